"""``hydra/sweeper=search``: experiments.runner.search.SearchSweeper, registered where Hydra takes sweepers
from (the ``hydra_plugins`` package). Without Optuna (pip install -e ".[search]") there is none. Optuna is
looked up here, not imported: Hydra imports this module in every process it starts (the search imports
Optuna where it runs)."""
from importlib.util import find_spec

if find_spec("optuna") is not None:
    from experiments.runner.search import SearchSweeper as _Sweeper

    class SearchSweeper(_Sweeper):
        """experiments.runner.search.SearchSweeper."""
