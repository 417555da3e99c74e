"""The vLLM backend of regeneration: the target served by the serving environment's vLLM,
answering many conversations at once (the server batches concurrent requests).

Prompts are rendered with the target's chat template here, in the training environment,
and sent as token ids to the completions API: the server sees exactly the ids training
will see, and a context that would not fit is caught before it is sent. Rows, shards and
resume are those of `blockdraft.regen.shards`, shared with the transformers backend.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Optional

from blockdraft.regen.turns import Reply, prompt_ids
from blockdraft.vllm_runtime.server import VllmServer, server_settings


class RegenRequestError(RuntimeError):
    """A generation request failed; rows written so far stay, and a rerun resumes after them."""


@contextmanager
def target_server(python, target_dir: str, log_path, device: str, max_model_len: int, max_num_seqs: int,
                  kv_cache_gib: int, startup_timeout_s: float, cpu_threads_bind: str = "auto") -> Iterator[str]:
    """The target served on loopback for the duration of the block; yields its URL."""
    args, env = server_settings(device, max_model_len, max_num_seqs, kv_cache_gib, cpu_threads_bind)
    server = VllmServer(python, target_dir, log_path=log_path, args=args, env=env, startup_timeout_s=startup_timeout_s)
    print(f"[regen] starting vLLM for {target_dir} (log: {log_path}) ...", flush=True)
    with server:
        print(f"[regen] vLLM ready after {server.startup_s:.0f} s at {server.url}", flush=True)
        yield server.url


def request_seed(seed: int, ids: List[int]) -> int:
    """A per-conversation seed, the same on every rerun and in any order of completion."""
    return (seed + zlib.crc32(json.dumps(ids).encode())) % (2**31)


def completion_body(model: str, ids: List[int], max_tokens: int, temperature: float, seed: int) -> dict:
    return {
        "model": model,
        "prompt": ids,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": request_seed(seed, ids),
        "skip_special_tokens": True,
    }


def parse_reply(answer: dict) -> Reply:
    try:
        choice = answer["choices"][0]
        tokens = int(answer["usage"]["completion_tokens"])
    except (KeyError, IndexError, TypeError, ValueError):
        raise RegenRequestError(f"the server's answer has no choice or usage: {str(answer)[:300]}") from None
    reason = "length" if choice.get("finish_reason") == "length" else "stop"
    return Reply(choice.get("text") or "", tokens, reason)


def vllm_reply(url: str, model: str, tokenizer, max_tokens: int, max_prompt_tokens: int, temperature: float = 0.0,
               chat_template_kwargs: Optional[dict] = None, seed: int = 0, timeout_s: float = 600.0):
    """`reply(messages) -> Reply | None` over HTTP; None when the context exceeds max_prompt_tokens."""

    def reply(messages: List[dict]) -> Optional[Reply]:
        ids = prompt_ids(tokenizer, messages, chat_template_kwargs)
        if len(ids) > max_prompt_tokens:
            return None
        body = completion_body(model, ids, max_tokens, temperature, seed)
        return parse_reply(_post(f"{url}/v1/completions", body, timeout_s))

    return reply


def _post(url: str, body: dict, timeout_s: float) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")[:500]
        raise RegenRequestError(f"the server answered HTTP {err.code}: {detail}; rerun to resume") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as err:
        raise RegenRequestError(
            f"no answer from {url} ({err}); if it timed out raise request_timeout_s={timeout_s:g}, then rerun to resume"
        ) from None


def default_log_path(out_dir) -> Path:
    return Path(out_dir) / "vllm_regen.log"
