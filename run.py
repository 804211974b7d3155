"""Entry point: ``python run.py [-m] key=value ...`` (Hydra). See README.md and ``--help``.

Ctrl-C (or SIGTERM) closes the runs in progress as KILLED, says what was kept and exits 130 (143);
re-running the same command resumes: finished runs are skipped, new ones join the same parent run.
"""
import os
import signal
import sys

import hydra
from omegaconf import OmegaConf

from experiments.config import register
from experiments.worker import gpu_count

register()
OmegaConf.register_new_resolver("pid", os.getpid, use_cache=True, replace=True)
OmegaConf.register_new_resolver("gpu_count", lambda: max(1, gpu_count()), use_cache=True, replace=True)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg) -> None:
    from experiments.config import Config
    from experiments.job import JobError, run_job
    from experiments.spec import SpecError
    known = set(OmegaConf.structured(Config).keys())
    if unknown := sorted(set(cfg.keys()) - known):
        raise SystemExit(f"Unknown config key(s): {', '.join(unknown)} (added with '+'?). "
                         f"Valid top-level keys: {', '.join(sorted(known))}; see python run.py --help")
    try:
        run_job(cfg)
    except SpecError as exc:   # single run: an impossible configuration stops before any work
        raise SystemExit(f"Invalid configuration: {exc}") from None
    except JobError as exc:
        raise SystemExit(f"Cannot run: {exc}") from None


def _terminate(signum, frame):
    raise KeyboardInterrupt(signum)


if __name__ == "__main__":
    from experiments.track import abort_open_runs
    signal.signal(signal.SIGTERM, _terminate)
    try:
        main()
    except KeyboardInterrupt as exc:
        signal.signal(signal.SIGINT, signal.SIG_IGN)     # a second Ctrl-C must not cut the cleanup
        term = exc.args == (signal.SIGTERM,)
        ended, kept = abort_open_runs("KILLED", "interrupted by " + ("SIGTERM" if term else "Ctrl-C"))
        print(f"\nInterrupted: {kept} run(s) finished in this command are kept; {ended} run(s) in progress "
              "marked KILLED. Run the same command again to resume (finished runs are skipped).",
              file=sys.stderr, flush=True)
        sys.exit(143 if term else 130)
    finally:
        abort_open_runs("FAILED", "the command ended without closing this run")
