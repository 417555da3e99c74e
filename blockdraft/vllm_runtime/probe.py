"""Ask the serving vLLM what it can do, in its own interpreter, before any server starts.

This file runs twice: imported in the training env (`probe_vllm`), and executed by path
by the serving interpreter (`main`), so its top level uses the standard library only.
The answer is one JSON line after a marker, because vLLM logs to stdout as it imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

MARKER = "BLOCKDRAFT_VLLM_PROBE "
PROBE_TIMEOUT_S = 300
# The entry point of vllm_plugin/ (its pyproject.toml): it registers the training stacks' draft names.
ALIAS_PLUGIN = "blockdraft_dflash_aliases"


@dataclass
class VllmInfo:
    version: str
    device: str  # "cpu", "cuda", ... as vLLM's platform names it
    has_triton: bool  # Model Runner V2 (the only one that runs DFlash2) needs it
    v2_runner_env: Optional[str]  # VLLM_USE_V2_MODEL_RUNNER as set, or None
    dflash_archs: List[str] = field(default_factory=list)  # DFlash* and DSpark drafts registered once plugins loaded
    alias_plugin_installed: bool = False  # vllm_plugin/'s entry point is in the serving env
    vllm_plugins_env: Optional[str] = None  # VLLM_PLUGINS as set (vLLM loads only the plugins it names)
    arch_known: bool = False
    arch_supports_eagle3: bool = False  # the target can hand aux hidden states to a draft
    arch_error: Optional[str] = None  # why vLLM's class for the target failed to import, if it did
    arch_has_inner_state: bool = False  # Mamba / linear-attention state that drafts must not corrupt
    anchor_clamp: Optional[bool] = None  # DFlash2 _score_edges clamps the anchor id; None = no DFlash2
    cpu_head_sizes: List[int] = field(default_factory=list)  # CPU attention's head sizes; [] off CPU
    python: Optional[str] = None  # the serving interpreter that answered

    @property
    def runs_v2_runner(self) -> bool:
        """Model Runner V2 needs a Triton GPU backend; without it vLLM falls back to V1."""
        forced_off = (self.v2_runner_env or "").lower() in ("0", "false")
        return self.has_triton and self.device != "cpu" and not forced_off

    def can_run_v2_draft(self, architecture: str) -> bool:
        """DFlash2 and DSpark drafts run only in the V2 runner; V1 refuses them."""
        return architecture in self.dflash_archs and self.runs_v2_runner


class ProbeError(RuntimeError):
    """The serving interpreter could not answer; the message holds its output tail."""


def probe_vllm(python: str | Path, architecture: str, timeout_s: float = PROBE_TIMEOUT_S) -> VllmInfo:
    """Run this file in the serving interpreter and read its answer."""
    return probe_architectures(python, [architecture], timeout_s)[architecture]


def probe_architectures(python: str | Path, architectures: List[str], timeout_s: float = PROBE_TIMEOUT_S) -> dict:
    """{architecture: VllmInfo} from one start of the serving interpreter (vLLM imports once).

    Answers are kept for this process, one per architecture: an eval of several drafts, or a gate
    run after a training run, asks the same interpreter the same question again, and each start
    costs seconds of importing vLLM. The key holds every VLLM_* variable, which change the answer, but
    VLLM_API_KEY: it changes nothing the probe reports, and a secret is kept in no table.
    """
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("VLLM_") and k != "VLLM_API_KEY"))
    missing = [arch for arch in architectures if (str(python), arch, env) not in _ANSWERS]
    if missing:  # one start for every architecture not asked yet; each answer is kept on its own
        for arch, info in _ask(python, missing, timeout_s).items():
            _ANSWERS[(str(python), arch, env)] = info
    return {arch: _ANSWERS[(str(python), arch, env)] for arch in architectures}


_ANSWERS: dict = {}


def _ask(python: str | Path, architectures: List[str], timeout_s: float) -> dict:
    # -I: the script's folder (this package) must not shadow modules vLLM imports.
    cmd = [str(python), "-I", str(Path(__file__).resolve()), *architectures]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ProbeError(f"{python} did not answer within {timeout_s} s while importing vLLM") from None
    for line in done.stdout.splitlines():
        if line.startswith(MARKER):
            answers = json.loads(line[len(MARKER) :])
            return {arch: VllmInfo(**answer, python=str(python)) for arch, answer in answers.items()}
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
    raise ProbeError(
        f"{python} could not import vLLM (exit {done.returncode}); check `{python} -c 'import vllm'`, "
        f"or rebuild the serving env: `rm -rf .venv-serve && make setup-serve`.\n--- last lines ---\n{tail}"
    )


# --- below runs inside the serving interpreter ----------------------------------------
def main(architectures: List[str]) -> None:
    import vllm
    from vllm.model_executor.models import ModelRegistry
    from vllm.platforms import current_platform
    from vllm.plugins import load_general_plugins
    from vllm.triton_utils import HAS_TRITON

    # The registry as a server sees it: general plugins (this project's alias plugin among
    # them, unless VLLM_PLUGINS leaves it out) register their architectures first.
    load_general_plugins()
    archs = ModelRegistry.get_supported_archs()
    # What this vLLM can do, whatever the target: asked once, shared by every answer.
    common = dict(
        version=vllm.__version__,
        device=current_platform.device_type,
        has_triton=bool(HAS_TRITON),
        v2_runner_env=os.environ.get("VLLM_USE_V2_MODEL_RUNNER"),
        dflash_archs=sorted(a for a in archs if "DFlash" in a or "DSpark" in a),
        alias_plugin_installed=_entry_point_installed("vllm.general_plugins", ALIAS_PLUGIN),
        vllm_plugins_env=os.environ.get("VLLM_PLUGINS"),
        anchor_clamp=_anchor_clamp(),
        cpu_head_sizes=_cpu_head_sizes(current_platform.device_type),
    )
    answers = {}
    for architecture in architectures:
        known = architecture in archs
        model_class, arch_error = _model_class(ModelRegistry, architecture) if known else (None, None)
        answers[architecture] = dict(
            common,
            arch_known=known,
            arch_supports_eagle3=model_class is not None and _supports_eagle3(model_class),
            arch_error=arch_error,
            arch_has_inner_state=model_class is not None and _has_inner_state(model_class),
        )
    print(MARKER + json.dumps(answers), flush=True)


def _entry_point_installed(group: str, name: str) -> bool:
    from importlib.metadata import entry_points

    return any(point.name == name for point in entry_points(group=group))


def _model_class(registry, architecture: str):
    """(vLLM's class for the architecture, None) or (None, why it could not be imported)."""
    import importlib

    # The registry's own loader swallows the import error; a lazy entry (module and class
    # names) is imported here to keep it.
    entry = getattr(registry, "models", {}).get(architecture)
    module_name, class_name = getattr(entry, "module_name", None), getattr(entry, "class_name", None)
    try:
        if module_name and class_name:
            return getattr(importlib.import_module(module_name), class_name), None
        return registry._try_load_model_cls(architecture), None  # no public way to get the class by name
    except Exception as err:  # noqa: BLE001 - an import failure means vLLM cannot serve it either
        return None, f"{type(err).__name__}: {err}"


def _supports_eagle3(model_class) -> bool:
    # DFlash reads the target's aux hidden states through the EAGLE3 interface; vLLM checks
    # it on the loaded model, i.e. only after start-up. The class answers the same, now.
    from vllm.model_executor.models.interfaces import supports_eagle3

    return bool(supports_eagle3(model_class))


def _has_inner_state(model_class) -> bool:
    from vllm.model_executor.models.interfaces import has_inner_state

    return bool(has_inner_state(model_class))


def _anchor_clamp() -> Optional[bool]:
    import inspect

    try:
        from vllm.model_executor.models import qwen3_dflash2
    except Exception:  # noqa: BLE001 - no DFlash2 in this vLLM
        return None
    source = inspect.getsource(getattr(qwen3_dflash2, "_score_edges", lambda: None))
    return "clamp" in source


def _cpu_head_sizes(device: str) -> List[int]:
    if device != "cpu":
        return []
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        return list(CPUAttentionBackend.get_supported_head_sizes())
    except Exception:  # noqa: BLE001 - the layout moved; skip the check rather than guess
        return []


if __name__ == "__main__":
    main(sys.argv[1:])
