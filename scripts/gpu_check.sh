#!/usr/bin/env bash
# The GPU path, checked on one CUDA machine in one command of under 10 minutes.
#
#   scripts/gpu_check.sh --prepare            # here (a CPU with a package registry): build the kit
#   scripts/gpu_check.sh --dry-run            # here: every step exists and parses (make test-slow runs it)
#   scripts/gpu_check.sh --results FILE       # on the GPU machine, from the repository root
#   scripts/gpu_check.sh --serve --results FILE  # there too, with vLLM 0.32 in $VLLM_PYTHON: serving
#
# The GPU machine needs only torch, transformers, accelerate, safetensors, tqdm and matplotlib: the
# rest travels in the kit (.gpu-kit/: wheels from scripts/gpu_wheels.toml, SmolLM2-135M's config and
# tokenizer, 300 of the demo's regenerated rows). Every step is bounded in time and appends what it
# printed to one results file (markdown):
#   1. pytest -m cuda            flex vs SDPA, bf16 vs fp32, the chunked loss at 151,936, activation
#                                checkpointing, DDP over nccl, a GPU checkpoint resumed on the CPU
#   2. scripts/bench/bench_train_gpu.py  the Qwen3-8B-shaped draft: tokens/s, step split, memory, MFU
#   3. the demo recipe           SmolLM2-135M-shaped target (random weights), bf16, flex: step time
# --serve, a second command of under 10 minutes (vLLM pins its own torch: it is the machine's own
# interpreter, VLLM_PYTHON, default .venv-serve/bin/python, never carried in the kit):
#   4. the gate on a DSpark draft  smollm2_dspark_cpu's draft trained on the random-weight
#                                SmolLM2-135M's own reply, exported in bfloat16, served by vLLM with
#                                method dspark (its V2 GPU runner): the reply unchanged, the draft accepted
set -uo pipefail
CALLER=$(pwd)
cd "$(dirname "$0")/.."
REPO=$(pwd)
KIT=${GPU_KIT:-.gpu-kit}
RESULTS=gpu_check_results.md
MODE=run
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) MODE=dry ;;
    --prepare) MODE=prepare ;;
    --serve) MODE=serve ;;
    --results) RESULTS=$2; [ "${RESULTS#/}" = "$RESULTS" ] && RESULTS=$CALLER/$RESULTS; shift ;;
    --kit) KIT=$2; shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "unknown argument $1; use --prepare, --dry-run, --results FILE, --serve or --kit DIR" >&2; exit 2 ;;
  esac
  shift
done
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ "$MODE" != run ] && [ "$MODE" != serve ] && PY=.venv/bin/python
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
# Time limits per step (seconds); together well inside one 10-minute command. On one H200 (2026-12-04)
# the cuda tests took 218 s (the DDP and CPU-resume tests 122 s of it), the benchmark 83, the target 12,
# the recipe 76: 180 s for the tests timed out there.
T_TESTS=${GPU_CHECK_T_TESTS:-280} T_BENCH=${GPU_CHECK_T_BENCH:-140} T_TARGET=${GPU_CHECK_T_TARGET:-30} T_RECIPE=${GPU_CHECK_T_RECIPE:-110}
REAL_STEPS=${GPU_CHECK_RECIPE_STEPS:-200}
SMOLLM2_DIR=.cache/targets/smollm2-135m-instruct
DEMO_ROWS=.cache/demo/regen/train.jsonl
# --serve: one vLLM start-up (compilation and CUDA graphs included), the training and the export.
# Not yet measured on a GPU; on the 2-core CPU the same gate (reference engine, float32) took 185 s.
T_GATE=${GPU_CHECK_T_GATE:-480}
VLLM_PY=${VLLM_PYTHON:-$REPO/.venv-serve/bin/python}

# The demo recipe online on the GPU: the run whose step time is compared with the CPU's.
recipe_args() {
  echo "experiment=smollm2_dflash_cpu target.path=$1 data.train=$KIT/data/train.jsonl data.val=null" \
       "train.attention_backend=flex train.dtype=bfloat16" \
       "train.max_steps=$REAL_STEPS train.save_every=0 train.log_every=20 train.progress=false run_dir=$2"
}

# The one-sample gate with the CPU DSpark recipe's draft: it takes the target's own greedy reply (a
# random-weight target's reply is as good as any: a draft trained on other rows would be accepted
# nowhere), trains the draft on it, exports it in bfloat16 and serves it on that prompt: with vLLM
# only (engine=vllm refuses rather than fall back to the reference engine), method dspark (what the
# harness sends for a dspark export). $1 the target, $2 out, $3 the serving Python.
gate_args() {
  echo "target=$1 out=$2 vllm_python=$3 experiment=smollm2_dspark_cpu steps=150 max_steps=300 dtype=bfloat16" \
       "engine=vllm overwrite=true train.attention_backend=sdpa train.dtype=bfloat16"
}

prepare() {
  set -e
  mkdir -p "$KIT/smollm2" "$KIT/data"
  "$PY" scripts/gpu_wheels.py fetch "$KIT/wheels"
  [ -f "$SMOLLM2_DIR/config.json" ] || "$PY" -m blockdraft.models.prepare_gguf
  for f in config.json generation_config.json tokenizer.json tokenizer_config.json chat_template.jinja; do
    [ -f "$SMOLLM2_DIR/$f" ] && cp "$SMOLLM2_DIR/$f" "$KIT/smollm2/"
  done
  if [ ! -f "$DEMO_ROWS" ]; then
    echo "no $DEMO_ROWS: run \`make demo\` once (its regen stage writes the rows), then --prepare again" >&2
    exit 1
  fi
  head -n 300 "$DEMO_ROWS" > "$KIT/data/train.jsonl"
  du -sh "$KIT"
  echo "kit ready in $KIT: carry it, and run scripts/gpu_check.sh --results <file> on the GPU machine"
}

dry_run() {
  local fail=0 log
  log=$(mktemp)
  step() { local name=$1; shift; if "$@" > "$log" 2>&1; then echo "ok    $name";
           else echo "FAIL  $name"; tail -20 "$log"; fail=1; fi; }
  step "this script parses" bash -n "$0"
  step "the scripts compile" "$PY" -m py_compile scripts/bench/bench_train_gpu.py scripts/bench/publish.py scripts/gpu_wheels.py scripts/make_random_target.py
  if [ -d "$KIT/wheels" ]; then
    step "the wheels list and the kit's wheels resolve" "$PY" scripts/gpu_wheels.py check --wheels "$KIT/wheels"
  else
    step "the wheels list resolves (no kit yet: --prepare fetches it)" "$PY" scripts/gpu_wheels.py check
  fi
  step "the GPU steps import nothing optional" "$PY" scripts/gpu_wheels.py imports
  step "the cuda tests collect" "$PY" -m pytest -q --collect-only -m cuda -p no:cacheprovider tests/cuda
  step "the benchmark runs (tiny shapes, CPU)" "$PY" scripts/bench/bench_train_gpu.py --dry-run
  step "the recipe run composes" "$PY" -m blockdraft.train $(recipe_args "$SMOLLM2_DIR" /tmp/gpu_check_dry_run) --cfg job
  step "the DSpark gate composes (--serve)" "$PY" -m blockdraft.gate $(gate_args "$SMOLLM2_DIR" /tmp/gpu_check_dry_run "$VLLM_PY") --cfg job
  rm -f "$log"
  [ $fail = 0 ] && echo "dry run: every step is ready" || echo "dry run: some steps would fail" >&2
  return $fail
}

# --- on the GPU machine ----------------------------------------------------------------------
STEP_NAME=gpu-check
# section and run_step
source scripts/gpu_steps.sh

recipe_summary() {
  "$PY" - "$1" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl") if '"step_time_s"' in l]
later = rows[1:] or rows  # the first window holds flex's compilation
print(f"steps {rows[-1]['step']}, median step time after the first window {statistics.median(r['step_time_s'] for r in later):.4f} s, "
      f"first window {rows[0]['step_time_s']:.4f} s, tokens/s {statistics.median(r['tokens_per_s'] for r in later):.0f}, "
      f"loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}, max memory {rows[-1].get('max_memory_gib', 0):.2f} GiB")
EOF
}

# The kit's wheels on the path, the machine in the results file's head, and a CUDA device.
gpu_setup() {
  if [ -d "$KIT/wheels" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site "$KIT"/wheels/*.whl || exit 1
    export PYTHONPATH=/tmp/gpu-site:$REPO${PYTHONPATH:+:$PYTHONPATH}
  else
    export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
  fi
  { echo "# $1, $(date -u +%Y-%m-%dT%H:%MZ)"; echo
    echo '```'; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
    "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| transformers', transformers.__version__)"
    "$PY" scripts/gpu_wheels.py verify; echo '```'; } > "$RESULTS"
  # Without a CUDA device every cuda test would skip and the step would pass: refuse instead.
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
    || { echo "torch sees no CUDA device (check the driver and CUDA_VISIBLE_DEVICES); results so far: $RESULTS" >&2; return 2; }
}

gpu_run() {
  local failed=0
  gpu_setup "GPU check" || return $?
  # -v: a step stopped at its limit still names the test that was running.
  run_step "pytest -m cuda" $T_TESTS "$PY" -m pytest -m cuda -v -p no:cacheprovider -rA tests/cuda || failed=1
  run_step "throughput: the Qwen3-8B-shaped draft" $T_BENCH "$PY" scripts/bench/bench_train_gpu.py --out /tmp/bench_train_gpu.json || failed=1
  [ -f /tmp/bench_train_gpu.json ] && { section "benchmark records (JSON)"; echo '```json' >> "$RESULTS"; cat /tmp/bench_train_gpu.json >> "$RESULTS"; echo '```' >> "$RESULTS"; }
  if run_step "random-weight SmolLM2-135M" $T_TARGET "$PY" scripts/make_random_target.py "$KIT/smollm2" /tmp/smollm2-random; then
    rm -rf /tmp/gpu-recipe
    run_step "the demo recipe, bf16 autocast and flex, $REAL_STEPS steps" $T_RECIPE "$PY" -m blockdraft.train $(recipe_args /tmp/smollm2-random /tmp/gpu-recipe) || failed=1
    [ -f /tmp/gpu-recipe/metrics.jsonl ] && { section "the demo recipe: step time"; recipe_summary /tmp/gpu-recipe >> "$RESULTS"; }
  else
    failed=1
  fi
  echo "[gpu-check] results in $RESULTS"
  return $failed
}

gate_summary() {
  "$PY" - "$1" <<'EOF'
import json, re, sys
from pathlib import Path
from blockdraft.serve.harness import runner_from_log
out = Path(sys.argv[1])
g = json.loads((out / "gate.json").read_text())
print(f"verdict {g.get('verdict')}, engine {g.get('engine')}, kind {g.get('kind')}, block_size {g.get('block_size')}")
print(f"mean acceptance length {g.get('mean_acceptance_length')} (training reached {g.get('train_accept_len')}, "
      f"the floor {g.get('min_acceptance_length')}), per position {g.get('acceptance_per_position')}")
log = out / "serve" / "vllm_draft.log"
if log.is_file():
    print(f"model runner: {runner_from_log(log)}")
    said = [l.strip()[:300] for l in log.read_text(errors="replace").splitlines() if re.search("dspark|DSpark", l)]
    print("\n".join(said[:6]) if said else "the draft server's log never names DSpark")
for failure in g.get("failures") or []:
    print(f"failure: {failure}")
EOF
}

# --serve: a DSpark export served by vLLM on the GPU, with method dspark.
gpu_serve() {
  local failed=0
  [ -x "$VLLM_PY" ] && "$VLLM_PY" -c "import vllm" 2> /dev/null \
    || { echo "no vLLM in VLLM_PYTHON=$VLLM_PY: point VLLM_PYTHON at a Python with vLLM 0.32 on this machine" >&2; return 2; }
  gpu_setup "GPU serving check" || return $?
  { echo '```'; "$VLLM_PY" -c "import vllm; print('vLLM', vllm.__version__)"; echo "in $VLLM_PY"; echo '```'; } >> "$RESULTS"
  run_step "random-weight SmolLM2-135M" $T_TARGET "$PY" scripts/make_random_target.py "$KIT/smollm2" /tmp/smollm2-random || return 1
  run_step "the gate on a DSpark draft: vLLM, method dspark, bfloat16" $T_GATE \
    "$PY" -m blockdraft.gate $(gate_args /tmp/smollm2-random /tmp/gpu-dspark-gate "$VLLM_PY") || failed=1
  if [ -f /tmp/gpu-dspark-gate/gate.json ]; then
    section "the DSpark gate: what vLLM served"
    { echo '```'; gate_summary /tmp/gpu-dspark-gate; echo '```'; } >> "$RESULTS"
  fi
  echo "[gpu-check] results in $RESULTS"
  return $failed
}

case $MODE in
  prepare) prepare ;;
  dry) dry_run ;;
  run|serve)
    command -v nvidia-smi > /dev/null || { echo "no nvidia-smi: run this on a CUDA machine, or use --dry-run here" >&2; exit 2; }
    if [ $MODE = run ]; then gpu_run; else gpu_serve; fi ;;
esac
