"""Verifier version 13's new cases, found by held-out attacks-v10 on the H200 (session 38): the
hidden sizes where 48 KiB of shared memory ends, an odd twin of the largest case in every dtype,
output gradients of exactly zero, a case past 2^32 elements, CUDA graph capture at decode sizes,
and a process whose first call is in another dtype. On the CPU, with Python stand-in kernels."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import SPECS
from specgen.spec import load_spec
from specgen.verify import strategies
from specgen.verify.data import output_gradient
from specgen.verify.engine import Options, Session
from specgen.verify.isolation import LocalRunner
from specgen.verify.strategies import (boundary_sizes, call_bytes, case_elements, full_size_cases, one_row_case,
                                       smoke_case)
from specgen.verify.verdict import WRONG_RESULT, Failure


@pytest.fixture(scope="module")
def gelu():
    return load_spec(SPECS / "gelu_tanh.yaml")


def test_the_boundary_walk_meets_the_widths_where_48_kib_of_shared_memory_ends():
    sizes = boundary_sizes(1, 65536)
    assert {12288, 24576, 28672, 49152} <= set(sizes)  # 12288 x 4 bytes = 24576 x 2 bytes = 48 KiB
    assert 12288 not in boundary_sizes(1, 12000)  # only within the range


def test_the_largest_case_has_an_odd_twin_in_every_dtype():
    log_softmax = load_spec(SPECS / "log_softmax.yaml")
    cases = full_size_cases(log_softmax, seed=0)
    sig = log_softmax.signature
    largest = max(cases, key=lambda c: call_bytes(sig, c.dim_map, c.dtype))
    twins = [c for c in cases if all(v % 2 for v in c.dim_map.values())]
    assert {c.dtype for c in twins} == set(log_softmax.dtypes), [c.describe() for c in twins]
    assert all(call_bytes(sig, c.dim_map, c.dtype) <= call_bytes(sig, largest.dim_map, largest.dtype) for c in twins)
    # a bfloat16 twin of at least 2^25 elements whose rows are not a multiple of 4
    assert any(c.dtype == "bfloat16" and case_elements(sig, c.dim_map) >= 1 << 25 and c.dim_map["N"] % 4 for c in twins)


def test_zero_output_gradients_are_drawn_in_every_dtype_a_scalar_loss_included(gelu):
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(output_gradient((), torch.float32, "zeros", gen), torch.zeros(()))
    assert not output_gradient((5, 8), torch.bfloat16, "zeros", gen).any()
    cases = strategies.boundary_cases(gelu, seed=1)
    assert {c.dtype for c in cases if c.gradients == "zeros"} == set(gelu.dtypes)


def test_one_row_of_the_smallest_benchmark_shape_is_captured_too(gelu, monkeypatch):
    base = strategies.make_case({"N": 64, "D": 4096}, "float32", seed=3)
    one = one_row_case(gelu, base, seed=4)
    assert one.dim_map == {"N": 1, "D": 4096}
    assert one_row_case(gelu, one, seed=5) is None and one_row_case(gelu, None) is None

    from specgen.verify import engine

    captured = []
    monkeypatch.setattr(engine, "check_capture", lambda runner, data, fresh, deterministic, later=(): captured.append(data.case))
    session = Session(gelu, LocalRunner(gelu, _kernel(), "cpu"), Options(), lambda text: None, device="cpu")
    session.capture_few_rows("forward")
    shapes = [c.dim_map for c in captured]
    assert shapes[-1]["N"] == 1 and len(shapes) == 2  # the smallest benchmark shape (scaled), then one row of it


def test_a_case_past_2_32_elements_follows_the_one_past_2_31(gelu, monkeypatch):
    """Offsets in unsigned 32-bit arithmetic wrap only past 2^32 elements (held-out attacks-v10's
    log-softmax passed version 12's case past 2^31)."""
    monkeypatch.setattr(strategies, "INT32_ELEMENTS", 1 << 12)
    session = Session(gelu, None, Options(), lambda text: None, device="cpu")
    prepared = []

    def record(case, direction, lean=False, later=False):
        prepared.append(case)
        raise torch.OutOfMemoryError("stop here")

    monkeypatch.setattr(session, "prepare", record)
    for wraps in (31, 32):
        session.past_int32("forward", on_gpu=False, wraps=wraps)
    sizes = [c.dim_map["N"] * c.dim_map["D"] for c in prepared]  # the largest tensor's elements
    assert len(sizes) == 2 and 1 << 12 < sizes[0] <= 1 << 13 < sizes[1]
    assert "past 2^32 elements" in session.shrunk[-1]


# ------------------------------------------------------------------ the first call's dtype

def _gelu(x):
    return torch.nn.functional.gelu(x.float(), approximate="tanh").to(x.dtype)


class FrozenFirstDtype:
    """A stand-in whose "static" is set by its process's first call: a 16-bit first call freezes a
    coarse tanh (about 11 bits, as tanh.approx) for every later call, float32 included."""

    def __init__(self, spec):
        self.spec, self.coarse = spec, None

    def has(self, direction):
        return True

    def call(self, direction, tensors, scalars, dims, stream):
        if self.coarse is None:
            self.coarse = tensors["x"].dtype != torch.float32
        x = tensors["x"]
        out = _gelu(x)
        if self.coarse:  # an error of about 2^-11 relative
            out = (out.float() * (1 + 2.0 ** -11)).to(x.dtype)
        tensors["out"].copy_(out)
        return 0

    def error_name(self, code):
        return f"error {code}"

    def clear_error(self):
        pass


def _kernel():
    from verify_fakes import correct

    return correct(load_spec(SPECS / "gelu_tanh.yaml"))


def test_a_choice_frozen_by_a_16_bit_first_call_is_met_in_a_process_that_begins_so(gelu):
    processes = []

    def fresh_process(kernel):
        def start():
            runner = LocalRunner(gelu, kernel(gelu), "cpu")
            processes.append(runner)
            return runner
        return start

    said = []
    frozen = Session(gelu, LocalRunner(gelu, FrozenFirstDtype(gelu), "cpu"), Options(), said.append, device="cpu",
                     fresh_runner=fresh_process(FrozenFirstDtype))
    frozen.run_case(smoke_case(gelu, 1), "forward")  # the usual process: float32 first, exact
    with pytest.raises(Failure) as failure:
        frozen.first_call_in_each_dtype("forward")
    assert failure.value.reason == WRONG_RESULT
    assert "first call was forward in float16" in failure.value.detail
    assert any("first call is float16, then float32" in line for line in said)

    honest = Session(gelu, LocalRunner(gelu, _kernel(), "cpu"), Options(), lambda text: None, device="cpu",
                     fresh_runner=fresh_process(lambda spec: _kernel()))
    processes.clear()
    honest.first_call_in_each_dtype("forward")
    assert len(processes) == len(gelu.dtypes) - 1  # one new process per dtype but the first


def test_without_fresh_processes_the_check_is_not_run(gelu):
    session = Session(gelu, LocalRunner(gelu, FrozenFirstDtype(gelu), "cpu"), Options(), lambda text: None,
                      device="cpu")
    session.first_call_in_each_dtype("forward")  # the in-process stand-ins: no process to start
    assert session.cases == 0
    assert dataclasses.replace(smoke_case(gelu), dtype="bfloat16").dtype == "bfloat16"
