"""Domino: a DFlash backbone and a GRU correction head that adjusts each slot's logits with the tokens drafted
before it. vLLM has no Domino drafter: the project's reference engine serves it."""

from blockdraft.kinds.domino.checks import check
from blockdraft.kinds.domino.contract import weight_shapes
from blockdraft.kinds.domino.export import DOMINO_KEYS, export_keys, read_keys, resolve_settings
from blockdraft.kinds.domino.reload import probe_outputs
from blockdraft.kinds.registry import register
from blockdraft.kinds.spec import KindSpec

SPEC = register(KindSpec(
    name="domino",
    title="Domino",
    model="blockdraft.kinds.domino.model:DominoDraftModel",
    architecture="DominoDraftModel",
    card_title="Domino (DFlash + GRU correction)",
    references=("paper: arXiv 2605.29707 (Domino), the id the model's code cites",
                "code: none in vLLM; the project's reference engine (blockdraft/engine/decoder.py) serves it"),
    vllm_method=None,
    reference_only="vLLM has no Domino drafter (its serial GRU correction head has no vLLM implementation)",
    draft_vocab_refusal="the Domino correction spans the target's full vocabulary",
    settings=DOMINO_KEYS,
    keyed_alone=(),
    check=check,
    export_keys=export_keys,
    read_keys=read_keys,
    resolve_settings=resolve_settings,
    weight_shapes=weight_shapes,
    weights_label="correction",
    probe_outputs=probe_outputs,
))
