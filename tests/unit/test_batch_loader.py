"""The order of training rows and the loader that reads it ahead (train/batch_order.py, train/batch_loader.py).

GlobalBatches keeps the order it always had: step k of epoch e takes rows randperm_e[k*G:(k+1)*G], its permutation
drawn once per epoch now. The loader, with workers or in the training thread, gives each rank exactly the
micro-batches and anchor generators GlobalBatches gives, in its order, across epochs; the position it reports
is that of the steps taken, never of those read ahead, so a loader restored there continues as the run would
have; a step left part way is not mixed into the next; a scheduler's SIGTERM does not stop the workers, and a
process that leaves its loader open still exits."""

import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from blockdraft.data.dataset import Documents, TokenizedDataset
from blockdraft.errors import ConfigError
from blockdraft.ranks.distributed import DistInfo
from blockdraft.train.batch_loader import BatchLoader, pack, unpack
from blockdraft.train.batch_order import GlobalBatches

PAD, SEED, ROWS = 0, 3, 23
MICRO, ACCUM, WORLD = 2, 2, 2  # 8 rows a step: 2 steps an epoch, 7 rows left out of each


def rank(r: int, world: int = WORLD) -> DistInfo:
    return DistInfo(rank=r, world_size=world, local_rank=r, device=torch.device("cpu"))


@pytest.fixture(scope="module")
def rows():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 12, (ROWS,), generator=g).tolist()
    ids = [torch.randint(1, 500, (n,), generator=g).tolist() for n in lengths]
    masks = [[i >= n // 3 for i in range(n)] for n in lengths]
    return TokenizedDataset(Documents.from_lists(ids, masks, list(range(ROWS))), seq_length=64)


def order(rows, r=0, world=WORLD, accum=ACCUM):
    return GlobalBatches(rows, MICRO, accum, PAD, rank(r, world), SEED)


def taken(source, steps: int) -> list:
    """Each step's rows of every rank, this rank's micro-batches (tensors, generator state) and the position after it."""
    out = []
    for _ in range(steps):
        micro = [({k: v.clone() for k, v in b.items()}, g.get_state()) for b, g in source.next_step()]
        out.append((list(source.last_step_rows), micro, source.position))
    return out


def assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for (rows_a, micro_a, pos_a), (rows_b, micro_b, pos_b) in zip(a, b):
        assert rows_a == rows_b and pos_a == pos_b and len(micro_a) == len(micro_b)
        for (batch_a, gen_a), (batch_b, gen_b) in zip(micro_a, micro_b):
            assert batch_a.keys() == batch_b.keys() and all(torch.equal(batch_a[k], batch_b[k]) for k in batch_a)
            assert torch.equal(gen_a, gen_b)


def test_the_order_is_a_permutation_per_epoch_as_before(rows):
    """The rule as the permutation drawn every step gave it: epoch e's permutation, seeded seed*7919 + e, cut into
    global steps; rank r's micro-batch i is the step's slice r*accum + i; its generator seeded by its global index."""
    batches = order(rows, r=1)
    for step in range(5):
        epoch, k = divmod(step, 2)
        perm = torch.randperm(ROWS, generator=torch.Generator().manual_seed(SEED * 7919 + epoch)).tolist()
        want = perm[k * 8:(k + 1) * 8]
        plan = batches.plan_step()
        assert plan.rows == want and plan.position == {"epoch": epoch, "samples": (k + 1) * 8}
        for i, micro in enumerate(plan.micro):
            start = k * 8 + (1 * ACCUM + i) * MICRO
            assert micro.rows == perm[start:start + MICRO]
            assert micro.seed == SEED * 1_000_003 + (epoch * ROWS + start) // MICRO


@pytest.mark.parametrize("workers", [0, 2])
def test_each_rank_gets_the_micro_batches_and_generators_of_global_batches(rows, workers):
    for r in range(WORLD):
        loader = BatchLoader(order(rows, r), workers)
        try:
            assert_same(taken(loader, 5), taken(order(rows, r), 5))  # 5 steps: into a third epoch
        finally:
            loader.close()


def test_one_rank_accumulating_gets_what_two_ranks_get_between_them(rows):
    loader = BatchLoader(order(rows, world=1, accum=ACCUM * WORLD), 2)
    try:
        one = taken(loader, 3)
    finally:
        loader.close()
    two = [taken(order(rows, r), 3) for r in range(WORLD)]
    for step, (rows_one, micro, _) in enumerate(one):
        assert rows_one == two[0][step][0] == two[1][step][0]
        assert_same([(rows_one, micro, None)], [(rows_one, two[0][step][1] + two[1][step][1], None)])


def test_the_position_is_of_the_steps_taken_and_a_restore_continues_there(rows):
    reference = taken(order(rows), 7)
    loader = BatchLoader(order(rows), 2)
    try:
        first = taken(loader, 3)
        # The workers have read ahead (the order's own position is past the steps taken), the position is not.
        assert loader.order.position != first[-1][2]
        assert loader.position == reference[2][2] == {"epoch": 1, "samples": 8}
        saved = loader.position
    finally:
        loader.close()
    resumed = BatchLoader(order(rows), 2)
    try:
        resumed.restore(saved)
        assert_same(first + taken(resumed, 4), reference)
        # A restore mid-run drops what was read ahead and continues at the position given.
        resumed.restore(reference[4][2])
        assert_same(taken(resumed, 1), reference[5:6])
        resumed.close()  # its workers stopped: the next step is still the one after the last taken
        assert_same(taken(resumed, 1), reference[6:])
    finally:
        resumed.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_step_left_part_way_is_not_mixed_into_the_next(rows, workers):
    reference = taken(order(rows), 3)
    loader = BatchLoader(order(rows), workers)
    try:
        next(iter(loader.next_step()))  # an error after the first micro-batch: the step's second is never taken
        assert_same(taken(loader, 2), reference[1:])
    finally:
        loader.close()


def test_the_workers_keep_reading_through_a_schedulers_sigterm(rows):
    reference = taken(order(rows), 4)
    loader = BatchLoader(order(rows), 2)
    try:
        first = taken(loader, 1)
        workers = [p for p in multiprocessing.active_children() if p.is_alive()]
        assert len(workers) == 2
        for worker in workers:
            os.kill(worker.pid, signal.SIGTERM)
        assert_same(first + taken(loader, 3), reference)
        assert all(w.is_alive() for w in workers)
    finally:
        loader.close()


def test_a_process_that_leaves_its_loader_open_still_exits(tmp_path):
    """The workers ignore SIGTERM, which is how multiprocessing stops them at exit: the loader stops them first."""
    script = tmp_path / "leave_open.py"
    script.write_text(
        "import torch\n"
        "from blockdraft.data.dataset import Documents, TokenizedDataset\n"
        "from blockdraft.train.batch_loader import BatchLoader\n"
        "from blockdraft.train.batch_order import GlobalBatches\n"
        "from blockdraft.ranks.distributed import DistInfo\n"
        "rows = TokenizedDataset(Documents.from_lists([[1, 2, 3]] * 8, [[False, True, True]] * 8, list(range(8))), 64)\n"
        "one = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device('cpu'))\n"
        "loader = BatchLoader(GlobalBatches(rows, 2, 1, 0, one, seed=0), 2)\n"
        "list(loader.next_step())\n"
        "print('stepped', flush=True)\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0 and "stepped" in out.stdout, out.stderr[-2000:]


def test_a_packed_micro_batch_unpacks_to_its_tensors():
    g = torch.Generator().manual_seed(1)
    batch = {"input_ids": torch.randint(0, 9, (2, 5), generator=g), "loss_mask": torch.rand(2, 5, generator=g) > 0.5,
             "features": torch.randn(2, 5, 3, generator=g), "teacher_logits": torch.randn(2, 5, 0),
             "position_ids": torch.arange(5).expand(2, -1)}  # not contiguous
    buffer, layout = pack(batch)
    got = unpack((buffer, layout))
    assert list(got) == list(batch) and buffer.dtype == torch.uint8
    assert all(got[k].dtype == v.dtype and torch.equal(got[k], v) for k, v in batch.items())
    assert all(t.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr() for t in got.values())


@pytest.mark.parametrize("workers", [-1, 1.5, "2", True])
def test_a_loader_workers_that_is_not_a_count_is_refused_with_the_fix(rows, workers):
    with pytest.raises(ConfigError) as err:
        BatchLoader(order(rows), workers)
    assert f"train.loader_workers={workers!r}" in str(err.value) and "0 to read them in the training thread" in str(err.value)
