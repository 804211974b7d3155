"""Evaluate a study's claims (a declarative YAML, e.g. analysis/claims/l4.yaml) against tracked runs.

Each claim says which kernels, which sizes, what to compute from the tidy table and what the study
published (the file's header documents the kinds). :func:`evaluate` computes "this GPU" from the runs
and a verdict, always with the reason and the numbers, by one rule for every claim:

- every value a claim computes is a check against an interval: the published range as the claim
  states it, or a published number widened by the file's one relative ``tolerance``; its *margin*
  is its relative distance to the nearest edge (negative outside);
- the noise of a value is the sum of the ``replicate_spread`` of the runs it is computed from (runs
  made with ``timing.repeats`` >= 2: (max - min) / median of the replicate medians, each taken apart
  in time). A margin within that noise is *inconclusive*; a claim holds when every margin is above
  the noise, fails when one lies outside beyond it. A run without replicates gives no noise: the
  claim is inconclusive and says it needs ``timing.repeats`` (the batch spread within one run is
  not run-to-run noise and is never used as such). The same relative noise applies to a value
  computed from the runs' ncu metrics (C9's occupancy), the only run-to-run measure there is;
- a claim about a tensor-core MMA that a run it depends on emulates (tag ``mma_native=false``: no
  MMA of its type in the SASS) is *not testable here*.

Given the study's own numbers (:func:`analysis.reference.read_study`) each claim is recomputed from
them, flagging a published value that they contradict or that rests on durations flagged implausible.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from numbers import Real

import pandas as pd

from .runs import COLUMNS, MEDIAN_US, ok_runs

__all__ = ["ClaimsError", "KINDS", "VERDICTS", "REPLICATE_SPREAD", "REPLICATES", "validate", "load_claims",
           "evaluate"]

KINDS = {"speedup": ("baseline", "published"), "ratio": ("baseline", "published", "metric"),
         "tracks": ("baseline", "published", "metric"), "fastest": ("kernel", "among"),
         "highest_not_fastest": ("metric", "among"), "dip": ("kernel", "baseline", "at")}
VERDICTS = ("holds", "fails", "inconclusive", "not testable here")
REPLICATE_SPREAD, REPLICATES = "replicate_spread", "replicates"     # metrics of runs with timing.repeats >= 2
_COLS = {c.name: c for c in COLUMNS}
_SUBJECT = ("kernel", "kernels", "best_of")        # who a pair kind (speedup, ratio, tracks) is about


class ClaimsError(ValueError):
    """A claims file that cannot be evaluated; the message names the claim, key, value and valid values."""


def validate(spec: dict) -> dict:
    """Check a claims spec (the parsed YAML) and fill defaults; returns it. Raises ClaimsError."""
    if not isinstance(spec, dict) or not isinstance(spec.get("claims"), list):
        raise ClaimsError("a claims file needs a top-level list `claims:` (see analysis/claims/l4.yaml)")
    spec.setdefault("match", "study_kernel")
    if spec["match"] not in _COLS:
        raise ClaimsError(f"match={spec['match']!r} is not a column; valid: {', '.join(_COLS)}")
    spec.setdefault("aliases", {})
    spec.setdefault("sizes", [512, 1024, 2048, 4096, 8192])
    spec.setdefault("tolerance", 0.15)
    if not isinstance(spec["tolerance"], Real) or spec["tolerance"] < 0:
        raise ClaimsError(f"tolerance={spec['tolerance']!r} must be a number >= 0 (relative, for published "
                          "numbers)")
    ids = set()
    for c in spec["claims"]:
        cid = c.get("id", "?")
        where = f"claim {cid}"
        if cid in ids:
            raise ClaimsError(f"{where}: id is used twice")
        ids.add(cid)
        if c.get("kind") not in KINDS:
            raise ClaimsError(f"{where}: kind={c.get('kind')!r} is not valid; valid values: "
                              + ", ".join(KINDS))
        if "tolerance" in c:
            raise ClaimsError(f"{where}: tolerance={c['tolerance']!r}: one tolerance applies to every claim; "
                              "set the file's top-level `tolerance` (relative, for published numbers)")
        pair = c["kind"] in ("speedup", "ratio", "tracks")
        if pair and sum(k in c for k in _SUBJECT) != 1:
            raise ClaimsError(f"{where} (kind {c['kind']}): give exactly one of {', '.join(_SUBJECT)}")
        for key in KINDS[c["kind"]] + ("claim",):
            if key not in c:
                raise ClaimsError(f"{where} (kind {c['kind']}): key {key!r} is missing; it needs "
                                  f"{', '.join(KINDS[c['kind']] + ('claim',))}")
        if "metric" in c and c["metric"] not in _COLS:
            raise ClaimsError(f"{where}: metric={c['metric']!r} is not a column of the run table; valid: "
                              + ", ".join(_COLS))
        c.setdefault("sizes", spec["sizes"])
        if c["kind"] == "dip" and (c["at"] not in c["sizes"] or c["at"] in (c["sizes"][0], c["sizes"][-1])):
            raise ClaimsError(f"{where}: at={c['at']!r} must be one of sizes {c['sizes']} with a size on "
                              "each side (the dip is measured against both neighbours)")
        if "published" in c:
            _interval(c, c["sizes"][0], spec["tolerance"])
    return spec


def load_claims(path) -> dict:
    """Read and :func:`validate` a claims YAML file."""
    from .reference import load_spec
    return validate(load_spec(path))


def _interval(c: dict, size: int, tol: float) -> tuple[float, float]:
    """Accepted [low, high] at one size: a published range as stated, a published number +- tol."""
    pub = c["published"]
    if isinstance(pub, Real):
        return float(pub) * (1 - tol), float(pub) * (1 + tol)
    if (isinstance(pub, list) and len(pub) == 2 and all(isinstance(v, Real) for v in pub)
            and pub[0] <= pub[1]):
        return float(pub[0]), float(pub[1])
    if isinstance(pub, dict) and set(pub) == set(c["sizes"]):
        return float(pub[size]) * (1 - tol), float(pub[size]) * (1 + tol)
    raise ClaimsError(f"claim {c.get('id')}: published={pub!r} is not valid; valid forms: a number, "
                      f"[low, high] with low <= high, or {{size: number}} for every size in {c['sizes']}")


def _published(c: dict, tol: float) -> str:
    if c["kind"] == "dip":
        return f"lower at N={c['at']} than at N={', '.join(str(s) for s in c['sizes'] if s != c['at'])}"
    if "published" not in c:
        return "true at every N" if c["kind"] == "highest_not_fastest" else "fastest at every N"
    pub = c["published"]
    if isinstance(pub, list):
        return f"{pub[0]:g}-{pub[1]:g}"
    text = ", ".join(f"{v:g} (N={s})" for s, v in pub.items()) if isinstance(pub, dict) else f"{pub:g}"
    return text + (f" (+-{tol:.0%})" if tol else "")


class _Cells:
    """Rows of one GPU's table by (kernel name, N), with why a cell is missing."""

    def __init__(self, df: pd.DataFrame, match: str, aliases: dict):
        self.aliases = aliases
        self.ok: dict = {}
        self.bad: dict = {}
        self.known = set(df[match].dropna())
        ok_ids = set(ok_runs(df)["run_id"])
        for _, r in df.sort_values(MEDIAN_US, ascending=False).iterrows():
            if isinstance(r[match], str) and isinstance(r["size"], str):
                (self.ok if r["run_id"] in ok_ids else self.bad)[(r[match], r["size"])] = r   # fastest last

    def names(self, name: str) -> set:
        return {name, self.aliases.get(name, name)} | {a for a, b in self.aliases.items() if b == name}

    def get(self, name: str, size: int):
        names = self.names(name)
        for n in names:
            if (n, str(size)) in self.ok:
                return self.ok[(n, str(size))], None
        for n in names:
            if (n, str(size)) in self.bad:
                r = self.bad[(n, str(size))]
                why = next((v for v in (r.get("error"), r.get("skip_reason")) if isinstance(v, str)),
                           "no timing").splitlines()[0]
                return None, f"{name} at N={size} {r['outcome']}: {why}"   # failed, skipped, interrupted
        if not names & self.known:
            return None, f"no runs of {name}"
        return None, f"no run of {name} at N={size}"


def _metric(row, col: str) -> float:
    v = row.get(col) if row is not None else None
    try:
        v = float(v)
    except (TypeError, ValueError):
        return math.nan
    return v


@dataclass
class _Check:
    """One value a claim computes, the interval it must lie in, and the runs it is computed from."""
    text: str             # what the value is, e.g. "int8_dp4a at N=512: 0.433"
    value: float
    lo: float
    hi: float
    rows: list

    @property
    def margin(self) -> float:
        """Relative distance of the value to the nearest edge of [lo, hi]; negative outside."""
        below = self.value / self.lo - 1 if self.lo > 0 else math.inf
        above = 1 - self.value / self.hi if math.isfinite(self.hi) else math.inf
        return min(below, above)

    @property
    def noise(self) -> float:
        """Sum of the runs' replicate spreads (relative); NaN when one of them has no replicates."""
        runs = {r["run_id"]: r for r in self.rows}.values()
        return sum(_metric(r, REPLICATE_SPREAD) for r in runs)

    def interval(self) -> str:
        return f"[{self.lo:.3g}, inf)" if math.isinf(self.hi) else f"[{self.lo:.3g}, {self.hi:.3g}]"

    def line(self) -> str:
        where = "inside" if self.margin >= 0 else "outside"
        return f"{self.text} {where} {self.interval()} by {abs(self.margin):.2%}"


def _judge(c: dict, cells: _Cells, tol: float):
    """(checks, shown values, missing, used rows, extra notes): what one claim finds in one table."""
    checks, vals, miss, used, extra = [], [], [], [], []
    kind = c["kind"]

    def get(name, size):
        row, why = cells.get(name, size)
        if row is None:
            miss.append(why)
        else:
            used.append(row)
        return row

    def speed(k, base, size):
        row, b = get(k, size), get(base, size)
        ok = row is not None and b is not None
        return row, b, (b[MEDIAN_US] / row[MEDIAN_US] if ok else None)

    for size in c["sizes"]:
        if kind in ("speedup", "ratio", "tracks"):
            subjects = c.get("kernels") or [c.get("kernel")]
            if "best_of" in c:                  # the fastest of the candidates measured at this size
                have = [(k, r) for k in c["best_of"] if (r := get(k, size)) is not None]
                subjects = [min(have, key=lambda t: t[1][MEDIAN_US])[0]] if have else []
            base = get(c["baseline"], size)
            for k in subjects:
                row = cells.get(k, size)[0] if "best_of" in c else get(k, size)
                if row is None or base is None:
                    continue
                if kind == "speedup":
                    v = base[MEDIAN_US] / row[MEDIAN_US]
                else:
                    m = c["metric"]
                    v = _metric(row, m) / _metric(base, m)
                    if kind == "tracks":
                        v /= row[MEDIAN_US] / base[MEDIAN_US]
                        share = _metric(row, "dram_active_pct") / _metric(base, "dram_active_pct")
                        if c.get("circular") and math.isfinite(share):
                            extra.append(f"DRAM share ratio {k}/{c['baseline']} at N={size}: {share:.3g}")
                    if not math.isfinite(v):
                        miss.append(f"no {_COLS[m].key} for {k} or {c['baseline']} at N={size}")
                        continue
                label = f"best of {len(c['best_of'])} ({k})" if "best_of" in c else k
                lo, hi = _interval(c, size, tol)
                vals.append((label, size, v))
                checks.append(_Check(f"{label} at N={size}: {v:.3g}", v, lo, hi, [row, base]))
        elif kind == "dip":
            if size != c["at"]:
                continue
            i = c["sizes"].index(size)
            row, b, v = speed(c["kernel"], c["baseline"], size)
            for nb in (c["sizes"][i - 1], c["sizes"][i + 1]):
                nrow, nbase, w = speed(c["kernel"], c["baseline"], nb)
                if v is None or w is None:
                    continue
                vals.append((c["kernel"], nb, w))
                checks.append(_Check(f"at N={size} vs N={nb}: {v:.3g} / {w:.3g} = {v / w:.3g}", v / w, 0.0,
                                     1.0, [row, b, nrow, nbase]))
            if v is not None:
                vals.append((c["kernel"], size, v))
        elif kind == "fastest":
            row = get(c["kernel"], size)
            rivals = [(r, x) for r in c["among"] if (x := get(r, size)) is not None]
            if row is None or not rivals:
                continue
            lead = [(r, x[MEDIAN_US] / row[MEDIAN_US], x) for r, x in rivals]
            vals.append((c["kernel"], size, float(all(v > 1 for _, v, _ in lead))))
            checks += [_Check(f"at N={size} {r} takes {v:.4g}x the time of {c['kernel']} "
                              f"({x[MEDIAN_US]:.4g} vs {row[MEDIAN_US]:.4g} us)", v, 1.0, math.inf, [row, x])
                       for r, v, x in lead]
        else:                                                   # highest_not_fastest
            m = c["metric"]
            got = [(r, x) for r in c["among"] if (x := get(r, size)) is not None]
            have = [(r, x) for r, x in got if math.isfinite(_metric(x, m))]
            miss += [f"no {_COLS[m].key} for {r} at N={size}" for r, x in got if (r, x) not in have]
            if len(have) < 2:
                continue
            by_metric = sorted(have, key=lambda t: -_metric(t[1], m))
            by_time = sorted(have, key=lambda t: t[1][MEDIAN_US])
            (top, xt), (fast, xf) = by_metric[0], by_time[0]
            vals.append((top, size, float(top != fast)))
            if top != fast:              # true here: both leads must be beyond the noise
                checks.append(_Check(f"at N={size} {m} of {top} (the highest) / of {fast} (the fastest): "
                                     f"{_metric(xt, m):.4g} / {_metric(xf, m):.4g}",
                                     _metric(xt, m) / _metric(xf, m), 1.0, math.inf, [xt, xf]))
                checks.append(_Check(f"at N={size} time of {top} / of {fast}: {xt[MEDIAN_US]:.4g} / "
                                     f"{xf[MEDIAN_US]:.4g} us", xt[MEDIAN_US] / xf[MEDIAN_US], 1.0, math.inf,
                                     [xt, xf]))
            else:                        # false here, by the smaller of its two leads
                (r1, x1), (r2, x2) = by_metric[1], by_time[1]
                lead = min(_metric(xt, m) / _metric(x1, m), x2[MEDIAN_US] / xt[MEDIAN_US])
                checks.append(_Check(f"at N={size} {top} has the highest {m} ({_metric(xt, m):.4g} vs "
                                     f"{_metric(x1, m):.4g} for {r1}) and is the fastest "
                                     f"({xt[MEDIAN_US]:.4g} vs {x2[MEDIAN_US]:.4g} us for {r2}); "
                                     f"smaller lead {lead:.4g}",
                                     lead, 0.0, 1.0, [xt, x1, x2]))
    return checks, vals, miss, used, extra


def _show(c: dict, vals: list) -> str:
    if not vals:
        return "-"
    if c["kind"] == "fastest":
        return f"fastest at {sum(v for *_, v in vals):.0f} of {len(vals)} sizes measured"
    if c["kind"] == "highest_not_fastest":
        return f"true at {sum(v for *_, v in vals):.0f} of {len(vals)} sizes measured"
    if c["kind"] == "dip":
        vals = sorted(vals, key=lambda t: t[1])
    if len(vals) <= 3:
        one = len({k for k, *_ in vals}) == 1
        return ", ".join(f"{v:.3g} (N={s})" if one else f"{k}: {v:.3g} (N={s})" for k, s, v in vals)
    v = [x for *_, x in vals]
    return f"{min(v):.3g}-{max(v):.3g} ({len(v)} values)"


def _merge(msgs: list[str], limit: int = 4) -> str:
    """Join reasons, one per kind of message with its sizes gathered ('... at N=512, 1024')."""
    absent = [m[len("no runs of "):] for m in msgs if m.startswith("no runs of ")]
    msgs = ([f"no runs of {', '.join(dict.fromkeys(absent))} on this GPU"] if absent else []) + \
        [m for m in msgs if not m.startswith("no runs of ")]
    groups: dict[str, list[str]] = {}
    for m in msgs:
        found = re.search(r" at N=(\d+)", m)
        key = re.sub(r" at N=\d+", " at N=\x00", m) if found else m    # NUL marks where sizes go
        groups.setdefault(key, [])
        if found and found.group(1) not in groups[key]:
            groups[key].append(found.group(1))
    parts = [k.replace("\x00", ", ".join(v)) if v else k for k, v in groups.items()]
    return "; ".join(parts[:limit]) + (f"; and {len(parts) - limit} more" if len(parts) > limit else "")


def _emulated(used: list, gpu: str) -> str | None:
    """Why a claim is not testable on this GPU: runs it depends on emulate their MMA (mma_native=false)."""
    emu = {r["_name"]: r for r in used if str(r.get("mma_native")).lower() == "false"}
    if not emu:
        return None
    precs = ", ".join(sorted({str(r.get("precision")) for r in emu.values()}))
    return (f"not testable here: {', '.join(sorted(emu))} have mma_native=false on {gpu or 'this GPU'} "
            f"(ptxas emulates the {precs} MMA: no tensor-core MMA of that type in the SASS), so their "
            "times measure the emulation, not the tensor-core instruction the claim is about")


def _verdict(checks: list[_Check], miss: list[str]) -> tuple[str, str]:
    """The one rule: margins against the runs' replicate noise (see the module docstring)."""
    if not checks:
        return "inconclusive", _merge(miss) or "nothing to check"
    no_noise = [ch for ch in checks if not math.isfinite(ch.noise)]
    if no_noise:
        outside = [ch for ch in checks if ch.margin < 0]
        worst = min(checks, key=lambda ch: ch.margin)
        what = (f"{len(outside)} of {len(checks)} value(s) outside, e.g. {worst.line()}" if outside else
                f"all {len(checks)} value(s) inside, the closest {worst.line()}")
        runs = len({r["run_id"] for ch in no_noise for r in ch.rows})
        return "inconclusive", (f"needs timing.repeats >= 2: {runs} run(s) it rests on have no replicates, "
                                f"so no run-to-run noise to judge the margins against; as measured once, "
                                f"{what}" + (f"; also {_merge(miss, 2)}" if miss else ""))
    fails = [ch for ch in checks if ch.margin < -ch.noise]
    close = [ch for ch in checks if abs(ch.margin) <= ch.noise]
    if fails:
        return "fails", _merge([f"{ch.line()} (replicate noise {ch.noise:.2%})" for ch in fails])
    if close:
        return "inconclusive", "within the replicate noise: " + _merge(
            [f"{ch.line()}, noise {ch.noise:.2%}" for ch in close] + miss)
    if miss:
        return "inconclusive", "where measured it holds, but " + _merge(miss)
    low = min(checks, key=lambda ch: ch.margin - ch.noise)
    return "holds", (f"all {len(checks)} value(s) inside beyond the replicate noise; the closest: "
                     f"{low.line()} (noise {low.noise:.2%})")


def _circular(c: dict, extra: list[str]) -> str:
    """C10-like claims: what a ratio of the DRAM active-cycle count to time is, with its value."""
    share = f" (here {extra[0].split(': ')[-1]})" if extra else ""
    return (f". {_COLS[c['metric']].key} counts DRAM-active cycles = DRAM share x elapsed cycles, so this "
            f"value is the ratio of the two kernels' DRAM shares{share}: 1 means equal shares, not that "
            "cycles track time; any duration ratio gives the same value (circular)")


def evaluate(spec: dict, runs: pd.DataFrame, reference: pd.DataFrame | None = None) -> pd.DataFrame:
    """The claims table for ONE GPU's runs: id, claim, sizes, published, this_gpu, verdict (one of
    :data:`VERDICTS`), reason, and, with ``reference`` (the study's own tidy table), study_recomputed
    and published_flag.

    runs: tidy table (failed, skipped or interrupted runs count as missing cells, with their reason;
    ``replicate_spread`` per run gives the noise). Raises ClaimsError for an invalid spec and
    ValueError for runs of several GPUs.
    """
    spec = validate(spec)
    gpus = runs["gpu"].dropna().unique()
    if len(gpus) > 1:
        raise ValueError(f"runs of {len(gpus)} GPUs ({', '.join(map(str, gpus))}): "
                         "evaluate one GPU at a time")
    match = spec["match"]
    runs = runs.assign(_name=runs[match])
    cells = _Cells(runs, match, spec["aliases"])
    ref_cells = None if reference is None else _Cells(reference, match, spec["aliases"])
    rtol = spec.get("reference", {}).get("recompute_tolerance", 0.02)
    tol = spec["tolerance"]
    rows = []
    for c in spec["claims"]:
        checks, vals, miss, used, extra = _judge(c, cells, tol)
        verdict, reason = _verdict(checks, miss)
        if why := _emulated(used, gpus[0] if len(gpus) else ""):
            verdict, reason = "not testable here", f"{why}. As measured: {reason}"
        if c.get("circular"):
            reason += _circular(c, extra)
        row = {"id": c["id"], "claim": c["claim"], "sizes": ", ".join(map(str, c["sizes"])),
               "published": _published(c, tol), "this_gpu": _show(c, vals), "verdict": verdict,
               "reason": reason}
        if ref_cells is not None:
            rchecks, rv, rmiss, _, _ = _judge(_strict(c, rtol), ref_cells, rtol)
            flags = [f"the study's own numbers give {ch.text} outside {ch.interval()}" for ch in rchecks
                     if ch.margin < 0]
            names = ({*c.get("kernels", []), *c.get("among", []), *c.get("best_of", [])}
                     | {c.get(k) for k in ("kernel", "baseline")})
            bad = [(name, size, r["implausible"]) for name in sorted(n for n in names if n)
                   for size in c["sizes"] for r in [ref_cells.get(name, size)[0]]
                   if r is not None and isinstance(r.get("implausible"), str)]
            if bad:
                flags.append(f"rests on {len(bad)} published duration(s) flagged implausible "
                             f"({', '.join(dict.fromkeys(b[0] for b in bad))}); "
                             f"e.g. {bad[-1][0]} at N={bad[-1][1]}: {bad[-1][2]}")
            row["study_recomputed"] = _show(c, rv) if rv else _merge(rmiss, 2) or "-"
            row["published_flag"] = _merge(flags, 3)
        rows.append(row)
    for c in spec.get("not_evaluated", []):
        rows.append({"id": c["id"], "claim": c["claim"], "sizes": "", "published": "", "this_gpu": "-",
                     "verdict": "inconclusive", "reason": f"not evaluated: {c['reason']}",
                     **({"study_recomputed": "-", "published_flag": ""} if ref_cells is not None else {})})
    return pd.DataFrame(rows)


def _strict(c: dict, rtol: float) -> dict:
    """The claim as the study's own numbers must meet it: a published range widened by rtol too (the
    rounding of the published figures)."""
    pub = c.get("published")
    if isinstance(pub, list):
        return dict(c, published=[pub[0] * (1 - rtol), pub[1] * (1 + rtol)])
    return c
