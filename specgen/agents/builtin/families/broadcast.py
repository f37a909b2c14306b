"""Inputs of lower rank than the row space, computed on before they are broadcast.

`F.batch_norm(x, mean, var, ...)` takes rsqrt(var + eps) on the [C] tensor, then broadcasts
it over [N, C, H, W]; which dims of the row space [C] spans is known only at the broadcast.
A `Pending` value holds such a computation with placeholder loads (kind "pending") and, per
load, the positions of its tensor's dims in the value's shape; pointwise ops and casts on
pending values stay pending, a `broadcast_in_dim` moves the positions, and at full rank (or
at any other use) every placeholder becomes the load the lowering gives that input at those
positions: a row, column or broadcast load (flat.py reads the last at each element's
coordinates). Used any other way, a pending value is materialized at its own shape, which is
what the lowering did before (a [D] parameter read as columns).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Node, level_of


@dataclass(frozen=True)
class IotaRef:
    """torch.arange(length) along an axis known only at its broadcast (a causal mask's query
    positions: arange(Q)[:, None] against arange(K)[None, :], broadcast over [B, H, Q, K])."""
    length: int


@dataclass
class Pending:
    val: object  # lower.Val whose node tree holds "pending" loads
    maps: dict  # pending load id -> (TensorRef, positions of the tensor's dims in val.shape)


def should_defer(lw, ref) -> bool:
    full = len(lw.rows) + 1
    return 0 < len(ref.shape) < full and not lw.is_row_shape(ref.shape)


def defer(lw, ref) -> Pending:
    from ..lower import Val

    dtype = "int" if ref.is_int else ("bool" if ref.ttype.dtype == "bool" else "float")
    node = Node("load", level="elem", dtype=dtype, attrs={"field": ref.field, "kind": "pending"}, name=ref.field)
    return Pending(Val(node, tuple(ref.shape)), {node.id: (ref, list(range(len(ref.shape))))})


def defer_iota(length: int) -> Pending:
    from ..lower import Val

    node = Node("load", level="elem", dtype="int", attrs={"field": "arange", "kind": "pending"}, name="arange")
    return Pending(Val(node, (length,)), {node.id: (IotaRef(length), [0])})


def iota_at(lw, position: int, rank: int, length: int, fx_node) -> Node:
    """An arange of `length` placed at dim `position` of a value of rank `rank` (right-aligned
    against the rows and the column, as broadcasting aligns): the column index, or a row's index
    along a row dim (`rowiota`, row level). Its length must be that axis's: the index counts up to
    the axis's size, not the arange's."""
    full = len(lw.rows) + 1
    axis = position + full - rank
    if axis < 0:
        raise lw.refuse(fx_node, "an arange along no axis of the rows or the columns")
    if axis == full - 1:
        lw.set_width(length, fx_node)  # refuses an arange of another length than the columns'
        return lw.column_iota()
    if lw.rows[axis] != length:
        raise lw.refuse(fx_node, f"an arange of {length} placed along a row dim of {lw.rows[axis]} (in the example)")
    return Node("rowiota", level="row", dtype="int", attrs={"axis": axis}, name=f"pos{axis}")


def substitute(node: Node, repl: dict) -> Node:
    memo: dict[int, Node] = {}

    def go(n: Node) -> Node:
        if n.id in repl:
            return repl[n.id]
        if n.id in memo:
            return memo[n.id]
        if not n.args:
            memo[n.id] = n
            return n
        args = tuple(go(a) for a in n.args)
        memo[n.id] = Node(n.op, args, level=level_of(*args), dtype=n.dtype, attrs=dict(n.attrs), name=n.name)
        return memo[n.id]

    return go(node)


def materialize(lw, p: Pending, fx_node):
    from ..lower import TensorRef, Val

    shape = tuple(p.val.shape)
    repl = {}
    for nid, (ref, positions) in p.maps.items():
        if isinstance(ref, IotaRef):
            repl[nid] = iota_at(lw, positions[0], len(shape), ref.length, fx_node)
            continue
        aligned = [1] * len(shape)
        for size, pos in zip(ref.shape, positions):
            aligned[pos] = size
        repl[nid] = lw.load(TensorRef(ref.field, tuple(aligned), ref.ttype, ref.is_int), fx_node).node
    return Val(substitute(p.val.node, repl), shape)


def elementwise(lw, op: str, vals: list, out_shape, fx_node):
    """The pointwise op of `vals` (some pending): pending when every tensor operand is pending
    at one shape (scalars aside), else None (the caller materializes them)."""
    from ..lower import Val

    vals = [_column_index_as_pending(v) for v in vals]
    pend = [v for v in vals if isinstance(v, Pending)]
    if len({tuple(p.val.shape) for p in pend}) != 1 or tuple(pend[0].val.shape) != tuple(out_shape):
        return None
    if any(not isinstance(v, Pending) and v.shape and v.node.level not in ("const", "global") for v in vals):
        return None
    nodes = [v.val.node if isinstance(v, Pending) else v.node for v in vals]
    maps = {k: m for p in pend for k, m in p.maps.items()}
    return Pending(Val(lw.pointwise(op, nodes, fx_node), tuple(out_shape)), maps)


def _column_index_as_pending(v):
    """The column index (an arange of the columns' width, placed last) beside a pending value
    (arange(T)[None, :] < lengths[:, None]): pending too, so that the two meet at the rank where
    the lengths' dims are known; placed there it is the column index again (iota_at)."""
    if isinstance(v, Pending) or v.node.op != "iota" or not v.shape:
        return v
    node = Node("load", level="elem", dtype="int", attrs={"field": "arange", "kind": "pending"}, name="arange")
    from ..lower import Val

    return Pending(Val(node, tuple(v.shape)), {node.id: (IotaRef(v.shape[-1]), [len(v.shape) - 1])})


def _fresh(p: Pending) -> Pending:
    """`p` with new placeholder nodes: a placement is its own, so one pending value placed at two
    positions and combined (ar[:, None] >= ar[None, :], p[:, None] - p[None, :]) keeps both
    (keyed by one node, the second placement overwrote the first: a red team, session 42)."""
    from ..ir import walk
    from ..lower import Val

    olds = {n.id: n for n in walk(p.val.node) if n.id in p.maps}
    repl = {nid: Node("load", level="elem", dtype=n.dtype, attrs=dict(n.attrs), name=n.name) for nid, n in olds.items()}
    maps = {repl[nid].id: placement for nid, placement in p.maps.items() if nid in repl}
    return Pending(Val(substitute(p.val.node, repl), p.val.shape), maps)


def view(lw, p: Pending, fx_node, new_shape):
    from ..lower import Val

    name = fx_node.target._schema.name.split("::")[1]
    if tuple(new_shape) == tuple(p.val.shape):
        return p
    if name == "broadcast_in_dim":
        bdims = lw.bdims(fx_node)
    else:  # a reshape that only adds or drops size-1 dims (positions.view(1, -1, 1)): its sizes move
        old = [i for i, s in enumerate(p.val.shape) if s != 1]
        new = [i for i, s in enumerate(new_shape) if s != 1]
        if [p.val.shape[i] for i in old] != [new_shape[i] for i in new]:
            return None
        bdims = dict(zip(old, new))
        if any(pos not in bdims for _, positions in p.maps.values() for pos in positions):
            return None
    maps = {k: (ref, [bdims[pos] for pos in positions]) for k, (ref, positions) in p.maps.items()}
    moved = _fresh(Pending(Val(p.val.node, tuple(new_shape)), maps))
    if len(new_shape) == len(lw.rows) + 1:
        return materialize(lw, moved, fx_node)
    return moved
