"""`python -m blockdraft.train experiment=... key=value` (also under torchrun)."""

import sys

import hydra

from blockdraft.config import CONFIG_DIR, register_schema
from blockdraft.errors import ConfigError, DataError
from blockdraft.train.config import TrainAppConfig

register_schema("train_schema", TrainAppConfig)


@hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base=None)
def main(cfg) -> None:
    from blockdraft.train.loop import run_training
    from blockdraft.train.stops import NonFiniteSteps, Preempted

    try:
        run_dir = run_training(cfg)
    except (ConfigError, DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except NonFiniteSteps as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except Preempted as stop:
        print(f"[train] {stop}", file=sys.stderr)
        sys.exit(143)  # 128 + SIGTERM, what a scheduler expects of a preempted job
    print(f"[train] done: {run_dir}")


if __name__ == "__main__":
    main()
