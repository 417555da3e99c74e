"""What the demo's stages cost on each CPU class it was measured on, and so what size fits 30 minutes.

Each class's throughputs come from a fresh-clone `make demo` on a 2-core machine of that class
(docs/benchmarks-history.md, demo_budget, gives each figure's run); `stage_seconds` turns a preset size into
seconds per stage, and `shares` into what a newcomer's half hour goes to. The preset (`demo.SIZES`) is
chosen so that on every class the stages and the probe fit 30 minutes, training takes at least 35% of
them and measuring (probe + serve) at most 35%; a test holds every class to that.
"""

from __future__ import annotations

from dataclasses import dataclass

BUDGET_S = 1800.0
MIN_TRAIN_SHARE = 0.35
MAX_MEASURE_SHARE = 0.35


@dataclass(frozen=True)
class Throughputs:
    """Seconds of one unit of each stage's work on a CPU class."""

    target_s: float  # de-quantising the GGUF
    startup_s: float  # one vLLM start-up
    regen_row_s: float  # one answered row, 96 requests in flight
    capture_row_s: float  # one row's features (bfloat16 where the CPU has it, else float32)
    step_s: float  # one training step of the demo recipe
    train_setup_s: float  # training's start before its first step
    export_s: float
    baseline_token_s: float  # one generated token at batch 1 without the draft
    draft_token_s: float  # the same with the demo's trained draft
    probe_token_s: float  # the same with the probe's untrained draft (one token a round)


# From each class's demo (docs/benchmarks-history.md, demo_budget): AMX 2026-12-03 (9323034), AVX512-BF16
# 2026-12-04 (5992ac1), neither 2026-12-03 (7b0ee35). The untrained draft's token costs a round: the round
# cost measured there (1.22, 1.05, 1.42) times a plain step. Those were rounds of 3 drafted tokens; the class
# without AVX-512 now serves 1, whose round costs less on its code paths (its draft served 1.21 plain steps a round
# at k = 1 against 1.38 at k = 3, docs/benchmarks-history.md, round_profile_avx2), so its probe and serve stage take
# at most what is counted here.
MEASURED = {
    "amx": Throughputs(18, 32, 0.375, 0.149, 0.1025, 12, 3, 1 / 14.73, 1 / 16.91, 1.22 / 14.73),
    "avx512_bf16": Throughputs(17, 25, 0.377, 0.255, 0.1145, 12, 3, 1 / 20.03, 1 / 26.10, 1.05 / 20.03),
    "other": Throughputs(48, 82, 0.788, 0.735, 0.21, 41, 6, 1 / 7.55, 1 / 7.41, 1.42 / 7.55),
}
# Soft labels (train.kl_weight=1: the target's top-32 kept beside the features, and a KL term in the loss) against
# hard labels alone, on a Xeon with AMX from the same 200 float32 rows (docs/benchmarks-history.md, small_data):
# the capture took 65.5 s against 59.9 s, a step 0.1103 s against 0.1011 s.
SOFT_LABEL_CAPTURE_FACTOR = 65.5 / 59.9
SOFT_LABEL_STEP_FACTOR = 0.1103 / 0.1011
# The probe (pipeline/round_cost.py PROBE_SETTINGS): one warm-up prompt and four measured ones of 64
# tokens a side, after a short request of 8; the serve app's own start (imports, tokenizer) besides.
PROBE_TOKENS_A_SIDE = 5 * 64 + 8
APP_START_S = 10.0
# Two servers loading side by side (the probe's and the serve stage's kept pair) were both up after 47.1 s
# on the Xeon where one alone took 32 s (2026-12-06): they share two cores.
PAIR_STARTUP_FACTOR = 47.1 / 32


def step_seconds(size: dict, speed: Throughputs) -> float:
    """One training step of the preset `size` on this class: dearer with soft labels."""
    return speed.step_s * (SOFT_LABEL_STEP_FACTOR if size.get("soft_labels") else 1.0)


def stage_seconds(size: dict, speed: Throughputs, heldout_rows: int = 48, serve_tokens: int = 128) -> dict:
    """Seconds per stage (and the probe) of a preset `size`: rows, minutes, steps, serve_prompts, warmup_prompts,
    and soft_labels (optional)."""
    serve_tokens_a_side = (size["serve_prompts"] + size["warmup_prompts"]) * serve_tokens + 8
    return {
        "target": speed.target_s,
        "probe": PAIR_STARTUP_FACTOR * speed.startup_s + APP_START_S
        + PROBE_TOKENS_A_SIDE * (speed.baseline_token_s + speed.probe_token_s),
        "regen": speed.startup_s + (size["rows"] + heldout_rows) * speed.regen_row_s,
        "capture": size["rows"] * speed.capture_row_s * (SOFT_LABEL_CAPTURE_FACTOR if size.get("soft_labels") else 1.0),
        "train": speed.train_setup_s + min(size["minutes"] * 60, size["steps"] * step_seconds(size, speed)),
        "export": speed.export_s,
        "serve": PAIR_STARTUP_FACTOR * speed.startup_s + APP_START_S
        + serve_tokens_a_side * (speed.baseline_token_s + speed.draft_token_s),
    }


def shares(seconds: dict) -> dict:
    """The total, and the shares of training and of measuring (probe + serve) in it."""
    total = sum(seconds.values())
    return {"total_s": total, "train": seconds.get("train", 0.0) / total,
            "measure": (seconds.get("probe", 0.0) + seconds.get("serve", 0.0)) / total}
