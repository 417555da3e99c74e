"""A prompt set holding prompts the draft trained on is refused before any server starts: by the serve
check, the eval, the gate (on a draft it did not train) and the pipeline's serve stage, in one line
naming how many and the key that picks others. The fake vLLM (tests/fake_vllm.py) records every start,
so "no server" is what it recorded. allow_training_prompts=true measures them and the report's headline
says so (the eval's, after a run: test_eval_logic.py); a draft without a record is measured with a warning."""

import json

import pytest

from blockdraft.config import compose, register_schema
from blockdraft.data.prompt_record import RECORD_NAME, PromptRecord, prompt_hash
from blockdraft.errors import ConfigError
from blockdraft.eval import runner
from blockdraft.eval.__main__ import evaluate
from blockdraft.eval.config import EvalAppConfig
from blockdraft.models.tiny_target import save_tiny_target
from blockdraft.gate import app as gate
from blockdraft.serve import harness
from blockdraft.serve.config import ServeConfig
from blockdraft.serve.held_out_check import check_gate_prompt
from blockdraft.serve.preflight import plan_serving
from blockdraft.vllm_runtime.probe import VllmInfo
from tests.fake_vllm import INFO_FIELDS, started_pids, write_fake_draft, write_fake_python

register_schema("eval_schema", EvalAppConfig)
QUESTIONS = ["Tell me about the moon.", "Name a fruit.", "Why is the sea salty?"]


def asked(question: str) -> int:
    return prompt_hash([{"role": "user", "content": question}])


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A tiny target, the fake serving interpreter recording its starts, a prompt file, and a draft that
    trained on the first two of its questions (and on one prompt not among them)."""
    fake = tmp_path / "fake"
    fake.mkdir()
    monkeypatch.setenv("FAKE_DIR", str(fake))
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q}]}) + "\n" for q in QUESTIONS))
    draft = write_fake_draft(tmp_path / "draft")
    PromptRecord.of([asked(QUESTIONS[0]), asked(QUESTIONS[1]), asked("Something else.")]).write(draft / RECORD_NAME)
    return dict(root=tmp_path, fake=fake, target=save_tiny_target(tmp_path / "target"), draft=draft, questions=questions,
                python=write_fake_python(tmp_path / "fake_python"))


def serve_config(world, **keys):
    return ServeConfig(draft_dir=str(world["draft"]), target_dir=str(world["target"]), vllm_python=str(world["python"]),
                       out=str(world["root"] / "serve"), prompts=str(world["questions"]), num_prompts=3, max_tokens=8,
                       rounds=1, servers="fresh", startup_timeout_s=30, **keys)


@pytest.fixture
def stood_in_probe(monkeypatch):
    """The fake is no vLLM to import: the probe's answer is what a CPU vLLM that knows DFlash says."""
    monkeypatch.setattr(harness, "plan_serving", lambda cfg: plan_serving(cfg, probe=lambda *_: VllmInfo(**INFO_FIELDS)))
    monkeypatch.setattr(runner, "probe_vllm", lambda *_: VllmInfo(**INFO_FIELDS))


def test_the_serve_check_refuses_prompts_the_draft_trained_on_before_any_server(world, stood_in_probe):
    with pytest.raises(ConfigError) as refused:
        harness.run(serve_config(world))
    message = str(refused.value)
    assert "2 of the 3 prompts of prompts=" in message and "are among the 3 training prompts of the draft" in message
    assert "a prompts_skip= past them" in message and "allow_training_prompts=true" in message and "\n" not in message
    assert started_pids(world["fake"]) == [] and not (world["root"] / "serve" / "report.json").exists()


def test_allowed_the_serve_report_says_so_first(world, capsys):
    from blockdraft.serve.report import RunRecord, build_report, print_table

    held = harness.check_held_out(serve_config(world, allow_training_prompts=True), encoded(QUESTIONS))
    assert held["trained_on"] == 2 and held["allowed"] and held["recorded"]
    print_table(build_report(RunRecord(held_out=held)))
    table = capsys.readouterr().out.splitlines()
    assert table[0].strip().startswith("MEASURED ON TRAINING PROMPTS: 2 of the 3 prompts are among those the draft trained on")
    assert any(line.split() == ["held", "out", "NO:", "2", "of", "3", "prompts", "trained", "on", "(allow_training_prompts=true)"]
               for line in table)


def encoded(questions):
    return [harness.EncodedPrompt(i, q, [1, 2], asked(q)) for i, q in enumerate(questions)]


def test_a_draft_without_a_record_is_measured_with_one_warning(world, capsys):
    (world["draft"] / RECORD_NAME).unlink()
    cfg = serve_config(world)
    held = harness.check_held_out(cfg, encoded(QUESTIONS))
    assert not held["recorded"] and held["trained_on"] == 0 and held["headline"] is None
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warned) == 1 and "carries no record of the prompts it trained on" in warned[0]


def test_the_eval_refuses_a_dataset_a_draft_trained_on_before_any_server(world, stood_in_probe):
    cfg = OmegaConf_eval([f"target_dir={world['target']}", f"drafts=[{world['draft']}]", f"datasets=[{world['questions']},tiny]",
                          "settings=[greedy]", "num_prompts=3", "max_tokens=8", f"vllm_python={world['python']}",
                          f"out={world['root'] / 'eval'}"])
    with pytest.raises(ConfigError, match=r"2 of the 3 prompts of dataset '.*questions.jsonl' for draft are among the 3 "
                                          r"training prompts of the draft .*dataset_options.<name>.skip= .* "
                                          r"allow_training_prompts=true"):
        evaluate(cfg)
    assert started_pids(world["fake"]) == [] and not (world["root"] / "eval" / "eval.json").exists()


def OmegaConf_eval(overrides):
    from omegaconf import OmegaConf

    return OmegaConf.to_object(compose("eval", overrides))


def test_the_gate_refuses_its_prompt_to_a_draft_that_trained_on_it(world):
    """recheck=true serves whatever export sits in out: one put there that trained on the gate's prompt
    among others (not the gate's own draft) is refused before the probe or any server."""
    out = world["root"] / "gate"
    out.mkdir()
    (out / gate.PROMPT_NAME).write_text(json.dumps({"messages": [{"role": "user", "content": QUESTIONS[0]}]}) + "\n")
    (out / "response.json").write_text(json.dumps({"prompt": QUESTIONS[0], "prompt_ids": [1, 2], "reply_ids": [3, 4],
                                                  "reply_text": "x", "generated_tokens": 2}))
    world["draft"].rename(out / "export")
    cfg = gate.parse_arguments([f"target={world['target']}", f"out={out}", "recheck=true", f"vllm_python={world['python']}"])
    with pytest.raises(ConfigError, match=r"1 of the 1 prompts of the gate's prompt='Tell me about the moon.' are among "
                                          r"the 3 training prompts of the draft .*\(prompt= another question\)"):
        gate.run_gate(cfg)
    assert started_pids(world["fake"]) == [] and not (out / gate.VERDICT_NAME).exists()


def test_the_gates_own_draft_is_served_on_its_one_sample_by_design(tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    PromptRecord.of([asked(QUESTIONS[0])]).write(own / RECORD_NAME)
    assert check_gate_prompt(own, QUESTIONS[0], allow=False) == []
    PromptRecord.of([asked(QUESTIONS[0]), asked(QUESTIONS[1])]).write(own / RECORD_NAME)
    assert check_gate_prompt(own, QUESTIONS[0], allow=True)[0].startswith("MEASURED ON TRAINING PROMPTS: 1 of the 1")
    assert check_gate_prompt(own, QUESTIONS[2], allow=False) == []  # a given draft that never saw the prompt
    (own / RECORD_NAME).unlink()
    assert "carries no record" in check_gate_prompt(own, QUESTIONS[0], allow=False)[0]


def test_the_pipeline_refuses_serve_prompts_among_its_training_ones_before_any_stage(world, capsys):
    from blockdraft.pipeline import app

    out = world["root"] / "pipeline"
    rows = world["root"] / "rows.jsonl"
    rows.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Question {i}?"}]}) + "\n" for i in range(12)))
    words = [f"target={world['target']}", f"prompts={rows}", "experiment=tiny_cpu", f"out={out}", "round_cost=false",
             "regen.num_train=8", "regen.num_heldout=2", f"regen.vllm_python={world['python']}",
             f"serve.vllm_python={world['python']}", f"serve.prompts={rows}", "serve.num_prompts=4"]
    assert app.main(words) == 2
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "error: 4 of the 4 prompts of serve.prompts=" in error[0]
    assert "among the 8 training prompts of this run" in error[0] and "serve.prompts_skip= past them" in error[0]
    assert "or set serve.allow_training_prompts=true" in error[0]
    assert started_pids(world["fake"]) == [] and not out.exists()
    # Past the training prompts (the first eight), or allowed, the same run composes.
    assert app.main([*words, "serve.prompts_skip=8", "--cfg", "job"]) == 0
    assert app.main([*words, "serve.allow_training_prompts=true", "--cfg", "job"]) == 0
    assert started_pids(world["fake"]) == []
