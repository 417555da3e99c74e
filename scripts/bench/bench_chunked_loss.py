"""Peak memory of the block CE over 8192 slots x 152k vocabulary: chunked vs all logits at once.

Each variant runs forward + backward in a fresh subprocess; the figure is the peak resident
memory during the loss minus the resident memory before it. A hidden size of 256 keeps the
matmuls quick on a CPU; the logits, which dominate, do not depend on it.

    .venv/bin/python scripts/bench/bench_chunked_loss.py [chunk_size]
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

from publish import stamp

SLOTS, VOCAB, HIDDEN = 8192, 151_936, 256


def run(chunk: int) -> dict:
    import torch

    from blockdraft.losses.block import block_cross_entropy, chunked_block_cross_entropy

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(SLOTS, HIDDEN, generator=g, requires_grad=True)
    head = torch.randn(VOCAB, HIDDEN, generator=g) * 0.02
    labels = torch.randint(0, VOCAB, (SLOTS,), generator=g)
    weights = torch.rand(SLOTS, generator=g)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if chunk:
        loss = chunked_block_cross_entropy(hidden, head, labels, weights, chunk)
    else:
        loss = block_cross_entropy(hidden @ head.t(), labels, weights)
    loss.backward()
    return {"chunk": chunk, "loss": loss.item(), "grad_norm": hidden.grad.norm().item(),
            "extra_peak_gib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 2**20,
            "seconds": time.perf_counter() - start}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        print(json.dumps(run(int(sys.argv[2]))))
        return
    chunk = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    results = []
    for c in (0, chunk):
        out = subprocess.run([sys.executable, __file__, "--one", str(c)], capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"block CE forward+backward, {SLOTS} slots x {VOCAB} vocab, hidden {HIDDEN}, fp32; {stamp()}")
    for r in results:
        name = "all logits at once" if r["chunk"] == 0 else f"chunks of {r['chunk']}"
        print(f"{name:<20} peak +{r['extra_peak_gib']:6.2f} GiB  {r['seconds']:6.1f} s  loss {r['loss']:.6f}  |grad| {r['grad_norm']:.6f}")
    full, chunked = results
    print(f"memory ratio: {full['extra_peak_gib'] / chunked['extra_peak_gib']:.1f}x less with chunks; "
          f"loss difference {abs(full['loss'] - chunked['loss']):.2e}")


if __name__ == "__main__":
    main()
