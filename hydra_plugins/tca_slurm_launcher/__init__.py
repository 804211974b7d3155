"""``hydra/launcher=slurm``: experiments.runner.slurm.SlurmLauncher, registered where Hydra takes launchers
from (the ``hydra_plugins`` package). Without hydra-submitit-launcher (pip install -e ".[cluster]")
there is none."""
try:
    from experiments.runner.slurm import SlurmLauncher as _Launcher
except ModuleNotFoundError as exc:
    if not (exc.name or "").startswith(("hydra_plugins.hydra_submitit_launcher", "submitit")):
        raise
else:
    class SlurmLauncher(_Launcher):
        """experiments.runner.slurm.SlurmLauncher."""
