"""Sums over all rows that per-element values need, computed before the row pass (pretotal.py):
the NLL loss with ignore_index (every LM's loss with padding) and a masked mean divide each
element's gradient by the count of kept rows. The row lowering hoists that count into a
`pretotal` (one value for the launch, summed by a one-block prologue kernel); a sum that reads
the row pass itself stays refused by the row lowering, with its reason."""
from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch

from builtin_support import check_backward, check_forward, compiles_for_hopper, own_spec, verifies_on_the_gpu
from specgen.agents.base import AgentRefused
from specgen.agents.builtin import build_source
from specgen.agents.builtin.generator import lower_spec
from specgen.agents.builtin.interp import run_program
from specgen.agents.builtin.ir import Node, Program, Store, const
from specgen.agents.builtin.emit_pretotal import PretotalEmitter
from specgen.agents.builtin.lower import lower
from specgen.agents.builtin.trace import trace
from specgen.agents.builtin.validate import IRError, validate
from specgen.inputs import make_inputs
from specgen.spec import load_spec

REPO = Path(__file__).resolve().parent.parent
NLL = REPO / "benchmarks" / "level1" / "specs" / "nll_log_softmax_ignore_pad_loss.yaml"
CASES = {
    "nll": [{"N": 7, "C": 11}, {"N": 1, "C": 3}, {"N": 5, "C": 1}, {"N": 33, "C": 17}],
    "masked_token_mean": [{"B": 2, "T": 3, "H": 5}, {"B": 1, "T": 1, "H": 1}, {"B": 3, "T": 4, "H": 9}],
    "ce_smooth_ignore": [{"N": 7, "C": 11}, {"N": 1, "C": 3}, {"N": 5, "C": 1}],
    "weighted_row_mse": [{"N": 7, "D": 11}, {"N": 1, "D": 1}, {"N": 4, "D": 65}],
    "ce_class_weights": [{"N": 7, "C": 11}, {"N": 1, "C": 1}, {"N": 3, "C": 2}],
}


def _spec(name):
    return load_spec(NLL) if name == "nll" else own_spec(name)


@pytest.mark.parametrize("name", list(CASES))
def test_the_backward_reads_one_pretotal_of_row_values(name):
    program = lower_spec(_spec(name))["backward"]
    nodes = program.nodes()
    totals = [n for n in nodes if n.op == "pretotal"]
    assert len(totals) == 1
    (total,) = totals
    assert total.level == "global" and total.args[0].level == "row"
    assert not any(n.level == "post" for n in nodes)  # nothing is left for a finalize
    assert [s.kind for s in program.stores] == ["elem"] * len(program.stores)


@pytest.mark.parametrize("name, dims", [(n, d) for n, ds in CASES.items() for d in ds])
def test_forward_and_backward_match_the_reference_in_float64(name, dims):
    spec = _spec(name)
    for seed in range(3):
        check_forward(spec, dims, seed=seed)
        check_backward(spec, dims, seed=seed)


def _nll_backward(targets: torch.Tensor, logits: torch.Tensor, grad: float):
    spec = load_spec(NLL)
    leaf = logits.clone().requires_grad_()
    loss = spec.reference_fn()(leaf, targets)
    (want,) = torch.autograd.grad(loss, [leaf], torch.tensor(grad, dtype=loss.dtype))
    outs = {"grad_logits": torch.full(logits.shape, float("nan"), dtype=torch.float64)}
    tensors = {"logits": logits, "target": targets, "out": loss.detach(),
               "grad_out": torch.tensor(grad, dtype=torch.float64)}
    dims = {"N": logits.shape[0], "C": logits.shape[1]}
    run_program(lower_spec(spec)["backward"], tensors, {}, dims, outs)
    return loss, outs["grad_logits"], want


def test_rows_all_ignored_give_zero_gradients_and_a_nan_loss():
    """No kept row: the count is 0, the loss NaN (torch's), and every ignored row's gradient 0
    (not 0 * inf): the division by the count sits behind the row's keep test."""
    logits = torch.randn(6, 5, dtype=torch.float64)
    loss, got, want = _nll_backward(torch.full((6,), -1, dtype=torch.int64), logits, 1.5)
    assert torch.isnan(loss)
    assert torch.equal(got, torch.zeros_like(got)) and torch.equal(want, torch.zeros_like(want))


def test_one_kept_row_among_padding_takes_the_whole_gradient():
    logits = torch.randn(4, 7, dtype=torch.float64)
    targets = torch.tensor([-1, 3, -1, -1])
    _, got, want = _nll_backward(targets, logits, 2.0)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert got[[0, 2, 3]].abs().max() == 0 and got[1].abs().max() > 0


@pytest.mark.parametrize("dtype, tol", [("float32", 2e-5), ("bfloat16", 2e-2)])
def test_the_masked_mean_backward_in_the_specs_dtypes(dtype, tol):
    spec = own_spec("masked_token_mean")
    dims = {"B": 3, "T": 5, "H": 33}
    args = make_inputs(spec.signature, dims, dtype, seed=9)
    leaves = {k: v.clone().requires_grad_() if v.is_floating_point() else v for k, v in args.items()}
    loss = spec.reference_fn()(**leaves)
    want = torch.autograd.grad(loss, [leaves["x"], leaves["y"]], torch.tensor(0.75))
    outs = {f"grad_{n}": torch.full(args[n].shape, float("nan"), dtype=torch.float64) for n in ("x", "y")}
    tensors = dict(args) | {"out": loss.detach(), "grad_out": torch.tensor(0.75)}
    run_program(lower_spec(spec)["backward"], tensors, {}, dims, outs, acc=torch.float32)
    for n, w in zip(("x", "y"), want):
        torch.testing.assert_close(outs[f"grad_{n}"], w.double(), rtol=tol, atol=tol)


def test_a_sum_over_rows_that_reads_the_row_pass_is_refused_by_the_row_lowering():
    """x / logsumexp(x, -1).sum(): the total is of the rows' own reductions, known only after the
    row pass. The row lowering refuses it with that reason."""
    spec = own_spec("over_total_lse")
    with pytest.raises(AgentRefused) as info:
        lower(trace(spec, "forward"))
    message = str(info.value)
    assert "over_total_lse.yaml:" in message and "known only after the row pass" in message
    assert "a sum over rows of a rowreduce value" in message


def test_validation_rejects_a_pretotal_of_values_of_the_row_pass():
    x = Node("load", level="elem", attrs={"field": "x", "kind": "row_mapped", "row_div": []}, name="x")
    row_sum = Node("rowreduce", (x,), level="row", attrs={"kind": "sum"})
    total = Node("pretotal", (row_sum,), level="global", attrs={"kind": "sum"})
    program = Program("p", "forward", [], const(1), 1, [Store("out", Node("mul", (x, total), level="elem"), "elem")])
    with pytest.raises(IRError, match="reads the row pass"):
        validate(program, "a test")


def test_the_launcher_runs_the_prologue_first_and_its_workspace_holds_the_sums():
    from specgen.agents.builtin.emit import DirectionEmitter

    spec = load_spec(NLL)
    em = DirectionEmitter(spec, lower_spec(spec)["backward"], "backward")
    host = em.emit_host(list(spec.dtypes))
    prologue = host.index(f"{em.kname}_pretotals<T><<<1, 1024")
    assert prologue < host.index("#define SG_LAUNCH(")  # the row kernel reads what the prologue wrote
    assert "sizeof(double) * 1 + " in host and "float* partials = (float*)(pre + 1);" in host
    assert not em.finalizes_in_cluster(em.variant) and "fin_cluster" not in host
    assert "reinterpret_cast<const double*>(partials) - 1" in em.emit_row_kernel()


@pytest.mark.nvcc
@pytest.mark.parametrize("name", list(CASES))
def test_the_sources_compile(name):
    compiles_for_hopper(_spec(name))


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("name", [*CASES, "masked_scaled_mse"])
def test_the_kernels_verify_on_the_gpu(name):
    verifies_on_the_gpu(_spec(name))


def test_the_nll_backward_at_the_gpu_tests_shape_matches_in_float32():
    """The GPU test's inputs (N = 4099 rows, more than 4 per prologue thread; C = 1031, no vector
    loads; every third row padding) through the lowered program in the kernels' float32: the
    program is right there, so a failure of that test is the kernel or its harness (session 34:
    the harness, a freed grad_out)."""
    spec = load_spec(NLL)
    dims = {"N": 4099, "C": 1031}
    args = make_inputs(spec.signature, dims, "float32", seed=0)
    args["target"][::3] = -1
    leaf = args["logits"].clone().requires_grad_()
    loss = spec.reference_fn()(leaf, args["target"])
    (want,) = torch.autograd.grad(loss, [leaf])
    out = {"grad_logits": torch.full_like(want, float("nan"))}
    tensors = {**args, "out": loss.detach(), "grad_out": torch.ones_like(loss)}
    run_program(lower_spec(spec)["backward"], tensors, {}, dims, out, acc=torch.float32)
    torch.testing.assert_close(out["grad_logits"], want, rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.nvcc
def test_the_nll_backward_is_bit_reproducible_and_matches_on_the_gpu():
    from specgen import abi
    from specgen.agents.builtin.generator import compile_source

    spec = load_spec(NLL)
    compiled = compile_source(spec, build_source(spec))
    lib = ctypes.CDLL(str(compiled.library))
    fn = getattr(lib, abi.entry_point(spec, "backward"))
    size = getattr(lib, abi.workspace_function(spec, "backward"))
    size.restype = ctypes.c_size_t
    dims = {"N": 4099, "C": 1031}
    args = make_inputs(spec.signature, dims, "float32", seed=0, device="cuda")
    # every third row padding, as the declared -1 (target in [-1, C)): the reference maps every
    # negative label to -100 itself, so a collator's -100 is the same row, outside the contract
    args["target"][::3] = -1
    leaf = args["logits"].clone().requires_grad_()
    loss = spec.reference_fn()(leaf, args["target"])
    (want,) = torch.autograd.grad(loss, [leaf])
    # held here: the struct keeps raw pointers only. A grad_out made inside the call was freed
    # when pack_args returned, the workspace reused its block and the prologue's count (2731.0,
    # low word 0) was read as grad_out = 0: every gradient 0 (the H200 run of session 34)
    grad_out = torch.ones_like(loss)
    results = []
    for _ in range(3):
        got = torch.full_like(args["logits"], float("nan"))
        struct = abi.pack_args(spec, "backward", {**args, "out": loss.detach(), "grad_out": grad_out,
                                                  "grad_logits": got}, {}, dims)
        workspace = torch.full((size(ctypes.byref(struct)),), 255, dtype=torch.uint8, device="cuda")
        abi.set_workspace(struct, workspace)
        assert fn(ctypes.byref(struct), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)) == 0
        torch.cuda.synchronize()
        results.append(got)
    assert all(torch.equal(results[0], r) for r in results[1:])
    torch.testing.assert_close(results[0], want, rtol=1e-4, atol=1e-6)


def test_a_sum_over_rows_per_column_inside_row_values_is_refused_with_its_reason(tmp_path):
    """(x * w).sum(2) + w.sum(1), w [C, H]: w.sum(1) is a sum over the rows of each column here,
    not known before the row pass: refused, and the message says which sum."""
    path = tmp_path / "colsum.yaml"
    path.write_text(
        "name: colsum\n"
        "description: a row value plus a sum of a parameter\n"
        'signature: "colsum(x: Tensor[B, C, H], w: Tensor[C, H]) -> Tensor[B, C]"\n'
        "dtypes: [float32]\n"
        "dims: {B: [1, 8], C: [1, 64], H: [1, 64]}\n"
        "reference: |\n"
        "  def reference(x, w):\n"
        "      return (x * w).sum(2) + w.sum(1)\n")
    with pytest.raises(AgentRefused) as info:
        lower(trace(load_spec(path), "forward"))
    assert "colsum.yaml:7" in str(info.value)
    assert "a sum over rows per column, known only after the row pass" in str(info.value)


def test_a_parameter_read_at_a_rows_index_is_summed_in_the_prologue():
    """ce_class_weights: the pretotal's summand is a gather of the [C] weights (a column-only
    value) at the row's target; the prologue reads weight[target] directly."""
    from specgen.agents.builtin.emit import DirectionEmitter

    spec = own_spec("ce_class_weights")
    program = lower_spec(spec)["backward"]
    (total,) = [n for n in program.nodes() if n.op == "pretotal"]
    gathers = [n for n in program.nodes() if n.op == "gather"]
    assert any(PretotalEmitter.reaches(total.args[0], g) for g in gathers)
    prologue = DirectionEmitter(spec, program, "backward").emit_pretotals()
    assert "A.weight.data)[0 + j]" in prologue and "A.target.data)[row]" in prologue


def test_class_weights_are_read_at_the_target_only():
    """ce_class_weights' backward reads w at each row's target (a gather), never the whole [C]
    weight per element: torch's decomposition multiplied the one-hot by w[col], and 0 * inf = NaN
    at every column of an infinite weight made whole rows NaN where ATen gives 0 (trace.py's
    nll_loss_backward; the H200's verifier, session 34)."""
    from specgen.agents.builtin.ir import walk

    program = lower_spec(own_spec("ce_class_weights"))["backward"]
    outside_gathers = lambda n: n.args[1:] if n.op == "gather" else n.args  # noqa: E731
    for store in program.stores:
        assert not any(n.op == "load" and n.attrs["field"] == "weight" for n in walk(store.value, outside_gathers))


@pytest.mark.parametrize("acc", [torch.float64, torch.float32])
def test_an_infinite_class_weight_gives_torchs_zeros_and_nans(acc):
    """An infinite |w| + 0.1 makes the total inf: a row whose target weight is finite has gradient
    g / inf * w[t] = 0, a row whose target weight is inf NaN (inf * 0), a row of only -inf logits
    NaN (the verifier's masked values on the H200 gave NaN in 7434 of 8192 rows)."""
    spec = own_spec("ce_class_weights")
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    logits[4] = float("-inf")
    logits[2, :2] = float("-inf")
    target = torch.tensor([0, 3, 1, 3, 2, 4])
    weight = torch.randn(5, generator=gen, dtype=torch.float64)
    weight[3] = float("-inf")
    leaf = logits.clone().requires_grad_()
    loss = spec.reference_fn()(leaf, target, weight)
    grad_out = torch.tensor(0.7, dtype=torch.float64)
    (want,) = torch.autograd.grad(loss, [leaf], grad_out)
    out = {"grad_logits": torch.full_like(logits, float("nan"))}
    tensors = {"logits": logits, "target": target, "weight": weight, "out": loss.detach(), "grad_out": grad_out}
    run_program(lower_spec(spec)["backward"], tensors, {}, {"N": 6, "C": 5}, out, acc=acc)
    torch.testing.assert_close(out["grad_logits"].double(), want, equal_nan=True)
    assert (want[[0, 2, 5]] == 0).all() and want[[1, 3, 4]].isnan().all()


@pytest.mark.parametrize("dims", [{"N": 5, "D": 7}, {"N": 1, "D": 4}, {"N": 3, "D": 1}])
def test_a_count_inside_a_parameter_gradient(dims):
    """masked_scaled_mse: the [D] scale's gradient sums over rows a value divided by the kept
    rows' count; the count is hoisted before the column reduction (it was refused: a CPU red
    team's coverage gap, session 33), so the column finalize reads sg_pre too."""
    from specgen.agents.builtin.emit import DirectionEmitter

    spec = own_spec("masked_scaled_mse")
    program = lower_spec(spec)["backward"]
    assert {s.kind for s in program.stores} == {"elem", "col"}
    assert any(n.op == "pretotal" for n in program.nodes())
    assert "sg_pre" in DirectionEmitter(spec, program, "backward").emit_finalize()
    for seed in range(3):
        check_forward(spec, dims, seed=seed)
        check_backward(spec, dims, seed=seed)


@pytest.mark.nvcc
def test_the_masked_parameter_gradient_compiles():
    compiles_for_hopper(own_spec("masked_scaled_mse"))


def test_a_target_outside_its_range_is_read_at_the_rows_edge():
    """cross_entropy declares target in [0, C); a -100 padding label (or C) still reaches the kernel
    before the package's lazy range check reports it. The row kernel's gather clamps the index to
    the row (the interpreter mirrors the emitter): the loss is the one of the clamped targets, and
    nothing is read outside the row (before the tensor, in row 0)."""
    spec = load_spec(REPO / "specs" / "cross_entropy.yaml")
    dims = {"N": 5, "C": 7}
    args = make_inputs(spec.signature, dims, "float32", seed=2)
    args["target"][0], args["target"][-1] = -100, 7
    out = {"out": torch.full((), float("nan")), "saved_max": torch.empty(5), "saved_logsum": torch.empty(5)}
    run_program(lower_spec(spec)["forward"], dict(args), {}, dims, out, acc=torch.float64)
    clamped = args["target"].clamp(0, 6)
    want = torch.nn.functional.cross_entropy(args["logits"].double(), clamped)
    torch.testing.assert_close(out["out"].double(), want, rtol=1e-6, atol=1e-6)
