"""What the report commands (experiments.reports.report, experiments.reports.performance,
experiments.ncu.profile, analysis.report) share as command lines."""
import os
import sys


def run_main(main) -> int:
    """Run a command's ``main()`` and return its exit status (an int; 0 for any other result). A
    closed stdout (``python -m experiments.report ... | head -1``) ends the command quietly with status
    1 instead of a BrokenPipeError traceback: stdout is pointed at the null device so that the
    interpreter's final flush finds nowhere to fail (Python's documented recipe for SIGPIPE)."""
    try:
        try:
            status = main()
        finally:                               # also after --help's SystemExit
            sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return status if isinstance(status, int) else 0


def positive_int(text: str) -> int:
    """argparse ``type`` of a count that must be at least 1 (``--n-boot``); raises
    argparse.ArgumentTypeError naming the value otherwise, which argparse reports with exit 2."""
    import argparse
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not a count: give 1 or more")
    return n


def out_problem(folder) -> str | None:
    """Why the output folder ``folder`` (to be made if absent) cannot take files, or None: a file
    where it or a folder above it should be, or a read-only folder (experiments.store.track.unwritable).
    Checked before a command computes anything."""
    from pathlib import Path

    from .store.track import unwritable
    folder = Path(folder).absolute()
    if (file := next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)):
        return f"{file} is a file, not a folder"
    if (locked := unwritable(folder)) is not None:
        return f"{locked} is read-only"
    return None


def refuse_store_options_with_table(ap, given: list) -> None:
    """With ``--table`` (a tidy table instead of a store): refuse the store's options ``given`` (their
    flags as typed, e.g. ["--sweep"]) through ``ap.error`` (exit 2), which would otherwise be ignored."""
    if given:
        ap.error(f"--table reads a tidy table, not a store: {', '.join(given)} would be ignored; leave "
                 f"{'it' if len(given) == 1 else 'them'} out, or give --uri instead of --table")
