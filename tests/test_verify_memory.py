"""Full-size work planned to the GPU memory at hand (specgen/verify/memory.py): the arithmetic,
and the session's shrinking of a case that would not fit (numbers injected: no GPU here)."""
from conftest import SPECS
from specgen.spec import load_spec
from specgen.verify import memory
from specgen.verify.engine import Options, Session
from specgen.verify.strategies import case_elements, make_case


def test_elements_that_fit_leave_the_allocators_slack_and_the_comparisons_reserve():
    free = 140 * 10**9
    planned = memory.elements_that_fit(100.0, free) * 100
    assert planned + memory.COMPARE_RESERVE <= free * 0.9
    assert planned >= 0.5 * (free - memory.COMPARE_RESERVE)
    assert memory.elements_that_fit(100.0, memory.COMPARE_RESERVE // 2) == 0  # less than the reserve: nothing


def test_timed_sets_are_cut_to_what_fits_but_never_below_two():
    roomy = memory.timed_sets_that_fit(6, set_input_bytes=10**9, output_bytes=10**9, per_element=50.0,
                                       elements=10**8, available=140 * 10**9)
    assert roomy == 6
    tight = memory.timed_sets_that_fit(6, set_input_bytes=10**10, output_bytes=10**10, per_element=50.0,
                                       elements=10**9, available=140 * 10**9)
    assert 2 <= tight < 6
    assert memory.timed_sets_that_fit(6, set_input_bytes=10**11, output_bytes=10**11, per_element=50.0,
                                      elements=10**10, available=10**9) == memory.MIN_TIMED_SETS


def test_a_case_too_large_for_the_free_memory_is_shrunk_and_named(monkeypatch):
    spec = load_spec(SPECS / "gelu_tanh.yaml")
    session = Session(spec, None, Options(), lambda text: None, device="cpu")
    monkeypatch.setattr(session, "per_element", lambda direction, dtype: 100.0)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 10**10)
    top = make_case({"N": 65536, "D": 16384}, "float32", seed=1)
    fitted = session.fit_memory(top, "forward")
    assert case_elements(spec.signature, fitted.dim_map) <= memory.elements_that_fit(100.0, 10**10)
    assert fitted.dim_map != top.dim_map and session.shrunk and "65536" in session.shrunk[0]
    small = make_case({"N": 64, "D": 4096}, "float32", seed=1)
    assert session.fit_memory(small, "forward") is small and len(session.shrunk) == 1
    twice = session.fit_memory(make_case({"N": 2048, "D": 4096}, "float32", seed=1), "backward", copies=2)
    assert case_elements(spec.signature, twice.dim_map, "backward") * 2 <= memory.elements_that_fit(100.0, 10**10)


def test_a_timed_run_that_does_not_fit_retries_on_fewer_sets_then_names_the_shape():
    """An arena the GPU cannot give (the free memory moved after the plan) halves the input sets;
    below the minimum the user gets an environment error naming the shape, not a verdict."""
    from types import SimpleNamespace

    import pytest

    from specgen.errors import EnvironmentMissing
    from specgen.verify.arena import ArenaError
    from specgen.verify.engine import Session
    from specgen.verify.memory import MIN_TIMED_SETS
    from specgen.verify.strategies import make_case

    tried = []

    def run(count, fits=3):
        tried.append(count)
        if count > fits:
            raise ArenaError("cuMemCreate(48320479232 bytes) failed: CUresult 2 (CUDA_ERROR_OUT_OF_MEMORY)")
        return f"run on {count}"

    session = SimpleNamespace(spec=SimpleNamespace(path="specs/elu.yaml"), shrunk=[])
    base = make_case({"N": 4096, "D": 393216}, "float32", seed=900)
    assert Session.within_memory(session, base, "forward", 12, run) == (3, "run on 3")
    assert tried == [12, 6, 3] and "3 input sets after 6 did not fit" in session.shrunk[-1]
    with pytest.raises(EnvironmentMissing, match=r"specs/elu.yaml: the benchmark shape .*N=4096 D=393216"):
        Session.within_memory(session, base, "forward", 8, lambda n: run(n, fits=0))
    assert tried[-1] == MIN_TIMED_SETS


def test_the_past_2_31_case_is_tried_past_the_plan_and_an_out_of_memory_is_not_a_verdict(monkeypatch):
    """cross_entropy's backward past 2^31 elements planned at 1.8x what the plan allowed on the H200
    (session 29): the case is tried up to PAST_INT32_ALLOWANCE times the plan; running out of
    memory there is named in the verdict as not run, beyond the allowance it is not tried."""
    import torch

    from specgen.verify import engine, strategies

    spec = load_spec(SPECS / "gelu_tanh.yaml")
    monkeypatch.setattr(strategies, "INT32_ELEMENTS", 1 << 12)
    session = Session(spec, None, Options(), lambda text: None, device="cpu")
    case = strategies.past_int32_case(spec, 1)
    elements = case_elements(spec.signature, case.dim_map)
    available = 10**10
    per_element = memory.elements_that_fit(1.0, available) / elements  # the plan fits this many times the case
    monkeypatch.setattr(memory, "available_bytes", lambda device: available)
    prepared = []

    def out_of_memory(case, direction, lean=False, later=False):
        assert lean and not later  # a float32 truth and no working-dtype reference: data.prepare
        prepared.append(case)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 17.00 GiB")

    monkeypatch.setattr(session, "prepare", out_of_memory)
    monkeypatch.setattr(session, "per_element", lambda direction, dtype, lean, later=False: per_element * 1.8)  # 1/1.8 of it planned
    session.past_int32("forward", on_gpu=True)
    assert len(prepared) == 1 and prepared[0].dim_map == case.dim_map  # tried whole, not shrunk
    assert session.shrunk == [f"forward past 2^31 elements {prepared[0].describe()}: not run (out of memory "
                              "(CUDA out of memory. Tried to allocate 17.00 GiB))"]
    monkeypatch.setattr(session, "per_element",
                        lambda direction, dtype, lean, later=False: per_element * engine.PAST_INT32_ALLOWANCE * 1.1)
    session.past_int32("forward", on_gpu=True)
    assert len(prepared) == 1 and "planned to fit" in session.shrunk[-1]  # beyond the allowance: not tried
