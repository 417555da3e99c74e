"""Feature-store rows captured by vLLM servers (`capture.backend=vllm`): the client side.

Each document of a row goes to a server as one completions request: the prompt as token ids,
max_tokens=1, and a `capture_name` in its kv_transfer_params. The server runs vLLM's
`extract_hidden_states` method with our connector (vllm_connector.py), which writes the states of
every prompt token, [n, len(aux layers), H], to `<scratch_dir>/<capture_name>.safetensors` (atomically:
the file appears whole or not at all). This module waits for that file, reads it and deletes it, and
builds the row RowForward._row builds (blockdraft/capture/forward.py): the same keys, dtypes and shapes.

Packed rows (several documents) are sent one request per document and put back together: online
capture runs them document by document too (models/features.py), so no document sees another.

Layers. `target_layer_ids = [i, ...]` (the output of 0-indexed decoder layer i, HF hidden_states[i + 1])
is vLLM's aux layer i + 1: `_maybe_add_hidden_state(aux, idx + 1, hidden_states, residual)` after decoder
layer idx keeps `hidden_states + residual`, the layer's output (model_executor/models/llama.py and
qwen2.py forward; interfaces.py EagleModelMixin). The last layer is reachable: aux L is that sum before
the final norm, which is what our forward hook on layer L-1 keeps too (HF hidden_states[L] is after the
norm). vLLM sorts and de-duplicates the aux ids (`_set_aux_hidden_state_layers`) while sizing its cache by
their count, so the servers get the sorted unique ids and the rows are put back in target_layer_ids order.

Soft labels (teacher_top_k > 0). vLLM's prompt_logprobs[t] (t >= 1) scores prompt token t from position t-1
(v1/worker/gpu_model_runner.py _get_prompt_logprobs_dict: "For prompt at index i, the token at prompt
index i+1 is the target"; logprobs.py create_prompt_logprobs puts None at 0). The store's position t holds
the top-k for token t+1, so it is prompt_logprobs[t + 1]; its dict holds the top k plus the prompt token
itself (any rank), so the k best by value are kept. The servers the capture starts run
`--logprobs-mode raw_logits`, under which these values are the target's raw logits, the store's own
numbers. A server in the default `raw_logprobs` mode gives logits minus a per-position constant
(log-sum-exp over the vocabulary); the trainer reads stored logits only through
log_softmax(logits / T) over each position's k candidates (losses/block.py teacher_log_probs), which
such a constant leaves unchanged, so those serve the same training. The last position of a document
scores no prompt token: where a packed row supervises the token after it, its top-k comes from the one
generated token's logprobs (`logprobs=k`, ids returned as `token_id:<id>`).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

from blockdraft.errors import DataError

NAME_KEY = "capture_name"  # as vllm_connector.NAME_KEY (that module imports vLLM, so it is not imported here)
PATH_KEY = "hidden_states_path"
FILE_POLL_S = 0.02


class CaptureRequestError(RuntimeError):
    """One request failed; `retryable` says whether sending it again may help."""

    def __init__(self, message: str, retryable: bool = True, unreachable: bool = False):
        super().__init__(message)
        self.retryable = retryable
        self.unreachable = unreachable  # no answer at all: is the server still there?


# --- conversions (pure) -------------------------------------------------------------------------
def aux_layer_ids(layer_ids: Sequence[int]) -> List[int]:
    """The aux ids the servers capture: target layer i is vLLM aux layer i + 1, sorted and unique as vLLM keeps them."""
    return sorted({int(i) + 1 for i in layer_ids})


def layer_order(layer_ids: Sequence[int]) -> List[int]:
    """For each of target_layer_ids, its slot in the file's (sorted, unique) layers."""
    aux = aux_layer_ids(layer_ids)
    return [aux.index(int(i) + 1) for i in layer_ids]


def features_from_states(states: torch.Tensor, layer_ids: Sequence[int]) -> torch.Tensor:
    """[n, len(aux), H] as the connector wrote it -> float32 [n, len(layer_ids) * H], in target_layer_ids order."""
    picked = states[:, layer_order(layer_ids)]
    return picked.float().reshape(states.shape[0], -1)


def topk_from_logprobs(entries: Optional[dict], k: int) -> tuple:
    """One position's {token id (str or int, or 'token_id:<id>'): value or {"logprob": value}} -> (ids, values) of the
    k best by value, best first (the prompt token vLLM adds beside the top k drops out unless it is among them)."""
    pairs = []
    for key, value in (entries or {}).items():
        token = int(str(key).rpartition(":")[2])
        pairs.append((float(value["logprob"] if isinstance(value, dict) else value), token))
    pairs.sort(key=lambda p: (-p[0], p[1]))
    best = pairs[:k]
    return [t for _, t in best], [v for v, _ in best]


def teacher_rows(documents: List[dict], loss_mask: torch.Tensor, k: int) -> tuple:
    """(teacher_ids int32 [n, k], teacher_logits float32 [n, k]) of a row, as teacher_topk_rows lays them out:
    position t holds the top-k for token t+1 where loss_mask[t+1] is set, zeros elsewhere.

    documents: per document in row order, {"length": n_d, "prompt_logprobs": [None, {...}, ...] (n_d entries),
    "last": {...} or None (the generated token's top logprobs: the distribution after the document's last token)}."""
    n = int(loss_mask.shape[0])
    ids = torch.zeros(n, k, dtype=torch.int32)
    logits = torch.zeros(n, k, dtype=torch.float32)
    wanted = torch.zeros(n, dtype=torch.bool)
    wanted[:-1] = loss_mask[1:].bool()
    start = 0
    for doc in documents:
        length = int(doc["length"])
        prompt = doc.get("prompt_logprobs")
        for t in range(length):
            if not wanted[start + t]:
                continue
            if t + 1 < length:
                if prompt is None or len(prompt) != length:
                    raise CaptureRequestError(f"the answer has {0 if prompt is None else len(prompt)} prompt_logprobs for "
                                              f"{length} prompt tokens", retryable=False)
                entries = prompt[t + 1]
            else:
                entries = doc.get("last")
            top_ids, top_values = topk_from_logprobs(entries, k)
            if not top_ids:
                raise CaptureRequestError(f"the answer has no logprobs for position {t} of a {length}-token document",
                                          retryable=False)
            ids[start + t, :len(top_ids)] = torch.tensor(top_ids, dtype=torch.int32)
            logits[start + t, :len(top_ids)] = torch.tensor(top_values, dtype=torch.float32)
        start += length
    return ids, logits


def position_ids(document_lengths: torch.Tensor) -> torch.Tensor:
    """Positions restarting at 0 for each document, as collate writes them."""
    return torch.cat([torch.arange(int(k)) for k in document_lengths]) if len(document_lengths) else torch.zeros(0, dtype=torch.long)


def request_body(model: Optional[str], ids: List[int], name: str, teacher_top_k: int, want_last: bool) -> dict:
    """The completions request of one document: its ids, one generated token, the capture file's name, and the
    top-k logprobs the store keeps (those of the prompt; of the generated token where the row needs the last one)."""
    body = {"prompt": [int(t) for t in ids], "max_tokens": 1, "temperature": 0.0, "stream": False,
            "kv_transfer_params": {NAME_KEY: name}}
    if model is not None:
        body["model"] = model
    if teacher_top_k:
        body["prompt_logprobs"] = int(teacher_top_k)
        if want_last:
            body["logprobs"] = int(teacher_top_k)
            body["return_tokens_as_token_ids"] = True
    return body


def last_top_logprobs(answer: dict) -> Optional[dict]:
    """The generated token's top logprobs (keys 'token_id:<id>') of a completions answer, or None."""
    try:
        tops = answer["choices"][0]["logprobs"]["top_logprobs"]
        return tops[0] if tops else None
    except (KeyError, IndexError, TypeError):
        return None


# --- the client ---------------------------------------------------------------------------------
@dataclass
class _Server:
    url: str
    model: Optional[str]
    free: int  # request slots left (workers in flight at most)
    gone: bool = False  # a request got no answer and it no longer lists its models: no more requests


class VllmRows:
    """`VllmRows(urls, scratch_dir, layer_ids, teacher_top_k, workers, timeout_s).rows(items, wheres)` -> store rows.

    urls: the capture servers (http://host:port, with or without /v1), whose connector writes into scratch_dir.
    Requests go out `workers` at a time per server, each to the server with the most free slots; a server that
    left a request unanswered and no longer lists its models gets no more while another answers; a request that fails (dropped connection, timeout, 5xx, 429, or no file within timeout_s) is sent again, to any
    server, up to `retries` times with a doubling backoff; a refusal (4xx) stops the capture at once."""

    def __init__(self, urls: Sequence[str], scratch_dir: str | os.PathLike, layer_ids: Sequence[int], teacher_top_k: int = 0,
                 workers: int = 16, timeout_s: float = 600.0, retries: int = 3, retry_backoff_s: float = 1.0,
                 model: Optional[str] = None, headers: Optional[Dict[str, str]] = None,
                 storage_dtype: Optional[str] = None):
        from blockdraft.regen.endpoints import base_url

        if not urls:
            raise ValueError("VllmRows needs at least one server URL")
        self.scratch_dir = Path(scratch_dir)
        self.layer_ids = [int(i) for i in layer_ids]
        self.teacher_top_k = int(teacher_top_k or 0)
        self.workers = int(workers)
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        self.retry_backoff_s = float(retry_backoff_s)
        self.headers = dict(headers or {})
        self.storage_dtype = storage_dtype
        self.servers = [_Server(base_url(u), model, self.workers) for u in urls]
        self._slots = threading.Condition()
        self._run = uuid.uuid4().hex[:12]  # file names unique to this client, whoever else shares the directory
        self._count = itertools.count()
        self._pool = ThreadPoolExecutor(max_workers=len(self.servers) * self.workers, thread_name_prefix="vllm-rows")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> "VllmRows":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- rows -----------------------------------------------------------------------------------
    def rows(self, items: List[dict], wheres: List[str]) -> List[dict]:
        """Every item's row (keys of RowForward._row), in order. All documents of all items are in flight together,
        `workers` per server; the first document that fails for good stops the call with a DataError naming its row."""
        jobs = []  # (item index, document index, ids, want_last)
        for r, item in enumerate(items):
            ids = torch.as_tensor(item["input_ids"]).long()
            mask = torch.as_tensor(item["loss_mask"]).bool()
            lengths = torch.as_tensor(item["document_lengths"]).long()
            if int(lengths.sum()) != len(ids):
                raise DataError(f"{wheres[r]}: document_lengths sum to {int(lengths.sum())}, not its {len(ids)} tokens")
            start = 0
            for d, length in enumerate(lengths.tolist()):
                end = start + length
                want_last = bool(self.teacher_top_k) and end < len(ids) and bool(mask[end])
                jobs.append((r, d, ids[start:end].tolist(), want_last))
                start = end
        futures = [self._pool.submit(self._document, ids, want_last) for _, _, ids, want_last in jobs]
        results: Dict[tuple, dict] = {}
        try:
            for (r, d, _, _), future in zip(jobs, futures):
                try:
                    results[(r, d)] = future.result()
                except CaptureRequestError as err:
                    raise DataError(f"{wheres[r]} (document {d}): vLLM capture failed: {err}") from None
        except BaseException:
            for future in futures:
                future.cancel()
            raise
        return [self._row(item, [results[(r, d)] for d in range(len(item["document_lengths"]))], wheres[r])
                for r, item in enumerate(items)]

    def _row(self, item: dict, documents: List[dict], where: str) -> dict:
        ids = torch.as_tensor(item["input_ids"]).long()
        mask = torch.as_tensor(item["loss_mask"]).bool()
        lengths = torch.as_tensor(item["document_lengths"])
        features = torch.cat([doc["features"] for doc in documents]) if documents else torch.zeros(0)
        self._check_range(features, where)
        row = {"input_ids": ids, "loss_mask": mask, "position_ids": position_ids(lengths), "document_lengths": item["document_lengths"],
               "prompt_hashes": item["prompt_hashes"], "features": features}
        if self.teacher_top_k:
            row["teacher_ids"], row["teacher_logits"] = teacher_rows(documents, mask, self.teacher_top_k)
        return row

    def _check_range(self, features: torch.Tensor, where: str) -> None:
        if self.storage_dtype is None:
            return
        from blockdraft.data.feature_store import STORAGE_DTYPES

        limit = torch.finfo(STORAGE_DTYPES[self.storage_dtype]).max
        peak = float(features.abs().max()) if features.numel() else 0.0
        if peak > limit:
            raise DataError(f"{where}: a target feature reaches {peak:.4g}, beyond {self.storage_dtype}'s range; capture "
                            "with storage_dtype=bfloat16 or float32.")

    # --- one document ---------------------------------------------------------------------------
    def _document(self, ids: List[int], want_last: bool) -> dict:
        """One document through a server, retried: {"length", "features", "prompt_logprobs", "last"}."""
        failures = []
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.retry_backoff_s * 2 ** (attempt - 1))
            server = self._take()
            try:
                return self._once(server, ids, want_last)
            except CaptureRequestError as err:
                failures.append(f"{server.url}: {err}")
                if err.unreachable and not server.gone:
                    from blockdraft.regen.endpoints import still_answers

                    server.gone = not still_answers(server.url, self.headers)
                if not err.retryable:
                    raise CaptureRequestError("; ".join(failures), retryable=False) from None
            finally:
                self._give(server)
        raise CaptureRequestError(f"{self.retries + 1} tries failed: " + "; ".join(failures), retryable=False)

    def _take(self) -> _Server:
        with self._slots:
            while True:
                # Servers that are gone get nothing while another still answers (wait for that one instead).
                usable = [s for s in self.servers if not s.gone] or self.servers
                open_ = [s for s in usable if s.free > 0]
                if open_:
                    server = max(open_, key=lambda s: s.free)
                    server.free -= 1
                    return server
                self._slots.wait()

    def _give(self, server: _Server) -> None:
        with self._slots:
            server.free += 1
            self._slots.notify_all()

    def _once(self, server: _Server, ids: List[int], want_last: bool) -> dict:
        from blockdraft.regen.vllm_backend import RegenRequestError, RequestRefused, post_json

        name = f"bd-{self._run}-{next(self._count)}"
        path = self.scratch_dir / f"{name}.safetensors"
        body = request_body(server.model, ids, name, self.teacher_top_k, want_last)
        try:
            answer = post_json(f"{server.url}/v1/completions", body, self.timeout_s, self.headers)
        except RequestRefused as err:
            raise CaptureRequestError(str(err), retryable=err.retryable) from None
        except RegenRequestError as err:
            raise CaptureRequestError(str(err), retryable=True, unreachable=err.unreachable) from None
        said = (answer.get("kv_transfer_params") or {}).get(PATH_KEY)
        if said is None:
            raise CaptureRequestError(
                f"{server.url} answered without kv_transfer_params.{PATH_KEY}: it does not run the capture connector; "
                "start it with the speculative and kv-transfer configs of blockdraft.capture.vllm_servers "
                "(capture_server_command)", retryable=False)
        states, token_ids = self._read(path, said)
        if token_ids.tolist() != list(ids):
            raise CaptureRequestError(f"{path} holds other token ids than were sent ({len(token_ids)} against {len(ids)})")
        expected = (len(ids), len(aux_layer_ids(self.layer_ids)))
        if tuple(states.shape[:2]) != expected:
            raise CaptureRequestError(f"{path} holds hidden states {tuple(states.shape)}, expected [{expected[0]}, "
                                      f"{expected[1]}, H]: the server captures other layers than aux "
                                      f"{aux_layer_ids(self.layer_ids)} (target_layer_ids {self.layer_ids})",
                                      retryable=False)
        document = {"length": len(ids), "features": features_from_states(states, self.layer_ids)}
        if self.teacher_top_k:
            document["prompt_logprobs"] = (answer.get("choices") or [{}])[0].get("prompt_logprobs")
            document["last"] = last_top_logprobs(answer) if want_last else None
        return document

    def _read(self, path: Path, said: str) -> tuple:
        """Wait up to timeout_s for the connector's file (it appears whole, by rename), read it, delete it."""
        from safetensors.torch import load_file

        deadline = time.monotonic() + self.timeout_s
        while not path.exists():
            if time.monotonic() > deadline:
                shared = "" if Path(said) == path else (
                    f" (the server wrote {said}: its capture_dir must be this scratch_dir, {self.scratch_dir}, on a "
                    "file system both machines share at the same path)")
                raise CaptureRequestError(f"no {path} within request_timeout_s={self.timeout_s:g} s{shared}; the "
                                          "server log says whether its connector failed to write")
            time.sleep(FILE_POLL_S)
        data = load_file(str(path))
        path.unlink(missing_ok=True)
        return data["hidden_states"], data["token_ids"]


def listed_model(url: str, headers: Optional[Dict[str, str]] = None, timeout_s: float = 30.0,
                 wanted: Optional[str] = None) -> str:
    """The name to send a server: `wanted` if it serves it, else the one model it lists."""
    from blockdraft.errors import ConfigError
    from blockdraft.regen.endpoints import base_url, listed_models

    try:
        served = [m.get("id") for m in listed_models(base_url(url), headers or {}, timeout_s)]
    except Exception as err:  # noqa: BLE001 - whatever the reason, the server is unusable as given
        raise ConfigError(f"capture server {url} does not answer /v1/models ({err}); start it or fix the URL") from None
    if wanted is not None:
        if wanted not in served:
            raise ConfigError(f"capture server {url} does not serve {wanted!r} (it serves {served})")
        return wanted
    if len(served) != 1:
        raise ConfigError(f"capture server {url} serves {len(served)} models {served}; name the target's")
    return served[0]
