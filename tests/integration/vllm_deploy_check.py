"""Read deploy lines as vLLM reads them; run with the serving interpreter (it must not import blockdraft).

    .venv-serve/bin/python tests/integration/vllm_deploy_check.py CASES.json

CASES.json is {name: "<the printed line>"}. For each line: its words split as a shell splits them, the
environment words set as the shell would set them, the rest parsed by the `vllm serve` subcommand's own
parser and checked by its own validation; then the engine arguments build the target's configs and,
from them, vLLM's SpeculativeConfig. Last, the whole VllmConfig is built twice, with the line's
environment and without it, to see which model runner vLLM picks (and what it refuses). One JSON
line per case is printed: `RESULT {...}`.
"""

import json
import os
import shlex
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


def serve_parser():
    """`vllm serve`'s parser, built as vLLM's CLI builds it (entrypoints/cli/main.py)."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    command = ServeSubcommand()
    command.subparser_init(parser.add_subparsers(dest="subparser"))
    return parser, command


def split_line(line: str):
    """(environment, the words after `vllm`): a shell's split of one command line."""
    words = shlex.split(line)
    env = {}
    while words and "=" in words[0] and words[0].split("=", 1)[0].isidentifier():
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    if len(words) < 2 or os.path.basename(words[0]) != "vllm" or words[1] != "serve":
        raise ValueError(f"not a `vllm serve` line: {line!r}")
    return env, words[1:]


def runner_outcome(engine_args, env: dict) -> str:
    """What building the whole VllmConfig says under `env` (a value of None: unset): the runner it picks,
    or its refusal."""
    saved = {key: os.environ.get(key) for key in env}
    for key, value in env.items():
        os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    try:
        config = engine_args.create_engine_config()
        return "ok: V2 model runner" if config.use_v2_model_runner else "ok: V1 model runner"
    except Exception as err:  # vLLM's refusal is the finding
        return f"refused: {err}"
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)


def check(name: str, line: str, parser, command) -> dict:
    import copy

    from vllm.engine.arg_utils import AsyncEngineArgs

    env, words = split_line(line)
    args = parser.parse_args(words)
    command.validate(args)
    args.model = args.model_tag  # as ServeSubcommand.cmd does
    engine_args = AsyncEngineArgs.from_cli_args(args)
    target_only = copy.deepcopy(engine_args)
    target_only.speculative_config = None
    target = target_only.create_engine_config()
    spec = copy.deepcopy(engine_args).create_speculative_config(target.model_config, target.parallel_config)
    hf = spec.draft_model_config.hf_config
    return {
        "name": name, "env": env, "target": args.model,
        "method": spec.method, "model": spec.model, "num_speculative_tokens": spec.num_speculative_tokens,
        "architectures": list(spec.draft_model_config.architectures or []),
        "draft_vocab_size": getattr(hf, "draft_vocab_size", None),
        "with_env": runner_outcome(engine_args, env),
        "without_env": runner_outcome(engine_args, dict.fromkeys(env)) if env else None,
    }


def main() -> int:
    cases = json.loads(open(sys.argv[1]).read())
    parser, command = serve_parser()
    for name, line in cases.items():
        print("RESULT " + json.dumps(check(name, line, parser, command)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
