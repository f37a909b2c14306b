"""Views that merge or split contiguous axes of S, for the axis-reduction family.

References reshape before they reduce: InstanceNorm views [B, C, H, W] as [1, B*C, H, W] and
reduces dims (0, 2, 3); GroupNorm splits C into (groups, C/groups) and merges H*W, then
reduces dims (2, 3) of [B, g, C/g, H*W]. A view of a contiguous tensor only regroups its
row-major axes, so every such shape is a grouping of one finer list of axes, the *atoms*:
S's signature dims, each split where some view of the whole tensor cuts it ([B, 8*G, H, W]
-> atoms B, 8, G, H, W). In atoms, a reduction over any view's dims is a reduction over a
set of atoms, and the family's [O, R, I] layout is chosen over atoms instead of S's dims.

`refine` finds the atoms from the shapes of a traced graph; `match` maps a shape onto them
(each non-1 dim spans a run of consecutive atoms, in order; runs may skip atoms, which a
broadcast value is constant along). Anything else (a view that mixes axes, a permute, a
shape that maps onto the atoms in two ways) does not match, and the lowering refuses it.
"""
from __future__ import annotations

import math

import torch

from ...base import AgentRefused
from ....signature import Dim


def _literal(size) -> bool:
    """A size fixed in the reference (GroupNorm's 8 groups), not one that follows a dim. A symbolic
    expression that is a constant on the dims the spec allows counts too: unflatten(-1, (n // 3, 3))
    of a 3*D dim traces its 3 as n // (n // 3), constant at every multiple of the traced sizes."""
    if not isinstance(size, torch.SymInt):
        return isinstance(size, int)
    expr = size.node.expr
    if getattr(expr, "is_number", False):
        return True
    env = size.node.shape_env  # (torch 2.14 renamed var_to_val; 2.11 has only the old name)
    values = getattr(env, "backed_var_to_val", None) or getattr(env, "var_to_val", {})
    hints = {s: values.get(s) for s in expr.free_symbols}
    if not hints or any(v is None for v in hints.values()):
        return False
    try:
        return all(int(expr.subs({s: int(v) * k for s, v in hints.items()})) == _hint(size) for k in (2, 3, 5))
    except (TypeError, ValueError):  # an expression sympy cannot evaluate to a number
        return False


def _hint(size) -> int:
    return int(size.node.hint) if isinstance(size, torch.SymInt) else int(size)


def graph_shapes(traces) -> list[tuple[tuple[int, bool], ...]]:
    """(size, literal) per dim of every tensor value in the traces' fx graphs."""
    out = []
    for g in traces:
        for n in g.graph.graph.nodes:
            vals = n.meta.get("val")
            for v in vals if isinstance(vals, (tuple, list)) else (vals,):
                if isinstance(v, torch.Tensor):
                    out.append(tuple((_hint(s), _literal(s)) for s in v.shape))
    return out


def refine(dims: tuple[Dim, ...], sizes: tuple[int, ...], shapes) -> tuple[tuple[Dim, ...], tuple[int, ...]]:
    """The atoms (Dims and example sizes) of S = `dims` under the views in `shapes`: a shape
    of S's numel whose cumulative products cut inside a dim of S splits it there. A shape
    whose cuts are not a split (a permute: a cut that no prefix of S divides) is left out
    here; the lowering refuses it if it reaches an elem value."""
    total = math.prod(sizes)
    bounds = [math.prod(sizes[:i]) for i in range(len(sizes) + 1)]
    cuts: set[int] = set()
    literal: set[tuple[int, int]] = set()
    for shape in shapes:
        if math.prod(s for s, _ in shape) != total or total <= 1:
            continue
        acc, mine, lits = 1, set(), set()
        for size, lit in shape:
            if size == 1:
                continue
            lo, acc = acc, acc * size
            mine.add(acc)
            if lit:
                lits.add((lo, acc))
        if all(_splits(c, bounds) for c in mine):
            cuts |= mine
            literal |= lits
    atoms, atom_sizes = [], []
    for d, lo, hi in zip(dims, bounds, bounds[1:]):
        points = [lo] + sorted(c for c in cuts if lo < c < hi) + [hi]
        if len(points) == 2:
            atoms.append(d)
            atom_sizes.append(hi // lo if lo else 1)
            continue
        pieces = [(a, b) for a, b in zip(points, points[1:])]
        if any(b % a for a, b in pieces):
            raise AgentRefused(f"views split dim {d} inconsistently")
        fixed = [b // a if (a, b) in literal else None for a, b in pieces]
        if d.is_literal:
            atoms += [Dim.literal(b // a) for a, b in pieces]
        else:
            free = [i for i, f in enumerate(fixed) if f is None]
            if len(free) != 1 or d.add:
                raise AgentRefused(f"a view splits dim {d} into parts that are not one dim and constants")
            k = math.prod(f for f in fixed if f is not None)
            g = math.gcd(d.mul, d.div * k)
            part = Dim(d.symbol, d.mul // g, d.div * k // g, 0)
            atoms += [part if f is None else Dim.literal(f) for f in fixed]
        atom_sizes += [b // a for a, b in pieces]
    return tuple(atoms), tuple(atom_sizes)


def _splits(cut: int, bounds: list[int]) -> bool:
    """`cut` (a cumulative product of a view) lies on a boundary of S or splits one dim."""
    for lo, hi in zip(bounds, bounds[1:]):
        if lo <= cut <= hi:
            return cut % lo == 0 and hi % cut == 0
    return False


def match(atoms: tuple[int, ...], shape) -> tuple[tuple[int, ...], ...] | None:
    """For each dim of `shape`, the atoms it spans (() for a size-1 dim): runs of consecutive
    atoms whose product is the dim's size, in order. None when no mapping or more than one."""
    shape = tuple(shape)
    nz = [a for a, s in enumerate(atoms) if s != 1]
    want = [(q, s) for q, s in enumerate(shape) if s != 1]
    found: list[list[tuple[int, ...]]] = []

    def walk(p: int, k: int, acc: list):
        if len(found) > 1:
            return
        if k == len(want):
            found.append(list(acc))
            return
        target = want[k][1]
        for start in range(p, len(nz)):
            prod = 1
            for end in range(start, len(nz)):
                prod *= atoms[nz[end]]
                if prod > target:
                    break
                if prod == target:
                    # a run spans the atoms between its ends (size-1 atoms included)
                    walk(end + 1, k + 1, acc + [tuple(range(nz[start], nz[end] + 1))])
                    break
    walk(0, 0, [])
    if len(found) != 1:
        return None
    spans = [()] * len(shape)
    for (q, _), run in zip(want, found[0]):
        spans[q] = run
    return tuple(spans)


def covered(atoms: tuple[int, ...], spans) -> set[int]:
    """The non-1 atoms a matched shape spans."""
    return {a for run in spans for a in run if atoms[a] != 1}
