"""Trace a spec's reference (and its vjp) into an fx graph of primitive ops.

`make_fx` runs the reference symbolically in the spec's dims with the full decomposition
table, so what reaches the lowering is a small set of `prims` ops (plus a few aten ops
such as gather/scatter) whose sizes are SymInts, not numbers baked in at one shape.
Scalars (eps, ...) are traced as sentinel constants and mapped back to the ABI field.
The trace runs in float32: the generated kernel computes in fp32 (fp64 for float64)
whatever the storage dtype, so the dtype-specific casts of the reference are irrelevant.
"""
from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass, field

import torch
from torch._decomp import decomposition_table
from torch.fx.experimental.proxy_tensor import make_fx

from ...inputs import TORCH_DTYPES, first_multiple
from ...reference import reference_failure
from ...saved import saved_expressions
from ..base import AgentRefused
from .families.scan import trace_decompositions
from .modules import modules_as_constants
from .scalar_constants import differing_constants, forms_of
from .global_pool import whole_window_pools
from .symbolic_math import symbolic_math
from .value_guards import traced_with_value_guards
from .welford import WelfordMeans

# Sizes used for the example inputs: distinct, so a size's example value names its symbol.
TRACE_SIZES = (5, 7, 11, 13, 17, 19, 23)
SENTINEL_BASE = 0.000123456789  # float scalars trace as sentinels (see SENTINEL_PRIMES)
OTHER_SENTINEL_BASE = 0.000345678912  # a second trace: what changes with it was computed from a scalar
# The k-th float scalar traces as base * sqrt(PRIMES[k]), the second trace with other primes.
# Square roots of distinct primes have no rational relation, so nothing computed from two
# scalars looks like a form of a third (with an arithmetic progression, a + c was 2 * b), and a
# number computed from several scalars (a / b) changes between the traces instead of staying a
# constant that would be baked in (session 21 review).
SENTINEL_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53)
# increasing like the first: scalars that a reference checks in order (hardtanh's min_val <=
# max_val) keep their order in both traces; min(a, b) is therefore not caught here (the verifier's
# drawn scalars are the net for it)
OTHER_SENTINEL_PRIMES = (59, 61, 67, 71, 73, 79, 83, 89, 97, 101, 103, 107, 109, 113, 127, 131)


def sentinel(base: float, index: int) -> float:
    """The value the index-th float scalar traces as (in the trace of `base`)."""
    primes = OTHER_SENTINEL_PRIMES if base == OTHER_SENTINEL_BASE else SENTINEL_PRIMES
    return base * math.sqrt(primes[index])


@dataclass
class Traced:
    spec: object
    direction: str  # forward | backward
    graph: torch.fx.GraphModule
    inputs: list[str]  # ABI field of each placeholder, in order
    outputs: list[str]  # ABI field of each graph output, in order (None: not a kernel output)
    dims: dict[str, int]  # the example size of each symbol
    # each float scalar's sentinel and every number recognised as computed from it
    # (scalar_constants.FORMS, "identity" the sentinel itself): traced value -> (form, field, scale)
    scalar_forms: dict[float, tuple[str, str, float]] = field(default_factory=dict)


def trace_dims(spec) -> dict[str, int]:
    """Example sizes: distinct values per symbol, honouring each symbol's divisibility."""
    sig = spec.signature
    divisors = sig.symbol_divisors()
    dims: dict[str, int] = {}
    # a literal dim's value is taken too: torch gives equal sizes one symbol, and a symbol traced
    # at a literal's value would be checked (and fixed) as that literal (a review, session 22)
    literals: set[int] = {d.add for t in _types(sig) for d in t.dims if d.is_literal}
    used = set(literals)
    # products of several symbols' sizes (a numel, rows merged by a view) must not equal a literal
    # either: the lowering would read x.numel() as a [385] input's size (a red-team finding)
    products: set[int] = set()
    candidates = iter(TRACE_SIZES + tuple(range(29, 400, 2)))
    for symbol in sig.symbols():
        step = divisors.get(symbol, 1)
        for base in candidates:
            value = base * step
            sizes = {d.resolve({**dims, symbol: value}) for t in _types(sig) for d in t.dims
                     if d.symbol == symbol and value * d.mul % d.div == 0}
            new_products = {s * p for s in sizes | {value} for p in products}
            if not (sizes | {value}) & (used | {0, 1}) and not new_products & literals:
                dims[symbol] = value
                used |= sizes | {value}
                products |= new_products | sizes | {value}
                break
    return dims


def _types(sig):
    return [p.type for p in sig.inputs] + [o.type for o in sig.outputs]


def _example_inputs(spec, dims: dict[str, int]) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    out = {}
    for p in spec.signature.inputs:
        shape = p.type.shape(dims)
        if p.type.value_range is not None:
            lo, hi = (d.resolve(dims) for d in p.type.value_range)
            out[p.name] = torch.randint(lo, max(hi, lo + 1), shape, generator=gen, dtype=torch.int64).to(
                TORCH_DTYPES[p.type.dtype])
        elif p.type.is_floating:
            dtype = TORCH_DTYPES[p.type.dtype] if p.type.dtype else torch.float32
            out[p.name] = torch.randn(shape, generator=gen, dtype=dtype)
        else:
            out[p.name] = torch.zeros(shape, dtype=TORCH_DTYPES[p.type.dtype])
    return out


def in_range_value(param, index: int) -> float:
    """The second trace's value of a float scalar: inside its range (between 30% and 70% of the
    way, at a point from the square root of a prime), or without one a moderate number (0.3 and
    up, increasing with the index, as the sentinels do). At the small sentinels a number computed
    from the scalar can look like a form of it (2 sin(a / 2) like a, sqrt(1 - a) + a^6 like
    sqrt(1 - a): a red team, session 40); at such a value it cannot."""
    frac = math.sqrt(OTHER_SENTINEL_PRIMES[index]) % 1.0
    if param.value_range is None:
        return 0.3 + 0.02 * index + 0.01 * frac
    lo, hi = param.value_range
    return lo + (hi - lo) * (0.3 + 0.4 * frac)


def _scalars(spec, base: float = SENTINEL_BASE, in_range: bool = False) -> tuple[dict[str, object], dict[float, str]]:
    values, sentinels = {}, {}
    if len(spec.signature.scalars) > len(SENTINEL_PRIMES):
        raise AgentRefused(f"{spec.path}: more than {len(SENTINEL_PRIMES)} scalars; the builtin generator traces at "
                           f"most that many. Use an LLM agent (--agent openai|anthropic|openai-compatible)")
    for index, p in enumerate(spec.signature.scalars):
        if p.type.kind == "float":
            value = in_range_value(p, index) if in_range else sentinel(base, index)
            values[p.name] = value
            sentinels[value] = p.name
        else:
            raise AgentRefused(f"{spec.path}: the builtin generator handles float scalars only; "
                               f"{p.name}: {p.type.kind} may steer Python control flow in the reference. "
                               f"Use an LLM agent (--agent openai|anthropic|openai-compatible)")
    return values, sentinels


def _constant_pad_by_cat(x, pad, value=0.0):
    """aten.constant_pad_nd as cat([full, x, full]) per padded dim (a negative pad: narrow).
    torch's own decomposition changed between versions: 2.11 copies `x` into a view at an offset
    of a filled tensor (which the lowering refuses), 2.14 cats; this one traces alike in both."""
    for i in range(len(pad) // 2):
        dim = x.dim() - 1 - i
        before, after = pad[2 * i], pad[2 * i + 1]
        if before < 0 or after < 0:
            start = -before if before < 0 else 0
            x = x.narrow(dim, start, x.shape[dim] - start + min(after, 0))
            before, after = max(before, 0), max(after, 0)
        parts = []
        for width in (before, None, after):
            if width is None:
                parts.append(x)
            elif width > 0:
                shape = list(x.shape)
                shape[dim] = width
                parts.append(torch.full(shape, value, dtype=x.dtype, device=x.device))
        x = torch.cat(parts, dim) if len(parts) > 1 else x
    return x


def _nll_loss_backward_at_targets(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    """aten.nll_loss_backward with class weights as ATen computes it: each row's -(g / total) *
    w[t] written at its target column, 0 elsewhere. torch's decomposition multiplies the one-hot
    by the whole [C] weight row, so an infinite weight at any column made 0 * inf = NaN in every
    row where ATen gives 0 (finite / inf; ce_class_weights on the H200, session 34). Unweighted:
    torch's own (its factor is already one value per row)."""
    if weight is None:
        return decomposition_table[torch.ops.aten.nll_loss_backward.default](
            grad_output, self, target, weight, reduction, ignore_index, total_weight)
    channel_dim = 0 if self.dim() < 2 else 1
    if reduction == 1:  # mean
        grad_output = grad_output / total_weight
    if self.dim() == 1 and target.dim() > 0:
        target = target[0]
    target = target.unsqueeze(channel_dim)
    safe_target = torch.where(target != ignore_index, target, 0)
    if self.dim() > grad_output.dim() > 0:
        grad_output = grad_output.unsqueeze(channel_dim)
    picked = weight.expand(self.shape).gather(channel_dim, safe_target)  # w[t]: one value per row
    value = torch.where(target != ignore_index, picked * -grad_output, 0)
    columns = torch.arange(self.shape[channel_dim], device=self.device)
    return torch.where(columns == safe_target, value, 0).to(self.dtype)


def decompositions() -> dict:
    """The table make_fx traces with: torch's full table, scans kept whole, pads as cats, a
    weighted NLL's backward at its targets only."""
    table = trace_decompositions(decomposition_table)
    table[torch.ops.aten.constant_pad_nd.default] = _constant_pad_by_cat
    table[torch.ops.aten.nll_loss_backward.default] = _nll_loss_backward_at_targets
    return table


def trace(spec, direction: str, *, sentinel_base: float = SENTINEL_BASE, checked: bool = True,
          in_range: bool = False) -> Traced:
    """`checked`: the refusals of sizes and scalars run; False for the second trace, made at the
    same sizes only to compare its constants with the first's (`in_range`: at values inside the
    scalars' ranges, where they have one)."""
    sig = spec.signature
    dims = trace_dims(spec)
    examples = _example_inputs(spec, dims)
    scalars, sentinels = _scalars(spec, sentinel_base, in_range)
    fn = spec.reference_fn()
    names = [p.name for p in sig.inputs]
    floating = [n for n, p in zip(names, sig.inputs) if p.type.differentiable]  # what the backward differentiates

    def forward(*tensors):
        with WelfordMeans():  # the user's var_mean/std_mean as torch answers them (welford.py)
            result = fn(**dict(zip(names, tensors)), **scalars)
        return tuple(result) if isinstance(result, (tuple, list)) else (result,)

    if direction == "forward":
        # saved intermediates are more outputs of the forward: the reference's, then each definition
        saved = [v.field for v in spec.saved_values]

        def target(*tensors):
            results = forward(*tensors)
            if not saved:
                return results
            defined = saved_expressions(spec, {**dict(zip(names, tensors)), **scalars})
            return results + tuple(defined[f] for f in saved)

        placeholders = list(names)
        args = [examples[n] for n in names]
        outputs = [o.name for o in sig.outputs] + saved
    else:
        float_outs = [i for i, o in enumerate(sig.outputs) if o.type.is_floating]
        with torch.no_grad():
            out_examples = forward(*[examples[n] for n in names])
        grads = [torch.randn_like(out_examples[i]) for i in float_outs]

        def target(*tensors):
            xs = [t.detach().requires_grad_(n in floating) for n, t in zip(names, tensors[:len(names)])]
            outs = forward(*xs)
            diff = [(outs[i], g) for i, g in zip(float_outs, tensors[len(names):]) if outs[i].requires_grad]
            wrt = [x for n, x in zip(names, xs) if n in floating]
            result = torch.autograd.grad([o for o, _ in diff], wrt, [g for _, g in diff], allow_unused=True)
            return tuple(torch.zeros_like(x) if r is None else r for r, x in zip(result, wrt))

        placeholders = names + [f"grad_{sig.outputs[i].name}" for i in float_outs]
        args = [examples[n] for n in names] + grads
        outputs = [f"grad_{n}" for n in floating]
    try:
        with _stack_anchor(str(spec.path or f"<{spec.name}>")), modules_as_constants(), symbolic_math(fn), \
                whole_window_pools():
            def trace_once():
                return make_fx(target, decomposition_table=decompositions(), tracing_mode="symbolic",
                               record_stack_traces=True, _allow_non_fake_inputs=True)(*args)

            # checks on values that only raise (F.gaussian_nll_loss's var >= 0) assumed to pass
            graph, _ = traced_with_value_guards(trace_once, str(spec.path or spec.name))
    except AgentRefused:
        raise
    except Exception as error:  # the reference does something make_fx cannot follow
        location = reference_failure(spec, error, "while tracing").location
        raise AgentRefused(f"{location}: the builtin generator cannot trace the {direction} of the reference "
                           f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
                           f"use an LLM agent (--agent openai|anthropic|openai-compatible)") from None
    traced = Traced(spec, direction, graph, placeholders, outputs, dims, forms_of(sentinels))
    if checked:
        _refuse_specialized_sizes(traced)
    # values nothing reads (a module's discarded scratch tensors, e.g. BatchNorm in eval mode)
    # are not lowered: fx keeps ops with side effects (in-place writes), which are refused
    graph.graph.eliminate_dead_code()
    if sentinels and checked:
        _refuse_unexpressed_scalar_numbers(traced)
    return traced


def _refuse_unexpressed_scalar_numbers(traced: Traced) -> None:
    """Traced again at other values (in_range_value): every number that changed must be one the lowering
    writes as an expression of its scalar (scalar_constants), or the graph is refused."""
    spec, direction = traced.spec, traced.direction
    try:  # at values inside the scalars' ranges (in_range_value), where a near-miss of a form shows
        other = trace(spec, direction, sentinel_base=OTHER_SENTINEL_BASE, checked=False, in_range=True)
    except AgentRefused:  # the reference raises there (two scalars' ranges in an order it checks): as before
        other = trace(spec, direction, sentinel_base=OTHER_SENTINEL_BASE, checked=False)
    why = differing_constants(traced.graph, other.graph, traced.scalar_forms, other.scalar_forms)
    if why:
        raise AgentRefused(f"{spec.path}: the {direction} of the reference: {why}; the kernel would hold the "
                           f"traced value for every value of the scalar. Use an LLM agent "
                           f"(--agent openai|anthropic|openai-compatible)")


def size_symbols(traced: Traced) -> tuple[dict, object]:
    """The sympy symbol of each placeholder size -> its Dim of the signature, and the shape env."""
    import sympy

    spec, graph, placeholders = traced.spec, traced.graph, traced.inputs
    sig = spec.signature
    types = {p.name: p.type for p in sig.inputs} | {f"grad_{o.name}": o.type for o in sig.outputs}
    symbolic, shape_env = {}, None
    nodes = [n for n in graph.graph.nodes if n.op == "placeholder"]
    for node, name in zip(nodes, placeholders):
        val, ttype = node.meta.get("val"), types.get(name)
        if ttype is None or not hasattr(val, "shape") or len(val.shape) != len(ttype.dims):
            continue
        for size, dim in zip(val.shape, ttype.dims):
            expr = getattr(size.node, "_expr", None) if isinstance(size, torch.SymInt) else None
            if isinstance(expr, sympy.Symbol) and (expr not in symbolic or not symbolic[expr].symbol):
                symbolic[expr] = dim  # _expr: the symbol before replacements; a signature symbol over a literal
                shape_env = size.node.shape_env
    return symbolic, shape_env


def _refuse_specialized_sizes(traced: Traced) -> None:
    """A reference that fixes a symbolic size of the signature to its example value (a module
    built from x.shape[-1], then checked against it; a Python branch on a size) traced a graph
    valid at that size only: refused, never lowered with the example's numbers baked in.
    (Literal dims of the signature are traced symbolic too, and fixed: that is expected.)
    When the graph also holds an op the lowering refuses (pooling fixes its length while
    tracing), that op's refusal is the one raised: it says what to change."""
    import sympy

    spec, direction = traced.spec, traced.direction
    symbolic, shape_env = size_symbols(traced)
    if shape_env is None:
        return
    fixed = [(symbolic[sym], int(value)) for sym, value in shape_env.replacements.items()
             if sym in symbolic and symbolic[sym].symbol and isinstance(value, sympy.Integer)]
    if fixed:
        names = ", ".join(f"{dim} = {value}" for dim, value in fixed)
        _refuse_an_op_first(traced, names)
        raise AgentRefused(f"{spec.path}:{spec.reference_line}: the {direction} of the reference fixes a symbolic "
                           f"size to its example value while tracing ({names}): its graph holds at that size only "
                           f"(a module built from a tensor's shape, or a branch on a size); declare the size as a "
                           f"literal dim, or use an LLM agent (--agent openai|anthropic|openai-compatible)")
    _refuse_size_branches(traced, symbolic, shape_env)


def other_sizes(spec) -> list[dict[str, int]]:
    """Sizes the spec allows, beside the traced ones, that a size branch is checked at: each
    symbol at its smallest, a middle and its largest value of at least 2 (its divisibility
    kept), all together and each one against the others, then each symbol alone over its first
    values and its powers of two (size 1 is left to the verifier: torch guards its size-1
    specializations itself, and keeps the general graph)."""
    divisors = spec.signature.symbol_divisors()
    choices = {}
    for symbol in spec.signature.symbols():
        lo, hi = spec.dims.get(symbol, (2, 2))
        step = divisors.get(symbol, 1)
        low = first_multiple(max(lo, 2), step)
        high = hi // step * step
        if low > high:  # no size >= 2 in range: its smallest
            low = high = first_multiple(lo, step)
        middle = max(low, min(high, int(math.sqrt(low * high)) // step * step))
        choices[symbol] = (low, middle, high, min(high, low + step))
    found = [{s: c[k] for s, c in choices.items()} for k in range(4)]
    for symbol in choices:
        for k, other in ((0, 2), (2, 0)):
            found.append({s: c[k if s == symbol else other] for s, c in choices.items()})
        # its first eight values and the powers of two (and three times them) in range, the
        # others at their smallest: `C in (3, 4, 8)`, `D % 5 < 4`, `L == 16`, `D & (D - 1)`
        step, (low, _, high, _) = divisors.get(symbol, 1), choices[symbol]
        firsts = range(low + step, min(high, low + 8 * step) + 1, step)
        powers = {m * 2 ** k * step for k in range(64) for m in (1, 3) if low < m * 2 ** k * step <= high}
        for value in sorted(set(firsts) | powers):
            found.append({s: value if s == symbol else c[0] for s, c in choices.items()})
    return found


def _refuse_size_branches(traced: Traced, symbolic: dict, shape_env) -> None:
    """A reference that branches on a size (`if x.shape[1] > 6`, a group count computed from a
    size that was 1 at the traced size) leaves a guard in the trace: a condition on the sizes
    that the graph holds under. Each is checked at other sizes the spec allows (`other_sizes`);
    one false there means the graph is the traced size's only: refused. torch's own guards that
    a size is not 0 or 1 are skipped (`_size_one_specialization`): it keeps the general graph."""
    import sympy

    spec, direction = traced.spec, traced.direction
    guards = [g.expr for g in getattr(shape_env, "guards", [])
              if not _size_one_specialization(g.expr) and g.expr.free_symbols and g.expr.free_symbols <= set(symbolic)]
    for sizes in other_sizes(spec) if guards else []:
        try:
            values = {sym: sympy.Integer(dim.resolve(sizes)) for sym, dim in symbolic.items()}
        except (KeyError, ValueError):  # a size the signature cannot take there
            continue
        for guard in guards:
            held = guard.xreplace(values)
            if held is sympy.false:
                shown = ", ".join(f"{k} = {v}" for k, v in sizes.items())
                raise AgentRefused(
                    f"{spec.path}:{spec.reference_line}: the {direction} of the reference branches on a size while "
                    f"tracing: its graph holds only where {_guard_in_dims(guard, symbolic)}, not at {shown} "
                    f"(a Python `if` on a shape, or a count computed from a size); compute it with tensor ops, "
                    f"declare the size as a literal dim, or use an LLM agent "
                    f"(--agent openai|anthropic|openai-compatible)")


# what torch's own size arithmetic is written with; a remainder, a bit operation or a float
# conversion in a guard is a user's (`if L % 2`, `if D & (D - 1)`)
SIZE_ARITHMETIC = ("Symbol", "Integer", "NegativeOne", "One", "Zero", "Add", "Mul", "FloorDiv", "CleanDiv",
                   "Max", "Min", "Pow")


def _size_one_specialization(guard) -> bool:
    """torch's own guards that a size (or a size computed from sizes) is not 0 or 1: the graph it
    keeps is the general one (`Ne(L - 1, 1)` for a slice of L - 1). Any other inequation
    (`Ne(Mod(L, 2), 0)`, `Ne(L, 16)`) is a user's branch, checked like any other guard."""
    import sympy

    if not isinstance(guard, sympy.Ne):
        return False
    plain = all(type(term).__name__ in SIZE_ARITHMETIC for side in guard.args for term in sympy.preorder_traversal(side))
    return plain and any(side in (sympy.Integer(0), sympy.Integer(1)) for side in guard.args)


def _guard_in_dims(guard, symbolic: dict) -> str:
    """A guard written with the signature's dims instead of torch's size symbols."""
    text = str(guard)
    for sym in sorted(symbolic, key=lambda s: -len(str(s))):
        text = re.sub(rf"\b{re.escape(str(sym))}\b", str(symbolic[sym]), text)
    return text


def _refuse_an_op_first(traced: Traced, fixed: str) -> None:
    """Raise the lowering's own refusal of the traced graph, if it has one (an op outside the
    families), noting the fixed sizes too; return when the lowering takes the graph."""
    from .lower import lower

    try:
        lower(traced)
    except AgentRefused as refusal:
        raise AgentRefused(f"{refusal} (its trace also fixed {fixed})") from None
    except Exception:  # noqa: BLE001 - the size refusal stands
        return


@contextlib.contextmanager
def _stack_anchor(filename: str):
    """fx keeps only "forward" frames in a node's stack trace; anchor the reference's frame
    too, so a refusal can name the YAML line, and the `__init__` of a module class the reference
    defines (a parameter built under the tracer from a symbolic size: `torch.randn(width)` is named
    where it is drawn). Best effort: older torch lacks the hook."""
    import torch.fx.proxy as fx_proxy

    anchors = getattr(fx_proxy, "_STACK_TRACE_ANCHORS", None)
    keys = [k for k in ((filename, "reference"), (filename, "__init__"))
            if isinstance(anchors, set) and k not in anchors]
    for key in keys:
        anchors.add(key)
    try:
        yield
    finally:
        for key in keys:
            anchors.discard(key)


def reference_line(spec, node) -> int | None:
    """The YAML line of the reference that produced an fx node (the reference is compiled
    with the YAML file as its filename and YAML line numbers)."""
    stack = (node.meta.get("stack_trace") or "") if node is not None else ""  # None: no one op (the width)
    filename = str(spec.path or f"<{spec.name}>")
    line = None
    for m in re.finditer(r'File "([^"]+)", line (\d+)', stack):
        if m.group(1) == filename:
            line = int(m.group(2))
    return line


def where(spec, node) -> str:
    line = reference_line(spec, node)
    filename = str(spec.path or spec.name)
    if line is None:
        return f"{filename}:{spec.reference_line}"
    return f"{filename}:{line}"


__all__ = ["Traced", "trace", "trace_dims", "reference_line", "where"]
