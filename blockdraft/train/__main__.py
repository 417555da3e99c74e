"""`python -m blockdraft.train experiment=<recipe> [key=value ...]` (also under torchrun); `--help` lists every key."""

import sys

import hydra

from blockdraft.config import CONFIG_DIR, register_schema
from blockdraft.config.app_help import AppHelp, exit_if_help_asked
from blockdraft.config.recipe import TrainAppConfig
from blockdraft.config.target_argument import rewrite_target_argument, target_argument_or_exit
from blockdraft.errors import ConfigError, DataError

register_schema("train_schema", TrainAppConfig)

HELP = AppHelp(
    app="train", module="blockdraft.train", schema=TrainAppConfig,
    usage="[experiment=<recipe>] [target=<group or dir>] [<group>=<option> ...] [key=value ...]",
    example="experiment=tiny_cpu train.max_steps=20 run_dir=runs/try",
    notes=("target=<dir> trains against a local Hugging Face directory (target.path=<dir>, no tiny target);",
           "several processes: torchrun --nproc_per_node=N -m blockdraft.train ... (or blockdraft pipeline train.nproc=N)."),
    rewrite=rewrite_target_argument,
)


@hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base=None)
def main(cfg) -> None:
    from blockdraft.ranks.rank_watch import PeerFailed
    from blockdraft.train.loop import run_training
    from blockdraft.train.stops import NonFiniteSteps, Preempted

    from hydra.core.hydra_config import HydraConfig

    try:
        run_dir = run_training(cfg, HydraConfig.get().overrides.task)
    except (ConfigError, DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except PeerFailed as err:  # another rank's error: said by this rank too, so every rank's log holds it
        print(f"error: stopping because {err}", file=sys.stderr)
        sys.exit(1)
    except NonFiniteSteps as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except Preempted as stop:
        print(f"[train] {stop}", file=sys.stderr)
        sys.exit(143)  # 128 + SIGTERM, what a scheduler expects of a preempted job
    print(f"[train] done: {run_dir}")


if __name__ == "__main__":
    exit_if_help_asked(HELP)
    sys.argv = target_argument_or_exit(sys.argv)
    main()
