"""The vLLM backend's request/answer handling, against a stand-in completions server."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from blockdraft.regen.turns import prompt_ids
from blockdraft.errors import ConfigError
from blockdraft.regen.endpoints import PROBE, api_headers, check_endpoint
from blockdraft.regen.vllm_backend import (RegenRequestError, RequestRefused, ServerUnreachable, completion_body, parse_reply,
                                           request_seed, vllm_reply)
from blockdraft.data.tiny_tokenizer import build_tiny_tokenizer
from blockdraft.vllm_runtime.server import server_settings


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


class FakeCompletions(BaseHTTPRequestHandler):
    bodies = []
    status = 200
    models = [{"id": "model-dir", "max_model_len": 4096}]
    tokens = None  # what /tokenize answers; None: no /tokenize (404)
    headers_seen = []

    def do_GET(self):  # noqa: N802 - the stdlib's name
        FakeCompletions.headers_seen.append(dict(self.headers))
        if FakeCompletions.status != 200:
            return self._answer(FakeCompletions.status, {"error": "no"})
        self._answer(200, {"object": "list", "data": FakeCompletions.models})

    def _answer(self, status, answer):
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):  # noqa: N802 - the stdlib's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeCompletions.bodies.append((self.path, body))
        if self.path == "/tokenize":
            tokens = FakeCompletions.tokens
            return self._answer(404, {"detail": "Not Found"}) if tokens is None else self._answer(200, {"tokens": tokens(body)})
        if FakeCompletions.status != 200:
            self.send_response(FakeCompletions.status)
            self.end_headers()
            self.wfile.write(b"prompt too long")
            return
        answer = {"choices": [{"text": "hi there", "finish_reason": "length"}], "usage": {"completion_tokens": 2}}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    FakeCompletions.bodies, FakeCompletions.status, FakeCompletions.headers_seen = [], 200, []
    FakeCompletions.models, FakeCompletions.tokens = [{"id": "model-dir", "max_model_len": 4096}], None
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeCompletions)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_prompts_are_sent_as_the_templated_ids_with_greedy_settings(server, tokenizer):
    messages = [{"role": "user", "content": "hello"}]
    reply = vllm_reply(server, "model-dir", tokenizer, max_tokens=5, max_prompt_tokens=100)
    answer = reply(messages)
    path, body = FakeCompletions.bodies[0]
    assert path == "/v1/completions"
    assert body["prompt"] == prompt_ids(tokenizer, messages)
    assert body["model"] == "model-dir" and body["max_tokens"] == 5 and body["temperature"] == 0.0
    assert (answer.text, answer.tokens, answer.finish_reason) == ("hi there", 2, "length")


def test_template_ids_are_not_given_a_second_bos(tokenizer):
    ids = prompt_ids(tokenizer, [{"role": "user", "content": "x"}])
    text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(ids) == text


def test_a_context_over_the_limit_is_not_sent(server, tokenizer):
    reply = vllm_reply(server, "m", tokenizer, max_tokens=5, max_prompt_tokens=3)
    assert reply([{"role": "user", "content": "a long enough question"}]) is None
    assert FakeCompletions.bodies == []


def test_a_refused_request_names_the_status_and_says_a_rerun_resumes(server, tokenizer):
    FakeCompletions.status = 400
    reply = vllm_reply(server, "m", tokenizer, max_tokens=5, max_prompt_tokens=100)
    with pytest.raises(RegenRequestError, match="HTTP 400.*prompt too long.*rerun to resume"):
        reply([{"role": "user", "content": "q"}])


def test_an_answer_without_usage_is_refused_with_what_came_back():
    with pytest.raises(RegenRequestError, match="no choice or usage"):
        parse_reply({"choices": [{"text": "x"}]})
    assert parse_reply({"choices": [{"text": "x", "finish_reason": "stop"}], "usage": {"completion_tokens": 1}}).finish_reason == "stop"


def test_seeds_depend_on_the_conversation_not_on_the_order_of_requests():
    assert request_seed(0, [1, 2, 3]) == request_seed(0, [1, 2, 3])
    assert request_seed(0, [1, 2, 3]) != request_seed(0, [1, 2, 4])
    assert request_seed(1, [1]) != request_seed(0, [1])
    body = completion_body("m", [1, 2], 8, 0.7, seed=3)
    assert body["seed"] == request_seed(3, [1, 2]) and body["temperature"] == 0.7


def test_cpu_serving_runs_eager_fp32_with_a_sized_kv_cache():
    args, env = server_settings("cpu", max_model_len=640, max_num_seqs=32, kv_cache_gib=2)
    assert args[args.index("--max-model-len") + 1] == "640" and "--enforce-eager" in args
    assert args[args.index("--dtype") + 1] == "float32" and env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    gpu_args, gpu_env = server_settings("cuda", 640, 32, 2)
    assert "--enforce-eager" not in gpu_args and "VLLM_CPU_KVCACHE_SPACE" not in gpu_env


def test_only_a_busy_or_broken_server_is_asked_again():
    assert RequestRefused("x", 500).retryable and RequestRefused("x", 429).retryable
    assert not RequestRefused("x", 400).retryable and not RequestRefused("x", 404).retryable
    assert ServerUnreachable("x").unreachable and not RequestRefused("x", 503).unreachable


def test_a_request_nobody_answers_is_told_apart_from_a_refused_one(tokenizer):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, not listening: refused
    reply = vllm_reply(closed, "m", tokenizer, max_tokens=5, max_prompt_tokens=100, timeout_s=5)
    with pytest.raises(ServerUnreachable, match="no answer from"):
        reply([{"role": "user", "content": "q"}])


def check(url, tokenizer, model=None, needed=200, headers=None):
    return check_endpoint(url, model, tokenizer, None, needed, headers or {})


def test_an_endpoint_serving_one_model_is_sent_its_name(server, tokenizer, capsys):
    found = check(server, tokenizer)
    assert (found.model, found.max_model_len, found.tokenizer_checked) == ("model-dir", 4096, False)
    assert "offers no /tokenize" in capsys.readouterr().err


def test_an_endpoint_serving_several_models_needs_endpoint_model(server, tokenizer):
    FakeCompletions.models = [{"id": "a"}, {"id": "b"}]
    with pytest.raises(ConfigError, match=r"serves 2 models \['a', 'b'\]; set endpoint_model="):
        check(server, tokenizer)
    assert check(server, tokenizer, model="b").model == "b"
    with pytest.raises(ConfigError, match=r"does not serve endpoint_model='c' \(it serves \['a', 'b'\]\)"):
        check(server, tokenizer, model="c")


def test_an_endpoint_too_short_for_the_rows_is_refused(server, tokenizer):
    FakeCompletions.models = [{"id": "m", "max_model_len": 128}]
    with pytest.raises(ConfigError, match=r"context of 128 tokens, under max_prompt_tokens \+ max_tokens = 200; .*--max-model-len 200"):
        check(server, tokenizer)


def test_an_endpoint_of_another_tokenizer_is_refused_and_one_of_the_same_is_checked(server, tokenizer):
    ours = prompt_ids(tokenizer, PROBE)
    FakeCompletions.tokens = lambda body: ours[:-1] + [ours[-1] + 1]
    with pytest.raises(ConfigError, match="tokenizes text unlike target_dir's tokenizer .*serves another model"):
        check(server, tokenizer)
    FakeCompletions.tokens = lambda body: list(tokenizer(body["prompt"], add_special_tokens=body["add_special_tokens"]).input_ids)
    assert check(server, tokenizer).tokenizer_checked


def test_an_endpoint_that_does_not_answer_or_wants_a_key_is_refused_before_any_generation(server, tokenizer, monkeypatch):
    with pytest.raises(ConfigError, match=r"endpoint http://127.0.0.1:9 does not answer /v1/models .*fix the URL"):
        check("http://127.0.0.1:9", tokenizer)
    FakeCompletions.status = 401
    with pytest.raises(ConfigError, match="answered HTTP 401 to /v1/models; set endpoint_api_key_env="):
        check(server, tokenizer)
    with pytest.raises(ConfigError, match="endpoint_api_key_env=REGEN_TEST_KEY: that environment variable is empty or unset"):
        api_headers("REGEN_TEST_KEY")
    monkeypatch.setenv("REGEN_TEST_KEY", "sk-test")
    FakeCompletions.status = 200
    check(server, tokenizer, headers=api_headers("REGEN_TEST_KEY"))
    assert FakeCompletions.headers_seen[-1]["Authorization"] == "Bearer sk-test"
