"""`python -m blockdraft.capture <training overrides> out=<dir>`: a feature store.

    torchrun --nproc_per_node N -m blockdraft.capture <the same overrides> out=<dir>   (every GPU)

Composed from the training app's groups, so `experiment=`, `target.path=`, `data.*` and
`draft.target_layer_ids=` mean what they mean for training: the rows are tokenised by the
same code (and the same cache), the target runs once per row through the same capture,
and each shard holds exactly the tensor online training would feed the draft. Under torchrun
the shards are shared out among the ranks and the store is the one a single process writes.
Train from it with `data.features=<dir>`. A killed capture resumes at its unfinished shards,
on the same or another number of ranks.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from omegaconf import OmegaConf

from blockdraft.capture.config import CaptureAppConfig, check_capture_config
from blockdraft.config.app_help import AppHelp, exit_if_help_asked
from blockdraft.config.target_argument import rewrite_target_argument, target_argument_or_exit
from blockdraft.errors import ConfigError, DataError
from blockdraft.out_lock import beside, hold_out_lock

HELP = AppHelp(
    app="capture", module="blockdraft.capture", schema=CaptureAppConfig,
    usage="<training overrides: experiment=<recipe> target=<group or dir> key=value ...> out=<dir>",
    example="experiment=tiny_cpu out=runs/store  (then: blockdraft train experiment=tiny_cpu data.features=runs/store)",
    notes=("The training app's keys mean what they mean for training; the capture's own keys are the top-level ones after run_dir.",
           "target=<dir> captures a local Hugging Face directory (target.path=<dir>, no tiny target).",
           "Under torchrun (torchrun --nproc_per_node N -m blockdraft.capture ...) each rank captures its share of the "
           "shards; the store is the one a single process writes, and a killed capture resumes on any number of ranks."),
    rewrite=rewrite_target_argument,
)


def run_capture(cfg) -> Path:
    """Entry used by the command line and by tests with a composed config."""
    from blockdraft.capture.stage import CaptureStage
    from blockdraft.ranks.distributed import init_distributed

    if OmegaConf.is_missing(cfg, "out"):
        raise ConfigError("out is not set: give the store's directory, e.g. out=.cache/stores/<name>.")
    schema: CaptureAppConfig = OmegaConf.to_object(cfg)
    check_capture_config(schema)
    # One capture per store (blockdraft/out_lock.py), taken by global rank 0 before the stage loads anything: a
    # second capture is refused at once, naming the holder. The process group comes first, so that the other
    # ranks learn of rank 0's refusal within seconds (the app's report_failure). The lock lies beside the store,
    # <out>.lock: a store's directory holds only the store.
    init_distributed(schema.distributed.startup_timeout_s, schema.distributed.timeout_s,
                     use_gpu=schema.backend != "vllm")  # with vllm the servers take the GPUs
    with hold_out_lock(schema.out, "capture", schema.distributed.lease_s, lock_path=beside(schema.out),
                       remedy=CAPTURE_REMEDY):
        return CaptureStage(schema).run()


# What a second capture into the same store is told to do (the holder's pid and host filled in).
CAPTURE_REMEDY = ("Wait for that capture to end, or stop it (kill {pid} on {host}) and rerun the same command, which "
                  "resumes at its unfinished shards; for another store use another out=")


def main() -> None:
    import hydra

    from blockdraft.config import CONFIG_DIR

    exit_if_help_asked(HELP)
    sys.argv = target_argument_or_exit(sys.argv)

    @hydra.main(config_path=str(CONFIG_DIR), config_name="capture", version_base=None)
    def app(cfg) -> None:
        from blockdraft.ranks.distributed import report_failure, shutdown
        from blockdraft.ranks.rank_watch import PeerFailed

        rank = int(os.environ.get("RANK", "0"))
        try:
            out = run_capture(cfg)
        except PeerFailed as err:  # another rank's failure: every rank's log says it
            report_failure(err, rank)
            print(f"error: stopping because {err}", file=sys.stderr)
            sys.exit(1)
        except BaseException as err:
            # Every other rank learns of it within seconds, instead of waiting in a collective for the timeout.
            report_failure(err, rank)
            if not isinstance(err, (ConfigError, DataError)):
                raise
            # Every rank refuses the same config (rank 0's store refusal is broadcast), so that is said once;
            # a row's DataError is the rank's own that met it.
            if isinstance(err, DataError) or rank == 0:
                print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        if rank == 0:
            print(f"[capture] train from it with data.features={out}")
        shutdown()

    app()
