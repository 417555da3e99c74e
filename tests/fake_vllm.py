"""One fake vLLM server for the tests that exercise the harness and the server wrapper.

It takes vLLM's command line, starts a child process in its own process group as vLLM's
engine core does, answers /health, the completions API (deterministic ids from the prompt,
enforcing --max-model-len when given) and, when started with --speculative-config, counts
drafts in /metrics as vLLM does. Environment knobs pick the behaviour under test:

    FAKE_DIR             where it records "<pid> <child pid>" (pids), its argv (argv, one JSON
                         line per start), the moments it died (died) or got busy (busy), and
                         each SIGTERM it ignored (sigterm)
    FAKE_MODE            serve (default) | crash (exits 3 at start) | hang (never healthy) |
                         stubborn (ignores SIGTERM and never gets healthy)
    FAKE_STUCK=1         serves, but ignores SIGTERM as a stuck server does: only SIGKILL ends it
    FAKE_FLIP=1          with the draft: token 3 of even-length prompts becomes the runner-up
    FAKE_DIE_AFTER_<BASELINE|DRAFT>=N   exits mid-request after N requests
    FAKE_SLOW_S=S        each completion takes S seconds
    FAKE_BUSY=1          its child spins on a core the whole time, as an engine loop that polls would
    FAKE_FAIL_PROMPTS    JSON {"<sum of the prompt's ids>": n}: the first n requests of that prompt get HTTP 500
                         (n = -1: every one), as a server that breaks on one input
    FAKE_DIE_ONE_AFTER=N of the servers started with it, only the first (claimed in FAKE_DIR) exits mid-request
                         after N requests, as one of several servers that dies

Besides, as regen's servers need: /v1/models lists the model (--served-model-name, else --model) with its
--max-model-len, a completion carries its text and usage, other POST routes are not found (no /tokenize),
and run as the serving interpreter's probe (`<python> -I .../probe.py <arch>...`) it answers as INFO_FIELDS.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

SCRIPT = r'''
import json, os, signal, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer

argv = sys.argv
env = os.environ
port = int(argv[argv.index("--port") + 1])
limit = int(argv[argv.index("--max-model-len") + 1]) if "--max-model-len" in argv else None
phase = "DRAFT" if "--speculative-config" in argv else "BASELINE"
mode = env.get("FAKE_MODE", "serve")
record_dir = env.get("FAKE_DIR")
# Like vLLM's engine core: a child in the server's process group that must not outlive it.
busy = env.get("FAKE_BUSY") == "1"
child = subprocess.Popen([sys.executable, "-c", "while True: pass" if busy else "import time; time.sleep(600)"])
if record_dir:
    with open(record_dir + "/pids", "a") as fh:
        fh.write(f"{os.getpid()} {child.pid}\n")
    with open(record_dir + "/argv", "a") as fh:
        fh.write(json.dumps(argv) + "\n")
print("fake vLLM starting", flush=True)
if mode == "crash":
    print("fake vLLM: cannot load the model", flush=True)
    sys.exit(3)
def ignore_sigterm(*_):
    if record_dir:  # so that a test knows the harness is stopping it
        open(record_dir + "/sigterm", "a").close()

if mode == "stubborn" or env.get("FAKE_STUCK") == "1":
    signal.signal(signal.SIGTERM, ignore_sigterm)
if mode in ("hang", "stubborn"):
    time.sleep(600)  # never answers /health
flip = phase == "DRAFT" and env.get("FAKE_FLIP") == "1"
die_after = int(env.get("FAKE_DIE_AFTER_" + phase) or 0)
if env.get("FAKE_DIE_ONE_AFTER"):
    try:  # the first server to claim it is the one that dies
        os.close(os.open(record_dir + "/die_claimed", os.O_CREAT | os.O_EXCL))
        die_after = int(env["FAKE_DIE_ONE_AFTER"])
    except FileExistsError:
        pass
fail_left = {int(k): n for k, n in json.loads(env.get("FAKE_FAIL_PROMPTS") or "{}").items()}
served_name = argv[argv.index("--served-model-name") + 1] if "--served-model-name" in argv else argv[argv.index("--model") + 1]
slow_s = float(env.get("FAKE_SLOW_S") or 0)
counts = {"served": 0, "drafts": 0, "accepted": 0}

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
        if self.path == "/v1/models":
            card = {"id": served_name, "object": "model", "root": argv[argv.index("--model") + 1], "max_model_len": limit}
            return self._send(200, json.dumps({"object": "list", "data": [card]}))
        lines = [f'vllm:spec_decode_num_drafts_total{{engine="0"}} {counts["drafts"]}',
                 f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {3 * counts["drafts"]}',
                 f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {counts["accepted"]}']
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{i}"}} {counts["accepted"] // 3}'
                  for i in range(3)]
        self._send(200, "\n".join(lines if phase == "DRAFT" else []) + "\n", "text/plain")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/completions":
            return self._send(404, json.dumps({"detail": "Not Found"}))
        prompt, n = body["prompt"], body["max_tokens"]
        if die_after and counts["served"] >= die_after:
            with open(record_dir + "/died", "w") as fh:
                fh.write(str(time.time()))
            print("fake vLLM: EngineCore died unexpectedly (fault injected)", flush=True)
            os._exit(1)  # mid-request: the client's connection drops
        counts["served"] += 1
        if limit is not None and len(prompt) + n > limit:
            msg = f"This model's maximum context length is {limit} tokens; the request has {len(prompt) + n}."
            return self._send(400, json.dumps({"error": {"message": msg}}))
        if fail_left.get(sum(prompt), 0):
            fail_left[sum(prompt)] -= 1
            return self._send(500, json.dumps({"error": {"message": "fake vLLM: this prompt broke the engine (fault injected)"}}))
        if slow_s:
            open(record_dir + "/busy", "w").close()
            time.sleep(slow_s)
        ids = [(sum(prompt) + 7 * i) % 200 for i in range(n)]
        top = [{f"token_id:{t}": -0.5, f"token_id:{(t + 1) % 200}": -0.51} for t in ids]
        if flip and len(prompt) % 2 == 0 and n > 3:
            ids[3] = (ids[3] + 1) % 200  # the runner-up: a near-tie by the baseline's numbers
        counts["drafts"] += n // 4
        counts["accepted"] += 3 * (n // 8)
        text = " ".join(f"w{t}" for t in ids)
        self._send(200, json.dumps({"choices": [{"token_ids": ids, "text": text, "finish_reason": "length",
                                                 "logprobs": {"top_logprobs": top}}], "usage": {"completion_tokens": n}}))

    def log_message(self, *args):
        pass

HTTPServer(("127.0.0.1", port), Api).serve_forever()
'''

# What the harness's vLLM probe would report of the fake: a CPU vLLM that knows DFlash.
INFO_FIELDS = dict(version="fake", device="cpu", has_triton=False, v2_runner_env=None, dflash_archs=["DFlashDraftModel"],
                   arch_known=True, arch_supports_eagle3=True, anchor_clamp=None, cpu_head_sizes=[])


# Run as the probe (`<python> -I <...>/probe.py <arch> ...`), the fake answers as the probe does, then exits.
PROBE_ANSWER = r'''
import json as _json, sys as _sys
if len(_sys.argv) > 2 and _sys.argv[1] == "-I" and _sys.argv[2].endswith("probe.py"):
    print("BLOCKDRAFT_VLLM_PROBE " + _json.dumps({arch: _json.loads(%r) for arch in _sys.argv[3:]}), flush=True)
    _sys.exit(0)
'''


def write_fake_python(path: Path) -> Path:
    """An executable standing in for the serving interpreter: it runs the fake whatever the module."""
    path.write_text(f"#!{sys.executable}\n{PROBE_ANSWER % json.dumps(INFO_FIELDS)}{SCRIPT}")
    path.chmod(0o755)
    return path


def write_fake_draft(directory: Path) -> Path:
    """The smallest DFlash export that the harness's preflight accepts for the tiny target."""
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["DFlashDraftModel"], "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
        "vocab_size": 268, "dflash_config": {"mask_token_id": 262, "target_layer_ids": [1, 3], "block_size": 4},
    }))
    save_file({"fc.weight": torch.zeros(64, 128)}, str(directory / "model.safetensors"))
    return directory


def started_pids(record_dir: Path) -> list:
    """Every (server, child) pid the fake recorded, flattened."""
    path = record_dir / "pids"
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def recorded_fake_python(tmp_path: Path, monkeypatch):
    """A fixture's body: the fake serving interpreter, FAKE_DIR recording its starts; afterwards no fake is left
    running, even where a test killed the run that owned them."""
    import os
    import signal

    monkeypatch.setenv("FAKE_DIR", str(tmp_path))
    yield write_fake_python(tmp_path / "fake_python")
    for pid in started_pids(tmp_path):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
