"""The deploy line of each kind, and the three places that print it: the export (`inspect`), the model card and
the pipeline's summary. That vLLM itself parses each kind's line and builds its SpeculativeConfig from it is
tests/integration/test_deploy_line_vllm.py."""

from __future__ import annotations

import io
import json
import shlex
from contextlib import redirect_stdout

import pytest
import torch

from blockdraft.draft_format.mask_embedding import MASK_EMBEDDING_FILE, write_mask_embedding
from blockdraft.export.deploy_line import V2_RUNNER_ENV, deploy_line, export_deploy_line
from blockdraft.export.vllm_config import vllm_config
from tests.unit.export_helpers import draft_config

TARGET = "/models/Qwen3-8B"


def speculative_config(command: str) -> tuple:
    """(environment words, target, the --speculative-config JSON) as a shell splits the line."""
    words = shlex.split(command)
    env = words[:words.index("vllm")]
    rest = words[words.index("vllm"):]
    assert rest[1] == "serve"
    return env, rest[2], json.loads(rest[rest.index("--speculative-config") + 1])


@pytest.mark.parametrize("kind, settings, method, drafted, v2", [
    ("dflash", {}, "dflash", "block_size - 1", False),
    ("jetspec", {}, "dflash", "block_size - 1", False),
    ("dflash2", {}, "dflash", "block_size - 1", True),
    ("dspark", {"markov_rank": 8}, "dspark", "block_size", True),
    ("dspark", {"markov_rank": 8, "sample_from_anchor": False}, "dspark", "block_size - 1", True),
])
def test_each_kind_gets_its_method_its_drafted_tokens_and_the_v2_runner_where_vllm_needs_it(kind, settings, method, drafted, v2):
    cfg = draft_config(kind, block_size=8, **settings)
    line = deploy_line(cfg, "/exports/d", TARGET, mask_embedding=False)
    env, target, spec = speculative_config(line.command)
    assert line.vllm and target == TARGET and spec["method"] == method and spec["model"] == "/exports/d"
    assert spec["num_speculative_tokens"] == {"block_size - 1": cfg.block_size - 1, "block_size": cfg.block_size}[drafted]
    assert env == ([f"{V2_RUNNER_ENV}=1"] if v2 else [])
    assert any(f"{drafted} = {spec['num_speculative_tokens']}" in note for note in line.notes)
    assert any("V2 GPU model runner" in note for note in line.notes) == v2


def test_a_mask_embedding_and_a_reduced_vocabulary_say_which_files_the_directory_must_carry():
    plain = deploy_line(draft_config("dflash"), "/exports/d", TARGET, mask_embedding=False)
    both = deploy_line(draft_config("dflash", draft_vocab_size=40), "/exports/d", TARGET, mask_embedding=True)
    assert both.command == plain.command  # the line itself needs nothing else
    assert not any(MASK_EMBEDDING_FILE in n or "d2t" in n for n in plain.notes)
    assert any(MASK_EMBEDDING_FILE in n and "mask_token_id 262" in n for n in both.notes)
    assert any("`d2t`" in n and "lm_head.weight" in n and "40 of 268" in n for n in both.notes)


def test_domino_gets_the_reference_engines_command_and_why():
    line = deploy_line(draft_config("domino"), "/exports/d", TARGET, mask_embedding=False)
    assert not line.vllm and "vllm serve" not in line.command
    assert line.command.startswith("python -m blockdraft.serve draft=/exports/d") and "engine=reference" in line.command
    assert "no Domino drafter" in line.notes[0]


def test_paths_with_spaces_and_quotes_survive_the_shell():
    line = deploy_line(draft_config("dflash"), "/my exports/it's", "/models/my target", mask_embedding=False)
    _, target, spec = speculative_config(line.command)
    assert target == "/models/my target" and spec["model"] == "/my exports/it's"


def _export_dir(root, kind="dflash", mask=False, architecture=None, **settings):
    """An export directory as far as its deploy line reads it: config.json, the recorded target, the mask file."""
    cfg = draft_config(kind, **settings)
    root.mkdir(parents=True)
    config = vllm_config(cfg)
    if architecture:
        config["architectures"] = [architecture]
    (root / "config.json").write_text(json.dumps(config))
    (root / "blockdraft_export.json").write_text(json.dumps({"target": TARGET}))
    if mask:
        write_mask_embedding(root, torch.zeros(cfg.hidden_size), cfg.mask_token_id)
    return root


def test_an_export_directory_gives_the_same_line_as_its_config(tmp_path):
    export = _export_dir(tmp_path / "e", "dflash2", mask=True)
    line = export_deploy_line(export)
    assert line == deploy_line(draft_config("dflash2"), export, TARGET, mask_embedding=True)
    renamed = export_deploy_line(_export_dir(tmp_path / "alias", "dflash", architecture="Qwen3DFlashDraftModel"))
    assert "vLLM's registry has no `Qwen3DFlashDraftModel`" in renamed.notes[-1] and "plugin" in renamed.notes[-1]


def test_the_pipeline_summary_ends_with_the_exports_line(tmp_path):
    from blockdraft.pipeline.records import StageRecords
    from blockdraft.pipeline.runner import Stage, summarize

    export = _export_dir(tmp_path / "export", "dspark", markov_rank=8)
    report = tmp_path / "report.json"
    stages = [Stage(name, {}, lambda: True, lambda: True, path) for name, path in (("export", export), ("serve", report))]
    records = StageRecords(tmp_path / "stages.json", writer=False)
    printed = {}
    for passed in (True, False):
        report.write_text(json.dumps({"passed": passed}))
        out = io.StringIO()
        with redirect_stdout(out):
            code = summarize(stages, records, {"export": 1.0, "serve": 1.0}, 2.0, report)
        assert code == (0 if passed else 1)
        printed[passed] = out.getvalue()
    line = export_deploy_line(export)
    for text in printed.values():
        deploy = text[text.index("=== deploy ==="):]
        assert line.command in deploy and all(note in deploy for note in line.notes)
    assert "did not pass" in printed[False] and "did not pass" not in printed[True]


def test_the_serve_check_starts_a_v2_only_draft_as_its_deploy_line_does(monkeypatch):
    """The smoke-serve harness's draft server gets the deploy line's VLLM_USE_V2_MODEL_RUNNER=1 for the kinds
    vLLM serves only on V2 (else vLLM may pick V1 on a GPU and refuse the draft); a value the user set wins."""
    from blockdraft.serve.harness import with_v2_runner

    monkeypatch.delenv(V2_RUNNER_ENV, raising=False)
    base = {"VLLM_CPU_KVCACHE_SPACE": "2"}
    for kind in ("dflash2", "dspark"):
        assert with_v2_runner(base, kind) == {**base, V2_RUNNER_ENV: "1"}
    for kind in ("dflash", "jetspec"):
        assert with_v2_runner(base, kind) == base
    monkeypatch.setenv(V2_RUNNER_ENV, "0")
    assert with_v2_runner(base, "dflash2") == base
