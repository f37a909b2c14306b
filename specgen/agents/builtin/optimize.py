"""Rewrites of row programs that save work or bytes, applied before emitting.

- `cse`: one node per structurally equal expression (the traced graphs repeat work: the
  LayerNorm backward sums x twice, every use of an input is its own load node), so a
  reduction runs once and a pass shares its arithmetic.
- `reuse_forward_outputs`: the backward receives the forward outputs (ABI), so an elem
  expression of the backward that is structurally the forward's stored output is read
  from that output instead of recomputed. Softmax backward then needs no max/sum passes
  and no exp (out * (g - sum(g * out))); the residual add of add_rmsnorm reads one tensor
  instead of two. The stored output is rounded to the working dtype, exactly what PyTorch's
  own backward of these ops reads.
- `onehot_sums`: a row sum of a one-hot expression (zero except at the column equal to a
  per-row index, times per-row factors) is that expression's value at the index, with no
  sweep: cross-entropy backward's sum of its scattered gradient was a reduction round and an
  index compare per element.
- `lone_norms`: a 2-norm sqrt(sum(a * a)) is |a| where the sum has one term (width 1), as
  torch's vector_norm has it; the square underflows or overflows in float32 where |a| does not.
- `centered_affine`: x * a + ((-m) * a + c) is (x - m) * a + c where that is finite (GroupNorm's
  decomposition folds the mean into the shift, and the products cancel when a is large).
- `centred_cross_sums`: (sum(a * x) - sum(a) * mean) * rstd is sum(a * (x - mean) * rstd), whose
  terms stay O(|a|) (GroupNorm's backward overflowed float32 on values near 1e15).
- `negated_compares`: not(a == b) is a != b (and not(a != b) is a == b), so cse sees one mask
  where torch's decompositions write it both ways (cross-entropy with label smoothing counts
  its kept rows twice: one count, one prologue sum; pretotal.py).
"""
from __future__ import annotations

from .ir import Node, Program, Store, const, is_const, level_of, walk


class _Canon:
    """Structural keys: leaves by what they read, inner nodes by op, attrs and child keys."""

    def __init__(self):
        self.keys: dict[int, tuple] = {}

    def key(self, node: Node) -> tuple:
        got = self.keys.get(node.id)
        if got is not None:
            return got
        stack = [node]
        while stack:  # iterative post-order: programs can be deep chains
            n = stack[-1]
            pending = [a for a in self._children(n) if a.id not in self.keys]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            if n.id not in self.keys:
                self.keys[n.id] = self._make(n)
        return self.keys[node.id]

    @staticmethod
    def _children(n: Node) -> list[Node]:
        extra = [n.attrs["offset"]] if isinstance(n.attrs.get("offset"), Node) else []
        return list(n.args) + extra

    def _make(self, n: Node) -> tuple:
        attrs = []
        for k in sorted(n.attrs):
            v = n.attrs[k]
            if isinstance(v, Node):
                v = self.keys[v.id]
            elif isinstance(v, list):
                v = tuple(str(d) for d in v)
            elif k == "dim":
                v = str(v)
            elif k == "value":
                v = (type(v).__name__, v)
            attrs.append((k, v))
        return (n.op, n.level, n.dtype, tuple(attrs), tuple(self.keys[a.id] for a in n.args))


def _rebuild(program: Program, replace) -> Program:
    """A copy of `program` where `replace(node, new_args) -> Node` builds each node bottom-up."""
    memo: dict[int, Node] = {}

    def visit(node: Node) -> Node:
        for n in _topo(node):
            if n.id in memo:
                continue
            args = tuple(memo[a.id] for a in n.args)
            attrs = dict(n.attrs)
            if isinstance(attrs.get("offset"), Node):
                attrs["offset"] = memo[attrs["offset"].id]
            memo[n.id] = replace(n, args, attrs)
        return memo[node.id]

    stores = [Store(s.field, visit(s.value), s.kind, visit(s.offset) if s.offset is not None else None, s.piece)
              for s in program.stores]
    return Program(program.op, program.direction, program.row_dims, visit(program.width), program.width_example,
                   stores, program.group_div, program.dims_example, program.fold)


def _topo(root: Node) -> list[Node]:
    order, seen, stack = [], set(), [(root, False)]
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if n.id in seen:
            continue
        seen.add(n.id)
        stack.append((n, True))
        for a in reversed(_Canon._children(n)):
            if a.id not in seen:
                stack.append((a, False))
    return order


def _same(n: Node, args: tuple, attrs: dict) -> Node:
    if args == n.args and attrs == n.attrs:
        return n
    return Node(n.op, args, n.level, n.dtype, attrs, n.name)


def cse(program: Program) -> Program:
    """Merge structurally equal nodes (keeping the first one's name)."""
    canon = _Canon()
    first: dict[tuple, Node] = {}

    def replace(n: Node, args: tuple, attrs: dict) -> Node:
        built = _same(n, args, attrs)
        return first.setdefault(canon.key(built), built)

    return _rebuild(program, replace)


def row_broadcasts(program: Program) -> Program:
    """A tensor broadcast over the columns and over trailing row dims ([B, 1, 1] over rows [B, Q] of
    K columns: a per-sample length, mask or scale) as a row value spanning those trailing rows
    (`row_div`, read once a row), in a program with row reductions. The lowering reads it as a
    `bcast` load (each element at its coordinates), which only the flat family emits, and a program
    with row reductions is never flat: held-out problems-v8's log-softmax masked by per-sample key
    lengths was refused (session 36). Scans keep theirs (their family reads `bcast` loads)."""
    nodes = program.nodes()
    if not any(n.op == "rowreduce" for n in nodes) or any(n.op == "scan" for n in nodes):
        return program
    rows = len(program.row_dims)

    def replace(n: Node, args: tuple, attrs: dict) -> Node:
        if n.op == "load" and attrs.get("kind") == "bcast":
            present = attrs["present"]  # per dim of [rows..., W]: does the tensor span it
            k = 0
            while k < rows and present[k]:
                k += 1
            if not any(present[k:]):  # a prefix of the row dims, then nothing: one value per k-prefix
                return Node("load", args, "row", n.dtype,
                            {"field": attrs["field"], "kind": "row", "row_div": list(program.row_dims[k:])}, n.name)
        return _same(n, args, attrs)

    return _rebuild(program, replace)


_NEGATED = {"eq": "ne", "ne": "eq"}


def negated_compares(program: Program) -> Program:
    def replace(n: Node, args: tuple, attrs: dict) -> Node:
        if n.op == "not" and args[0].op in _NEGATED:
            inner = args[0]
            return Node(_NEGATED[inner.op], inner.args, inner.level, inner.dtype, dict(inner.attrs), n.name)
        return _same(n, args, attrs)

    return _rebuild(program, replace)


def reuse_forward_outputs(forward: Program, backward: Program, output_fields: set[str]) -> Program:
    """Replace backward expressions equal to a stored forward output with loads of it."""
    if forward.fold != backward.fold or [str(d) for d in forward.row_dims] != [str(d) for d in backward.row_dims]:
        return backward  # rows of another shape: a forward output is not the backward's row
    canon = _Canon()
    stored: dict[tuple, str] = {}
    for s in forward.stores:
        if s.kind == "elem" and s.offset is None and s.piece is None and s.field in output_fields and s.value.level == "elem" \
                and s.value.op != "load" and s.value.dtype == "float":
            stored.setdefault(canon.key(s.value), s.field)
    if not stored:
        return backward
    loads: dict[str, Node] = {}

    def replace(n: Node, args: tuple, attrs: dict) -> Node:
        built = _same(n, args, attrs)
        field = stored.get(canon.key(built)) if built.level == "elem" else None
        if field is None:
            return built
        if field not in loads:
            loads[field] = Node("load", level="elem", dtype="float",
                                attrs={"field": field, "kind": "elem", "row_div": [], "offset": None}, name=field)
        return loads[field]

    return _rebuild(backward, replace)


def _onehot(node: Node):
    """(index, value) when `node` is `value` at the column `index` (row level) and 0 elsewhere,
    `value` row level or coarser; else None. Forms: where(col == index, value, 0) and
    products of such a form with row-level factors."""
    if node.op == "where":
        cond, hit, miss = node.args
        if is_const(miss, 0) and cond.op == "eq" and _row_or_coarser(hit):
            a, b = cond.args
            if a.op == "iota" and _row_or_coarser(b):
                return b, hit
            if b.op == "iota" and _row_or_coarser(a):
                return a, hit
        return None
    if node.op == "mul":
        for i in (0, 1):
            found, other = _onehot(node.args[i]), node.args[1 - i]
            if found is not None and _row_or_coarser(other):
                index, value = found
                return index, Node("mul", (value, other) if i == 0 else (other, value),
                                   level=level_of(value, other), dtype=node.dtype)
    return None


def _row_or_coarser(node: Node) -> bool:
    return node.level in ("const", "global", "row")


def onehot_sums(program: Program) -> Program:
    """rowreduce(sum, one-hot) -> where(0 <= index < width, value, 0), a row value."""
    def replace(n: Node, args: tuple, attrs: dict) -> Node:
        built = _same(n, args, attrs)
        if built.op != "rowreduce" or built.attrs.get("kind") != "sum":
            return built
        found = _onehot(built.args[0])
        if found is None:
            return built
        index, value = found
        inside = Node("and", (Node("ge", (index, const(0)), level=index.level, dtype="bool"),
                              Node("lt", (index, program.width), level=level_of(index, program.width),
                                   dtype="bool")), level=level_of(index, program.width), dtype="bool")
        value = value if value.dtype == "float" else Node("cast", (value,), level=value.level, dtype="float")
        return Node("where", (inside, value, const(0.0)), level=level_of(inside, value), dtype="float",
                    name=built.name)

    return _rebuild(program, replace)


def _squared(node: Node) -> Node | None:
    """`a` when `node` is a * a or a ** 2 of a float elem value `a`, else None."""
    if node.op == "mul" and node.args[0] is node.args[1]:
        a = node.args[0]
    elif node.op == "pow" and is_const(node.args[1]) and node.args[1].attrs["value"] in (2, 2.0):
        a = node.args[0]
    else:
        return None
    return a if a.level == "elem" and a.dtype == "float" else None


def lone_norms(program: Program) -> Program:
    """sqrt(rowreduce(sum, a * a)) -> where(width == 1, rowreduce(max, |a|), sqrt(...)).

    Over a single element the 2-norm is |a| exactly, and torch's vector_norm returns abs()
    when every reduced dim has size 1 (ATen's is_reduce_over_1D_vector). Squaring first loses
    it in float32: a * a underflows to 0 for |a| < 2^-75 (a subnormal's norm was 0, its
    gradient a / norm 0 where torch's is +-1) and is inexact below 2^-63 (the square is
    subnormal); it overflows past 2^64. The max of |a| rides in the sum's sweep (no extra
    bytes). Run after cse, which makes the two factors of a * a one node."""
    def replace(n: Node, args: tuple, attrs: dict) -> Node:
        built = _same(n, args, attrs)
        if built.op != "sqrt" or built.level != "row" or built.args[0].op != "rowreduce" \
                or built.args[0].attrs.get("kind") != "sum":
            return built
        a = _squared(built.args[0].args[0])
        if a is None:
            return built
        top = Node("rowreduce", (Node("abs", (a,), level=a.level, dtype="float"),), level="row", dtype="float",
                   attrs={"kind": "max"}, name=f"{built.name}_lone")
        one = Node("eq", (program.width, const(1)), level=level_of(program.width), dtype="bool")
        return Node("where", (one, top, built), level="row", dtype="float", name=f"{built.name}_norm")

    return _rebuild(program, replace)


def _centered(p: Node, q: Node) -> tuple[Node, Node] | None:
    """((x - m) * a, c) when p = x * a and q = (-m) * a + c (any order of the products' factors
    and of q's sum), else None."""
    if p.op != "mul" or q.op != "add":
        return None
    for r, c in ((q.args[0], q.args[1]), (q.args[1], q.args[0])):
        if r.op != "mul":
            continue
        for neg_m, a in ((r.args[0], r.args[1]), (r.args[1], r.args[0])):
            if neg_m.op != "neg" or a not in p.args:
                continue
            x = p.args[1] if p.args[0] is a else p.args[0]
            m = neg_m.args[0]
            if x.dtype != "float" or m.dtype != "float" or a.dtype != "float" or c.dtype != "float":
                continue
            diff = Node("sub", (x, m), level=level_of(x, m), dtype="float")
            scaled = Node("mul", (diff, a), level=level_of(diff, a), dtype="float")
            return scaled, c
    return None


def centered_affine(program: Program) -> Program:
    """x * a + ((-m) * a + c) -> (x - m) * a + c where that is finite, else the folded form.

    torch's decomposition of native_group_norm (its CUDA kernel too) folds the mean into the
    shift: a = rstd * w, c' = b - mean * a, y = x * a + c'. With a large a (a group of one value:
    zero variance, rstd = 1/sqrt(eps) = 316) the two products cancel and float32 keeps 1-3e-5 of
    rounding where y is exactly b (session 23, every variant of the axis kernels). Centring first
    is exact when x == m. Where the centred value is not finite the folded one is kept: the
    reference's NaN from inf - inf (an infinite weight: x * inf + (b - m * inf)) is the contract,
    and the centred form alone gave -inf there (session 24, the verifier's specials on the H200).
    Run after cse (the two a's one node)."""
    def replace(n: Node, args: tuple, attrs: dict) -> Node:
        built = _same(n, args, attrs)
        if built.op != "add" or built.level != "elem" or built.dtype != "float":
            return built
        for p, q in ((built.args[0], built.args[1]), (built.args[1], built.args[0])):
            got = _centered(p, q)
            if got is not None:
                scaled, c = got
                centred = Node("add", (scaled, c), level=built.level, dtype="float")
                folded = Node("add", built.args, level=built.level, dtype="float")
                finite = Node("isfinite", (centred,), level=built.level, dtype="bool")
                return Node("where", (finite, centred, folded), level=built.level, dtype="float", name=built.name)
        return built

    return _rebuild(program, replace)


def _signed_terms(node: Node) -> list[tuple[int, Node]]:
    """`node` as a signed sum of row values: add, sub and neg opened, other nodes one term each."""
    if node.level == "row" and node.op in ("add", "sub"):
        a, b = _signed_terms(node.args[0]), _signed_terms(node.args[1])
        return a + ([(-s, t) for s, t in b] if node.op == "sub" else b)
    if node.level == "row" and node.op == "neg":
        return [(-s, t) for s, t in _signed_terms(node.args[0])]
    return [(1, node)]


def _factors(node: Node) -> list[Node]:
    """`node` as a product: mul opened, factors of exactly 1 dropped (torch writes db * 1.0)."""
    if node.op == "mul" and node.dtype == "float":
        return _factors(node.args[0]) + _factors(node.args[1])
    return [] if is_const(node) and node.attrs["value"] == 1 else [node]


def _same_factors(a: list[Node], b: list[Node]) -> bool:
    return sorted(n.id for n in a) == sorted(n.id for n in b)


def _is_sum(node: Node) -> bool:
    return node.op == "rowreduce" and node.attrs.get("kind") == "sum" and node.dtype == "float"


def _mean_of(m: Node) -> Node | None:
    """x when `m` is the row mean rowreduce(sum, x) / count of an elem value x, else None."""
    if m.op == "div" and m.level == "row" and _is_sum(m.args[0]) and m.args[1].level in ("const", "global"):
        x = m.args[0].args[0]
        return x if x.level == "elem" and x.dtype == "float" else None
    return None


def _uncentred_difference(node: Node) -> tuple[int, Node, Node, Node] | None:
    """(sign, a, x, m) when `node` is sign * (sum(a * x) - sum(a) * m) with m = sum(x) / count the
    row mean of x (the product's factors in any order and grouping), else None. GroupNorm's
    backward (torch's decomposition of native_group_norm_backward) has db * mean - ds with
    ds = sum(dy * w * x) and db = sum(dy * w)."""
    terms = _signed_terms(node)
    if len(terms) != 2:
        return None
    for (sign, ds), (other_sign, scaled) in (terms, terms[::-1]):
        if sign != -other_sign or not _is_sum(ds):
            continue
        pair = _factors(scaled)
        if len(pair) != 2:
            continue
        for db, m in (pair, pair[::-1]):
            x = _mean_of(m) if _is_sum(db) else None
            if x is not None and _same_factors(_factors(ds.args[0]), _factors(db.args[0]) + [x]):
                return sign, db.args[0], x, m
    return None


def _count_factors(n: Node) -> tuple | None:
    """A count (through casts and products of ints) as (its constants' product, its dims sorted), so
    that 8 * (H * W) and (8 * H) * W compare equal; None for anything else."""
    if n.op == "cast":
        return _count_factors(n.args[0])
    if n.op == "const" and n.dtype == "int":
        return n.attrs["value"], ()
    if n.op == "dim":
        return 1, (str(n.attrs["dim"]),)
    if n.op == "mul" and n.dtype == "int":
        a, b = _count_factors(n.args[0]), _count_factors(n.args[1])
        return None if a is None or b is None else (a[0] * b[0], tuple(sorted(a[1] + b[1])))
    return None


def _same_mean(m: Node, other: Node) -> bool:
    """One row mean: one node, or the same sum over counts that are the same product (torch's
    decomposition writes GroupNorm's group size two ways: the forward's and the backward's)."""
    if m is other:
        return True
    if m.op != "div" or other.op != "div" or m.args[0] is not other.args[0]:
        return False
    count = _count_factors(m.args[1])
    return count is not None and count == _count_factors(other.args[1])


def _reciprocal_std(r: Node, m: Node) -> Node | None:
    """The mean of the squared deviations sum((x - mean)^2) that `r` is 1 / sqrt(.) of a value of
    (GroupNorm's rstd = rsqrt(var + eps)), when that mean is `m`'s; else None. Then (x - m) * r
    is O(1)."""
    if r.level != "row":
        return None
    if r.op == "rsqrt":
        root = r.args[0]
    elif r.op == "reciprocal" and r.args[0].op == "sqrt":
        root = r.args[0].args[0]
    elif r.op == "div" and is_const(r.args[0]) and r.args[0].attrs["value"] == 1 and r.args[1].op == "sqrt":
        root = r.args[1].args[0]
    else:
        return None
    for n in walk(root):
        found = squared_deviations(n) if n.op == "rowreduce" else None
        if found is not None and _same_mean(found[1], m):
            return found[1]
    return None


def _normalized_cross_sum(sign: int, a: Node, x: Node, m: Node, r: Node, name: str) -> Node:
    """sign * rowreduce(sum, a * ((x - m) * r)): the centred sum with each term scaled by r."""
    xhat = Node("mul", (Node("sub", (x, m), level="elem", dtype="float"), r), level="elem", dtype="float")
    total = Node("rowreduce", (Node("mul", (a, xhat), level="elem", dtype="float"),), level="row", dtype="float",
                 attrs={"kind": "sum"}, name=f"{name}_centred" if name else "")
    return total if sign > 0 else Node("neg", (total,), level="row", dtype="float", name=name)


def centred_cross_sums(program: Program) -> Program:
    """(sum(a * x) - sum(a) * m) * r -> sum(a * ((x - m) * r)), m = sum(x) / count and r the
    reciprocal standard deviation of x about m (any sign of the difference, its factors in any
    order).

    torch's decomposition of native_group_norm_backward takes c2 = (db * mean - ds) * rstd^3 / n
    with ds = sum(dy * w * x) over the raw x: with values near 1e15 (the verifier's `huge`
    class, and FiLM's gamma folded into dy) each term of ds is ~1e45 and float32 overflows, so
    grad_x was inf/NaN where the float64 truth is finite (groupnorm_film on the GPU). The
    identity is exact: the terms of the rewritten sum are a times the normalized x, O(|a|), and
    the difference's cancellation goes too. The cost: the sum reads rstd, one sweep later than
    ds did. Run after cse (the mean's and the variance's x one node)."""
    def replace(n: Node, args: tuple, attrs: dict) -> Node:
        built = _same(n, args, attrs)
        if built.op != "mul" or built.level != "row" or built.dtype != "float":
            return built
        for d, r in (built.args, built.args[::-1]):
            found = _uncentred_difference(d)
            mean = _reciprocal_std(r, found[3]) if found is not None else None
            if mean is not None:  # the variance's own mean: (x - mean) is its deviation node, shared
                sign, a, x, _ = found
                return _normalized_cross_sum(sign, a, x, mean, r, built.name)
        return built

    return _rebuild(program, replace)


def _online_max(total: Node) -> Node | None:
    """m when `total` is rowreduce(sum, exp(a - m)) with m = rowreduce(max, a), else None."""
    term = total.args[0]
    if total.attrs.get("kind") != "sum" or term.op != "exp" or term.args[0].op != "sub":
        return None
    a, m = term.args[0].args
    return m if m.op == "rowreduce" and m.attrs.get("kind") == "max" and m.args[0] is a else None


def squared_deviations(squares: Node) -> tuple[Node, Node, Node] | None:
    """(s1, mean, count) when `squares` is rowreduce(sum, (x - s1 / count)^2) with s1 =
    rowreduce(sum, x): a variance's sum of squared deviations, whoever checks what count is
    (the row width here, the reduced extent in families/axis_emit.py), else None."""
    sq = squares.args[0]
    if squares.attrs.get("kind") != "sum":
        return None
    if sq.op == "mul" and sq.args[0] is sq.args[1]:
        dev = sq.args[0]
    elif sq.op == "pow" and sq.args[1].op == "const" and sq.args[1].attrs["value"] in (2, 2.0):
        dev = sq.args[0]
    else:
        return None
    if dev.op != "sub" or dev.args[1].op != "div":
        return None
    mean = dev.args[1]
    s1 = mean.args[0]
    if s1.op == "rowreduce" and s1.attrs.get("kind") == "sum" and dev.args[0] is s1.args[0]:
        return s1, mean, mean.args[1]
    return None


def _moments(squares: Node, width: Node) -> tuple[Node, Node] | None:
    """(s1, mean) when `squares` is rowreduce(sum, (x - s1 / W)^2) with s1 = rowreduce(sum, x) and
    W the row width (LayerNorm's mean and variance), else None."""
    found = squared_deviations(squares)
    if found is None:
        return None
    s1, mean, count = found
    count = count.args[0] if count.op == "cast" else count
    if count.op == "dim" and width.op == "dim" and str(count.attrs["dim"]) == str(width.attrs["dim"]):
        return s1, mean
    return None


def mark_fused_pairs(program: Program) -> Program:
    """Annotate the row reductions an emitter may take together, matched here once (the emitter
    reads the marks): a sum of exp(a - max(a)) gets `online_max` (its max's id: softmax,
    log-softmax, logsumexp, cross-entropy take the pair in one sweep), and LayerNorm's sum of
    squared deviations from sum(x) / W gets `moments_of` and `moments_mean` (the sum's and the
    mean's ids: one merge round under the `moments` variant). In place, attributes only, and
    idempotent: no node is rebuilt, so it runs after every rewriting pass (emit.DirectionEmitter)."""
    for n in program.nodes():
        if n.op != "rowreduce":
            continue
        m = _online_max(n)
        if m is not None:
            n.attrs["online_max"] = m.id
        pair = _moments(n, program.width)
        if pair is not None:
            n.attrs["moments_of"], n.attrs["moments_mean"] = pair[0].id, pair[1].id
    return program


__all__ = ["centred_cross_sums", "cse", "lone_norms", "mark_fused_pairs", "negated_compares", "onehot_sums", "reuse_forward_outputs",
           "row_broadcasts"]
