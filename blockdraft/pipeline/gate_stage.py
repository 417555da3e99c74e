"""The one-sample gate as the pipeline's first stage: on the target and serving stack the run will use,
minutes before the hours of regen, capture and training, in a chain of its own (no later stage's key
holds it, so a retrain keeps a finished gate), and its verdict: a pass lets the long stages follow, a
failure stops the run with the verdict and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from blockdraft.pipeline import commands, keys
from blockdraft.pipeline.process import StageFailed, readable_result, run_command, say
from blockdraft.pipeline.runner import Stage
from blockdraft.pipeline.settings import PipelineSettings


class GateFailed(StageFailed):
    """The gate's verdict stops the run before the long stages: its message is the verdict and the fix."""

    def __init__(self, message: str):
        Exception.__init__(self, message)
        self.code = 1


def gate_stage(s: PipelineSettings, cfgs: dict) -> Stage:
    """The one-sample gate on the target and serving stack the run will use. It needs nothing of the other
    stages, so it runs first (minutes, before hours), in a chain of its own: no stage's key holds it, and a
    retrain keeps a finished gate. A finished gate is cached whatever its verdict (`gate_verdict` stops
    the run on a failing one); one that stopped without a verdict is not."""
    p = s.paths()
    if not s.gate:
        return Stage("gate", {}, lambda: True, lambda: True, p["gate"], skip_reason="gate=false")
    from blockdraft.models.target_fingerprint import target_fingerprint

    def run() -> bool:
        p["gate"].unlink(missing_ok=True)  # a verdict left from an earlier run must not pass for this one
        code = run_command(commands.stage_argv("gate", s, True))
        verdict = readable_result(p["gate"])
        # Done only with a readable verdict its exit status agrees with (0 passed, 1 failed): a crash after a
        # verdict, or a verdict torn by a full disk, is not a result to cache.
        if verdict is None or code != (0 if verdict.get("passed") else 1):
            raise StageFailed("gate", code, "it reached no readable verdict: fix what it says above, then rerun the "
                                            "same command")
        return True

    gate = cfgs["gate"]
    inputs = keys.gate_inputs(s, gate, gate_training(gate), target_fingerprint(s.target), serving_stack(gate))
    return Stage("gate", inputs, run, lambda: readable_result(p["gate"]) is not None, p["gate"], moves=p["gate"].parent)


def serving_stack(gate_cfg) -> Optional[dict]:
    """The packages of the interpreter the gate serves with; None on the reference engine, which runs here."""
    if gate_cfg.engine == "reference":
        return None
    from blockdraft.pipeline.serving_stack import serving_versions
    from blockdraft.vllm_runtime import DEFAULT_VLLM_PYTHON

    return serving_versions(Path(gate_cfg.vllm_python).expanduser() if gate_cfg.vllm_python else DEFAULT_VLLM_PYTHON)


def gate_training(gate_cfg):
    """The training config the gate composes for its sample: the draft and the training it gets."""
    from omegaconf import OmegaConf

    from blockdraft.gate.app import training_config

    return OmegaConf.to_object(training_config(gate_cfg, Path(gate_cfg.out).absolute(), gate_cfg.max_tokens))


# What to change in the pipeline's terms, by verdict (the gate's own message names its keys).
GATE_FIXES = {
    "undertrained": "raise gate.max_steps= (or gate.optim.lr=) so that the gate's draft memorises its sample",
    "serving differs": "this serving stack does not compute what training does for this draft: check what the "
                       "failure names (target_layer_ids, positions, masks, names, dtypes), or serve with another vLLM "
                       "(serve.vllm_python=)",
    "not lossless": "the served output is not the target's own: read the serving log under <out>/gate/serve",
    "draft unused": "no draft was proposed: read the serving log under <out>/gate/serve",
}


def gate_verdict(s: PipelineSettings) -> None:
    """Go on after a passing gate; stop with its verdict and the fix after a failing one."""
    if not s.gate:
        return
    path = s.paths()["gate"]
    verdict = readable_result(path)
    if verdict is None:  # present() is what cached it: a verdict damaged since is the gate's to run again
        raise GateFailed(f"the gate's verdict {path} is unreadable; rerun with force=[gate]")
    if verdict.get("passed"):
        say(f"gate: passed ({verdict.get('engine')}: serving accepted {verdict.get('mean_acceptance_length', 0):.2f} "
            f"of a perfect draft's {verdict.get('perfect_acceptance_length') or 0:.2f} on the sample); the long stages follow")
        return
    name = verdict.get("verdict", "failed")
    fix = GATE_FIXES.get(name, "as the failure says").replace("<out>", str(s.root))
    raise GateFailed(f"the gate failed before the long stages ({name}): {' '.join(verdict.get('failures', []))} "
                     f"Nothing after it ran. To fix: {fix}; then rerun the same command (the gate runs again when the "
                     "target, the serving stack, the draft's settings or gate.* change; force=[gate] runs it again "
                     f"after a fix outside those; gate=false goes on without it). The verdict: {path}")
