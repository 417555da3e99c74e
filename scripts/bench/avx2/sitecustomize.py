"""Imported by every Python process started under scripts/bench/emulate_avx2.sh (this folder leads
PYTHONPATH there): torch.cpu's AVX-512 and AMX probes answer False, so vLLM loads its `_C_AVX2` kernels
and picks the code paths a CPU without AVX-512 takes. The environment the script sets does the same for
torch's own kernels, oneDNN and MKL."""

import os

if os.environ.get("BLOCKDRAFT_EMULATED_ISA") == "avx2":
    import torch.cpu

    for probe in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_avx512_vnni_supported",
                  "_is_amx_tile_supported", "_is_amx_fp16_supported"):
        if hasattr(torch.cpu, probe):
            setattr(torch.cpu, probe, lambda: False)
