"""DSpark: a DFlash backbone with a Markov head (each slot's logits biased by the token before it) and a
confidence head for vLLM's adaptive verification; vLLM's `method: dspark` serves it on its V2 runner."""

from blockdraft.kinds.dspark.checks import check
from blockdraft.kinds.dspark.contract import weight_shapes
from blockdraft.kinds.dspark.export import DSPARK_SETTINGS, dspark_backbone_keys, export_keys, read_keys, resolve_settings
from blockdraft.kinds.dspark.reload import probe_outputs
from blockdraft.kinds.registry import register
from blockdraft.kinds.spec import VLLM_MODELS, KindSpec

SPEC = register(KindSpec(
    name="dspark",
    title="DSpark",
    model="blockdraft.kinds.dspark.model:DSparkDraftModel",
    architecture="Qwen3DSparkModel",
    card_title="DSpark (DFlash + Markov and confidence heads)",
    references=("paper: arXiv 2607.05147 (DSpark), the id the model's code cites",
                f"code: {VLLM_MODELS}qwen3_dspark.py (`Qwen3DSparkModel`, `method: dspark`)"),
    reads=("Qwen3DSparkDraftModel",),
    vllm_method="dspark",
    # vLLM 0.32 serves it on its V2 GPU model runner only (config/vllm.py, V1's refusals).
    v2_runner="its speculator exists only in V2; V1 refuses `dspark speculative decoding`",
    anchor_predicts_when="sample_from_anchor",
    settings=DSPARK_SETTINGS,
    keyed_alone=tuple(f"draft.{key}" for key in DSPARK_SETTINGS) + ("train.confidence_weight", "train.confidence_target"),
    gate_keyed_alone=False,
    check=check,
    export_keys=export_keys,
    read_keys=read_keys,
    backbone_keys=dspark_backbone_keys,
    resolve_settings=resolve_settings,
    weight_shapes=weight_shapes,
    weights_label="Markov/confidence head",
    probe_outputs=probe_outputs,
))
