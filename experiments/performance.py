"""``python -m experiments.performance``: the command of :mod:`experiments.reports.performance`."""
import sys

from experiments.cli import run_main
from experiments.reports.performance import main

if __name__ == "__main__":
    sys.exit(run_main(main))
