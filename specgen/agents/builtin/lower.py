"""Lower a traced fx graph (prims + a few aten ops, symbolic sizes) to a row program.

Sizes are classified by their example values (trace.py picks distinct sizes per symbol):
the row space is the leading dims of the first highest-rank input, the last dim is the
column domain, or the product of a run of trailing dims when every reduction over several
axes reduces that run (trailing_fold: LayerNorm / RMSNorm over [H, W]; shapes are folded
once, in shape_of, so the rest of the pipeline sees rows x columns). An op this lowering
does not know, or a shape pattern outside the row model (a reduction over a middle dim, a
transpose, a matrix product), raises AgentRefused naming the op and the reference line that
produced it.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import sympy
import torch

from ..base import AgentRefused
from . import ir, pretotal, scalar_constants
from .ir import Node, Program, Store, const, is_const, level_of
from .families import broadcast, scan
from .modules import Uninit, constant_value, lower_copy
from .symbolic_math import SYMBOLIC
from .trace import Traced, where

REDUCTIONS = {"sum", "amax", "amin", "var", "prod"}
LLM_HINT = "use an LLM agent for this op (--agent openai | anthropic | openai-compatible)"

PRIM_UNARY = {"neg": "neg", "exp": "exp", "log": "log", "tanh": "tanh", "rsqrt": "rsqrt", "sqrt": "sqrt",
              "abs": "abs", "erf": "erf", "log1p": "log1p", "expm1": "expm1", "reciprocal": "reciprocal",
              "sin": "sin", "cos": "cos", "exp2": "exp2", "log2": "log2", "log10": "log10", "floor": "floor",
              "ceil": "ceil", "sign": "sign", "signbit": "signbit", "round": "round", "trunc": "trunc", "tan": "tan",
              "atan": "atan", "asin": "asin", "acos": "acos", "sinh": "sinh", "cosh": "cosh", "asinh": "asinh",
              "acosh": "acosh", "atanh": "atanh",
              "bitwise_not": "not", "logical_not": "not", "sigmoid": "sigmoid"}
PRIM_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "maximum": "maximum",
               "minimum": "minimum", "pow": "pow", "eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt",
               "ge": "ge", "bitwise_and": "and", "bitwise_or": "or", "logical_and": "and", "logical_or": "or",
               "atan2": "atan2", "fmod": "fmod", "remainder": "remainder"}
VIEW_OPS = {"broadcast_in_dim", "view_of", "clone", "squeeze", "reshape", "collapse_view", "split_dim",
            "expand", "alias", "view", "_unsafe_view", "unsqueeze", "expand_dims", "contiguous"}
PY_INT_OPS = {operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.floordiv: "floordiv",
              operator.neg: "neg"}
# torch's symbolic math of sizes, as a traced reference calls it (symbolic_math.py): fn -> its name
SYM_MATH = {fn: name for name, fn in SYMBOLIC.items()}
FOLD = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "maximum": max, "minimum": min,
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
    "ge": operator.ge, "and": lambda a, b: bool(a and b), "or": lambda a, b: bool(a or b),
    "floordiv": operator.floordiv, "neg": operator.neg, "not": operator.not_, "pow": operator.pow,
}


@dataclass
class TensorRef:
    """A placeholder not loaded yet: loads are placed where they are used (views first)."""

    field: str
    shape: tuple[int, ...]
    ttype: object  # signature TensorType
    is_int: bool


@dataclass
class Val:
    node: Node
    shape: tuple[int, ...]


@dataclass
class Cat:
    pieces: list  # [(offset Node, Val)]
    shape: tuple[int, ...]


@dataclass
class Narrowed:
    """The first few elements along one axis of a value (`alpha[:, :1]`), kept only for its
    shape: `torch.ones_like(alpha[:, :1])` reads nothing of it; any read is refused."""

    val: object
    shape: tuple


@dataclass
class RowCat:
    """n equal pieces of the row space concatenated along row dim `dim` (the gradient of a
    channel chunk, torch.chunk(x, 2, dim=1)'s backward): stored piece by piece (Store.piece)."""

    pieces: list  # [Val], each of the row space's shape
    dim: int
    shape: tuple[int, ...]
    per_row: bool = False  # pieces of one value per row (row stores), not rows of columns


@dataclass(frozen=True)
class IndexRefused:
    """The indices of torch.max / min where the row family has none: refused where they are read."""

    why: str


def _hint(size) -> int:
    if isinstance(size, torch.SymInt):
        return int(size.node.hint)
    return int(size)


def _example(arg):
    """An as_strided argument (a stride, an offset) at the traced example: a traced size's hint,
    or the number itself."""
    return _hint(arg.meta["val"]) if isinstance(arg, torch.fx.Node) else arg


def _shape(fx_node) -> tuple[int, ...]:
    val = fx_node.meta.get("val")
    return tuple(_hint(s) for s in val.shape)


def _raw_shape(arg) -> tuple[int, ...] | None:
    """An fx argument's traced shape, or None (a number, or a node with no tensor value)."""
    if isinstance(arg, torch.fx.Node) and hasattr(arg.meta.get("val"), "shape"):
        return _shape(arg)
    return None


class Lowering:
    def __init__(self, traced: Traced, totals_in_rows: bool = False, rows_of_output: bool = False,
                 indices_in_rows: bool = False):
        self.t = traced
        # a sum over every axis of element values alone as row sums then their sum (else the axis
        # family's, which splits the elements over many blocks): the retry where that family refuses
        self.totals_in_rows = totals_in_rows
        self.indices_in_rows = indices_in_rows  # torch.max's indices as a second sweep: the last retry
        self.spec = traced.spec
        self.scan_shapes: dict[int, tuple] = {}  # a scan node's own shape (families/scan.py)
        sig = self.spec.signature
        dims = traced.dims
        self.types = {p.name: p.type for p in sig.inputs}
        for o in sig.outputs:
            self.types[o.name] = o.type
            if o.type.is_floating:
                self.types[f"grad_{o.name}"] = o.type
        for p in sig.inputs:
            if p.type.differentiable:
                self.types[f"grad_{p.name}"] = p.type
        for value in self.spec.saved_values:  # the forward writes them, the backward may read them
            self.types[value.field] = value.type
        primary = max(sig.inputs, key=lambda p: p.type.ndim)
        if rows_of_output and sig.outputs and sig.outputs[0].type.ndim == primary.type.ndim:
            # the retry for an input read in row pieces (a GLU over channels: [B, 2C, T] -> [B, C, T]):
            # the rows are the output's, and each piece of the input is a load of its own
            primary = sig.outputs[0]
        if primary.type.ndim < 1:
            raise AgentRefused(f"{self.spec.path}: the builtin generator needs a tensor input of rank >= 1")
        # example size -> signature Dim, for every dim of every tensor
        self.size_dims: dict[int, object] = {}
        for t in self.types.values():
            for d in t.dims:
                self.size_dims.setdefault(d.resolve(dims), d)
        # trailing axes folded into the one column axis, decided once for the whole program
        self.fold_dims = self.trailing_fold(primary.type)
        self.fold_sizes = tuple(d.resolve(dims) for d in self.fold_dims)
        self.row_dims = list(primary.type.dims[:-max(1, len(self.fold_dims))])
        self.col_dims = list(primary.type.dims[-max(1, len(self.fold_dims)):])
        self.rows = tuple(d.resolve(dims) for d in self.row_dims)
        self.width: int | None = None
        self.group_div: list | None = None
        self.env: dict = {}
        self.pretotals: dict[int, Node] = {}  # sums over rows hoisted before the row pass (pretotal.py)

    # ---------------------------------------------------------------- errors
    def refuse(self, fx_node, what: str) -> AgentRefused:
        return AgentRefused(f"{where(self.spec, fx_node)}: {what}: outside the builtin generator's families "
                            f"(pointwise ops, reductions over a contiguous block of axes or both ends, "
                            f"arg-reductions, their fusions and backward); "
                            f"{LLM_HINT}")

    # ---------------------------------------------------------------- trailing axes folded into columns
    def trailing_fold(self, primary) -> list:
        """The Dims of the primary input's trailing axes that become the one column axis (the
        row is their product), or [] for the last axis alone. Folded when every reduction over
        several axes in the graph reduces the same contiguous run of k >= 2 trailing axes of a
        value of the primary's rank (LayerNorm / RMSNorm / a mean over [H, W]), the run's sizes
        are distinct from every other dim's, and every tensor of the signature either ends in
        those axes, ends in k size-1 axes (keepdim) or spans none of them. Otherwise nothing is
        folded and a reduction over several axes is refused (or left to the families) as before;
        a value or reduction that splits the run is refused while lowering (fold_shape)."""
        rank = primary.ndim
        full = tuple(d.resolve(self.t.dims) for d in primary.dims)
        runs = set()
        for n in self.t.graph.graph.nodes:
            schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
            if schema is None or schema.name.split("::")[1] not in REDUCTIONS or len(n.args) < 2:
                continue
            src, dims = n.args[0], n.args[1]
            if not isinstance(src, torch.fx.Node) or not isinstance(dims, (list, tuple)) or "val" not in src.meta:
                continue
            shape = _shape(src)
            ds = sorted({int(d) % len(shape) for d in dims}) if shape else []
            if len(ds) < 2 or ds[-1] != len(shape) - 1 or ds != list(range(ds[0], len(shape))):
                continue  # not a run of several trailing axes: nothing to fold for it
            if len(shape) != rank or shape[ds[0]:] != full[ds[0]:]:
                return []
            runs.add(len(ds))
        if len(runs) != 1:
            return []
        k = runs.pop()
        if k >= rank:
            return []  # every axis: no rows left (a family's reduction to a scalar)
        fold = list(primary.dims[rank - k:])
        names = [str(d) for d in fold]
        sizes = [d.resolve(self.t.dims) for d in fold]
        others = [d.resolve(self.t.dims) for t in self.types.values() for d in t.dims if str(d) not in names]
        if any(s <= 1 or s in others for s in sizes) or len(set(sizes)) != k or math.prod(sizes) in others:
            return []
        for t in self.types.values():
            tail = [str(d) for d in t.dims[-k:]] if t.ndim >= k else None
            if tail == names or (tail is not None and all(d.is_literal and d.add == 1 for d in t.dims[-k:])):
                continue
            if any(str(d) in names for d in t.dims):
                return []  # a tensor spanning part of the run ([W] of [B, H, W])
        return fold

    def expanded(self, shape) -> list[tuple[int, ...]]:
        """Each axis of `shape` as the row dims it stands for: itself, or the k > 1 consecutive row
        dims a view merged into it (logits.view(-1, V) of [B, T, V]: [(B, T), (V,)];
        scores.view(B * H, T, T) of [B, H, T, T]: [(B, H), (T,), (T,)]). Read along the row dims from
        the first axis while the sizes follow them; a merged size must be no signature dim's
        (trace.py's example sizes are distinct, so a product names its dims)."""
        out, p = [], 0
        for size in shape:
            if p is not None and p < len(self.rows):
                if size == self.rows[p]:
                    p += 1
                elif size not in self.size_dims:
                    q = next((q for q in range(len(self.rows), p + 1, -1) if math.prod(self.rows[p:q]) == size), None)
                    if q is not None:
                        out.append(self.rows[p:q])
                        p = q
                        continue
                    p = None
                else:
                    p = None
            out.append((size,))
        return out

    def merged(self, shape) -> bool:
        return any(len(sizes) > 1 for sizes in self.expanded(shape))

    def unmerged(self, shape) -> tuple[int, ...]:
        return tuple(s for sizes in self.expanded(shape) for s in sizes)

    def axis_spans(self, raw_shape) -> list[range]:
        """Each raw axis's axes in the unmerged shape."""
        spans, at = [], 0
        for sizes in self.expanded(raw_shape):
            spans.append(range(at, at + len(sizes)))
            at += len(sizes)
        return spans

    def canonical_axes(self, dims, raw_shape, fx_node) -> list[int]:
        """Axes of a value of raw shape `raw_shape` in the lowering's space: a merged axis is its
        row dims again, then the folded trailing run is one axis (fold_axes)."""
        r = len(raw_shape)
        dims = sorted({int(d) % r for d in dims}) if r else [int(d) for d in dims]
        spans = self.axis_spans(raw_shape)
        dims = sorted({a for d in dims for a in spans[d]})
        return self.fold_axes(dims, self.unmerged(raw_shape), fx_node)

    def is_last_axis(self, dim: int, src, shape) -> bool:
        """Is `dim` the last axis of `src` (an fx value: in its raw shape; else of `shape`)."""
        raw = _raw_shape(src) or shape
        return bool(raw) and dim % len(raw) == len(raw) - 1

    def unmergeable(self, fx_node, what: str) -> None:
        shapes = [_raw_shape(a) for a in [*fx_node.all_input_nodes, fx_node]]
        if any(self.merged(shape) for shape in shapes if shape is not None):
            raise self.refuse(fx_node, f"{what} of rows merged by a view")

    def fold_shape(self, shape, fx_node=None) -> tuple[int, ...]:
        """An example shape in the folded space: an axis that merges row dims is those dims
        (expanded); the trailing run of folded axes (or k size-1 axes after a keepdim
        reduction) becomes one axis."""
        shape = self.unmerged(shape)
        if not self.fold_sizes:
            return shape
        k = len(self.fold_sizes)
        if len(shape) >= k and shape[-k:] == self.fold_sizes:
            shape = shape[:-k] + (math.prod(self.fold_sizes),)
        elif len(shape) >= k and all(s == 1 for s in shape[-k:]):
            shape = shape[:-k] + (1,)
        if any(s in self.fold_sizes for s in shape):
            raise self.refuse(fx_node, f"a value of shape {shape} that splits the trailing axes "
                                       f"{[str(d) for d in self.fold_dims]} the reductions fold into one row")
        return shape

    def shape_of(self, fx_node) -> tuple[int, ...]:
        return self.fold_shape(_shape(fx_node), fx_node)

    def folds(self, shape) -> bool:
        k = len(self.fold_sizes)
        return bool(k) and len(shape) >= k and (tuple(shape[-k:]) == self.fold_sizes
                                                or all(s == 1 for s in shape[-k:]))

    def fold_axes(self, dims, raw_shape, fx_node) -> list[int]:
        """Axes of a value of unfolded shape `raw_shape` mapped to the folded space: the folded
        run is one axis; an axis list that takes part of the run is refused."""
        r = len(raw_shape)
        dims = sorted({int(d) % r for d in dims}) if r else [int(d) for d in dims]
        if not self.folds(raw_shape):
            return dims
        start = r - len(self.fold_sizes)
        inside = {d for d in dims if d >= start}
        if inside and inside != set(range(start, r)):
            raise self.refuse(fx_node, f"a reduction over dims {sorted(dims)} of a value of shape {tuple(raw_shape)} "
                                       f"(part of the trailing axes {[str(d) for d in self.fold_dims]} reduced "
                                       f"together elsewhere)")
        out: list[int] = []
        for d in dims:
            q = min(d, start)
            if not (d >= start and out and out[-1] == start):
                out.append(q)
        return out

    def bdims(self, fx_node) -> list[int]:
        """broadcast_in_dim's dims in the folded space (axes that merge row dims unmerged)."""
        bdims = list(fx_node.args[2])
        src = fx_node.args[0]
        raw = _shape(fx_node)
        source = self.expanded(_shape(src)) if isinstance(src, torch.fx.Node) else []
        if self.merged(raw) or any(len(sizes) > 1 for sizes in source):
            spans = self.axis_spans(raw)
            mapped = []
            for sizes, d in zip(source, bdims):
                if (len(sizes) > 1 and len(spans[d]) != len(sizes)) or (len(sizes) == 1 < len(spans[d])
                                                                         and sizes[0] != 1):
                    raise self.refuse(fx_node, "a broadcast that moves rows merged by a view")
                # a source axis of one size into a merged one: its first row dim (size 1 broadcasts anywhere)
                mapped += list(spans[d]) if len(sizes) > 1 else [spans[d][0]]
            bdims, raw = mapped, self.unmerged(raw)
        if not self.fold_sizes:
            return bdims
        if not self.folds(raw):
            return bdims
        start = len(raw) - len(self.fold_sizes)
        out: list[int] = []
        for d in bdims:
            if d >= start and out and out[-1] == start:
                continue
            out.append(min(d, start))
        return out

    def unfoldable(self, fx_node, what: str) -> None:
        self.unmergeable(fx_node, what)
        if self.fold_sizes:
            raise self.refuse(fx_node, f"{what} in a program that folds the trailing axes "
                                       f"{[str(d) for d in self.fold_dims]} into one row")

    # ---------------------------------------------------------------- sizes
    def fold_width(self) -> Node:
        return self.dims_product(self.fold_dims, "fold_width")

    def dims_product(self, dims, name: str) -> Node:
        """The product of signature dims as IR (`name` for each product node)."""
        node: Node | None = None
        for d in dims:
            dn = Node("dim", level="global", dtype="int", attrs={"dim": d}, name=f"dim_{d.resolve(self.t.dims)}")
            node = dn if node is None else Node("mul", (node, dn), level="global", dtype="int", name=name)
        return node

    def dim_node(self, size: int, fx_node) -> Node:
        if self.fold_sizes and size == math.prod(self.fold_sizes):
            return self.fold_width()
        if size in self.size_dims:
            d = self.size_dims[size]
            return Node("dim", level="global", dtype="int", attrs={"dim": d}, name=f"dim_{size}")
        if size in (0, 1):
            return const(size)
        run = self.dims_run(size)
        if run is not None:  # rows merged by a view (logits.view(-1, V) of [B, T, V]), a numel: their product
            return self.dims_product(run, "rows_merged")
        raise self.refuse(fx_node, f"a size ({size} in the example) that is none of the signature's dims")

    def dims_run(self, size: int) -> list | None:
        """Consecutive dims of the primary input (row dims, then column dims) whose example sizes
        multiply to `size` (two or more), or None."""
        run = self.row_dims + self.col_dims
        sizes = [d.resolve(self.t.dims) for d in run]
        for i in range(len(run)):
            for j in range(i + 2, len(run) + 1):
                if math.prod(sizes[i:j]) == size:
                    return run[i:j]
        return None

    def sym(self, value, fx_node) -> Node:
        if isinstance(value, torch.fx.Node):
            got = self.env[value]
            return got if isinstance(got, Node) else self.refuse(fx_node, "a tensor used as a size")
        if isinstance(value, bool):
            return const(value)
        if isinstance(value, (int, float)):
            return const(value)
        raise self.refuse(fx_node, f"a size argument of type {type(value).__name__}")

    # ---------------------------------------------------------------- classification
    def aligned(self, lead: tuple[int, ...]) -> tuple[int, ...] | None:
        """`lead` right-aligned against the row space (padded with 1s), or None."""
        if len(lead) > len(self.rows):
            return None
        padded = (1,) * (len(self.rows) - len(lead)) + tuple(lead)
        if all(a == r or a == 1 for a, r in zip(padded, self.rows)):
            return padded
        return None

    def is_row_shape(self, shape) -> bool:
        """[rows...] or [rows..., 1]: one value per row (a keepdim reduction, an int target)."""
        if shape and shape[-1] == 1 and self.rows and self.aligned(shape[:-1]) == self.rows:
            return True
        return bool(self.rows) and tuple(shape) == self.rows

    def row_div(self, padded: tuple[int, ...], fx_node) -> list | None:
        """Row mapping of a tensor whose leading dims are `padded`: None = full rows, [] = no
        row dependence (a column parameter), else the Dims one row of the tensor spans."""
        if padded == self.rows:
            return None
        k = 0
        while k < len(padded) and padded[k] == self.rows[k] and padded[k] != 1:
            k += 1
        if any(p != 1 for p in padded[k:]):
            raise self.refuse(fx_node, f"a broadcast pattern {padded} over rows {self.rows} (only a prefix "
                                       f"of the row dims may be present)")
        return list(self.row_dims[k:])

    def set_width(self, width: int, fx_node) -> None:
        if self.width is None:
            self.width = width
        elif self.width != width:
            raise self.refuse(fx_node, f"columns of two widths ({self.width} and {width} in the example) "
                                       f"computed together")

    # ---------------------------------------------------------------- loads
    def load(self, ref: TensorRef, fx_node, *, width: int | None = None, offset: Node | None = None,
             rows_piece: tuple | None = None) -> Val:
        shape = ref.shape
        dtype = "int" if ref.is_int else ("bool" if ref.ttype.dtype == "bool" else "float")
        if rows_piece is not None and tuple(shape) == self.rows:  # one value per row of the piece's rows
            return Val(Node("load", level="row", dtype=dtype, name=f"{ref.field}_at",
                            attrs={"field": ref.field, "kind": "row", "row_div": [], "rows_piece": rows_piece}), shape)
        if rows_piece is not None and (len(shape) == 0 or self.is_row_shape(shape)):
            # a piece one column wide ([B, 2C, 1]) would be a row load, which has no piece's rows (red team, session 41)
            raise self.refuse(fx_node, f"a piece of input {ref.field} along a row dim that is one value per row")
        if len(shape) == 0 or (_one_element(ref.ttype) and all(s == 1 for s in shape)):  # a 0-d tensor (any view)
            return Val(Node("load", level="global", dtype=dtype, attrs={"field": ref.field, "kind": "global"},
                            name=ref.field), shape)
        if self.is_row_shape(shape):
            padded = self.aligned(shape[:-1] if shape[-1] == 1 and shape != self.rows else shape)
            div = self.row_div(padded, fx_node)
            return Val(Node("load", level="row", dtype=dtype,
                            attrs={"field": ref.field, "kind": "row", "row_div": div or []},
                            name=ref.field), shape)
        padded = self.aligned(shape[:-1])
        if padded is None:
            raise self.refuse(fx_node, f"input {ref.field} of shape {shape} that is not rows x columns "
                                       f"(rows {self.rows})")
        try:
            div = self.row_div(padded, fx_node)
        except AgentRefused:
            div = None if offset is not None or width is not None else "bcast"
            if div is None:
                raise
        if div == "bcast" or (shape[-1] == 1 and offset is None and width is None):
            # broadcast over dims other than a row prefix ([C, 1, 1] over [N, C, H, W]): read at
            # each element's coordinates; only the flat family emits it (families/flat.py)
            node = Node("load", level="elem", dtype=dtype, name=ref.field,
                        attrs={"field": ref.field, "kind": "bcast", "row_div": [], "offset": None,
                               "present": tuple(p != 1 for p in padded + (shape[-1],))})
            return Val(node, padded + (shape[-1],))
        width = shape[-1] if width is None else width
        self.set_width(width, fx_node)
        kind = "col" if all(p == 1 for p in padded) and self.rows != padded else "elem"
        if kind == "col":
            div = []
        attrs = {"field": ref.field, "kind": kind, "row_div": div or [], "offset": offset}
        if rows_piece is not None:  # piece k of n along a row dim: its rows are the row space's
            if kind != "elem" or div:
                raise self.refuse(fx_node, f"a piece of input {ref.field} along a row dim that is not the row space")
            attrs["rows_piece"] = rows_piece
        node = Node("load", level="elem", dtype=dtype, attrs=attrs,
                    name=ref.field if offset is None and rows_piece is None else f"{ref.field}_at")
        return Val(node, padded + (width,))

    def value(self, arg, fx_node, defer: bool = False) -> Val:
        """An fx argument as a Val (loading placeholders on first use, consts as 0-d).
        `defer`: an input of lower rank may stay pending until broadcast (broadcast.py)."""
        if isinstance(arg, torch.fx.Node):
            got = self.env[arg]
            if isinstance(got, TensorRef) and defer and broadcast.should_defer(self, got):
                return broadcast.defer(self, got)
            if isinstance(got, broadcast.Pending):
                return got if defer else broadcast.materialize(self, got, fx_node)
            if isinstance(got, TensorRef):  # loaded per use; the emitter shares equal loads
                got = self.load(got, fx_node)
            if isinstance(got, Node):  # a SymInt / SymFloat used as a tensor operand
                return Val(got, ())
            if isinstance(got, Cat):
                return self.cat_by_column(got, fx_node)
            if isinstance(got, RowCat):
                raise self.refuse(fx_node, "a concatenation along a row dim used before it is stored")
            if isinstance(got, Narrowed):
                raise self.refuse(fx_node, f"a slice from {tuple(got.val.shape)} to {got.shape} read as a value")
            if isinstance(got, (scan.Prepended, scan.PrependedScan)):
                raise self.refuse(fx_node, "a concatenation before a scan, or that scan's last element, used as a value")
            if isinstance(got, Uninit):
                raise self.refuse(fx_node, "a tensor from torch.empty read before it is written")
            if isinstance(got, (scan.ScanPrefix, scan.ScanSuffix)):
                raise self.refuse(fx_node, "a slice of a scan other than its exclusive form")
            if isinstance(got, scan.Rev):
                raise self.refuse(fx_node, "a flip (torch.flip) outside a scan along the flipped dim")
            return got
        if isinstance(arg, (bool, int, float)):
            hit = scalar_constants.match(arg, self.t.scalar_forms) if isinstance(arg, float) else None
            if hit is not None:
                return Val(self.scalar_expression(*hit, fx_node), ())
            return Val(const(arg), ())
        raise self.refuse(fx_node, f"an operand of type {type(arg).__name__}")

    def scalar_expression(self, form: str, field: str, scale: float, fx_node) -> Node:
        """A number the reference computed from a float scalar (1 / alpha, 0.5 * delta), as IR on the scalar."""
        node = Node("scalar", level="global", dtype="float", attrs={"field": field}, name=field)
        for op in scalar_constants.FORMS[form][1]:
            if op == "square":
                node = self.pointwise("mul", [node, node], fx_node)
            elif op in ("one_minus", "one_plus"):
                node = self.pointwise("sub" if op == "one_minus" else "add", [const(1.0), node], fx_node)
            elif op == "minus_one":
                node = self.pointwise("sub", [node, const(1.0)], fx_node)
            else:
                node = self.pointwise(op, [node], fx_node)
        return node if scale == 1.0 else self.pointwise("mul", [const(scale), node], fx_node)

    # ---------------------------------------------------------------- node builders
    def pointwise(self, op: str, args: list[Node], fx_node, dtype: str | None = None) -> Node:
        if all(a.op == "const" for a in args) and op in FOLD:
            value = FOLD[op](*[a.attrs["value"] for a in args])
            return const(value)
        folded = self.fold_range(op, args)
        if folded is not None:
            return folded
        if op in ir.COMPARE or op in ("and", "or", "not", "signbit"):
            out_dtype = "bool"
        elif dtype is not None:
            out_dtype = dtype
        elif any(a.dtype == "float" for a in args) or op in ("div", "exp", "log", "log2", "log10", "tanh", "rsqrt",
                                                              "sqrt"):
            out_dtype = "float" if any(a.dtype == "float" for a in args) or op != "div" else "int"
        else:
            out_dtype = "int" if any(a.dtype == "int" for a in args) else "bool"
        return Node(op, tuple(args), level=level_of(*args), dtype=out_dtype, name=fx_node.name)

    def fold_range(self, op, args) -> Node | None:
        """Compare an int input with a constant outside its declared value range."""
        if op not in ir.COMPARE or len(args) != 2:
            return None
        a, b = args
        if not (a.op == "load" and is_const(b) and isinstance(b.attrs["value"], (int, float))):
            return None
        ttype = self.types.get(a.attrs["field"])
        if ttype is None or ttype.value_range is None:
            return None
        lo, hi = ttype.value_range
        c = b.attrs["value"]
        below = lo.is_literal and c < lo.add
        above = hi.is_literal and c >= hi.add
        if not (below or above):
            return None
        return const({"eq": False, "ne": True, "lt": above, "le": above, "gt": below, "ge": below}[op])

    def where(self, cond: Node, a: Node, b: Node, fx_node) -> Node:
        if is_const(cond):
            return a if cond.attrs["value"] else b
        dtype = "float" if "float" in (a.dtype, b.dtype) else a.dtype
        return Node("where", (cond, a, b), level=level_of(cond, a, b), dtype=dtype, name=fx_node.name)

    def cast(self, node: Node, dtype: torch.dtype, fx_node) -> Node:
        target = "float" if dtype.is_floating_point else ("bool" if dtype == torch.bool else "int")
        if node.dtype == target:
            return node
        if node.op == "const":
            v = node.attrs["value"]
            return const(float(v) if target == "float" else bool(v) if target == "bool" else int(v), target)
        return Node("cast", (node,), level=node.level, dtype=target, name=fx_node.name)

    # ---------------------------------------------------------------- reductions
    def reduce(self, kind: str, val: Val, dims: list[int], fx_node, correction: float | None = None) -> Val:
        shape = val.shape
        dims = sorted(d % len(shape) for d in dims) if shape else []
        out_shape = tuple(s for i, s in enumerate(shape) if i not in dims)
        node = val.node
        if node.level == "post":  # a masked mean's count inside a gradient summed over rows or columns
            try:
                node = pretotal.hoist(node, self.pretotals)
            except pretotal.NotBeforehand:
                pass  # stays post: refused below with the reduction's own reason
        if all(shape[d] == 1 for d in dims):  # reducing size-1 dims: a view
            if kind == "var":
                return Val(const(0.0), out_shape)
            return Val(node, out_shape)
        last = len(shape) - 1
        if kind == "sum" and node.level == "elem" and dims == list(range(len(shape))) and len(dims) > 1 \
                and self.is_row_shape(shape[:-1]) and (self.totals_in_rows or _reads_per_row_values(node)):
            # a sum over every axis at once of values that need their rows' reductions or per-row
            # inputs (KL of two log-softmaxes, a variance per row): the row sums first, then their
            # sum over the rows. Values of elements alone (x.sum(), an MSE) stay with the axis
            # family (its reduction to a scalar splits the elements over many blocks)
            per_row = self.reduce(kind, val, [last], fx_node)
            return self.reduce(kind, per_row, [d for d in dims if d != last], fx_node)
        if node.level in ("const", "global") and kind in ("sum",):
            count = self.count(shape, dims, fx_node)
            return Val(self.pointwise("mul", [node, count], fx_node), out_shape)
        if dims == [last] and not self.is_row_shape(shape):
            if node.level in ("const", "global", "row"):  # constant along the row
                if kind == "sum":
                    return Val(self.pointwise("mul", [node, self.dim_node(shape[last], fx_node)], fx_node),
                               out_shape)
                if kind in ("max", "min"):
                    return Val(node, out_shape)
            if kind == "var":
                w = self.dim_node(shape[last], fx_node)
                wf = self.cast(w, torch.float32, fx_node)
                total = Node("rowreduce", (node,), level="row", attrs={"kind": "sum"}, name=f"{fx_node.name}_sum")
                mean = self.pointwise("div", [total, wf], fx_node)
                dev = self.pointwise("sub", [node, mean], fx_node)
                sq = self.pointwise("mul", [dev, dev], fx_node)
                ssq = Node("rowreduce", (sq,), level="row", attrs={"kind": "sum"}, name=f"{fx_node.name}_ssq")
                denom = self.pointwise("sub", [wf, const(float(correction or 0.0))], fx_node)
                return Val(self.pointwise("div", [ssq, denom], fx_node), out_shape)
            return Val(Node("rowreduce", (node,), level="row", dtype=node.dtype, attrs={"kind": kind},
                            name=fx_node.name), out_shape)
        if self.is_row_shape(shape) and node.level in ("row", "const", "global"):
            if set(dims) != set(range(len(shape))) and not (len(dims) == len(shape) - 1 and shape[-1] == 1):
                raise self.refuse(fx_node, "a reduction over part of the row dims of a per-row value")
            if kind != "sum":
                raise self.refuse(fx_node, f"a {kind} over rows")
            return Val(Node("globalreduce", (node,), level="post", dtype=node.dtype, attrs={"kind": "sum"},
                            name=fx_node.name), out_shape)
        if last not in dims and node.level == "elem":
            lead = shape[:-1]
            if kind != "sum":
                raise self.refuse(fx_node, f"a {kind} over rows")
            padded = self.aligned(lead)
            if padded is None:
                raise self.refuse(fx_node, "a reduction over rows of a value that is not rows x columns")
            offset = len(self.rows) - len(lead)
            reduced = {d + offset for d in dims}
            kept = [i for i in range(len(self.rows)) if i not in reduced]
            if kept != list(range(len(kept))):
                raise self.refuse(fx_node, "a reduction over leading row dims that keeps a later one")
            group_div = list(self.row_dims[len(kept):])
            if self.group_div is not None and [str(d) for d in self.group_div] != [str(d) for d in group_div]:
                raise self.refuse(fx_node, "reductions over rows in two different groupings")
            self.group_div = group_div
            return Val(Node("colreduce", (node,), level="post", dtype="float", attrs={"kind": "sum"},
                            name=fx_node.name), out_shape)
        raise self.refuse(fx_node, f"a reduction over dims {dims} of a value of shape {shape}")

    def count(self, shape, dims, fx_node) -> Node:
        total: Node = const(1)
        for d in dims:
            total = self.pointwise("mul", [total, self.dim_node(shape[d], fx_node)], fx_node)
        return total

    # ---------------------------------------------------------------- the walk
    def run(self) -> Program:
        graph = self.t.graph.graph
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        for fx_node, field in zip(placeholders, self.t.inputs):
            ttype = self.types[field]
            self.env[fx_node] = TensorRef(field, self.shape_of(fx_node), ttype,
                                          is_int=not ttype.is_floating and ttype.dtype != "bool")
        stores: list[Store] = []
        for fx_node in graph.nodes:
            if fx_node.op == "placeholder":
                continue
            if fx_node.op == "output":
                results = fx_node.args[0]
                results = results if isinstance(results, (tuple, list)) else (results,)
                for field, result in zip(self.t.outputs, results):
                    stores += self.store(field, result, fx_node)
                continue
            if fx_node.op == "get_attr":  # a module's parameter or buffer: a constant (modules.py)
                self.env[fx_node] = self.tensor_constant(fx_node)
                continue
            if fx_node.op != "call_function":
                raise self.refuse(fx_node, f"fx {fx_node.op} {fx_node.target}")
            self.env[fx_node] = self.call(fx_node)
        width_node = self.dim_node(self.width, None) if self.width else const(1)
        self.check_width_is_a_column(width_node)
        return Program(self.spec.name, self.t.direction, self.row_dims, width_node, self.width or 1, stores,
                       self.group_div, dict(self.t.dims), max(1, len(self.fold_dims)))

    def check_width_is_a_column(self, width_node: Node) -> None:
        """The width is named by its example size; a size that only happens to equal another dim's
        example (x[:, 2:] - x[:, :-2] of [N, D]: D - 2 = 5 = N at the trace's sizes) would be read
        as that dim. A width that is one dim must be the primary input's columns, or a dim that is
        no row dim and some tensor's last (or the folded columns); else refused (red team, session 41)."""
        if width_node.op != "dim" or self.fold_dims:
            return
        dim = width_node.attrs["dim"]
        if dim == self.col_dims[-1]:
            return  # the primary input's own columns (also a row dim's size in a square [N, N])
        if dim in self.row_dims or not any(t.dims and t.dims[-1] == dim for t in self.types.values()):
            raise self.refuse(None, f"a row width ({self.width} in the example) that no tensor of the signature has "
                                    f"as its columns (a slice of the columns, its size no dim of the signature)")

    # scans (families/scan.py): cumsum, cumprod, logcumsumexp, cummax/cummin values (scan.SCAN_OPS,
    # dispatched in `call`) and the flips around them
    def scan_op(self, fx_node, name: str, x, dim):
        self.unfoldable(fx_node, "a scan")
        kind = scan.SCAN_OPS[name]
        lower_one = scan.lower_extreme if kind in ("max", "min") else scan.lower_scan  # (values, indices)
        return lower_one(self, fx_node, kind, x, dim)

    def op_rev(self, fx_node, x, dims, *_, **__):
        self.unfoldable(fx_node, "a flip")
        return scan.lower_rev(self, fx_node, x, dims)

    # a module's parameters built under the tracer (sized from a symbolic shape): modules.py
    def op_empty(self, fx_node, *_, **__):
        return Uninit(self.shape_of(fx_node))

    def op_empty_strided(self, fx_node, *_, **__):
        return Uninit(self.shape_of(fx_node))

    def op_iota(self, fx_node, length, *, start=0, step=1, dtype=torch.int64, **_):
        """torch.arange along the columns (a one-hot or a length mask: arange(C) == target[:, None],
        arange(W) < lengths[:, None]): the column index. An arange of a row dim's length (a causal
        mask's query positions) stays pending until a broadcast places it (broadcast.py): then the
        row's index along that dim, or the column's."""
        self.unfoldable(fx_node, "an arange")
        if not isinstance(start, int) or not isinstance(step, int):
            raise self.refuse(fx_node, "an arange whose start or step is computed")
        (n,) = _shape(fx_node)
        if n in (0, 1):
            raise self.refuse(fx_node, f"an arange of {n} (in the example) that is not along the columns")
        if n in self.rows or (self.width is not None and n != self.width):
            node = broadcast.defer_iota(n)
            return self.arange_scaled(node, start, step, dtype, fx_node)
        self.set_width(n, fx_node)
        return self.arange_scaled(Val(self.column_iota(), (n,)), start, step, dtype, fx_node)

    @staticmethod
    def column_iota() -> Node:
        """The program's column index (the row lowering's last axis, the axis family's reduced one)."""
        return Node("iota", level="elem", dtype="int", name="col")

    def arange_scaled(self, base, start: int, step: int, dtype, fx_node):
        """start + step * base, in dtype (base a Val, or a pending arange: the result stays pending)."""
        pending = isinstance(base, broadcast.Pending)
        val = base.val if pending else base
        node = val.node
        if step != 1:
            node = self.pointwise("mul", [node, const(int(step))], fx_node)
        if start != 0:
            node = self.pointwise("add", [node, const(int(start))], fx_node)
        if dtype is not None:
            node = self.cast(node, dtype, fx_node)
        out = Val(node, val.shape)
        return broadcast.Pending(out, base.maps) if pending else out

    def op_empty_permuted(self, fx_node, *_, **__):  # empty_like's: filled before it is read
        return Uninit(self.shape_of(fx_node))

    def tensor_constant(self, fx_node) -> Val:
        tensor = getattr(self.t.graph, fx_node.target)
        value = constant_value(tensor) if isinstance(tensor, torch.Tensor) else None
        if value is None:
            raise self.refuse(fx_node, "a tensor the reference builds (a module's parameter or buffer) that is not "
                                       "one value throughout: the builtin generator bakes in constant fills only; "
                                       "declare varying weights as inputs of the spec")
        dtype = "bool" if tensor.dtype == torch.bool else "float" if tensor.is_floating_point() else "int"
        return Val(const(value, dtype), tuple(tensor.shape))

    def call(self, fx_node):
        target = fx_node.target
        args, kwargs = fx_node.args, fx_node.kwargs
        if target in PY_INT_OPS:
            return self.pointwise(PY_INT_OPS[target], [self.sym(a, fx_node) for a in args], fx_node)
        if target is operator.truediv:  # Python's / of sizes is a float (n / (n - 1)), not the int quotient
            return self.pointwise("div", [self.cast(self.sym(a, fx_node), torch.float32, fx_node) for a in args],
                                  fx_node)
        if target is torch.sym_float:
            return self.cast(self.sym(args[0], fx_node), torch.float32, fx_node)
        if target is operator.pow and isinstance(fx_node.meta.get("val"), torch.SymInt):
            return self.int_power(args, fx_node)  # an int size to an int power stays an int
        if target is operator.pow or target in SYM_MATH:  # a size's power or math.sqrt (symbolic_math.py)
            floats = [self.cast(self.sym(a, fx_node), torch.float32, fx_node) for a in args]
            return self.sym_math(SYM_MATH.get(target, "pow"), floats, fx_node)
        if target is torch.sym_max:  # a fill's strides (F.pad's decomposition)
            return self.pointwise("maximum", [self.sym(a, fx_node) for a in args], fx_node, dtype="int")
        if target is operator.getitem:
            got = self.env[args[0]][args[1]]
            if isinstance(got, IndexRefused):
                raise self.refuse(fx_node, got.why)
            return got
        schema = getattr(target, "_schema", None)
        if schema is None:
            raise self.refuse(fx_node, f"the call {getattr(target, '__name__', target)}")
        ns, name = schema.name.split("::")
        handler = getattr(self, f"op_{name}", None)
        if name in PRIM_UNARY:
            return self.elementwise(PRIM_UNARY[name], args[:1], fx_node)
        if name in PRIM_BINARY:
            return self.elementwise(PRIM_BINARY[name], args[:2], fx_node)
        if name in VIEW_OPS:
            return self.view(args[0], fx_node)
        if name in scan.SCAN_OPS:
            return self.scan_op(fx_node, name, args[0], args[1])
        if handler is None:
            raise self.refuse(fx_node, f"the op {ns}.{name}")
        return handler(fx_node, *args, **kwargs)

    def int_power(self, args, fx_node) -> Node:
        """size ** k for a small constant k, as k - 1 products (C has no integer power)."""
        base, exponent = args
        if not isinstance(exponent, int) or isinstance(exponent, bool) or not 0 <= exponent <= 16:
            raise self.refuse(fx_node, "an integer size to a power that is not a constant from 0 to 16")
        node = self.sym(base, fx_node)
        result = node if exponent else const(1)
        for _ in range(exponent - 1):
            result = self.pointwise("mul", [result, node], fx_node)
        return result

    def sym_math(self, name: str, args: list[Node], fx_node) -> Node:
        """A math function of sizes (float nodes of the global level): an op of ops.py."""
        return self.pointwise(name, args, fx_node)

    def elementwise(self, op: str, args, fx_node):
        vals = [self.value(a, fx_node, defer=True) for a in args]
        if any(isinstance(v, broadcast.Pending) for v in vals):
            shape = self.shape_of(fx_node) if hasattr(fx_node.meta.get("val"), "shape") else ()
            pending = broadcast.elementwise(self, op, vals, shape, fx_node)
            if pending is not None:
                return pending
            vals = [broadcast.materialize(self, v, fx_node) if isinstance(v, broadcast.Pending) else v
                    for v in vals]
        node = self.pointwise(op, [v.node for v in vals], fx_node)
        if node.level == "elem":
            self.check_elem_operands(vals, fx_node)
        return Val(node, self.shape_of(fx_node) if "val" in fx_node.meta and hasattr(fx_node.meta["val"], "shape")
                   else ())

    def check_elem_operands(self, vals, fx_node):
        for v in vals:
            if v.node.level == "post":
                raise self.refuse(fx_node, "a reduction over rows used inside the row computation")

    def view(self, src, fx_node):
        got = self.env[src]
        new_shape = self.shape_of(fx_node)
        if isinstance(got, Cat):
            return Cat(got.pieces, new_shape)
        if isinstance(got, RowCat):
            if got.per_row and tuple(new_shape) in (got.shape + (1,), got.shape[:len(self.rows)]):
                return RowCat(got.pieces, got.dim, tuple(new_shape), per_row=True)  # its keepdim 1 added or dropped
            if tuple(new_shape) != got.shape:
                raise self.refuse(fx_node, "a view of a concatenation along a row dim")
            return got
        if isinstance(got, (scan.Prepended, scan.PrependedScan, Narrowed)):
            if tuple(new_shape) != tuple(got.shape):
                raise self.refuse(fx_node, "a view of a slice or a concatenation of computed values")
            return got
        if isinstance(got, (scan.ScanPrefix, scan.ScanSuffix)):
            raise self.refuse(fx_node, "a slice of a scan other than its exclusive form")
        if isinstance(got, scan.Rev):  # a flip awaits the scan that takes it; viewed first, it has no layout
            raise self.refuse(fx_node, "a view of a flipped value (a flip is lowered only as a scan's direction)")
        if isinstance(got, TensorRef):
            return self.view_input(got, fx_node, new_shape)
        if isinstance(got, Uninit):
            return Uninit(new_shape)
        if isinstance(got, Node):
            return got
        if isinstance(got, broadcast.Pending):
            moved = broadcast.view(self, got, fx_node, new_shape)
            if moved is not None:
                return moved
            got = broadcast.materialize(self, got, fx_node)
        old = got.shape
        if self.broadcasts_bcast(got, new_shape):
            return Val(got.node, new_shape)
        if old and new_shape and old[-1] != new_shape[-1] and got.node.level == "elem" \
                and math.prod(old) != math.prod(new_shape):
            raise self.refuse(fx_node, f"a view from {old} to {new_shape}")
        if got.node.level == "elem" and old and new_shape and old[-1] != new_shape[-1] and old[-1] != 1:
            raise self.refuse(fx_node, f"a reshape of the column dim ({old} to {new_shape})")
        return Val(got.node, new_shape)

    def broadcasts_bcast(self, got: Val, new_shape) -> bool:
        """A value of broadcast loads only (per channel), broadcast to more of the full shape:
        it is computed at each element's coordinates anyway."""
        full = len(self.rows) + 1
        if got.node.level != "elem" or len(got.shape) != full or len(new_shape) != full:
            return False
        if not all(o == n or o == 1 for o, n in zip(got.shape, new_shape)):
            return False
        stack, seen = [got.node], set()
        while stack:
            n = stack.pop()
            if n.id in seen:
                continue
            seen.add(n.id)
            if n.op == "load" and n.level == "elem" and n.attrs["kind"] != "bcast":
                return False
            if n.op in ("rowreduce", "gather", "colreduce", "globalreduce", "scan", "iota"):
                return False
            stack.extend(n.args)
        return True

    def view_input(self, ref: TensorRef, fx_node, new_shape):
        """A view of an input stays an input reference (loaded where used) with the shape
        aligned to the view: same elements, or a broadcast whose source dims are known."""
        if math.prod(new_shape) == math.prod(ref.shape) and [s for s in new_shape if s != 1] == \
                [s for s in ref.shape if s != 1]:
            return TensorRef(ref.field, new_shape, ref.ttype, ref.is_int)
        name = fx_node.target._schema.name.split("::")[1]
        if name == "broadcast_in_dim":
            bdims = self.bdims(fx_node)
            aligned = [1] * len(new_shape)
            for size, d in zip(ref.shape, bdims):
                aligned[d] = size
            if len(new_shape) <= len(self.rows) and 1 in aligned and 1 not in ref.shape:
                # an intermediate broadcast ([C] -> [1, C] -> [1, C, 1, 1]): the input stays a
                # reference, loaded where the dims it spans are known
                return TensorRef(ref.field, tuple(aligned), ref.ttype, ref.is_int)
            if len(new_shape) <= len(self.rows) and broadcast.should_defer(self, ref):
                # a [B] input broadcast in steps below the full rank (lengths[:, None] against an
                # arange(T)[None, :]): pending until the rank where the dims it spans are known
                moved = broadcast.view(self, broadcast.defer(self, ref), fx_node, new_shape)
                if moved is not None:
                    return moved
            return Val(self.load(TensorRef(ref.field, tuple(aligned), ref.ttype, ref.is_int), fx_node).node,
                       new_shape)
        raise self.refuse(fx_node, f"a view of input {ref.field} from {ref.shape} to {new_shape}")

    # -- sizes
    def op_sym_size(self, fx_node, tensor, dim):
        size = _hint(fx_node.meta["val"])
        got = self.env.get(tensor) if isinstance(tensor, torch.fx.Node) else None
        if isinstance(got, (scan.Prepended, scan.PrependedScan)) and dim % len(got.shape) == got.axis:
            # the one-longer axis of cat([the identity, y]) (and of its scan): y's size + 1, named from
            # y's own shape (a size one past *any* dim's example was a width D - 1 read as N + 1)
            inner = self.dim_node(got.val.shape[got.axis], fx_node)
            return Node("add", (inner, const(1)), level="global", dtype="int", name=f"dim_{size}")
        return self.dim_node(size, fx_node)

    def op_sym_stride(self, fx_node, tensor, dim):
        return Node("stride", level="global", dtype="int", attrs={"value": _hint(fx_node.meta["val"])},
                    name=fx_node.name)

    def op_sym_numel(self, fx_node, tensor):
        return self.dim_node(_hint(fx_node.meta["val"]), fx_node)

    def op_transpose(self, fx_node, src, permutation):
        """The identity permutation only (torch's repeat of a 1-d tensor transposes [0, 1]);
        any other moves axes, which the families do not take."""
        if list(permutation) != list(range(len(permutation))):
            raise self.refuse(fx_node, f"the op prims.transpose (axes moved: {list(permutation)})")
        return self.view(src, fx_node)

    # -- views with offsets
    def op_as_strided(self, fx_node, src, size, stride, storage_offset=0):
        if self.is_reshape(fx_node, src, stride, storage_offset):
            return self.view(src, fx_node)  # target.reshape(-1) of a computed value: the same elements
        self.unfoldable(fx_node, "a strided view")
        got = self.env[src]
        new_shape = self.shape_of(fx_node)
        offset = self.sym(storage_offset, fx_node) if storage_offset is not None else const(0)
        if isinstance(got, TensorRef):
            strides = [_hint(s) if not isinstance(s, torch.fx.Node) else self.env[s].attrs.get("value")
                       for s in stride]
            contiguous = _contiguous_strides(got.shape)
            per_row = self.row_piece(got, new_shape, strides, storage_offset, fx_node) \
                if tuple(new_shape) == self.rows else None
            if per_row is not None:  # [B, 2C] (a concatenation's gradient) read as two [B, C] of per-row values
                return self.load(TensorRef(got.field, tuple(new_shape), got.ttype, got.is_int), fx_node,
                                 rows_piece=per_row)
            if strides[-1] != 1 or list(new_shape[:-1]) != list(got.shape[:-1]) or strides[:-1] != contiguous[:-1]:
                piece = self.row_piece(got, new_shape, strides, storage_offset, fx_node)
                if piece is None and is_const(offset, 0) and self.is_narrowing(got, new_shape, strides):
                    return Narrowed(got, tuple(new_shape))  # a template's shape (zeros_like(x[:, :1]))
                if piece is None:
                    raise self.refuse(fx_node, "a strided view of an input other than a column slice")
                return self.load(TensorRef(got.field, tuple(new_shape), got.ttype, got.is_int), fx_node,
                                 rows_piece=piece)
            if is_const(offset, 0) and new_shape == got.shape:
                return got  # the whole input: still a reference, loaded per use
            return self.load(got, fx_node, width=new_shape[-1], offset=None if is_const(offset, 0) else offset)
        strides = [_example(s) for s in stride]
        if isinstance(got, (scan.Prepended, scan.PrependedScan)):
            return scan.lower_prepended_view(self, fx_node, got, new_shape, strides, _example(storage_offset) or 0)
        if isinstance(got, Narrowed):
            raise self.refuse(fx_node, "a view of a slice of a computed value")
        picked = self.column_pick(got, new_shape, strides, storage_offset)
        if picked is not None:
            return picked
        if not is_const(offset, 0):
            hint = _example(storage_offset)
            suffix = scan.lower_suffix(self, fx_node, got, new_shape, hint, strides) \
                if isinstance(got, (Val, scan.ScanSuffix)) else None  # a reversed scan from its second element
            if suffix is None:
                raise self.refuse(fx_node, "a strided view at an offset of a computed value")
            return suffix
        if isinstance(got, Val):
            prefix = scan.lower_prefix(self, fx_node, got, new_shape, strides)  # an exclusive scan's slice
            if prefix is not None:
                return prefix
            if self.is_narrowing(got, new_shape, strides):
                try:
                    return self.view(src, fx_node)  # a per-row value narrowed is that value
                except AgentRefused:
                    return Narrowed(got, tuple(new_shape))  # kept for its shape: any read is refused
        return self.view(src, fx_node)

    @staticmethod
    def is_narrowing(got, new_shape, strides) -> bool:
        """The first few elements along one axis of a value (computed, or an input), at its own
        strides (the caller checks the offset is 0)."""
        shape, new_shape = tuple(got.shape), tuple(new_shape)
        differ = [d for d, (a, b) in enumerate(zip(new_shape, shape)) if a != b]
        return len(new_shape) == len(shape) > 0 and len(differ) == 1 and new_shape[differ[0]] < shape[differ[0]] \
            and list(strides) == _contiguous_strides(shape)

    def op_select(self, fx_node, src, dim, index):
        """x[..., k] along the columns when they are a literal few (a box's coordinates of
        [N, 4]): column k of each row (`column_pick`); any other select is refused."""
        got = self.env.get(src) if isinstance(src, torch.fx.Node) else None
        shape = tuple(got.shape) if isinstance(got, (TensorRef, Val)) else ()
        if not shape or dim % len(shape) != len(shape) - 1 or not isinstance(index, int) \
                or any(d.symbol is not None for d in self.col_dims) or self.fold_dims:
            raise self.refuse(fx_node, "the op aten.select")
        k = index % shape[-1]
        if isinstance(got, TensorRef):
            if shape[:-1] != self.rows:
                raise self.refuse(fx_node, "the op aten.select")
            self.set_width(shape[-1], fx_node)
            dtype = "int" if got.is_int else ("bool" if got.ttype.dtype == "bool" else "float")
            return Val(Node("load", level="row", dtype=dtype, name=f"{got.field}_c{k}",
                            attrs={"field": got.field, "kind": "colpick", "row_div": [], "col": k}), shape[:-1])
        picked = self.column_pick(got, shape[:-1] + (1,), _contiguous_strides(shape), k)
        if picked is None:
            raise self.refuse(fx_node, "the op aten.select")
        return Val(picked.node, shape[:-1])

    def cat_by_column(self, cat: Cat, fx_node) -> Val:
        """A concatenation of one-column pieces read as a value (the gradient of a box's four
        coordinates, stacked back into [N, 4]): piece k where the column index is its offset."""
        if not cat.shape or cat.shape[-1] != self.width or any(
                not v.shape or v.shape[-1] != 1 or not is_const(off) for off, v in cat.pieces):
            raise self.refuse(fx_node, "a concatenation used before it is stored")
        node = cat.pieces[-1][1].node
        for off, v in reversed(cat.pieces[:-1]):
            column = self.pointwise("eq", [self.column_iota(), off], fx_node)
            node = self.where(column, v.node, node, fx_node)
        return Val(node, tuple(cat.shape))

    def column_pick(self, got, new_shape, strides, storage_offset):
        """Column k of a computed value whose columns are a literal few (a box's cx, cy, w, h of
        [N, 4]: `boxes.unbind(-1)`, `boxes[:, 2]`): the value's expression at column k, one per
        row; None when this is not such a pick."""
        k = _example(storage_offset) or 0
        if not isinstance(got, Val) or got.node.level != "elem" or not got.shape or len(new_shape) != len(got.shape) \
                or tuple(new_shape[:-1]) != tuple(got.shape[:-1]) or new_shape[-1] != 1 or self.fold_dims \
                or got.shape[-1] != self.width or strides != _contiguous_strides(got.shape) \
                or not isinstance(k, int) or not 0 <= k < got.shape[-1] \
                or any(d.symbol is not None for d in self.col_dims):
            return None
        node = at_column(got.node, k)
        return None if node is None else Val(node, tuple(new_shape))

    def row_piece(self, got: TensorRef, new_shape, strides, storage_offset, fx_node) -> tuple | None:
        """(d, k, n) when the view is piece k of n equal pieces of the input along row dim d, the
        pieces of the row space (torch.chunk(x, n, dim=d), F.glu over channels); else None. The
        input's dim d must be n times the row dim symbolically, not only in the example."""
        new_shape = tuple(new_shape)
        per_row = new_shape == self.rows  # [B, 2C] read as two [B, C] of one value per row
        if len(new_shape) != len(got.shape) or self.fold_dims or strides != _contiguous_strides(got.shape) \
                or not per_row and (new_shape[:-1] != self.rows or new_shape[-1] != got.shape[-1]):
            return None
        differ = [d for d, (a, b) in enumerate(zip(new_shape, got.shape)) if a != b]
        if len(differ) != 1 or not new_shape[differ[0]] or got.shape[differ[0]] % new_shape[differ[0]]:
            return None
        d = differ[0]
        n = got.shape[d] // new_shape[d]
        if not self.n_pieces_of_a_row_dim(got.field, d, n):
            return None
        block = new_shape[d] * strides[d]  # one piece's elements per index of the dims before d
        offset = _example(storage_offset) if storage_offset is not None else 0
        if not isinstance(offset, int) or offset % block or not 0 <= offset // block < n:
            return None
        if not self.offset_is_pieces(fx_node, got.field, d, offset // block):
            return None  # x.narrow(1, B + 2, C): k pieces only where B + 2 = C (the example; red team, session 42)
        return (d, offset // block, n)

    def offset_is_pieces(self, fx_node, field: str, d: int, k: int) -> bool:
        """Is the as_strided view's storage offset k pieces along dim d at other sizes than the
        example too: its traced expression, at dims each scaled by a different factor, against k
        times the row dim d times the field's dims after d there."""
        offset = fx_node.args[3] if len(fx_node.args) > 3 else fx_node.kwargs.get("storage_offset", 0)
        alt = {symbol: value * (i + 2) for i, (symbol, value) in enumerate(sorted(self.t.dims.items()))}
        at_alt: dict = {}  # the trace's size symbols at those dims (each input's dims say which is which)
        for placeholder, name in zip((n for n in self.t.graph.graph.nodes if n.op == "placeholder"), self.t.inputs):
            sizes = getattr(placeholder.meta.get("val"), "shape", ())
            for size, dim in zip(sizes, self.types[name].dims if name in self.types else ()):
                if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                    at_alt[size.node.expr] = dim.resolve(alt)
        got = offset.meta["val"] if isinstance(offset, torch.fx.Node) else (offset or 0)
        expr = got.node.expr if isinstance(got, torch.SymInt) else sympy.Integer(int(got))
        if not expr.free_symbols <= set(at_alt):
            return False
        want = k * self.row_dims[d].resolve(alt) * math.prod(x.resolve(alt) for x in self.types[field].dims[d + 1:])
        return int(expr.subs(at_alt)) == want

    def n_pieces_of_a_row_dim(self, field: str, d: int, n: int) -> bool:
        """Dim d of `field` is n times row dim d symbolically (2*C against C), not only in the example."""
        whole, part = self.types[field].dims[d], self.row_dims[d]
        return whole.symbol is not None and whole.symbol == part.symbol and not whole.add and not part.add \
            and whole.mul * part.div == n * part.mul * whole.div

    def is_reshape(self, fx_node, src, stride, storage_offset) -> bool:
        """An as_strided that only reshapes a contiguous value: offset 0, the same element
        count, the contiguous strides of its new shape."""
        val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
        if val is None or not hasattr(val, "is_contiguous") or storage_offset not in (None, 0):
            return False
        strides = [_example(s) for s in stride]
        raw = _shape(fx_node)
        try:
            contiguous = bool(val.is_contiguous())
        except Exception:  # a symbolic answer it cannot give: not taken as a reshape
            return False
        return contiguous and math.prod(raw) == math.prod(_shape(src)) and strides == _contiguous_strides(raw)

    def op_cat(self, fx_node, tensors, dim=0):
        self.unfoldable(fx_node, "a concatenation")
        exclusive = scan.lower_cat(self, fx_node, tensors, dim)
        if exclusive is not None:
            return exclusive
        shape = self.shape_of(fx_node)
        per_row = self.per_row_cat(fx_node, tensors, dim % len(shape), shape)
        if per_row is not None:
            return per_row
        if dim % len(shape) != len(shape) - 1:
            row_cat = self.row_cat(fx_node, tensors, dim % len(shape), shape)
            if row_cat is None:
                raise self.refuse(fx_node, "a concatenation along a dim other than the last")
            return row_cat
        if len({self.shape_of(t)[-1] for t in tensors}) > 1:  # a row holds one width: a [N, 1] piece
            # was stored as wide as the others, over the next row (a helper's size fuzz, session 22)
            raise self.refuse(fx_node, "a concatenation of pieces of different widths")
        pieces, offset = [], 0
        literal = all(d.symbol is None for d in self.col_dims)  # [N, 4] boxes: offsets are numbers
        for t in tensors:
            v = self.value(t, fx_node)
            at = const(offset) if literal else self.dim_node(offset, fx_node) if offset else const(0)
            pieces.append((at, v))
            offset += self.shape_of(t)[-1]
        return Cat(pieces, shape)

    def row_cat(self, fx_node, tensors, dim: int, shape) -> RowCat | None:
        """Equal pieces of the row space along row dim `dim` (a channel chunk's gradient), or None."""
        if self.fold_dims or dim >= len(self.rows) or len(shape) != len(self.rows) + 1:
            return None
        if any(tuple(self.shape_of(t)) != self.rows + (shape[-1],) for t in tensors):
            return None
        return RowCat([self.value(t, fx_node) for t in tensors], dim, tuple(shape))

    def per_row_cat(self, fx_node, tensors, dim: int, shape) -> RowCat | None:
        """Per-row values (a pool's mean and std over [B, C]) concatenated along a row dim, [B, 2C]
        or [B, 2C, 1]: each a row store into its piece of the output's rows, or None."""
        if self.fold_dims or dim >= len(self.rows) or not self.rows:
            return None
        if any(tuple(self.shape_of(t)) not in (self.rows, self.rows + (1,)) for t in tensors):
            return None
        vals = [self.value(t, fx_node) for t in tensors]
        if any(v.node.level not in ("row", "const", "global") for v in vals):
            return None
        return RowCat(vals, dim, tuple(shape), per_row=True)

    def filled(self, value, fx_node) -> Node:
        """A fill value: a number computed from a float scalar is its expression (torch.full_like(x,
        alpha) filled the traced sentinel before, session 21 review), any other a constant."""
        hit = scalar_constants.match(value, self.t.scalar_forms) if isinstance(value, float) else None
        return self.scalar_expression(*hit, fx_node) if hit is not None else const(value)

    def op_full_like(self, fx_node, src, value, **kwargs):
        return Val(self.filled(value, fx_node), self.shape_of(fx_node))

    def op_full(self, fx_node, size, value, **kwargs):
        return Val(self.filled(value, fx_node), self.shape_of(fx_node))

    def op_scalar_tensor(self, fx_node, value, **kwargs):
        if isinstance(value, torch.fx.Node):  # a size as a tensor (torch.div(i, n, rounding_mode="floor") by a size)
            node = self.sym(value, fx_node)
            want = kwargs.get("dtype")
            if want is not None and want.is_floating_point and node.dtype != "float":
                node = self.cast(node, want, fx_node)
            return Val(node, ())
        return Val(self.filled(value, fx_node), ())

    def op_copy_(self, fx_node, dst, src, *args, **kwargs):
        """aten.copy_ into a fresh torch.empty: a module's parameter initialized with a fill
        (modules.lower_copy). Any other copy is functional (decompositions copy a value into a
        fresh tensor; a module's buffer update in training mode, which no output reads): the
        source's value, at the destination's shape when that is only a view of it."""
        if isinstance(self.env.get(dst) if hasattr(dst, "op") else None, Uninit):
            return lower_copy(self, fx_node, dst, src)
        shape = self.shape_of(fx_node)
        ref = self.env.get(src) if isinstance(src, torch.fx.Node) else None
        same_dtype = isinstance(src, torch.fx.Node) and getattr(src.meta.get("val"), "dtype", None) == \
            getattr(fx_node.meta.get("val"), "dtype", None)
        if not same_dtype:  # a copy that converts (float32 into a bf16 buffer) rounds: the general path
            ref = None
        if isinstance(ref, TensorRef) and tuple(ref.shape) == shape:
            return ref  # an input copied whole (a module's buffer loaded from it): still the input
        if isinstance(ref, broadcast.Pending) and tuple(ref.val.shape) == shape:
            return ref  # a value computed on a lower-rank input, still to be broadcast
        v = self.value(src, fx_node)
        if tuple(v.shape) != shape and v.node.level == "elem":
            raise self.refuse(fx_node, "a copy that broadcasts a tensor")
        return Val(v.node, shape)

    def op_convert_element_type(self, fx_node, src, dtype):
        v = self.value(src, fx_node, defer=True)
        if isinstance(v, broadcast.Pending):
            return broadcast.Pending(Val(self.cast(v.val.node, dtype, fx_node), v.val.shape), v.maps)
        return Val(self.cast(v.node, dtype, fx_node), self.shape_of(fx_node))

    def op_where(self, fx_node, cond, a, b):
        vals = [self.value(t, fx_node, defer=True) for t in (cond, a, b)]
        if any(isinstance(v, broadcast.Pending) for v in vals):  # a clamp of a [H] parameter before its broadcast
            pending = broadcast.elementwise(self, "where", vals, self.shape_of(fx_node), fx_node)
            if pending is not None:
                return pending
            vals = [broadcast.materialize(self, v, fx_node) if isinstance(v, broadcast.Pending) else v for v in vals]
        c, x, y = vals
        return Val(self.where(c.node, x.node, y.node, fx_node), self.shape_of(fx_node))

    # -- reductions
    def reduce_axes(self, src, dims, fx_node) -> list[int]:
        if not isinstance(src, torch.fx.Node) or "val" not in src.meta:
            return list(dims)
        return self.canonical_axes(list(dims), _shape(src), fx_node)

    def op_sum(self, fx_node, src, dims, **kw):
        return self.reduce("sum", self.value(src, fx_node), self.reduce_axes(src, dims, fx_node), fx_node)

    def op_amax(self, fx_node, src, dims, **kw):
        return self.reduce("max", self.value(src, fx_node), self.reduce_axes(src, dims, fx_node), fx_node)

    def op_amin(self, fx_node, src, dims, **kw):
        return self.reduce("min", self.value(src, fx_node), self.reduce_axes(src, dims, fx_node), fx_node)

    def op_max(self, fx_node, src, dim=None, keepdim=False):
        return self.extreme_with_index("max", fx_node, src, dim, keepdim)

    def op_min(self, fx_node, src, dim=None, keepdim=False):
        return self.extreme_with_index("min", fx_node, src, dim, keepdim)

    def extreme_with_index(self, kind: str, fx_node, src, dim, keepdim: bool):
        """torch.max / torch.min over one dim: (values, indices). The values are amax's; the index,
        over the columns only, is the first column holding the value, or the first NaN (torch's
        ties and NaN): the least column of where(x == m or x != x, col, W), a second dependent
        sweep. Indices over another dim are refused where they are used."""
        if dim is None:  # torch.max(x): one value, no index
            return self.reduce(kind, self.value(src, fx_node), list(range(len(_shape(src)))), fx_node)
        v = self.value(src, fx_node)
        axes = self.reduce_axes(src, [dim], fx_node)
        values = self.reduce(kind, v, axes, fx_node)
        shape = tuple(1 if i in axes else s for i, s in enumerate(v.shape)) if keepdim else values.shape
        values = Val(values.node, shape)
        if not self.indices_in_rows:  # the axis family's arg-reduction first (one sweep of (value, index))
            return values, IndexRefused(f"the indices of a {kind} inside a row computation")
        if axes != [len(v.shape) - 1] or v.node.level != "elem" or self.is_row_shape(v.shape):
            return values, IndexRefused(f"the indices of a {kind} over a dim other than the columns")
        width = self.dim_node(v.shape[-1], fx_node)
        if width.op != "dim" or self.largest(width.attrs["dim"]) > 1 << 24:
            return values, IndexRefused(f"the indices of a {kind} over columns that may pass 2^24 (the row "
                                        f"reductions carry floats: a column index is exact below 2^24)")
        # the least column in a float row reduction (the row sweeps accumulate acc_t): exact below 2^24
        hit = self.pointwise("or", [self.pointwise("eq", [v.node, values.node], fx_node),
                                    self.pointwise("ne", [v.node, v.node], fx_node)], fx_node)
        at = self.pointwise("where", [hit, self.cast(self.column_iota(), torch.float32, fx_node),
                                      self.cast(width, torch.float32, fx_node)], fx_node, dtype="float")
        first = Node("rowreduce", (at,), level="row", dtype="float", attrs={"kind": "min"}, name=f"{fx_node.name}_at")
        return values, Val(self.cast(first, torch.int64, fx_node), shape)

    def largest(self, dim) -> int:
        """A signature dim's largest size that the spec's dims allow."""
        if dim.symbol is None:
            return dim.resolve({})
        return self.spec.dims[dim.symbol][1] * dim.mul // dim.div + dim.add

    def op_var(self, fx_node, src, dims, correction=0.0, **kw):
        return self.reduce("var", self.value(src, fx_node), self.reduce_axes(src, dims, fx_node), fx_node,
                           correction=correction)

    # -- indexing along the last dim
    def op_gather(self, fx_node, src, dim, index, **kw):
        if self.fold_sizes:
            self.unfoldable(fx_node, "a gather")
        v, idx = self.value(src, fx_node), self.value(index, fx_node)
        if not self.is_last_axis(dim, src, v.shape) or idx.node.level not in ("row", "const", "global"):
            raise self.refuse(fx_node, "a gather other than one column per row")
        return Val(Node("gather", (v.node, idx.node), level="row", dtype=v.node.dtype, name=fx_node.name),
                   self.shape_of(fx_node))

    def op_scatter(self, fx_node, base, dim, index, value=None, **kw):
        if self.fold_sizes:
            self.unfoldable(fx_node, "a scatter")
        if kw.get("reduce") is not None:  # scatter(..., reduce="add" / "multiply") combines with the base
            raise self.refuse(fx_node, f"a scatter with reduce={kw['reduce']!r}")
        b, idx = self.value(base, fx_node), self.value(index, fx_node)
        # a per-row source (aten.scatter.src: torch.max's backward puts each row's gradient at its index)
        src = self.value(value, fx_node) if isinstance(value, torch.fx.Node) else None
        if src is None and not isinstance(value, (int, float)) or src is not None and (
                src.node.level not in ("row", "const", "global") or not self.one_per_row(value)) \
                or not self.is_last_axis(dim, base, b.shape) \
                or idx.node.level not in ("row", "const", "global") or not self.one_per_row(index):
            raise self.refuse(fx_node, "a scatter other than one value per row at one column per row (a one-hot)")
        self.set_width(b.shape[-1], fx_node)
        hit = self.column_hit(idx.node, fx_node)
        put = src.node if src is not None else self.filled(value, fx_node)
        return Val(self.where(hit, put, b.node, fx_node), self.shape_of(fx_node))

    def column_hit(self, index: Node, fx_node) -> Node:
        """column == index: where a scatter of one value per row writes (the column is the
        program's column index: the row lowering's last axis, the axis family's reduced one)."""
        return self.pointwise("eq", [self.column_iota(), index], fx_node)

    def one_per_row(self, index) -> bool:
        """Does a scatter's index name one column in every row: shaped [rows..., 1] (an index of
        fewer rows, a [1, 1] one, touches only those rows in torch)."""
        raw = _raw_shape(index)
        return bool(raw) and raw[-1] == 1 and self.is_row_shape(self.fold_shape(raw))

    def op_scatter_add(self, fx_node, base, dim, index, src, **kw):
        """gather's backward: one value per row added at one column per row (a [rows, 1] index and
        source), base + where(column == index, source, 0)."""
        if self.fold_sizes:
            self.unfoldable(fx_node, "a scatter_add")
        b, idx, add = self.value(base, fx_node), self.value(index, fx_node), self.value(src, fx_node)
        if not self.is_last_axis(dim, base, b.shape) or idx.node.level not in ("row", "const", "global") \
                or add.node.level not in ("row", "const", "global") or not self.one_per_row(index):
            raise self.refuse(fx_node, "a scatter_add other than one value per row at one column per row")
        self.set_width(b.shape[-1], fx_node)
        return Val(self.added_at(b.node, idx.node, add.node, fx_node), self.shape_of(fx_node))

    def added_at(self, base: Node, index: Node, value: Node, fx_node) -> Node:
        """base + where(column == index, value, 0): a scatter_add of one value per row."""
        added = self.where(self.column_hit(index, fx_node), value, const(0.0 if value.dtype == "float" else 0), fx_node)
        return self.pointwise("add", [base, added], fx_node)

    # -- outputs
    def store(self, field: str, result, fx_node) -> list[Store]:
        got = self.env[result] if isinstance(result, torch.fx.Node) else None
        if got is None:
            got = Val(const(result), ())
        ttype = self.types[field]
        if isinstance(got, RowCat):
            return self.store_row_pieces(field, got, fx_node)
        pieces = got.pieces if isinstance(got, Cat) else [(None, self.value(result, fx_node))]
        # a 0-d output, or one of one element ([1]: a scalar parameter's gradient) holding a total
        if ttype.ndim == 0 or (_one_element(ttype) and pieces[0][1].node.level in ("post", "global", "const")):
            node = pieces[0][1].node
            if node.level in ("row", "elem"):
                raise self.refuse(fx_node, f"a 0-d output {field} that is not a reduction over every row")
            return [Store(field, node, "global")]
        shape = self.fold_shape(tuple(d.resolve(self.t.dims) for d in ttype.dims), fx_node)
        if self.is_row_shape(shape):
            node = self.before_the_rows(pieces[0][1].node, field, fx_node)
            if node.level == "elem":
                raise self.refuse(fx_node, f"output {field} is per row but its value is per element")
            return [Store(field, node, "row")]
        lead = tuple(shape[:-1])
        if lead == self.rows:
            div = None
        elif lead == self.rows[:len(lead)]:  # per group of rows (a parameter's gradient)
            div = list(self.row_dims[len(lead):])
        else:
            raise self.refuse(fx_node, f"output {field} of shape {shape} that is not rows x columns")
        stores = []
        for offset, val in pieces:
            node = val.node
            piece_width = val.shape[-1] if val.shape else shape[-1]
            if piece_width != 1:
                self.set_width(piece_width, fx_node)
            off = None if offset is None or is_const(offset, 0) else offset
            if div is None:
                node = self.before_the_rows(node, field, fx_node)
                stores.append(Store(field, node, "elem", off))
            else:
                if node.level != "post" and node.level != "const":
                    raise self.refuse(fx_node, f"output {field} is broadcast over rows but not a sum over rows")
                if self.group_div is not None and [str(d) for d in div] != [str(d) for d in self.group_div]:
                    raise self.refuse(fx_node, f"output {field}: its rows do not match the reduction's groups")
                if self.group_div is None:
                    self.group_div = div
                stores.append(Store(field, node, "col", off))
        return stores

    def store_row_pieces(self, field: str, got: RowCat, fx_node) -> list[Store]:
        """Each piece into its rows of the output (piece k of n along row dim d): checked against
        the output's dims symbolically, as the input's pieces are (row_piece)."""
        d, n = got.dim, len(got.pieces)
        if not self.n_pieces_of_a_row_dim(field, d, n) or tuple(got.shape[:-1]) == self.rows:
            raise self.refuse(fx_node, f"output {field}: a concatenation along a row dim that is not n pieces "
                                       f"of the row space")
        if got.per_row:
            if self.types[field].ndim not in (len(self.rows), len(self.rows) + 1) or \
                    self.types[field].ndim == len(self.rows) + 1 and got.shape[-1] != 1:
                raise self.refuse(fx_node, f"output {field}: per-row pieces stored at another rank")
            return [Store(field, self.before_the_rows(val.node, field, fx_node), "row", piece=(d, k, n))
                    for k, val in enumerate(got.pieces)]
        self.set_width(got.shape[-1], fx_node)
        stores = []
        for k, val in enumerate(got.pieces):
            node = self.before_the_rows(val.node, field, fx_node)
            if node.level not in ("elem", "row", "const", "global"):
                raise self.refuse(fx_node, f"output {field}: a piece that is a sum over rows")
            stores.append(Store(field, node, "elem", piece=(d, k, n)))
        return stores

    def before_the_rows(self, node: Node, field: str, fx_node) -> Node:
        """A per-row or per-element output's value with its sums over rows computed before the
        row pass (pretotal.py), or a refusal when one of them needs the row pass itself."""
        if node.level != "post":
            return node
        try:
            return pretotal.hoist(node, self.pretotals)
        except pretotal.NotBeforehand as why:
            raise self.refuse(fx_node, f"output {field} mixes a reduction over rows into per-row values "
                                       f"({why}, known only after the row pass)") from None


def _reads_per_row_values(node: Node) -> bool:
    """Does `node` read a value per row: a row reduction, a gather or a per-row input."""
    return any(n.level == "row" for n in ir.walk(node))


def at_column(node: Node, k: int) -> Node | None:
    """`node`'s value at column k, as one value per row: its elem loads read that column, the
    column index is k. None where an elem value needs the whole row (a reduction, a scan, a
    gather) or a [W] parameter (not read per row)."""
    memo: dict[int, Node | None] = {}

    def go(n: Node) -> Node | None:
        if n.id in memo:
            return memo[n.id]
        if n.level != "elem":
            out = n
        elif n.op == "load" and n.attrs.get("kind") == "elem" and n.attrs.get("offset") is None:
            out = Node("load", level="row", dtype=n.dtype, name=f"{n.name}_c{k}",
                       attrs={"field": n.attrs["field"], "kind": "colpick", "row_div": n.attrs.get("row_div", []),
                              "col": k})
        elif n.op == "iota":
            out = const(k)
        elif n.op in ("load", "rowreduce", "scan", "gather") or not n.args:
            out = None
        else:
            args = [go(a) for a in n.args]
            out = None if any(a is None for a in args) else \
                Node(n.op, tuple(args), level=level_of(*args), dtype=n.dtype, attrs=dict(n.attrs), name=n.name)
        memo[n.id] = out
        return out

    return go(node)


def _contiguous_strides(shape):
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return list(reversed(strides))


def _one_element(ttype) -> bool:
    """A tensor type whose every size is the literal 1 (one value, whatever its rank)."""
    return all(d.is_literal and d.add == 1 for d in ttype.dims)


def lower(traced: Traced, totals_in_rows: bool = False, rows_of_output: bool = False,
          indices_in_rows: bool = False) -> Program:
    return Lowering(traced, totals_in_rows, rows_of_output, indices_in_rows).run()
