"""The benchmark: bytes from the signature, roofline arithmetic, the CLI; timing on the GPU."""
from __future__ import annotations

import json

import pytest

from conftest import SPECS
from specgen.bench import BenchRow, moved_bytes
from specgen.cli import main
from specgen.commands.bench import parse_shape, results_table
from specgen.errors import UsageError
from specgen.spec import load_spec


def test_bytes_moved_count_every_input_and_output_once():
    rms = load_spec(SPECS / "rmsnorm.yaml")
    # x (N*D) + weight (D) in, out (N*D) written; bf16 = 2 bytes; the saved float32 rstd (N) written
    assert moved_bytes(rms, {"N": 4, "D": 8}, "bfloat16") == (32 + 8 + 32) * 2 + 4 * 4
    ce = load_spec(SPECS / "cross_entropy.yaml")
    # logits N*C in the working dtype, target N int64, a float32 0-d loss, the saved float32 max and logsum (N each)
    assert moved_bytes(ce, {"N": 3, "C": 10}, "float16") == 30 * 2 + 3 * 8 + 4 + 2 * 3 * 4
    swiglu = load_spec(SPECS / "swiglu.yaml")
    assert moved_bytes(swiglu, {"N": 2, "H": 5}, "float32") == (2 * 10 + 2 * 5) * 4


def test_row_ratios_and_roofline_fraction():
    row = BenchRow("op", {"N": 1}, "float32", bytes=2_000_000, roofline_us=1.0, copy_gbs=2000.0,
                   kernel_us=2.0, eager_us=6.0, compile_us=3.0)
    data = row.as_dict()
    assert data["kernel_gbs"] == pytest.approx(1000.0)
    assert data["kernel_roofline_fraction"] == pytest.approx(0.5)
    assert data["speedup_vs_eager"] == pytest.approx(3.0)
    assert data["speedup_vs_compile"] == pytest.approx(1.5)
    assert data["baseline_gbs"] is None
    table = results_table(type("R", (), {"op": "op", "device": "H200", "copy_gbs": 2000.0, "rows": [row]})())
    assert table.row_count == 1 and len(table.columns) == 10


def test_parse_shape():
    assert parse_shape("N=4,D=8", ["N", "D"]) == {"N": 4, "D": 8}
    with pytest.raises(UsageError, match="no size for D"):
        parse_shape("N=4", ["N", "D"])
    with pytest.raises(UsageError, match="SYMBOL=SIZE"):
        parse_shape("Q=4", ["N", "D"])


def test_bench_without_a_gpu_exits_3(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["bench", str(SPECS / "gelu_tanh.yaml"), "--no-compile"]) == 3
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_time_callable_and_copy_bandwidth():
    import torch

    from specgen.bench import copy_bandwidth_gbs, time_callable

    x = torch.randn(1 << 24, device="cuda")
    stats = time_callable(lambda: x.mul_(1.0), reps=10)
    assert 0 < stats.min_ms <= stats.median_ms <= stats.max_ms
    assert 100 < copy_bandwidth_gbs() < 20000  # GB/s: any real GPU


@pytest.mark.gpu
@pytest.mark.nvcc
def test_bench_spec_times_kernel_eager_and_compile_side_by_side(tmp_path):
    from verify_support import GOOD, record

    out = tmp_path / "bench.json"
    code = main(["bench", str(SPECS / "gelu_tanh.yaml"), "--kernel", str(GOOD / "gelu_tanh.cu"),
                 "--shape", "N=4096,D=4096", "--dtype", "bfloat16", "--reps", "10", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    row = data["rows"][0]
    record("bench_test", "gelu_tanh", row)
    for key in ("kernel_us", "eager_us", "compile_us"):
        assert row[key] and row[key] > 0, (key, row)
    assert 0 < row["kernel_roofline_fraction"] <= 1.05  # above the copy roofline is a bug


def test_backward_bytes_are_inputs_and_output_grads_read_plus_input_grads_written():
    gelu = load_spec(SPECS / "gelu_tanh.yaml")
    # x and grad_out read, grad_x written (the forward output is passed but not counted)
    assert moved_bytes(gelu, {"N": 16384, "D": 8192}, "bfloat16", "backward") == 3 * 16384 * 8192 * 2
    rms = load_spec(SPECS / "rmsnorm.yaml")
    # x, weight, grad_out and the saved rstd read; grad_x, grad_weight written
    assert moved_bytes(rms, {"N": 4, "D": 8}, "float32", "backward") == (32 + 8 + 4 + 32 + 32 + 8) * 4
    ce = load_spec(SPECS / "cross_entropy.yaml")
    # logits, int64 target, the saved max and logsum, the float32 0-d loss's gradient in; grad_logits out
    # (no grad for target)
    assert moved_bytes(ce, {"N": 3, "C": 10}, "float16", "backward") == 30 * 2 + 3 * 8 + 2 * 3 * 4 + 4 + 30 * 2


def test_backward_bytes_leave_out_an_input_no_gradient_depends_on():
    """A sum's backward broadcasts its gradient: x only gives the shape, a correct kernel never
    reads it, so the roofline (as the verifier's physics floor) does not count it."""
    from specgen.verify.physics import unread_inputs

    spec = load_spec(SPECS.parent / "benchmarks" / "level1" / "specs" / "sum_last_keepdim.yaml")
    unread = unread_inputs(spec, "backward")
    assert unread == {"x"}
    dims = {symbol: 8 for symbol in spec.signature.symbols()}
    full, honest = moved_bytes(spec, dims, "float32", "backward"), moved_bytes(spec, dims, "float32", "backward", unread)
    x_bytes = 4 * 8 ** len(spec.signature.inputs[0].type.dims)
    assert full - honest == x_bytes
    # rope is linear in x: its backward reads grad_out and the tables (no_grad, still read), not x.
    # Counting x put the H200's rope backward at 139-148% of the copy roofline (session 13).
    rope = load_spec(SPECS / "rope.yaml")
    assert unread_inputs(rope, "backward") == {"x"}
    dims = {"S": 4, "H": 2, "D": 8}
    assert moved_bytes(rope, dims, "float32", "backward", unread_inputs(rope, "backward")) == (64 + 16 + 16 + 64) * 4


def _swiglu_inputs(n: int):
    import torch

    return {"x": torch.randn(n, 2 * 3, dtype=torch.float64)}


def test_a_fresh_compile_per_shape_never_falls_back_where_one_shared_compile_does():
    """The H200 run's bug: one torch.compile(reference) over many shapes and dtypes hit dynamo's
    recompile limit (8) and ran eager for the rest, silently."""
    from specgen.bench import fresh_compiled

    reference = load_spec(SPECS / "swiglu.yaml").reference_fn()
    shared, watch = fresh_compiled(reference, backend="eager")
    for n in range(1, 11):
        shared(**_swiglu_inputs(n))
    assert "recompile limit" in watch.fallback()
    for n in range(1, 11):
        fn, watch = fresh_compiled(reference, backend="eager")
        fn(**_swiglu_inputs(n))
        watch.mark_compiled()
        fn(**_swiglu_inputs(n))
        assert watch.fallback() is None, n


def test_a_recompile_while_timed_is_reported():
    from specgen.bench import fresh_compiled

    fn, watch = fresh_compiled(load_spec(SPECS / "swiglu.yaml").reference_fn(), backend="eager")
    fn(**_swiglu_inputs(4))
    watch.mark_compiled()
    fn(**_swiglu_inputs(5))  # another shape inside the "timed" region
    assert "recompiled 1 time(s) while timed" in watch.fallback()


@pytest.mark.parametrize("backend", [None, "aot_eager"])
def test_backward_step_runs_only_the_backward_and_repeats(backend):
    import torch

    from specgen.bench import autograd_backward, backward_operands, bench_inputs, fresh_compiled

    spec = load_spec(SPECS / "bias_gelu.yaml")
    args = bench_inputs(spec, {"N": 4, "D": 8}, "float32", seed=0, device="cpu")
    fwd_outputs, grads = backward_operands(spec, args)
    assert set(fwd_outputs) == {"out"} and set(grads) == {"grad_out"}
    fn = spec.reference_fn() if backend is None else fresh_compiled(spec.reference_fn(), backend=backend)[0]
    calls = []
    counted = lambda **kw: (calls.append(1), fn(**kw))[1]
    step = autograd_backward(spec, counted, args, grads)
    assert len(calls) == 1  # the forward ran once, outside the step
    first, second = step(), step()  # retain_graph: the same graph, twice
    assert len(calls) == 1
    x = args["x"].clone().requires_grad_(True)
    b = args["bias"].clone().requires_grad_(True)
    expected = torch.autograd.grad(spec.reference_fn()(x, b), [x, b], grads["grad_out"])
    for got in (first, second):
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e)


def _builtin_bench():
    import importlib.util

    from conftest import REPO

    loader = importlib.util.spec_from_file_location("builtin_bench", REPO / "benchmarks" / "builtin_bench.py")
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module


def test_builtin_bench_table_marks_a_compile_fallback_and_leaves_it_out_of_the_mean():
    bench = _builtin_bench()
    row = {"op": "softmax", "direction": "backward", "dims": {"N": 64, "D": 4096}, "dtype": "bfloat16",
           "bytes": 2_000_000, "roofline_us": 1.0, "kernel_us": 10.0, "eager_us": 100.0, "compile_us": 20.0,
           "compile_fallback": None, "notes": []}
    fell_back = dict(row, dtype="float32", compile_us=200.0, compile_fallback="dynamo hit its recompile limit")
    text = bench.table([row, fell_back], 4000.0)
    lines = [line for line in text.splitlines() if line.startswith("| softmax")]
    assert lines[0].endswith("| ok |") and "compile fell back to eager" in lines[1]
    assert lines[0].count("|") == 12  # op, dir, shape, dtype, MB, kernel, eager, compile, x, %, target
    assert "2.00x over 1 rows" in text  # the fallback row's 20x is not a speedup vs torch.compile


@pytest.mark.gpu
@pytest.mark.nvcc
def test_bench_spec_times_the_backward_of_kernel_eager_and_compile(tmp_path):
    from verify_support import GOOD, record

    from specgen.abi import write_header
    from specgen.bench import bench_spec
    from specgen.toolchain import compile_kernel

    spec = load_spec(SPECS / "gelu_tanh.yaml")
    write_header(spec, tmp_path)
    library = compile_kernel(GOOD / "gelu_tanh.cu", include_dirs=[tmp_path], name=spec.name).library
    shapes = [{"N": 4096, "D": 4096}, {"N": 64, "D": 4096}]
    result = bench_spec(spec, library, shapes=shapes, dtypes=["bfloat16", "float32"],
                        directions=("forward", "backward"), reps=10)
    assert [(r.direction, r.dtype) for r in result.rows[:4]] == [
        ("forward", "bfloat16"), ("backward", "bfloat16"), ("forward", "float32"), ("backward", "float32")]
    for row in result.rows:
        record("bench_backward_test", f"{row.direction} {row.dtype} {row.dims}", row.as_dict())
        assert row.kernel_us and row.eager_us and row.compile_us, row
        assert row.compile_fallback is None, row.compile_fallback  # 8 keys: a shared compile would hit the limit
        if row.direction == "backward":  # the baselines' training-step forward, timed beside
            assert row.eager_graph_us and row.compile_graph_us, row
        assert 0 < row.fraction(row.kernel_us) <= 1.05
    backward = result.rows[1]
    assert backward.bytes == 3 * 4096 * 4096 * 2


def test_bench_json_on_stdout_is_the_record_alone(monkeypatch, capsys):
    """`specgen bench SPEC --json -` (no kernel: eager and torch.compile only): the record alone
    on stdout, the table on stderr. The timing itself is stood in for (no GPU here)."""
    import specgen.bench as bench_module
    import specgen.verify as verify_module

    def fake_bench_spec(spec, library, shapes, dtypes, **kw):
        row = bench_module.BenchRow(spec.name, dict(shapes[0]), "bfloat16", 1 << 20, 1.0, 4000.0,
                                    eager_us=20.0, compile_us=10.0)
        return bench_module.BenchResult(spec.name, "stand-in", 4000.0, [row])

    monkeypatch.setattr(verify_module, "gpu_available", lambda: True)
    monkeypatch.setattr(bench_module, "bench_spec", fake_bench_spec)
    code = main(["bench", str(SPECS / "gelu_tanh.yaml"), "--shape", "N=64,D=4096", "--dtype", "bfloat16",
                 "--json", "-"])
    captured = capsys.readouterr()
    assert code == 0
    record = json.loads(captured.out)
    assert record["op"] == "gelu_tanh" and record["rows"][0]["eager_us"] == 20.0
    assert "gelu_tanh" in captured.err and "20" in captured.err  # the table, on stderr


def _graph_leaves(out) -> list:
    """The tensors autograd accumulates into (AccumulateGrad nodes) under `out`'s graph."""
    seen, stack, leaves = set(), [out.grad_fn], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable"):
            leaves.append(node.variable)
        stack += [n for n, _ in node.next_functions]
    return leaves


def test_forward_recording_the_graph_saves_what_the_backward_reads():
    """The baselines' training-step forward (BenchRow.*_graph_us): grad on even under no_grad
    outside, outputs that carry a graph whose backward gives the reference's gradients."""
    import torch

    from specgen.bench import autograd_forward, bench_inputs

    spec = load_spec(SPECS / "bias_gelu.yaml")
    args = bench_inputs(spec, {"N": 4, "D": 8}, "float32", seed=0, device="cpu")
    step = autograd_forward(spec, spec.reference_fn(), args)
    with torch.no_grad():
        out = step()
    assert out.requires_grad and out.grad_fn is not None
    assert not args["x"].requires_grad  # the caller's tensors are left as they were
    leaves = _graph_leaves(out)
    assert len(leaves) == 2 and {tuple(t.shape) for t in leaves} == {(4, 8), (8,)}
    grad = torch.randn_like(out)
    out.backward(grad)
    x = args["x"].clone().requires_grad_(True)
    b = args["bias"].clone().requires_grad_(True)
    expected = dict(zip(((4, 8), (8,)), torch.autograd.grad(spec.reference_fn()(x, b), [x, b], grad)))
    for leaf in leaves:
        torch.testing.assert_close(leaf.grad, expected[tuple(leaf.shape)])
    assert step().grad_fn is not out.grad_fn  # each call records its own graph


def test_a_baseline_backward_above_the_roofline_is_a_saved_tensor_not_a_bug():
    """torch.compile's hinge-loss backward ran at 8.4 TB/s of the inputs' bytes (session 34): it
    reads its forward's saved mask. The kernel above the roofline is still called a bug."""
    from specgen.bench import BenchRow, roofline_notes

    row = BenchRow("hinge", {"N": 8192}, "float32", bytes=int(3.76e9), roofline_us=900.0, copy_gbs=4180.0,
                   kernel_us=991.0, eager_us=5456.0, compile_us=449.0, direction="backward")
    notes = roofline_notes(row)
    assert len(notes) == 1 and "compile's backward at 2.00x" in notes[0] and "forward saved" in notes[0]
    forward = BenchRow("hinge", {"N": 8192}, "float32", bytes=int(3.22e9), roofline_us=800.0, copy_gbs=4180.0,
                       kernel_us=700.0, compile_us=900.0)
    assert roofline_notes(forward) == ["kernel at 1.14x the copy roofline: a measurement bug "
                                       "(or the output is not really written)"]
    assert roofline_notes(BenchRow("x", {}, "float32", 1, 100.0, 1.0, kernel_us=100.0)) == []
