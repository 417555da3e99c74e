"""Prove that vLLM loads every weight of an exported DFlash draft, and nothing else.

Run with the serving interpreter (it must not import blockdraft):
    .venv-serve/bin/python scripts/check_vllm_weights.py --target T --draft D [--num-speculative-tokens K]

vLLM's DFlash loader returns None from load_weights, so vLLM itself never checks that
every draft parameter was filled: a tensor missing from the file leaves its parameter
uninitialised and acceptance collapses silently. This script loads the draft in-process,
snapshots the drafter's tensors the moment load_weights returns (on CPU the linear
weights are repacked and emptied right afterwards), and compares them with the file.
Exit 0 when everything matches, 1 otherwise.
"""

import argparse
import json
import os
import sys
from pathlib import Path

# vLLM reads these at import time; the engine must live in this process for the hook.
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402

# Names the DFlash loader drops (qwen3_dflash.py load_weights and AutoWeightsLoader's
# REMOVE_UNUSED_ROTARY_EMBEDS_MAPPER): a file that ships them carries dead weight.
ROTARY_LEFTOVERS = ("rotary_pos_emb.inv_freq", "rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
# Attention's KV-cache quantisation scales: registered buffers that default to 1.0 and are
# only ever read from a quantised checkpoint.
KV_SCALES = ("_k_scale", "_v_scale", "_q_scale", "_prob_scale")
QKV_SHARDS = {"q": 0, "k": 1, "v": 2}
MASK_EMBEDDING_FILE = "mask_embedding.pt"


# --- shared by the head checks (check_vllm_dspark.py, check_vllm_lilicorr.py) ----------------------------------
_PROCESS_GROUP = []  # vLLM's process group is set up once per process


def drafter_config(target: str, draft: Path, method: str, k: int):
    """vLLM's config for the target with `draft` as its speculator (method, k drafted tokens), validated as vLLM
    validates it. VllmConfig itself refuses a drafter that needs the V2 model runner (DSpark, LiLiCorr) on the
    CPU's V1 runner: the runner is the CPU's choice, not the draft's, so the speculative config is set afterwards."""
    from vllm.config import SpeculativeConfig
    from vllm.engine.arg_utils import EngineArgs

    vllm_config = EngineArgs(model=target, dtype="float32", max_model_len=256, enforce_eager=True).create_engine_config()
    spec = SpeculativeConfig(method=method, model=str(draft), num_speculative_tokens=k,
                             target_model_config=vllm_config.model_config,
                             target_parallel_config=vllm_config.parallel_config)
    print(f"vLLM config: method={spec.method} num_speculative_tokens={spec.num_speculative_tokens} "
          f"architectures={spec.draft_model_config.architectures}")
    vllm_config.speculative_config = spec
    return vllm_config


def one_process_group() -> None:
    """vLLM's (single-rank, gloo) process group, which building a model needs; inside set_current_vllm_config."""
    import tempfile

    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    if not _PROCESS_GROUP:
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{tempfile.mkdtemp()}/init")
        ensure_model_parallel_initialized(1, 1)
        _PROCESS_GROUP.append(True)


def prepare_for_compute(model, vllm_config) -> None:
    """What the loader does after load_weights (on a CPU: repack each linear for its GEMM kernel)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    with set_current_vllm_config(vllm_config):
        process_weights_after_loading(model, vllm_config.speculative_config.draft_model_config, torch.device("cpu"))


def read_draft(draft: Path) -> dict:
    index = draft / "model.safetensors.index.json"
    # Same file choice as vLLM: the index's shards when there is one, else every *.safetensors.
    if index.is_file():
        files = sorted({draft / f for f in json.loads(index.read_text())["weight_map"].values()})
    else:
        files = sorted(draft.glob("*.safetensors"))
    if not files:
        sys.exit(f"no safetensors in {draft}")
    tensors = {}
    mask_file = draft / MASK_EMBEDDING_FILE
    if mask_file.is_file():  # vLLM's own loader reads it into model.mask_embedding
        state = torch.load(mask_file, weights_only=True)
        tensors[MASK_EMBEDDING_FILE] = (state["embedding"] if isinstance(state, dict) else state).reshape(-1)
    for path in files:
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                tensors[name] = f.get_tensor(name)
    return tensors


def find_drafter(llm, expected):
    """The DFlash model inside the engine: the V1 runner's drafter, else a short search."""
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM

    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    drafter = getattr(getattr(runner, "drafter", None), "model", None)
    if drafter is expected:
        return runner, drafter, "llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter.model"
    # The V2 runner names it `speculator`; search the runner's attributes two levels deep.
    for name, obj in vars(runner).items():
        for sub_name, sub in [("", obj), *((f".{k}", v) for k, v in getattr(obj, "__dict__", {}).items())]:
            if isinstance(sub, DFlashQwen3ForCausalLM) and sub is expected:
                return runner, sub, f"...model_runner.{name}{sub_name}"
    sys.exit("could not find the DFlashQwen3ForCausalLM that vLLM loaded inside the engine "
             "(expected at ...driver_worker.worker.model_runner.drafter.model); vLLM's layout changed")


def vllm_name(model, file_name):
    """(param name, shard id) the DFlash loader routes a file tensor to, or (None, why)."""
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3Model

    if file_name == MASK_EMBEDDING_FILE:
        return "model.mask_embedding", None
    # Outer renames of DFlashQwen3ForCausalLM.load_weights.
    if "t2d" in file_name:
        return None, "skipped by vLLM's DFlash loader (t2d is never used)"
    if "mask_hidden" in file_name:
        return None, "rejected by vLLM's DFlash loader (masks come from mask_token_id)"
    if "d2t" in file_name:
        name = file_name.replace("d2t", "draft_id_to_target_id")
    elif "lm_head" not in file_name:
        name = "model." + file_name
    else:
        name = file_name
    if any(s in name for s in ROTARY_LEFTOVERS):
        return None, "dropped by vLLM (rotary tables are recomputed)"
    if "fc." in name and not model.model.use_aux_hidden_state:
        return None, "dropped by vLLM (use_aux_hidden_state is off)"
    if "mask_embedding" in name:
        return None, "dropped by vLLM (it reads a mask embedding only from mask_embedding.pt)"
    if not name.startswith("model."):
        return name, None
    # Inner renames and q/k/v, gate/up stacking of DFlashQwen3Model.load_weights.
    mapped = DFlashQwen3Model.hf_to_vllm_mapper._map_name_with_shard(name[len("model."):])
    if mapped is None:
        return None, "dropped by vLLM's DFlash model mapper"
    return "model." + mapped[0], mapped[1]


def rows_for(model, param_name, shard):
    """Row range of the (possibly fused) parameter that one file tensor fills."""
    if shard is None:
        return None
    module = model.get_submodule(param_name.rsplit(".", 1)[0])
    index = QKV_SHARDS.get(shard, shard)
    if not isinstance(index, int):
        raise ValueError(f"{param_name}: unsupported shard id {shard!r}")
    sizes = module.output_sizes
    start = sum(sizes[:index])
    return start, start + sizes[index]


def check(draft, tensors, model, state, live, target_model):
    problems, excluded, equal = [], [], 0
    covered = {name: torch.zeros(t.shape[0] if t.dim() else 1, dtype=torch.bool) for name, t in state.items()}
    filled = set()
    for file_name, tensor in sorted(tensors.items()):
        name, shard = vllm_name(model, file_name)
        if name is None:
            problems.append(f"unexpected: {file_name}: {shard}")
            continue
        if name not in state:
            problems.append(f"unexpected: {file_name} -> {name}: no such parameter in vLLM's drafter")
            continue
        param = state[name]
        span = rows_for(model, name, shard)
        start, stop = span if span else (0, tensor.shape[0] if tensor.dim() else 1)
        got = param[start:stop] if param.dim() else param
        # The vocab-parallel lm_head/embedding pads its rows; the file fills the first ones.
        if span is None and param.dim() and tensor.dim() and param.shape[0] > tensor.shape[0] \
                and hasattr(model.get_submodule(name.rsplit(".", 1)[0]), "org_vocab_size"):
            if torch.count_nonzero(param[tensor.shape[0]:]):
                problems.append(f"wrong: {name}: vocab padding rows are not zero")
            covered[name][tensor.shape[0]:] = True
        if got.shape != tensor.shape:
            problems.append(f"wrong: {file_name} -> {name}: shape {tuple(tensor.shape)} in file, {tuple(got.shape)} in vLLM")
            continue
        covered[name][start:stop] = True
        filled.add(name)
        # Cast like vLLM's copy_ does, so a bf16 file in an fp32 model compares exactly.
        if not torch.equal(got, tensor.to(param.dtype)):
            diff = (got.double() - tensor.double()).abs().max().item()
            problems.append(f"wrong: {file_name} -> {name}: values differ (max abs diff {diff:g})")
            continue
        # Still the same after the engine finished starting, where vLLM kept the tensor.
        now = live.get(name)
        if now is not None and now.numel() == param.numel() and not torch.equal(now.reshape(param.shape).cpu(), param):
            problems.append(f"wrong: {name} changed after loading")
            continue
        equal += 1

    # What vLLM fills without the file, each justified against the running engine.
    target_inner = target_model.model
    excused = {
        "model.embed_tokens.weight": (lambda: model.model.embed_tokens is target_inner.embed_tokens,
                                      "shared from the target"),
        # A reduced-vocabulary draft cannot use the target's full-width head.
        "lm_head.weight": (lambda: model.lm_head is target_model.lm_head and model.draft_id_to_target_id is None,
                           "shared from the target when the draft has no lm_head"),
        "model.mask_embedding": (lambda: not model.model.has_separate_mask_embedding,
                                 "unused without mask_embedding.pt"),
    }
    for name, mask in covered.items():
        if bool(mask.all()):
            continue
        if name.endswith("rotary_emb.cos_sin_cache"):
            excluded.append(f"{name} (computed by vLLM from the rope config)")
            continue
        if name.rsplit(".", 1)[-1] in KV_SCALES and float(state[name]) == 1.0:
            excluded.append(f"{name} (KV-cache quantisation scale, neutral 1.0)")
            continue
        if name in excused and name not in filled:
            holds, why = excused[name]
            if holds():
                excluded.append(f"{name} ({why})")
                continue
            problems.append(f"missing: {name}: not in the file, and not {why} here")
            continue
        rows = mask.logical_not().nonzero().flatten().tolist()
        part = f" (rows {rows[0]}..{rows[-1]} of {len(mask)})" if name in filled else ""
        problems.append(f"missing: {name}{part}: no tensor of {draft} fills it")
    return problems, excluded, equal


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--num-speculative-tokens", type=int)
    args = p.parse_args()
    draft = Path(args.draft).resolve()
    config = json.loads((draft / "config.json").read_text())
    k = args.num_speculative_tokens
    if k is None:
        k = (config.get("dflash_config") or {}).get("block_size", config.get("block_size")) - 1

    import vllm
    from vllm.model_executor.models import qwen3_dflash

    seen = {}
    original = qwen3_dflash.DFlashQwen3ForCausalLM.load_weights

    def load_weights(self, weights):
        result = original(self, weights)
        # Snapshot now: process_weights_after_loading repacks (and empties) CPU linears next.
        seen["model"] = self
        seen["state"] = {n: t.detach().clone().cpu()
                         for n, t in [*self.named_parameters(), *self.named_buffers()]}
        return result

    qwen3_dflash.DFlashQwen3ForCausalLM.load_weights = load_weights
    llm = vllm.LLM(model=args.target, speculative_config={"method": "dflash", "model": str(draft),
                                                          "num_speculative_tokens": k},
                   enforce_eager=True, dtype="float32", max_model_len=512, max_num_seqs=2, seed=0,
                   disable_log_stats=False)
    if "model" not in seen:
        sys.exit("vLLM never called DFlashQwen3ForCausalLM.load_weights: is the draft a DFlash Qwen3 model?")
    runner, model, path = find_drafter(llm, seen["model"])
    print(f"drafter model: {path} ({type(model).__name__})")

    tensors = read_draft(draft)
    live = {n: t.detach() for n, t in [*model.named_parameters(), *model.named_buffers()]}
    problems, excluded, equal = check(draft, tensors, model, seen["state"], live, runner.model)
    print("not from the file, by design: " + "; ".join(excluded))
    missing = sum(p.startswith("missing") for p in problems)
    unexpected = sum(p.startswith("unexpected") for p in problems)
    if problems:
        print("\n".join(problems))
        print(f"vLLM loaded {equal} of {len(tensors)} tensors of {draft} correctly: {missing} missing, "
              f"{unexpected} unexpected, {len(problems) - missing - unexpected} wrong")
        return 1

    # Let the drafter actually run once.
    out = llm.generate(["The quick brown fox"], vllm.SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    print(f"greedy 8 tokens: {list(out[0].outputs[0].token_ids)}")
    try:
        counters = {m.name: m.value for m in llm.get_metrics()
                    if m.name.startswith("vllm:spec_decode") and hasattr(m, "value")}
        print("spec decode: " + ", ".join(f"{n.split(':', 1)[1]}={v:g}" for n, v in sorted(counters.items())))
    except Exception as e:  # the counters are a nicety, not part of the check
        print(f"spec decode counters unavailable: {e}")
    print(f"vLLM loaded {equal} tensors of {draft}: 0 missing, 0 unexpected, all equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
