"""``python -m experiments.profile``: the command of :mod:`experiments.ncu.profile`."""
import sys

from experiments.cli import run_main
from experiments.ncu.profile import main

if __name__ == "__main__":
    sys.exit(run_main(main))
