"""The verifier's cases: boundary sizes always present, every case legal and within budget."""
from __future__ import annotations

import pytest
from hypothesis import given, settings

from conftest import SPECS
from specgen.spec import load_spec
from specgen.verify.strategies import (boundary_cases, boundary_sizes, case_elements, case_strategy, large_case,
                                       LARGE_CASE_FACTOR,
                                       smoke_case)

SPEC_NAMES = ["gelu_tanh", "rope", "swiglu", "cross_entropy", "linear_bias_relu", "softmax"]
BUDGET = 1 << 20


def test_boundary_sizes_cover_the_edges():
    sizes = boundary_sizes(1, 16384)
    for size in (1, 31, 32, 33, 127, 128, 129, 1023, 1024, 1025, 4095, 4097, 16383, 16384):
        assert size in sizes
    assert any(s % 2 and s > 33 and s & (s - 1) for s in sizes)  # odd, not near a power of two
    assert all(1 <= s <= 16384 for s in sizes)


def test_boundary_sizes_respect_divisibility_and_range():
    assert all(s % 2 == 0 and 2 <= s <= 256 for s in boundary_sizes(2, 256, 2))
    assert boundary_sizes(5, 5) == [5]


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_boundary_cases_are_legal_within_budget_and_cover_every_dtype(name):
    spec = load_spec(SPECS / f"{name}.yaml")
    cases = boundary_cases(spec, BUDGET)
    steps = spec.signature.symbol_divisors()
    for case in cases:
        dims = case.dim_map
        for symbol, (lo, hi) in spec.dims.items():
            assert lo <= dims[symbol] <= hi and dims[symbol] % steps.get(symbol, 1) == 0
        assert case_elements(spec.signature, dims) <= BUDGET
    assert {c.dtype for c in cases} == set(spec.dtypes)
    assert any(c.offset for c in cases) and any(c.distribution != "normal" for c in cases)
    # the largest allowed size of each dim appears (others shrunk to fit the budget)
    for symbol, (lo, hi) in spec.dims.items():
        if case_elements(spec.signature, {s: (hi if s == symbol else spec.dims[s][0]) for s in spec.dims}) <= BUDGET:
            assert any(c.dim_map[symbol] == hi for c in cases), symbol
    for symbol in spec.dims:
        assert any(c.dim_map[symbol] in (31, 32, 33) for c in cases) or spec.dims[symbol][1] < 31


@pytest.mark.parametrize("name", ["rope", "swiglu"])
def test_drawn_cases_are_legal(name):
    spec = load_spec(SPECS / f"{name}.yaml")
    steps = spec.signature.symbol_divisors()

    @settings(max_examples=40, database=None, deadline=None)
    @given(case_strategy(spec, BUDGET))
    def check(case):
        dims = case.dim_map
        assert case.dtype in spec.dtypes
        assert case_elements(spec.signature, dims) <= BUDGET
        for symbol, (lo, hi) in spec.dims.items():
            assert lo <= dims[symbol] <= hi and dims[symbol] % steps.get(symbol, 1) == 0
    check()


def test_smoke_and_large_cases():
    spec = load_spec(SPECS / "softmax.yaml")
    assert smoke_case(spec).dim_map == {"N": 37, "D": 37}
    large = large_case(spec, BUDGET)
    assert case_elements(spec.signature, large.dim_map) <= BUDGET * LARGE_CASE_FACTOR
    assert large.dim_map["D"] == spec.benchmark[0]["D"]  # rows as wide as benchmarked: many blocks per row
    assert large.dim_map["N"] >= 64


@pytest.mark.parametrize("name", ["softmax", "rmsnorm", "gelu_tanh", "swiglu", "cross_entropy"])
def test_every_dtype_meets_a_misaligned_pointer_at_a_vector_friendly_size(name):
    """A kernel that picks 16-byte loads from the row size alone (D % 4 == 0 for float32)
    faults or reads wrong data on an offset view: every dtype must meet each misaligned offset
    with every dim a multiple of 16, not only at odd sizes (measured: on the H200 a float32
    softmax doing exactly that passed 618 cases when the walk paired float32 with 2^n - 1)."""
    spec = load_spec(SPECS / f"{name}.yaml")
    cases = boundary_cases(spec)
    for dtype in spec.dtypes:
        offsets = {c.offset % 8 for c in cases
                   if c.dtype == dtype and all(size % 16 == 0 for size in c.dim_map.values())}
        assert {1, 2, 3} <= offsets, (dtype, offsets)


def test_the_walk_gives_each_dtype_every_member_of_the_edge_triples():
    spec = load_spec(SPECS / "softmax.yaml")
    walked = [c for c in boundary_cases(spec) if c.dim_map["N"] in (3, 33, 1, 129)]
    for dtype in spec.dtypes:
        residues = {c.dim_map["D"] % 4 for c in walked if c.dtype == dtype and c.dim_map["D"] > 4}
        assert {0, 1, 3} <= residues, (dtype, residues)


def test_the_sizes_models_use_are_always_tried():
    """A kernel wrong only at a model's hidden size or head dim (768, 3072, 5120, 11008; 96, 160)
    meets it in the boundary walk, not only by luck in the drawn cases."""
    spec = load_spec(SPECS / "rmsnorm.yaml")
    widths = {c.dim_map["D"] for c in boundary_cases(spec)}
    assert {768, 3072, 5120, 11008, 96, 160} <= widths
    assert 16384 + 1 not in boundary_sizes(1, 16384)  # within the range only
    assert all(size % 3 == 0 for size in boundary_sizes(3, 14336, 3))  # and the divisibility


def test_full_size_cases_meet_model_sizes_at_the_longest_rows():
    """Held-out attacks-v5's cross-entropy (session 26) split rows above 65536 columns into 4096-column
    chunks and dropped the last partial one when the width is even: exact at the round benchmark
    widths and their odd twins. The full-size cases now hold the widest rows again at a model's
    size (an odd multiple of 256: Llama 3's 128256) with more than 2^24 elements."""
    from specgen.verify.strategies import full_size_cases, model_size

    spec = load_spec(SPECS / "cross_entropy.yaml")
    cases = full_size_cases(spec)
    vocab = [c for c in cases if c.dim_map["C"] == 128256]
    assert vocab and vocab[0].dim_map["N"] * 128256 >= 1 << 24
    for size in (131072, 16384, 8192, 4096, 2048, 768, 512, 300):
        got = model_size(size, 1, size, 1)
        unit = 256 if size >= 8192 else 16
        assert got % unit == 0 and (got // unit) % 2 == 1 and 0.9 * size < got < size
    assert model_size(37, 1, 100, 1) == 37 and model_size(64, 1, 64, 1) == 64  # small sizes stay (48 is 75%)
    assert model_size(4096, 1, 4096, 3) == 4096  # a divisor the unit does not honour: unchanged


def test_a_case_shrunk_to_the_gpu_memory_keeps_its_row_width(monkeypatch):
    """Held-out attacks-v5's cross-entropy miscounts chunks only at widths above 65536: a model-size
    case (15616 x 128256) shrunk for memory by halving its largest dim (C to 64128) met no chunked
    path on a crowded H200 (session 26). Rows are what kernels dispatch on: other dims give first."""
    import specgen.verify.memory as memory
    from specgen.verify.engine import Options, Session
    from specgen.verify.strategies import make_case

    spec = load_spec(SPECS / "cross_entropy.yaml")
    session = Session(spec, runner=None, options=Options(), progress=lambda text: None, device="cpu")
    monkeypatch.setattr(session, "per_element", lambda direction, dtype: 64.0)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 64 * 400_000_000)  # about 400M elements fit
    shrunk = session.fit_memory(make_case({"N": 15616, "C": 128256}, "float32"), "forward")
    assert shrunk.dim_map["C"] == 128256 and shrunk.dim_map["N"] < 15616
    assert session.shrunk and "128256" in session.shrunk[0]


def test_the_past_int32_case_holds_just_over_2_31_elements_at_the_widest_row():
    import math

    from conftest import SPECS
    from specgen.verify.strategies import past_int32_case

    spec = load_spec(SPECS / "cross_entropy.yaml")  # N up to 65536, C up to 131072
    case = past_int32_case(spec, seed=3)
    logits = case.dim_map["N"] * case.dim_map["C"]
    assert case.dim_map["C"] == 131072 and 2**31 < logits <= 2**31 + 131072
    assert case.dtype in ("float16", "bfloat16")  # the fewest bytes past the mark
    assert past_int32_case(load_spec(SPECS / "rmsnorm.yaml")) is None  # its ranges stop below the mark
    assert past_int32_case(spec, limit=math.prod(spec.dims[s][1] for s in ("N", "C"))) is None  # the ranges stop there
