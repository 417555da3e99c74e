"""A vLLM KV connector that writes each finished request's captured hidden states to a file.

Loaded by vLLM itself, in the serving interpreter (`.venv-serve`), through
`--kv-transfer-config '{"kv_connector": "CaptureConnector",
"kv_connector_module_path": "blockdraft.capture.vllm_connector", "kv_role": "kv_producer",
"kv_connector_extra_config": {"capture_dir": DIR}}'` beside
`--speculative-config '{"method": "extract_hidden_states", "num_speculative_tokens": 1,
"draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [...]}}}'`.
So it imports only the standard library, torch, safetensors and vLLM (blockdraft/__init__.py and
blockdraft/capture/__init__.py import nothing).

How the states get here: `extract_hidden_states` runs a stand-in draft model whose only layer
(CacheOnlyAttentionLayer) writes the target's aux hidden states of every token into its own KV
cache group, [num_blocks, num_aux_layers, block_size, hidden] per block. When a request finishes,
the scheduler side keeps its blocks (request_finished returns True) and hands their ids to the
worker side, which gathers the request's rows, copies them to the host, and reports the request
done so the blocks are freed; a thread writes the file.

The file: `<capture_dir>/<name>.safetensors` with `hidden_states` [num_prompt_tokens, num_aux_layers,
hidden] (aux layers ascending: vLLM sorts them) and `token_ids` [num_prompt_tokens] (int64). `name` is
the request's `kv_transfer_params["capture_name"]` when the client gives one (letters, digits, `._-`),
else vLLM's request id. It is written to a temporary name in the same directory and renamed, so a
reader polling for the name never sees a partial file (rename is atomic on one file system), and
needs no lock. Only tensor-parallel rank 0 writes (every rank holds the same, full states).

This differs from vLLM's ExampleHiddenStatesConnector in three ways: it runs on CPU as well (the
example copies through CUDA streams and pinned memory, which a CPU-only torch lacks), the file name
is the client's, and there is no lock file (the rename replaces it).
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole,
                                                               SupportsHMA)

logger = logging.getLogger("vllm.blockdraft.capture")

NAME_KEY = "capture_name"  # kv_transfer_params key a client names its file with
PATH_KEY = "hidden_states_path"  # what the answer's kv_transfer_params say (the example connector's key)
_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")


def capture_file(directory: str, name: str) -> str:
    """The file a request named `name` is written to. Refuses names that could leave `directory`."""
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"capture name {name!r}: use 1-200 letters, digits, '.', '_' or '-'")
    return os.path.join(directory, f"{name}.safetensors")


def file_name_for(directory: str, request_id: str, params: Optional[dict]) -> str:
    """The client's name when it gives a valid one, else the request id (characters outside the safe set
    replaced): a bad client name must not stop the engine, only fall back (and say so)."""
    name = (params or {}).get(NAME_KEY)
    if name is not None:
        try:
            return capture_file(directory, str(name))
        except ValueError as err:
            logger.warning("request %s: %s; writing under its request id", request_id, err)
    return capture_file(directory, re.sub(r"[^A-Za-z0-9._-]", "_", request_id)[:200] or "request")


def write_atomically(tensors: dict, path: str) -> None:
    """safetensors to a temporary file beside `path`, then renamed onto it: readers see all or nothing."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".safetensors", dir=directory)
    os.close(fd)
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _log_failure(path: str):
    def check(future) -> None:
        if future.exception() is not None:  # the client then times out waiting for the file and retries
            logger.error("writing %s failed: %r", path, future.exception())

    return check


def gather_rows(cache: torch.Tensor, block_ids: list, num_tokens: int) -> torch.Tensor:
    """A request's first `num_tokens` rows of the hidden-state cache [num_blocks, layers, block_size, hidden]
    -> [num_tokens, layers, hidden], on the cache's device."""
    block_size = cache.shape[2]
    blocks = torch.tensor(block_ids, dtype=torch.long)
    slots = (blocks[:, None] * block_size + torch.arange(block_size)[None, :]).flatten()[:num_tokens]
    slots = slots.to(cache.device)
    return cache[slots // block_size, :, slots % block_size]


@dataclass
class PendingSave:
    req_id: str
    path: str
    token_ids: torch.Tensor
    block_ids: list


@dataclass
class CaptureMetadata(KVConnectorMetadata):
    saves: list = field(default_factory=list)  # PendingSave, scheduler -> worker


class CaptureConnector(KVConnectorBase_V1, SupportsHMA):
    """Store-only connector for `extract_hidden_states`; see the module docstring."""

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config
        self.directory = str(extra.get_from_extra_config("capture_dir", "") or "")
        if not self.directory:
            raise ValueError("CaptureConnector needs kv_connector_extra_config.capture_dir (where files are written)")
        if vllm_config.speculative_config is None or vllm_config.speculative_config.method != "extract_hidden_states":
            raise ValueError("CaptureConnector needs --speculative-config with method extract_hidden_states")
        self.group = self._hidden_state_group(kv_cache_config)
        # scheduler side
        self._paths: dict = {}  # req_id -> file, set when first scheduled
        self._pending: list = []  # saves for the next step's metadata
        # worker side
        self._cache: Optional[torch.Tensor] = None
        self._rank0 = True
        self._finished: set = set()  # req ids the engine said finished, not yet reported done
        self._copies: dict = {}  # req_id -> (event or None, host tensors, path): copy launched, not reported
        self._writer = ThreadPoolExecutor(max_workers=int(extra.get_from_extra_config("writer_threads", 4)),
                                          thread_name_prefix="capture-write")
        self._stream = None  # CUDA copy stream, made on first use on a CUDA cache

    @staticmethod
    def _hidden_state_group(kv_cache_config) -> int:
        """Index of the KV cache group holding the hidden states (the stand-in draft's own group)."""
        if kv_cache_config is None:
            return 0
        from vllm.v1.kv_cache_interface import HiddenStateCacheSpec

        groups = kv_cache_config.kv_cache_groups
        found = [i for i, g in enumerate(groups) if isinstance(g.kv_cache_spec, HiddenStateCacheSpec)]
        if len(found) == 1:
            return found[0]
        if not found and len(groups) == 1:
            return 0
        raise ValueError(f"expected one hidden-state KV cache group among {len(groups)}, found {len(found)}")

    # --- scheduler side ------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        return 0, False  # never loads anything

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        pass

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        for new in scheduler_output.scheduled_new_reqs:
            extra = (new.sampling_params.extra_args or {}) if new.sampling_params is not None else {}
            self._paths[new.req_id] = file_name_for(self.directory, new.req_id, extra.get("kv_transfer_params"))
        meta, self._pending = CaptureMetadata(saves=self._pending), []
        return meta

    def request_finished(self, request, block_ids: list):
        path = self._paths.pop(request.request_id, None)
        if path is None or request.prompt_token_ids is None:
            return False, None  # aborted before it ran, or prompt embeddings: nothing to write
        # Only prompt tokens: the generated token was never an input, so it has no state.
        ids = torch.tensor(list(request.prompt_token_ids), dtype=torch.long)
        self._pending.append(PendingSave(request.request_id, path, ids, list(block_ids)))
        return True, {PATH_KEY: path}  # True: keep the blocks until the worker has copied them

    def request_finished_all_groups(self, request, block_ids: tuple):
        if not 0 <= self.group < len(block_ids):
            return False, None
        return self.request_finished(request, block_ids[self.group])

    def get_finished_count(self) -> int:
        return 1  # only TP rank 0 reports: waiting for every rank would keep the blocks forever

    # --- worker side ---------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict):
        from vllm.config import get_layers_from_vllm_config
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionLayer

        self._rank0 = get_tensor_model_parallel_rank() == 0
        layers = list(get_layers_from_vllm_config(self._vllm_config, CacheOnlyAttentionLayer, list(kv_caches)))
        if len(layers) != 1:
            raise ValueError(f"expected one CacheOnlyAttentionLayer (extract_hidden_states), found {layers}")
        self._cache = kv_caches[layers[0]]

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        pass  # the stand-in layer already wrote the states into the cache during the forward

    def wait_for_save(self) -> None:
        pass

    def get_finished(self, finished_req_ids: set):
        if self.has_connector_metadata():
            meta = self._get_connector_metadata()
            for save in getattr(meta, "saves", ()):
                if self._rank0:
                    self._copy_out(save)
        self._finished |= set(finished_req_ids)
        done = set()
        # A request is reported once its states are on the host (its blocks may then be reused);
        # the vLLM contract: only ids it has passed in finished_req_ids.
        for req_id in list(self._finished):
            copy = self._copies.get(req_id)
            if copy is None:
                # Its save comes in the same step as its finish: none means nothing to write (aborted before
                # it ran, or another rank), so stop tracking it.
                self._finished.discard(req_id)
                continue
            if copy[0] is not None and not copy[0].query():
                continue  # the device-to-host copy is still running
            _, tensors, path = self._copies.pop(req_id)
            self._finished.discard(req_id)
            self._writer.submit(write_atomically, tensors, path).add_done_callback(_log_failure(path))
            done.add(req_id)
        return done or None, None

    def _copy_out(self, save: PendingSave) -> None:
        """Gather the request's rows and start their copy to the host. On CPU the gather is the copy; on CUDA
        it goes to pinned memory on a side stream (the engine's stream is not held up), finished by an event."""
        rows = gather_rows(self._cache, save.block_ids, len(save.token_ids)) if len(save.token_ids) else \
            self._cache.new_zeros((0, *self._cache.shape[1:2], self._cache.shape[3]))
        event = None
        if rows.is_cuda:
            if self._stream is None:
                self._stream = torch.cuda.Stream()
            self._stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self._stream):
                host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
                host.copy_(rows, non_blocking=True)
                rows.record_stream(self._stream)
            event = torch.cuda.Event()
            event.record(self._stream)
            rows = host
        self._copies[save.req_id] = (event, {"hidden_states": rows, "token_ids": save.token_ids}, save.path)

    def shutdown(self):
        self._writer.shutdown(wait=True)  # files already handed to the writer are finished

