"""Entry point: ``python run.py [-m] key=value ...`` (Hydra). See README.md and ``--help``."""
import hydra

from experiments.config import register

register()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg) -> None:
    from experiments.job import run_job
    from experiments.spec import SpecError
    try:
        run_job(cfg)
    except SpecError as exc:   # single run: an impossible configuration stops before any work
        raise SystemExit(f"Invalid configuration: {exc}") from None


if __name__ == "__main__":
    main()
