"""The whole harness (preflight, two servers, verdict, report) against a fake vLLM, in seconds.

The fake answers the completions API deterministically from the prompt's token ids and,
when started with --speculative-config, counts drafts in /metrics as vLLM does. The real
vLLM run is the lead's train -> export -> serve test; this one needs no serving env.
"""

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from blockdraft.models.tiny_target import save_tiny_target
from blockdraft.serve import harness
from blockdraft.serve.config import ServeConfig
from blockdraft.serve.preflight import plan_serving
from blockdraft.serve.vllm_probe import VllmInfo

FAKE_VLLM = """\
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

port = int(sys.argv[sys.argv.index("--port") + 1])
speculative = "--speculative-config" in sys.argv
flip = speculative and os.environ.get("FAKE_FLIP") == "1"
counts = {"drafts": 0, "accepted": 0}

class Api(BaseHTTPRequestHandler):
    def _send(self, code, body, kind="application/json"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self._send(200, "")
        lines = []
        if speculative:
            lines = [
                f'vllm:spec_decode_num_drafts_total{{engine="0"}} {counts["drafts"]}',
                f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {3 * counts["drafts"]}',
                f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {counts["accepted"]}',
            ] + [
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{i}"}} {counts["accepted"] // 3}'
                for i in range(3)
            ]
        self._send(200, "\\n".join(lines) + "\\n", "text/plain")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt, n = body["prompt"], body["max_tokens"]
        ids = [(sum(prompt) + 7 * i) % 200 for i in range(n)]
        top = [{f"token_id:{t}": -0.5, f"token_id:{(t + 1) % 200}": -0.51} for t in ids]
        if flip and len(prompt) % 2 == 0 and n > 3:
            ids[3] = (ids[3] + 1) % 200  # the runner-up: a near-tie by the baseline's numbers
        counts["drafts"] += n // 4
        counts["accepted"] += 3 * (n // 8)
        choice = {"token_ids": ids, "finish_reason": "length", "logprobs": {"top_logprobs": top}}
        self._send(200, json.dumps({"choices": [choice]}))

    def log_message(self, *args):
        pass

HTTPServer(("127.0.0.1", port), Api).serve_forever()
"""

FAKE_INFO = VllmInfo(
    version="fake", device="cpu", has_triton=False, v2_runner_env=None, dflash_archs=["DFlashDraftModel"],
    arch_known=True, arch_supports_eagle3=True, anchor_clamp=None, cpu_head_sizes=[],
)


@pytest.fixture
def setup(tmp_path, monkeypatch):
    script = tmp_path / "fake_python"
    script.write_text(f"#!{sys.executable}\n{FAKE_VLLM}")
    script.chmod(0o755)
    target = save_tiny_target(tmp_path / "target")
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({
        "architectures": ["DFlashDraftModel"], "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
        "vocab_size": 268, "dflash_config": {"mask_token_id": 262, "target_layer_ids": [1, 3], "block_size": 4},
    }))
    save_file({"fc.weight": torch.zeros(64, 128)}, str(draft / "model.safetensors"))
    monkeypatch.setattr(harness, "plan_serving", lambda cfg: plan_serving(cfg, probe=lambda *_: FAKE_INFO))
    return ServeConfig(draft_dir=str(draft), target_dir=str(target), vllm_python=str(script), out=str(tmp_path / "out"),
                       num_prompts=4, max_tokens=16, startup_timeout_s=30)


def test_a_lossless_active_run_passes_and_writes_its_report(setup):
    report = harness.run(setup)
    assert report["passed"] and report["lossless"] and report["draft_active"], report["failures"]
    assert report["engine"] == "vllm" and not report["incomplete"]
    # Per prompt of 16 tokens: 4 drafts, 6 accepted -> 1 + 6/4; the warm-up request is not counted.
    assert report["mean_acceptance_length"] == pytest.approx(2.5)
    assert report["acceptance_per_position"] == pytest.approx([0.5, 0.5, 0.5])
    assert set(report["timings_s"]) >= {"startup_baseline", "generation_baseline", "startup_draft", "generation_draft"}
    written = json.loads((Path(setup.out) / "report.json").read_text())
    assert written["tokens_generated"] == {"baseline": 64, "draft": 64}


def test_a_differing_draft_run_is_reported_with_prompt_and_position(setup, monkeypatch):
    monkeypatch.setenv("FAKE_FLIP", "1")
    report = harness.run(setup)
    assert not report["passed"] and not report["lossless"]
    first = report["mismatches"][0]
    assert first["position"] == 3 and first["near_tie"] == "yes"
    setup.allow_near_ties = True
    setup.overwrite = True  # the same out again: the earlier report is replaced only when asked
    assert harness.run(setup)["passed"]


def test_a_server_that_cannot_start_leaves_an_incomplete_report(setup, tmp_path):
    broken = tmp_path / "broken_python"
    broken.write_text(f"#!{sys.executable}\nimport sys\nprint('no vLLM here')\nsys.exit(1)\n")
    broken.chmod(0o755)
    setup.vllm_python = str(broken)
    report = harness.run(setup)
    assert report["incomplete"] and not report["passed"]
    assert "exited with code 1" in report["error"] and "no vLLM here" in report["error"]


def test_dflash2_on_a_cpu_vllm_is_checked_by_the_reference_engine(tmp_path, monkeypatch, capsys):
    from transformers import AutoModelForCausalLM

    from blockdraft.export.writer import export_draft
    from blockdraft.models.io import save_draft
    from tests.conftest import make_draft

    target = save_tiny_target(tmp_path / "target")
    save_draft(tmp_path / "ckpt", make_draft(AutoModelForCausalLM.from_pretrained(target), "dflash2"))
    export = export_draft(tmp_path / "ckpt", tmp_path / "export", dtype="float32", target_dir=target)
    info = VllmInfo(**{**FAKE_INFO.__dict__, "dflash_archs": ["DFlash2DraftModel", "DFlashDraftModel"], "anchor_clamp": False})
    monkeypatch.setattr(harness, "plan_serving", lambda cfg: plan_serving(cfg, probe=lambda *_: info))
    cfg = ServeConfig(draft_dir=str(export), target_dir=str(target), vllm_python=sys.executable,
                      out=str(tmp_path / "out"), num_prompts=2, max_tokens=8)
    report = harness.run(cfg)
    assert report["engine"] == "reference" and report["lossless"] and not report["incomplete"]
    assert report["spec_decode"]["num_drafts"] > 0
    assert any("reference engine" in w for w in report["warnings"])
    assert any("clamp" in w for w in report["warnings"])
    assert "REFERENCE engine" in capsys.readouterr().out
