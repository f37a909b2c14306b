"""The flat pointwise family: which programs take one flat grid, that its index plan covers
every element once at odd sizes, that the sources compile, and (GPU) that they verify."""
from __future__ import annotations

from pathlib import Path

import pytest

from specgen.agents.builtin import build_source
from specgen.agents.builtin.families import flat
from specgen.agents.builtin.generator import lower_spec
from specgen.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"
OWN = Path(__file__).resolve().parent / "builtin_specs"
FLAT_SPECS = ["relu_odd", "leaky_relu_3d", "sigmoid_1d", "channel_affine", "batchnorm_infer", "third_slope_gate"]


def _plans(path):
    return {d: flat.plan_of(p) for d, p in lower_spec(load_spec(path)).items()}


def test_pointwise_programs_take_the_flat_grid_and_row_programs_do_not():
    plans = _plans(SPECS / "gelu_tanh.yaml")
    assert plans["forward"].loads == ("x",) and plans["forward"].stores == ("out",)
    assert set(plans["backward"].loads) == {"x", "grad_out"}
    # a [D] parameter keeps the row form (its chunks stay in registers over a thread's rows)
    assert _plans(SPECS / "bias_gelu.yaml")["forward"] is None
    assert _plans(OWN / "bias_tanh.yaml")["forward"] is None
    for op in ("softmax", "rmsnorm", "rope", "cross_entropy", "layernorm_gelu", "swiglu"):
        assert all(p is None for p in _plans(SPECS / f"{op}.yaml").values()), op
    for name in FLAT_SPECS:
        assert all(p is not None for p in _plans(OWN / f"{name}.yaml").values()), name


def _written(plan, n, vec, grid):
    """Python mirror of the flat kernel's loops: the elements each (block, thread) writes."""
    seen = [0] * n
    nvec, step = n // vec, grid * plan.block * plan.unroll
    for b in range(grid):
        for t in range(plan.block):
            c0 = b * plan.block * plan.unroll + t
            while c0 < nvec:
                for u in range(plan.unroll):
                    c = c0 + u * plan.block
                    if c < nvec:
                        for v in range(vec):
                            seen[c * vec + v] += 1
                c0 += step
            e = nvec * vec + b * plan.block + t
            while e < n:
                seen[e] += 1
                e += grid * plan.block
    return seen


@pytest.mark.parametrize("n, vec, grid", [(1, 4, 1), (7, 8, 1), (4099, 4, 2), (8195, 8, 1), (12345, 4, 3),
                                          (100003, 8, None)])
def test_every_element_is_written_once_at_odd_sizes(n, vec, grid):
    plan = flat.FlatPlan(("x",), (), ("out",))
    grid = grid or plan.grid(n, vec, sm_count=2, per_sm=1)  # fewer blocks than chunks: grid-stride
    assert _written(plan, n, vec, grid) == [1] * n


def test_grid_is_a_block_per_256_chunks_up_to_its_waves():
    plan = flat.FlatPlan(("x",), (), ("out",))
    assert plan.grid(1 << 40, 4) == 132 * 8 * 4096  # capped: the blocks stride over the rest
    assert plan.grid(1 << 30, 4) == (1 << 30) // 4 // 256  # 4 GB of float32: aten's grid, no cap
    assert flat.FlatPlan(("x",), (), ("out",), waves=64).grid(1 << 30, 4) == 132 * 8 * 64
    assert plan.grid(4096 * 4096, 8) == 4096 * 4096 // 8 // 256  # one chunk per thread
    assert plan.grid(1000, 4) == 1
    persistent = flat.FlatPlan(("x",), (), ("out",), unroll=4, waves=1)
    assert persistent.grid(1 << 30, 4) == 132 * 8


@pytest.mark.nvcc
@pytest.mark.parametrize("name", FLAT_SPECS)
def test_flat_sources_compile(name):
    from specgen.agents.builtin.generator import compile_source

    spec = load_spec(OWN / f"{name}.yaml")
    compiled = compile_source(spec, build_source(spec))
    flat_kernels = [k for k in compiled.resources if "_flat<" in k]
    vector = [k for k in flat_kernels if ", 1>" not in k]  # the VEC = 1 fallback (misaligned views) may spill
    assert vector and all(compiled.resources[k]["spill_store_bytes"] == 0 for k in vector)


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("path", [OWN / f"{n}.yaml" for n in FLAT_SPECS] + [SPECS / "gelu_tanh.yaml"],
                         ids=lambda p: p.stem)
def test_flat_kernels_verify_on_the_gpu(path):
    from specgen.verify import verify_kernel

    spec = load_spec(path)
    verdict = verify_kernel(spec, build_source(spec))
    assert verdict.passed, verdict.summary()


def test_per_channel_parameters_are_read_at_each_elements_coordinates():
    """[C] statistics broadcast over [N, C, H, W]: broadcast loads of the flat grid, checked
    against the reference on the CPU."""
    from builtin_support import check_forward, own_spec

    spec = own_spec("channel_affine")
    plan = _plans(OWN / "channel_affine.yaml")["forward"]
    assert plan.loads == ("x",) and set(plan.bcasts) == {"mean", "var", "weight", "bias"}
    check_forward(spec, {"N": 2, "C": 3, "H": 5, "W": 4})
    bcast = [n for n in lower_spec(spec)["forward"].nodes() if n.op == "load" and n.attrs["kind"] == "bcast"]
    assert {n.attrs["present"] for n in bcast} == {(False, True, False, False)}


def test_batchnorm_inference_computes_on_the_channel_statistics_before_broadcasting():
    """F.batch_norm takes rsqrt(var + eps) on [C] before broadcasting it (broadcast.py keeps
    it pending until the broadcast says it spans dim 1): one flat kernel."""
    from builtin_support import check_forward, own_spec

    spec = own_spec("batchnorm_infer")
    plan = _plans(OWN / "batchnorm_infer.yaml")["forward"]
    assert plan.loads == ("x",) and set(plan.bcasts) == {"mean", "var", "weight", "bias"}
    check_forward(spec, {"N": 2, "C": 3, "H": 5, "W": 4})
    check_forward(spec, {"N": 1, "C": 4, "H": 1, "W": 7})


def test_flat_kernels_are_their_own_tuning_class():
    from specgen.agents.builtin.generator import shape_class_of
    from specgen.agents.builtin.schedule import DEFAULT_VARIANT, variants_named

    spec = load_spec(SPECS / "gelu_tanh.yaml")
    assert shape_class_of(spec, "forward", {"N": 16384, "D": 8192}, "bfloat16") == "flat"
    program = lower_spec(spec)["forward"]
    flat2, persistent, old_default = variants_named("flat2w32,flat4w1,flat1w64")
    default = flat.plan_of(program, DEFAULT_VARIANT)
    assert (default.unroll, default.waves) == (1, 4096)
    assert (flat.plan_of(program, old_default).unroll, flat.plan_of(program, old_default).waves) == (1, 64)
    assert (flat.plan_of(program, flat2).unroll, flat.plan_of(program, flat2).waves) == (2, 32)
    assert (flat.plan_of(program, persistent).unroll, flat.plan_of(program, persistent).waves) == (4, 1)
    assert build_source(spec, flat2) != build_source(spec) != build_source(spec, persistent)
    softmax = load_spec(SPECS / "softmax.yaml")  # a row program: the flat fields change nothing
    strip = lambda text: text.replace("flat2w32", "default")  # noqa: E731
    assert strip(build_source(softmax, flat2)) == build_source(softmax)


LEVEL1 = ROOT / "benchmarks" / "level1" / "specs"


def _fast_expm1(x):
    """prelude.PRELUDE_EXPM1_LOG1P's 16-bit expm1, in float32 (the hardware exp as float32 exp)."""
    import torch

    taylor = x * (1 + x * (0.5 + x * (1 / 6 + x * (1 / 24))))
    return torch.where(x.abs() < 2 ** -5, taylor, torch.exp(x) - 1)


def _fast_log1p(x):
    import torch

    taylor = x * (1 - x * (0.5 - x * (1 / 3 - x * 0.25)))
    return torch.where(x.abs() < 2 ** -5, taylor, torch.log(1 + x))


@pytest.mark.parametrize("fast, exact", [(_fast_expm1, "expm1"), (_fast_log1p, "log1p")])
def test_the_16_bit_expm1_and_log1p_stay_far_below_bf16_and_fp16_rounding(fast, exact):
    import torch

    x32 = torch.cat([torch.linspace(-0.99, 0.99, 200_001), torch.logspace(-30, 1.5, 20_001),
                     -torch.logspace(-30, 1.5, 20_001)]).float()
    truth = getattr(torch, exact)(x32.double())
    got = fast(x32).double()
    inside = truth.isfinite()  # log1p below -1 is NaN both ways
    assert got[~inside].isnan().all()
    relative = ((got - truth).abs() / truth.abs().clamp_min(1e-300))[inside].max()
    assert relative < 2 ** -16  # float16 rounds at 2^-11, bfloat16 at 2^-8
    assert fast(torch.tensor([0.0])).item() == 0.0 and fast(torch.tensor([float("nan")])).isnan().all()


def test_only_kernels_that_call_expm1_or_log1p_carry_their_fast_forms():
    from specgen.agents.builtin.prelude import PRELUDE_EXPM1_LOG1P

    for name, call in [("elu", "sg::expm1_<T>("), ("selu", "sg::expm1_<T>("), ("softplus", "sg::log1p_<T>(")]:
        source = build_source(load_spec(LEVEL1 / f"{name}.yaml"))
        assert call in source and source.count(PRELUDE_EXPM1_LOG1P) == 1, name
        assert source.index(PRELUDE_EXPM1_LOG1P) < source.index(call)  # defined before the kernels
    assert PRELUDE_EXPM1_LOG1P not in build_source(load_spec(LEVEL1 / "relu.yaml"))


@pytest.mark.nvcc
def test_a_kernel_with_the_fast_forms_compiles():
    from specgen.agents.builtin.generator import compile_source

    spec = load_spec(LEVEL1 / "elu.yaml")
    assert compile_source(spec, build_source(spec)).library.exists()


def test_a_quotient_that_cancels_exactly_gives_torchs_nan_times_inf():
    """third_slope_gate: grad * (x / 3 + 0.5) is inf * 0 = NaN at x = -1.5 (the verifier's -inf
    grads); the interpreter rounds x * (1/3) on its own, as the kernel must (next test)."""
    import torch

    from builtin_support import check_forward, own_spec
    from specgen.agents.builtin.interp import run_program

    spec = own_spec("third_slope_gate")
    check_forward(spec, {"N": 3, "D": 5})
    grad = torch.tensor([[float("inf"), float("-inf"), float("-inf"), 2.0]])
    x = torch.tensor([[-1.5, -1.5, 0.25, -1.5]])
    out = {"out": torch.full_like(x, float("nan"))}
    run_program(lower_spec(spec)["forward"], {"grad": grad, "x": x}, {}, {"N": 1, "D": 4}, out, acc=torch.float32)
    torch.testing.assert_close(out["out"], spec.reference_fn()(grad, x), equal_nan=True)
    assert out["out"][0, :2].isnan().all()


@pytest.mark.nvcc
def test_a_division_by_a_constant_is_not_contracted_into_an_fma(tmp_path):
    """x / 3 is emitted as x * (1/3) (emit.div_per_row); nvcc fused that product with the + 0.5
    into fma(x, 1/3, 0.5) = -1.5e-8 at x = -1.5, where torch's quotient rounds to -0.5 and the sum
    is 0 (inf grads gave inf where torch has NaN: hardswish_backward in bf16 on the H200, session
    34). The product is sg::mul_rn: a mul.rn of its own in the PTX."""
    import subprocess

    from specgen import abi
    from specgen.toolchain.cuda import find_cuda_toolkit

    spec = load_spec(OWN / "third_slope_gate.yaml")
    abi.write_header(spec, tmp_path)
    (tmp_path / "k.cu").write_text(build_source(spec))
    subprocess.run([str(find_cuda_toolkit().nvcc), "-O3", "-std=c++17", "-arch=sm_90", "-ptx", "-I", str(tmp_path),
                    "k.cu", "-o", "k.ptx"], cwd=tmp_path, check=True, capture_output=True)
    ptx = (tmp_path / "k.ptx").read_text()
    assert "mul.rn.f32" in ptx  # x * (1/3), rounded on its own (mul.rn is never fused by ptxas)
    assert "fma.rn.f32" not in ptx  # was fma.rn.f32 %f2, %f1, 0f3EAAAAAB, 0f3F000000
