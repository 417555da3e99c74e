#!/usr/bin/env bash
# `blockdraft pipeline` end to end on one CUDA machine, as a user runs it, in one command of under 10 minutes.
#
#   scripts/gpu_check.sh --prepare            # here first: the kit (.gpu-kit/: wheels, SmolLM2's tokenizer, 300 rows)
#   scripts/gpu_pipeline.sh --dry-run         # here, on the CPU: the same runs at a tiny width (make test-slow runs it)
#   scripts/gpu_pipeline.sh --results FILE    # on the GPU machine, from the repository root
#
# The target is a Qwen3 of about 0.5B parameters with random weights, built from a config (nothing is
# downloaded): the Qwen3-0.6B shape (28 layers, width 1024, 16 heads, 8 kv heads of 128) with
# SmolLM2's tokenizer (49,152 tokens), so that the demo's recipes and mask token apply. The GPU machine
# has torch and transformers but no vLLM, so regen uses the transformers backend and the serve check
# and the gate the reference engine. Two runs share one out directory: DFlash (smollm2_dflash_cpu),
# then DFlash2 (smollm2_dflash2_cpu), whose rerun keeps the regen and capture stages. Each: the gate,
# regen, capture to a bfloat16 store, training with flex attention in bfloat16, a bfloat16 export, and
# the serve check on held-out prompts. Every step is bounded in time and appends what it printed to one
# results file (markdown), with each stage's seconds from stages.json.
set -uo pipefail
CALLER=$(pwd)
cd "$(dirname "$0")/.."
REPO=$(pwd)
KIT=${GPU_KIT:-.gpu-kit}
RESULTS=gpu_pipeline_results.md
MODE=run
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) MODE=dry ;;
    --results) RESULTS=$2; [ "${RESULTS#/}" = "$RESULTS" ] && RESULTS=$CALLER/$RESULTS; shift ;;
    --kit) KIT=$2; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "unknown argument $1; use --dry-run, --results FILE or --kit DIR" >&2; exit 2 ;;
  esac
  shift
done
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ "$MODE" = dry ] && PY=.venv/bin/python
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

# What differs between the GPU run and its dry run: the target's width, the sizes, the attention and dtypes.
if [ "$MODE" = dry ]; then
  WIDTH=64 HEADS=4 KV_HEADS=2 HEAD_DIM=16 INTERMEDIATE=192
  TOKENIZER_DIR=${TOKENIZER_DIR:-.cache/targets/smollm2-135m-instruct}
  PROMPTS=${PROMPTS:-tiny} NUM_TRAIN=16 NUM_HELDOUT=4 MAX_TOKENS=24 STEPS=20 GATE_STEPS=20 SERVE_TOKENS=16
  ATTENTION=sdpa DTYPE=float32 EXPORT_DTYPE=float32  # flex has no backward on a CPU; vLLM-free CPU serving is fp32
  # As on the GPU machine, which has no vLLM: the gate and the serve check never ask one.
  NO_VLLM="serve.vllm_python=/nonexistent/vllm-python gate.vllm_python=/nonexistent/vllm-python"
  OUT=${GPU_PIPELINE_OUT:-/tmp/gpu_pipeline_dry_run}
  T_TARGET=120 T_FIRST=900 T_SECOND=900
else
  WIDTH=1024 HEADS=16 KV_HEADS=8 HEAD_DIM=128 INTERMEDIATE=3072
  TOKENIZER_DIR=$KIT/smollm2
  PROMPTS=$KIT/data/train.jsonl NUM_TRAIN=${GPU_PIPELINE_ROWS:-48} NUM_HELDOUT=8 MAX_TOKENS=96
  STEPS=${GPU_PIPELINE_STEPS:-300} GATE_STEPS=150 SERVE_TOKENS=64
  ATTENTION=flex DTYPE=bfloat16 EXPORT_DTYPE=bfloat16
  NO_VLLM=""  # the machine has none: the default serving interpreter is absent
  OUT=/tmp/gpu-pipeline
  # Not yet run on a GPU: regen's transformers backend decodes one turn at a time (about 20 ms a token for
  # a 0.5B model: 56 replies of up to 96 tokens in under 2 minutes), training's flex compiles once. The
  # second run keeps regen and capture. 60 + 300 + 200 s: inside one 10-minute command.
  T_TARGET=60 T_FIRST=${GPU_PIPELINE_T_FIRST:-300} T_SECOND=${GPU_PIPELINE_T_SECOND:-200}
fi
TARGET=$OUT-target
# Target layers for 28 layers (the recipes' [1, 10, 18, 27] are SmolLM2's 30).
LAYERS="[1,9,17,25]"

# One pipeline run of a recipe into $OUT: every stage, the gate first.
pipeline_args() {
  echo "target=$TARGET out=$OUT prompts=$PROMPTS experiment=$1 gate=true round_cost=false" \
       "regen.backend=transformers regen.num_train=$NUM_TRAIN regen.num_heldout=$NUM_HELDOUT regen.max_tokens=$MAX_TOKENS" \
       "capture.storage_dtype=bfloat16 draft.target_layer_ids=$LAYERS" \
       "train.max_steps=$STEPS train.attention_backend=$ATTENTION train.dtype=$DTYPE train.log_every=20 train.progress=false" \
       "export.dtype=$EXPORT_DTYPE serve.engine=reference serve.max_tokens=$SERVE_TOKENS" \
       "gate.engine=reference gate.steps=$GATE_STEPS gate.max_steps=$GATE_STEPS gate.dtype=$EXPORT_DTYPE $NO_VLLM"
}

STEP_NAME=gpu-pipeline
# section and run_step
source scripts/gpu_steps.sh

# Each stage's seconds and state, from the run's own record.
stage_times() {
  "$PY" - "$OUT/stages.json" <<'EOF'
import json, sys
for name, stage in json.load(open(sys.argv[1])).items():
    if isinstance(stage, dict) and "seconds" in stage:
        state = "done" if stage.get("done") else ("failed" if stage.get("failed") else "not done")
        print(f"{name:8s} {state:8s} {stage['seconds']:8.1f} s")
EOF
}

run_all() {
  local failed=0
  { echo "# blockdraft pipeline on $([ "$MODE" = dry ] && echo 'the CPU (dry run, width 64)' || echo 'one GPU'), $(date -u +%Y-%m-%dT%H:%MZ)"
    echo; echo '```'; command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1
    "$PY" -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__)"
    echo '```'; } > "$RESULTS"
  # Here the demo's SmolLM2 directory is made from its GGUF when missing; there the kit carries its tokenizer.
  [ "$MODE" = dry ] && [ ! -f "$TOKENIZER_DIR/tokenizer.json" ] && "$PY" -m blockdraft.models.prepare_gguf
  [ -f "$TOKENIZER_DIR/tokenizer.json" ] \
    || { echo "no tokenizer in $TOKENIZER_DIR: run scripts/gpu_check.sh --prepare first" >&2; return 2; }
  rm -rf "$TARGET"
  run_step "random-weight Qwen3, width $WIDTH, 28 layers, SmolLM2's tokenizer" $T_TARGET \
    "$PY" scripts/make_random_target.py "$TOKENIZER_DIR" "$TARGET" --qwen3 "$WIDTH,$HEADS,$KV_HEADS,$HEAD_DIM,$INTERMEDIATE,28" || return 1
  rm -rf "$OUT"
  for recipe in smollm2_dflash_cpu smollm2_dflash2_cpu; do
    local limit=$T_FIRST; [ $recipe = smollm2_dflash2_cpu ] && limit=$T_SECOND
    run_step "pipeline: $recipe" $limit "$PY" -m blockdraft.pipeline $(pipeline_args $recipe) || failed=1
    [ -f "$OUT/stages.json" ] && { section "$recipe: each stage's seconds"; { echo '```'; stage_times; echo '```'; } >> "$RESULTS"; }
  done
  echo "[gpu-pipeline] results in $RESULTS"
  return $failed
}

case $MODE in
  dry) run_all ;;
  run)
    command -v nvidia-smi > /dev/null || { echo "no nvidia-smi: run this on a CUDA machine, or use --dry-run here" >&2; exit 2; }
    if [ -d "$KIT/wheels" ]; then
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site "$KIT"/wheels/*.whl || exit 1
      export PYTHONPATH=/tmp/gpu-site:$REPO${PYTHONPATH:+:$PYTHONPATH}
    else
      export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
    fi
    "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
      || { echo "torch sees no CUDA device (check the driver and CUDA_VISIBLE_DEVICES)" >&2; exit 2; }
    run_all ;;
esac
