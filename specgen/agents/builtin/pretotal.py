"""Sums over every row that per-element values need: computed before the row pass.

A loss averaged over the rows a mask keeps (NLL with ignore_index, a masked MSE) divides every
element's gradient by the count of kept rows: a sum over all rows (a `post` value) inside
per-element values, which one pass over the rows cannot give. When that sum reads only per-row
loads (the targets, the mask: no reduction over a row's columns), it is known before the row
pass: `hoist` rewrites each such `globalreduce` into a `pretotal` node, one value for the launch
(level global), that a one-block prologue kernel sums in a fixed order (deterministic) into the
workspace, and every kernel of the direction reads like a 0-d input (emit_pretotal.py).
"""
from __future__ import annotations

from .ir import Node, level_of, walk

# ops whose level is their own, not their arguments' highest (ir.py): kept as they are
_OWN_LEVEL = {"rowreduce", "gather", "colreduce", "globalreduce", "scan", "pretotal"}


class NotBeforehand(Exception):
    """A sum over rows that depends on the row pass itself: it cannot be computed beforehand."""


def column_only(value: Node) -> bool:
    """Is `value` a function of the column alone: [W] parameters ("col" loads), the column index,
    launch-wide values (cross-entropy's class weights, read at a row's target)."""
    return not any(n.level in ("row", "post") or n.op in _OWN_LEVEL
                   or (n.op == "load" and n.level == "elem" and n.attrs.get("kind") != "col") for n in walk(value))


def knowable_beforehand(summand: Node) -> str | None:
    """None when the per-row `summand` reads only row loads, scalars, dims, constants and column
    parameters at a per-row index (no reduction over a row's columns, no element of a row), else
    what it reads that is not."""
    def follow(n: Node):  # a [W] parameter at the row's index: one read in the prologue
        return (n.args[1],) if n.op == "gather" and column_only(n.args[0]) else n.args

    for n in walk(summand, follow):
        if n.op == "gather" and column_only(n.args[0]):
            continue
        if n.level in ("elem", "post") or n.op in _OWN_LEVEL - {"pretotal"}:
            return f"a {n.op} value ({n.level})"
    return None


def hoist(value: Node, memo: dict[int, Node]) -> Node:
    """`value` with every sum over rows it depends on as a pretotal (a launch-wide value), and
    the nodes above re-levelled (a post value of them becomes global, elem or row). `memo`
    (old node id -> new node) is shared by the program's stores, so a sum read by two outputs
    is one pretotal. NotBeforehand when one such sum depends on the row pass."""

    def rebuilt(n: Node) -> Node:
        if n.id in memo:
            return memo[n.id]
        if n.op == "globalreduce":
            reason = knowable_beforehand(n.args[0])
            if reason is not None or n.attrs.get("kind", "sum") != "sum":
                raise NotBeforehand(f"a sum over rows of {reason}" if reason else f"a {n.attrs.get('kind')} over rows")
            new = Node("pretotal", n.args, level="global", dtype=n.dtype, attrs=dict(n.attrs), name=n.name)
        elif n.op == "colreduce":
            raise NotBeforehand("a sum over rows per column")
        else:
            args = tuple(rebuilt(a) for a in n.args)
            if all(a is b for a, b in zip(args, n.args)):
                new = n
            else:
                level = n.level if n.op in _OWN_LEVEL else level_of(*args)
                new = Node(n.op, args, level=level, dtype=n.dtype, attrs=dict(n.attrs), name=n.name)
        memo[n.id] = new
        return new

    return rebuilt(value)
