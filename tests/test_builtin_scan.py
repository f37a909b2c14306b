"""The scan family: cumsum / cumprod / logcumsumexp / cummax and cummin values along any axis, reversed and exclusive
forms, forward and backward, checked by the CPU interpreter against the reference and its
autograd; the plans the kernels follow; nvcc compiles; (GPU) every kernel verifies."""
from __future__ import annotations

import pytest
import torch

from builtin_support import check_backward, check_forward, logcumsumexp_backward_as_the_kernel, own_spec, verifies_on_the_gpu
from specgen.agents.base import AgentRefused
from specgen.agents.builtin import build_source
from specgen.agents.builtin.families import scan
from specgen.agents.builtin.generator import lower_spec

CASES = {  # spec -> CPU dims (not the trace's example sizes)
    "cumsum_last": {"N": 3, "D": 37},
    "cumsum_middle": {"B": 2, "L": 9, "D": 5},
    "cumsum_reverse": {"N": 3, "D": 37},
    "cumsum_exclusive": {"N": 4, "D": 33},
    "cumprod_last": {"N": 3, "D": 11},
    "logcumsumexp_last": {"N": 3, "D": 37},
    "logcumsumexp_first": {"L": 13, "D": 6},
    "cumsum_exclusive_pad": {"N": 3, "D": 17},
    "cummax_middle": {"B": 2, "L": 9, "D": 5},
    "cummin_reverse_last": {"N": 3, "D": 37},
    "suffix_exclusive_pad": {"B": 2, "L": 9, "D": 5},
    "scan_column_grads": {"B": 2, "L": 9, "D": 5},
    "scan_column_grads_heads": {"B": 2, "L": 7, "H": 3, "P": 4},
    "transmittance_prepend_ones": {"R": 3, "S": 9},
    "exclusive_cumsum_prepend_zeros": {"B": 2, "L": 9, "D": 5},
}
FORWARD_ONLY = ("cumprod_last", "cumsum_exclusive_pad", "cummax_middle", "cummin_reverse_last", "suffix_exclusive_pad",
                "transmittance_prepend_ones", "exclusive_cumsum_prepend_zeros")
BACKWARD = [n for n in CASES if n not in FORWARD_ONLY]


@pytest.mark.parametrize("name", list(CASES))
def test_scan_forward_matches_the_reference(name):
    check_forward(own_spec(name), CASES[name])


@pytest.mark.parametrize("name", BACKWARD)
def test_scan_backward_matches_autograd(name):
    check_backward(own_spec(name), CASES[name])


def test_cumsum_backward_is_a_reversed_cumsum():
    programs = lower_spec(own_spec("cumsum_last"))
    fwd, bwd = (scan.plan_of(programs[d]) for d in ("forward", "backward"))
    assert (fwd.axis, fwd.reverse, fwd.kinds) == (1, False, ("sum",))
    assert (bwd.axis, bwd.reverse, bwd.kinds) == (1, True, ("sum",))


def test_kernel_choice_follows_the_axis():
    last = scan.plan_of(lower_spec(own_spec("cumsum_last"))["forward"])
    middle = scan.plan_of(lower_spec(own_spec("cumsum_middle"))["forward"])
    assert middle.axis == 1 and middle.rank == 3
    assert last.kernel(inner=1) == "rows" and middle.kernel(inner=64) == "lanes"
    # few lanes (a cumsum down 32768 columns: 32768 threads alone) split each lane's axis
    assert middle.kernel(inner=32768, lanes=32768, length=32768) == "segments"
    assert middle.kernel(inner=32768, lanes=1 << 20, length=32768) == "lanes"  # enough lanes
    assert middle.kernel(inner=64, lanes=64, length=8) == "lanes"  # too short to split


@pytest.mark.parametrize("name, sums", [("scan_column_grads", 2), ("scan_column_grads_heads", 1)])
def test_parameter_gradients_of_a_scan_are_column_sums_of_its_lanes(name, sums):
    """A [W] parameter's gradient (a sum over every row per column) rides the scan kernels: each lane
    one column's, its running sum a slot's partial; never the rows kernel, whose block is a row."""
    programs = lower_spec(own_spec(name))
    assert scan.plan_of(programs["forward"]).column_sums == 0
    plan = scan.plan_of(programs["backward"])
    assert plan.column_sums == sums
    assert plan.kernel(inner=1) == "lanes"  # a last dim of 1 at run time: still a lane per column
    assert plan.kernel(inner=64, lanes=64, length=4096) == "segments"


@pytest.mark.parametrize("name, kind, axis", [("transmittance_prepend_ones", "prod", 1),
                                              ("exclusive_cumsum_prepend_zeros", "sum", 1)])
def test_the_identity_concatenated_before_a_scan_makes_it_exclusive(name, kind, axis):
    """cumprod(cat([ones, y]))[..., :-1] (NeRF's transmittance) and cumsum(cat([zeros, y], 1))[:, :-1]:
    one exclusive scan of y, its shape y's (no column one wider)."""
    program = lower_spec(own_spec(name))["forward"]
    (node,) = [n for n in program.nodes() if n.op == "scan"]
    assert node.attrs["exclusive"] and node.attrs["kind"] == kind and not node.attrs["reverse"]
    assert scan.plan_of(program).axis == axis


def test_logcumsumexp_backward_reads_the_forward_output_to_keep_one_direction():
    bwd = lower_spec(own_spec("logcumsumexp_last"))["backward"]
    plan = scan.plan_of(bwd)
    assert plan.reverse and plan.kinds == ("logsumexp", "logsumexp")
    assert "out" in {n.attrs["field"] for n in bwd.nodes() if n.op == "load"}


@pytest.mark.parametrize("name, why", [
    ("cumprod_backward", "use an LLM agent"),
    ("cumsum_gelu", "both directions"),  # its backward needs the forward scan and a reversed one
    ("flip_only", "a flip"),
    ("cummax_indices", "the indices of a running max or min"),
    ("scan_last_column_grad", "a scan fused with row reductions"),  # no lane holds a scanned position's column
    ("cumprod_prepend_threes", "other than the identity before the values"),
])
def test_scans_outside_the_family_are_refused(name, why):
    with pytest.raises(AgentRefused) as info:
        build_source(own_spec(name))
    assert why in str(info.value)


@pytest.mark.nvcc
@pytest.mark.parametrize("name", list(CASES))
def test_scan_sources_compile(name):
    from specgen.agents.builtin.generator import compile_source

    spec = own_spec(name)
    compiled = compile_source(spec, build_source(spec))
    assert any("_scan_lanes<" in k for k in compiled.resources)
    chained = scan.plan_of(lower_spec(spec)["forward"]).chained
    assert any("_scan_segments<" in k for k in compiled.resources) != chained
    # no spills, but for the frame of an IEEE float division's slow path (a subroutine call: sigmoid's
    # 1 / (1 + exp(-x)) in an unrolled loop saves ~20 bytes; transmittance_prepend_ones)
    assert all(r["spill_store_bytes"] <= 32 for k, r in compiled.resources.items() if "_scan_segments<" in k)


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("name", list(CASES))
def test_scan_kernels_verify_on_the_gpu(name):
    verifies_on_the_gpu(own_spec(name))


def test_pad_of_a_scan_prefix_is_an_exclusive_scan():
    program = lower_spec(own_spec("cumsum_exclusive_pad"))["forward"]
    scans = [n for n in program.nodes() if n.op == "scan"]
    assert len(scans) == 1 and scans[0].attrs["exclusive"] and not scans[0].attrs["reverse"]


def _tile_scan(row, block, vec, warp, reverse, exclusive):
    """Python mirror of the rows kernel (ScanEmitter.emit_tiles) for one row and a sum."""
    L = len(row)
    out = [None] * L
    carry = 0.0
    for base in range(0, L, block * vec):
        locs, totals = [], []
        for t in range(block):
            q0 = base + t * vec
            live = q0 < L
            c0 = L - q0 - vec if reverse else q0
            loc, pre = [], 0.0
            for v in range(vec):
                pv = vec - 1 - v if reverse else v
                x = row[c0 + pv] if live else 0.0
                loc.append(pre if exclusive else pre + x)
                pre += x
            locs.append((live, c0, loc))
            totals.append(pre)
        inclusive = [sum(totals[w0:t + 1]) for w0 in (0,) for t in range(block)]  # block-wide scan
        for t, (live, c0, loc) in enumerate(locs):
            lane_excl = sum(totals[(t // warp) * warp:t])
            warp_before = sum(totals[:(t // warp) * warp])
            before = carry + warp_before + lane_excl
            for v in range(vec):
                pv = vec - 1 - v if reverse else v
                if live:
                    out[c0 + pv] = before + loc[v]
        carry += inclusive[-1]
    return out


@pytest.mark.parametrize("L, vec, reverse, exclusive", [(64, 4, False, False), (36, 4, True, False),
                                                        (40, 2, False, True), (33, 1, True, True),
                                                        (8, 4, False, False)])
def test_tile_algorithm_of_the_rows_kernel(L, vec, reverse, exclusive):
    import torch

    row = torch.arange(1.0, L + 1).tolist()
    got = torch.tensor(_tile_scan(row, block=8, vec=vec, warp=4, reverse=reverse, exclusive=exclusive))
    x = torch.tensor(row).flip(0) if reverse else torch.tensor(row)
    want = x.cumsum(0) - (x if exclusive else 0)
    want = want.flip(0) if reverse else want
    torch.testing.assert_close(got, want)


@pytest.mark.nvcc
def test_last_axis_scans_take_16_byte_tiles():
    from specgen.agents.builtin.generator import compile_source

    spec = own_spec("cumsum_last")
    compiled = compile_source(spec, build_source(spec))
    tiles = [k for k in compiled.resources if "_scan_rows<" in k]
    assert any("float, 4>" in k for k in tiles) and any("__nv_bfloat16, 8>" in k for k in tiles)
    assert all(compiled.resources[k]["spill_store_bytes"] == 0 for k in tiles)


def _pad_into_a_view(x, pad, value=0.0):
    """torch 2.11's constant_pad_nd decomposition: the input copied into a view of a filled
    tensor at the padding's offset (the H200's torch; 2.14 cats)."""
    shape = list(x.shape)
    for i in range(len(pad) // 2):
        shape[x.dim() - 1 - i] += pad[2 * i] + pad[2 * i + 1]
    out = torch.full(shape, value, dtype=x.dtype, device=x.device)
    view = out
    for i in range(len(pad) // 2):
        view = view.narrow(x.dim() - 1 - i, pad[2 * i], x.shape[x.dim() - 1 - i])
    view.copy_(x)
    return out


def test_a_pad_traces_as_a_cat_whatever_torch_decomposes_it_to(monkeypatch):
    """The exclusive cumsum (F.pad of the inclusive one) was refused on the H200's torch 2.11,
    whose pad decomposition writes into a view at an offset; the tracer's own pad keeps it a cat."""
    import torch.nn.functional as F
    from torch._decomp import decomposition_table

    from specgen.agents.builtin import trace

    x = torch.randn(3, 5, 7)
    for pad in [(1, 0), (0, 2), (2, 1, 1, 0), (-1, 2), (1, -2), (0, 0, 3, -1)]:
        assert torch.equal(trace._constant_pad_by_cat(x, list(pad), 1.5), F.pad(x, pad, value=1.5)), pad
    from specgen.agents.builtin import generator

    spec = own_spec("cumsum_exclusive_pad")
    monkeypatch.setitem(decomposition_table, torch.ops.aten.constant_pad_nd.default, _pad_into_a_view)
    monkeypatch.setattr(generator, "_programs", {})  # lowered afresh
    assert "cumsum_exclusive_pad_forward" in build_source(spec)  # 2.11's decomposition, overridden: lowers
    monkeypatch.setattr(trace, "_constant_pad_by_cat", _pad_into_a_view)
    monkeypatch.setattr(generator, "_programs", {})
    with pytest.raises(AgentRefused):  # without the override: refused, as on the H200
        build_source(spec)


@pytest.mark.parametrize("name", ["cummax_middle", "cummin_reverse_last"])
def test_running_extremes_propagate_nan_as_torch(name):
    """torch.cummax / cummin: a NaN, once met, is every later value (the interpreter follows
    torch; the kernel's sg_scan_extreme keeps a NaN running value)."""
    spec = own_spec(name)
    dims = CASES[name]
    x = torch.randn(*spec.signature.inputs[0].type.shape(dims), dtype=torch.float64)
    x.view(-1)[[3, 17]] = float("nan")
    out = torch.full_like(x, 0.0)
    from specgen.agents.builtin.interp import run_program

    run_program(lower_spec(spec)["forward"], {"x": x}, {}, dims, {"out": out})
    torch.testing.assert_close(out, spec.reference_fn()(x), equal_nan=True, rtol=0, atol=0)


def test_a_suffix_sum_written_with_flips_and_a_pad_is_one_exclusive_reversed_scan():
    program = lower_spec(own_spec("suffix_exclusive_pad"))["forward"]
    scans = [n for n in program.nodes() if n.op == "scan"]
    assert [(n.attrs["reverse"], n.attrs.get("exclusive"), n.attrs["axis"]) for n in scans] == [(True, True, 1)]


@pytest.mark.parametrize("body", [
    # a reversed scan regrouped before its slice: the slice is not along the scan's own axis
    "s = torch.cumsum(x.flip(1), 1).flip(1).reshape(x.shape[1], x.shape[0], x.shape[2])\n"
    "      return F.pad(s[:, 1:, :], (0, 0, 0, 1)).reshape(x.shape)",
    # the same for a forward scan and its prefix
    "s = torch.cumsum(x, 1).reshape(x.shape[1], x.shape[0], x.shape[2])\n"
    "      return F.pad(s[:, :-1, :], (0, 0, 1, 0)).reshape(x.shape)",
    # a scan's slice used other than padded
    "s = torch.cumsum(x.flip(1), 1).flip(1)\n"
    "      return F.pad(s[:, 1:, :] * 2, (0, 0, 0, 1))",
])
def test_slices_of_scans_other_than_the_exclusive_forms_are_refused(tmp_path, body):
    """Session 21 review: a regrouped scan's slice was lowered as an exclusive scan of the
    original layout (wrong values), other uses of the slice raised AttributeError."""
    from specgen.spec import load_spec

    path = tmp_path / "scan_slice.yaml"
    path.write_text(
        "name: scan_slice\n"
        "description: a slice of a scan\n"
        'signature: "scan_slice(x: Tensor[B, L, D]) -> Tensor[B, L, D]"\n'
        "dtypes: [float32]\n"
        "dims: {B: [1, 8], L: [2, 64], D: [1, 64]}\n"
        "reference: |\n"
        "  import torch\n"
        "  import torch.nn.functional as F\n"
        "  def reference(x):\n"
        f"      {body}\n")
    with pytest.raises(AgentRefused) as info:
        build_source(load_spec(path))
    assert "scan_slice.yaml:" in str(info.value)


def test_a_flip_viewed_before_its_scan_is_refused_not_a_crash(tmp_path):
    """Session 25 review: logcumsumexp of a flip, flipped back, with a kernel backward: the
    backward views the flipped value before a scan takes it, and lowering raised AttributeError
    ('Rev' object has no attribute 'shape') instead of refusing."""
    from specgen.spec import load_spec

    path = tmp_path / "rev_lcse.yaml"
    path.write_text(
        "name: rev_lcse\n"
        "description: a reversed logcumsumexp written with flips\n"
        'signature: "rev_lcse(x: Tensor[N, D]) -> Tensor[N, D]"\n'
        "dtypes: [float32]\n"
        "dims: {N: [1, 64], D: [1, 4096]}\n"
        "reference: |\n"
        "  import torch\n"
        "  def reference(x):\n"
        "      return torch.logcumsumexp(x.flip(-1), -1).flip(-1)\n"
        "backward: kernel\n")
    with pytest.raises(AgentRefused) as info:
        build_source(load_spec(path))
    assert "rev_lcse.yaml:" in str(info.value) and "a view of a flipped value" in str(info.value)


def _host_combine(kind: int, pairs):
    """The scan helpers' own C text (families/scan.py HELPERS) compiled for the host with g++ and
    run on `pairs`: the combine a kernel applies, checked without a GPU."""
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    body = "\n".join(f"  show(sg_scan_op<{kind}, double>({a!r}, {b!r}));".replace("inf", "INFINITY")
                     .replace("nan", "NAN") for a, b in pairs)
    src = ("#include <cmath>\n#include <cstdio>\nusing std::log1p; using std::exp; using std::fabs;\n"
           "#define __device__\n#define __forceinline__ inline\n" + scan.HELPERS +
           "\nstatic void show(double v) { std::printf(\"%.17g\\n\", v); }\nint main() {\n" + body + "\n}\n")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "c.cpp").write_text(src)
        subprocess.run([cxx, "-O1", "-o", f"{tmp}/c", f"{tmp}/c.cpp"], check=True, capture_output=True)
        lines = subprocess.run([f"{tmp}/c"], check=True, capture_output=True, text=True).stdout.split()
    return [float(v) for v in lines]


SPECIALS = [float("nan"), float("inf"), float("-inf"), 0.0, -1.5, 3.0]


def _host_scan_last(values, ctype: str) -> float:
    """The helpers' sg_scan_step (log-sum-exp) over `values` with the running value in `ctype`
    (each value rounded to float first, as the kernel reads it), compiled for the host."""
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    data = ", ".join(f"{v!r}f" for v in values)
    src = ("#include <cmath>\n#include <cstdio>\nusing std::log1p; using std::exp; using std::fabs;\n"
           "#define __device__\n#define __forceinline__ inline\n" + scan.HELPERS +
           f"\nstatic const float xs[] = {{{data}}};\nint main() {{\n  {ctype} s = -INFINITY;\n"
           f"  for (float x : xs) sg_scan_step<2, false>(s, ({ctype})x);\n  std::printf(\"%.17g\\n\", (double)s);\n}}\n")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "c.cpp").write_text(src)
        subprocess.run([cxx, "-O1", "-o", f"{tmp}/c", f"{tmp}/c.cpp"], check=True, capture_output=True)
        return float(subprocess.run([f"{tmp}/c"], check=True, capture_output=True, text=True).stdout)


def test_the_backward_carries_its_log_sum_exp_in_float64_for_float32():
    """logcumsumexp's backward scans log|g| - out, at |out| (1e4 at outliers): a float32 running
    value rounds at 1e-3 a step, and over 4095 steps the exp of it was 8% off on the H200 (session
    23). The backward's scans run in double for float32 data (the forward, verified, keeps float);
    here the helper's own C over such a sequence, float against double carry."""
    from specgen.agents.builtin.families.scan import ScanEmitter
    from specgen.agents.builtin.schedule import DEFAULT_VARIANT

    gen = torch.Generator().manual_seed(0)
    values = (-1.0e4 + torch.randn(4095, generator=gen, dtype=torch.float64)).float()
    truth = torch.logcumsumexp(values.double(), 0)[-1].item()
    in_float = _host_scan_last(values.tolist(), "float")
    in_double = _host_scan_last(values.tolist(), "double")
    assert abs(in_double - truth) < 1e-9 < 1e-5 < abs(in_float - truth)
    spec = own_spec("logcumsumexp_last")
    programs = lower_spec(spec)
    kinds = {d: ScanEmitter(spec, p, d, DEFAULT_VARIANT, scan.plan_of(p)).scan_t for d, p in programs.items()}
    assert kinds == {"forward": "acc_t", "backward": "scan_t"}


def test_logaddexp_combine_handles_specials_as_torch_does():
    # session 23's GPU run: a NaN beside -inf vanished and inf (+) inf gave NaN
    pairs = [(a, b) for a in SPECIALS for b in SPECIALS]
    got = _host_combine(scan.KIND_ID["logsumexp"], pairs)
    for (a, b), value in zip(pairs, got):
        want = torch.logcumsumexp(torch.tensor([a, b], dtype=torch.float64), 0)[1].item()
        assert (value == want) or (value != value and want != want) or abs(value - want) < 1e-12, (a, b, value, want)


@pytest.mark.parametrize("kind", ["max", "min"])
def test_extreme_combine_handles_specials_as_torch_does(kind):
    pairs = [(a, b) for a in SPECIALS for b in SPECIALS]
    got = _host_combine(scan.KIND_ID[kind], pairs)
    for (a, b), value in zip(pairs, got):
        t = torch.tensor([a, b], dtype=torch.float64)
        want = (t.cummax(0) if kind == "max" else t.cummin(0)).values[1].item()
        assert (value == want) or (value != value and want != want), (a, b, value, want)


def test_the_backward_rounds_each_scan_value_to_float32_before_adding_x():
    """The H200's "huge" cases (|x| up to 1e15, session 25): `out` read in float32 is off by its
    rounding, worth e^30 at 1e9, so log-sum-exp + x is noise of either sign. torch's float32
    backward rounds the scan to a float32 tensor first and lands near the float64 truth's 0; the
    kernel kept double and gave 129 where the truth is 0. The emitted backward rounds each scan
    value (the carry stays double), and in that arithmetic every element is within the
    verifier's bound: float32 tolerance plus the reference's own error."""
    from specgen.inputs import _values

    for seed in (100, 108, 48):
        x = _values((3, 3072), "huge", torch.Generator().manual_seed(seed)).float()
        g = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64).float()
        out = torch.logcumsumexp(x, -1)
        x64 = x.double().requires_grad_(True)
        truth, = torch.autograd.grad(torch.logcumsumexp(x64, -1), x64, g.double())
        x32 = x.clone().requires_grad_(True)
        reference, = torch.autograd.grad(torch.logcumsumexp(x32, -1), x32, g)
        bound = 1e-5 + 2e-5 * truth.abs() + (reference.double() - truth).abs()
        rounded = logcumsumexp_backward_as_the_kernel(x, g, out, round_value=True).double()
        kept = logcumsumexp_backward_as_the_kernel(x, g, out, round_value=False).double()
        assert ((rounded - truth).abs() <= bound).all()
        assert ((kept - truth).abs() > bound).any()  # the form that failed on the H200
    source = build_source(own_spec("logcumsumexp_last"))
    backward = source[source.index("=== backward ==="):]
    values = [line.strip() for line in backward.splitlines()
              if "sg_scan_step<" in line and "=" in line.split("sg_scan_step<")[0]
              or line.strip().startswith("const acc_t sv_") or line.strip().startswith("const scan_t sv_")]
    assert values and all(v.startswith("const acc_t ") and "= (acc_t)sg_scan_" in v for v in values), values
