"""Family: reductions over any contiguous block of axes (and their backward), arg-reductions.

The tensor space is the primary input's shape S = [lead..., block..., inner...], viewed as
[O, R, I]: O = prod(lead), R = prod(block) (the reduced axes), I = prod(inner). A kept value
(one per (o, i): a reduction's result, or an input of the kept shape [lead..., inner...] with
or without the block's size-1 dims) is a `row` of the row-program IR, an element of S is an
`elem`, and the row's columns are the reduced axis, strided by I in memory. So the IR, its
optimizations and the CPU interpreter (on a transposed view, `run_axis_program`) are shared
with the row family; only the layout and the emitter (axis_emit.py) are this family's.

    sum / mean / amax / amin over dim 1 of [B, C, H, W]      O = B, R = C, I = H*W
    x.sum() or F.mse_loss(a, b) (all axes to a scalar)       O = 1, R = numel, I = 1
    torch.max(x, dim=-1) (values, indices), argmax, argmin   O = rows, R = D, I = 1

S's dims are first split where a view of the whole tensor splits them (axis_views.py: the
*atoms*), and the block is a run of atoms, so reductions after views that merge or split
contiguous dims are reductions over a block too:

    F.instance_norm: var over (0, 2, 3) of [1, B*C, H, W]         O = B*C, R = H*W, I = 1
    nn.GroupNorm(8, 8*G): var over (2, 3) of [B, 8, G, H*W]       O = B*8, R = G*H*W, I = 1
    nn.BatchNorm2d in training: over (0, 2, 3)                    O = C, R = B x H*W (both ends)

Backward: the reduced values' gradients broadcast back over the block (sum, mean, losses,
normalizations), amax's ties (a count over the block, then a pass), max/min's scatter at the
index, a sum over part of the block scaled per row and summed over the rest (PartialSum).
Outside this (two different blocks in one program, a view that mixes axes, a parameter that
varies along the block): AgentRefused.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...base import AgentRefused
from ..ir import Node, Program, Store, const
from ..lower import Cat, Lowering, TensorRef, Val, _contiguous_strides, _example, _raw_shape, _shape
from ..modules import Uninit
from ..trace import trace
from .scan import Rev

REDUCE_PRIMS = {"sum": "sum", "amax": "max", "amin": "min", "prod": "prod"}
ARG_ATEN = {"argmax": "argmax", "argmin": "argmin"}


@dataclass(frozen=True)
class Layout:
    """S split as lead | block | inner (each a tuple of signature Dims), S[start:stop] the block.

    ends False: the block is reduced: [O, R, I] = [lead, block, inner].
    ends True: the block is kept and lead and inner are reduced (a sum over dims 0 and 2 of
    [B, C, L]): [O, R, I] = [block, lead x inner, 1], the reduced index j = a * RB + b
    (RB = prod(inner)) at offset (a * O + o) * RB + b."""

    shape: tuple[int, ...]  # S at the trace's example sizes
    start: int
    stop: int
    lead: tuple = ()
    block: tuple = ()
    inner: tuple = ()
    ends: bool = False

    @property
    def red_axes(self) -> list[int]:
        if self.ends:
            return list(range(self.start)) + list(range(self.stop, len(self.shape)))
        return list(range(self.start, self.stop))

    @property
    def kept_dims(self) -> tuple:
        return self.block if self.ends else self.lead + self.inner

    @property
    def red_dims(self) -> tuple:
        return self.lead + self.inner if self.ends else self.block

    @property
    def kept_shape(self) -> tuple[int, ...]:
        return tuple(s for a, s in enumerate(self.shape) if a not in self.red_axes)

    @property
    def kept_keepdim(self) -> tuple[int, ...]:
        return tuple(1 if a in self.red_axes else s for a, s in enumerate(self.shape))

    @property
    def red_size(self) -> int:
        return math.prod(self.shape[a] for a in self.red_axes)

    def sizes(self, dims: dict[str, int]) -> tuple[int, int, int]:
        prod = lambda ds: math.prod(d.resolve(dims) for d in ds)
        if self.ends:
            return prod(self.block), prod(self.lead) * prod(self.inner), 1
        return prod(self.lead), prod(self.block), prod(self.inner)

    def describe(self) -> str:
        name = lambda ds: " * ".join(map(str, ds)) or "1"
        if self.ends:
            return f"O = {name(self.block)}, R = {name(self.lead)} x {name(self.inner)} (both ends), I = 1"
        return f"O = {name(self.lead)}, R = {name(self.block)}, I = {name(self.inner)}"


@dataclass
class AxisProgram(Program):
    """A row program whose rows are the (o, i) pairs and whose columns are the block."""

    layout: Layout | None = None

    def describe(self) -> str:
        return super().describe().replace("program ", f"axis program ({self.layout.describe()}) ", 1)


def with_layout(program: Program, layout: Layout) -> AxisProgram:
    """An optimized copy of an AxisProgram (the passes build plain Programs) with its layout."""
    return AxisProgram(program.op, program.direction, program.row_dims, program.width, program.width_example,
                       program.stores, program.group_div, program.dims_example, layout=layout)


def _nonunit(shape) -> tuple:
    return tuple(s for s in shape if s != 1)


def find_layout(spec, traced, others=()) -> Layout:
    """The block of the forward's reductions: every reduction of the forward must reduce the
    same contiguous block of S's atoms (S's dims split where a view of the forward or of
    `others`, the other directions' traces, splits them: axis_views.py; size-1 dims aside)."""
    from .axis_views import covered, graph_shapes, match, refine

    sig = spec.signature
    primary = max(sig.inputs, key=lambda p: p.type.ndim)
    dims = traced.dims
    sig_shape = tuple(d.resolve(dims) for d in primary.type.dims)
    if not sig_shape:
        raise AgentRefused(f"{spec.path}: no tensor input of rank >= 1")
    atoms, shape = refine(tuple(primary.type.dims), sig_shape, graph_shapes([traced] + list(others)))
    numel = math.prod(shape)
    blocks, totals = {}, []  # reduction node -> its block of atoms (start, stop, ends)
    reduced: dict = {}  # reduction node -> (the S-view its input was, the atoms it reduced): for chains
    for n in traced.graph.graph.nodes:
        if n.op != "call_function" or not hasattr(n.target, "_schema"):
            continue
        name = n.target._schema.name.split("::")[1]
        src = n.args[0] if n.args else None
        if name in REDUCE_PRIMS or name in ("var",):
            axes = list(n.args[1]) if len(n.args) > 1 and n.args[1] is not None else None
        elif name in ARG_ATEN or (name in ("max", "min") and len(n.args) > 1):
            dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
            axes = None if dim is None else [dim]
        else:
            continue
        if not isinstance(src, torch.fx.Node):
            raise AgentRefused(f"{spec.path}: a reduction of a constant")
        src_shape = _shape(src)
        spans = match(shape, src_shape) if math.prod(src_shape) == numel else None
        earlier = _keepdim_chain(src, reduced) if spans is None else None
        if earlier is not None and len(reduced[earlier][0]) == len(src_shape):
            # the rest of a reduction already begun, keepdim (x.sum(3, keepdim=True).sum(2, keepdim=True)):
            # the chain reduces the union, one block (its partial sums: PartialSum in the lowering)
            view, before = reduced[earlier]
            spans = match(shape, view)
        elif spans is None or covered(shape, spans) != {a for a, s in enumerate(shape) if s != 1}:
            # a total of kept values (a loss's mean over rows): checked by the lowering
            totals.append(src_shape)
            continue
        else:
            earlier, view, before = None, src_shape, set()
        # the reduced dims of the view, as atoms of S
        view_axes = range(len(src_shape)) if axes is None else {a % len(src_shape) for a in axes}
        axes = sorted({a for q in view_axes for a in spans[q]} | before)
        axes = [a for a in axes if shape[a] != 1] or axes
        if not axes:
            raise AgentRefused(f"{spec.path}: a reduction over size-1 dims only")
        reduced[n] = (view, set(axes))
        if earlier is not None:
            blocks.pop(earlier, None)  # its block was only the chain's first part
        if axes == list(range(axes[0], axes[-1] + 1)):
            blocks[n] = (axes[0], axes[-1] + 1, False)
            continue
        kept = [a for a in range(len(shape)) if a not in axes]
        if kept != list(range(kept[0], kept[-1] + 1)) or kept[0] == 0 or kept[-1] == len(shape) - 1:
            raise AgentRefused(f"{spec.path}: a reduction over axes {axes}: neither contiguous nor both ends")
        blocks[n] = (kept[0], kept[-1] + 1, True)
    distinct = set(blocks.values())
    if len(distinct) != 1:
        raise AgentRefused(f"{spec.path}: {'no reduction' if not distinct else 'reductions over different axes'}")
    start, stop, ends = distinct.pop()
    d = list(atoms)
    return Layout(shape, start, stop, tuple(d[:start]), tuple(d[start:stop]), tuple(d[stop:]), ends)


def _keepdim_chain(src, reduced: dict):
    """The reduction `src` is the keepdim result of (through the broadcast that keeps its dims,
    views, casts and a scale by a number: a mean's division), when it is one find_layout
    recorded; else None."""
    node = src
    while isinstance(node, torch.fx.Node) and node not in reduced:
        name = node.target._schema.name.split("::")[1] if hasattr(node.target, "_schema") else None
        if name in ("div", "mul") and len(node.args) == 2 and not isinstance(
                getattr(node.args[1], "meta", {}).get("val"), torch.Tensor):
            node = node.args[0]
            continue
        if name not in ("broadcast_in_dim", "view_of", "convert_element_type", "clone") or not node.args:
            return None
        node = node.args[0]
    return node if isinstance(node, torch.fx.Node) else None


@dataclass(frozen=True)
class PartialSum:
    """A sum of an elem value over part of the block (GroupNorm's backward sums over H*W per
    channel, scales by a per-row value, then sums the channels of each group): kept lazy, it
    is only scaled by values constant over the block and summed over the rest of the block,
    which is then one rowreduce of the scaled summand. No `.node`: any other use refuses."""

    summand: Node
    shape: tuple
    atoms: frozenset


@dataclass(frozen=True)
class KeptPieces:
    """torch.cat of kept values (keepdim reductions, [B, 1, H, W] each) along a dim where each
    has size 1 (CBAM's channel pool: the max and the mean over C as [B, 2, H, W]): stored only,
    each piece a `piece` store of its kept values."""

    pieces: tuple
    shape: tuple
    dim: int


class AxisLowering(Lowering):
    """The row lowering with the [O, R, I] layout's shape classification."""

    def __init__(self, traced, layout: Layout):
        super().__init__(traced)
        self.layout = layout
        self.row_dims = list(layout.kept_dims)
        self.rows = (math.prod(layout.kept_shape),)

    def trailing_fold(self, primary) -> list:
        return []  # the [O, R, I] layout says what a row is: no folding of trailing axes

    def op_iota(self, fx_node, length, *, start=0, step=1, dtype=torch.int64, **_):
        """torch.arange over one atom of S (a soft-argmin's disparities arange(D) along the reduced
        axis of [B, D, H, W]): each element's coordinate along that atom, read as a `part` value
        with no tensor behind it (axis_emit.elem_load_expr computes it from the element's index)."""
        (n,) = _shape(fx_node)
        atoms = [a for a, size in enumerate(self.layout.shape) if size == n]
        if n <= 1 or len(atoms) != 1 or not isinstance(start, int) or not isinstance(step, int):
            raise self.refuse(fx_node, "an arange (torch.arange) that is not the coordinate along one axis")
        a = atoms[0]
        return Val(Node("load", level="elem", dtype="float" if dtype.is_floating_point else "int", name=f"arange_{a}",
                        attrs={"field": f"arange_{a}", "kind": "part", "row_div": [], "offset": None,
                               "atoms": (a,), "arange": (start, step)}), (n,))

    def refuse(self, fx_node, what: str) -> AgentRefused:
        from ..trace import where
        return AgentRefused(f"{where(self.spec, fx_node) if fx_node is not None else self.spec.path}: {what}: "
                            f"outside the builtin generator's axis-reduction family")

    # ------------------------------------------------ sizes and calls
    def dim_node(self, size: int, fx_node) -> Node:
        """A size: one signature dim, or a product of consecutive dims of S (a numel)."""
        if size in self.size_dims or size in (0, 1):
            return super().dim_node(size, fx_node)
        dims = self.layout.lead + self.layout.block + self.layout.inner
        shape = self.layout.shape
        for a in range(len(shape)):
            for b in range(a + 1, len(shape) + 1):
                if math.prod(shape[a:b]) == size:
                    return self.dims_product(dims[a:b], f"size_{size}")
        return super().dim_node(size, fx_node)

    def op_empty_strided(self, fx_node, *args, **kwargs):  # only ever filled (full_like) by the traces
        return Val(const(0.0), _shape(fx_node))

    # ------------------------------------------------ shape classes
    def spans(self, shape):
        from .axis_views import match
        return match(self.layout.shape, shape)

    def kept_sizes(self, shape) -> bool:
        """`shape` has the kept atoms' sizes, in order, with size-1 dims anywhere."""
        lay = self.layout
        kept = [s for a, s in enumerate(lay.shape) if a not in lay.red_axes and s != 1]
        return [s for s in shape if s != 1] == kept

    def shape_class(self, shape) -> str | None:
        """elem: a view of S (every atom); row: of the kept atoms exactly, in order; part: a
        broadcast value's shape (some atoms absent: only a value constant over the absent
        ones, per row or global, may have it); None: not a grouping of S's atoms."""
        from .axis_views import covered

        lay = self.layout
        shape = tuple(shape)
        if shape == lay.shape:
            return "elem"
        if not shape or all(s == 1 for s in shape):
            return "row" if math.prod(lay.kept_shape) == 1 else "global"
        spans = self.spans(shape)
        if spans is None:
            return None
        got = covered(lay.shape, spans)
        nonunit = {a for a, s in enumerate(lay.shape) if s != 1}
        if got == nonunit:
            return "elem"
        if got == nonunit - set(lay.red_axes):
            return "row"
        return "part"

    def load(self, ref: TensorRef, fx_node, *, width=None, offset=None) -> Val:
        if offset is not None or width is not None:
            raise self.refuse(fx_node, "a slice of an input")
        cls = self.shape_class(ref.shape)
        dtype = "int" if ref.is_int else ("bool" if ref.ttype.dtype == "bool" else "float")
        if cls is None:
            raise self.refuse(fx_node, f"input {ref.field} of shape {ref.shape} that is neither S {self.layout.shape} "
                                       f"nor its kept shape {self.layout.kept_shape}")
        if cls == "part":  # a parameter over some atoms (GroupNorm's weight [C] of [B, g, C/g, L]):
            # read at each element's coordinates in its atoms (axis_emit.part_index)
            return Val(Node("load", level="elem", dtype=dtype, name=ref.field,
                            attrs={"field": ref.field, "kind": "part", "row_div": [], "offset": None,
                                   "atoms": self.atoms_of(ref.shape)}), ref.shape)
        if cls == "global" or not ref.shape:
            return Val(Node("load", level="global", dtype=dtype, attrs={"field": ref.field, "kind": "global"},
                            name=ref.field), ref.shape)
        if cls == "row":
            return Val(Node("load", level="row", dtype=dtype, attrs={"field": ref.field, "kind": "row", "row_div": []},
                            name=ref.field), ref.shape)
        return Val(Node("load", level="elem", dtype=dtype,
                        attrs={"field": ref.field, "kind": "elem", "row_div": [], "offset": None},
                        name=ref.field), ref.shape)

    def part_view(self, old, new) -> bool:
        """A value over some atoms (a parameter's) regrouped (the same atoms) or broadcast over
        more of them (InstanceNorm's weight repeated per sample): computed at each element's
        coordinates, it is the same node."""
        if self.shape_class(old) not in ("part", "row") or self.shape_class(new) not in ("part", "row", "elem"):
            return False
        mine, theirs = set(self.atoms_of(old)), set(self.atoms_of(new))
        return mine == theirs if math.prod(new) == math.prod(old) else mine < theirs

    def atoms_of(self, shape) -> tuple[int, ...]:
        """The non-1 atoms of S a shape of its grouping spans, in order."""
        from .axis_views import covered
        return tuple(sorted(covered(self.layout.shape, self.spans(shape))))

    def value(self, arg, fx_node, defer: bool = False):
        # never pending (broadcast.py): a lower-rank input is a part load here, read at each
        # element's coordinates in its atoms, whatever is computed on it first
        if isinstance(arg, torch.fx.Node) and isinstance(self.env.get(arg), (KeptPieces, Cat)):
            raise self.refuse(fx_node, "a concatenation used before it is stored")
        got = super().value(arg, fx_node, False)
        if isinstance(got, PartialSum):
            raise self.refuse(fx_node, "a sum over part of the reduced axes used other than scaled and summed on")
        return got

    def partial_or_value(self, arg, fx_node):
        got = self.env.get(arg) if isinstance(arg, torch.fx.Node) else None
        return got if isinstance(got, PartialSum) else self.value(arg, fx_node)

    def elementwise(self, op: str, args, fx_node):
        vals = [self.partial_or_value(a, fx_node) for a in args]
        partial = [v for v in vals if isinstance(v, PartialSum)]
        if not partial:
            return super().elementwise(op, args, fx_node)
        # sum(a) +- sum(b) == sum(a +- b) over the same atoms (GroupNorm's weight gradient:
        # sum(g * x) - sum(g) * mean, both over H*W per channel)
        if len(partial) == 2 and len(vals) == 2 and op in ("add", "sub") and partial[0].atoms == partial[1].atoms:
            node = self.pointwise(op, [partial[0].summand, partial[1].summand], fx_node)
            return PartialSum(node, _shape(fx_node), partial[0].atoms)
        # sum(e) * v == sum(e * v) when v is constant over the summed atoms: per row, global, or
        # a value over other atoms (GroupNorm's weight per channel, constant over H*W)
        others = [v for v in vals if not isinstance(v, PartialSum)]
        part = partial[0]
        if len(partial) != 1 or op not in ("mul", "div", "neg") or (op == "div" and vals[0] is not part) \
                or not all(self.constant_over(v, part.atoms) for v in others):
            raise self.refuse(fx_node, f"a {op} of a sum over part of the reduced axes")
        node = self.pointwise(op, [part.summand if isinstance(v, PartialSum) else v.node for v in vals], fx_node)
        return PartialSum(node, _shape(fx_node), part.atoms)

    def constant_over(self, v: Val, atoms: frozenset) -> bool:
        """Is `v` constant along every atom in `atoms`? Per row, global, or (a broadcast value,
        its shape spanning some atoms only) absent from all of them."""
        if v.node.level in ("const", "global", "row"):
            return v.node.level != "row" or not (atoms - set(self.layout.red_axes))
        return self.shape_class(v.shape) == "part" and not (set(self.atoms_of(v.shape)) & atoms)

    def op_sum(self, fx_node, src, dims, **kw):
        return self.reduce("sum", self.partial_or_value(src, fx_node), list(dims), fx_node)

    def view(self, src, fx_node):
        got = self.env[src]
        new_shape = _shape(fx_node)
        if isinstance(got, PartialSum):
            if self.shape_class(new_shape) is None:
                raise self.refuse(fx_node, f"a view from {got.shape} to {new_shape}")
            return PartialSum(got.summand, new_shape, got.atoms)
        if isinstance(got, KeptPieces) and tuple(new_shape) == tuple(got.shape):
            return got  # clone / view_of of the concatenation
        if isinstance(got, (Cat, KeptPieces)):
            raise self.refuse(fx_node, "a concatenation")
        if isinstance(got, Rev):  # a flip awaits a scan; this family has none
            raise self.refuse(fx_node, "a view of a flipped value")
        if isinstance(got, Node):
            return got
        if isinstance(got, Uninit):  # a module's parameter before its fill (modules.py)
            return Uninit(new_shape)
        if isinstance(got, TensorRef):
            got = self.load(got, fx_node)
        old_level, new_cls = got.node.level, self.shape_class(new_shape)
        if new_cls is None and old_level == "row" and self.kept_sizes(new_shape):
            # a kept value given its size-1 dims back where two atoms have one size (a softmax's max
            # over the last axis of [B, H, N, N] kept as [B, H, N, 1]): the shape alone matches
            # two ways, but a kept value spans the kept atoms
            return Val(got.node, new_shape)
        # a value per row (or constant) may take any grouping of the atoms (a broadcast over
        # the absent ones); a value per element only another view of all of S
        if new_cls is None and old_level not in ("const", "global"):
            raise self.refuse(fx_node, f"a view from {got.shape} to {new_shape}")
        # a value per element: another view of all of S, or a parameter's value regrouped or broadcast
        if old_level == "elem" and (new_cls != "elem" or self.shape_class(got.shape) in ("part", "row")) \
                and not self.part_view(got.shape, new_shape):
            raise self.refuse(fx_node, f"a view from {got.shape} to {new_shape}")
        return Val(got.node, new_shape)

    # ------------------------------------------------ pieces: a concatenation of kept values
    def op_cat(self, fx_node, tensors, dim=0):
        """torch.cat of kept values along a dim where each has size 1 (CBAM's [B, 2, H, W] of
        the max and the mean over C): stored piece by piece, never read back."""
        shape = _shape(fx_node)
        d = dim % len(shape) if shape else 0
        vals = [self.value(t, fx_node) for t in tensors]
        rest = tuple(shape[:d]) + tuple(shape[d + 1:])
        if len(vals) < 2 or not all(
                v.node.level in ("row", "const", "global") and len(v.shape) == len(shape) and v.shape[d] == 1
                and tuple(v.shape[:d]) + tuple(v.shape[d + 1:]) == rest and self.shape_class(v.shape) == "row"
                for v in vals):
            raise self.refuse(fx_node, "a concatenation")
        return KeptPieces(tuple(vals), tuple(shape), d)

    def input_piece(self, fx_node, src, stride, storage_offset) -> Val | None:
        """Position k of an input along a dim of literal size n, one kept value per kept element
        (a concatenation's backward reads grad_out[:, k:k+1] of [B, n, H, W]): a `piece` load."""
        got = self.env.get(src) if isinstance(src, torch.fx.Node) else None
        if not isinstance(got, TensorRef):
            return None
        old, new = tuple(got.shape), tuple(_shape(fx_node))
        diff = [a for a in range(len(old)) if len(new) == len(old) and new[a] != old[a]]
        if len(diff) != 1 or new[diff[0]] != 1 or self.shape_class(new) != "row":
            return None
        d = diff[0]
        contiguous = _contiguous_strides(old)
        strides = [_example(s) for s in stride]
        offset = _example(storage_offset) or 0
        dims = self.types[got.field].dims
        if strides != contiguous or offset % contiguous[d] or not 0 <= offset // contiguous[d] < old[d] \
                or len(dims) != len(old) or dims[d].symbol is not None:
            return None
        dtype = "int" if got.is_int else ("bool" if got.ttype.dtype == "bool" else "float")
        return Val(Node("load", level="row", dtype=dtype, name=got.field,
                        attrs={"field": got.field, "kind": "piece", "row_div": [],
                               "piece": (d, offset // contiguous[d], old[d])}), new)

    # ------------------------------------------------ reductions
    def reduced_atoms(self, shape, dims) -> set[int] | None:
        """The non-1 atoms that reducing `dims` of a value of `shape` reduces (None: not a view)."""
        spans = self.spans(shape)
        if spans is None:
            return None
        return {a for d in dims for a in spans[d % len(shape)] if self.layout.shape[a] != 1} if shape else set()

    def block_of(self, shape, dims) -> bool:
        """Reducing `dims` of a view of all of S reduces exactly the layout's block."""
        if self.shape_class(shape) != "elem":
            return False
        want = {a for a in self.layout.red_axes if self.layout.shape[a] != 1}
        return self.reduced_atoms(shape, dims) == want

    def reduce(self, kind: str, val: Val, dims: list[int], fx_node, correction=None) -> Val:
        out_shape = _shape(fx_node)
        block = frozenset(a for a in self.layout.red_axes if self.layout.shape[a] != 1)
        if isinstance(val, PartialSum):  # the rest of the block: one reduction of the summand
            rest = self.reduced_atoms(val.shape, dims)
            if kind != "sum" or rest is None or rest & val.atoms:
                raise self.refuse(fx_node, f"a {kind} of a partial sum over atoms it already summed")
            if rest | val.atoms == block:
                return Val(Node("rowreduce", (val.summand,), level="row", attrs={"kind": "sum"},
                                name=fx_node.name), out_shape)
            # summed over other atoms than the block (GroupNorm's weight gradient: over H*W, then
            # over the batch): a total per element of the output's atoms
            return self.part_total(val.summand, rest | val.atoms, out_shape, fx_node)
        node = val.node
        if kind == "sum" and node.level == "elem" and node.dtype == "float" \
                and self.shape_class(val.shape) == "elem":
            some = self.reduced_atoms(val.shape, dims)
            if some and some < block:
                return PartialSum(node, out_shape, frozenset(some))
            if some and some != block and self.shape_class(out_shape) == "part":
                return self.part_total(node, some, out_shape, fx_node)
        if kind == "var":  # two sweeps: the mean, then the squared deviations from it
            if node.level != "elem" or node.dtype != "float" or not self.block_of(val.shape, dims):
                raise self.refuse(fx_node, f"a variance over dims {list(dims)} of a value of shape {val.shape}")
            wf = self.cast(self.width_node(fx_node), torch.float32, fx_node)
            total = Node("rowreduce", (node,), level="row", attrs={"kind": "sum"}, name=f"{fx_node.name}_sum")
            mean = self.pointwise("div", [total, wf], fx_node)
            dev = self.pointwise("sub", [node, mean], fx_node)
            ssq = Node("rowreduce", (self.pointwise("mul", [dev, dev], fx_node),), level="row",
                       attrs={"kind": "sum"}, name=f"{fx_node.name}_ssq")
            denom = self.pointwise("sub", [wf, const(float(correction or 0.0))], fx_node)
            return Val(self.pointwise("div", [ssq, denom], fx_node), out_shape)
        if kind not in ("sum", "prod") and node.dtype != "float":
            raise self.refuse(fx_node, f"a {kind} of {node.dtype} values")
        if node.level == "row" and val.shape and self.shape_class(val.shape) == "row" \
                and tuple(val.shape) != self.layout.shape and math.prod(self.layout.kept_shape) > 1:
            # a total over every kept element (the mean over rows of a per-row loss): post level
            if {d % len(val.shape) for d in dims} | {i for i, n in enumerate(val.shape) if n == 1} \
                    != set(range(len(val.shape))):
                # over some kept atoms (InstanceNorm's weight gradient: a per-(sample, channel) value
                # summed over the samples): a total per element of the output's atoms
                if kind != "sum" or node.dtype != "float":
                    raise self.refuse(fx_node, f"a {kind} over part of the kept dims {val.shape}")
                return self.part_total(node, self.reduced_atoms(val.shape, dims), out_shape, fx_node)
            if kind != "sum":
                raise self.refuse(fx_node, f"a {kind} over every kept element")
            return Val(Node("globalreduce", (node,), level="post", dtype="float", attrs={"kind": "sum"},
                            name=fx_node.name), out_shape)
        if node.level in ("const", "global", "row") and (not val.shape or self.block_of(val.shape, dims)):
            if kind == "prod":
                raise self.refuse(fx_node, "a product of a value constant over the reduced axes")
            if kind == "sum":
                return Val(self.pointwise("mul", [node, self.width_node(fx_node)], fx_node), out_shape)
            return Val(node, out_shape)
        part = self.reduced_atoms(val.shape, dims) if val.shape and node.level in ("const", "global", "row") \
            else None
        if part and part < {a for a in self.layout.red_axes if self.layout.shape[a] != 1} and kind != "prod":
            # constant along the reduced atoms it spans: a sum is a product with their sizes
            if kind != "sum":
                return Val(node, out_shape)
            atoms = self.layout.lead + self.layout.block + self.layout.inner
            for a in sorted(part):
                d = atoms[a]
                size = Node("dim", level="global", dtype="int", attrs={"dim": d}, name="dim_part") if d.symbol \
                    else const(d.add)
                node = self.pointwise("mul", [node, size], fx_node)
            return Val(node, out_shape)
        if not self.block_of(val.shape, dims):
            raise self.refuse(fx_node, f"a reduction over dims {list(dims)} of a value of shape {val.shape} "
                                       f"(the program reduces {self.layout.describe()})")
        dtype = node.dtype if kind in ("max", "min") else ("float" if node.dtype == "float" else "int")
        return Val(Node("rowreduce", (node,), level="row", dtype=dtype, attrs={"kind": kind}, name=fx_node.name),
                   out_shape)

    def part_total(self, summand: Node, summed: set[int] | None, out_shape, fx_node) -> Val:
        """A sum of `summand` (per element of S, or per kept element) over the atoms `summed`,
        one value per element of the output's atoms (every other non-1 atom): a `partreduce`,
        evaluated after the reductions by its own kernel (axis_emit.write_part)."""
        nonunit = {a for a, n in enumerate(self.layout.shape) if n != 1}
        space = nonunit if summand.level == "elem" else nonunit - set(self.layout.red_axes)
        cls = self.shape_class(out_shape) if out_shape else None
        keep = set(self.atoms_of(out_shape)) if cls in ("part", "row") else None
        if summed is None or keep is None or keep & summed or keep | summed != space or not summed \
                or summand.level not in ("elem", "row"):
            raise self.refuse(fx_node, f"a sum over dims to shape {out_shape} that is not a total over some atoms")
        return Val(Node("partreduce", (summand,), level="post", dtype="float",
                        attrs={"kind": "sum", "atoms": tuple(sorted(keep)), "over": summand.level},
                        name=fx_node.name), out_shape)

    def width_node(self, fx_node) -> Node:
        """R: the product of the block's dims (a global int)."""
        total = None
        for d in self.layout.red_dims:
            node = Node("dim", level="global", dtype="int", attrs={"dim": d}, name="dim_r") if d.symbol \
                else const(d.add)
            total = node if total is None else Node("mul", (total, node), level="global", dtype="int", name="r")
        return total or const(1)

    def arg_reduce(self, kind: str, fx_node, src, dim, keepdim=False):
        val = self.value(src, fx_node)
        dims = list(range(len(val.shape))) if dim is None else [dim]
        if val.node.level != "elem" or val.node.dtype != "float" or not self.block_of(val.shape, dims) or \
                (dim is None and len(self.layout.red_axes) != len(val.shape)):
            raise self.refuse(fx_node, f"an {kind} over dim {dim} of a value of shape {val.shape}")
        return Node("rowreduce", (val.node,), level="row", dtype="int", attrs={"kind": kind}, name=fx_node.name)

    def op_prod(self, fx_node, src, dims, **kw):
        return self.reduce("prod", self.value(src, fx_node), list(dims), fx_node)

    def op_argmax(self, fx_node, src, dim=None, keepdim=False):
        return Val(self.arg_reduce("argmax", fx_node, src, dim), _shape(fx_node))

    def op_argmin(self, fx_node, src, dim=None, keepdim=False):
        return Val(self.arg_reduce("argmin", fx_node, src, dim), _shape(fx_node))

    def _values_indices(self, kind, fx_node, src, dim, keepdim=False):
        index = self.arg_reduce(f"arg{kind}", fx_node, src, dim)
        # the values are the operand at the index: `arg_pair` lets the emitter take them from the
        # arg-reduction's own running value instead of reducing the row twice
        values = Node("rowreduce", index.args, level="row", dtype=index.args[0].dtype,
                      attrs={"kind": kind, "arg_pair": True}, name=f"{fx_node.name}_values")
        shape = tuple(_hint_shape(fx_node))
        return (Val(values, shape), Val(index, shape))

    def op_max(self, fx_node, src, dim=None, keepdim=False):
        if dim is None:
            raise self.refuse(fx_node, "torch.max of a whole tensor (use amax)")
        return self._values_indices("max", fx_node, src, dim, keepdim)

    def op_min(self, fx_node, src, dim=None, keepdim=False):
        if dim is None:
            raise self.refuse(fx_node, "torch.min of a whole tensor (use amin)")
        return self._values_indices("min", fx_node, src, dim, keepdim)

    def op_scatter(self, fx_node, base, dim, index, value=None, **kw):
        """A scatter along the (single) block axis at one index per kept element (the backward
        of max/min over a dim): where(r == index, value, base)."""
        b, idx = self.value(base, fx_node), self.value(index, fx_node)
        if self.layout.red_axes != [dim % len(b.shape)] \
                or idx.node.level not in ("row", "const", "global") or not self.one_per_kept(index):
            raise self.refuse(fx_node, "a scatter other than one value per kept element along the reduced axis")
        src = self.value(value, fx_node).node if isinstance(value, torch.fx.Node) else self.filled(value, fx_node)
        if src.level == "elem":
            raise self.refuse(fx_node, "a scatter of a full tensor")
        return Val(self.where(self.column_hit(idx.node, fx_node), src, b.node, fx_node), _shape(fx_node))

    def one_per_kept(self, index) -> bool:
        """Does a scatter's index hold one entry per kept element (an index of fewer, a [1, 1]
        one, touches only those in torch)."""
        raw = _raw_shape(index)
        return raw is not None and math.prod(raw) == math.prod(self.layout.kept_shape)

    def op_scatter_add(self, fx_node, base, dim, index, src, **kw):
        """gather's backward along the (single) block axis, one value per kept element (as
        op_scatter): base + where(r == index, value, 0). The row lowering's form reads its own
        column index, which is not this family's reduced index."""
        b, idx, add = self.value(base, fx_node), self.value(index, fx_node), self.value(src, fx_node)
        if self.layout.red_axes != [dim % len(b.shape)] or idx.node.level not in ("row", "const", "global") \
                or add.node.level not in ("row", "const", "global") or not self.one_per_kept(index):
            raise self.refuse(fx_node, "a scatter_add other than one value per kept element along the reduced axis")
        return Val(self.added_at(b.node, idx.node, add.node, fx_node), _shape(fx_node))

    def op_empty_permuted(self, fx_node, *args, **kwargs):  # empty_like's: as empty_strided here
        return self.op_empty_strided(fx_node, *args, **kwargs)

    def op_gather(self, fx_node, *args, **kw):
        raise self.refuse(fx_node, "a gather")

    def op_select(self, fx_node, *args, **kw):  # the row lowering's column pick: its columns are not R
        raise self.refuse(fx_node, "the op aten.select")

    def op_as_strided(self, fx_node, src, size, stride, storage_offset=0):
        piece = self.input_piece(fx_node, src, stride, storage_offset)
        if piece is not None:
            return piece
        got = self.env[src]
        if isinstance(got, TensorRef) and tuple(_shape(fx_node)) == got.shape and not storage_offset:
            return got
        # contiguous strides over the whole source (GroupNorm's [B, g, C/g, 1] back to [B, C]): a view
        new_shape = _shape(fx_node)
        strides = [int(_example(s)) for s in stride]
        old_shape = _raw_shape(src)
        contiguous, acc = [], 1
        for n in reversed(new_shape):
            contiguous.append(acc)
            acc *= max(n, 1)
        if not storage_offset and old_shape is not None and math.prod(old_shape) == math.prod(new_shape) \
                and all(s == c for s, c, n in zip(strides, reversed(contiguous), new_shape) if n != 1) \
                and (not isinstance(got, Val) or got.node.level != "elem" or _contiguous_source(src)):
            return self.view(src, fx_node)
        raise self.refuse(fx_node, "a strided view")

    # ------------------------------------------------ outputs
    def store(self, field: str, result, fx_node) -> list[Store]:
        got = self.env[result] if isinstance(result, torch.fx.Node) else Val(const(result), ())
        if isinstance(got, KeptPieces):
            if tuple(d.resolve(self.t.dims) for d in self.types[field].dims) != got.shape:
                raise self.refuse(fx_node, f"output {field}: a concatenation of another shape")
            return [Store(field, v.node, "piece", piece=(got.dim, k, len(got.pieces)))
                    for k, v in enumerate(got.pieces)]
        if isinstance(got, Cat):
            raise self.refuse(fx_node, "a concatenated output")
        if isinstance(got, PartialSum):  # a sum over part of the block returned as it is (a U-Net's
            # per-(sample, channel) scale's gradient: over H and W of GroupNorm's [B, 32, G, H, W]):
            # one total per element of the output's atoms
            got = self.part_total(got.summand, set(got.atoms), got.shape, fx_node)
            self.env[result] = got
        val = self.value(result, fx_node) if isinstance(result, torch.fx.Node) else got
        shape = tuple(d.resolve(self.t.dims) for d in self.types[field].dims)
        cls = self.shape_class(shape)
        node = val.node
        if cls == "elem":
            return [Store(field, node, "elem")]
        if cls == "row" and node.level != "elem":
            return [Store(field, node, "row")]
        if cls == "global" and node.level in ("const", "global", "post") and not _part_totals(node):
            return [Store(field, node, "global")]
        if cls == "part" and node.level == "post" and _part_totals(node) \
                and {t.attrs["atoms"] for t in _part_totals(node)} == {tuple(self.atoms_of(shape))}:
            return [Store(field, node, "part")]
        raise self.refuse(fx_node, f"output {field} of shape {shape} holding a {node.level} value")

    def run(self) -> AxisProgram:
        p = super().run()
        lay = self.layout
        return AxisProgram(p.op, p.direction, list(lay.kept_dims), self.width_node(None),
                           lay.red_size, p.stores, None, p.dims_example, layout=lay)

    def set_width(self, width, fx_node):  # the width is the block's size, fixed by the layout
        return None


def _part_totals(node: Node) -> list[Node]:
    """The partreduce nodes a post value is computed from (through post-level arithmetic)."""
    found, stack, seen = [], [node], set()
    while stack:
        n = stack.pop()
        if n.id in seen or n.level != "post":
            continue
        seen.add(n.id)
        if n.op == "partreduce":
            found.append(n)
            continue
        stack.extend(n.args)
    return found


def _contiguous_source(src) -> bool:
    """The fx value is laid out contiguously (an as_strided of it regroups its row-major axes)."""
    val = src.meta.get("val")
    return isinstance(val, torch.Tensor) and val.is_contiguous()


def _hint_shape(fx_node):
    val = fx_node.meta.get("val")
    first = val[0] if isinstance(val, (tuple, list)) else val
    return tuple(int(s.node.hint) if isinstance(s, torch.SymInt) else int(s) for s in first.shape)


def validate(program: AxisProgram) -> None:
    """Structural checks of an axis program after the passes (AssertionError on a bug):
    levels are monotone along the edges, reductions take elem values to rows, stores match
    the layout's classes, and only the ops the emitter knows appear."""
    from .. import ir

    known = ir.UNARY | ir.BINARY | {"const", "scalar", "dim", "load", "iota", "where", "cast", "rowreduce",
                                    "globalreduce", "partreduce"}
    for n in program.nodes():
        assert n.op in known, f"axis program: op {n.op} outside the family"
        assert n.level in ("const", "global", "row", "elem", "post"), f"axis program: level {n.level} of {n!r}"
        if n.op == "globalreduce":
            assert n.args[0].level in ("row", "global", "const") and n.level == "post", f"axis program: {n!r}"
        if n.op == "partreduce":
            assert n.args[0].level in ("elem", "row") and n.level == "post" and n.attrs["atoms"], \
                f"axis program: {n!r}"
            continue
        if n.op == "rowreduce":
            assert n.args[0].level == "elem" and n.level == "row", f"axis program: {n!r}"
            assert n.attrs["kind"] in ("sum", "prod", "max", "min", "argmax", "argmin"), n
        elif n.args:
            want = max((a.level for a in n.args), key=ir.LEVEL_RANK.__getitem__)
            assert ir.LEVEL_RANK[n.level] >= ir.LEVEL_RANK[want], f"axis program: {n!r} below its operands"
        if n.op == "load":
            assert n.attrs["kind"] in ("elem", "row", "global", "part", "piece") and not n.attrs.get("row_div"), n
            assert n.attrs["kind"] != "part" or n.level == "elem", n
            assert (n.attrs["kind"] == "piece") == (n.attrs.get("piece") is not None) and \
                (n.attrs["kind"] != "piece" or n.level == "row"), n
    for s in program.stores:
        assert s.kind in ("elem", "row", "global", "part", "piece") and s.offset is None, s
        assert (s.kind == "piece") == (s.piece is not None), s
        if s.kind == "piece":
            assert s.value.level in ("const", "global", "row"), s
        if s.kind == "part":
            assert s.value.level == "post" and _part_totals(s.value), s
        if s.kind == "global":
            assert not _part_totals(s.value), s
        if s.kind == "row":
            assert s.value.level not in ("elem", "post"), s
        if s.kind == "global":
            assert s.value.level in ("const", "global", "post"), s
        if s.kind == "elem":
            assert s.value.level != "post", s


def _stored_exactly(spec, field_type, value: Node) -> bool:
    """Does the output field hold `value` exactly as the kernel computed it (so a backward may
    read it instead of computing it again)? An index always; an extreme (max/min: one of the
    input's values) in the input dtype; any float in float64, or in float32 when the kernel's
    math is float32 (no float64 among the spec's dtypes)."""
    if value.dtype == "int":
        return not field_type.is_floating
    if not field_type.is_floating:
        return False
    if field_type.dtype is None:
        return value.op == "rowreduce" and value.attrs["kind"] in ("max", "min")
    return field_type.dtype == "float64" or (field_type.dtype == "float32" and "float64" not in spec.dtypes)


def reuse_forward_rows(forward: AxisProgram, backward: AxisProgram, spec) -> AxisProgram:
    """A backward recomputes values the forward stored per kept element (the extreme of
    max/min, an argmax index, a norm, a saved intermediate) with a sweep over the block; the
    backward receives the forward's outputs and saved values: read them instead, where the
    field holds the value exactly."""
    from ..optimize import _Canon, _rebuild, _same

    canon = _Canon()
    stored: dict[tuple, tuple[str, str]] = {}
    # the outputs, and the saved intermediates: written by the forward for the backward to read
    fields = {o.name: o.type for o in spec.signature.outputs} | {v.field: v.type for v in spec.saved_values}
    for s in forward.stores:
        if s.kind == "row" and s.value.level == "row" and s.field in fields \
                and _stored_exactly(spec, fields[s.field], s.value):
            stored.setdefault(canon.key(s.value), (s.field, s.value.dtype))
    if not stored:
        return backward
    loads: dict[str, Node] = {}

    def replace(n: Node, args: tuple, attrs: dict) -> Node:
        built = _same(n, args, attrs)
        got = stored.get(canon.key(built)) if built.level == "row" else None
        if got is None:
            return built
        field, dtype = got
        if field not in loads:
            loads[field] = Node("load", level="row", dtype=dtype, attrs={"field": field, "kind": "row", "row_div": []},
                                name=field)
        return loads[field]

    return with_layout(_rebuild(backward, replace), backward.layout)


def lower_axis(spec) -> dict[str, AxisProgram]:
    """The programs of every direction the spec asks for, or AgentRefused."""
    from ..optimize import centered_affine, cse, lone_norms

    forward = trace(spec, "forward")
    directions = ["forward"] + (["backward"] if spec.backward == "kernel" else [])
    traces = {"forward": forward} | {d: trace(spec, d) for d in directions if d != "forward"}
    # the atoms come from every direction's views (a backward may split what the forward merged)
    others = [t for d, t in traces.items() if d != "forward"]
    try:
        layout = find_layout(spec, forward, others)
    except AgentRefused as why:
        # a pointwise forward whose backward reduces (a per-channel parameter's gradient: PReLU,
        # a channel scale and shift over [N, C, H, W]): the backward's reductions set the layout
        if "no reduction" not in str(why) or "backward" not in traces:
            raise
        layout = find_layout(spec, traces["backward"], [forward])
    programs = {}
    for d in directions:
        traced = traces[d]
        lowered = _centred_within_sweeps(cse(AxisLowering(traced, layout).run()))
        program = with_layout(cse(centered_affine(lone_norms(lowered))), layout)
        validate(program)
        if any(n.op == "globalreduce" for n in program.nodes()) and not any(n.op == "rowreduce"
                                                                              for n in program.nodes()):
            raise AgentRefused(f"{spec.path}: the {d} totals kept values without a reduction over the block")
        if sweeps(program) > MAX_SWEEPS:
            raise AgentRefused(f"{spec.path}: the {d} needs {sweeps(program)} dependent sweeps over the reduced "
                               f"axes (at most {MAX_SWEEPS}), outside the axis-reduction family")
        programs[d] = program
    if "backward" in programs:
        from ..optimize import reuse_forward_outputs

        forward, backward = programs["forward"], programs["backward"]
        backward = with_layout(cse(reuse_forward_rows(forward, backward, spec)), layout)
        # a forward elem output (softmax over channels) read back instead of recomputed, kept
        # when it streams no more tensors and needs no more sweeps (as the row family does)
        outputs = {o.name for o in spec.signature.outputs if o.type.is_floating}
        reused = with_layout(cse(reuse_forward_outputs(forward, backward, outputs)), layout)
        if len(_streamed(reused)) <= len(_streamed(backward)) and sweeps(reused) <= sweeps(backward):
            backward = reused
        validate(backward)
        programs["backward"] = backward
    return programs


def _centred_within_sweeps(program: Program) -> Program:
    """optimize.centred_cross_sums (GroupNorm's backward: its sum of dy * w * x over the raw x
    overflowed float32), kept where the program still needs at most MAX_SWEEPS sweeps: the
    centred sum reads the reciprocal standard deviation, a sweep later than the raw sum."""
    from ..optimize import centred_cross_sums

    centred = centred_cross_sums(program)
    return centred if sweeps(centred) <= MAX_SWEEPS else program


# ---------------------------------------------------------------- CPU interpreter

def run_axis_program(program: AxisProgram, tensors: dict, scalars: dict, dims: dict, outputs: dict,
                     acc: torch.dtype = torch.float64) -> None:
    """run_program on the transposed view: S tensors as [O*I, R], kept tensors as [O*I]
    (`acc`: the precision of the float math, as run_program's)."""
    from ..interp import run_program

    lay = program.layout
    O, R, I = lay.sizes(dims)
    S = O * R * I
    full = tuple(d.resolve(dims) for d in lay.lead + lay.block + lay.inner)
    # [O, R, I] (or for `ends`, [RA, O, RB]) as rows x columns and back
    ra = math.prod(d.resolve(dims) for d in lay.lead)
    view = (ra, O, R // max(ra, 1)) if lay.ends else (O, R, I)

    # how the program reads each input: an S tensor and a kept one have the same numel when R == 1
    # (GroupNorm with one element a group), so the loads say which is which
    loads = {n.attrs["field"]: n.attrs for n in program.nodes() if n.op == "load"}
    read_as = {field: attrs["kind"] for field, attrs in loads.items()}

    def s_rows(t):  # an S tensor as [O*I, R] (or, for `ends`, [O, RA*RB])
        return t.reshape(view).permute(1, 0, 2).reshape(O, R) if lay.ends else \
            t.reshape(O, R, I).permute(0, 2, 1).reshape(O * I, R)

    def to_rows(t, name=None):
        if read_as.get(name) == "piece":  # read at its pieces' places (interp.piece_index)
            return t
        if t.dim() == 0 or (read_as.get(name) == "global" and t.numel() == 1):  # a [1] tensor is one value too
            return t.reshape(())
        if read_as.get(name) in ("elem", "part") or \
                (read_as.get(name) is None and t.numel() == S and (tuple(t.shape) == full or t.numel() != O * I)):
            return s_rows(t)
        return t.reshape(O * I)

    def from_rows(t, shape):
        if lay.ends:
            return t.reshape(O, view[0], view[2]).permute(1, 0, 2).reshape(shape)
        return t.reshape(O, I, R).permute(0, 2, 1).reshape(shape)

    def expanded(t, atoms):  # a parameter over some atoms, as the S tensor it broadcasts to
        return t.reshape([full[a] if a in atoms else 1 for a in range(len(full))]).expand(full)

    parts = {field: attrs["atoms"] for field, attrs in loads.items() if attrs["kind"] == "part"}
    tensors = {**tensors, **{field: torch.arange(full[attrs["atoms"][0]]) * attrs["arange"][1] + attrs["arange"][0]
                             for field, attrs in loads.items() if attrs.get("arange")}}  # an arange's coordinates
    # (inputs the program does not read are left out: a bias the backward never loads has no layout)
    ins = {k: to_rows(expanded(v, parts[k]) if k in parts else v, k) for k, v in tensors.items() if k in read_as}
    kept_atoms = [a for a in range(len(full)) if a not in lay.red_axes]

    def partreduce(node, args):
        """The sum over every atom but the output's, at every element it is constant over (so
        that the epilogue's arithmetic with a parameter read per element lines up); a part
        store then takes one element per output element."""
        x = args[0]
        if node.attrs["over"] == "elem":
            x = from_rows(x.expand(O * I, R), full)
            space = list(range(len(full)))
        else:
            x = x.expand(O * I, 1).reshape([full[a] for a in kept_atoms])
            space = kept_atoms
        summed = [q for q, a in enumerate(space) if a not in node.attrs["atoms"]]
        x = x.sum(summed, keepdim=True).expand(x.shape) if summed else x
        return s_rows(x) if node.attrs["over"] == "elem" else x.reshape(O * I, 1)

    def one_per_output(t, store):  # a part store's value at the first element of each output element
        atoms = _part_totals(store.value)[0].attrs["atoms"]
        return from_rows(t, full)[tuple(slice(None) if a in atoms else 0 for a in range(len(full)))]

    outs = {}
    for k, v in outputs.items():
        kind = next((s.kind for s in program.stores if s.field == k), None)
        outs[k] = torch.empty(O * I, R, dtype=v.dtype) if kind in ("elem", "part") else \
            torch.empty(O * I, dtype=v.dtype) if kind == "row" else \
            torch.empty(v.shape, dtype=v.dtype) if kind == "piece" else torch.empty((), dtype=v.dtype)
    run_program(program, ins, scalars, dims, outs, acc=acc, family_ops={"partreduce": partreduce})
    for k, v in outputs.items():
        store = next((s for s in program.stores if s.field == k), None)
        kind = store.kind if store is not None else None
        if kind == "elem":
            v.copy_(from_rows(outs[k], v.shape))
        elif kind == "part":
            v.copy_(one_per_output(outs[k], store).reshape(v.shape))
        elif kind == "row":
            v.copy_(outs[k].reshape(v.shape))
        elif kind in ("global", "piece"):
            v.copy_(outs[k].reshape(v.shape))


MAX_SWEEPS = 4


def _streamed(program) -> set[str]:
    return {n.attrs["field"] for n in program.nodes() if n.op == "load" and n.attrs.get("kind") == "elem"}


def sweeps(program: AxisProgram) -> int:
    """Dependent sweeps over S the reductions need (a variance from its mean: 2)."""
    depth: dict[int, int] = {}
    for n in program.nodes():
        d = max((depth[a.id] for a in n.args), default=0)
        depth[n.id] = d + 1 if n.op == "rowreduce" else d
    return max(depth.values(), default=0)
