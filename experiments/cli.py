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
