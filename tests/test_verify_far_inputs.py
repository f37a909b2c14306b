"""Inputs far apart (verifier version 16, specgen/verify/far_inputs.py): every other case places a
call's tensors a few hundred bytes apart in one arena, so a kernel that reads one input through
another's pointer at a 32-bit element offset passes; held-out attacks-v11's add_rmsnorm_a read
residual as x[i + (int32)((residual - x) / sizeof(T))]. Here each tensor gets a piece of a sparse
arena 9-17 GiB from the next, in ABI order going up and going down.

On the CPU the arena is host address space reserved with MAP_NORESERVE (untouched pages cost
nothing), and the add + RMSNorm stand-ins below compute that offset from the tensors' real
addresses; where the wrapped offset points between the pieces the stand-in returns what a GPU
would (an illegal address). The VMM arena itself (cuMemAddressReserve/cuMemMap, shared by fd) is
tested only where a GPU is (`gpu` marker)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from specgen.spec import load_spec
from specgen.verify import far_inputs
from specgen.verify.engine import Options, Session, run_verification
from specgen.verify.far_inputs import (FAR_ARENAS, GAPS, GIB, ORDERS, FarLayout, check_far_inputs, far_cases, plan_far,
                                       plans_for)
from specgen.verify.isolation import LocalRunner
from specgen.verify.layout import GUARD
from specgen.verify.sparse_arena import HostSparseArena, host_bytes_at

import verify_fakes as fakes

SMALL = Options(examples=0, budget=1 << 13, seed=2, endurance=0, directions=("forward",), full_size=False)
INT32 = 1 << 31


@pytest.fixture(scope="module")
def add_rmsnorm():
    from conftest import SPECS

    return load_spec(SPECS / "add_rmsnorm.yaml")


class AddRms(fakes.PyKernel):
    """An add + RMSNorm forward stand-in; `through_x`: residual read through x's pointer at
    (residual - x) / sizeof(T) narrowed to int32, as attacks-v11's add_rmsnorm_a does."""

    def __init__(self, spec, through_x: bool = False):
        super().__init__(spec, self.forward)
        self.through_x = through_x
        self.wrapped = 0  # calls whose 32-bit offset did not reach residual

    def call(self, direction, tensors, scalars, dims, stream) -> int:
        self.scalars = scalars
        return super().call(direction, tensors, scalars, dims, stream)

    @staticmethod
    def forward(k, t, dims):
        x, residual = t["x"], t["residual"]
        if k.through_x:
            size = x.element_size()
            offset = (residual.data_ptr() - x.data_ptr()) // size
            narrowed = (offset + INT32) % (1 << 32) - INT32  # (int32_t) on the host
            address = x.data_ptr() + narrowed * size
            if address != residual.data_ptr():
                k.wrapped += 1
                raw = host_bytes_at(address, residual.numel() * size)
                if raw is None:
                    return 700  # what a GPU does between the pieces: an illegal address
                residual = raw.view(x.dtype).view(x.shape)
        s = (x + residual).double()
        rstd = torch.rsqrt(s.pow(2).mean(-1) + k.scalars["eps"])
        t["out"].copy_((s * rstd[..., None] * t["weight"].double()).to(t["out"].dtype))
        t["residual_out"].copy_(s.to(t["residual_out"].dtype))
        t["saved_rstd"].copy_(rstd.reshape(t["saved_rstd"].shape).float())
        return 0


def session_of(spec, kernel, options=SMALL) -> Session:
    return Session(spec, LocalRunner(spec, kernel, "cpu"), options, lambda text: None, "cpu")


# ------------------------------------------------------------------ placement arithmetic

@pytest.mark.parametrize("order", ORDERS)
def test_every_pair_of_tensors_lies_past_2_31_elements_of_every_dtype(order):
    sizes = [37 * 4096 * 2, 37 * 4096 * 2, 4096 * 2]  # x, residual, weight in 16 bits
    plan = plan_far(sizes, order, 2 << 20)
    datas = [piece.data for piece in plan.pieces]
    rising = datas == sorted(datas)
    assert rising == (order == "above") and (datas == sorted(datas, reverse=True)) == (order == "below")
    for i in range(len(datas)):
        for j in range(i + 1, len(datas)):
            apart = abs(datas[j] - datas[i])
            assert apart // 4 > INT32, (i, j, apart)  # past 2^31 float32 elements, so 16-bit ones too
    # somewhere past 2^32 float32 elements too (an unsigned 32-bit offset wraps there)
    assert max(abs(b - a) for a, b in zip(datas, datas[1:])) // 4 > 2 * INT32
    # the second input above the first in one order, below it in the other
    assert (datas[1] > datas[0]) == (order == "above")


def test_gaps_double_for_eight_byte_floats(add_rmsnorm):
    plain = plan_far([4096] * 2, "above", 2 << 20)
    wide = plan_far([4096] * 2, "above", 2 << 20, scale=far_inputs.gap_scale([torch.float64]))
    assert (wide.pieces[1].data - wide.pieces[0].data) // 8 > INT32
    assert wide.pieces[1].data - wide.pieces[0].data > plain.pieces[1].data - plain.pieces[0].data
    assert far_inputs.gap_scale([torch.float32, torch.bfloat16, torch.int64]) == 1


@pytest.mark.parametrize("order", ORDERS)
def test_only_the_pieces_are_mapped_and_each_is_guarded(order):
    granule = 2 << 20
    sizes = [1000, 3 << 20, 12]
    plan = plan_far(sizes, order, granule, leads=[0, 6, 0])
    assert plan.span > GAPS[0] + GAPS[1] and plan.mapped_bytes < 16 << 20  # GiBs reserved, MBs mapped
    spans = sorted((p.offset, p.offset + p.length) for p in plan.pieces)
    assert spans[0][0] == 0 and spans[-1][1] == plan.span  # the lowest piece at the start, the top at the end
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start - end >= GAPS[0]  # nothing mapped between
    for piece, size, lead in zip(plan.pieces, sizes, [0, 6, 0]):
        assert piece.offset % granule == 0 and piece.length % granule == 0
        before, after = piece.guards()
        assert before == (piece.offset, GUARD + lead) and piece.data == piece.offset + GUARD + lead
        assert after[0] == piece.data + size and after[1] >= GUARD
        assert after[0] + after[1] == piece.offset + piece.length  # the piece's slack is guarded too
    layout = FarLayout({"far_inputs": plan})
    assert layout.guards["far_inputs"] == [g for p in plan.pieces for g in p.guards()]
    assert set(layout.used) == {"workspace", "far_inputs"}  # no compact inputs arena armed meanwhile


def test_the_cases_are_small_and_moderate_in_both_orders_with_dtypes_in_turn(add_rmsnorm):
    found = far_cases(add_rmsnorm, 1 << 20, 0)
    assert [order for order, _ in found] == list(ORDERS)
    cases = [case for _, group in found for case in group]
    assert len(cases) == 4 and {c.dtype for c in cases} == set(add_rmsnorm.dtypes)
    small, moderate = found[0][1]
    assert moderate.dim_map["D"] == 4096 and small.dim_map["N"] * small.dim_map["D"] < moderate.dim_map["N"] * 4096


def test_the_host_arena_maps_its_span_lazily_and_reads_nothing_between_pieces():
    plan = plan_far([4096, 4096], "above", 64 << 10)
    arena = HostSparseArena(plan.span, plan.ranges())
    try:
        tensor = arena.tensor()
        assert tensor.numel() == plan.span > 9 * GIB
        second = plan.pieces[1]
        tensor[second.data:second.data + 4].fill_(7)
        assert host_bytes_at(arena.pointer + second.data, 4).tolist() == [7] * 4
        assert host_bytes_at(arena.pointer + second.offset - 4096, 8) is None  # between the pieces: a fault
        assert host_bytes_at(arena.pointer + plan.span + (1 << 20), 8) is None  # outside the arena
    finally:
        arena.close()


# ------------------------------------------------------------------ the check, on stand-ins

def test_an_honest_kernel_passes_with_its_tensors_far_apart(add_rmsnorm):
    kernel = AddRms(add_rmsnorm)
    session = session_of(add_rmsnorm, kernel)
    check_far_inputs(session, "forward")
    assert session.cases == 4 and not session.shrunk
    assert "far_inputs" not in session.runner.memory.arenas  # taken back after


def test_the_cheat_passes_the_compact_layout(add_rmsnorm):
    kernel = AddRms(add_rmsnorm, through_x=True)
    session = session_of(add_rmsnorm, kernel)
    for case in far_cases(add_rmsnorm, SMALL.budget, 3)[0][1]:
        session.run_case(case, "forward")
    assert kernel.wrapped == 0  # residual is always less than 2^31 elements after x there


@pytest.mark.parametrize("order", ORDERS)
def test_residual_read_through_x_at_a_32_bit_offset_is_rejected(add_rmsnorm, order, monkeypatch):
    monkeypatch.setattr(far_inputs, "ORDERS", (order,))
    kernel = AddRms(add_rmsnorm, through_x=True)
    session = session_of(add_rmsnorm, kernel)
    with pytest.raises(Exception) as caught:
        check_far_inputs(session, "forward")
    failure = caught.value
    assert getattr(failure, "reason", None) in ("crash", "wrong-result"), failure
    assert kernel.wrapped >= 1
    assert f"each {order} the one before it" in failure.detail and "9-17 GiB apart" in failure.detail
    assert "64-bit offsets" in failure.detail and "residual at +" in failure.detail


def test_a_wrapped_offset_landing_on_another_tensor_is_a_wrong_result(add_rmsnorm, monkeypatch):
    """Gaps of exactly 16 GiB: a float32 offset of 2^32 elements narrows to 0 and reads x itself."""
    monkeypatch.setattr(far_inputs, "GAPS", (16 * GIB,))
    monkeypatch.setattr(far_inputs, "plan_far", _exact_gaps(far_inputs.plan_far))
    monkeypatch.setattr(far_inputs, "far_cases", lambda spec, budget, seed: [
        ("above", [dataclasses.replace(c, dtype="float32") for c in far_cases(spec, budget, seed)[0][1][:1]])])
    kernel = AddRms(add_rmsnorm, through_x=True)
    with pytest.raises(Exception) as caught:
        check_far_inputs(session_of(add_rmsnorm, kernel), "forward")
    assert caught.value.reason == "wrong-result", caught.value
    assert caught.value.counterexample.output in ("out", "residual_out", "saved_rstd")


def _exact_gaps(plan):
    """plan_far with each gap shortened by the piece before it: data exactly GAPS apart."""
    def planned(nbytes, order, granule, **kw):
        first = plan(nbytes, order, granule, **kw)
        length = max(p.length for p in first.pieces)
        return plan([length - 2 * GUARD] * len(nbytes), order, granule,
                    gaps=tuple(g - length for g in far_inputs.GAPS), **kw)
    return planned


def test_the_engine_runs_it_after_the_smoke_case(add_rmsnorm):
    verdict = run_verification(add_rmsnorm, AddRms(add_rmsnorm, through_x=True), SMALL, device="cpu")
    assert verdict.reason in ("crash", "wrong-result") and "GiB apart" in verdict.detail, verdict.summary()
    assert "phase_s smoke+capture" in verdict.timings  # the smoke case and the capture passed before it


def test_where_the_arenas_cannot_be_set_up_the_check_is_named_as_not_run(add_rmsnorm, monkeypatch):
    from specgen.verify.arena import ArenaError

    def refused(span, pieces):
        raise ArenaError("cannot reserve address space here")
    monkeypatch.setattr("specgen.verify.sparse_arena.HostSparseArena", refused)
    session = session_of(add_rmsnorm, AddRms(add_rmsnorm, through_x=True))
    check_far_inputs(session, "forward")
    assert session.cases == 0
    assert any("inputs 9-17 GiB apart: not run (cannot reserve" in line for line in session.shrunk), session.shrunk


def test_the_plans_hold_the_largest_case_at_each_place(add_rmsnorm):
    session = session_of(add_rmsnorm, AddRms(add_rmsnorm))
    order, cases = far_cases(add_rmsnorm, SMALL.budget, 1)[0]
    datas = [session.prepare(case, "forward") for case in cases]
    plans = plans_for(datas, order, 64 << 10)
    for name, piece in zip(datas[0].inputs, plans[FAR_ARENAS["inputs"]].pieces):
        assert piece.nbytes == max(d.inputs[name].numel() * d.inputs[name].element_size() for d in datas)
    assert len(plans[FAR_ARENAS["outputs"]].pieces) == len(datas[0].outputs)


def test_the_pieces_cross_to_the_candidate_in_batches_of_at_most_8_descriptors():
    from types import SimpleNamespace

    from specgen.verify.sparse_arena import MAX_FDS, far_messages

    pieces = [(k << 21, 1 << 21) for k in range(11)]
    arena = SimpleNamespace(span=11 << 21, fds=list(range(100, 111)))
    sent = list(far_messages("far_inputs", arena, pieces, readonly=True))
    assert [len(fds) for _, fds in sent] == [MAX_FDS, 3] and MAX_FDS == 8
    assert [m["first"] for m, _ in sent] == [True, False] and all(m["readonly"] for m, _ in sent)
    assert [tuple(p) for m, _ in sent for p in m["pieces"]] == pieces
    assert [fd for _, fds in sent for fd in fds] == arena.fds


def test_the_candidate_refuses_without_killing_itself_and_closes_every_descriptor(monkeypatch):
    import os

    from specgen.verify import sparse_arena
    from specgen.verify.arena import ArenaError

    def no_driver(*args, **kw):
        raise ArenaError("cannot load the CUDA driver (libcuda.so.1)")
    monkeypatch.setattr(sparse_arena.SparseArena, "__init__", no_driver)
    read, write = os.pipe()
    closed = []
    old = type("Old", (), {"close": lambda self: closed.append("old")})()
    arenas = {"far_outputs": (old, None)}
    reply = sparse_arena.serve_far_arenas(arenas, {"op": "far_arenas", "drop": ["far_outputs"], "name": "far_inputs",
                                                   "span": 1 << 34, "readonly": True, "first": True,
                                                   "pieces": [[0, 1 << 21], [1 << 33, 1 << 21]]}, [read, write], 0)
    assert reply["type"] == "refused" and "libcuda" in reply["message"]  # not fatal: the judge names it not run
    assert closed == ["old"] and arenas == {}
    for fd in (read, write):
        with pytest.raises(OSError):
            os.fstat(fd)


# ------------------------------------------------------------------ on a GPU

@pytest.mark.gpu
def test_a_sparse_arena_shared_by_fd_maps_pieces_gib_apart():
    import os

    from specgen.verify.arena import granularity
    from specgen.verify.sparse_arena import SparseArena, far_messages, serve_far_arenas

    device = torch.cuda.current_device()
    plan = plan_far([4096, 4096, 4096], "below", granularity(device))
    judge = SparseArena.create(plan.span, plan.ranges(), device)
    arenas: dict = {}
    try:
        # GiBs reserved, a few MB mapped (the arena's own count: the device's free memory moves with
        # whatever else runs on the GPU, as the other gputests shard did on the H100 in session 45)
        assert plan.span > 9 * GIB and judge.mapped_bytes < 64 << 20, (plan.span, judge.mapped_bytes)
        for message, fds in far_messages("far_inputs", judge, plan.ranges(), readonly=True):
            copies = [os.dup(fd) for fd in fds]  # (what the channel hands the candidate's process)
            assert serve_far_arenas(arenas, message, copies, device) == {"type": "ok"}
        mine, theirs = judge.tensor(), arenas["far_inputs"][1]
        for index, piece in enumerate(plan.pieces):
            mine[piece.data:piece.data + 16].fill_(index + 1)
        torch.cuda.synchronize()
        for index, piece in enumerate(plan.pieces):
            assert theirs[piece.data:piece.data + 16].tolist() == [index + 1] * 16
        assert theirs[plan.pieces[0].data:].data_ptr() - theirs[plan.pieces[1].data:].data_ptr() > 8 * GIB
    finally:
        serve_far_arenas(arenas, {"op": "far_arenas", "drop": ["far_inputs"]}, [], device)
        judge.close()


@pytest.mark.gpu
def test_an_honest_kernel_passes_far_apart_on_a_gpu(add_rmsnorm):
    session = Session(add_rmsnorm, LocalRunner(add_rmsnorm, AddRms(add_rmsnorm), "cuda"), SMALL, lambda text: None,
                      "cuda")
    check_far_inputs(session, "forward")
    assert session.cases == 4 and not session.shrunk


def _isolated_session(spec, source, tmp_path, directions):
    """A Session whose runner is the candidate's own process with `source` compiled and loaded."""
    from specgen.verify import static_checks
    from specgen.verify.isolation import started_runner

    verdict, compiled = static_checks(spec, source, cache_dir=tmp_path)
    assert verdict is None, verdict.summary()
    runner = started_runner(spec)
    runner.wait_ready()
    assert not runner.load(compiled.library).fatal
    options = Options(examples=0, seed=2, endurance=0, directions=directions, full_size=False)
    return Session(spec, runner, options, lambda text: None, "cuda")


@pytest.mark.gpu
@pytest.mark.nvcc
def test_the_committed_add_rmsnorm_passes_far_apart_in_its_own_process(add_rmsnorm, tmp_path):
    from conftest import SPECS

    session = _isolated_session(add_rmsnorm, SPECS / "kernels" / "add_rmsnorm.cu", tmp_path, ("forward", "backward"))
    try:
        for direction in ("forward", "backward"):
            check_far_inputs(session, direction)
        assert session.cases == 8 and not session.shrunk, session.shrunk
    finally:
        session.runner.close()


@pytest.mark.gpu
@pytest.mark.nvcc
def test_attacks_v11_add_rmsnorm_a_is_rejected_far_apart(tmp_path):
    """(attacks-v11 is spoiled: read after its first contact, a regression set.)"""
    from conftest import REPO

    spec = load_spec(REPO / "heldout" / "attacks-v11" / "specs" / "add_rmsnorm.yaml")
    session = _isolated_session(spec, REPO / "heldout" / "attacks-v11" / "add_rmsnorm_a.cu", tmp_path, ("forward",))
    try:
        with pytest.raises(Exception) as caught:
            check_far_inputs(session, "forward")
        assert caught.value.reason in ("crash", "wrong-result"), caught.value
        assert "64-bit offsets" in caught.value.detail
    finally:
        session.runner.close()
