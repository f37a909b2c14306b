"""Verifier v3 on the CPU (issue 11): value classes, drawn scalars, size sweeps, the capture
check, the timed phase, per-element tolerance, physics, guard bytes, the lock's refusal, and
the candidate's process holding no checking code. The GPU side: scripts/gpu-suite verify."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

import verify_fakes as fakes
from conftest import SPECS
from specgen.spec import load_spec
from specgen.verify.engine import Options, run_verification

SMALL = Options(examples=4, budget=1 << 13, seed=1)


@pytest.fixture(scope="module")
def gelu():
    return load_spec(SPECS / "gelu_tanh.yaml")


@pytest.fixture(scope="module")
def rmsnorm(tmp_path_factory):
    # the fakes below write out only (the example spec also saves rstd since session 12)
    from builtin_support import without_saved

    return without_saved(SPECS / "rmsnorm.yaml", tmp_path_factory.mktemp("plain"))


def verdict_of(spec, kernel, options=SMALL):
    return run_verification(spec, kernel, options, device="cpu")


@pytest.mark.parametrize("impl", [fakes.nan_inf_to_zero, fakes.flushes_huge])
def test_value_classes_catch_kernels_that_clean_up_their_inputs(gelu, impl):
    verdict = verdict_of(gelu, fakes.PyKernel(gelu, impl))
    assert verdict.reason == "wrong-result", verdict.summary()
    assert verdict.counterexample.case["distribution"] in ("specials", "huge")


def test_a_kernel_wrong_for_a_band_of_widths_meets_the_sweep(gelu):
    verdict = verdict_of(gelu, fakes.PyKernel(gelu, fakes.wrong_for_mid_widths), Options(examples=0, budget=1 << 15))
    assert verdict.reason == "wrong-result", verdict.summary()
    assert 5000 <= verdict.counterexample.case["dims"]["D"] < 6000


def test_a_hard_coded_eps_fails_once_eps_is_drawn(rmsnorm):
    kernel = fakes.RmsKernel(rmsnorm, fakes.rmsnorm_forward_fixed_eps, fakes.rmsnorm_backward)
    verdict = verdict_of(rmsnorm, kernel)
    assert verdict.reason == "wrong-result", verdict.summary()
    assert verdict.counterexample.case["scalars"]["eps"] != 1e-6


def test_an_honest_rmsnorm_passes_with_drawn_eps(rmsnorm):
    def forward(k, t, dims):
        x = t["x"].float()
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + k.last_eps)
        t["out"].copy_((y * t["weight"].float()).to(t["out"].dtype))

    verdict = verdict_of(rmsnorm, fakes.RmsKernel(rmsnorm, forward, fakes.rmsnorm_backward))
    assert verdict.passed, verdict.summary()


def test_a_call_that_cannot_be_captured_is_rejected(gelu):
    verdict = verdict_of(gelu, fakes.NotCapturable(gelu, fakes.gelu_forward))
    assert verdict.reason == "not-capturable", verdict.summary()
    assert "CUDA graph" in verdict.detail


def test_a_kernel_idle_after_many_calls_is_caught_by_the_timed_phase(gelu):
    verdict = verdict_of(gelu, fakes.PyKernel(gelu, fakes.idle_after_calls), Options(examples=0, budget=1 << 13))
    assert verdict.reason in ("post-timing-mismatch", "unwritten-output", "nondeterministic"), verdict.summary()
    assert not verdict.passed


def test_a_kernel_wrong_after_thousands_of_calls_is_caught_by_the_endurance_run(gelu):
    kernel = fakes.PyKernel(gelu, fakes.wrong_after_many_calls)
    options = Options(examples=0, budget=1 << 12, full_size=False, directions=("forward",))
    assert verdict_of(gelu, kernel, dataclasses.replace(options, endurance=0)).passed  # too few calls to see it
    kernel.calls = 0
    verdict = verdict_of(gelu, kernel, dataclasses.replace(options, endurance=4000))
    assert verdict.reason == "wrong-result", verdict.summary()
    assert "after 4000 calls in a row" in verdict.detail
    assert kernel.calls >= 4000


def test_calls_faster_on_inputs_seen_before_are_a_memory_of_inputs():
    from specgen.verify.timed import TimedRun, check_no_memory_of_inputs
    from specgen.verify.verdict import Failure

    def run(us):
        return TimedRun([us / 1e3] * 5, floor_us=1.0, checked_calls=5)

    with pytest.raises(Failure) as caught:  # a cache of results served on repeats: 2.5x faster
        check_no_memory_of_inputs(run(250.0), run(100.0), "N=64 D=4096")
    assert caught.value.reason == "remembers-inputs" and "2.50x" in caught.value.detail
    check_no_memory_of_inputs(run(250.0), run(240.0), "N=64 D=4096")  # timing noise
    check_no_memory_of_inputs(run(6.0), run(4.0), "N=1 D=4096")  # decode-size jitter, under the slack
    check_no_memory_of_inputs(run(100.0), run(130.0), "N=64 D=4096")  # slower on repeats: not a cache


def test_a_fresh_run_that_looks_remembered_is_timed_again_before_the_verdict():
    """The six fresh calls can meet a GPU with low clocks after idle: new sets, timed after the
    cadence warmed it, decide. A cache of results is slow on those too."""
    from specgen.verify.timed import TimedRun, judge_memory_of_inputs
    from specgen.verify.verdict import Failure

    def run(us):
        return TimedRun([us / 1e3] * 5, floor_us=1.0, checked_calls=5)

    again = []
    judged = judge_memory_of_inputs(run(144.5), run(41.2), "N=8 C=4096", lambda: again.append(1) or run(42.0))
    assert again == [1] and judged.median_us == pytest.approx(42.0)  # honest: slow clocks, then steady
    assert judge_memory_of_inputs(run(250.0), run(240.0), "N=64", lambda: pytest.fail("no second look")).median_us \
        == pytest.approx(250.0)
    with pytest.raises(Failure) as caught:  # a cache: new sets are slow again
        judge_memory_of_inputs(run(250.0), run(100.0), "N=64 D=4096", lambda: run(255.0))
    assert caught.value.reason == "remembers-inputs" and "2.55x" in caught.value.detail


def test_the_tolerance_record_names_the_largest_error_and_widening(gelu):
    verdict = verdict_of(gelu, fakes.PyKernel(gelu, fakes.gelu_forward))
    assert verdict.passed, verdict.summary()
    entry = verdict.tolerances["forward float32"]
    assert entry["max_abs_error"] >= 0 and "max_widening" in entry
    assert "largest error of the kernel" in verdict.summary()


# ------------------------------------------------------------------ strategies

def test_the_sweep_leaves_no_gap_of_20_percent():
    from specgen.verify.strategies import sweep_sizes

    sizes = sweep_sizes(1, 16384)
    assert sizes[-1] == 16384
    assert all(b <= a * 1.2 for a, b in zip(sizes, sizes[1:]))
    assert any(5000 <= s < 6000 for s in sizes)


def test_full_size_cases_cover_benchmark_shapes_and_range_tops(rmsnorm):
    from specgen.verify.strategies import full_size_cases

    cases = full_size_cases(rmsnorm)
    dims = [c.dim_map for c in cases]
    for shape in rmsnorm.benchmark:
        assert {k: int(v) for k, v in shape.items()} in dims
    assert any(d["N"] == rmsnorm.dims["N"][1] for d in dims)
    assert any(d["D"] == rmsnorm.dims["D"][1] for d in dims)


def test_full_size_cases_include_an_odd_twin_of_the_largest(rmsnorm):
    """A path taken only above some size that drops the tail after its last whole chunk meets no
    tail at round benchmark shapes and range tops (held-out attacks-v2, session 21)."""
    import math

    from specgen.verify.strategies import call_bytes, full_size_cases

    cases = full_size_cases(rmsnorm)
    sig = rmsnorm.signature
    odd_at = next(i for i, c in enumerate(cases) if all(v % 2 for v in c.dim_map.values()))
    round_cases, odd = cases[:odd_at], cases[odd_at]  # (the model-size twins follow it)
    largest = max(round_cases, key=lambda c: call_bytes(sig, c.dim_map, c.dtype))
    assert odd.dtype != largest.dtype  # the next dtype (bfloat16 here: not wider than float32)
    for s, v in odd.dim_map.items():
        assert abs(v - largest.dim_map[s]) == 1 and rmsnorm.dims[s][0] <= v <= rmsnorm.dims[s][1]
    assert math.prod(odd.dim_map.values()) % 1024 != 0


def test_the_odd_twin_is_never_wider_than_the_case_it_twins(tmp_path):
    from specgen.spec import load_spec
    from specgen.verify.strategies import call_bytes, full_size_cases

    path = tmp_path / "narrow.yaml"
    path.write_text('name: narrow\ndescription: d\nsignature: "narrow(x: Tensor[N, D]) -> Tensor[N, D]"\n'
                    "dtypes: [bfloat16, float32]\ndims: {N: [1, 65536], D: [1, 16384]}\n"
                    "reference: |\n  def reference(x):\n      return x\n"
                    "benchmark:\n  - {N: 65536, D: 16384}\n")
    spec = load_spec(path)
    cases = full_size_cases(spec)
    odd = next(c for c in cases if all(v % 2 for v in c.dim_map.values()))
    assert odd.dim_map == {"N": 65535, "D": 16383} and odd.dtype == "bfloat16"
    assert call_bytes(spec.signature, odd.dim_map, odd.dtype) < call_bytes(spec.signature, cases[0].dim_map, "float32")


def test_scalars_are_drawn_within_their_range():
    import random

    from specgen.inputs import draw_scalar, scalar_range
    from specgen.signature import parse_signature

    sig = parse_signature("f(x: Tensor[N], eps: float = 1e-6 in [1e-12, 1e-2], a: float = 0.5, "
                          "b: float = 0.0, k: int = 2, flag: bool = False) -> Tensor[N]")
    eps, a, b, k, flag = sig.scalars
    assert scalar_range(eps) == (1e-12, 1e-2) and scalar_range(a) == (0.05, 5.0)
    assert scalar_range(b) is None and scalar_range(k) is None
    rng = random.Random(0)
    draws = [draw_scalar(eps, rng) for _ in range(200)]
    assert all(1e-12 <= v <= 1e-2 for v in draws) and min(draws) < 1e-9 < 1e-4 < max(draws)
    assert {draw_scalar(flag, rng) for _ in range(50)} == {True, False}
    assert draw_scalar(k, rng) == 2


def test_value_classes_make_what_they_say():
    from specgen.inputs import _values

    gen = torch.Generator().manual_seed(0)
    specials = _values((20000,), "specials", gen, "float32")
    assert specials.isnan().any() and (specials == float("inf")).any() and (specials == float("-inf")).any()
    huge = _values((20000,), "huge", gen, "float16").to(torch.float16)
    assert bool(torch.isfinite(huge).all()) and float(huge.abs().min()) >= 999
    denormal = _values((20000,), "denormal", gen, "float32").float()
    tiny = (denormal != 0) & (denormal.abs() < torch.finfo(torch.float32).smallest_normal)
    assert int(tiny.sum()) > 5000
    outliers = _values((64, 4096), "outliers", gen, "bfloat16")
    big = outliers.abs() >= 999
    assert 100 <= int(big.sum()) <= 600 and float(outliers.abs().max()) <= 1e4  # rare, 1e3-1e4
    # whole 16 x 16 tiles hold only ordinary values: a kernel that skips 'negligible' tiles meets them
    tiles = big.reshape(4, 16, 256, 16).any(dim=3).any(dim=1)
    assert int((~tiles).sum()) > 0.5 * tiles.numel()
    assert int((_values((3,), "outliers", gen, "float16").abs() >= 99).sum()) >= 1  # one even in 3 elements
    assert float(_values((100000,), "outliers", gen, "float16").abs().max()) <= 1e3
    rounded = _values((4096,), "rounded", gen, "float32").float()
    assert bool(((rounded.view(torch.int32) & 0xFFFF) == 0).all()) and float(rounded.std()) > 0.5  # bf16 values


# ------------------------------------------------------------------ physics and the lock

def test_physics_floor_rejects_a_time_faster_than_the_memory(gelu):
    from specgen.verify.physics import floor, violation

    bound = floor(gelu, {"N": 16384, "D": 8192}, "bfloat16", "forward")
    assert bound.bytes_counted >= 16384 * 8192 * 2  # every input byte at least
    assert violation(bound.us * 0.5, bound) is not None
    assert "faster than physics" in violation(bound.us * 0.5, bound)
    assert violation(bound.us * 1.2, bound) is None  # an honest kernel near the peak passes


def test_physics_floor_does_not_count_an_input_the_outputs_do_not_depend_on(tmp_path):
    # a held-out mean over all axes (session 11): its backward broadcasts the gradient, x gives only
    # the shape; an honest kernel writing grad_x at 4.5 TB/s was refused as faster than physics
    from pathlib import Path

    from specgen.verify.physics import floor, l2_bytes, tensor_bytes, unread_inputs

    mean = load_spec(Path(__file__).parent / "builtin_specs" / "mean_hw_flat.yaml")
    assert unread_inputs(mean, "backward") == {"x"}
    assert unread_inputs(mean, "forward") == frozenset()  # the mean reads every element
    dims = {"B": 4096, "H": 256, "W": 256}
    read, written = tensor_bytes(mean, dims, "float32", "backward", unread_inputs(mean, "backward"))
    assert read == 4096 * 4 and written == 4096 * 256 * 256 * 4  # the gradient in, grad_x out
    everything = sum(tensor_bytes(mean, dims, "float32", "backward"))  # x counted too: 2 GB
    assert read + written - l2_bytes() <= floor(mean, dims, "float32", "backward").bytes_counted < everything - 2 ** 29
    cross_entropy = load_spec(SPECS / "cross_entropy.yaml")  # logits and targets both matter
    assert unread_inputs(cross_entropy, "backward") & {"logits", "target"} == set()
    ignored = tmp_path / "ignores_y.yaml"
    ignored.write_text((Path(__file__).parent / "builtin_specs" / "mean_hw_flat.yaml").read_text()
                       .replace("name: mean_hw_flat", "name: ignores_y")
                       .replace("mean_hw_flat(x: Tensor[B, H, W], scale", "ignores_y(x: Tensor[B, H, W], y: Tensor[B], scale")
                       .replace("def reference(x, scale=2.0):", "def reference(x, y, scale=2.0):"))
    assert unread_inputs(load_spec(ignored), "forward") == {"y"}


NLL = """\
name: nll_gather
description: Mean negative log-likelihood of the target class per row (a gather, then a mean).
signature: "nll_gather(logp: Tensor[N, C], target: Tensor[N] int64 in [0, C)) -> Tensor[] float32"
dtypes: [float32]
dims: {N: [1, 16384], C: [2, 32768]}
reference: |
  import torch

  def reference(logp, target):
      work = torch.float64 if logp.dtype == torch.float64 else torch.float32
      return -logp.to(work).gather(1, target[:, None]).mean()
"""


LM_SHIFT = """\
name: lm_shift_ce
description: Causal LM loss, logits shifted by one against next-token targets.
signature: "lm_shift_ce(logits: Tensor[B, T, V], labels: Tensor[B, T] int64 in [0, V)) -> Tensor[] float32"
dtypes: [float32]
dims: {B: [1, 16], T: [2, 4096], V: [2, 65536]}
reference: |
  import torch
  import torch.nn.functional as F

  def reference(logits, labels):
      work = torch.float64 if logits.dtype == torch.float64 else torch.float32
      V = logits.shape[-1]
      return F.cross_entropy(logits[:, :-1].to(work).reshape(-1, V), labels[:, 1:].reshape(-1))
"""


FIRST20 = """\
name: first20
description: The mean of the first 20 features of each row.
signature: "first20(x: Tensor[N, D]) -> Tensor[N] float32"
dtypes: [float32]
dims: {N: [1, 16384], D: [20, 8192]}
reference: |
  import torch

  def reference(x):
      work = torch.float64 if x.dtype == torch.float64 else torch.float32
      return x[:, :20].to(work).mean(-1)
"""


def test_physics_floor_counts_an_input_read_in_part_at_its_fraction_or_not_at_all(tmp_path):
    # held-out nll_loss (H200, session 18): an honest gather kernel at 85 us was refused as faster
    # than physics, the floor counting all 2.1 GB of logp where a correct kernel reads N elements
    from specgen.verify.physics import floor, read_fractions, tensor_bytes, unread_inputs

    path = tmp_path / "nll_gather.yaml"
    path.write_text(NLL)
    nll = load_spec(path)
    assert unread_inputs(nll, "forward") == {"logp"}  # the int64 targets stay counted
    dims = {"N": 16384, "C": 32768}
    assert floor(nll, dims, "float32", "forward").us < 85.31 / 10
    assert sum(tensor_bytes(nll, dims, "float32", "forward")) > 2 * 10 ** 9  # what was counted before
    # an LM loss over logits[:, :-1] needs all but one position: counted at the probed fraction
    # (the red team's case: dropping such an input left a 2 GB loss with a floor of 0.02 us)
    lm = tmp_path / "lm_shift_ce.yaml"
    lm.write_text(LM_SHIFT)
    shifted = load_spec(lm)
    assert unread_inputs(shifted, "forward") == frozenset()
    (fraction,) = read_fractions(shifted, "forward").values()
    assert 0.9 <= fraction < 1.0
    dims = {"B": 8, "T": 2048, "V": 32000}
    counted, _ = tensor_bytes(shifted, dims, "float32", "forward", frozenset(), read_fractions(shifted, "forward"))
    assert counted >= 0.9 * 8 * 2048 * 32000 * 4
    # a fixed number of columns: the share it ignores grows with the shape (17 of 37, 54 of 74),
    # so a fraction measured at the probe would overcount at 8192: not counted, as a gather
    first20 = tmp_path / "first20.yaml"
    first20.write_text(FIRST20)
    assert unread_inputs(load_spec(first20), "forward") == {"x"}
    # every element of every example op's inputs matters: their floors are unchanged
    for name in ("softmax", "rmsnorm", "cross_entropy", "swiglu", "layernorm_gelu", "rope"):
        spec = load_spec(SPECS / f"{name}.yaml")
        assert unread_inputs(spec, "forward") == frozenset(), name


PICK = """\
name: {name}
description: Mean negative log-probability at classes chosen by the scores s (a gather at computed indices).
signature: "{name}(logp: Tensor[N, C], s: Tensor[N, C]) -> Tensor[] float32"
dtypes: [float32]
dims: {{N: [1, 16384], C: [4, 32768]}}
reference: |
  import torch

  def reference(logp, s):
      work = torch.float64 if logp.dtype == torch.float64 else torch.float32
      return -logp.to(work).gather(1, {index}).mean()
"""


MASK = """\
name: {name}
description: Row sums of g where x passes a threshold (ReLU's backward, summed).
signature: "{name}(g: Tensor[N, C], x: Tensor[N, C]) -> Tensor[N] float32"
dtypes: [float32]
dims: {{N: [1, 16384], C: [4, 32768]}}
reference: |
  import torch

  def reference(g, x):
      work = torch.float64 if g.dtype == torch.float64 else torch.float32
      return torch.where({keep}, g.to(work), 0.0).sum(-1)
"""


def _written_spec(tmp_path, text: str, name: str, **fields):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text.format(name=name, **fields))
    return load_spec(path)


def test_physics_floor_counts_a_gather_at_indices_computed_from_values_as_a_gather(tmp_path):
    # logp.gather(1, s.argmax(1)) reads one element a row of logp (and all of s): the floor
    # counted all of logp, twice what an honest kernel moves at a large C
    from specgen.verify.physics import floor, read_fractions, tensor_bytes, unread_inputs

    argmax = _written_spec(tmp_path, PICK, "argmax_pick", index="s.argmax(1, keepdim=True)")
    assert unread_inputs(argmax, "forward") == {"logp"} and read_fractions(argmax, "forward") == {}
    dims = {"N": 16384, "C": 32768}
    s_bytes = 16384 * 32768 * 4
    assert tensor_bytes(argmax, dims, "float32", "forward", unread_inputs(argmax, "forward")) == (s_bytes, 4)
    assert s_bytes <= floor(argmax, dims, "float32", "forward").bytes_counted <= s_bytes + 4  # was 2 x s_bytes
    # four classes a row: half of a row of 8 read, a quarter of a row of 16: a count fixed per row
    topk = _written_spec(tmp_path, PICK, "top4_pick", index="s.topk(4, 1).indices")
    assert unread_inputs(topk, "forward") == {"logp"}


def test_physics_floor_counts_in_full_what_values_mask_or_a_share_that_does_not_shrink(tmp_path):
    # where values decide how many elements are read (a mask: ReLU's backward, a sparse threshold)
    # a kernel still reads nearly every sector; a value-chosen half of each row is half at any
    # width, not a gather's count: in doubt, all counted
    from specgen.verify.physics import read_fractions, unread_inputs

    for name, keep in (("relu_mask", "x > 0"), ("sparse_mask", "x > 1.5")):
        spec = _written_spec(tmp_path, MASK, name, keep=keep)
        assert unread_inputs(spec, "forward") == frozenset() and read_fractions(spec, "forward") == {}, name
    half = _written_spec(tmp_path, PICK, "half_pick", index="s.topk(s.shape[1] // 2, 1).indices")
    assert unread_inputs(half, "forward") == frozenset() and read_fractions(half, "forward") == {}


def test_flop_floor_counts_a_matmul_reference():
    from specgen.verify.physics import reference_flops

    spec = load_spec(SPECS / "linear_bias_relu.yaml")
    dims = {s: 256 for s in spec.signature.symbols()}
    assert reference_flops(spec, dims, "bfloat16", "forward") >= 2 * 256 ** 3


def test_the_lock_refuses_a_record_that_beat_physics_or_was_rejected(tmp_path, monkeypatch):
    from specgen.lock import LockError, Record, _check_physics

    ok = Record("h", "3", "sm_90", benchmark={"rows": [{"kernel_us": 100.0, "floor_us": 90.0}]})
    _check_physics(ok)
    for rows in ([{"kernel_us": 10.0, "floor_us": 90.0}], [{"kernel_us": 100.0, "rejected": "post-timing-mismatch: x"}]):
        with pytest.raises(LockError):
            _check_physics(Record("h", "3", "sm_90", benchmark={"rows": rows}))


# ------------------------------------------------------------------ memory and isolation

def test_guard_bytes_catch_a_write_past_a_tensor():
    from specgen.verify.layout import GUARD, Layout, Memory

    layout = Layout()
    ref = layout.place("outputs", (10,), torch.float32)
    memory = Memory({"inputs": torch.zeros(0, dtype=torch.uint8), "outputs": torch.zeros(layout.needed("outputs"),
                                                                                          dtype=torch.uint8)})
    memory.layout = layout
    memory.arm_guards()
    memory.tensor(ref).fill_(1.0)
    assert memory.broken_guards() == []
    past = ref.offset + ref.nbytes
    memory.arenas["outputs"][past] = int(memory.expected(past, 1)[0]) ^ 0xFF  # one byte past the end
    assert memory.broken_guards() and "after" in memory.broken_guards()[0]
    assert ref.offset >= GUARD


def test_a_write_megabytes_past_an_output_is_caught():
    """Every byte of the arena no tensor uses is a guard: scratch written 1 MiB past a 4-byte
    output (far beyond the GUARD bytes) is found; so is a byte in the gap alignment leaves."""
    from specgen.verify.layout import GUARD, Layout, Memory

    layout = Layout()
    first = layout.place("outputs", (1,), torch.float32)
    second = layout.place("outputs", (3,), torch.float16)
    memory = Memory({"inputs": torch.zeros(0, dtype=torch.uint8), "outputs": torch.zeros(4 << 20, dtype=torch.uint8)})
    memory.layout = layout
    memory.arm_guards()
    memory.tensor(first).fill_(2.0)
    memory.tensor(second).fill_(3.0)
    assert memory.broken_guards() == []
    far = first.offset + (1 << 20)
    memory.arenas["outputs"][far] = int(memory.expected(far, 1)[0]) ^ 0xFF
    found = memory.broken_guards()
    assert len(found) == 1 and "unused bytes" in found[0], found
    memory.arm_guards()
    gap = first.offset + first.nbytes + GUARD  # after the first tensor's guard, before the next region
    assert gap < second.offset - GUARD
    memory.arenas["outputs"][gap] = int(memory.expected(gap, 1)[0]) ^ 0xFF
    assert memory.broken_guards(), "the alignment gap between two tensors is guarded"


def test_the_guard_pattern_is_new_for_every_case_and_not_uniform():
    """A kernel that reads past its output cannot recognise the verifier by a fixed byte there."""
    from specgen.verify.layout import Layout, Memory

    layout = Layout()
    ref = layout.place("outputs", (4,), torch.float32)
    memory = Memory({"inputs": torch.zeros(0, dtype=torch.uint8), "outputs": torch.zeros(1 << 16, dtype=torch.uint8)})
    memory.layout = layout
    seen = []
    for _ in range(3):
        memory.arm_guards()
        after = memory.arenas["outputs"][ref.offset + ref.nbytes:ref.offset + ref.nbytes + 256].clone()
        assert len(set(after.tolist())) > 100  # not one repeated byte
        assert memory.broken_guards() == []
        seen.append(after)
    assert not torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2])


def test_a_stray_read_modify_write_on_a_guard_always_changes_its_bytes():
    """Small guards (`arm_guards(small=True)`, the second call of the indices-out-of-range check): read
    as any float type, at any alignment, they are small numbers, so `x -= 1e-3` at an unchecked index
    changes them (uniform bytes gave huge floats or NaN that the write left as they were: an
    unchecked cross-entropy backward write passed a third of the runs, session 37). Uniform bytes
    stay the default: a read past a tensor turns them into a wrong result."""
    from specgen.verify.layout import Layout, Memory

    layout = Layout()
    ref = layout.place("outputs", (4,), torch.float32)
    memory = Memory({"inputs": torch.zeros(0, dtype=torch.uint8), "outputs": torch.zeros(1 << 14, dtype=torch.uint8)})
    memory.layout = layout
    for _ in range(20):
        memory.arm_guards(small=True)
        raw = memory.arenas["outputs"][ref.offset + ref.nbytes:ref.offset + ref.nbytes + 264].clone()
        for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            size = torch.empty((), dtype=dtype).element_size()
            for shift in range(size):
                window = raw[shift:shift + 256].clone()  # its own storage: any alignment may be viewed
                words = window.view(dtype).double()
                assert bool(torch.isfinite(words).all()) and float(words.abs().max()) <= 0.125, (dtype, shift)
                written = (words - 1e-3).to(dtype)
                assert bool((written.view(torch.uint8) != window).view(-1, size).any(1).all()), (dtype, shift)


def test_the_candidates_process_holds_no_checking_code():
    """What the candidate's process imports: its own module, the ABI and spec parsing, never
    the reference, the comparison, the checks or the verdict."""
    code = ("import sys, specgen.verify.candidate_main, specgen.verify.library, specgen.verify.arena, "
            "specgen.verify.layout, specgen.verify.graphs, specgen.spec; import json; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('specgen'))))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                       check=True).stdout)
    for judging in ("specgen.verify.checks", "specgen.verify.compare", "specgen.verify.engine",
                    "specgen.verify.data", "specgen.verify.timed", "specgen.reference", "specgen.checking"):
        assert judging not in loaded, judging


def test_the_candidate_environment_has_no_credentials(monkeypatch):
    from specgen.verify.isolation import scrubbed_environment

    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    monkeypatch.setenv("HF_TOKEN", "t")
    env = scrubbed_environment()
    assert "OPENAI_API_KEY" not in env and "HF_TOKEN" not in env and "PATH" in env


def test_the_candidates_main_process_loads_its_modules_eagerly(monkeypatch):
    """The first calls' race needs eager loading (isolation.py says why, above started_runner): the main runner and
    the spare started ahead of it load eagerly, even when the user's environment asks for lazy."""
    from specgen.verify import isolation

    monkeypatch.setenv("CUDA_MODULE_LOADING", "LAZY")
    assert isolation._child_env(True)["CUDA_MODULE_LOADING"] == "EAGER"
    assert isolation._child_env(False)["CUDA_MODULE_LOADING"] == "LAZY"
    made = []

    class Recorder:
        def __init__(self, spec, **options):
            made.append(options)
            self.process = type("P", (), {"poll": staticmethod(lambda: None)})()

        def close(self):
            pass

    monkeypatch.setattr(isolation, "IsolatedRunner", Recorder)
    monkeypatch.setattr(isolation, "_spare", None)
    monkeypatch.setattr(isolation, "keep_spare", True)
    isolation.started_runner("spec")
    isolation.started_runner("spec", readonly_inputs=False)
    assert [m["eager_modules"] for m in made] == [True, True, False]  # main, its spare, the writable one
    monkeypatch.setattr(isolation, "_spare", None)


def test_messages_and_descriptors_cross_the_channel():
    import os
    import socket

    from specgen.verify.channel import Channel

    a, b = socket.socketpair()
    left, right = Channel(a), Channel(b)
    read_fd, write_fd = os.pipe()
    left.send({"op": "arenas", "n": 3}, fds=(read_fd,))
    message, fds = right.receive(timeout=5)
    assert message == {"op": "arenas", "n": 3} and len(fds) == 1
    os.write(write_fd, b"x")
    assert os.read(fds[0], 1) == b"x"
    assert right.receive(timeout=0.05) is None


def test_a_memo_keyed_on_a_sampled_fingerprint_is_caught_by_the_model_loop_check(gelu):
    """Skips when the sampled input looks unchanged and the output looks computed: the stale
    output loop changes 3 input elements (a sample of 32 words misses them) and checks."""
    verdict = verdict_of(gelu, fakes.PyKernel(gelu, fakes.memo_by_sampled_fingerprint),
                         Options(examples=0, budget=1 << 13, full_size=False))
    assert verdict.reason == "post-timing-mismatch", verdict.summary()
    assert "input changed in place" in verdict.detail or "changed in place" in verdict.detail
    honest = verdict_of(gelu, fakes.PyKernel(gelu, fakes.gelu_forward), Options(examples=0, budget=1 << 13,
                                                                                full_size=False))
    assert honest.passed, honest.summary()


def test_a_memo_only_at_launch_bound_sizes_is_caught_by_the_model_loop_check(gelu):
    """A result table keyed on a sampled fingerprint, used only at small sizes (held-out
    attacks-v2's sampled memo gated on N*C): the model-loop check also runs at launch-bound
    cases, not only at the large one (where it never meets the memo)."""
    from specgen.verify.strategies import case_elements, large_case

    options = Options(examples=0, budget=1 << 13, full_size=False)
    big = large_case(gelu, options.budget, options.seed)
    assert case_elements(gelu.signature, big.dim_map) > fakes.MEMO_SMALL_ELEMENTS  # the large case misses it
    verdict = verdict_of(gelu, fakes.PyKernel(gelu, fakes.memo_at_launch_bound_sizes), options)
    assert verdict.reason == "post-timing-mismatch", verdict.summary()
    assert "changed in place" in verdict.detail


def test_the_cadence_holds_no_more_input_sets_than_fit():
    """At a benchmark shape where only two sets fit beside each other, the cadence rotates two
    (three asked the H200 for a 48 GB arena at a 4.3 GB shape, beside the fresh run's)."""
    from specgen.verify.engine import BENCH_SETS, cadence_sets

    assert cadence_sets(100) == BENCH_SETS == 3
    assert cadence_sets(2) == 2 and cadence_sets(1) == 1 and cadence_sets(0) == 1
