"""A DSpark export against vLLM 0.32's own code: its config validation, its loader, its heads.

vLLM runs DSpark only in its V2 GPU model runner, so no engine starts with it on a CPU;
scripts/check_vllm_dspark.py builds vLLM's Qwen3DSparkForCausalLM on the CPU instead, feeds its
load_weights the export, and runs its heads on hidden states and previous tokens chosen here.
Ours must give the same base logits, Markov bias, top-k corrected logits and confidence.
"""

import os

import pytest
import torch
from safetensors.torch import load_file

from blockdraft.export.writer import export_draft
from tests.integration.conftest import REPO
from tests.integration.renamed_draft import renamed_copy
from tests.integration.serving_env import serving_run
from tests.unit.export_helpers import make_run

SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
TARGET = REPO / ".cache" / "targets" / "tiny-qwen3"
pytestmark = [
    pytest.mark.serve,
    pytest.mark.skipif(not SERVE_PYTHON.is_file(), reason=f"no serving env at {SERVE_PYTHON}; run `make setup-serve`"),
]
# vLLM computes in float32 like us, but sums in another order.
ATOL = 1e-5

CASES = {
    # The defaults: anchor-first layout, the confidence head reading the Markov embedding, plus top-k.
    "anchor_first": dict(markov_rank=8, dspark_draft_topk=5),
    # The other layout, a reduced vocabulary (own head + d2t), the confidence head on h alone.
    "reduced_fill_in": dict(markov_rank=8, sample_from_anchor=False, draft_vocab_size=40, confidence_head_with_markov=False),
}


def _export(tmp_path, name, settings):
    step_dir, draft = make_run(tmp_path / name, kind="dspark", target_path=str(TARGET), **settings)
    if draft.reduced_vocab:
        head = load_file(str(TARGET / "model.safetensors"))["lm_head.weight"]
        vocab = torch.randperm(head.shape[0], generator=torch.Generator().manual_seed(0))[: settings["draft_vocab_size"]]
        draft.set_draft_vocab(vocab.sort().values, head)
        from blockdraft.models.io import save_draft
        save_draft(step_dir, draft)
    return export_draft(step_dir, tmp_path / f"{name}_export", dtype="float32", target_dir=TARGET), draft


def _ours(draft, inputs):
    head = load_file(str(TARGET / "model.safetensors"))["lm_head.weight"]
    hidden, previous = inputs["hidden"], inputs["previous_ids"]
    with torch.no_grad():
        base = draft.draft_logits(hidden, head)
        embed = draft.markov_head.embed(previous)
        out = {"base_logits": base, "markov_bias": draft.slot_logits(torch.zeros_like(base), embed, None)}
        if draft.confidence_head is not None:
            out["confidence"] = draft.confidence_logits(draft.joint_hidden(hidden, previous)).sigmoid()
        if "topk" in inputs:
            out["topk_logits"] = draft.slot_logits(base, embed, base.topk(int(inputs["topk"]), dim=-1).indices)
        out["draft_ids_to_target"] = draft.draft_token_ids() if draft.reduced_vocab else torch.arange(base.shape[-1])
    return out


def test_vllm_validates_loads_and_computes_our_dspark_exports(tmp_path):
    args, ours = [], {}
    for name, settings in CASES.items():
        export, draft = _export(tmp_path, name, settings)
        g = torch.Generator().manual_seed(1)
        inputs = {"hidden": torch.randn(6, draft.config.hidden_size, generator=g),
                  "previous_ids": torch.randint(0, draft.config.vocab_size, (6,), generator=g)}
        if draft.config.dspark_draft_topk:
            inputs["topk"] = draft.config.dspark_draft_topk
        torch.save(inputs, tmp_path / f"{name}_in.pt")
        ours[name] = _ours(draft.eval(), inputs)
        args += ["--case", str(export), str(tmp_path / f"{name}_in.pt"), str(tmp_path / f"{name}_out.pt")]
    # The first case again under SGLang's name: vllm_plugin/ must give vLLM the literal Qwen3DSparkModel,
    # or its SpeculativeConfig takes a DSpark draft of any other name for a DeepSeek-V4 one.
    first = next(iter(CASES))
    alias = renamed_copy(tmp_path / f"{first}_export", tmp_path / "alias", "Qwen3DSparkDraftModel")
    args += ["--case", str(alias), str(tmp_path / f"{first}_in.pt"), str(tmp_path / "alias_out.pt")]
    ours["alias"] = ours[first]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1"}
    proc = serving_run(["scripts/check_vllm_dspark.py", "--target", str(TARGET), *args], cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.stdout.count("method=dspark") == len(ours)
    assert proc.stdout.count("architectures=['Qwen3DSparkModel']") == len(ours)
    assert "draft architectures ['Qwen3DSparkDraftModel'] read as ['Qwen3DSparkModel']" in proc.stdout + proc.stderr
    assert proc.stdout.count("0 missing, 0 unexpected, all equal") == len(ours)
    for name in ours:
        theirs = torch.load(tmp_path / f"{name}_out.pt")
        assert set(theirs) == set(ours[name]), name
        for key, value in ours[name].items():
            if key == "draft_ids_to_target":
                assert torch.equal(theirs[key], value), (name, key)
                continue
            finite = torch.isfinite(value)
            assert torch.equal(finite, torch.isfinite(theirs[key])), (name, key)  # the top-k's -inf entries
            assert torch.allclose(theirs[key][finite], value[finite].float(), atol=ATOL), (name, key)
