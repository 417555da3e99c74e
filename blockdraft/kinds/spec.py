"""What the pipeline knows of one draft kind, in one place: its registry entry.

Every stage asks the entry, never the kind's name: training builds `model`, checks `check` and trains with the
model's own loss hooks; export writes `architecture` and the kind's keys (`export_keys`) and reads them back
(`read_keys`), checks its tensors against vLLM's contract (`weight_shapes`) and its reload (`probe_outputs`);
serving takes vLLM's method, whether only vLLM's V2 model runner serves the kind, or why vLLM cannot serve it
at all, and what to warn of (`serving_warnings`). A kind's folder (`blockdraft/kinds/<kind>/`) holds its model,
its checks and its export mapping, and registers one `KindSpec` (docs/adding-a-kind.md).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Tuple

Shape = Tuple[int, ...]


def _no_keys(_cfg) -> tuple:
    return {}, {}


def _nothing(*_args) -> dict:
    return {}


def _no_check(*_args) -> None:
    return None


def _none(*_args) -> list:
    return []


@dataclass(frozen=True)
class KindSpec:
    name: str
    """The `draft.kind` value."""
    title: str
    """How messages name it ("DFlash2")."""
    model: str
    """"module:Class" of its draft model, imported on first use: asking a serving question imports no model."""
    architecture: str
    """The `architectures` entry its export's config.json carries."""
    reads: Tuple[str, ...] = ()
    """Other stacks' architecture names read as this kind (beside `architecture`, where the kind owns it)."""
    owns_architecture: bool = True
    """False where the architecture is another kind's and the config tells them apart (`recognize`)."""
    recognize: Optional[Callable[[str, Mapping], bool]] = None
    """(the kind read from the architecture, config.json) -> this kind's config? For kinds sharing one."""
    vllm_method: Optional[str] = "dflash"
    """vLLM's speculative method for it; None where vLLM cannot serve it (then `reference_only` says why)."""
    reference_only: Optional[str] = None
    """Why vLLM cannot serve it: the reference engine decodes it."""
    v2_runner: Optional[str] = None
    """Why only vLLM's V2 model runner (a Triton GPU backend) serves it, or None where V1 serves it too."""
    causal_in_block: bool = False
    """Slot k attends to slots 0..k of its block only (JetSpec); the others see the whole block."""
    anchor_predicts_when: Optional[str] = None
    """The boolean setting under which the anchor's slot predicts too (DSpark's sample_from_anchor): a round
    then drafts block_size tokens, not block_size - 1."""
    drafts_below_block: bool = False
    """vLLM refuses num_speculative_tokens >= block_size for it (LiLiCorr's lattice has block_size - 1 slots)."""
    draft_vocab_refusal: Optional[str] = None
    """Why a reduced draft vocabulary cannot be served for it, or None where it can."""
    card_title: Optional[str] = None
    """The export's model card's heading for it ("DSpark (DFlash + Markov and confidence heads)"); None: title."""
    references: Tuple[str, ...] = ()
    """What it follows: the paper where one is cited, the code it is built to match (the model card's References,
    and docs/training.md's, which a test keeps in step). An arXiv id only where the model's own code cites it."""
    settings: Tuple[str, ...] = ()
    """Its own `draft.*` keys beyond the shared ones (the keys a resolved config carries for it)."""
    keyed_alone: Optional[Tuple[str, ...]] = None
    """The settings the pipeline's stage keys hold for this kind only: other kinds' keys leave them out, so adding
    a kind changes no finished run's key. None: its `draft.*` settings. DFlash2's and Domino's settings are in
    every kind's keys (()): they were keyed so before this rule, and finished runs keep their keys."""
    gate_keyed_alone: bool = True
    """The gate's key leaves `keyed_alone` out for other kinds too (DSpark's settings are in every gate's key,
    for the same reason)."""
    check: Callable = _no_check
    """(DraftModelConfig) -> None: its own settings checked, a ConfigError with the fix where one is wrong."""
    export_keys: Callable = _no_keys
    """(DraftModelConfig) -> (its dflash_config keys, its top-level config.json keys)."""
    read_keys: Callable = _no_check
    """(DraftModelConfig, config.json, dflash_config, where) -> None: its settings read back from an export."""
    backbone_keys: Callable = _nothing
    """(config.json) -> the dflash_config keys a config of this kind may keep elsewhere (DSpark's top level)."""
    resolve_settings: Callable = lambda own, hidden_size: own
    """(its settings as the user set them, the draft's width) -> its resolved settings (nulls filled in)."""
    required_keys: Tuple[str, ...] = ()
    """dflash_config keys serving cannot do without (vLLM reads them without a default)."""
    weight_shapes: Callable = _nothing
    """(DraftModelConfig) -> {name: shape} of its own tensors beyond the DFlash backbone, as vLLM's loader names
    them. Written from vLLM's module for the kind, not from its model, so checking a state_dict checks the model.
    The importer refuses them under another kind's config, and a file of this kind that lacks one."""
    weights_label: str = "head"
    """How messages name those tensors ("conv/selector")."""
    probe_outputs: Callable = _none
    """(draft, the reload check's Probe, the probe's hidden states [1, 2B, H]) -> its outputs beyond the logits,
    each [1, 2B, *], which the reload check compares too: its heads, which the logits never touch."""
    serving_warnings: Callable = _none
    """(VllmInfo, DraftFacts) -> lines to warn of when serving it with that vLLM."""

    def keyed_alone_settings(self) -> Tuple[str, ...]:
        if self.keyed_alone is not None:
            return self.keyed_alone
        return tuple(f"draft.{key}" for key in self.settings)

    def model_class(self):
        module, _, name = self.model.partition(":")
        return getattr(importlib.import_module(module), name)

    def anchor_predicts(self, settings) -> bool:
        """Does the anchor's slot predict, with these settings (a mapping, such as a config.json, or an object
        with attributes, such as a draft config)? vLLM's DSpark speculator defaults sample_from_anchor to true
        when the key is absent."""
        key = self.anchor_predicts_when
        if key is None:
            return False
        value = settings.get(key, True) if isinstance(settings, Mapping) else getattr(settings, key, True)
        return bool(value)

    def drafted_per_round(self, block_size: int, settings: Mapping) -> int:
        return drafted_per_round(block_size, self.anchor_predicts(settings))


# Where vLLM's module for a kind lives, as the references quote it.
VLLM_MODELS = "vLLM 0.32, vllm/model_executor/models/"


def drafted_per_round(block_size: int, anchor_predicts: bool) -> int:
    """The tokens one round drafts: every slot when the anchor predicts (N query slots, N drafts), else the MASK
    slots only (1 + N query slots)."""
    return int(block_size) if anchor_predicts else int(block_size) - 1
