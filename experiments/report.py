"""``python -m experiments.report``: the command of :mod:`experiments.reports.report`."""
import sys

from experiments.cli import run_main
from experiments.reports.report import main

if __name__ == "__main__":
    sys.exit(run_main(main))
