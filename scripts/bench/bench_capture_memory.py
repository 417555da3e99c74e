"""Peak memory of capturing 5 layers of a 36-layer target: forward hooks vs output_hidden_states.

Each mode runs in a fresh subprocess; the figure is the peak resident memory during the
forward minus the resident memory just before it (same model, same input).

    .venv/bin/python scripts/bench/bench_capture_memory.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from publish import stamp

LAYERS = 36
CAPTURED = [1, 9, 17, 25, 33]
SHAPE = (4, 2048)  # rows x tokens


def measure(mode: str) -> dict:
    import resource

    import torch

    from blockdraft.models.target import TargetModel
    from blockdraft.models.tiny_target import build_tiny_model

    torch.manual_seed(0)
    hf = build_tiny_model("qwen3", vocab_size=1024, num_layers=LAYERS, hidden_size=256)
    target = TargetModel(hf, CAPTURED)
    ids = torch.randint(0, 1024, SHAPE)
    with torch.no_grad():
        target.capture(ids[:, :8])  # warm-up allocations outside the measurement
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    with torch.no_grad():
        if mode == "hooks":
            feats = target.capture(ids)
        else:
            hs = hf(ids, output_hidden_states=True).hidden_states
            feats = torch.cat([hs[i + 1] for i in CAPTURED], dim=-1)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"mode": mode, "extra_peak_mib": (peak - before) / 1024, "seconds": seconds, "features": list(feats.shape)}


def main() -> None:
    if len(sys.argv) > 1:
        print(json.dumps(measure(sys.argv[1])))
        return
    results = []
    for mode in ("hooks", "output_hidden_states"):
        out = subprocess.run([sys.executable, __file__, mode], capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"capture of {len(CAPTURED)} of {LAYERS} layers, input {SHAPE[0]}x{SHAPE[1]} tokens, hidden 256, fp32; {stamp()}")
    for r in results:
        print(f"{r['mode']:<22} peak +{r['extra_peak_mib']:8.1f} MiB  {r['seconds']:6.2f} s  features {r['features']}")
    print(f"ratio output_hidden_states / hooks: {results[1]['extra_peak_mib'] / results[0]['extra_peak_mib']:.2f}x")


if __name__ == "__main__":
    main()
