"""capture.backend=vllm without vLLM: the client's conversions (layers, soft labels, packed rows), its requests,
retries and file reads against a fake server on a real port, the config's refusals, and the connector's file
naming, gathering and atomic write (its module loaded over stand-ins for the few vLLM names it imports)."""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from blockdraft.capture import vllm_rows
from blockdraft.capture.vllm_config import CaptureVllmConfig, check_capture_vllm
from blockdraft.capture.vllm_rows import (VllmRows, aux_layer_ids, features_from_states, layer_order, request_body,
                                          teacher_rows, topk_from_logprobs)
from blockdraft.capture.vllm_servers import capture_args, capture_server_command, speculative_config
from blockdraft.errors import ConfigError, DataError
from blockdraft.models.teacher import teacher_topk_rows

H = 4


# --- conversions ----------------------------------------------------------------------------------
def test_target_layer_i_is_aux_i_plus_one_sorted_unique_and_rows_come_back_in_target_order():
    assert aux_layer_ids([5, 1, 3]) == [2, 4, 6]
    assert layer_order([5, 1, 3]) == [2, 0, 1]
    states = torch.stack([torch.full((3, H), float(a)) for a in (2, 4, 6)], dim=1).to(torch.bfloat16)  # [n, 3, H]
    out = features_from_states(states, [5, 1, 3])
    assert out.dtype == torch.float32 and out.shape == (3, 3 * H)
    assert out.view(3, 3, H)[:, :, 0].tolist() == [[6.0, 2.0, 4.0]] * 3
    assert speculative_config([5, 1, 3])["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 6]


def test_topk_keeps_the_k_best_of_vllms_dict_with_the_prompt_token_beside_them():
    entries = {"17": {"logprob": -9.0, "rank": 212}, "53": {"logprob": 0.3, "rank": 1}, "80": {"logprob": 0.2, "rank": 2},
               "token_id:9": -0.5}
    assert topk_from_logprobs(entries, 2) == ([53, 80], [0.3, 0.2])
    assert topk_from_logprobs(entries, 3) == ([53, 80, 9], [0.3, 0.2, -0.5])


def logprob_dict(logits: torch.Tensor, k: int, prompt_token: int) -> dict:
    """A position as vLLM's completions answer gives it: the top k and the prompt token, keyed by id."""
    values, ids = logits.topk(k)
    entries = {str(int(prompt_token)): {"logprob": float(logits[prompt_token]), "rank": 99}}
    entries.update({str(int(i)): {"logprob": float(v), "rank": r + 1} for r, (v, i) in enumerate(zip(values, ids))})
    return entries


def test_prompt_logprobs_t_plus_one_is_the_stores_position_t_also_across_packed_documents():
    """The store's teacher (teacher_topk_rows: position t = the top-k for token t+1, zeros where token t+1 is not
    supervised) rebuilt from vLLM's per-document prompt_logprobs and, at a document's end, its generated token."""
    torch.manual_seed(0)
    k, vocab, lengths = 3, 11, [4, 3]
    n = sum(lengths)
    ids = torch.randint(0, vocab, (n,))
    logits = torch.randn(n, vocab)  # per position, each document's own (as the online capture runs them)
    mask = torch.tensor([0, 1, 1, 0, 1, 1, 1], dtype=torch.bool)  # token 4 (document 1's first) supervised
    eye = torch.eye(vocab)
    want_ids, want_logits = teacher_topk_rows(logits, mask, eye, k)  # hidden @ eye.T = the logits themselves
    documents, start = [], 0
    for length in lengths:
        prompt = [None] + [logprob_dict(logits[start + t - 1], k, ids[start + t]) for t in range(1, length)]
        last = logprob_dict(logits[start + length - 1], k, 0)
        documents.append({"length": length, "prompt_logprobs": prompt, "last": last})
        start += length
    got_ids, got_logits = teacher_rows(documents, mask, k)
    assert torch.equal(got_ids, want_ids) and torch.allclose(got_logits, want_logits)
    assert got_ids.dtype == torch.int32 and got_logits.dtype == torch.float32
    assert got_logits[3].abs().sum() > 0  # document 0's last position, from the generated token's logprobs
    assert got_logits[-1].abs().sum() == 0  # the row's last position is never supervised


def test_logprobs_teach_what_logits_teach():
    """vLLM's default mode gives logits minus a per-position constant; the trainer's log_softmax over the k
    candidates cancels it, so a store of logprobs trains like a store of logits."""
    from blockdraft.losses.block import teacher_log_probs

    logits = torch.randn(5, 8)
    rest = torch.randn(5, 100)  # the vocabulary outside the top k
    logprobs = logits - torch.logsumexp(torch.cat([logits, rest], -1), -1, keepdim=True)
    usable = torch.rand(5, 8) > 0.3
    usable[:, 0] = True
    for temperature in (1.0, 2.0):
        assert torch.allclose(teacher_log_probs(logits, usable, temperature), teacher_log_probs(logprobs, usable, temperature),
                              atol=1e-5)


def test_request_body_sends_ids_one_token_the_file_name_and_the_logprobs_asked():
    body = request_body(None, [1, 2, 3], "bd-x-0", 0, want_last=False)
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 1 and body["kv_transfer_params"] == {"capture_name": "bd-x-0"}
    assert "prompt_logprobs" not in body and "model" not in body
    body = request_body("m", [1], "n", 4, want_last=True)
    assert body["model"] == "m" and body["prompt_logprobs"] == 4 and body["logprobs"] == 4 and body["return_tokens_as_token_ids"]


def test_server_arguments_carry_the_connector_and_turn_prefix_caching_off(tmp_path):
    args = capture_args(tmp_path, 8)
    config = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert config["kv_connector_module_path"] == "blockdraft.capture.vllm_connector"
    assert config["kv_connector_extra_config"]["capture_dir"] == str(tmp_path.resolve())
    assert "--no-enable-prefix-caching" in args and args[args.index("--max-logprobs") + 1] == "8"
    assert args[args.index("--logprobs-mode") + 1] == "raw_logits"
    assert "--max-logprobs" not in capture_args(tmp_path, 0)
    assert "PYTHONPATH=" in capture_server_command("py", "/t", [1], str(tmp_path), 0, 129)


@pytest.mark.parametrize("change, words", [
    (dict(servers=0), "nothing would answer"),
    (dict(endpoints=["http://h:1"]), "scratch_dir"),
    (dict(endpoints=["h:1"], scratch_dir="/s"), "capture.vllm.endpoints[0]"),
    (dict(workers=0), "capture.vllm.workers=0"),
    (dict(request_timeout_s=0), "request_timeout_s"),
    (dict(cpu_threads_bind="most"), "cpu_threads_bind"),
    (dict(extra_vllm_args=["--max-model-len", "9"]), "data.seq_length"),
    (dict(extra_vllm_args=["--enable-prefix-caching"]), "prefix-cache hit"),
    (dict(extra_vllm_args=["--gpu-memory-utilization", 0.8]), "must be strings"),
])
def test_config_refusals_name_the_key_and_the_fix(change, words):
    with pytest.raises(ConfigError) as err:
        check_capture_vllm(CaptureVllmConfig(**change))
    assert words in str(err.value)


def test_config_defaults_pass():
    check_capture_vllm(CaptureVllmConfig(), 32)
    check_capture_vllm(CaptureVllmConfig(servers=0, endpoints=["http://h:1/v1"], scratch_dir="/shared/x"))


# --- the client against a fake capture server --------------------------------------------------------
class FakeCapture:
    """A completions server on loopback that does what a capture server does: writes [n, layers, H] states (token id
    plus the aux id, per element) and the ids to <dir>/<capture_name>.safetensors, answers with the path and, when
    asked, prompt logprobs (logit of token v at position t: -(v - ids[t]) ** 2). `script` holds, per request, what
    to do: "ok", "drop" (close the connection), "500", "400", "nofile", "noparams"."""

    def __init__(self, directory: Path, aux: list, script=()):
        self.directory, self.aux, self.script, self.bodies = directory, aux, list(script), []
        self.delay_s, self.in_flight, self.most_in_flight, self.lock = 0.0, 0, 0, threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.bodies.append(body)
                    fake.in_flight += 1
                    fake.most_in_flight = max(fake.most_in_flight, fake.in_flight)
                try:
                    self.answer(body)
                finally:
                    with fake.lock:
                        fake.in_flight -= 1

            def answer(self, body):
                time.sleep(fake.delay_s)
                action = fake.script.pop(0) if fake.script else "ok"
                if action == "drop":
                    self.connection.close()
                    return
                if action in ("500", "400"):
                    self.send_response(int(action))
                    self.end_headers()
                    self.wfile.write(b"no")
                    return
                ids = body["prompt"]
                name = body["kv_transfer_params"]["capture_name"]
                path = fake.directory / f"{name}.safetensors"
                if action == "ok":
                    states = torch.tensor(ids, dtype=torch.float32)[:, None, None] + torch.tensor(fake.aux, dtype=torch.float32)[None, :, None]
                    save_file({"hidden_states": states.expand(-1, -1, H).contiguous(), "token_ids": torch.tensor(ids)}, str(path))
                answer = {"choices": [{"text": "x"}], "kv_transfer_params": {"hidden_states_path": str(path)}}
                if action == "noparams":  # a plain vLLM server, without the capture's connector
                    answer.pop("kv_transfer_params")
                k = body.get("prompt_logprobs")
                if k:
                    answer["choices"][0]["prompt_logprobs"] = [None] + [
                        {str(v): {"logprob": -float((v - ids[t - 1]) ** 2), "rank": 1} for v in range(k)} for t in range(1, len(ids))]
                    if body.get("logprobs"):
                        answer["choices"][0]["logprobs"] = {"top_logprobs": [
                            {f"token_id:{v}": -float((v - ids[-1]) ** 2) for v in range(k)}]}
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake(tmp_path):
    servers = []

    def make(script=(), aux=(2, 4)):
        server = FakeCapture(tmp_path, list(aux), script)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


def item(ids, lengths, mask=None):
    ids = torch.tensor(ids)
    return {"input_ids": ids, "loss_mask": torch.ones(len(ids), dtype=torch.bool) if mask is None else torch.tensor(mask, dtype=torch.bool),
            "document_lengths": torch.tensor(lengths), "prompt_hashes": torch.arange(len(lengths))}


def test_rows_have_the_keys_of_the_online_capture_one_request_per_document_and_files_removed(fake, tmp_path):
    server = fake()
    items = [item([5, 6, 7, 8, 9], [2, 3], mask=[0, 0, 1, 1, 1]), item([1, 2], [2])]
    with VllmRows([server.url + "/v1"], tmp_path, [3, 1], teacher_top_k=2, workers=2, timeout_s=5) as client:
        rows = client.rows(items, ["row 0", "row 1"])
    assert sorted(rows[0]) == sorted(["input_ids", "loss_mask", "position_ids", "document_lengths", "prompt_hashes", "features",
                                      "teacher_ids", "teacher_logits"])
    assert [b["prompt"] for b in server.bodies if b["prompt"] != [1, 2]] in ([[5, 6], [7, 8, 9]], [[7, 8, 9], [5, 6]])
    feats = rows[0]["features"].view(5, 2, H)[:, :, 0]
    assert feats.tolist() == [[t + 4, t + 2] for t in [5, 6, 7, 8, 9]]  # layer 3 = aux 4 first, then layer 1 = aux 2
    assert rows[0]["position_ids"].tolist() == [0, 1, 0, 1, 2]
    # position 1 (document 0's last) teaches token 2 (supervised): the generated token's top-2 around ids[1] = 6
    assert rows[0]["teacher_ids"][1].tolist() == [1, 0] and rows[0]["teacher_logits"][1].tolist() == [-25.0, -36.0]
    assert rows[0]["teacher_ids"][0].tolist() == [0, 0] and rows[0]["teacher_logits"][0].abs().sum() == 0
    assert rows[0]["teacher_ids"][2].tolist() == [1, 0] and rows[0]["teacher_logits"][2].tolist() == [-36.0, -49.0] and rows[0]["teacher_logits"][4].abs().sum() == 0
    assert list(tmp_path.glob("*.safetensors")) == []


def test_dropped_connections_and_5xx_are_retried_a_4xx_is_not(fake, tmp_path):
    server = fake(["drop", "500"])
    with VllmRows([server.url], tmp_path, [1, 3], workers=1, timeout_s=5, retries=2, retry_backoff_s=0.01) as client:
        row = client.rows([item([4, 5, 6], [3])], ["row 0"])[0]
    assert row["features"].shape == (3, 2 * H) and len(server.bodies) == 3
    server.script = ["400"]
    with VllmRows([server.url], tmp_path, [1, 3], workers=1, timeout_s=5, retries=2, retry_backoff_s=0.01) as client:
        with pytest.raises(DataError, match="row 7 .*HTTP 400"):
            client.rows([item([4], [1])], ["row 7"])


def test_a_file_that_never_comes_is_retried_then_the_capture_stops_naming_the_row_and_the_shared_dir(fake, tmp_path):
    server = fake(["nofile", "ok"])
    with VllmRows([server.url], tmp_path, [1, 3], workers=1, timeout_s=0.3, retries=1, retry_backoff_s=0.01) as client:
        assert client.rows([item([4, 5], [2])], ["r"])[0]["features"].shape == (2, 2 * H)
    server.script = ["nofile", "nofile"]
    elsewhere = tmp_path / "not-shared"
    elsewhere.mkdir()
    with VllmRows([server.url], elsewhere, [1, 3], workers=1, timeout_s=0.2, retries=1, retry_backoff_s=0.01) as client:
        with pytest.raises(DataError, match="row 3.*2 tries failed.*shared"):
            client.rows([item([4, 5], [2])], ["row 3"])


def test_a_server_without_the_connector_and_one_of_other_layers_are_refused_at_once(fake, tmp_path):
    server = fake(["noparams"], aux=(2, 4, 6))
    with VllmRows([server.url], tmp_path, [1, 3], workers=1, timeout_s=5, retries=3) as client:
        with pytest.raises(DataError, match="does not run the capture connector"):
            client.rows([item([4, 5], [2])], ["r"])
        with pytest.raises(DataError, match="other layers"):
            client.rows([item([4, 5], [2])], ["r"])
    assert len(server.bodies) == 2


def test_requests_spread_over_servers_at_most_workers_in_flight_each(fake, tmp_path):
    a, b = fake(), fake()
    a.delay_s = b.delay_s = 0.05
    items = [item([i, i + 1], [2]) for i in range(12)]
    with VllmRows([a.url, b.url], tmp_path, [1, 3], workers=2, timeout_s=5) as client:
        rows = client.rows(items, [f"r{i}" for i in range(12)])
    assert [int(r["input_ids"][0]) for r in rows] == list(range(12))
    assert len(a.bodies) + len(b.bodies) == 12 and a.most_in_flight == 2 and b.most_in_flight == 2


# --- the connector, over stand-ins for vLLM ----------------------------------------------------------
@pytest.fixture
def connector(monkeypatch):
    """blockdraft.capture.vllm_connector imported with stand-ins for the vLLM base classes it names."""
    base = types.ModuleType("vllm.distributed.kv_transfer.kv_connector.v1.base")

    class KVConnectorBase_V1:
        def __init__(self, vllm_config, role, kv_cache_config):
            self._vllm_config, self._kv_transfer_config, self._meta = vllm_config, vllm_config.kv_transfer_config, None

        def bind_connector_metadata(self, meta):
            self._meta = meta

        def has_connector_metadata(self):
            return self._meta is not None

        def _get_connector_metadata(self):
            return self._meta

    class KVConnectorMetadata:
        pass

    base.KVConnectorBase_V1, base.KVConnectorMetadata = KVConnectorBase_V1, KVConnectorMetadata
    base.KVConnectorRole, base.SupportsHMA = object, type("SupportsHMA", (), {})
    for name in ("vllm", "vllm.distributed", "vllm.distributed.kv_transfer", "vllm.distributed.kv_transfer.kv_connector",
                 "vllm.distributed.kv_transfer.kv_connector.v1"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, base.__name__, base)
    monkeypatch.delitem(sys.modules, "blockdraft.capture.vllm_connector", raising=False)
    module = importlib.import_module("blockdraft.capture.vllm_connector")
    yield module
    sys.modules.pop("blockdraft.capture.vllm_connector", None)


def test_file_names_are_the_clients_or_the_request_id_never_a_path(connector, tmp_path):
    d = str(tmp_path)
    assert connector.file_name_for(d, "cmpl-1-0", {"capture_name": "bd-a-7"}) == os.path.join(d, "bd-a-7.safetensors")
    assert connector.file_name_for(d, "cmpl-1-0", None) == os.path.join(d, "cmpl-1-0.safetensors")
    assert connector.file_name_for(d, "cmpl/..", {"capture_name": "../../etc/x"}) == os.path.join(d, "cmpl_...safetensors")
    with pytest.raises(ValueError):
        connector.capture_file(d, "..")


def test_atomic_write_leaves_no_partial_file(connector, tmp_path, monkeypatch):
    path = str(tmp_path / "a.safetensors")
    connector.write_atomically({"x": torch.arange(3)}, path)
    assert sorted(os.listdir(tmp_path)) == ["a.safetensors"]

    def torn(tensors, filename):
        Path(filename).write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(connector, "save_file", torn)
    with pytest.raises(OSError):
        connector.write_atomically({"x": torch.arange(3)}, str(tmp_path / "b.safetensors"))
    assert sorted(os.listdir(tmp_path)) == ["a.safetensors"]


def test_a_finished_request_is_gathered_from_its_blocks_written_once_and_reported_done(connector, tmp_path):
    layers, block, hidden = 2, 4, 3
    cache = torch.randn(6, layers, block, hidden)  # [num_blocks, layers, block_size, hidden], as vLLM lays it out
    extra = {"capture_dir": str(tmp_path)}
    transfer = types.SimpleNamespace(get_from_extra_config=lambda key, default: extra.get(key, default))
    config = types.SimpleNamespace(kv_transfer_config=transfer,
                                   speculative_config=types.SimpleNamespace(method="extract_hidden_states"))
    scheduler = connector.CaptureConnector(config, "scheduler", None)
    worker = connector.CaptureConnector(config, "worker", None)
    worker._cache = cache
    ids = list(range(10, 16))  # 6 tokens over blocks 3 and 1
    new = types.SimpleNamespace(req_id="cmpl-9-0", sampling_params=types.SimpleNamespace(
        extra_args={"kv_transfer_params": {"capture_name": "row-0"}}))
    scheduler.build_connector_meta(types.SimpleNamespace(scheduled_new_reqs=[new]))
    request = types.SimpleNamespace(request_id="cmpl-9-0", prompt_token_ids=ids)
    keep, params = scheduler.request_finished_all_groups(request, ([3, 1],))
    assert keep and params == {"hidden_states_path": str(tmp_path / "row-0.safetensors")}
    worker.bind_connector_metadata(scheduler.build_connector_meta(types.SimpleNamespace(scheduled_new_reqs=[])))
    done, _ = worker.get_finished({"cmpl-9-0", "aborted-1"})
    assert done == {"cmpl-9-0"} and worker._finished == set()
    worker.shutdown()
    from safetensors.torch import load_file

    data = load_file(str(tmp_path / "row-0.safetensors"))
    want = torch.cat([cache[3].permute(1, 0, 2), cache[1].permute(1, 0, 2)])[:6]  # [tokens, layers, hidden]
    assert torch.equal(data["hidden_states"], want) and data["token_ids"].tolist() == ids
    assert sorted(os.listdir(tmp_path)) == ["row-0.safetensors"]
    worker.bind_connector_metadata(connector.CaptureMetadata())
    assert worker.get_finished(set()) == (None, None)


def test_a_dead_server_is_passed_over_once_it_failed(fake, tmp_path):
    alive = fake()
    dead = FakeCapture(tmp_path, [2, 4])
    dead.close()  # its port now refuses connections
    items = [item([i, i + 1], [2]) for i in range(8)]
    with VllmRows([dead.url, alive.url], tmp_path, [1, 3], workers=1, timeout_s=5, retries=1, retry_backoff_s=0.01) as client:
        rows = client.rows(items, [f"r{i}" for i in range(8)])
    assert len(rows) == 8 and len(alive.bodies) == 8
