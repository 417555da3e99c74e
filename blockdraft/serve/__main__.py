"""Smoke-serve a draft with vLLM: is greedy output unchanged, and is the draft doing work?

    python -m blockdraft.serve draft=<export dir> target=<HF dir> \
        prompts=<file.jsonl|sharegpt|humaneval|tiny> num_prompts=<n> max_tokens=<n> out=<dir>

`draft=` / `target=` are aliases of `draft_dir=` / `target_dir=` (see ServeConfig).
Exit status: 0 passed; 1 the check failed (not lossless, draft not active, acceptance
below min_acceptance_length, or a server that failed); 2 refused before launch (the
message says what to fix); 130 interrupted. Every server started is stopped first.
"""

from __future__ import annotations

import signal
import sys
from typing import List

import hydra
from omegaconf import OmegaConf

from blockdraft.config import CONFIG_DIR, register_schema
from blockdraft.config.app_help import AppHelp, exit_if_help_asked
from blockdraft.serve import cli
from blockdraft.serve.cli import USER_ERRORS
from blockdraft.serve.config import ServeConfig

register_schema("serve_schema", ServeConfig)

ALIASES = {"draft=": "draft_dir=", "target=": "target_dir="}


@hydra.main(config_path=str(CONFIG_DIR), config_name="serve", version_base=None)
def main(conf) -> None:
    from blockdraft.serve.harness import run

    cfg: ServeConfig = OmegaConf.to_object(conf)
    try:
        report = run(cfg)
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted; the vLLM server was stopped", file=sys.stderr)
        sys.exit(130)
    sys.exit(0 if report["passed"] else 1)


def alias_arguments(argv: List[str]) -> List[str]:
    """serve's aliases: `draft=` / `target=` for `draft_dir=` / `target_dir=`."""
    return cli.alias_arguments(argv, ALIASES)


HELP = AppHelp(
    app="serve", module="blockdraft.serve", schema=ServeConfig,
    usage="draft=<export dir> target=<HF dir> [prompts=<file.jsonl|sharegpt|humaneval|tiny>] [key=value ...]",
    example="draft=exports/try target=.cache/targets/tiny-qwen3 prompts=tiny num_prompts=4 out=runs/serve",
    notes=("draft=<dir> / target=<dir> are draft_dir= / target_dir=. Exit status: 0 passed, 1 the check failed, "
           "2 refused before launch, 130 interrupted.",),
    rewrite=alias_arguments,
)


if __name__ == "__main__":
    exit_if_help_asked(HELP)
    signal.signal(signal.SIGTERM, cli.terminate_as_interrupt)
    sys.argv = alias_arguments(sys.argv)
    main()
