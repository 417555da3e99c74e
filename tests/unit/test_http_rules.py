"""The HTTP rules of every request the project sends (blockdraft/vllm_runtime/http_rules.py), against real
http.server threads on 127.0.0.1: an API key never follows a redirect to another origin nor goes over plain
http to another machine, loopback skips the environment's proxy, a request ends by its total timeout however
slowly the server drips, answers are capped, Retry-After is honoured, and the key shows in no message."""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from blockdraft.errors import ConfigError
from blockdraft.regen.endpoints import api_headers, check_endpoint, listed_models
from blockdraft.regen.vllm_backend import RegenRequestError, RequestRefused, ServerUnreachable, post_json
from blockdraft.serve.client import RequestError, read_spec_metrics
from blockdraft.vllm_runtime import http_rules
from blockdraft.vllm_runtime.http_rules import (AnswerTooLarge, DeadlineExceeded, KeyInTheClear, fetch, is_loopback,
                                                retry_after_s)
from blockdraft.vllm_runtime.server import _healthy, server_environment

KEY = "sk-test-0123456789-secret"
MODELS = json.dumps({"data": [{"id": "tiny", "max_model_len": 512}]}).encode()


@contextmanager
def local_server(respond):
    """A threaded server on 127.0.0.1 whose every request goes to respond(handler); yields (url, seen), seen
    holding (method, path, headers) of each request it got."""
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def handle_one(self):
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            seen.append((self.command, self.path, dict(self.headers)))
            respond(self)

        do_GET = do_POST = handle_one

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    # A short poll: shutdown() waits up to one poll interval, 0.5 s by default, for every server of every test.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def send(handler, status=200, body=b"{}", headers=None):
    handler.send_response(status)
    for name, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


def no_key_in(seen) -> bool:
    return all(KEY not in json.dumps(headers) for _, _, headers in seen)


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv("BD_TEST_KEY", KEY)
    return api_headers("BD_TEST_KEY")


# --- the key and redirects -------------------------------------------------------------------
@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_to_another_port_never_carries_the_key(key, code):
    with local_server(lambda h: send(h, body=MODELS)) as (target, recorded):
        with local_server(lambda h: send(h, code, b"", {"Location": f"{target}{h.path}"})) as (first, _):
            with pytest.raises(Exception) as get:
                listed_models(first, key, 5)
            with pytest.raises(RequestRefused) as post:
                post_json(f"{first}/v1/completions", {"prompt": [1]}, 5, key)
    assert recorded == [] and no_key_in(recorded)
    assert getattr(get.value, "code", None) == code
    assert "not followed" in str(post.value) and target in str(post.value) and KEY not in str(post.value)
    assert not post.value.retryable


def test_check_endpoint_names_the_redirect_and_the_fix_without_the_key(key):
    with local_server(lambda h: send(h, body=MODELS)) as (target, recorded):
        with local_server(lambda h: send(h, 302, b"", {"Location": f"{target}/v1/models"})) as (first, _):
            with pytest.raises(ConfigError, match=r"HTTP 302 .*redirect to http://127\.0\.0\.1:\d+/v1/models, not "
                                                  r"followed.*give that URL") as err:
                check_endpoint(first, None, None, None, 64, key)
    assert recorded == [] and KEY not in str(err.value)


def test_a_redirect_within_the_origin_keeps_the_key_and_one_without_a_key_is_followed(key):
    def answer(h):
        if h.path == "/v1/models":
            send(h, 302, b"", {"Location": "/v1/models/"})
        else:
            send(h, body=MODELS)

    with local_server(answer) as (url, seen):
        assert listed_models(url, key, 5)[0]["id"] == "tiny"
    assert [path for _, path, _ in seen] == ["/v1/models", "/v1/models/"]
    assert seen[1][2].get("Authorization") == f"Bearer {KEY}"
    with local_server(lambda h: send(h, body=MODELS)) as (target, recorded):
        with local_server(lambda h: send(h, 302, b"", {"Location": f"{target}/v1/models"})) as (first, _):
            assert listed_models(first, {}, 5)[0]["id"] == "tiny"
    assert len(recorded) == 1


# --- the key over plain http -----------------------------------------------------------------
def test_a_key_for_plain_http_on_another_machine_is_refused_before_anything_is_sent(key):
    remote = "http://10.255.255.1:8000"  # never contacted: the refusal comes first
    began = time.monotonic()
    with pytest.raises(ConfigError, match=r"(?s)endpoint_api_key_env.*plain http://.*https://.*ssh -N -L 8000") as err:
        check_endpoint(remote, None, None, None, 64, key)
    with pytest.raises(RequestRefused, match="not sent"):
        post_json(f"{remote}/v1/completions", {}, 30, key)
    with pytest.raises(KeyInTheClear):
        fetch(f"{remote}/v1/models", headers=key, timeout_s=30)
    assert time.monotonic() - began < 2 and KEY not in str(err.value)
    http_rules.check_key_transport("https://10.255.255.1:8000", key)  # https: fine
    http_rules.check_key_transport("http://10.255.255.1:8000", {})  # no key: fine
    http_rules.check_key_transport("http://localhost:8000", key)  # loopback: fine


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.3.4.5", True), ("::1", True), ("[::1]", True),
                                            ("localhost", True), ("10.0.0.1", False), ("example.com", False),
                                            ("", False), (None, False)])
def test_loopback_hosts(host, loopback):
    assert is_loopback(host) is loopback


def test_the_key_shows_in_no_repr_and_no_error(key):
    assert KEY not in repr(key) and KEY not in str(key) and key["Authorization"] == f"Bearer {KEY}"
    with local_server(lambda h: send(h, 401, b'{"error": "bad key"}')) as (url, _):
        with pytest.raises(ConfigError, match="HTTP 401.*endpoint_api_key_env") as refused:
            check_endpoint(url, None, None, None, 64, key)
        with pytest.raises(RequestRefused) as failed:
            post_json(f"{url}/v1/completions", {}, 5, key)
    with pytest.raises(ConfigError) as unreachable:
        check_endpoint(url, None, None, None, 64, key)  # the server is gone now
    for err in (refused.value, failed.value, unreachable.value):
        assert KEY not in str(err) and KEY not in repr(err.args)


# --- proxies ---------------------------------------------------------------------------------
def closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_loopback_requests_skip_the_proxy_of_the_environment(monkeypatch):
    # urlopen's cached opener read the proxies when first built: a fresh one, as a process started with them has.
    monkeypatch.setattr(http_rules.urllib.request, "_opener", None)
    proxy = f"http://127.0.0.1:{closed_port()}"
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, proxy)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    metrics = b"vllm:spec_decode_num_drafts_total 3.0\n"
    with local_server(lambda h: send(h, body=metrics if h.path == "/metrics" else b'{"ok": 1}')) as (url, seen):
        assert _healthy(url)
        assert post_json(f"{url}/v1/completions", {}, 5) == {"ok": 1}
        assert read_spec_metrics(url, 5).num_drafts == 3.0
        localhost = url.replace("127.0.0.1", "localhost")
        assert fetch(f"{localhost}/health", timeout_s=5).status == 200
    assert len(seen) == 4
    # Elsewhere the environment's proxy stays in use (a cluster may only reach out through it).
    proxies = [h for h in http_rules.opener_for("http://10.0.0.1:80").handlers
               if isinstance(h, http_rules.urllib.request.ProxyHandler)]
    assert proxies and proxies[0].proxies.get("http") == proxy


# --- a total deadline ------------------------------------------------------------------------
def drip(where):
    def answer(h):
        try:
            if where == "headers":
                for byte in b"HTTP/1.1 200 OK\r\n":
                    h.wfile.write(bytes([byte]))
                    h.wfile.flush()
                    time.sleep(0.1)
            else:
                h.send_response(200)
                h.send_header("Content-Length", "100")
                h.end_headers()
                for _ in range(100):
                    h.wfile.write(b" ")
                    h.wfile.flush()
                    time.sleep(0.1)
        except OSError:
            pass  # the client hung up: what the deadline is for
    return answer


@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_server_that_drips_is_cut_at_the_total_timeout(where):
    with local_server(drip(where)) as (url, _):
        began = time.monotonic()
        with pytest.raises(DeadlineExceeded, match="within 1 s"):
            fetch(f"{url}/v1/models", timeout_s=1)
        assert time.monotonic() - began < 1.8  # each byte comes within urllib's per-read timeout of 1 s
        with pytest.raises(ServerUnreachable, match="request_timeout_s=0.5"):
            post_json(f"{url}/v1/completions", {}, 0.5)
        with pytest.raises(RequestError, match="no answer"):
            read_spec_metrics(url, 0.5)


# --- a size cap ------------------------------------------------------------------------------
def test_an_answer_over_the_cap_is_refused_declared_or_not(monkeypatch):
    def big(h):
        h.send_response(200)
        if h.path == "/declared":
            h.send_header("Content-Length", str(3000))
        h.send_header("Connection", "close")
        h.end_headers()
        try:
            h.wfile.write(b"x" * 3000)
        except OSError:
            pass

    with local_server(big) as (url, _):
        for path in ("/declared", "/undeclared"):
            with pytest.raises(AnswerTooLarge, match="2048-byte cap"):
                fetch(f"{url}{path}", timeout_s=5, max_bytes=2048)
        assert len(fetch(f"{url}/undeclared", timeout_s=5, max_bytes=4096).body) == 3000
        monkeypatch.setattr(http_rules, "MAX_BODY_BYTES", 2048)  # what every caller gets by default
        with pytest.raises(RequestRefused, match="2048-byte cap") as err:
            post_json(f"{url}/declared", {}, 5)
        assert not err.value.retryable
        with pytest.raises(RequestError, match="2048-byte cap"):
            read_spec_metrics(url.replace("127.0.0.1", "localhost") + "/undeclared", 5)


# --- Retry-After -----------------------------------------------------------------------------
def busy_then_ok(status, after, times=1):
    calls = []

    def answer(h):
        calls.append(time.monotonic())
        if len(calls) <= times:
            send(h, status, b'{"error": "busy"}', {"Retry-After": after})
        else:
            send(h, body=b'{"ok": 1}')
    return answer, calls


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_waited_for_then_the_request_is_sent_again(status):
    answer, calls = busy_then_ok(status, "1")
    with local_server(answer) as (url, _):
        assert post_json(f"{url}/v1/completions", {}, 10) == {"ok": 1}
    assert len(calls) == 2 and calls[1] - calls[0] >= 0.95


def test_a_retry_after_too_long_or_past_the_deadline_goes_to_the_caller():
    answer, calls = busy_then_ok(503, "3600")
    with local_server(answer) as (url, _):
        began = time.monotonic()
        with pytest.raises(RequestRefused, match="HTTP 503") as err:
            post_json(f"{url}/v1/completions", {}, 10)
        assert err.value.retryable and time.monotonic() - began < 2 and len(calls) == 1
    answer, calls = busy_then_ok(429, "5")
    with local_server(answer) as (url, _):
        with pytest.raises(RequestRefused, match="HTTP 429"):
            post_json(f"{url}/v1/completions", {}, 2)  # 5 s is past the 2 s deadline
    answer, calls = busy_then_ok(503, "0", times=100)
    with local_server(answer) as (url, _):
        with pytest.raises(RequestRefused):
            post_json(f"{url}/v1/completions", {}, 10)
    assert len(calls) == 1 + http_rules.RETRY_AFTER_TRIES


def test_retry_after_reads_seconds_and_dates():
    from email.utils import formatdate

    assert retry_after_s({"Retry-After": "7"}) == 7.0
    assert 25 <= retry_after_s({"Retry-After": formatdate(time.time() + 30, usegmt=True)}) <= 30
    assert retry_after_s({"Retry-After": formatdate(time.time() - 30, usegmt=True)}) == 0.0
    assert retry_after_s({"Retry-After": "soon"}) is None and retry_after_s({}) is None


# --- non-JSON answers ------------------------------------------------------------------------
def test_a_non_json_answer_is_the_projects_error_with_url_status_and_first_bytes():
    from blockdraft.serve.client import _post_json

    page = b"<html><body>Gateway login</body></html>"
    with local_server(lambda h: send(h, body=page)) as (url, _):
        with pytest.raises(RequestError, match=r"prompt 3: http://127\.0\.0\.1:\d+/v1/completions answered HTTP 200 "
                                               r"with something that is not JSON: b'<html><body>Gateway") as err:
            _post_json(f"{url}/v1/completions", {}, 5, "prompt 3")
        assert err.value.__cause__ is None and err.value.__suppress_context__
        with pytest.raises(RegenRequestError, match=r"\(HTTP 200\) is not JSON.*Gateway"):
            post_json(f"{url}/v1/completions", {}, 5)


# --- the project's own servers ---------------------------------------------------------------
def test_the_servers_started_here_do_not_inherit_vllm_api_key(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    monkeypatch.setenv("BD_OTHER", "kept")
    env = server_environment({"VLLM_CPU_KVCACHE_SPACE": "1"})
    assert "VLLM_API_KEY" not in env and env["BD_OTHER"] == "kept" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert server_environment({"VLLM_API_KEY": "chosen"})["VLLM_API_KEY"] == "chosen"  # set on purpose: kept


def test_the_probe_cache_keeps_no_api_key(monkeypatch):
    from blockdraft.vllm_runtime import probe

    monkeypatch.setattr(probe, "_ANSWERS", {})
    monkeypatch.setattr(probe, "_ask", lambda python, archs, timeout_s: {a: "info" for a in archs})
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    probe.probe_architectures("/no/python", ["Qwen3ForCausalLM"])
    assert KEY not in repr(list(probe._ANSWERS))
