"""Give a draft saved under an alias its registry name in memory, before vLLM reads the name.

Registering the aliases is not enough, because vLLM (0.32) reads the draft's name three times:
the draft's ModelConfig looks it up in the registry; for method "dflash" EAGLEConfig then
renames every name that neither starts nor ends with "DFlash" to "DFlash" + name
(Qwen3DFlashDraftModel -> DFlashQwen3DFlashDraftModel, in no registry); and the DFlash2
speculator of the V2 runner, like the V1 runner's refusal of candidate-head drafts, tests for
the literal "DFlash2DraftModel", so a DFlash2 draft under another name would be run as plain
DFlash; for method "dspark" SpeculativeConfig keeps the Qwen3 DSpark path only for the literal
"Qwen3DSparkModel" and turns any other DSpark name into a DeepSeek-V4 draft. With the registry
name in the loaded config, vLLM does exactly what it does for a draft exported under that name.
The draft's config.json on disk is not touched.

Where: SpeculativeConfig builds the draft's ModelConfig with
hf_overrides=SpeculativeConfig.hf_config_override (looked up when the ModelConfig is built, and
again inside the composed override used when the target has a callable one), and ModelConfig
applies it to the config it just loaded, before its first registry lookup. vLLM loads general
plugins in EngineArgs.__post_init__ (and when the CLI parser is built), i.e. before
create_engine_config builds the SpeculativeConfig; engine-core and worker processes receive
the finished config, pickled, with the names already replaced.
"""

from __future__ import annotations

from blockdraft_vllm_plugin import announce
from blockdraft_vllm_plugin.aliases import normalise_architectures

HOOKED = "SpeculativeConfig.hf_config_override"
_original = None  # vLLM's function, once replaced in this process


def draft_hf_config_override(hf_config, *args, **kwargs):
    """Replaces SpeculativeConfig.hf_config_override: alias names first, then vLLM's own override.

    A module-level function, so the draft ModelConfig that holds it as hf_overrides still
    pickles to vLLM's other processes (by reference to this module, installed there too).
    """
    from vllm.model_executor.models import ModelRegistry

    announce.flush()  # the registration line, if vLLM's logging was not ready for it
    change = normalise_architectures(hf_config, ModelRegistry)
    if change:
        announce.info("blockdraft_vllm_plugin: draft architectures %s read as %s (in memory; config.json unchanged)",
                      *change)
    original = _original or _speculative_config().hf_config_override  # not replaced in this process
    return original(hf_config, *args, **kwargs)


def install() -> bool:
    """Replace vLLM's override once per process; False (with a warning) where this vLLM has none."""
    global _original
    try:
        speculative_config = _speculative_config()
        current = speculative_config.__dict__.get("hf_config_override")
    except (ImportError, AttributeError):
        current = None
    if not isinstance(current, staticmethod):
        # A warning shows even before vLLM configures logging (Python's last-resort handler).
        announce.logger.warning(
            "blockdraft_vllm_plugin: this vLLM has no %s to hook, so a draft's config keeps its alias name: "
            "Qwen3DFlash2DraftModel and Qwen3DSparkDraftModel are left unregistered (selected by name, they would "
            "run as plain DFlash or a DeepSeek-V4 DSpark draft) and Qwen3DFlashDraftModel may be refused. Export "
            "drafts under vLLM's names (DFlashDraftModel / DFlash2DraftModel / Qwen3DSparkModel) for this vLLM.",
            HOOKED,
        )
        return False
    if current.__func__ is not draft_hf_config_override:
        _original = current.__func__
        speculative_config.hf_config_override = staticmethod(draft_hf_config_override)
    return True


def _speculative_config():
    from vllm.config.speculative import SpeculativeConfig

    return SpeculativeConfig
