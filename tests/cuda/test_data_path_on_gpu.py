"""The data path and the step's timing on a GPU: the loader's batches pinned and as GlobalBatches gives them, a
draft built on the meta device with the host build's weights on the GPU, and a span that times the device's
work without the host waiting for it."""

import time

import torch

from blockdraft.models import build_draft
from blockdraft.models.meta_build import build_draft_on
from blockdraft.train.batch_loader import BatchLoader
from blockdraft.train.step_timer import Span
from tests.cuda.gpu_helpers import needs_cuda
from tests.unit.test_batch_loader import assert_same, order, rows, taken  # noqa: F401  (rows: a fixture)
from tests.unit.test_meta_build import kind_configs, snapshot

pytestmark = needs_cuda


def test_the_loader_pins_what_global_batches_gives(rows):
    loader = BatchLoader(order(rows), 2, pin_memory=True)
    try:
        got = taken(loader, 4)
        pinned = [batch for batch, _ in loader.next_step()]
    finally:
        loader.close()
    assert_same(got, taken(order(rows), 4))
    assert pinned and all(v.is_pinned() for batch in pinned for v in batch.values())


def test_a_draft_built_on_the_meta_device_has_the_host_builds_weights_on_the_gpu(tiny_hf):
    for name, cfg in kind_configs(tiny_hf.config):
        torch.manual_seed(5)
        host = build_draft(cfg).cuda()
        torch.manual_seed(5)
        built = build_draft_on(cfg, "cuda")
        assert all(p.is_cuda for p in built.parameters())
        (want, want_b), (got, got_b) = snapshot(host), snapshot(built)
        for key, value in want.items():
            assert torch.equal(got[key][0], value[0]) and got[key][1:] == value[1:], f"{name}: {key}"
        assert all(torch.equal(got_b[k], v) for k, v in want_b.items()), name


def test_a_span_times_the_devices_work_without_the_host_waiting():
    torch.cuda.synchronize()
    span = Span(torch.device("cuda"))
    torch.cuda._sleep(200_000_000)  # a kernel that spins on the device
    launched = time.perf_counter()
    span.stop()
    host_seconds = time.perf_counter() - launched
    assert span.seconds() > 10 * host_seconds  # the stop returned at once; the device's time is read here
