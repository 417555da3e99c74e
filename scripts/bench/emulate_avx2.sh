#!/usr/bin/env bash
# Run a command as a CPU without AVX-512 would run it, on a CPU with AVX-512: torch's kernels
# (ATEN_CPU_CAPABILITY), oneDNN's (ONEDNN_MAX_CPU_ISA), MKL's (MKL_ENABLE_INSTRUCTIONS) and vLLM's
# (its _C_AVX2 library, via avx2/sitecustomize.py) all take their AVX2 code paths, in the command's own
# process and every process it starts. The cores, caches and memory stay this machine's: what it
# reproduces is how the code paths' costs scale (a vLLM round against a plain step), not the slow
# CPU's seconds. Usage: scripts/bench/emulate_avx2.sh <command> [args...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export BLOCKDRAFT_EMULATED_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
export PYTHONPATH="$here/avx2${PYTHONPATH:+:$PYTHONPATH}"
exec "$@"
