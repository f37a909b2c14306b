"""The builtin generator's lowering, checked on the CPU: the IR interpreter against the
reference (forward) and the reference's autograd (backward), in float64, at shapes that
differ from the trace's example sizes."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specgen.agents.base import AgentRefused
from specgen.agents.builtin.generator import lower_spec
from specgen.agents.builtin.interp import run_program
from specgen.agents.builtin.lower import lower
from specgen.agents.builtin.trace import trace
from specgen.inputs import make_inputs
from specgen.saved import evaluate_saved

from builtin_support import without_saved
from specgen.spec import load_spec

SPECS = Path(__file__).resolve().parent.parent / "specs"
OPS = ["gelu_tanh", "bias_gelu", "swiglu", "layernorm_gelu", "rmsnorm", "add_rmsnorm", "softmax",
       "log_softmax", "cross_entropy", "rope"]
SHAPES = {"N": 6, "D": 40, "C": 33, "H": 3, "S": 4}


def _dims(spec):
    dims = {s: SHAPES[s] for s in spec.signature.symbols()}
    if spec.name == "swiglu":
        dims["H"] = 20
    return dims


def _alloc(ttype, dims, float_dtype=torch.float64):
    shape = ttype.shape(dims)
    dtype = float_dtype if ttype.is_floating and not ttype.dtype else torch.float32 if ttype.is_floating else torch.int64
    return torch.full(shape, float("nan"), dtype=torch.float64 if dtype.is_floating_point else dtype)


@pytest.mark.parametrize("op", OPS)
def test_forward_matches_reference(op):
    spec = load_spec(SPECS / f"{op}.yaml")
    dims = _dims(spec)
    args = make_inputs(spec.signature, dims, "float64", seed=3)
    program = lower(trace(spec, "forward"))
    tensors = {p.name: args[p.name] for p in spec.signature.inputs}
    scalars = {p.name: args[p.name] for p in spec.signature.scalars}
    outs = {o.name: _alloc(o.type, dims) for o in spec.signature.outputs}
    saved = evaluate_saved(spec, args, "float64")  # the statistics the forward saves for its backward
    outs |= {field: torch.full(value.shape, float("nan"), dtype=torch.float64) for field, value in saved.items()}
    run_program(program, tensors, scalars, dims, outs)
    expected = spec.reference_fn()(**args)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for o, want in zip(spec.signature.outputs, expected):
        torch.testing.assert_close(outs[o.name], want.double(), rtol=1e-9, atol=1e-9)
    for field, want in saved.items():
        torch.testing.assert_close(outs[field], want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("optimized", [False, True], ids=["lowered", "optimized"])
@pytest.mark.parametrize("op", OPS)
def test_backward_matches_autograd(op, optimized):
    """`optimized`: the programs the emitter gets (CSE, forward outputs read back)."""
    spec = load_spec(SPECS / f"{op}.yaml")
    dims = _dims(spec)
    sig = spec.signature
    args = make_inputs(sig, dims, "float64", seed=4)
    leaves = {k: (v.clone().requires_grad_() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
              for k, v in args.items()}
    result = spec.reference_fn()(**leaves)
    result = result if isinstance(result, tuple) else (result,)
    gen = torch.Generator().manual_seed(5)
    grads = {f"grad_{o.name}": torch.randn(r.shape, generator=gen, dtype=torch.float64)
             for o, r in zip(sig.outputs, result) if o.type.is_floating}
    floating = [p.name for p in sig.inputs if p.type.differentiable]  # rope's no_grad tables: none written
    expected = torch.autograd.grad([r for o, r in zip(sig.outputs, result) if o.type.is_floating],
                                   [leaves[n] for n in floating], list(grads.values()), allow_unused=True)
    program = lower_spec(spec)["backward"] if optimized else lower(trace(spec, "backward"))
    forward_outputs = {o.name: r.detach() for o, r in zip(sig.outputs, result)}
    tensors = {p.name: args[p.name] for p in sig.inputs} | forward_outputs | evaluate_saved(spec, args, "float64") | grads
    outs = {f"grad_{n}": torch.full(args[n].shape, float("nan"), dtype=torch.float64) for n in floating}
    run_program(program, tensors, {p.name: args[p.name] for p in sig.scalars}, dims, outs)
    for n, want in zip(floating, expected):
        want = torch.zeros_like(args[n]) if want is None else want
        torch.testing.assert_close(outs[f"grad_{n}"], want, rtol=1e-9, atol=1e-9)


def test_matmul_is_refused_with_the_reference_line():
    spec = load_spec(SPECS / "linear_bias_relu.yaml")
    with pytest.raises(AgentRefused) as info:
        lower(trace(spec, "forward"))
    message = str(info.value)
    assert "linear_bias_relu.yaml:13" in message  # the F.linear line of the reference
    assert "transpose" in message or "mm" in message
    assert "LLM agent" in message and "--agent" in message


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "add_rmsnorm"])
def test_backward_reads_forward_outputs_instead_of_recomputing(op):
    spec = load_spec(SPECS / f"{op}.yaml")
    program = lower_spec(spec)["backward"]
    streamed = {n.attrs["field"] for n in program.nodes() if n.op == "load" and n.attrs["kind"] == "elem"}
    outputs = {o.name for o in spec.signature.outputs}
    assert streamed & outputs
    assert len(streamed) <= len({n.attrs["field"] for n in lower(trace(spec, "backward")).nodes()
                                 if n.op == "load" and n.attrs["kind"] == "elem"})
    if op == "softmax":  # out * (g - sum(g * out)): one reduction, no max, no exp
        assert [n.attrs["kind"] for n in program.nodes() if n.op == "rowreduce"] == ["sum"]
        assert not any(n.op == "exp" for n in program.nodes())


def test_cse_merges_the_repeated_mean_of_layernorm_backward():
    spec = load_spec(SPECS / "layernorm_gelu.yaml")
    raw = lower(trace(spec, "backward"))
    merged = lower_spec(spec)["backward"]
    count = lambda p: sum(n.op == "rowreduce" for n in p.nodes())
    assert count(merged) < count(raw)


def test_a_row_sum_of_a_one_hot_becomes_the_value_at_the_index(tmp_path):
    # cross-entropy backward (recomputing its log-sum-exp, not saving it): sum_j(onehot(target)_j * -g/N)
    # is -g/N for a target in range
    spec = without_saved(SPECS / "cross_entropy.yaml", tmp_path)
    raw = lower(trace(spec, "backward"))
    program = lower_spec(spec)["backward"]
    kinds = lambda p: sorted(n.attrs["kind"] for n in p.nodes() if n.op == "rowreduce")
    assert kinds(raw) == ["max", "sum", "sum"] and kinds(program) == ["max", "sum"]
    # same values as the unrewritten program, targets out of range included (the sum is 0 there)
    dims = {"N": 6, "C": 5}
    gen = torch.Generator().manual_seed(3)
    tensors = {"logits": torch.randn(6, 5, generator=gen, dtype=torch.float64),
               "target": torch.tensor([0, 4, 2, -1, 5, 1]), "grad_out": torch.tensor(0.7, dtype=torch.float64),
               "out": torch.tensor(0.0, dtype=torch.float64)}
    outs = [{"grad_logits": torch.full((6, 5), float("nan"), dtype=torch.float64)} for _ in range(2)]
    for p, out in zip((raw, program), outs):
        run_program(p, tensors, {}, dims, out)
    torch.testing.assert_close(outs[1]["grad_logits"], outs[0]["grad_logits"], rtol=1e-12, atol=1e-12)
    assert torch.isfinite(outs[1]["grad_logits"]).all()


def test_an_op_outside_the_families_is_named_even_when_its_trace_also_fixes_a_size(tmp_path):
    """Max pooling fixes its length while tracing; the refusal names the pooling line and the
    families it is outside of (what to change), not only the fixed size."""
    path = tmp_path / "maxpool4.yaml"
    path.write_text(
        'name: maxpool4\ndescription: max pooling along rows, window 4.\n'
        'signature: "maxpool4(x: Tensor[B, L]) -> Tensor[B, L/4]"\ndtypes: [float32]\n'
        "dims: {B: [1, 64], L: [4, 4096]}\nreference: |\n  import torch.nn.functional as F\n\n"
        "  def reference(x):\n      return F.max_pool1d(x.unsqueeze(1), kernel_size=4).squeeze(1)\n"
        "backward: none\n")
    with pytest.raises(AgentRefused) as info:
        lower(trace(load_spec(path), "forward"))
    message = str(info.value)
    assert f"{path}:10:" in message  # the F.max_pool1d line
    assert "outside the builtin generator's families" in message and "its trace also fixed L = " in message
    # a size fixed by a branch on it, with every op inside the families: the size refusal
    branch = tmp_path / "branch.yaml"
    branch.write_text(path.read_text().replace("maxpool4", "branch").replace("Tensor[B, L/4]", "Tensor[B, L]").replace(
        "return F.max_pool1d(x.unsqueeze(1), kernel_size=4).squeeze(1)",
        "return x * float(x.shape[-1])"))
    with pytest.raises(AgentRefused) as info:
        lower(trace(load_spec(branch), "forward"))
    assert "fixes a symbolic size to its example value" in str(info.value)


def _size_probe(tmp_path, name: str, body: str, dims: str = "{B: [1, 8], C: [4, 64], L: [1, 64]}"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f'name: {name}\ndescription: a size probe.\nsignature: "{name}(x: Tensor[B, C, L]) -> Tensor[B, C, L]"\n'
        f"dtypes: [float32]\ndims: {dims}\nreference: |\n  import torch\n  import torch.nn.functional as F\n\n"
        f"  def reference(x):\n{body}\nbackward: none\n")
    return load_spec(path)


@pytest.mark.parametrize("name, body, holds", [
    # a Python branch on a size: both traces of the example sizes take the same branch
    ("branch_on_size", "      if x.shape[1] > 6:\n          return x * 2.0\n      return x * 3.0", "C > 6"),
    # a group count computed from a size: 7 // 4 == 1 group at the traced size, a graph of one group
    ("groups_from_size", "      return F.group_norm(x, x.shape[1] // 4, eps=1e-5)", "Eq((C//4), 1)"),
    # inequations that are not torch's size-1 specializations (a helper's size fuzz, session 22)
    ("odd_width", "      if x.shape[-1] % 2:\n          return x * 2.0\n      return x * 3.0", "Ne(Mod(L, 2), 0)"),
    ("not_sixteen", "      if x.shape[-1] == 16:\n          return x * 2.0\n      return x * 3.0", "Ne(L, 16)"),
    ("power_of_two", "      d = x.shape[-1]\n      if d & (d - 1):\n          return x * 2.0\n      return x * 3.0",
     "Ne(BitwiseFn_bitwise_and(L, L - 1), 0)"),
])
def test_a_branch_on_a_size_is_refused_and_named_in_the_signatures_dims(tmp_path, name, body, holds):
    spec = _size_probe(tmp_path, name, body)
    with pytest.raises(AgentRefused) as info:
        trace(spec, "forward")
    message = str(info.value)
    assert f"{spec.path}:" in message and "branches on a size" in message
    assert f"holds only where {holds}, not at " in message and "literal dim" in message


def test_sizes_used_as_tensor_arithmetic_and_size_one_specializations_still_lower(tmp_path):
    """A size read as a number of the graph (a mean written by hand, x * L) stays symbolic, and
    torch's own guards (Ne: size-1 broadcasting, equal sizes) are not branches of the user."""
    for name, body in (("mean_by_hand", "      return x - x.sum(-1, keepdim=True) / x.shape[-1]"),
                       ("times_width", "      return x * x.shape[-1]")):
        lower(trace(_size_probe(tmp_path, name, body), "forward"))  # raises when refused
    # nn.GroupNorm(8, x.shape[1]) over 8*G channels: its guards (Eq(Mod(C, 8), 0), Ne(C//8, 1),
    # 8*B*H*W*(C//8) >= 2, ...) hold at every size the spec allows
    lower_spec(load_spec(Path(__file__).resolve().parent.parent / "benchmarks/level1/specs/groupnorm_module.yaml"))


def test_other_sizes_keep_divisibility_and_the_dims_range():
    from specgen.agents.builtin.trace import other_sizes

    spec = load_spec(Path(__file__).resolve().parent.parent / "benchmarks/level1/specs/groupnorm4_ncl_affine.yaml")
    found = other_sizes(spec)
    assert found and all(set(s) == {"B", "G", "L"} for s in found)
    for sizes in found:
        for symbol, value in sizes.items():
            lo, hi = spec.dims[symbol]
            assert lo <= value <= hi and value >= min(2, hi)
    assert {s["L"] for s in found} >= {2, 16384}  # the smallest of at least 2 and the largest


def test_a_python_division_of_sizes_is_a_float_division(tmp_path):
    """n / (n - 1) of two sizes is Python's true division: lowered as the int quotient before
    (1 at every n >= 3), wrong at the traced size too (a helper's size fuzz, session 22)."""
    spec = _size_probe(tmp_path, "bessel", "      n = x.shape[-1]\n      return x * (n / (n - 1))")
    program = lower_spec(spec)["forward"]
    for dims in ({"B": 2, "C": 4, "L": 3}, {"B": 1, "C": 5, "L": 8}):
        x = make_inputs(spec.signature, dims, "float64", seed=1)["x"]
        out = {"out": torch.full(x.shape, float("nan"), dtype=torch.float64)}
        run_program(program, {"x": x}, {}, dims, out)
        torch.testing.assert_close(out["out"], x * (dims["L"] / (dims["L"] - 1)), rtol=1e-6, atol=1e-6)


def test_a_concatenation_of_pieces_of_different_widths_is_refused(tmp_path):
    """A [B, C, 1] piece beside [B, C, L] was stored L wide at offset L: over the next row."""
    path = tmp_path / "pad_col.yaml"
    path.write_text(
        'name: pad_col\ndescription: a zero column appended.\n'
        'signature: "pad_col(x: Tensor[N, D]) -> Tensor[N, D+1]"\ndtypes: [float32]\n'
        "dims: {N: [1, 8], D: [1, 32]}\nreference: |\n  import torch\n\n"
        "  def reference(x):\n      return torch.cat([x, x.new_zeros(x.shape[0], 1)], dim=-1)\nbackward: none\n")
    with pytest.raises(AgentRefused, match="a concatenation of pieces of different widths"):
        lower_spec(load_spec(path))


def test_a_symbol_is_never_traced_at_a_literal_dims_value(tmp_path):
    """torch gives equal sizes one symbol: N traced at 5 beside a literal 5 was checked as the
    literal (x[:, :3] of [N, 5] refused at N = 2) or the literal's dim was checked for N (a branch
    on N lowered with N = 5 baked in); a review, session 22."""
    from specgen.agents.builtin.trace import trace_dims

    def probe(name, sig, body):
        path = tmp_path / f"{name}.yaml"
        path.write_text(f'name: {name}\ndescription: probe.\nsignature: "{name}{sig}"\ndtypes: [float32]\n'
                        "dims: {N: [1, 64]}\nreference: |\n  import torch\n\n  def reference(x):\n"
                        + "".join("      " + line + "\n" for line in body.split("\n")) + "backward: none\n")
        return load_spec(path)

    sliced = probe("lit_slice", "(x: Tensor[N, 5]) -> Tensor[N, 3]", "return x[:, :3] * 2.0")
    assert trace_dims(sliced)["N"] != 5
    lower_spec(sliced)  # raises when refused
    branch = probe("lit_first_branch", "(x: Tensor[5, N]) -> Tensor[5, N]",
                   "if x.shape[1] == 5:\n    return x * 2.0\nreturn x * 3.0")
    with pytest.raises(AgentRefused, match="branches on a size"):
        lower_spec(branch)


def test_no_product_of_traced_sizes_equals_a_literal_dim():
    """x / x.numel() beside a [385] input: at B, T, V = 5, 7, 11 the numel traced as 385 and was
    read as the literal's size, a constant (a red-team finding, session 33). The trace sizes now
    keep every product of several symbols' sizes off the literals."""
    from builtin_support import check_forward, own_spec
    from specgen.agents.builtin.trace import trace_dims

    spec = own_spec("numel_beside_literal")
    sizes = trace_dims(spec)
    assert sizes["B"] * sizes["T"] * sizes["V"] != 385 and sizes["B"] * sizes["T"] != 385
    for dims in ({"B": 2, "T": 3, "V": 5}, {"B": 1, "T": 1, "V": 1}):
        check_forward(spec, dims)
