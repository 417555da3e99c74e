"""torch.distributed as torchrun sets it up: gloo on CPU, nccl on CUDA. One process works too.

Two timeouts, as torchtitan has them: a long one until the first optimizer step ends (loading a large target,
first allocations) and distributed.timeout_s for the collectives of training steps. Waits on another rank's
long chore are not collectives (rank_watch.py `patient_barrier`): they last as long as that rank is alive.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Dict, Optional

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


# Until a run sets its own (distributed.startup_timeout_s / timeout_s): torch's nccl default, for any backend.
DEFAULT_TIMEOUT_S = 600.0

_watch = None  # this process's RankWatch, once the process group is up


def init_distributed(startup_timeout_s: float = DEFAULT_TIMEOUT_S, timeout_s: Optional[float] = None,
                     use_gpu: bool = True) -> DistInfo:
    """The process group with `startup_timeout_s` for its collectives (set_step_timeout shortens it once the
    run is going), and the rank watch, whose heartbeats give up on a silent rank after `timeout_s`.
    use_gpu=False: a process that leaves the GPUs to others (a capture whose vLLM servers hold them) never makes
    a CUDA context, which would take memory on GPU 0 that a server there counts on."""
    global _watch
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if use_gpu and torch.cuda.is_available():
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        # device_id binds the group to this rank's GPU at once (nccl connects eagerly, no guessing of the device).
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(seconds=startup_timeout_s),
                                **_attempt_store(rank, world, startup_timeout_s),
                                **({"device_id": device} if device.type == "cuda" else {}))
    if world > 1 and _watch is None:
        from blockdraft.ranks.rank_watch import RankWatch

        _watch = RankWatch(dist.distributed_c10d._get_default_store(), rank, world,
                           timeout_s if timeout_s is not None else startup_timeout_s).start()
    return DistInfo(rank, world, local, device)


def _attempt_store(rank: int, world: int, timeout_s: float) -> dict:
    """Under torchrun's agent store, a store of this restart attempt's own for the process group.

    torchrun's c10d rendezvous shares one store across the restarts of a job, and torch's env:// handler adds
    no prefix per attempt there, so the group a restart forms can read the addresses the dead attempt's ranks
    published and fail to connect ("Gloo connectFullMesh failed ... Connection refused"). Keys under the
    attempt's own prefix start empty. Elsewhere (one process, a launch of our own) env:// as torch does it."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=world, is_master=False,
                          timeout=timedelta(seconds=timeout_s))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return {"store": dist.PrefixStore(f"blockdraft/attempt_{attempt}/", store), "rank": rank, "world_size": world}


def set_step_timeout(timeout_s: float) -> None:
    """From now on a collective (and a silent rank) fails after `timeout_s`: the run is past its start-up."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    setter = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if setter is not None:  # older torch keeps the start-up timeout: slower to fail, never wrong
        setter(timedelta(seconds=timeout_s))
    if _watch is not None:
        _watch.set_timeout(timeout_s)


def patient_barrier(what: str) -> None:
    """Every rank arrives here, however long a chore keeps one of them, as long as it is alive (rank_watch.py)."""
    if _watch is not None:
        _watch.wait_all(what)


def report_failure(err: BaseException, rank: int) -> None:
    """Tell every other rank that this one fails, and why: they stop within seconds, not at a timeout."""
    from blockdraft.ranks.rank_watch import PeerFailed

    if _watch is None:
        return
    if isinstance(err, PeerFailed):  # another rank's failure, already posted and read
        _watch.exiting = True
        return
    _watch.post_failure(f"rank {rank} failed: {type(err).__name__}: {err}")
    # This rank's error may be an echo of another's (a collective ended by a peer that left): the first failure
    # posted is the cause, and every rank's log says it.
    try:
        first = _watch.posted_failure()
    except Exception:  # the store's host is gone: this rank's own error is all there is to say
        first = None
    if first is not None and not first.startswith(f"rank {rank} "):
        print(f"[rank {rank}] stopping: {first}", file=sys.stderr, flush=True)


def all_reduce_sums(sums: Dict[str, torch.Tensor], device) -> Dict[str, torch.Tensor]:
    """A dict of sums summed over the ranks in one all-reduce (one collective, not one a metric), on the CPU.
    Every rank must hold the same keys and shapes."""
    if not (dist.is_available() and dist.is_initialized()):
        return {k: v.detach().float().cpu() for k, v in sums.items()}
    keys = sorted(sums)
    flat = torch.cat([sums[k].detach().float().reshape(-1).to(device) for k in keys])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    out, at = {}, 0
    for k in keys:
        n = sums[k].numel()
        out[k] = flat[at:at + n].reshape(sums[k].shape).cpu()
        at += n
    return out


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def broadcast_object(obj, src: int = 0):
    """Rank `src`'s value on every rank (e.g. a decision or an error taken on rank 0)."""
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj) -> list:
    """Every rank's `obj`, in rank order, on every rank ([obj] on one process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def shutdown() -> None:
    """Every rank meets (none is left watching a finished neighbour), then the group goes."""
    global _watch
    if _watch is not None:
        _watch.wait_all("the end of the run")
        _watch.stop()
        _watch = None
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
