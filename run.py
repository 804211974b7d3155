"""Entry point: ``python run.py [-m] key=value ...`` (Hydra). See README.md and ``--help``."""
import hydra

from experiments.config import register

register()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg) -> None:
    from experiments.job import run_job
    run_job(cfg)


if __name__ == "__main__":
    main()
