"""Drafts saved under other training stacks' names, which vLLM serves through vllm_plugin/.

vLLM's registry knows DFlashDraftModel / DFlash2DraftModel / Qwen3DSparkModel only. This project's vLLM plugin
(installed by `make setup-serve`) registers the aliases below and makes vLLM read such a
directory as its registry name, so it is served unchanged. This module names the aliases and
says what to install when the serving vLLM has neither the alias nor the plugin.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from blockdraft.vllm_runtime.probe import ALIAS_PLUGIN, VllmInfo

# alias -> vLLM's registry name; the same table as vllm_plugin/blockdraft_vllm_plugin/aliases.py
# (a unit test keeps the two equal: the plugin cannot import this package, nor this one the plugin).
ALIASES = {
    "Qwen3DFlashDraftModel": "DFlashDraftModel",
    "Qwen3DFlash2DraftModel": "DFlash2DraftModel",
    "Qwen3DSparkDraftModel": "Qwen3DSparkModel",
}
PLUGIN_DIR = Path(__file__).resolve().parents[2] / "vllm_plugin"


def install_command(python: Optional[str]) -> str:
    where = PLUGIN_DIR if PLUGIN_DIR.is_dir() else "<blockdraft checkout>/vllm_plugin"
    return f"{python or '<serving python>'} -m pip install {where}"


def alias_problem(info: VllmInfo, architecture: str) -> Optional[str]:
    """Why the serving vLLM cannot serve a draft saved as `architecture`, or None if it can."""
    if architecture not in ALIASES or architecture in info.dflash_archs:
        return None
    named = f"architectures=['{architecture}'] is a training stack's name for vLLM's {ALIASES[architecture]}"
    enabled = info.vllm_plugins_env is None or ALIAS_PLUGIN in info.vllm_plugins_env.split(",")
    if info.alias_plugin_installed and not enabled:
        return (
            f"{named}; the plugin that registers it is installed in {info.python}, but VLLM_PLUGINS="
            f"{info.vllm_plugins_env!r} leaves it out: add {ALIAS_PLUGIN} to VLLM_PLUGINS (comma-separated) or unset it."
        )
    if info.alias_plugin_installed:
        return (
            f"{named}; the plugin is loaded in {info.python}, but vLLM {info.version}'s registry still lacks it (it has "
            f"{info.dflash_archs}; the plugin adds an alias only where vLLM has the class, and a DFlash2 or DSpark one only "
            f"where it can also rename the loaded config). Export the draft under {ALIASES[architecture]} for this vLLM."
        )
    return (
        f"{named}, and vLLM {info.version} knows it only with this project's vLLM plugin, which is not installed in "
        f"{info.python or 'the serving env'}. Install it: `make setup-serve` (into the project's .venv-serve), or "
        f"`{install_command(info.python)}`; the directory is then served unchanged."
    )
