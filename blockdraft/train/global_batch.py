"""The global batch: rows per optimizer step over every rank, train.micro_batch_size x train.grad_accum x the
world size. It is what the training's math depends on (batch_order.GlobalBatches: W ranks with grad_accum A
train exactly what one rank with W*A trains), so a run continued on more or fewer ranks keeps it and grad_accum
follows. The rule: a resume keeps its checkpoint's global batch unless train.grad_accum is given on the command
line; given, it is used as given, and a global batch it changes is said."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

from blockdraft.errors import ConfigError


@dataclass(frozen=True)
class Batch:
    micro_batch_size: int
    grad_accum: int
    world_size: int

    @property
    def rows(self) -> int:
        return self.micro_batch_size * self.grad_accum * self.world_size


def given_on_command_line(overrides: Sequence[str], key: str = "train.grad_accum") -> bool:
    """Whether `key` is among the command line's `key=value` words (`+key=`, `++key=` and `~key` count)."""
    return any(word.partition("=")[0].lstrip("+~") == key for word in overrides)


def divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0] if n > 0 else []


def world_sizes_keeping(rows: int, micro_batch_size: int, most: int = 12) -> List[int]:
    """The world sizes on which some grad_accum keeps `rows` rows per step (the first `most`)."""
    return divisors(rows // micro_batch_size)[:most] if rows % micro_batch_size == 0 else []


def grad_accum_keeping(rows: int, micro_batch_size: int, world_size: int) -> Optional[int]:
    """The grad_accum that makes `rows` rows per step on `world_size` ranks; None where none does."""
    share = micro_batch_size * world_size
    return rows // share if rows % share == 0 else None


def one_of(values: List[int]) -> str:
    return ", ".join(map(str, values[:-1])) + f" or {values[-1]}" if len(values) > 1 else str(values[0])


def ranks(n: int) -> str:
    return f"{n} rank" if n == 1 else f"{n} ranks"


def split_advice(rows: int, micro_batch_size: int, world_size: int) -> str:
    """Where a global batch can be kept: the world sizes that split it at this micro_batch_size, or else the
    micro_batch_sizes at which this world size does; '' where neither does."""
    sizes = world_sizes_keeping(rows, micro_batch_size)
    if sizes:
        return f"on {one_of(sizes)} {'rank' if sizes == [1] else 'ranks'}"
    micro = divisors(rows // world_size) if rows % world_size == 0 else []
    return f"with train.micro_batch_size={one_of(micro)}" if micro else ""


def resumed_grad_accum(saved: Batch, micro_batch_size: int, grad_accum: int, world_size: int, given: bool,
                       checkpoint) -> tuple:
    """(the grad_accum this run continues with, the line that says what happened to the global batch, or None
    when nothing changed). Refused, before anything loads, where the checkpoint's global batch cannot be kept."""
    if given:
        now = Batch(micro_batch_size, grad_accum, world_size)
        return grad_accum, batch_line(saved, now, given=True)
    keeping = grad_accum_keeping(saved.rows, micro_batch_size, world_size)
    if keeping is None:
        advice = split_advice(saved.rows, micro_batch_size, world_size)
        raise ConfigError(
            f"cannot resume from {checkpoint} on {ranks(world_size)} with train.micro_batch_size={micro_batch_size}: "
            f"its global batch of {saved.rows} rows per step does not split evenly over them; "
            + (f"resume it {advice}, or " if advice else "")
            + "give train.grad_accum= to train on with another global batch.")
    return keeping, batch_line(saved, Batch(micro_batch_size, keeping, world_size), given=False)


def batch_line(saved: Batch, now: Batch, given: bool) -> Optional[str]:
    """One line: how the run's split of the global batch changed since its checkpoint, and whether the global batch
    was kept (it changes only with train.grad_accum given); None when nothing changed."""
    split = [f"{name} {a} -> {b}" for name, a, b in (("world size", saved.world_size, now.world_size),
                                                    ("micro_batch_size", saved.micro_batch_size, now.micro_batch_size)) if a != b]
    if now.rows != saved.rows:
        changed = f"{', '.join(split)} with " if split else ""
        return (f"[train] {changed}train.grad_accum={now.grad_accum}{' as given' if given else ''}: the global batch "
                f"changes from {saved.rows} to {now.rows} rows per step (leave train.grad_accum out to keep {saved.rows})")
    if not split:
        return None
    accum = (f"grad_accum {saved.grad_accum} -> {now.grad_accum}" if saved.grad_accum != now.grad_accum
             else f"grad_accum {now.grad_accum}")
    return f"[train] {', '.join(split)}: {accum} keeps the global batch of {now.rows} rows per step"
