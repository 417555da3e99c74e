"""Prove that vLLM 0.32 loads an exported LiLiCorr draft and scores its candidate lattice as we do.

Run with the serving interpreter (it must not import blockdraft):
    .venv-serve/bin/python scripts/check_vllm_lilicorr.py --target T --draft D --inputs IN.pt --out OUT.pt

vLLM serves LiLiCorr only from its V2 GPU model runner, so on a CPU no engine can start with it.
This script checks, with vLLM's own code:
1. the config: SpeculativeConfig(method="dflash") reads the export as `LiLiCorrDraftModel`;
2. the weights: LiLiCorrForCausalLM is built on the CPU and its load_weights fed the export's files. That
   loader raises on any `lilicorr.` (or conv) parameter the file lacks (its coverage rule) and then calls
   the head's materialize_inference_buffers; every `lilicorr.` parameter must then hold its file tensor.
   The same file less one head tensor must be refused, or the coverage rule was not exercised;
3. the numbers: LiLiCorrHead.forward on IN.pt's lattice (token embeddings, top-k log-probs, slot
   hidden states, anchor state and validity), saved to OUT.pt for the caller to compare with its own.
Exit 0 when 1 and 2 hold, 1 otherwise.
"""

import argparse
import json
import os
import sys
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from check_vllm_weights import drafter_config, one_process_group, prepare_for_compute, read_draft  # noqa: E402

HEAD_PREFIX = "lilicorr."


def build_drafter(target: str, draft: Path):
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models.lilicorr import LiLiCorrForCausalLM

    block_size = json.loads((draft / "config.json").read_text())["dflash_config"]["block_size"]
    vllm_config = drafter_config(target, draft, "dflash", block_size - 1)
    with set_current_vllm_config(vllm_config):
        one_process_group()
        return vllm_config, lambda: LiLiCorrForCausalLM(vllm_config=vllm_config, prefix="")


def coverage_refuses_a_missing_head_tensor(vllm_config, make_model, tensors) -> bool:
    from vllm.config import set_current_vllm_config

    dropped = sorted(n for n in tensors if n.startswith(HEAD_PREFIX))[0]
    # A second drafter in this process: its attention layers register under the same names.
    vllm_config.compilation_config.static_forward_context.clear()
    with set_current_vllm_config(vllm_config):
        try:
            make_model().load_weights((n, t) for n, t in tensors.items() if n != dropped)
        except ValueError as e:
            print(f"without {dropped}: vLLM refused: {e}")
            return dropped in str(e)
    print(f"without {dropped}: vLLM loaded it anyway")
    return False


def head_problems(head, tensors) -> list:
    problems = []
    params = dict(head.named_parameters())
    for name, tensor in tensors.items():
        if not name.startswith(HEAD_PREFIX):
            continue
        short = name[len(HEAD_PREFIX):]
        if short not in params:
            problems.append(f"unexpected: {name}")
        elif not torch.equal(params[short].data.cpu(), tensor.to(params[short].dtype)):
            problems.append(f"wrong: {name}")
    problems += [f"missing: {HEAD_PREFIX}{n}" for n in params if HEAD_PREFIX + n not in tensors]
    return problems


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--inputs", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    draft = Path(args.draft).resolve()
    from vllm.config import set_current_vllm_config

    vllm_config, make_model = build_drafter(args.target, draft)
    tensors = read_draft(draft)
    with set_current_vllm_config(vllm_config):
        model = make_model()
        model.load_weights(tensors.items())  # raises on a coverage mismatch; materializes the head's buffers
    head = model.model.lilicorr
    problems = head_problems(head, tensors)
    if not coverage_refuses_a_missing_head_tensor(vllm_config, make_model, tensors):
        problems.append("coverage: a file without a head tensor was not refused")

    prepare_for_compute(model, vllm_config)
    inputs = torch.load(args.inputs, weights_only=True)  # tensors only: a file of ours, never code
    with torch.no_grad(), set_current_vllm_config(vllm_config):
        scores = head(inputs["token_embeddings"], inputs["candidate_log_probs"], inputs["pass_hidden"],
                      inputs["anchor_hidden"], inputs["anchor_valid"])
    torch.save({"scores": scores}, args.out)
    n_head = sum(n.startswith(HEAD_PREFIX) for n in tensors)
    if problems:
        print("\n".join(problems))
        return 1
    print(f"vLLM's LiLiCorrHead holds all {n_head} {HEAD_PREFIX} tensors of {draft}, all equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
