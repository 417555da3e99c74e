"""The vLLM backend's request/answer handling, against a stand-in completions server."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from blockdraft.regen.turns import prompt_ids
from blockdraft.regen.vllm_backend import RegenRequestError, completion_body, parse_reply, request_seed, vllm_reply
from blockdraft.data.tiny_tokenizer import build_tiny_tokenizer
from blockdraft.vllm_runtime.server import server_settings


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


class FakeCompletions(BaseHTTPRequestHandler):
    bodies = []
    status = 200

    def do_POST(self):  # noqa: N802 - the stdlib's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeCompletions.bodies.append((self.path, body))
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
    FakeCompletions.bodies, FakeCompletions.status = [], 200
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeCompletions)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
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
