"""capture.backend=vllm against a real vLLM CPU server on the tiny target: the rows VllmRows builds from vLLM's
extract_hidden_states (through our connector) equal the transformers capture's (RowForward over TargetModel):
features per layer within float32 noise, ids, masks and positions exact, the soft labels' ids exact and their
logits within float32 noise, packed rows and target_layer_ids out of order (the last layer among them) included.
One server start (~30 s on a 2-core CPU)."""

from __future__ import annotations

import pytest
import torch

from blockdraft.capture.forward import RowForward
from blockdraft.capture.vllm_config import CaptureVllmConfig, check_capture_vllm
from blockdraft.capture.vllm_rows import VllmRows
from blockdraft.capture.vllm_servers import capture_servers
from blockdraft.data.dataset import collate
from blockdraft.models.target import TargetModel
from blockdraft.models.tiny_target import save_tiny_target
from blockdraft.vllm_runtime import DEFAULT_VLLM_PYTHON
from tests.integration.conftest import REPO

pytestmark = [
    # make test-slow: the store-level test (test_capture_vllm_store.py, soft labels included) runs real vLLM in
    # make test, and tests/unit/test_capture_vllm_rows.py the conversions this adds packed rows and layer order to.
    pytest.mark.slow,
    pytest.mark.serve,
    pytest.mark.skipif(not DEFAULT_VLLM_PYTHON.is_file(), reason="no vLLM serving environment: run `make setup-serve`"),
]

LAYERS = [5, 0, 3]  # out of order; 5 is the tiny target's last layer (6 layers)
TOP_K = 8


def tiny_items():
    g = torch.Generator().manual_seed(0)
    items = []
    for lengths in ([40], [12, 20], [7, 9, 5]):
        n = sum(lengths)
        mask = torch.rand(n, generator=g) > 0.3
        for at in torch.tensor(lengths).cumsum(0)[:-1].tolist():
            mask[at] = True  # a document's first token supervised: its teacher is the previous document's last position
        items.append({"input_ids": torch.randint(0, 256, (n,), generator=g), "loss_mask": mask,
                      "document_lengths": torch.tensor(lengths), "prompt_hashes": torch.arange(len(lengths))})
    return items


def test_vllm_rows_equal_the_transformers_capture(tmp_path):
    target = str(save_tiny_target(REPO / ".cache" / "targets" / "tiny-qwen3", "qwen3"))
    items = tiny_items()
    wheres = [f"row {i}" for i in range(len(items))]
    model = TargetModel.load(target, LAYERS)
    online = RowForward(model, torch.device("cpu"), torch.float32, TOP_K, "float32")
    want = online.rows(items, collate(items, pad_id=0), wheres)

    cfg = CaptureVllmConfig(workers=4, kv_cache_gib=1, startup_timeout_s=300, request_timeout_s=60)
    check_capture_vllm(cfg, TOP_K)
    with capture_servers(cfg, target, LAYERS, TOP_K, max_model_len=257, out=tmp_path) as servers:
        with VllmRows(servers.urls, servers.scratch_dir, LAYERS, TOP_K, workers=cfg.workers,
                      timeout_s=cfg.request_timeout_s, storage_dtype="float32") as client:
            got = client.rows(items, wheres)
        assert list(servers.scratch_dir.iterdir()) == []  # every file read and removed
    hidden = model.hidden_size
    for w, g in zip(want, got):
        assert sorted(w) == sorted(g)
        for key in ("input_ids", "loss_mask", "position_ids", "document_lengths", "prompt_hashes", "teacher_ids"):
            assert torch.equal(w[key], g[key]) and w[key].dtype == g[key].dtype, key
        assert g["features"].dtype == torch.float32 and g["features"].shape == w["features"].shape
        n = len(w["input_ids"])
        for j, layer in enumerate(LAYERS):
            a, b = w["features"].view(n, len(LAYERS), hidden)[:, j], g["features"].view(n, len(LAYERS), hidden)[:, j]
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-5), (layer, float((a - b).abs().max()))
        assert torch.allclose(w["teacher_logits"], g["teacher_logits"], rtol=1e-5, atol=1e-5)
