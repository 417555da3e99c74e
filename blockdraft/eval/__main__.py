"""Evaluate drafts as users compare them: acceptance and speedup per dataset, per draft, greedy
and sampled, at each concurrency.

    python -m blockdraft.eval target=<HF dir> drafts=[<export>,<export>] \
        datasets=[sharegpt,humaneval] concurrency=[1,4] out=<dir>

`target=` is an alias of `target_dir=`. Writes <out>/eval.json, eval.md and the plots; a rerun
skips every finished cell. Exit status: 0 done (every greedy cell lossless); 1 a greedy cell was
not lossless or a server failed; 2 refused before launch (the message says what to fix); 130
interrupted. Every server started is stopped first.
"""

from __future__ import annotations

import signal
import sys

import hydra
from omegaconf import OmegaConf

from blockdraft.config import CONFIG_DIR, register_schema
from blockdraft.config.app_help import AppHelp, exit_if_help_asked
from blockdraft.eval.config import EvalAppConfig
from blockdraft.serve.cli import USER_ERRORS, alias_arguments, terminate_as_interrupt
from blockdraft.vllm_runtime.server import ServerError

register_schema("eval_schema", EvalAppConfig)

ALIASES = {"target=": "target_dir="}
HELP = AppHelp(
    app="eval", module="blockdraft.eval", schema=EvalAppConfig,
    usage="target=<HF dir> drafts=[<export>,...] [datasets=[sharegpt,humaneval]] [concurrency=[1,4]] [key=value ...]",
    example="target=/models/Qwen3-8B drafts=[exports/a,exports/b] datasets=[sharegpt] concurrency=[1,4] out=runs/eval",
    notes=("target=<dir> is target_dir=<dir>. Per dataset: dataset_options.<name>.{num_prompts,max_tokens,skip,"
           "use_chat_template,chat_template_kwargs}; add a sampling setting with +sampling.<name>={temperature:...}.",),
    rewrite=lambda argv: alias_arguments(argv, ALIASES),
)


def evaluate(cfg: EvalAppConfig) -> dict:
    """The whole evaluation (also what tests call); results are written even when a server fails."""
    from blockdraft.eval import results
    from blockdraft.eval.runner import Evaluation

    evaluation = Evaluation(cfg)
    try:
        evaluation.run()
    except BaseException:
        if evaluation.prompts:  # what finished is written before the error goes on
            results.write(evaluation)
        raise
    return results.write(evaluation)


@hydra.main(config_path=str(CONFIG_DIR), config_name="eval", version_base=None)
def main(conf) -> None:
    cfg: EvalAppConfig = OmegaConf.to_object(conf)
    try:
        report = evaluate(cfg)
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except ServerError as err:
        print(f"error: {err}\nThe finished cells are kept: rerun the same command to go on.", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("interrupted; the vLLM server was stopped, the finished cells are kept", file=sys.stderr)
        sys.exit(130)
    not_lossless = [r for r in report["results"] if r["lossless"] is False]
    for r in not_lossless:
        print(f"NOT LOSSLESS: {r['draft']} on {r['dataset']} ({r['setting']}, concurrency {r['concurrency']}): "
              f"{r['mismatches'][0]}", file=sys.stderr)
    sys.exit(1 if not_lossless else 0)


if __name__ == "__main__":
    exit_if_help_asked(HELP)
    signal.signal(signal.SIGTERM, terminate_as_interrupt)
    sys.argv = alias_arguments(sys.argv, ALIASES)
    main()
