"""A draft built on the meta device and materialised on its own device, with the weights a host build gives.

Built whole in float32 on the host and then moved, a 4.6B draft holds 18 GB of host memory on every rank
before any of it reaches a GPU. Here the draft's constructor runs on the meta device (shapes only, no
memory) while every aten op it calls is recorded; the record is then replayed on the host, and each tensor
moves to the device as soon as its value is final. The replay runs the constructor's very ops in its order
on the CPU, random draws included (nn.Linear's kaiming_uniform_, the normal_ re-inits, DFlash2's randn, the
GRU's uniform_), so for one seed the weights, and the CPU generator's state after them, are bit-identical to
`build_draft(cfg)` on the host. Values a later op overwrites whole before anything reads them (a Linear's
default init under the draft's normal_) are never kept: their draws still happen, into a scratch tensor of
the same layout, and the tensor is allocated at the write that counts. The host then holds the tensors
being initialised at that moment, not the draft.

A draft whose construction cannot be replayed this way (an op that reads values on the meta device, a
tensor attribute outside parameters and buffers, two parameters over one storage) is built as before, on
the host, and said.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

log = logging.getLogger(__name__)

aten = torch.ops.aten
# Ops that write their first argument whole without reading it: values written before are dead.
OVERWRITES = {aten.uniform_, aten.normal_, aten.fill_, aten.zero_, aten.copy_, aten.random_, aten.exponential_,
              aten.geometric_, aten.log_normal_, aten.cauchy_, aten.bernoulli_}


class Unreplayable(Exception):
    """The constructor did something the replay cannot reproduce exactly."""


def build_draft_on(cfg, device, build: Optional[Callable[[], nn.Module]] = None) -> nn.Module:
    """`build()` (default `build_draft(cfg)`) with its weights on `device`, bit-identical to a host build for the
    CPU generator's state at the call, and that state advanced as a host build advances it."""
    if build is None:
        from blockdraft.models import build_draft

        def build():
            return build_draft(cfg)
    device = torch.device(device)
    state = torch.get_rng_state()
    try:
        plan = Plan(*record(build))
        return plan.materialise(lambda t: t.to(device, copy=True))
    except Unreplayable as why:
        torch.set_rng_state(state)  # the fallback draws from where a host build starts
        log.warning("draft kind %s built on the host, then moved to %s: its construction does not replay from the "
                    "meta device (%s)", getattr(cfg, "kind", "?"), device, why)
        return build().to(device)


# --- recording ---------------------------------------------------------------------------------
@dataclass
class Op:
    func: object
    args: tuple
    kwargs: dict
    outs: List[torch.Tensor]


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: List[Op] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        # The record holds every tensor it names, so no storage is freed and its address reused meanwhile.
        self.ops.append(Op(func, args, kwargs, [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]))
        return out


def record(build: Callable[[], nn.Module]) -> Tuple[List[Op], nn.Module]:
    """The ops `build()` runs on the meta device, in order, and the model it returns (on the meta device)."""
    recorder = _Recorder()
    try:
        with torch.device("meta"), recorder:
            model = build()
    except (NotImplementedError, RuntimeError) as err:  # an op that needs values (`.item()`, data-dependent shapes)
        raise Unreplayable(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from None
    return recorder.ops, model


# --- the plan: which ops count ----------------------------------------------------------------------
def _key(t: torch.Tensor) -> int:
    """The storage a tensor views: tensors over one storage share their values."""
    return t.untyped_storage()._cdata


def _is_meta(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "meta"


def _covers_storage(t: torch.Tensor) -> bool:
    """t's elements are its storage's, each once (a whole write through t leaves nothing of what was there)."""
    if t.storage_offset() != 0 or t.numel() * t.element_size() != t.untyped_storage().nbytes():
        return False
    expected = 1
    for size, stride in sorted(((s, st) for s, st in zip(t.shape, t.stride()) if s != 1), key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _storage_elements(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes() // t.element_size()


@dataclass
class _Step:
    op: Op
    mutated: List[torch.Tensor]  # meta tensors it writes in place
    fresh: List[torch.Tensor]  # meta tensors it returns over new storages
    reads: List[torch.Tensor]  # meta tensors whose values it reads
    kills: List[int]  # storages whose earlier values it overwrites whole
    random: bool
    view: bool
    live: bool = False

    @property
    def writes(self) -> List[torch.Tensor]:
        return self.mutated + self.fresh


def _classify(op: Op) -> _Step:
    schema = op.func._schema
    mutated = []
    for i, arg in enumerate(schema.arguments):
        value = op.args[i] if i < len(op.args) else op.kwargs.get(arg.name)
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        if _is_meta(value):
            mutated.append(value)
        elif any(_is_meta(x) for x in tree_flatten(value)[0]):
            raise Unreplayable(f"{op.func} writes a list of tensors")
    inputs = [x for x in tree_flatten((op.args, op.kwargs))[0] if _is_meta(x)]
    random = torch.Tag.nondeterministic_seeded in op.func.tags
    on_meta = inputs or any(_is_meta(t) for t in op.outs)
    if random and not on_meta:
        raise Unreplayable(f"{op.func} draws on the host during construction")
    view = not mutated and bool(schema.returns) and all(r.alias_info is not None for r in schema.returns)
    overwrite = op.func.overloadpacket in OVERWRITES and bool(mutated)
    first = mutated[0] if mutated else None
    reads = [x for x in inputs if not (overwrite and x is first)]
    fresh = [] if (mutated or view) else [t for t in op.outs if _is_meta(t)]
    kills = [_key(t) for t in fresh] + ([_key(first)] if overwrite and _covers_storage(first) else [])
    return _Step(op, mutated, fresh, reads, kills, random, view)


def _targets(model: nn.Module) -> Dict[int, List[Tuple[nn.Module, str, torch.Tensor, bool]]]:
    """Storage -> the parameters and buffers over it: (module, name, meta tensor, is a parameter)."""
    out: Dict[int, list] = {}
    owner: Dict[int, int] = {}
    for module in model.modules():
        for name, value in vars(module).items():
            if _is_meta(value):
                raise Unreplayable(f"{type(module).__name__}.{name} is a tensor outside its parameters and buffers")
        for table, is_param in ((module._parameters, True), (module._buffers, False)):
            for name, t in table.items():
                if t is None:
                    continue
                key = _key(t)
                if owner.setdefault(key, id(t)) != id(t):
                    raise Unreplayable(f"{type(module).__name__}.{name} shares its storage with another tensor")
                out.setdefault(key, []).append((module, name, t, is_param))
    return out


class Plan:
    """The recorded ops, each marked live (its result is part of a final value) or not, and when each storage
    is last used; `materialise` replays them."""

    def __init__(self, ops: List[Op], model: nn.Module):
        self.model = model
        self.steps = [_classify(op) for op in ops]
        self.targets = _targets(model)
        self._mark_live()
        self.peak_host_bytes = 0  # the most the replay held on the host at once (its scratch draws aside)

    def _mark_live(self) -> None:
        """Backwards: an op is live when it writes a storage whose value is still needed (by a final value, or by
        a live op after it); a whole overwrite ends that need. A discarded draw is still drawn, from its inputs."""
        needed = set(self.targets)
        for step in reversed(self.steps):
            if step.view:
                continue
            step.live = bool({_key(t) for t in step.writes} & needed)
            if step.live:
                needed -= set(step.kills)
            if step.live or step.random:
                needed |= {_key(t) for t in step.reads}
        self.last_use: Dict[int, int] = {}
        for i, step in enumerate(self.steps):
            used = (step.writes + step.reads) if step.live else step.reads if step.random else []
            for t in used:
                self.last_use[_key(t)] = i
        if any(key not in self.last_use for key in self.targets):
            raise Unreplayable("a parameter's value comes from no recorded op")

    # --- the replay on the host ---------------------------------------------------------------------
    def materialise(self, place: Callable[[torch.Tensor], torch.Tensor]) -> nn.Module:
        """Replay on the CPU; each parameter and buffer goes through `place` (to its device) once final and its
        host copy is dropped. Returns the model with its tensors replaced."""
        placed = self._replay(place)
        made: Dict[int, torch.Tensor] = {}  # one new parameter for one old one, wherever it is registered
        for key, entries in self.targets.items():
            for module, name, meta, is_param in entries:
                if id(meta) not in made:
                    value = placed[key]
                    if is_param:
                        value = nn.Parameter(value, requires_grad=meta.requires_grad)
                        value.__dict__.update(meta.__dict__)  # flags set on a parameter (e.g. row_lazy) stay
                    made[id(meta)] = value
                (module._parameters if is_param else module._buffers)[name] = made[id(meta)]
        return self.model

    def _replay(self, place) -> Dict[int, torch.Tensor]:
        real: Dict[int, torch.Tensor] = {}  # storage -> a flat CPU tensor over its replayed storage
        placed: Dict[int, torch.Tensor] = {}
        held = 0

        def host(t: torch.Tensor) -> torch.Tensor:
            base = real.get(_key(t))
            if base is None:
                raise Unreplayable("an op reads a tensor no recorded op wrote")
            if base.dtype != t.dtype:
                raise Unreplayable(f"a {t.dtype} view of a {base.dtype} storage")
            return base.as_strided(t.shape, t.stride(), t.storage_offset())

        def scratch(t: torch.Tensor) -> torch.Tensor:
            # The layout the draw had on the host: the CPU kernels draw in another order for another layout.
            return torch.empty(_storage_elements(t), dtype=t.dtype).as_strided(t.shape, t.stride(), t.storage_offset())

        def argument(x, discard):
            if _is_meta(x):
                return scratch(x) if id(x) in discard else host(x)
            if isinstance(x, torch.device) and x.type == "meta":
                return torch.device("cpu")
            return x

        def run(step: _Step) -> int:
            """The op on the host; returns the bytes it added to the host's storages (its locals die with it)."""
            op, added = step.op, 0
            discard = set() if step.live else {id(t) for t in step.writes}  # a draw whose values nothing keeps
            if step.live:
                for t in step.mutated:  # written whole after a dead past: its storage starts here
                    if _key(t) not in real:
                        real[_key(t)] = torch.empty(_storage_elements(t), dtype=t.dtype)
                        added += t.untyped_storage().nbytes()
            args, kwargs = tree_map(lambda x: argument(x, discard), (op.args, op.kwargs))
            out = op.func(*args, **kwargs)
            if step.live and step.fresh:
                values = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
                for meta, value in zip(op.outs, values):
                    if _is_meta(meta):
                        if meta.storage_offset() or value.storage_offset() or value.dtype != meta.dtype:
                            raise Unreplayable(f"{op.func} returned a view")
                        real[_key(meta)] = value.as_strided((_storage_elements(value),), (1,))
                        added += value.untyped_storage().nbytes()
            return added

        for i, step in enumerate(self.steps):
            if step.view or not (step.live or step.random):
                continue
            held += run(step)
            self.peak_host_bytes = max(self.peak_host_bytes, held)
            for key in {_key(t) for t in step.writes + step.reads}:
                if self.last_use.get(key) == i:
                    if key in self.targets:
                        placed[key] = place(host(self.targets[key][0][2]))
                    gone = real.pop(key, None)
                    held -= 0 if gone is None else gone.untyped_storage().nbytes()
                    del gone
        return placed
