"""Inputs far apart (verifier version 16): a call whose tensors lie 9 to 17 GiB apart.

Every other case places its tensors in one compact arena, in ABI order, a few hundred bytes
apart (layout.py): two inputs of a call are never 2^31 elements apart, so a kernel that reads
one input through another's pointer at a 32-bit element offset passes. Held-out attacks-v11's
add_rmsnorm_a read `residual` as `x[i + res_off]` with `res_off = (int32_t)((residual - x) /
sizeof(T))`; in a model x and residual are wherever PyTorch's caching allocator put them, often
more than 4 GiB apart at 7-70B scale, and there it is wrong everywhere or faults.

Here each input (and each output) of a case gets a piece of memory of its own in one
SparseArena (sparse_arena.py): consecutive pieces 9 GiB and 17 GiB apart in turn (2^31 and 2^32
elements of float32 lie at 8 and 16 GiB; twice that for 8-byte floats), once in ABI order going
up ("above": each tensor above the one before) and once going down ("below"), so a signed or an
unsigned 32-bit offset from any tensor to any other wraps. Only the pieces are mapped: a few MB
of memory for tens of GiB of address space. Guard bytes fill each piece around its tensor, as
everywhere (layout.py); the unmapped space between pieces faults. Per direction and order a
small case (the smoke shape) and a moderate one (the large case at a quarter of the budget),
dtypes in turn, each checked as any case is (checks.check_case).

Where the sparse arenas cannot be set up (no VMM support, out of memory, the sanitizer's
separate allocations) the check is named as not run in the verdict.
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch

from .. import abi
from ..inputs import DTYPE_NAMES
from .layout import ALIGN, GUARD, Layout, Memory, TensorRef, shape_bytes

GIB = 1 << 30
GAPS = (9 * GIB, 17 * GIB)  # address space between one tensor's piece and the next, in turn
ORDERS = ("above", "below")  # each tensor above the one before it in ABI order, or below it
HOST_GRANULE = 64 << 10  # the CPU stand-ins' piece granularity (a GPU's: arena.granularity, 2 MiB)
FAR_ARENAS = {"inputs": "far_inputs", "outputs": "far_outputs"}
HINT = ("A call's tensors lie wherever the caller's allocator put them (PyTorch's caching allocator puts two "
        "tensors of one call many GiB apart in a large model); index each tensor from its own pointer with 64-bit "
        "offsets: an offset from one tensor's pointer to another's, narrowed to 32 bits, wraps")


class FarUnavailable(RuntimeError):
    """The sparse arenas could not be set up here: the check is not run (said in the verdict)."""


# ------------------------------------------------------------------ placement arithmetic

@dataclass(frozen=True)
class Piece:
    """One tensor's mapped piece: [offset, offset + length) of the arena, its data at `data`."""

    offset: int
    length: int
    data: int
    nbytes: int

    def guards(self) -> list[tuple[int, int]]:
        """(start, length) before the data and after it: the whole piece but the tensor."""
        end = self.data + self.nbytes
        return [(self.offset, self.data - self.offset), (end, self.offset + self.length - end)]


@dataclass(frozen=True)
class FarPlan:
    order: str
    span: int  # bytes of address space the arena reserves
    pieces: tuple[Piece, ...]  # in tensor (ABI) order

    @property
    def mapped_bytes(self) -> int:
        return sum(piece.length for piece in self.pieces)

    def ranges(self) -> list[tuple[int, int]]:
        return [(piece.offset, piece.length) for piece in self.pieces]


def round_up(value: int, to: int) -> int:
    return -(-value // to) * to


def plan_far(nbytes: list[int], order: str, granule: int, *, leads: list[int] | None = None,
             scale: int = 1, gaps: tuple[int, ...] = GAPS) -> FarPlan:
    """Pieces for tensors of `nbytes` (in ABI order): each piece GUARD bytes (and its `leads`,
    an offset view's bytes) before the data and at least GUARD after, rounded up to `granule`;
    consecutive pieces `gaps` apart in turn (times `scale`), tensor 0 lowest ("above") or highest
    ("below")."""
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}")
    leads = leads or [0] * len(nbytes)
    lengths = [round_up(GUARD + lead + size + GUARD, granule) for size, lead in zip(nbytes, leads)]
    walk = list(range(len(nbytes))) if order == "above" else list(reversed(range(len(nbytes))))
    offsets, at = {}, 0
    for rank, index in enumerate(walk):
        offsets[index] = at
        at += lengths[index] + (gaps[rank % len(gaps)] * scale if rank + 1 < len(walk) else 0)
    pieces = tuple(Piece(offsets[i], lengths[i], offsets[i] + GUARD + leads[i], nbytes[i]) for i in range(len(nbytes)))
    assert all(piece.data % ALIGN == (GUARD + lead) % ALIGN for piece, lead in zip(pieces, leads))
    return FarPlan(order, max(at, granule), pieces)


def gap_scale(dtypes: list[torch.dtype]) -> int:
    """Gaps are sized for 4-byte elements (9 GiB: past 2^31 of them, 17 GiB: past 2^32); 8-byte
    floats get twice the gaps."""
    floating = [torch.empty((), dtype=d).element_size() for d in dtypes if d.is_floating_point]
    return max(1, max(floating, default=4) // 4)


def plans_for(datas: list, order: str, granule: int) -> dict[str, FarPlan]:
    """One plan per far arena for the cases `datas` of one shape family (each tensor's piece
    holds the largest of the cases' tensors at that place)."""
    first = datas[0]
    inputs = [max(d.inputs[name].numel() * d.inputs[name].element_size() for d in datas) for name in first.inputs]
    outputs = [max(shape_bytes(d.outputs[i].shape, d.outputs[i].dtype) for d in datas) for i in range(len(first.outputs))]
    dtypes = [t.dtype for d in datas for t in d.inputs.values()] + [s.dtype for d in datas for s in d.outputs]
    scale = gap_scale(dtypes)
    return {FAR_ARENAS["inputs"]: plan_far(inputs, order, granule, scale=scale),
            FAR_ARENAS["outputs"]: plan_far(outputs, order, granule, scale=scale)}


def describe(plan: FarPlan, names: list[str]) -> str:
    """Where each tensor sits, in GiB from the lowest: 'x at +0.0, residual at +9.0, ...'."""
    return ", ".join(f"{name} at +{piece.data / GIB:.1f} GiB" for name, piece in zip(names, plan.pieces))


# ------------------------------------------------------------------ the arenas in a runner

class FarMemory(Memory):
    """The runner's memory while far arenas are in it: the same arenas dict (a workspace that grows
    meanwhile is the runner's), and no "unused bytes" in a far arena, whose space between the
    pieces is not mapped (the pieces' own slack is guarded: Piece.guards)."""

    def __init__(self, base: Memory, far: set[str]):
        super().__init__(base.arenas)
        self.far = far

    def unused(self, arena: str) -> tuple[int, int]:
        return (0, 0) if arena in self.far else super().unused(arena)


class FarLayout(Layout):
    """A layout over the far arenas (their guards: every piece's bytes but its tensor) and the
    workspace arena (placed as usual)."""

    def __init__(self, plans: dict[str, FarPlan]):
        super().__init__()
        self.used = {"workspace": 0, **{name: plan.span for name, plan in plans.items()}}
        self.guards = {"workspace": [], **{name: [g for piece in plan.pieces for g in piece.guards()]
                                           for name, plan in plans.items()}}


def granule_of(runner) -> int:
    device = getattr(runner, "device", None)
    if device is not None and torch.device(device).type == "cpu":
        return HOST_GRANULE
    from .arena import ArenaError, granularity

    try:
        return granularity(torch.cuda.current_device())
    except (ArenaError, RuntimeError) as error:
        raise FarUnavailable(f"no VMM allocation granularity: {error}") from None


@contextlib.contextmanager
def far_arenas(runner, plans: dict[str, FarPlan]):
    """`runner` with a sparse arena per plan (far inputs read-only where the runner maps inputs so)
    and a FarMemory, for the block; both taken back after. FarUnavailable where it cannot be set up."""
    from .arena import ArenaError
    from .isolation import IsolatedRunner, SeparateMemory
    from .sparse_arena import HostSparseArena, SparseArena, far_messages

    if isinstance(runner.memory, SeparateMemory):
        raise FarUnavailable("every tensor is an allocation of its own in this run (the sanitizer's)")
    isolated = isinstance(runner, IsolatedRunner)
    on_cpu = not isolated and torch.device(getattr(runner, "device", "cuda")).type == "cpu"
    made: dict[str, object] = {}
    sent: list[str] = []
    base = runner.memory
    try:
        try:
            for name, plan in plans.items():
                if on_cpu:
                    made[name] = HostSparseArena(plan.span, plan.ranges())
                else:
                    if isolated:
                        runner.wait_ready()
                    torch.cuda.synchronize()
                    made[name] = SparseArena.create(plan.span, plan.ranges(), torch.cuda.current_device(),
                                                    export=isolated)
            if isolated:
                for name, plan in plans.items():
                    readonly = name == FAR_ARENAS["inputs"] and runner.readonly_inputs
                    sent.append(name)  # (dropped on the way out, however far its mapping got)
                    for message, fds in far_messages(name, made[name], plan.ranges(), readonly):
                        _ask(runner, message, fds)
        except (ArenaError, torch.OutOfMemoryError) as error:
            raise FarUnavailable(str(error).splitlines()[0][:300]) from None
        runner.memory = FarMemory(base, set(plans))
        for name, arena in made.items():
            base.arenas[name] = arena.tensor()
        yield
    finally:
        runner.memory = base
        for name in made:
            base.arenas.pop(name, None)
        if isolated and sent and not runner.dead:
            with contextlib.suppress(Exception):  # a process that cannot unmap them ends with the runner
                _ask(runner, {"op": "far_arenas", "drop": sent}, ())
        for arena in made.values():
            with contextlib.suppress(Exception):
                arena.close()


def _ask(runner, message: dict, fds: tuple) -> None:
    """One far_arenas request to the candidate's process, which answers ok or says why not."""
    from .arena import ArenaError

    if runner.dead:
        raise ArenaError(f"the candidate's process is gone ({runner.dead})")
    torch.cuda.synchronize()
    runner.channel.send(message, fds=fds)
    reply = runner._receive(runner.call_timeout)
    if reply.get("type") != "ok":
        raise ArenaError(f"the candidate's process could not map the far arenas: {reply.get('message') or reply}")


def stage_far(runner, data, plans: dict[str, FarPlan], *, snapshots: bool) -> None:
    """`data` laid out in the far arenas (inputs and outputs each in its piece), its workspace in
    the workspace arena as usual, the guards armed, the inputs copied in."""
    from .data import bind_inputs, place_workspace

    inputs, outputs = plans[FAR_ARENAS["inputs"]], plans[FAR_ARENAS["outputs"]]
    data.input_refs = {name: TensorRef(FAR_ARENAS["inputs"], piece.data, tuple(tensor.shape), _name(tensor.dtype))
                       for (name, tensor), piece in zip(data.inputs.items(), inputs.pieces)}
    data.output_refs = {slot.name: TensorRef(FAR_ARENAS["outputs"], piece.data, tuple(slot.shape), _name(slot.dtype))
                        for slot, piece in zip(data.outputs, outputs.pieces)}
    layout = FarLayout(plans)
    runner.memory.layout = layout
    place_workspace(runner, [data], [data.output_refs], layout, 1)
    runner.memory.arm_guards()
    bind_inputs(runner, data)
    data.snapshots = {name: t.clone() for name, t in data.storages.items()} if snapshots else {}


def _name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES[dtype]


# ------------------------------------------------------------------ the check

def far_cases(spec, budget: int, seed: int):
    """(order, cases) per order: the smoke shape and a moderate case (the large case at a quarter of
    the budget), the spec's dtypes in turn over all four."""
    from .strategies import large_case, smoke_case

    small = smoke_case(spec, seed)
    moderate = large_case(spec, max(budget // 4, 1), seed + 1)
    shapes = [small] if moderate.dims == small.dims else [small, moderate]
    turn = 0
    found = []
    for order in ORDERS:
        cases = []
        for shape in shapes:
            cases.append(dataclasses.replace(shape, dtype=spec.dtypes[turn % len(spec.dtypes)], seed=seed + 10 + turn))
            turn += 1
        found.append((order, cases))
    return found


def check_far_inputs(session, direction: str) -> None:
    """Every case of far_cases with its tensors far apart (far_arenas), checked as any case; a
    failure names the placement and the fix."""
    from .checks import check_case
    from .verdict import Failure

    runner, spec = session.runner, session.spec
    where = f"{direction}: inputs 9-17 GiB apart"
    for order, cases in far_cases(spec, session.options.budget, session.options.seed + 8100):
        datas = [session.prepare(case, direction) for case in cases]
        try:
            plans = plans_for(datas, order, granule_of(runner))
            with far_arenas(runner, plans):
                for data in datas:
                    session.progress(f"{direction}: each input and output {order} the one before, 9-17 GiB apart, "
                                     f"{data.case.describe()}")
                    stage_far(runner, data, plans, snapshots=not runner.readonly_inputs)
                    session.cases += 1
                    try:
                        check_case(runner, data, deterministic=spec.deterministic,
                                   stats=session.stats(data.case, direction, data))
                    except Failure as failure:
                        raise Failure(failure.reason, f"{placement_words(spec, direction, data, plans, order)}: "
                                                      f"{failure.detail}. {HINT}", failure.counterexample,
                                      fatal=failure.fatal) from None
        except FarUnavailable as why:
            session.not_run(where, str(why))
            return
        del datas  # (views of the far arenas, unmapped now)


def placement_words(spec, direction: str, data, plans: dict[str, FarPlan], order: str) -> str:
    way = "above" if order == "above" else "below"
    inputs = describe(plans[FAR_ARENAS["inputs"]], list(data.inputs))
    return (f"{abi.entry_point(spec, direction)} with its tensors far apart in the address space, each {way} the one "
            f"before it in the ABI's order, 9-17 GiB apart (inputs: {inputs}; the outputs likewise)")
