"""The builtin agent: readable source implementing the ABI, refusals, the no-GPU flow."""
from __future__ import annotations

import re
import shutil
from types import SimpleNamespace
from pathlib import Path

import pytest

from specgen import abi, lock
from specgen.agents.base import AgentExhausted, AgentRefused, KernelTask
from specgen.agents.builtin import BuiltinAgent, build_source, generate_builtin
from specgen.spec import load_spec

SPECS = Path(__file__).resolve().parent.parent / "specs"


def _task(spec) -> KernelTask:
    return KernelTask(spec, abi.header_text(spec), abi.header_filename(spec))


def test_source_defines_both_entry_points_and_dispatches_dtypes():
    spec = load_spec(SPECS / "layernorm_gelu.yaml")
    source = build_source(spec)
    assert f'#include "{abi.header_filename(spec)}"' in source
    for direction in ("forward", "backward"):
        assert f'extern "C" cudaError_t {abi.entry_point(spec, direction)}(' in source
    for code in ("SPECGEN_FLOAT32", "SPECGEN_FLOAT16", "SPECGEN_BFLOAT16"):
        assert f"case {code}" in source
    assert "finalize_cols" in source  # weight/bias grads: the deterministic two-stage reduction
    assert "atomicAdd" not in source
    assert "// Schedule:" in source  # the schedule choice is commented


def test_cross_entropy_loss_is_a_two_stage_global_reduction():
    source = build_source(load_spec(SPECS / "cross_entropy.yaml"))
    assert "cross_entropy_fwd_finalize_global" in source and "atomicAdd" not in source


def test_agent_proposes_once_then_is_exhausted():
    spec = load_spec(SPECS / "softmax.yaml")
    agent = BuiltinAgent()
    candidate = agent.propose(_task(spec), [])
    assert candidate.agent == "builtin" and "softmax_forward" in candidate.source
    with pytest.raises(AgentExhausted):
        agent.propose(_task(spec), [object()])


def test_agent_refuses_matmul_by_op_and_line():
    spec = load_spec(SPECS / "linear_bias_relu.yaml")
    with pytest.raises(AgentRefused, match=r"linear_bias_relu.yaml:13.*LLM agent"):
        BuiltinAgent().propose(_task(spec), [])


@pytest.mark.nvcc
@pytest.mark.slow
def test_generate_without_gpu_compiles_and_locks_without_records(tmp_path):
    shutil.copy(SPECS / "gelu_tanh.yaml", tmp_path / "gelu_tanh.yaml")
    spec = load_spec(tmp_path / "gelu_tanh.yaml")
    result = generate_builtin(spec, gpu=False)
    assert result.library.exists()
    assert result.kernel_path == tmp_path / "kernels" / "gelu_tanh.cu"
    entry = lock.Lock.load(tmp_path).entry("gelu_tanh")
    assert entry.agent == "builtin" and entry.records == []
    assert lock.status(spec).state == lock.FRESH


def test_generated_source_is_the_same_in_any_process_state():
    """Kernels are committed: generating another op first must not change a kernel's text."""
    from specgen.agents.builtin.generator import build_source
    from specgen.spec import load_spec

    rmsnorm = load_spec(SPECS / "rmsnorm.yaml")
    first = build_source(rmsnorm)
    build_source(load_spec(SPECS / "softmax.yaml"))  # advances any process-wide counters
    assert build_source(rmsnorm) == first


def test_autotune_keeps_each_shape_class_from_its_fastest_verified_variant(monkeypatch):
    """The tuner on fakes (no GPU): `twopass` is fastest on medium rows, `nosplit` on split
    rows; the kept kernel takes each class's fields from its winner and is verified again."""
    import re
    from types import SimpleNamespace

    import specgen.bench
    import specgen.verify
    from specgen.agents.builtin import generator
    from specgen.agents.builtin.schedule import variants_named

    spec = load_spec(SPECS / "cross_entropy.yaml")
    verified = []

    def fake_compile(spec, source, **_):
        return SimpleNamespace(library=re.search(r"// Schedule variant: (\S+)\.", source).group(1), arch="sm_90")

    def fake_verify(spec, source, **_):
        verified.append(re.search(r"// Schedule variant: (\S+)\.", source).group(1))
        return SimpleNamespace(passed=True, summary=lambda: "ok")

    def fake_bench(spec, library, shapes=None, dtypes=None, **_):
        rows = []
        for dims, fast in [({"N": 8192, "C": 32768}, "twopass"), ({"N": 1024, "C": 131072}, "nosplit")]:
            us = 100.0 if fast in library else 150.0  # medium rows, then split rows
            rows.append(SimpleNamespace(kernel_us=us, direction="backward", dims=dims, dtype="float32"))
        return SimpleNamespace(rows=rows)

    monkeypatch.setattr(generator, "compile_source", fake_compile)
    monkeypatch.setattr(specgen.verify, "verify_kernel", fake_verify)
    monkeypatch.setattr(specgen.bench, "bench_spec", fake_bench)
    result = generator.GeneratedKernel(spec, "", "default")
    variant, source, _, verdict = generator.autotune(spec, variants_named("default,twopass,nosplit"), result=result)
    assert variant.reg_pair == "twopass" and variant.split_rows is False
    assert "exact two-pass form" in source and "SG_LAUNCH_CL(VEC" not in source.split("#define SG_LAUNCH_CL")[-1]
    assert verdict.passed and verified == ["default", "twopass", "nosplit", variant.name]
    assert any("medium rows: variant twopass fastest" in n for n in result.notes)
    assert any("split rows: variant nosplit fastest" in n for n in result.notes)


def test_autotune_tries_a_source_once_when_variants_coincide(monkeypatch):
    # csmem only changes programs with column partials: for softmax it is the default kernel
    import specgen.bench
    import specgen.verify
    from specgen.agents.builtin import generator
    from specgen.agents.builtin.schedule import variants_named

    spec = load_spec(SPECS / "softmax.yaml")
    verified = []
    monkeypatch.setattr(generator, "compile_source", lambda spec, source, **_: SimpleNamespace(
        library=re.search(r"// Schedule variant: (\S+)\.", source).group(1), arch="sm_90"))
    monkeypatch.setattr(specgen.verify, "verify_kernel", lambda spec, source, **_: verified.append(
        re.search(r"// Schedule variant: (\S+)\.", source).group(1)) or SimpleNamespace(passed=True, summary=str))
    variant, *_ = generator.autotune(spec, variants_named("default,csmem"),
                                     result=generator.GeneratedKernel(spec, "", "default"))
    assert verified == ["default"] and variant.name == "default"


def test_autotune_keeps_the_best_single_variant_when_the_combination_is_slower(monkeypatch):
    # the csmem lesson: a class's winner can owe its speed to a field of another class, so the
    # combination is timed too and loses to the best single variant when it is slower
    import specgen.bench
    import specgen.verify
    from specgen.agents.builtin import generator
    from specgen.agents.builtin.schedule import variants_named

    spec = load_spec(SPECS / "cross_entropy.yaml")
    monkeypatch.setattr(generator, "compile_source", lambda spec, source, **_: SimpleNamespace(
        library=re.search(r"// Schedule variant: (\S+)\.", source).group(1), arch="sm_90"))
    monkeypatch.setattr(specgen.verify, "verify_kernel",
                        lambda spec, source, **_: SimpleNamespace(passed=True, summary=str))

    def fake_bench(spec, library, **_):
        times = {"default": (120.0, 100.0), "twopass": (100.0, 140.0), "nosplit": (160.0, 90.0)}
        medium, split = times.get(library, (200.0, 200.0))  # the combination: slow everywhere
        return SimpleNamespace(rows=[
            SimpleNamespace(kernel_us=medium, direction="backward", dims={"N": 8192, "C": 32768}, dtype="float32"),
            SimpleNamespace(kernel_us=split, direction="backward", dims={"N": 1024, "C": 131072}, dtype="float32")])

    monkeypatch.setattr(specgen.bench, "bench_spec", fake_bench)
    result = generator.GeneratedKernel(spec, "", "default")
    variant, *_ = generator.autotune(spec, variants_named("default,twopass,nosplit"), result=result)
    assert variant.name == "default"  # geomean 109.5 us, the best single variant
    assert "medium:twopass+split:nosplit" in result.timings  # the combination was timed
    assert any("is slower than default" in n for n in result.notes)
