"""The vLLM backend of regeneration: the target served by the serving environment's vLLM,
answering many conversations at once (the server batches concurrent requests).

Prompts are rendered with the target's chat template here, in the training environment,
and sent as token ids to the completions API: the server sees exactly the ids training
will see, and a context that would not fit is caught before it is sent. Rows, shards and
resume are those of `blockdraft.regen.shards`, shared with the transformers backend.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import zlib
from typing import Dict, List, Optional

from blockdraft.regen.turns import Reply, prompt_ids
from blockdraft.vllm_runtime.http_rules import AnswerTooLarge, KeyInTheClear, fetch


class RegenRequestError(RuntimeError):
    """A generation request failed; rows written so far stay, and a rerun resumes after them."""

    retryable = True  # a garbled answer may come out right the next time
    unreachable = False  # no answer at all: is the server still there?


class RequestRefused(RegenRequestError):
    """The server answered with an HTTP error: worth a retry when it was busy or broken (429, 5xx), not when it
    refused the request itself (4xx)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status
        self.retryable = status in (408, 429) or status >= 500


class ServerUnreachable(RegenRequestError):
    """No answer: the connection was refused or dropped, or the request timed out."""

    unreachable = True


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
               chat_template_kwargs: Optional[dict] = None, seed: int = 0, timeout_s: float = 600.0,
               headers: Optional[Dict[str, str]] = None):
    """`reply(messages) -> Reply | None` over HTTP; None when the context exceeds max_prompt_tokens."""

    def reply(messages: List[dict]) -> Optional[Reply]:
        ids = prompt_ids(tokenizer, messages, chat_template_kwargs)
        if len(ids) > max_prompt_tokens:
            return None
        body = completion_body(model, ids, max_tokens, temperature, seed)
        return parse_reply(post_json(f"{url}/v1/completions", body, timeout_s, headers))

    return reply


def post_json(url: str, body: dict, timeout_s: float, headers: Optional[Dict[str, str]] = None) -> dict:
    """One JSON request under the project's HTTP rules (vllm_runtime/http_rules.py): `timeout_s` in all, the
    answer capped, Retry-After honoured, loopback without proxy, a key kept to its origin and off plain http."""
    sent = {"Content-Type": "application/json", **(headers or {})}
    try:
        answer = fetch(url, data=json.dumps(body).encode(), headers=sent, timeout_s=timeout_s)
    except KeyInTheClear as err:  # status 0: refused here, before any HTTP status; never worth a retry
        raise RequestRefused(f"{err}; the request was not sent", 0) from None
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")[:500]
        where = redirect_note(err)
        raise RequestRefused(f"the server answered HTTP {err.code}{where}: {detail}; rerun to resume", err.code) from None
    except AnswerTooLarge as err:
        raise RequestRefused(f"{err}; the server is broken or not an OpenAI-compatible one", 0) from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError, http.client.HTTPException) as err:
        raise ServerUnreachable(
            f"no answer from {url} ({err}); if it timed out raise request_timeout_s={timeout_s:g}, then rerun to resume"
        ) from None
    try:
        return json.loads(answer.body)
    except ValueError as err:  # not JSON
        raise RegenRequestError(f"the answer of {url} (HTTP {answer.status}) is not JSON ({err}): "
                                f"{answer.body[:200]!r}") from None


def redirect_note(err: urllib.error.HTTPError) -> str:
    """Where a redirect that was not followed pointed: a key goes to no other origin than it was sent to."""
    location = err.headers.get("Location") if 300 <= err.code < 400 and err.headers is not None else None
    if not location:
        return ""
    return (f" (a redirect to {location}, not followed: the API key goes to no other host; "
            "give that URL itself if it is the same server)")
