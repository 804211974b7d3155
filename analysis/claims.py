"""Evaluate a study's claims (a declarative YAML, e.g. analysis/claims/l4.yaml) against tracked runs.

Each claim says which kernels, which sizes, what to compute from the tidy table, the published value
and a relative tolerance (the file's header documents the kinds). :func:`evaluate` computes "this
GPU" from the runs and a verdict -- holds, fails or inconclusive, always with the reason -- and, given
the study's own numbers (:func:`analysis.reference.read_study`), recomputes each claim from them and
flags a published value that they contradict or that rests on durations flagged implausible.
"""
from __future__ import annotations

import math
import re
from numbers import Real

import pandas as pd

from .runs import COLUMNS, MEDIAN_US, SPREAD, ok_runs

__all__ = ["ClaimsError", "KINDS", "validate", "load_claims", "evaluate", "VERDICTS"]

KINDS = {"speedup": ("baseline", "published"), "ratio": ("baseline", "published", "metric"),
         "tracks": ("baseline", "published", "metric"), "fastest": ("kernel", "among"),
         "highest_not_fastest": ("metric", "among")}
VERDICTS = ("holds", "fails", "inconclusive")
_COLS = {c.name: c for c in COLUMNS}


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
        pair = c["kind"] in ("speedup", "ratio", "tracks") and "kernels" not in c
        need = KINDS[c["kind"]] + (("kernel",) if pair else ())
        for key in need + ("claim",):
            if key not in c:
                raise ClaimsError(f"{where} (kind {c['kind']}): key {key!r} is missing; it needs "
                                  f"{', '.join(need + ('claim',))}")
        if "metric" in c and c["metric"] not in _COLS:
            raise ClaimsError(f"{where}: metric={c['metric']!r} is not a column of the run table; valid: "
                              + ", ".join(_COLS))
        c.setdefault("sizes", spec["sizes"])
        c.setdefault("tolerance", 0.0)
        if not isinstance(c["tolerance"], Real) or c["tolerance"] < 0:
            raise ClaimsError(f"{where}: tolerance={c['tolerance']!r} must be a number >= 0 (relative)")
        if "published" in c:
            _interval(c, c["sizes"][0])
    return spec


def load_claims(path) -> dict:
    """Read and :func:`validate` a claims YAML file."""
    from .reference import load_spec
    return validate(load_spec(path))


def _interval(c: dict, size: int) -> tuple[float, float]:
    """Accepted [low, high] at one size: published widened by the relative tolerance."""
    pub, tol = c["published"], c.get("tolerance", 0.0)
    if isinstance(pub, Real):
        lo = hi = float(pub)
    elif (isinstance(pub, list) and len(pub) == 2 and all(isinstance(v, Real) for v in pub)
          and pub[0] <= pub[1]):
        lo, hi = map(float, pub)
    elif isinstance(pub, dict) and set(pub) <= set(c["sizes"]) and set(c["sizes"]) <= set(pub):
        lo = hi = float(pub[size])
    else:
        raise ClaimsError(f"claim {c.get('id')}: published={pub!r} is not valid; valid forms: a number, "
                          f"[low, high] with low <= high, or {{size: number}} for every size in {c['sizes']}")
    return lo * (1 - tol), hi * (1 + tol)


def _published(c: dict) -> str:
    if "published" not in c:
        return "true at every N" if c["kind"] == "highest_not_fastest" else "fastest at every N"
    pub, tol = c["published"], c["tolerance"]
    text = (f"{pub[0]:g}-{pub[1]:g}" if isinstance(pub, list) else
            ", ".join(f"{v:g} (N={s})" for s, v in pub.items()) if isinstance(pub, dict) else f"{pub:g}")
    return text + (f" (tolerance {tol:.0%})" if tol else "")


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
    return float(v) if v is not None and not (isinstance(v, float) and math.isnan(v)) else math.nan


def _noise(a, b) -> float:
    """Relative difference two runs' own batch spreads cannot resolve (0 without a spread)."""
    return max([v for v in (_metric(a, SPREAD), _metric(b, SPREAD)) if math.isfinite(v)] or [0.0])


def _judge(c: dict, cells: _Cells):
    """(values, outside, missing, noise, extra): what one claim finds in one table."""
    vals, out, miss, noise, extra = [], [], [], [], []
    kind = c["kind"]
    for size in c["sizes"]:
        if kind in ("speedup", "ratio", "tracks"):
            base, why_b = cells.get(c["baseline"], size)
            for k in c.get("kernels", [c.get("kernel")]):
                row, why = cells.get(k, size)
                if row is None or base is None:
                    miss.append(why or why_b)
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
                            extra.append(f"DRAM share ratio {k}/{c['baseline']} at N={size}: {share:.2f}")
                    if not math.isfinite(v):
                        miss.append(f"no {_COLS[m].key} for {k} or {c['baseline']} at N={size}")
                        continue
                lo, hi = _interval(c, size)
                vals.append((k, size, v))
                if not lo <= v <= hi:
                    out.append(f"{k} at N={size}: {v:.3g} outside [{lo:.3g}, {hi:.3g}]")
        elif kind == "fastest":
            row, why = cells.get(c["kernel"], size)
            if row is None:
                miss.append(why)
                continue
            rivals = [(r, cells.get(r, size)) for r in c["among"]]
            miss += [w for _, (x, w) in rivals if x is None]
            present = [(r, x) for r, (x, _) in rivals if x is not None]
            faster = [(r, x) for r, x in present if x[MEDIAN_US] < row[MEDIAN_US]]
            if not present:
                continue
            close = {r for r, x in present if abs(x[MEDIAN_US] / row[MEDIAN_US] - 1) <= _noise(x, row)}
            vals.append((c["kernel"], size, 0.0 if faster else 1.0))
            for r, x in faster:
                if r in close:
                    noise.append(f"{r} at N={size} is faster within the measurement spread")
                else:
                    out.append(f"at N={size} {r} is faster ({x[MEDIAN_US]:.4g} vs {row[MEDIAN_US]:.4g} us)")
            if not faster:
                noise += [f"{c['kernel']} leads {r} at N={size} by less than the measurement spread"
                          for r in close]
        else:                                                   # highest_not_fastest
            got = [(r, *cells.get(r, size)) for r in c["among"]]
            miss += [w for _, x, w in got if x is None]
            have = [(r, x) for r, x, _ in got if x is not None and math.isfinite(_metric(x, c["metric"]))]
            miss += [f"no {_COLS[c['metric']].key} for {r} at N={size}" for r, x, _ in got
                     if x is not None and not math.isfinite(_metric(x, c["metric"]))]
            if len(have) < 2:
                continue
            top = max(have, key=lambda t: _metric(t[1], c["metric"]))
            best = min(have, key=lambda t: t[1][MEDIAN_US])
            vals.append((top[0], size, float(top[0] != best[0])))
            if top[0] == best[0]:
                out.append(f"at N={size} {top[0]} has the highest {c['metric']} "
                           f"({_metric(top[1], c['metric']):.3g}) and is the fastest")
    return vals, out, miss, noise, extra


def _show(c: dict, vals: list) -> str:
    if not vals:
        return "-"
    if c["kind"] == "fastest":
        return f"fastest at {sum(v for *_, v in vals):.0f} of {len(vals)} sizes measured"
    if c["kind"] == "highest_not_fastest":
        return f"true at {sum(v for *_, v in vals):.0f} of {len(vals)} sizes measured"
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


def _verdict(kind: str, vals, out, miss, noise) -> tuple[str, str]:
    if out:
        return "fails", _merge(out)
    if noise:
        return "inconclusive", "within the measurement spread: " + _merge(noise + miss)
    if miss:
        return "inconclusive", ("where measured it holds, but " if vals else "") + _merge(miss)
    if not vals:
        return "inconclusive", "nothing to check"
    sizes = len({s for _, s, _ in vals})
    return "holds", (f"true at all {sizes} sizes" if kind in ("fastest", "highest_not_fastest")
                     else f"all {len(vals)} value(s) inside the published range")


def evaluate(spec: dict, runs: pd.DataFrame, reference: pd.DataFrame | None = None) -> pd.DataFrame:
    """The claims table for ONE GPU's runs: id, claim, sizes, published, this_gpu, verdict, reason,
    and, with ``reference`` (the study's own tidy table), study_recomputed and published_flag.

    runs: tidy table (failed, skipped or interrupted runs count as missing cells, with their reason).
    Raises ClaimsError for an invalid spec and ValueError for runs of several GPUs.
    """
    spec = validate(spec)
    gpus = runs["gpu"].dropna().unique()
    if len(gpus) > 1:
        raise ValueError(f"runs of {len(gpus)} GPUs ({', '.join(map(str, gpus))}): "
                         "evaluate one GPU at a time")
    cells = _Cells(runs, spec["match"], spec["aliases"])
    ref_cells = None if reference is None else _Cells(reference, spec["match"], spec["aliases"])
    rtol = spec.get("reference", {}).get("recompute_tolerance", 0.02)
    rows = []
    for c in spec["claims"]:
        vals, out, miss, noise, extra = _judge(c, cells)
        verdict, reason = _verdict(c["kind"], vals, out, miss, noise)
        if c.get("circular"):
            reason += (f". {_COLS[c['metric']].key} is a count that grows with duration: a ratio near "
                       "1 is expected by construction (circular); compare the DRAM share instead")
        if extra:
            reason += ". " + "; ".join(extra)
        row = {"id": c["id"], "claim": c["claim"], "sizes": ", ".join(map(str, c["sizes"])),
               "published": _published(c), "this_gpu": _show(c, vals), "verdict": verdict, "reason": reason}
        if ref_cells is not None:
            strict = dict(c, tolerance=rtol) if "published" in c else c
            rv, rout, rmiss, _, _ = _judge(strict, ref_cells)
            flags = [f"the study's own numbers give {m}" for m in rout]
            names = ({*c.get("kernels", []), *c.get("among", [])}
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
