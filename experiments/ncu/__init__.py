"""Nsight Compute: the canonical metric table and the parser of ncu's CSV pages.

Canonical metrics (``conf/ncu/metrics.yaml``) are logged to MLflow as ``ncu.<name>`` in one
declared unit each and map to the ncu metric of the GPU's architecture. :func:`parse_csv` reads
``ncu --csv --page raw`` (header, units row, one row per launch) and ``--page details`` (one row
per metric): ncu's ``==PROF==`` lines and the program's output may precede the header, values
carry thousands separators ("1,128"), percentages may exceed 100, C++ kernel names contain commas
and a value may be ``n/a``. Text reports: :mod:`experiments.ncu.text`.

Metric names and suffixes: Nsight Compute 2025.3 Profiling Guide, "Metrics Structure" and
"Metrics Reference"; options and messages: the Nsight Compute CLI guide.
"""
from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from omegaconf import OmegaConf

__all__ = ["CONF_DIR", "PREFIX", "NcuConfigError", "NcuParseError", "Metric", "Table", "MetricSet",
           "load_table", "load_set", "Launch", "CsvReport", "parse_csv", "to_decimal", "convert",
           "canonical"]

CONF_DIR = Path(__file__).resolve().parents[2] / "conf" / "ncu"
PREFIX = "ncu."
_KINDS = ("hw", "launch")


class NcuConfigError(ValueError):
    """A metric set or the metric table is wrong; the message names the file, key and valid values."""


class NcuParseError(ValueError):
    """ncu output that this module cannot read; the message says where."""


@dataclass(frozen=True)
class Metric:
    """One canonical metric: logged as ``ncu.<name>`` in ``unit``; ``ncu`` maps architecture
    (``sm_90``, or ``*`` for all) to the ncu metric name; ``accept``: ncu units taken as ``unit``
    unchanged; ``text``: (section, row label) in text reports; ``kind``: hw or launch."""
    name: str
    unit: str
    ncu: dict
    accept: tuple = ()
    text: tuple | None = None
    kind: str = "hw"

    @property
    def key(self) -> str:
        return PREFIX + self.name

    def ncu_name(self, arch: str) -> str | None:
        return self.ncu.get(arch, self.ncu.get("*"))


@dataclass(frozen=True)
class Table:
    """The metric table: ``archs`` (architecture -> ncu chip), ``aliases`` (unchecked architecture ->
    mapped one) and the metrics by canonical name."""
    archs: dict
    aliases: dict
    metrics: dict
    path: Path

    def arch(self, arch: str) -> str:
        """The mapped architecture for ``arch`` (``sm_86`` -> ``sm_80``); NcuConfigError if none."""
        arch = self.aliases.get(arch, arch)
        if arch not in self.archs:
            raise NcuConfigError(f"no ncu metric names are mapped for {arch} in {self.path}; mapped: "
                                 f"{', '.join(self.archs)} (and {', '.join(self.aliases)} as aliases)")
        return arch


@dataclass(frozen=True)
class MetricSet:
    """What one profile collects: ncu's ``--set`` (None: only the metrics) and canonical metrics."""
    name: str
    section_set: str | None
    metrics: tuple

    def ncu_names(self, arch: str) -> list[str]:
        """Distinct ncu metric names to pass to ``--metrics`` for ``arch``, in table order."""
        return list(dict.fromkeys(n for m in self.metrics if (n := m.ncu_name(arch))))


def _metric(name: str, d, where: str) -> Metric:
    if not isinstance(d, dict) or not isinstance(d.get("unit"), str) or "ncu" not in d:
        raise NcuConfigError(f"{where}: metric {name!r} needs `unit` (a string) and `ncu` (a name, or "
                             f"one per architecture), got {d!r}")
    ncu = d["ncu"] if isinstance(d["ncu"], dict) else {"*": d["ncu"]}
    if not ncu or not all(isinstance(v, str) and v for v in ncu.values()):
        raise NcuConfigError(f"{where}: {name}.ncu must be a metric name, or a name per architecture "
                             f"(e.g. {{sm_90: sm__cycles_active.avg}}), got {d['ncu']!r}")
    text = d.get("text")
    if text is not None and (not isinstance(text, list) or len(text) != 2):
        raise NcuConfigError(f"{where}: {name}.text must be [section, label], got {text!r}")
    if d.get("kind", "hw") not in _KINDS:
        raise NcuConfigError(f"{where}: {name}.kind={d['kind']!r}; valid: {', '.join(_KINDS)}")
    return Metric(name, d["unit"], {k: str(v) for k, v in ncu.items()}, tuple(d.get("accept", ())),
                  tuple(text) if text else None, d.get("kind", "hw"))


def load_table(path: str | Path | None = None) -> Table:
    """Read the metric table (default ``conf/ncu/metrics.yaml``); stall reasons become
    ``stall_<reason>`` metrics. Raises NcuConfigError naming the bad entry."""
    path = Path(path or CONF_DIR / "metrics.yaml")
    data = OmegaConf.to_container(OmegaConf.load(path))
    metrics = {n: _metric(n, d, str(path)) for n, d in data.get("metrics", {}).items()}
    st = data.get("stalls")
    if st:
        only = st.get("only", {})
        for reason in [*st["reasons"], *only]:
            name = st["ncu"].format(reason=reason)
            ncu = {a: name for a in only[reason]} if reason in only else {"*": name}
            metrics[f"stall_{reason}"] = Metric(f"stall_{reason}", st["unit"], ncu,
                                                tuple(st.get("accept", ())))
    return Table(dict(data["archs"]), dict(data.get("aliases", {})), metrics, path)


def load_set(name: str, table: Table | None = None) -> MetricSet:
    """A metric set: ``default``, ``full`` (``conf/ncu/<name>.yaml``) or a YAML path. Its
    ``metrics`` is ``all`` or a list of canonical names (``stalls`` = every stall reason) and
    inline definitions ``{name: {unit, ncu, ...}}``. Raises NcuConfigError naming valid values."""
    table = table or load_table()
    path = Path(name) if name.endswith((".yaml", ".yml")) else CONF_DIR / f"{name}.yaml"
    if Path(name).is_dir():
        raise NcuConfigError(f"--set {name} is a folder: give a set's name (default, full) or a .yaml file")
    if not path.is_file():
        sets = sorted(p.stem for p in CONF_DIR.glob("*.yaml") if p.stem != "metrics")
        raise NcuConfigError(f"metric set {name!r} not found ({path}); valid: {', '.join(sets)}, "
                             "or a path to a .yaml file")
    try:
        data = OmegaConf.to_container(OmegaConf.load(path))
    except Exception as exc:  # noqa: BLE001 - YAML syntax errors of several kinds
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NcuConfigError(f"{path}: not a readable YAML metric set ({first})") from None
    entries = data.get("metrics") if isinstance(data, dict) else None
    if entries == "all":
        entries = list(table.metrics)
    if not isinstance(entries, list) or not entries or path.resolve() == Path(table.path).resolve():
        raise NcuConfigError(f"{path}: a metric set needs `metrics:` with `all` or a list of names from "
                             f"{table.path.name} (e.g. `metrics: [duration_us, stalls]`), as "
                             "conf/ncu/default.yaml")
    if unknown := sorted(set(data) - {"metrics", "section_set"}):
        raise NcuConfigError(f"{path}: unknown key {unknown[0]!r}; a metric set has `metrics` and "
                             "`section_set`")
    if not isinstance(data.get("section_set"), (str, type(None))):
        raise NcuConfigError(f"{path}: section_set must be an ncu section set's name (e.g. full) or null, "
                             f"got {data['section_set']!r}")
    out = {}
    for e in entries:
        if not isinstance(e, (str, dict)):
            raise NcuConfigError(f"{path}: metric {e!r} is neither a name from {table.path.name} nor an "
                                 "inline definition {name: {unit, ncu}}")
        if isinstance(e, dict):
            out.update({n: _metric(n, d, str(path)) for n, d in e.items()})
        elif e == "stalls":
            out.update({n: m for n, m in table.metrics.items() if n.startswith("stall_")})
        elif e in table.metrics:
            out[e] = table.metrics[e]
        else:
            raise NcuConfigError(f"{path}: metric {e!r} is not in {table.path.name}; valid: stalls, "
                                 + ", ".join(table.metrics))
    return MetricSet(path.stem, data.get("section_set"), tuple(out.values()))


# ----------------------------------------------------------------------------- values and units
_NUM = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][+-]?\d+)?")
_TIME = {"ns": "1e-9", "nsecond": "1e-9", "us": "1e-6", "usecond": "1e-6", "ms": "1e-3",
         "msecond": "1e-3", "s": "1", "second": "1"}
_SI = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def to_decimal(text: str) -> Decimal | None:
    """ncu's value text -> Decimal ("1,128" -> 1128, "2,732.67" -> 2732.67); None for '' and n/a.
    Raises ValueError for text that is not a number (e.g. 'CachePreferNone')."""
    t = text.strip()
    if t in ("", "n/a", "N/A"):
        return None
    if not any(c.isdigit() for c in t) or not _NUM.fullmatch(t):
        raise ValueError(f"not a number: {text!r}")
    return Decimal(t.replace(",", ""))


def _atom(u: str) -> tuple[str, Decimal]:
    if u in _TIME:
        return "s", Decimal(_TIME[u])
    if len(u) > 1 and u[0] in _SI and u[1:].isalpha() and u[1:].islower():
        return u[1:], Decimal(_SI[u[0]])
    return u, Decimal(1)


def _dimension(unit: str) -> tuple[str, Decimal]:
    num, _, den = unit.partition("/")
    dn, sn = _atom(num.strip())
    if not den:
        return dn, sn
    dd, sd = _atom(den.strip())
    return f"{dn}/{dd}", sn / sd


def convert(value: Decimal, unit: str, metric: Metric) -> float:
    """``value`` in ncu's ``unit`` -> float in the metric's unit (us, hz, byte, byte/s, ...).

    Prefixed units scale exactly (Decimal): 1.65 s -> 1650000 us, 805.73 Mhz -> 805730000 hz.
    Raises NcuParseError when the units measure different things (e.g. cycle vs us).
    """
    if unit == metric.unit or unit in metric.accept:
        return float(value)
    (d_from, s_from), (d_to, s_to) = _dimension(unit), _dimension(metric.unit)
    if d_from != d_to:
        raise NcuParseError(f"{metric.key}: ncu reports it in {unit!r}, which does not convert to "
                            f"{metric.unit!r}")
    return float(value * s_from / s_to)


# ----------------------------------------------------------------------------- CSV pages
@dataclass
class Launch:
    """One profiled kernel launch. ``values``/``units``: ncu metric name -> value text / unit;
    ``labels``: (section, display label) -> (value text, unit), from details pages and text
    reports; ``grid``/``block``: (x, y, z); ``cc``: compute capability as printed ("9.0")."""
    id: int
    kernel: str
    grid: tuple
    block: tuple
    cc: str = ""
    stream: str = ""
    values: dict = field(default_factory=dict)
    units: dict = field(default_factory=dict)
    labels: dict = field(default_factory=dict)
    row: list | None = None

    @property
    def function(self) -> str:
        """The kernel name without its parameter list."""
        return self.kernel.split("(")[0].strip()

    def number(self, name: str) -> float | None:
        """Value of ncu metric ``name`` as a float (None when n/a); KeyError if not returned."""
        d = to_decimal(self.values[name])
        return None if d is None else float(d)


@dataclass
class CsvReport:
    """A parsed CSV page: header and units rows (raw page), launches in file order, the lines before
    the header (ncu's and the program's) and ncu's ``==`` lines after it."""
    header: list
    units: list | None
    launches: list
    preamble: list
    messages: list

    def launch_csv(self, launch: Launch) -> str:
        """The header, units row and this launch's row, quoted as ncu writes them (raw page)."""
        buf = io.StringIO()
        w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
        w.writerows([self.header] + ([self.units] if self.units else []) + [launch.row])
        return buf.getvalue()


def _dims(text: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", text))


_INFO = ("ID", "Kernel Name", "Grid Size", "Block Size", "CC", "Stream")


def parse_csv(text: str) -> CsvReport:
    """Parse ``ncu --csv --page raw`` or ``--page details`` output (either detected from the header).

    Raises NcuParseError when there is no header line (``"ID",...``) or a row has more fields
    than the header.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if start is None:
        raise NcuParseError('no ncu CSV header (a line starting with "ID",) in the output')
    body = [line for line in lines[start:] if not line.startswith("==")]
    rows = list(csv.reader(io.StringIO("\n".join(body))))
    header, rows = rows[0], [r for r in rows[1:] if r]
    col = {h: i for i, h in enumerate(header)}
    missing = [h for h in _INFO if h not in col]
    if missing:
        raise NcuParseError(f"ncu CSV header lacks {', '.join(missing)}: {header[:12]}")
    units = rows.pop(0) if rows and rows[0][col["ID"]] == "" else None
    if units is not None:
        units += [""] * (len(header) - len(units))
    first_metric = col["CC"] + 1
    launches: dict = {}
    for n, r in enumerate(rows, 1):
        if len(r) > len(header):
            raise NcuParseError(f"CSV row {n} has {len(r)} fields, the header {len(header)}: {r[:5]}")
        r = r + [""] * (len(header) - len(r))
        lid = int(r[col["ID"]])
        la = launches.get(lid)
        if la is None:
            la = launches[lid] = Launch(lid, r[col["Kernel Name"]], _dims(r[col["Grid Size"]]),
                                        _dims(r[col["Block Size"]]), r[col["CC"]], r[col["Stream"]])
        if "Metric Name" in col:              # details page: one metric per row, rule rows have none
            name = r[col["Metric Name"]]
            if name:
                value, unit = r[col["Metric Value"]], r[col["Metric Unit"]]
                la.values.setdefault(name, value)
                la.units.setdefault(name, unit)
                la.labels.setdefault((r[col["Section Name"]], name), (value, unit))
        else:
            la.row = r
            la.values = dict(zip(header[first_metric:], r[first_metric:], strict=True))
            la.units = dict(zip(header[first_metric:], units[first_metric:], strict=True)) if units else {}
    return CsvReport(header, units, list(launches.values()), lines[:start],
                     [line for line in lines[start:] if line.startswith("==")])


def canonical(launch: Launch, metrics, arch: str | None) -> tuple[dict, dict]:
    """Canonical metrics of one launch: ({'ncu.x': float in the metric's unit}, {'ncu.y': why
    missing}). A metric is looked up by its ncu name for ``arch``, else by its text label; one
    that ncu did not return, or returned as n/a, is missing, never 0."""
    out, missing = {}, {}
    for m in metrics:
        name = m.ncu_name(arch) if arch else None
        if name and name in launch.values:
            raw, unit = launch.values[name], launch.units.get(name, "")
        elif m.text and m.text in launch.labels:
            raw, unit = launch.labels[m.text]
        else:
            missing[m.key] = f"{name}: not returned" if name else "not in the report"
            continue
        try:
            value = to_decimal(raw)
        except ValueError as exc:
            missing[m.key] = f"{name or m.text[1]}: {exc}"
            continue
        if value is None:
            missing[m.key] = f"{name or m.text[1]}: {raw or 'empty'}"
            continue
        try:
            out[m.key] = convert(value, unit, m)
        except NcuParseError as exc:
            missing[m.key] = str(exc)
    return out, missing
