"""The GPU check is ready before any GPU time is spent: its dry run, its wheels list, and the
benchmark's model-FLOPs count (the denominator-free half of its MFU)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

REPO = Path(__file__).resolve().parents[2]


def _script(name, folder="scripts"):
    spec = importlib.util.spec_from_file_location(name, REPO / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # runs every GPU-check step's CPU dry run (make test-slow); the pieces are tested below
def test_dry_run_finds_every_step_ready():
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "dry run: every step is ready" in proc.stdout
    assert proc.stdout.count("ok    ") == 8


def test_the_wheels_list_refuses_a_missing_requirement_and_a_wrong_pin(tmp_path):
    wheels = _script("gpu_wheels")
    text = wheels.LIST.read_text()
    broken = tmp_path / "list.toml"
    broken.write_text(text.replace('"omegaconf" = "2.3.1"\n', "").replace('"dill" = "0.4.1"', '"dill" = "0.3.0"'))
    problems = "\n".join(wheels.check(None, broken))
    assert "hydra-core needs omegaconf" in problems and "carry it" in problems
    assert "dill==0.3.0 is carried, but the tests here run dill 0.4.1" in problems
    assert "multiprocess needs dill>=0.4.1, but dill==0.3.0 is carried" in problems


def test_fetched_wheels_must_match_the_pins_and_the_gpu_machines_python(tmp_path):
    wheels = _script("gpu_wheels")
    carry = {"dill": "0.4.1", "xxhash": "4.1.0", "pytest": "9.2.0"}
    for name in ("dill-0.4.1-py3-none-any.whl", "xxhash-4.1.0-cp311-cp311-manylinux_2_17_x86_64.whl",
                 "dill-0.4.0-py3-none-any.whl"):
        (tmp_path / name).touch()
    problems = "\n".join(wheels.check_wheels(tmp_path, carry))
    assert "two wheels of dill" in problems
    assert "xxhash-4.1.0-cp311-cp311-manylinux_2_17_x86_64.whl: not for CPython 3.12" in problems
    assert "no wheel of pytest==9.2.0" in problems


def _matmul_flops(counter: FlopCounterMode) -> float:
    ops = counter.get_flop_counts()["Global"]
    return float(sum(n for op, n in ops.items() if "mm" in str(op) and "scaled_dot_product" not in str(op)))


def test_bench_model_flops_equal_what_torch_counts_for_the_matmuls():
    bench = _script("bench_train_gpu", "scripts/bench")
    shape, device = bench.TINY, torch.device("cpu")
    target, _ = bench.build_target(shape, device)
    draft_cfg = bench.resolve_draft_config(bench.DraftConfig(
        kind="dflash", num_layers=shape.draft_layers, block_size=shape.block, mask_token_id=shape.vocab - 1,
        target_layer_ids=list(shape.layer_ids)), target.model.config)
    draft = bench.build_draft(draft_cfg)
    batch = bench.build_batch(shape, device)
    cfg = bench.LoopConfig(num_anchors=shape.anchors)
    blocks = bench.draw_blocks(batch, cfg, shape.block, draft_cfg.mask_token_id, torch.Generator().manual_seed(0))
    expected = bench.forward_flops(shape, bench.attended_pairs(blocks, batch, shape), int(blocks.label_mask.sum()))
    with torch.no_grad():
        with FlopCounterMode(display=False) as counted_target:
            features = bench.batch_features(target, batch)
        mask = bench.block_attention_mask(blocks, batch, shape.block, "sdpa", None)
        with FlopCounterMode(display=False) as counted_draft:
            hidden = draft(draft.embed(blocks.block_ids, target.embed_tokens), blocks.block_position_ids,
                           draft.context_kv(features, batch["position_ids"]), mask, shape.block)
        h_sup = hidden.view(*blocks.label_mask.shape, -1)[blocks.label_mask]
        with FlopCounterMode(display=False) as counted_head:
            torch.nn.functional.linear(h_sup, target.lm_head_weight)
    # HF's rotary embedding adds one tiny matmul per forward; everything else must match exactly.
    assert _matmul_flops(counted_target) == pytest.approx(expected["target_matmul"], rel=2e-3)
    assert _matmul_flops(counted_draft) == pytest.approx(expected["draft_matmul"], rel=1e-9)
    assert _matmul_flops(counted_head) == pytest.approx(expected["head"], rel=1e-9)


def _gate_words(target, out, python):
    """The --serve step's gate arguments, as the script's own gate_args prints them."""
    script = f'eval "$(sed -n "/^gate_args()/,/^}}/p" scripts/gpu_check.sh)"; gate_args {target} {out} {python}'
    proc = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, check=True)
    return proc.stdout.split()


def test_serve_mode_gates_a_bfloat16_dspark_export_on_vllm_with_method_dspark(tmp_path):
    from types import SimpleNamespace

    from blockdraft.serve.harness import speculative_config
    from blockdraft.models.tiny_target import save_tiny_target
    from tests.unit.command_check import config_only_target, run_app

    # SmolLM2-135M's shape, config only (--cfg job loads no weights; a fresh checkout has not prepared SmolLM2).
    tiny = save_tiny_target(REPO / ".cache" / "targets" / "tiny-qwen3", "qwen3")
    smollm2 = config_only_target(tmp_path / "smollm2-135m-instruct", "llama", tiny, num_hidden_layers=30, hidden_size=576,
                                 intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3, vocab_size=49152)
    words = _gate_words(smollm2, tmp_path / "gate", "/srv/vllm/bin/python")
    assert {"engine=vllm", "dtype=bfloat16", "experiment=smollm2_dspark_cpu", "vllm_python=/srv/vllm/bin/python"} <= set(words)
    status, printed = run_app("gate", [*words, "--cfg", "job"])
    assert status == 0, printed[-2000:]
    assert "kind: dspark" in printed and "train_mask_embedding: false" in printed and "markov_rank: 64" in printed
    # What the harness then asks vLLM for, for a dspark export.
    plan = SimpleNamespace(draft=SimpleNamespace(kind="dspark", directory=tmp_path), num_speculative_tokens=4)
    assert speculative_config(plan)["method"] == "dspark"


def test_serve_mode_refuses_a_machine_without_vllm_before_any_work(tmp_path):
    (tmp_path / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA H100'\n")
    (tmp_path / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "VLLM_PYTHON": str(tmp_path / "no-python")}
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--serve", "--results", str(tmp_path / "r.md")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no vLLM in VLLM_PYTHON=" in proc.stderr
    assert not (tmp_path / "r.md").exists()
