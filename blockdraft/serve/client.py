"""Talking to a running vLLM server: greedy completions of token-id prompts, and spec metrics.

Requests go to the completions API with the prompt as token ids (the chat template was
applied client-side), `return_token_ids` for the generated ids, and `logprobs=2` with
`return_tokens_as_token_ids`, so a mismatch can be judged a near-tie or not.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from blockdraft.serve.prompts import EncodedPrompt
from blockdraft.vllm_runtime.http_rules import Answer, AnswerTooLarge, fetch

TOP_LOGPROBS = 2  # the chosen token and its runner-up: enough to tell a near-tie
SPEC_PREFIX = "vllm:spec_decode_"


class RequestError(RuntimeError):
    """A request to the server failed; the message names the prompt and the server's answer."""


@dataclass
class Completion:
    prompt_index: int
    token_ids: List[int]
    seconds: float
    finish_reason: Optional[str] = None
    # Per generated position: {token id: logprob} of the top candidates; empty when not returned.
    top_logprobs: List[Dict[int, float]] = field(default_factory=list)


@dataclass
class SpecMetrics:
    """vLLM's speculative-decoding counters (or the reference engine's, in the same terms)."""

    num_drafts: float = 0.0
    num_draft_tokens: float = 0.0
    num_accepted_tokens: float = 0.0
    accepted_per_position: List[float] = field(default_factory=list)

    def minus(self, before: "SpecMetrics") -> "SpecMetrics":
        """Counts between two readings (a warm-up request must not count)."""
        return self._combine(before, lambda a, b: a - b)

    def plus(self, other: "SpecMetrics") -> "SpecMetrics":
        """Counts of two runs together (the draft runs of several rounds)."""
        return self._combine(other, lambda a, b: a + b)

    def _combine(self, other: "SpecMetrics", op) -> "SpecMetrics":
        width = max(len(self.accepted_per_position), len(other.accepted_per_position))
        mine, theirs = _padded(self.accepted_per_position, width), _padded(other.accepted_per_position, width)
        return SpecMetrics(
            op(self.num_drafts, other.num_drafts),
            op(self.num_draft_tokens, other.num_draft_tokens),
            op(self.num_accepted_tokens, other.num_accepted_tokens),
            [op(a, b) for a, b in zip(mine, theirs)],
        )


def _padded(values: List[float], width: int) -> List[float]:
    return list(values) + [0.0] * (width - len(values))


# --- completions ----------------------------------------------------------------------
@dataclass(frozen=True)
class Sampling:
    """How a completion is drawn: greedy (temperature 0) unless set; top_k 0 = no truncation."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def request_fields(self) -> dict:
        if self.temperature <= 0:
            return {"temperature": 0.0}
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k or -1}


GREEDY = Sampling()


def complete(
    url: str, model: str, prompt: EncodedPrompt, max_tokens: int, timeout_s: float, ignore_eos: bool = False,
    sampling: Sampling = GREEDY, seed: int = 0,
) -> Completion:
    """One completion of a token-id prompt (greedy unless `sampling` says otherwise), timed from
    request to full answer. A sampled request carries its own seed, so reruns draw the same."""
    body = {
        "model": model,
        "prompt": prompt.token_ids,
        "max_tokens": max_tokens,
        **sampling.request_fields(),
        "seed": seed,
        "ignore_eos": ignore_eos,
        "return_token_ids": True,
        "logprobs": TOP_LOGPROBS,
        "return_tokens_as_token_ids": True,
    }
    began = time.perf_counter()
    answer = _post_json(f"{url}/v1/completions", body, timeout_s, f"prompt {prompt.index} ({prompt.source})")
    seconds = time.perf_counter() - began
    return parse_completion(answer, prompt.index, seconds)


def complete_all(
    url: str, model: str, prompts: Sequence[EncodedPrompt], max_tokens: int, timeout_s: float, ignore_eos: bool = False
) -> List[Completion]:
    """Prompts one at a time (batch size 1: the latency speculative decoding is meant to cut)."""
    return [complete(url, model, p, max_tokens, timeout_s, ignore_eos) for p in prompts]


def complete_concurrently(
    url: str, model: str, prompts: Sequence[EncodedPrompt], max_tokens: int, timeout_s: float, concurrency: int,
    ignore_eos: bool = False, sampling: Sampling = GREEDY, seed: int = 0,
) -> List[Completion]:
    """Every prompt with `concurrency` requests in flight at a time (the server batches them), in
    prompt order. Prompt i is drawn with seed + i whatever the concurrency."""
    from concurrent.futures import ThreadPoolExecutor

    def one(p: EncodedPrompt) -> Completion:
        return complete(url, model, p, max_tokens, timeout_s, ignore_eos, sampling, seed + p.index)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, prompts))


def parse_completion(answer: dict, prompt_index: int, seconds: float) -> Completion:
    try:
        choice = answer["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise RequestError(f"prompt {prompt_index}: the server's answer has no choices: {str(answer)[:500]}") from None
    ids = choice.get("token_ids")
    if ids is None:
        raise RequestError(
            f"prompt {prompt_index}: the server's answer has no `token_ids`; this vLLM ignores "
            "`return_token_ids` (added in 0.10.2): serve with a newer vLLM."
        )
    logprobs = choice.get("logprobs") or {}
    top = [_token_id_keys(d) for d in (logprobs.get("top_logprobs") or []) if d is not None]
    return Completion(prompt_index, [int(t) for t in ids], seconds, choice.get("finish_reason"), top)


def _token_id_keys(top: Dict[str, float]) -> Dict[int, float]:
    # With return_tokens_as_token_ids the keys read "token_id:123".
    out = {}
    for key, value in top.items():
        if key.startswith("token_id:"):
            out[int(key.split(":", 1)[1])] = float(value)
    return out


def _post_json(url: str, body: dict, timeout_s: float, what: str) -> dict:
    answer = _fetch(url, what, timeout_s, json.dumps(body).encode())
    try:
        return json.loads(answer.body)
    except ValueError:  # an HTML page of a proxy, a truncated answer: not the vLLM server we think it is
        raise RequestError(f"{what}: {url} answered HTTP {answer.status} with something that is not JSON: "
                           f"{answer.body[:200]!r}; check that the URL is the vLLM server's") from None


def _fetch(url: str, what: str, timeout_s: float, data: Optional[bytes] = None) -> Answer:
    """One request under the project's HTTP rules (vllm_runtime/http_rules.py): `timeout_s` in all, the answer
    capped, Retry-After honoured, loopback without proxy."""
    headers = {"Content-Type": "application/json"} if data is not None else {}
    try:
        return fetch(url, data=data, headers=headers, timeout_s=timeout_s)
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")[:1000]
        raise RequestError(f"{what}: {url} answered HTTP {err.code}: {detail}") from None
    except AnswerTooLarge as err:
        raise RequestError(f"{what}: {err}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError, http.client.HTTPException) as err:
        raise RequestError(
            f"{what}: no answer from {url} ({err}); if it timed out, raise request_timeout_s={timeout_s:g}."
        ) from None


# --- metrics --------------------------------------------------------------------------
def read_spec_metrics(url: str, timeout_s: float = 30.0) -> SpecMetrics:
    """The spec-decode counters from the server's Prometheus /metrics (zeros before any draft)."""
    answer = _fetch(f"{url}/metrics", f"reading {url}/metrics", timeout_s)
    return parse_spec_metrics(answer.body.decode(errors="replace"))


def parse_spec_metrics(text: str) -> SpecMetrics:
    """Sum the `vllm:spec_decode_*_total` counters over engines; per position by `position` label."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0}
    per_pos: Dict[int, float] = {}
    try:
        samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    except ValueError as err:
        raise RequestError(f"the server's /metrics is not Prometheus text ({err})") from None
    for sample in samples:
        if not sample.name.startswith(SPEC_PREFIX) or not sample.name.endswith("_total"):
            continue
        name = sample.name[len(SPEC_PREFIX) : -len("_total")]
        if name == "num_accepted_tokens_per_pos":
            position = int(sample.labels["position"])
            per_pos[position] = per_pos.get(position, 0.0) + sample.value
        elif name in totals:
            totals[name] += sample.value
    positions = [per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)] if per_pos else []
    return SpecMetrics(totals["num_drafts"], totals["num_draft_tokens"], totals["num_accepted_tokens"], positions)
