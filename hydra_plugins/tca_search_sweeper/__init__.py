"""``hydra/sweeper=search``: experiments.runner.search.SearchSweeper, registered where Hydra takes sweepers
from (the ``hydra_plugins`` package). Without Optuna (pip install -e ".[search]") there is none."""
try:
    import optuna  # noqa: F401
except ModuleNotFoundError as exc:
    if exc.name != "optuna":
        raise
else:
    from experiments.runner.search import SearchSweeper as _Sweeper

    class SearchSweeper(_Sweeper):
        """experiments.runner.search.SearchSweeper."""
