"""Imported by every Python process started under scripts/bench/emulate_avx2.sh (this folder leads
PYTHONPATH there): torch.cpu's AVX-512 and AMX probes answer False, so vLLM loads its `_C_AVX2` kernels
and picks the code paths a CPU without AVX-512 takes. The environment the script sets does the same for
torch's own kernels, oneDNN and MKL."""

import os


def _answer_no_avx512() -> None:
    try:
        import torch.cpu
    except ImportError:  # an interpreter without torch (pip, a shell helper): nothing to answer
        return
    for probe in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_avx512_vnni_supported",
                  "_is_amx_tile_supported", "_is_amx_fp16_supported"):
        if hasattr(torch.cpu, probe):
            setattr(torch.cpu, probe, lambda: False)


if os.environ.get("BLOCKDRAFT_EMULATED_ISA") == "avx2":
    _answer_no_avx512()
