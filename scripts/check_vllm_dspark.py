"""Prove that vLLM 0.32 accepts an exported DSpark draft and computes its heads as we do.

Run with the serving interpreter (it must not import blockdraft):
    .venv-serve/bin/python scripts/check_vllm_dspark.py --target T --case D IN.pt OUT.pt [--case ...]

vLLM serves DSpark only from its V2 GPU model runner, so on a CPU no engine can start with it.
This script checks the three things that do not need the runner, with vLLM's own code:
1. the config: vLLM's SpeculativeConfig(method="dspark") parses and validates the export;
2. the weights: Qwen3DSparkForCausalLM is built on the CPU and its load_weights fed the export's
   files; every parameter must then hold its file tensor (scripts/check_vllm_weights.py's check:
   nothing missing, nothing unexpected, every value equal);
3. the numbers: on the hidden states and previous tokens in IN.pt, vLLM's compute_draft_logits,
   markov_embed + markov_bias, apply_markov_bias_gathered (dspark_draft_topk) and
   compute_confidence, saved to OUT.pt for the caller to compare with its own.
Exit 0 when 1 and 2 hold, 1 otherwise.
"""

import argparse
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from check_vllm_weights import (check, drafter_config, one_process_group, prepare_for_compute,  # noqa: E402
                                read_draft)  # (this directory)


def build_drafter(target: str, draft: Path, k: int):
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models.qwen3_dspark import Qwen3DSparkForCausalLM

    vllm_config = drafter_config(target, draft, "dspark", k)
    with set_current_vllm_config(vllm_config):
        one_process_group()
        model = Qwen3DSparkForCausalLM(vllm_config=vllm_config, prefix="")
        model.load_weights(read_draft(draft).items())
    return model, vllm_config


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--case", nargs=3, action="append", required=True, metavar=("DRAFT", "INPUTS", "OUT"))
    args = p.parse_args()
    failed = [check_case(args.target, Path(d).resolve(), i, o) for d, i, o in args.case]
    return 1 if any(failed) else 0


def check_case(target: str, draft: Path, inputs_path: str, out_path: str) -> bool:
    """True when vLLM refused or misloaded the draft."""
    config = json.loads((draft / "config.json").read_text())
    sample_from_anchor = config.get("sample_from_anchor", True)
    k = config["block_size"] if sample_from_anchor else config["block_size"] - 1
    model, vllm_config = build_drafter(target, draft, k)

    tensors = read_draft(draft)
    state = {n: t.detach().clone() for n, t in [*model.named_parameters(), *model.named_buffers()]}
    # load_dspark_model shares the target's embed_tokens (and its lm_head for a full vocabulary) after
    # loading, when the file has none (spec_decode/dspark/utils.py); there is no target module here.
    shared = SimpleNamespace(model=SimpleNamespace(embed_tokens=model.model.embed_tokens), lm_head=model.lm_head)
    problems, excluded, equal = check(draft, tensors, model, state, state, shared)
    print("not from the file, by design: " + "; ".join(excluded))
    missing = sum(p.startswith("missing") for p in problems)
    unexpected = sum(p.startswith("unexpected") for p in problems)
    if model.model.confidence_head is None and config.get("enable_confidence_head"):
        problems.append("missing: the config enables the confidence head but vLLM dropped it (no confidence_head tensors?)")

    inputs = torch.load(inputs_path, weights_only=True)  # tensors only: a file of ours, never code
    with torch.no_grad():
        if model.draft_id_to_target_id is None:  # the target's head, as load_dspark_model shares it
            head = load_file(str(Path(target) / "model.safetensors"))["lm_head.weight"]
            model.lm_head.weight.data[: head.shape[0]].copy_(head)
    prepare_for_compute(model, vllm_config)
    with torch.no_grad():
        hidden, previous = inputs["hidden"].float(), inputs["previous_ids"]
        base = model.compute_draft_logits(hidden)
        embed = model.markov_embed(previous)
        out = {"base_logits": base, "markov_bias": model.markov_bias(embed)}
        if model.model.confidence_head is not None:
            out["confidence"] = model.compute_confidence(hidden, embed)
        if "topk" in inputs:
            values, index = base.topk(int(inputs["topk"]), dim=-1)
            dense = torch.full_like(base, float("-inf"))
            out["topk_logits"] = model.apply_markov_bias_gathered(embed, dense, values, index)
        out["draft_ids_to_target"] = model.map_draft_to_target(torch.arange(base.shape[-1]))
    torch.save(out, out_path)

    if problems:
        print("\n".join(problems))
        print(f"vLLM loaded {equal} of {len(tensors)} tensors of {draft} correctly: {missing} missing, "
              f"{unexpected} unexpected, {len(problems) - missing - unexpected} wrong")
        return True
    print(f"vLLM loaded {equal} tensors of {draft}: 0 missing, 0 unexpected, all equal")
    return False


if __name__ == "__main__":
    sys.exit(main())
