"""ncu's plain-text report (what ``ncu`` prints to stdout without ``--csv``): parse it, and load
published reports into MLflow as a reference experiment with the same canonical ``ncu.*`` metrics.

    python -m experiments.profile --import-text FILE... [--experiment NAME] [--gpu NAME]

A report holds the program's own lines, then result blocks
``  kernel(signature) (gx, gy, gz)x(bx, by, bz), Context C, Stream S, Device D, CC X.Y``, each with
``Section:`` tables of Metric Name / Metric Unit / Metric Value. A table is cut at the column
positions of its dashed ruler: a wide value may sit one space after its unit. Rows are display
labels (Duration, Achieved Occupancy, ...): ``conf/ncu/metrics.yaml`` maps them (``text``).
"""
from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from pathlib import Path

from . import Launch, NcuParseError, canonical, load_table

__all__ = ["TextReport", "parse_text_report", "program_info", "import_reports"]

_BLOCK = re.compile(r"^  (?P<kernel>\S.*?) \((?P<grid>\d+, \d+, \d+)\)x\((?P<block>\d+, \d+, \d+)\), "
                    r"Context \d+, Stream (?P<stream>\d+), Device \d+, CC (?P<cc>[\d.]+)\s*$")
_SECTION = re.compile(r"^    Section: (?P<name>.+?)\s*$")
_RULER = re.compile(r"^ *-+(?: +-+)+ *$")


def _dims(text: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", text))


@dataclass
class TextReport:
    """ncu's stdout report: result ``blocks`` (as Launch, with ``labels`` only), the program's own
    lines, how many launches ncu profiled (``==PROF== Profiling`` lines; hand-trimmed files keep
    fewer blocks) and the replay passes of the last one."""
    blocks: list
    program: list
    profiled: int
    passes: int | None


def _table(lines: list, i: int, block: Launch, section: str) -> int:
    """Read the table whose ruler is lines[i]; returns the index after its closing ruler."""
    ruler = lines[i].rstrip()
    cuts = [m.start() for m in re.finditer(r"-+", ruler)]
    if len(cuts) != 3:
        raise NcuParseError(f"line {i + 1}: a metric table ruler with {len(cuts)} columns, expected 3")
    j = i + 3
    while j < len(lines) and lines[j].rstrip() != ruler:
        row = lines[j]
        if not row.strip() or _SECTION.match(row) or _BLOCK.match(row):
            raise NcuParseError(f"line {j + 1}: table of section {section!r} ends without its ruler")
        name, unit, value = row[:cuts[1]].strip(), row[cuts[1]:cuts[2]].strip(), row[cuts[2]:].strip()
        block.labels.setdefault((section, name), (value, unit))
        j += 1
    return j + 1


def parse_text_report(text: str) -> TextReport:
    """Parse ncu's plain-text (stdout) report into one Launch per result block, ids 0, 1, ...

    Raises NcuParseError for a table that does not end with its ruler.
    """
    lines = text.splitlines()
    blocks, program, profiled, passes = [], [], 0, None
    block, section, i = None, None, 0
    while i < len(lines):
        line = lines[i]
        if m := _BLOCK.match(line):
            block = Launch(len(blocks), m["kernel"], _dims(m["grid"]), _dims(m["block"]), m["cc"],
                           m["stream"])
            blocks.append(block)
        elif block is None:
            if line.startswith("==PROF== Profiling"):
                profiled += 1
            if p := re.findall(r"- (\d+) passes", line):
                passes = int(p[-1])
            if line.strip() and not line.startswith(("==", "....")) and not re.match(r"\[\d+\] ", line):
                program.append(line.rstrip())
        elif m := _SECTION.match(line):
            section = m["name"]
        elif (section and _RULER.match(line) and i + 2 < len(lines) and "Metric Name" in lines[i + 1]
              and lines[i + 2].rstrip() == line.rstrip()):
            i = _table(lines, i, block, section)
            continue
        i += 1
    return TextReport(blocks, program, profiled, passes)


def program_info(program: list) -> dict:
    """What the program printed about its run: ``verified`` (True/False from a ``[verify] ... PASS``
    or ``FAIL`` line, absent without one), ``verify_line``, and ``m, n, k, batch`` from a
    ``[profile] name | M=.. N=.. K=.. B=..`` line."""
    info = {}
    for line in program:
        if line.startswith("[verify]") and (v := re.search(r"\b(PASS|FAIL)\b", line)):
            info.update(verified=v[1] == "PASS", verify_line=line)
        if line.startswith("[profile]"):
            info.update({k.lower() if k != "B" else "batch": int(v)
                         for k, v in re.findall(r"\b([MNKB])=(\d+)", line)})
    return info


def _block_run(block: Launch, info: dict, path: Path, sha: str, gpu: str | None, metrics: list) -> tuple:
    """(params, tags, metrics) of one result block."""
    batch = info.get("batch")
    role = "unknown" if batch is None else ("profiled" if block.grid[2] == batch else "other")
    values, missing = canonical(block, metrics, None)
    params = {"kernel": block.function, "grid": list(block.grid), "block": list(block.block),
              "source.file": path.name, "source.block": block.id}
    if role == "profiled":
        params.update({f"problem.{k}": info[k] for k in ("m", "n", "k", "batch") if k in info})
    sections = {s for s, _ in block.labels}
    tags = {"kernel": block.function, "source": "ncu_text", "source_sha256": sha, "launch_role": role,
            "compute_capability": block.cc.replace(".", ""), "stream": block.stream, "ncu": "done",
            "ncu.set": "full" if "Warp State Statistics" in sections else "basic",
            "ncu.missing": "; ".join(f"{k} ({v})" for k, v in missing.items()) or "none",
            "run_key": hashlib.sha256(f"{sha}|{block.id}".encode()).hexdigest()[:24]}
    if role == "profiled":      # the study's measured configuration: what the analysis reads
        tags["backend"] = "reference"
    if gpu:
        tags["gpu"] = gpu
    if "verified" in info:
        tags["verified"] = str(info["verified"]).lower()
    return params, tags, values


def import_reports(paths, uri: str, experiment: str, gpu: str | None = None, rerun: bool = False,
                   echo=print) -> int:
    """Load ncu text reports into MLflow ``experiment``: one parent run per file (tag
    ``kind=reference-study``), one child run per result block with the canonical ``ncu.*`` metrics
    (``ncu.duration_us`` in us, ...), ``verified`` from the program's ``[verify]`` line and
    ``launch_role``: ``profiled`` (tag ``backend=reference``, params ``problem.*``) for the block
    whose grid z equals the ``[profile]`` line's B, ``other`` for the program's other launches.
    Blocks already imported (same file content and block) are skipped unless ``rerun``.
    Returns the number of runs created. Raises NcuParseError for a file without result blocks,
    StoreError (:class:`experiments.store.track.Tracker`) for a store or experiment that cannot be used.
    A new store is made, and each file checked and imported, under the store's lock, so that
    concurrent imports into one store add nothing twice.
    """
    from mlflow.entities import Metric, Param, RunTag

    from ..store.track import Tracker, store_lock
    tr = Tracker(uri, experiment)
    client, exp_id = tr.client, tr.experiment_id
    metrics = list(load_table().metrics.values())
    created = 0
    for path in map(Path, paths):
        text = path.read_text(errors="replace")
        rep = parse_text_report(text)
        if not rep.blocks:
            raise NcuParseError(f"{path}: no ncu result block (a line '  kernel(...) (gx, gy, gz)x(...), "
                                "Context ..., CC X.Y') in the file; is it ncu's text output?")
        sha = hashlib.sha256(text.encode()).hexdigest()
        info = program_info(rep.program)
        runs = [_block_run(b, info, path, sha, gpu, metrics) for b in rep.blocks]
        kept = f"{len(rep.blocks)} result block(s) of {rep.profiled} profiled launch(es)"
        with store_lock(uri):
            done = {r.data.tags.get("run_key") for r in client.search_runs(
                [exp_id], f"tags.source_sha256 = '{sha}'", max_results=1000)}
            todo = [r for r in runs if rerun or r[1]["run_key"] not in done]
            if not todo:
                echo(f"{path.name}: {kept}, already imported (--rerun to import again)")
                continue
            parent = client.create_run(exp_id, run_name=path.name, tags={
                "kind": "reference-study", "source": "ncu_text", "source_file": str(path),
                "source_sha256": sha, "ncu.blocks_kept": kept}).info.run_id
            now = int(time.time() * 1000)
            for params, tags, values in todo:
                name = f"{path.stem} #{params['source.block']} {params['kernel']} {tuple(params['grid'])}"
                rid = client.create_run(exp_id, run_name=name,
                                        tags={**tags, "mlflow.parentRunId": parent}).info.run_id
                client.log_batch(rid, metrics=[Metric(k, v, now, 0) for k, v in values.items()],
                                 params=[Param(k, str(v)) for k, v in params.items()],
                                 tags=[RunTag("ncu.metrics", str(len(values)))])
                client.set_terminated(rid)
                created += 1
            client.set_terminated(parent)
        roles = [t["launch_role"] for _, t, _ in todo]
        flag = ""
        if info.get("verified") is False:
            flag = f"; the program's own check FAILED, runs tagged verified=false: {info['verify_line']}"
        echo(f"{path.name}: {kept}; imported {len(todo)} ({roles.count('profiled')} profiled "
             f"configuration, grid z = B = {info.get('batch', '?')}){flag}")
    return created
