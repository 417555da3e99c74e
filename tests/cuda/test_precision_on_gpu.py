"""bf16 autocast against fp32, and the chunked loss at Qwen3's 151,936-token vocabulary, on the GPU."""

import torch
import torch.nn.functional as F

from blockdraft.config.recipe import LoopConfig
from blockdraft.losses.block import chunked_cross_entropy_rows
from blockdraft.models.target import TargetModel
from blockdraft.models.tiny_target import build_tiny_model
from blockdraft.train.step import train_step
from tests.conftest import make_draft
from tests.cuda.gpu_helpers import cosine, grads_of, needs_cuda, packed_batch

pytestmark = needs_cuda
QWEN3_VOCAB = 151_936


def test_bf16_autocast_step_is_close_to_the_fp32_step():
    hf = build_tiny_model("qwen3", seed=0).cuda()
    target = TargetModel(hf, [1, 3])
    draft = make_draft(hf, "dflash").cuda()
    batch = packed_batch()
    cfg = LoopConfig(num_anchors=8, gamma=4.0)
    runs = []
    for autocast in (False, True):
        draft.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            result = train_step(draft, target, batch, cfg, torch.Generator().manual_seed(5), "flex")
            result.loss.backward()
        runs.append((result.loss.detach().float(), grads_of(draft)))
    (fp32_loss, fp32_grads), (bf16_loss, bf16_grads) = runs
    assert abs(float(bf16_loss - fp32_loss)) <= 0.02 * float(fp32_loss)
    assert cosine(bf16_grads, fp32_grads) > 0.99


def _ce_and_grads(hidden, head, labels, chunk):
    h = hidden.clone().requires_grad_(True)
    if chunk:
        ce = chunked_cross_entropy_rows(h, head, labels, chunk)
    else:
        ce = F.cross_entropy(F.linear(h, head).float(), labels, reduction="none")
    ce.mean().backward()
    return ce.detach(), h.grad


def test_chunked_loss_equals_the_unchunked_one_at_qwen3_vocabulary():
    g = torch.Generator(device="cuda").manual_seed(0)
    m, h = 3000, 512  # 3000 supervised slots: the last chunk is a partial one
    hidden = torch.randn(m, h, device="cuda", generator=g)
    head = torch.randn(QWEN3_VOCAB, h, device="cuda", generator=g) * 0.02
    labels = torch.randint(0, QWEN3_VOCAB, (m,), device="cuda", generator=g)
    (full_ce, full_grad), full_peak = _peak_memory(lambda: _ce_and_grads(hidden, head, labels, 0))
    (chunk_ce, chunk_grad), chunk_peak = _peak_memory(lambda: _ce_and_grads(hidden, head, labels, 1024))
    torch.testing.assert_close(chunk_ce, full_ce, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunk_grad, full_grad, rtol=1e-4, atol=1e-7)
    # The whole [M, V] logits (1.8 GB here, with their softmax and gradient) never live at once.
    assert chunk_peak < 0.5 * full_peak


def _peak_memory(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    return out, torch.cuda.max_memory_allocated() - before


def test_chunked_loss_in_bf16_autocast_matches_unchunked_bf16():
    g = torch.Generator(device="cuda").manual_seed(1)
    m, h = 2048, 512
    hidden = torch.randn(m, h, device="cuda", generator=g)
    head = torch.randn(QWEN3_VOCAB, h, device="cuda", generator=g) * 0.02
    labels = torch.randint(0, QWEN3_VOCAB, (m,), device="cuda", generator=g)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        full_ce, full_grad = _ce_and_grads(hidden, head, labels, 0)
        chunk_ce, chunk_grad = _ce_and_grads(hidden, head, labels, 512)
    torch.testing.assert_close(chunk_ce, full_ce, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(chunk_grad, full_grad, rtol=1e-2, atol=1e-5)
