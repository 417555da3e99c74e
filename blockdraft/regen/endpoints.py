"""What an OpenAI-compatible server must show before it answers a single prompt: that it answers, which model
name to send it, that the target's rows fit its context, and, where it offers /tokenize, that it reads token
ids as the target's tokenizer writes them (regen sends ids: another model's tokenizer would turn them into
another text). The servers regen starts pass the same checks as those a cluster already runs."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
from dataclasses import dataclass
from typing import Dict, List, Optional
from urllib.parse import urlparse

from blockdraft.errors import ConfigError
from blockdraft.regen.turns import prompt_ids
from blockdraft.regen.vllm_backend import RegenRequestError, RequestRefused, post_json, redirect_note
from blockdraft.vllm_runtime.http_rules import HiddenKeyHeaders, KeyInTheClear, check_key_transport, fetch

CHECK_TIMEOUT_S = 30.0
# Digits, accents, CJK, markup and an emoji: two tokenizers that agree on these agree on the vocabulary.
PROBE = [{"role": "user", "content": "Check: 12,345 apples, naïve café, 東京, <b>tags</b> & emoji 🙂"}]


@dataclass
class EndpointCheck:
    url: str
    model: str  # the name sent in every request
    max_model_len: Optional[int]  # as /v1/models lists it; None where it does not
    tokenizer_checked: bool  # False where the server offers no /tokenize


def base_url(url: str) -> str:
    """`http://host:8000/v1/` -> `http://host:8000`: the OpenAI clients' base URL ends in /v1, regen adds its paths."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def check_endpoint_urls(endpoints: List[str]) -> None:
    for i, url in enumerate(endpoints):
        parsed = urlparse(str(url))
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError(f"endpoints[{i}]={url!r} is not an http(s) URL; write it as http://host:port")


def api_headers(env_name: Optional[str]) -> Dict[str, str]:
    """The Bearer token from the environment variable named; the key itself is never written anywhere (the
    headers' repr hides it), and vllm_runtime/http_rules.py keeps it off plain http and off other hosts."""
    if not env_name:
        return {}
    key = os.environ.get(env_name)
    if not key:
        raise ConfigError(f"endpoint_api_key_env={env_name}: that environment variable is empty or unset; export it, "
                          "or set endpoint_api_key_env=null for endpoints without a key")
    return HiddenKeyHeaders({"Authorization": f"Bearer {key}"})


def listed_models(url: str, headers: Dict[str, str], timeout_s: float) -> List[dict]:
    return list(json.loads(fetch(f"{url}/v1/models", headers=headers, timeout_s=timeout_s).body)["data"])


def still_answers(url: str, headers: Dict[str, str], timeout_s: float = 10.0) -> bool:
    """Whether the server still lists its models: what tells a dead or unreachable server from a failed request."""
    try:
        listed_models(url, headers, timeout_s)
        return True
    except Exception:  # noqa: BLE001 - any failure to answer means the same here
        return False


def check_endpoint(url: str, wanted_model: Optional[str], tokenizer, chat_template_kwargs: Optional[dict],
                   needed_len: int, headers: Dict[str, str]) -> EndpointCheck:
    """The checks above, each failure one line naming the endpoint and the fix."""
    try:
        check_key_transport(url, headers)  # before the first request: a key in the clear is never sent
    except KeyInTheClear as err:
        raise ConfigError(f"endpoint_api_key_env is set, and endpoint {err}") from None
    try:
        models = listed_models(url, headers, CHECK_TIMEOUT_S)
    except urllib.error.HTTPError as err:
        hint = "; set endpoint_api_key_env= to the variable holding its key" if err.code in (401, 403) else ""
        raise ConfigError(f"endpoint {url} answered HTTP {err.code} to /v1/models{redirect_note(err)}{hint}") from None
    except Exception as err:  # noqa: BLE001 - refused, unresolvable, not JSON: the endpoint is unusable as given
        raise ConfigError(f"endpoint {url} does not answer /v1/models ({err}); start it, or fix the URL "
                          "(http://host:port of an OpenAI-compatible server)") from None
    model = _pick_model(url, [m.get("id") for m in models], wanted_model)
    max_len = next((m.get("max_model_len") for m in models if m.get("id") == model), None)
    if max_len is not None and max_len < needed_len:
        raise ConfigError(f"endpoint {url} serves {model} with a context of {max_len} tokens, under max_prompt_tokens + "
                          f"max_tokens = {needed_len}; lower those, or restart it with --max-model-len {needed_len}")
    checked = _check_tokenizer(url, model, tokenizer, chat_template_kwargs, headers)
    return EndpointCheck(url, model, max_len, checked)


def _pick_model(url: str, served: List[str], wanted: Optional[str]) -> str:
    if wanted is not None:
        if wanted not in served:
            raise ConfigError(f"endpoint {url} does not serve endpoint_model={wanted!r} (it serves {served}); "
                              "set endpoint_model to the name it serves the target under")
        return wanted
    if len(served) != 1:
        raise ConfigError(f"endpoint {url} serves {len(served)} models {served}; set endpoint_model= to the target's name there")
    return served[0]


def _check_tokenizer(url: str, model: str, tokenizer, chat_template_kwargs: Optional[dict], headers: Dict[str, str]) -> bool:
    text = tokenizer.apply_chat_template(PROBE, tokenize=False, add_generation_prompt=True, **(chat_template_kwargs or {}))
    body = {"model": model, "prompt": text, "add_special_tokens": False}
    try:
        theirs = post_json(f"{url}/tokenize", body, CHECK_TIMEOUT_S, headers).get("tokens")
    except RequestRefused as err:
        if err.status in (404, 405, 501):
            print(f"[regen] note: endpoint {url} offers no /tokenize: that it tokenizes as {model!r} does is not checked",
                  file=sys.stderr)
            return False
        raise ConfigError(f"endpoint {url} refused /tokenize: {err}") from None
    except RegenRequestError as err:
        raise ConfigError(f"endpoint {url} did not answer /tokenize: {err}") from None
    ours = prompt_ids(tokenizer, PROBE, chat_template_kwargs)
    if theirs != ours:
        raise ConfigError(f"endpoint {url} tokenizes text unlike target_dir's tokenizer (a probe gave {len(theirs or [])} "
                          f"tokens there, {len(ours)} here): it serves another model than the target; point endpoints at "
                          "servers of the target, or target_dir at the model they serve")
    return True
