"""The scan family: cumsum, cumprod, logcumsumexp and the values of cummax / cummin along any
axis, forward and reversed (flip-scan-flip, the backward of cumsum and logcumsumexp), fused
with pointwise ops before and after (an exclusive scan written as cumsum(x) - x is one).

Lowering (`lower_scan`, `lower_rev`, called from lower.py): trace.py keeps aten.cumsum /
cumprod / logcumsumexp undecomposed; a scan becomes an elem node `scan` (attrs: kind sum |
prod | logsumexp, axis, the scanned shape as dim nodes, reverse). `prims.rev` (flip) is held
as a `Rev` until a scan along the same axis takes it (scan(rev(x)) = rev(reverse scan(x))) or
another rev cancels it; a flip used any other way is refused.

Kernels (`plan_of`, `ScanEmitter`): the scanned tensor is [outer, L, inner] around the axis.
    lanes   (inner > 1, or scans that feed each other): a thread per (outer, inner) lane walks
            L in order, coalesced along inner; every scan a running value in a register.
    segments (inner > 1, independent scans, lanes too few to fill the GPU: a cumsum down the
            columns): each lane's L in SEGMENTS pieces, a thread each; the pieces' totals, the
            carry of the pieces before from shared memory, then the scan (two reads, one write).
    rows    (inner == 1, independent scans): a block per row, the row in tiles of BLOCK * VEC;
            a VEC-element chunk per thread (one 16-byte access, coalesced) scanned in registers,
            the chunks' totals scanned over the block (warp shuffles, then the warp totals),
            combined with the carry of the tiles before: one read and one write of the row.
Every scan of a program runs along one axis in one direction; anything else is refused.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...base import AgentRefused
from ..ctext import Ctx, dim_expr, entry_function, launch_need_param, take_workspace, workspace_entry
from ..cwriter import CWriter
from ..ir import Node, Program, walk

SCAN_OPS = {"cumsum": "sum", "cumprod": "prod", "logcumsumexp": "logsumexp", "cummax": "max", "cummin": "min"}
# each kind's identity as C, cast to the scan's running type (ScanEmitter.ident)
IDENTITY = {"sum": "0", "prod": "1", "logsumexp": "(-INFINITY)", "max": "(-INFINITY)", "min": "INFINITY"}
BLOCK = 256
SEGMENTS = 8  # threads a lane in the segments kernel (lanes x 8 fill the H200 from 2^15 lanes)
SEGMENTS_MIN_LENGTH = 4 * SEGMENTS  # shorter lanes are not split
RESIDENT_THREADS = 2048  # per SM: lanes below half the GPU's resident threads take segments


@dataclass
class Rev:
    """A flipped value along `axis` (of a Val of `shape`), awaiting the scan that takes it."""

    val: object
    axis: int


def trace_decompositions(table: dict) -> dict:
    """The decomposition table without the scans (their decompositions are O(L^2) masks)."""
    keep = {getattr(torch.ops.aten, name).default for name in SCAN_OPS}
    return {k: v for k, v in table.items() if k not in keep}


def lower_rev(lw, fx_node, x, dims):
    got = lw.env[x] if isinstance(x, torch.fx.Node) else None
    if len(dims) != 1:
        raise lw.refuse(fx_node, "a flip over several dims")
    if isinstance(got, Rev):
        shape = got.val.shape
        if dims[0] % len(shape) == got.axis:
            return got.val  # rev(rev(y)) = y
        raise lw.refuse(fx_node, "flips over two different dims")
    val = lw.value(x, fx_node)
    if not val.shape:
        return val
    return Rev(val, dims[0] % len(val.shape))


def lower_scan(lw, fx_node, kind: str, x, dim):
    got = lw.env[x] if isinstance(x, torch.fx.Node) else None
    if isinstance(got, Prepended):
        return _scan_of_prepended(lw, fx_node, kind, got, dim)
    reverse = isinstance(got, Rev)
    val = got.val if reverse else lw.value(x, fx_node)
    if not val.shape:
        return val
    axis = dim % len(val.shape)
    if reverse and got.axis != axis:
        raise lw.refuse(fx_node, "a scan of a tensor flipped along another dim")
    return _scan(lw, fx_node, kind, val, axis, reverse)


def _scan(lw, fx_node, kind: str, val, axis: int, reverse: bool, exclusive: bool = False):
    """The scan node of `val` along `axis` (a Val, or a Rev of it when reversed)."""
    from ..lower import Val

    shape = val.shape
    if val.node.level != "elem" or val.node.dtype != "float":
        raise lw.refuse(fx_node, f"a {kind} scan of a {val.node.level} {val.node.dtype} value (scans of "
                                 f"per-element float values only)")
    if lw.rows + (lw.width,) != tuple(shape) and (lw.width is not None or tuple(shape[:-1]) != lw.rows):
        raise lw.refuse(fx_node, f"a scan of a broadcast value (shape {tuple(shape)}, rows {lw.rows})")
    lw.set_width(shape[-1], fx_node)
    dims = [lw.dim_node(s, fx_node) for s in shape]
    attrs = {"kind": kind, "axis": axis, "shape": dims, "reverse": reverse, **({"exclusive": True} if exclusive else {})}
    node = Node("scan", (val.node,), level="elem", dtype="float", attrs=attrs, name=fx_node.name)
    lw.scan_shapes[node.id] = tuple(shape)
    out = Val(node, shape)
    return Rev(out, axis) if reverse else out


def _own_slice(lw, got, new_shape, strides) -> int | None:
    """The scan's axis when `got` is a scan at its own shape (not a view that regroups its dims)
    and `new_shape` its slice along that axis one shorter, with the scan's own strides; else None."""
    from ..lower import _contiguous_strides

    node, shape = got.node, tuple(got.shape)
    if node.op != "scan" or node.attrs.get("exclusive") or lw.scan_shapes.get(node.id) != shape \
            or len(new_shape) != len(shape) or list(strides) != _contiguous_strides(shape):
        return None
    axis = node.attrs["axis"]
    return axis if tuple(new_shape) == shape[:axis] + (shape[axis] - 1,) + shape[axis + 1:] else None


@dataclass
class Prepended:
    """cat([the identity, y], axis): one element of a constant before y along `axis`, awaiting
    the scan along that axis that makes it y's exclusive scan and then y's total (NeRF's
    transmittance, cumprod(cat([ones, 1 - alpha + 1e-10], -1), -1)[..., :-1])."""

    fill: object  # the constant's Val, one element along axis
    val: object  # y
    axis: int
    shape: tuple  # y's shape, one longer along axis


@dataclass
class PrependedScan:
    """The scan of a Prepended: its first L elements along the axis are y's exclusive scan
    (`val`); any other use of it (its last element, y's total) is refused."""

    val: object
    axis: int
    shape: tuple


def _scan_of_prepended(lw, fx_node, kind: str, got: Prepended, dim):
    fill = got.fill.node
    if dim % len(got.shape) != got.axis or fill.op != "const" or \
            float(fill.attrs["value"]) != IDENTITY_VALUE[kind]:
        raise lw.refuse(fx_node, "a scan of a concatenation other than the identity before the values")
    return PrependedScan(_scan(lw, fx_node, kind, got.val, got.axis, False, exclusive=True), got.axis, got.shape)


def lower_prepended_view(lw, fx_node, got, new_shape, strides, offset):
    """A view of a Prepended or of its scan: as it is (same shape, its own strides), or the scan's
    first L elements along the axis (the exclusive scan); anything else refused."""
    from ..lower import _contiguous_strides

    own = list(strides) == _contiguous_strides(got.shape) and offset == 0
    if own and tuple(new_shape) == tuple(got.shape):
        return got
    if own and isinstance(got, PrependedScan) and tuple(new_shape) == tuple(got.val.shape):
        return got.val
    raise lw.refuse(fx_node, "a slice of a scan other than its exclusive form")


@dataclass
class ValuesOnly:
    """torch.cummax / cummin's (values, indices): the values are a scan; the indices (their
    backward's scatter) are outside the family."""

    values: object
    lw: object
    fx_node: object

    def __getitem__(self, index: int):
        if index == 0:
            return self.values
        raise self.lw.refuse(self.fx_node, "the indices of a running max or min")


def lower_extreme(lw, fx_node, kind: str, x, dim):
    return ValuesOnly(lower_scan(lw, fx_node, kind, x, dim), lw, fx_node)


@dataclass
class ScanPrefix:
    """The first L - 1 values of a scan along its axis (inclusive[..., :-1]), awaiting the pad
    that makes it exclusive."""

    val: object
    axis: int


def lower_prefix(lw, fx_node, got, new_shape, strides):
    axis = _own_slice(lw, got, new_shape, strides)
    return ScanPrefix(got, axis) if axis is not None and not got.node.attrs["reverse"] else None


@dataclass
class ScanSuffix:
    """The last L - 1 values of a reversed scan along its axis (reverse inclusive[..., 1:]),
    awaiting the pad at the end that makes it exclusive."""

    val: object
    axis: int
    shape: tuple


def lower_suffix(lw, fx_node, got, new_shape, offset: int, strides):
    """A reversed scan at its own shape sliced from its second element along its axis (a storage
    offset of that axis's stride, the scan's own strides), or that slice viewed again as it is;
    None for anything else."""
    from ..lower import _contiguous_strides

    if isinstance(got, ScanSuffix):
        parent = _contiguous_strides(got.val.shape)
        return got if tuple(new_shape) == got.shape and list(strides) == parent and offset == parent[got.axis] else None
    axis = _own_slice(lw, got, new_shape, strides)
    if axis is None or not got.node.attrs["reverse"] or offset != _contiguous_strides(got.shape)[axis]:
        return None
    return ScanSuffix(got, axis, tuple(new_shape))


def _exclusive(scan: Node, fill, shape, axis: int, dim: int):
    """The exclusive form of `scan` when `fill` is its identity, one element along `axis`."""
    from ..lower import Val

    if dim % len(shape) != axis or not isinstance(fill, Val) or fill.node.op != "const" or fill.shape[axis] != 1 \
            or float(fill.node.attrs["value"]) != IDENTITY_VALUE[scan.attrs["kind"]]:
        return None
    node = Node("scan", scan.args, level="elem", dtype="float", attrs={**scan.attrs, "exclusive": True},
                name=f"{scan.name}_excl")
    return Val(node, shape)


def lower_cat(lw, fx_node, tensors, dim):
    """cat([identity fill of width 1, scan[..., :-1]]) along the scan's axis: the exclusive scan
    (F.pad(x.cumsum(-1)[..., :-1], (1, 0))); cat([reversed scan[..., 1:], identity fill]): the
    exclusive reversed scan (a suffix sum of the elements after each one); None for any other
    concatenation."""
    from ..lower import Val

    if len(tensors) != 2 or not all(isinstance(t, torch.fx.Node) for t in tensors):
        return None
    first, second = lw.env.get(tensors[0]), lw.env.get(tensors[1])
    if isinstance(second, ScanPrefix):
        return _exclusive(second.val.node, first, second.val.shape, second.axis, dim)
    if isinstance(first, ScanSuffix):
        return _exclusive(first.val.node, second, first.val.shape, first.axis, dim)
    if isinstance(first, Val) and first.node.op == "const" and not isinstance(second, Val):
        second = lw.value(tensors[1], fx_node)  # an input, loaded (a refusal names it)
    if isinstance(first, Val) and first.node.op == "const" and isinstance(second, Val) and second.shape \
            and len(first.shape) == len(second.shape):  # a constant before the values: a scan may take it
        axis = dim % len(second.shape)
        one = tuple(second.shape[:axis]) + (1,) + tuple(second.shape[axis + 1:])
        if tuple(first.shape) == one:
            longer = tuple(second.shape[:axis]) + (second.shape[axis] + 1,) + tuple(second.shape[axis + 1:])
            return Prepended(first, second, axis, longer)
    return None


# ------------------------------------------------------------------ the CPU interpreter
def interp_scan(node: Node, x: torch.Tensor, rows: int, width: int, dims: dict) -> torch.Tensor:
    shape = [int(d.attrs["dim"].resolve(dims)) if d.op == "dim" else int(d.attrs["value"])
             for d in node.attrs["shape"]]
    full = x.expand(rows, width).reshape(shape)
    axis = node.attrs["axis"]
    if node.attrs["reverse"]:
        full = full.flip(axis)
    kind = node.attrs["kind"]
    out = (full.cumsum(axis) if kind == "sum" else full.cumprod(axis) if kind == "prod"
           else full.cummax(axis).values if kind == "max" else full.cummin(axis).values if kind == "min"
           else full.logcumsumexp(axis))
    if node.attrs.get("exclusive"):  # the value before each element: shifted by one, identity first
        first = torch.full_like(out.narrow(axis, 0, 1), IDENTITY_VALUE[kind])
        out = torch.cat([first, out.narrow(axis, 0, out.shape[axis] - 1)], axis)
    if node.attrs["reverse"]:
        out = out.flip(axis)
    return out.reshape(rows, width)


# ------------------------------------------------------------------ plan
@dataclass(frozen=True)
class ScanPlan:
    axis: int  # the scanned axis of the stores' shape
    rank: int
    reverse: bool
    kinds: tuple  # one per scan node, in program order
    chained: bool  # a scan reads another scan's values (lanes kernel only)
    block: int = BLOCK
    column_sums: int = 0  # sums over every row per column (a [W] parameter's gradient): no rows kernel

    def kernel(self, inner: int, lanes: int | None = None, length: int = 0, sms: int = 132) -> str:
        """rows | segments | lanes: the kernel the host runs for a scanned tensor of `inner`
        trailing elements, `lanes` = outer * inner lanes of `length` along the axis, on `sms` SMs."""
        if self.chained:
            return "lanes"
        if inner == 1 and not self.column_sums:
            return "rows"
        few = lanes is not None and lanes * 2 <= sms * RESIDENT_THREADS and length >= SEGMENTS_MIN_LENGTH
        return "segments" if few else "lanes"


def plan_of(program: Program) -> ScanPlan | None:
    from . import flat

    scans = [n for n in program.nodes() if n.op == "scan"]
    if not scans:
        return None
    axes = {(n.attrs["axis"], len(n.attrs["shape"]), n.attrs["reverse"]) for n in scans}
    if len(axes) != 1:
        raise AgentRefused(f"{program.op}: scans along different axes or in both directions in one "
                           f"{program.direction} kernel: outside the builtin generator's scan family; use an "
                           f"LLM agent (--agent openai|anthropic|openai-compatible)")
    axis, rank, reverse = axes.pop()
    # the rest must be flat: every value per element (or global), inputs of the scanned shape, and
    # sums over every row per column where a lane is one column's (_column_sums_fit)
    column_sums = [n for n in program.nodes() if n.op == "colreduce"]
    if not _flat_but_scans(program, flat, bool(column_sums)) or (
            column_sums and not _column_sums_fit(program, column_sums, axis, rank)):
        raise AgentRefused(f"{program.op}: a scan fused with row reductions, per-row values or sliced "
                           f"inputs in one {program.direction} kernel: outside the builtin generator's scan "
                           f"family; use an LLM agent (--agent openai|anthropic|openai-compatible)")
    ids = {n.id for n in scans}
    chained = any(_reaches(n.args[0], ids) for n in scans)
    return ScanPlan(axis, rank, reverse, tuple(n.attrs["kind"] for n in scans), chained,
                    column_sums=len(column_sums))


def scan_directions(program: Program) -> int:
    """How many (axis, direction) pairs the program's scans take."""
    return len({(n.attrs["axis"], n.attrs["reverse"]) for n in program.nodes() if n.op == "scan"})


def _column_sums_fit(program: Program, column_sums: list, axis: int, rank: int) -> bool:
    """Sums over every row of each column (Mamba-2's per-head parameters' gradients): a lane of
    the lanes and segments kernels is one column's, so each thread sums its own elements and
    writes one slot's partial, and the finalize sums the slots in order. It needs the columns to be
    the scanned shape's last axis alone, the scan along another one, and one group of all rows."""
    grouped = program.group_div is not None and [str(d) for d in program.group_div] != [
        str(d) for d in program.row_dims]
    return (all(n.attrs.get("kind") == "sum" and n.args[0].level == "elem" for n in column_sums)
            and program.fold == 1 and axis < rank - 1 and not grouped)


def _reaches(node: Node, ids: set) -> bool:
    return any(n.id in ids for n in walk(node))


def _flat_but_scans(program: Program, flat, column_sums: bool = False) -> bool:
    """Every value per element (or global) but the scans' own; with column_sums, also sums over
    the rows per column and the column values computed from them (stored as [W] outputs)."""
    store_kinds = ("elem", "col") if column_sums else ("elem",)
    if not program.stores or any(s.kind not in store_kinds or s.offset is not None or s.piece is not None
                                 for s in program.stores):
        return False
    positions = _position_values(program)
    allowed = {"scan", "colreduce"} if column_sums else {"scan"}
    for n in program.nodes():
        if n.id in positions:
            continue
        if n.op in flat._NOT_FLAT - allowed or n.level == "row" or (n.level == "post" and not column_sums):
            return False
        if n.op == "load" and n.level == "elem" and (n.attrs.get("offset") is not None or n.attrs.get("row_div")
                                                     or n.attrs.get("rows_piece")
                                                     or n.attrs["kind"] == "bcast"):
            return False
    return True


_NOT_POSITION = {"load", "scan", "rowreduce", "gather", "colreduce", "globalreduce", "pretotal"}


def _position_values(program: Program) -> set:
    """Ids of the nodes computed from element positions alone (the column index, a row's index
    along a row dim, and pointwise math of them with constants and scalars): the scan kernels
    give each element its position (ScanEmitter._positions)."""
    found: set = set()
    for n in program.nodes():  # arguments before their users
        if n.op in ("iota", "rowiota") or (
                n.op not in _NOT_POSITION and any(a.id in found for a in n.args)
                and all(a.id in found or a.level in ("const", "global") for a in n.args)):
            found.add(n.id)
    return found


# ------------------------------------------------------------------ emitter
HELPERS = r"""#ifndef SG_SCAN_HELPERS
#define SG_SCAN_HELPERS
// torch's _log_add_exp_helper: a NaN on either side is the result (a NaN beside -inf too), and
// two infinities of one sign stay that infinity (inf - inf would give NaN)
template <typename A> __device__ __forceinline__ A sg_scan_logaddexp(A a, A b) {
  if (a != a) return a;
  if (b != b) return b;
  const A m = a > b ? a : b;
  if (m == (A)(-INFINITY) || m == (A)INFINITY) return m;
  return m + log1p(exp(-fabs(a - b)));
}
// torch.cummax / cummin: a NaN, once met, is the running value (torch's values)
template <bool MAX, typename A> __device__ __forceinline__ A sg_scan_extreme(A a, A b) {
  if (a != a) return a;
  if (b != b) return b;
  return MAX ? (b >= a ? b : a) : (b <= a ? b : a);  // ties: the later one, as torch (-0.0 after +0.0)
}
// KIND 0: sum, 1: product, 2: log-sum-exp, 3: max, 4: min.
template <int KIND, typename A> __device__ __forceinline__ A sg_scan_op(A a, A b) {
  return KIND == 0 ? a + b : KIND == 1 ? a * b : KIND == 2 ? sg_scan_logaddexp(a, b)
       : sg_scan_extreme<KIND == 3>(a, b);
}
// One scan step: the running value s takes x; the inclusive value (s after) or the exclusive
// one (s before) is returned.
template <int KIND, bool EXCL, typename A> __device__ __forceinline__ A sg_scan_step(A& s, A x) {
  const A before = s;
  s = sg_scan_op<KIND>(s, x);
  return EXCL ? before : s;
}
#endif"""
KIND_ID = {"sum": 0, "prod": 1, "logsumexp": 2, "max": 3, "min": 4}
IDENTITY_VALUE = {"sum": 0.0, "prod": 1.0, "logsumexp": float("-inf"), "max": float("-inf"), "min": float("inf")}


def _base():
    from ..emit import DirectionEmitter

    return DirectionEmitter


class ScanEmitter(_base()):
    def __init__(self, spec, program: Program, direction: str, variant, plan: ScanPlan):
        super().__init__(spec, program, direction, variant)
        self.plan = plan
        self.scans = [n for n in self.nodes if n.op == "scan"]
        self.state = {n.id: f"s_{i}" for i, n in enumerate(self.scans)}
        # a backward's log-sum-exp scan carried in float64 for float32 data: logcumsumexp's backward
        # (a reversed logcumsumexp of log|g| - out) runs at |out| (1e4 at outliers) and, carried in
        # float32, lost 8% over 4095 steps on the H200 (session 23); torch's CPU carries double.
        # The forward (verified in float32) keeps float: double's exp and log1p cost about 4x.
        # Only the carry is double: each scan value is rounded to the working type where it is
        # used, as torch's float32 logcumsumexp tensor is. Kept double, log-sum-exp + x cancelled
        # to a precise value of the wrong sign where `out` (read in float32) is 1e9 or more and
        # its rounding alone is worth e^30 (the H200's "huge" cases, session 25): the float64
        # truth gave 0, torch's float32 about 0, the kernel 129.
        self.scan_t = "scan_t" if direction == "backward" and any(
            n.attrs["kind"] == "logsumexp" for n in self.scans) else "acc_t"

    def to_working(self) -> str:
        """The cast of a scan's value from its running type to acc_t (none when they are one)."""
        return "(acc_t)" if self.scan_t != "acc_t" else ""

    def ident(self, n: Node) -> str:
        """The scan's identity in its running type."""
        return f"({self.scan_t}){IDENTITY[n.attrs['kind']]}"

    def op_expr(self, node: Node, x: list[str]) -> str:
        if node.op == "scan":
            excl = "true" if node.attrs.get("exclusive") else "false"
            return (f"{self.to_working()}sg_scan_step<{KIND_ID[node.attrs['kind']]}, {excl}>({self.state[node.id]}, "
                    f"({self.scan_t})({x[0]}))")
        return super().op_expr(node, x)

    def _prologue(self, ctx: Ctx) -> list[str]:
        """A kernel's first statements: acc_t, W, the global-level values (named in ctx), the pointers."""
        lines = ["using acc_t = typename sg::Acc<T>::type;"]
        if self.scan_t == "scan_t":
            lines.append("using scan_t = typename std::conditional<std::is_same<T, float>::value, double, acc_t>::type;")
        lines += [
                 f"const int64_t W = {self.expr(self.p.width, Ctx())}; (void)W;"]
        for n in self.nodes:
            if n.level == "global" and n.op not in ("dim", "stride"):
                name = self.var(n)
                lines.append(f"const {self.ctype_var(n)} {name} = {self.expr(n, ctx)};")
                ctx.names[n.id] = name
        for key in self.elem_loads:
            fld = key[0]
            lines.append(f"const {self.ctype_of(fld)}* __restrict__ {self.pointer_name(key)} = "
                         f"(const {self.ctype_of(fld)}*)A.{fld}.data;")
        for i, s in self.elem_stores():
            t = self.ctype_of(s.field)
            lines.append(f"{t}* __restrict__ o_{i} = ({t}*)A.{s.field}.data;")
        return lines

    def elem_stores(self) -> list:
        """(index, store) of the per-element outputs (the column sums' [W] outputs are the finalize's)."""
        return [(i, s) for i, s in enumerate(self.p.stores) if s.kind == "elem"]

    def element_roots(self) -> list[Node]:
        """The values a kernel's last pass computes at each element: the outputs, the column sums' terms."""
        return [s.value for _, s in self.elem_stores()] + [c.args[0] for c in self.colreduces]

    def column_sums_open(self) -> list[str]:
        """Each column sum's running total over this thread's elements, in double: a lane of 65535
        elements summed in float would lose about 1e-5 relative."""
        return [f"double cacc_{k} = 0;" for k in range(len(self.colreduces))]

    def column_sums_out(self, slot: str, cslots: str) -> list[str]:
        """This thread's partial of each column sum into its slot (lane % W is its column)."""
        return [f"partials[({k} * ({cslots}) + {slot}) * W + lane % W] = (float)cacc_{k};"
                for k in range(len(self.colreduces))]

    def partials_param(self) -> str:
        return ", float* __restrict__ partials" if self.colreduces else ""

    def lane_keeps_its_column(self) -> bool:
        """A lane (outer o, inner i) stays in one column along the axis when the columns are the
        last axis and the scan runs along another (inner is a multiple of W): its column i % W,
        computed once, saves an int64 modulo per element (a call to a division routine)."""
        return self.p.fold == 1 and self.plan.axis < self.plan.rank - 1

    def lane_column_line(self) -> list[str]:
        return ["const int64_t col = i % W;  // the lane's column along the whole axis"] \
            if self.lane_keeps_its_column() else []

    def _positions(self, inner: Ctx, column: str = "e % W") -> None:
        """Element e's index along each axis, where the program reads one (a cumulative mean divides
        by the position along the scan axis): the column e % W, row dim k's (e / W / span) % size."""
        dims = self.p.row_dims
        for n in self.nodes:
            if n.op == "iota":
                inner.names[n.id] = f"({column})"
            elif n.op == "rowiota":
                span = " * ".join(dim_expr(d) for d in dims[n.attrs["axis"] + 1:]) or "1"
                inner.names[n.id] = f"((e / W / ({span})) % {dim_expr(dims[n.attrs['axis']])})"

    def _element_ctx(self, ctx: Ctx) -> Ctx:
        """Names for element `e` of a lane: its loads ([W] parameters at its column)."""
        column = "col" if self.lane_keeps_its_column() else "e % W"
        inner = Ctx(dict(ctx.names))
        self._positions(inner, column)
        for key, ns in self.elem_loads.items():
            index = column if key[1] == "col" else "e"
            for n in ns:
                inner.loads[n.id] = f"(acc_t)sg::to_acc({self.pointer_name(key)}[{index}])" \
                    if n.dtype == "float" else f"({self.ctype_var(n)})({self.pointer_name(key)}[{index}])"
        return inner

    def _element(self, ctx: Ctx, roots: list[Node], write: bool) -> list[str]:
        """Statements for element `e`: the closure of `roots` (scans update their state),
        and the stores when `write`."""
        inner = self._element_ctx(ctx)
        lines = self.elem_statements(roots, inner)
        if write:
            for i, s in self.elem_stores():
                t = self.ctype_of(s.field)
                lines.append(f"o_{i}[e] = sg::from_acc<{t}>((acc_t)({self.expr(s.value, inner)}));")
            lines += [f"cacc_{k} += (double)({self.expr(c.args[0], inner)});" for k, c in enumerate(self.colreduces)]
        return lines

    def emit_row_kernel(self) -> str:
        plan = self.plan
        roots = self.element_roots()
        walk = "L - 1 - t" if plan.reverse else "t"
        w = CWriter()
        w.line(HELPERS)
        w.line()
        self.write_lanes_head(w, [f"scans along axis {plan.axis} of {plan.rank}: a thread per (outer, inner) lane walks the",
                                  "axis in order (coalesced along inner), each scan a running value in a register"],
                              "lanes", str(plan.block))
        with w.block():
            ctx = Ctx()
            w.lines(self._prologue(ctx))
            w.line("const int64_t lanes = outer * inner;")
            with w.block("for (int64_t lane = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; lane < lanes; "
                         "lane += (int64_t)gridDim.x * blockDim.x)"):
                w.line("const int64_t o = lane / inner, i = lane % inner;")
                w.lines(self.lane_column_line())
                w.lines(f"{self.scan_t} {self.state[n.id]} = {self.ident(n)};" for n in self.scans)
                w.lines(self.column_sums_open())
                with w.block("for (int64_t t = 0; t < L; ++t)"):
                    w.line(f"const int64_t e = (o * L + ({walk})) * inner + i;")
                    w.lines(self._element(ctx, roots, True))
                w.lines(self.column_sums_out("lane / W", "lanes / W"))
        if not plan.chained:
            w.line()
            self.write_segments(w, roots)
            if not self.colreduces:  # a block per row has no lane of one column: column sums never take it
                w.line()
                self.write_tiles(w)
        return w.text()

    def write_lanes_head(self, w: CWriter, comment: list[str], kernel: str, bounds: str) -> None:
        """A lanes-shaped kernel's comment and signature: (A, outer, L, inner)."""
        w.lines(f"// {line}" for line in comment)
        w.line("template <typename T>")
        w.line(f"__global__ void __launch_bounds__({bounds})")
        w.line(f"{self.kname}_scan_{kernel}(const {self.args_t} A, int64_t outer, int64_t L, int64_t inner"
               f"{self.partials_param()})")

    def write_segments(self, w: CWriter, roots: list[Node]) -> None:
        """The lanes kernel for too few lanes to fill the GPU (a cumsum down the columns of
        [32768, 32768]: 32768 threads, each a 32768-step chain, 8% of the bandwidth on the H200,
        session 21): each lane's axis in SEGMENTS segments, a thread each (a block: 32 lanes x
        SEGMENTS). A first pass sums each segment's inputs, the segments before each one are
        combined in order from shared memory, a second pass scans the segment from that carry.
        Two reads and one write; deterministic (a fixed order)."""
        plan = self.plan
        walk = "L - 1 - t" if plan.reverse else "t"
        self.write_lanes_head(w, [f"scans along axis {plan.axis} of {plan.rank} with few lanes: each lane's axis in "
                                  f"{SEGMENTS} segments, a",
                                  "thread each; the segments' totals, the carry of the segments before, then the scan"],
                              "segments", f"32 * {SEGMENTS}")
        with w.block():
            ctx = Ctx()
            w.lines(self._prologue(ctx))
            w.line(f"__shared__ {self.scan_t} seg_total[{len(self.scans)}][{SEGMENTS}][32];")
            w.line("const int64_t lanes = outer * inner, lane = (int64_t)blockIdx.x * 32 + threadIdx.x;")
            w.line("const bool live = lane < lanes;")
            w.line("const int64_t o = live ? lane / inner : 0, i = live ? lane % inner : 0;")
            w.lines(self.lane_column_line())
            w.line(f"const int64_t len = (L + {SEGMENTS} - 1) / {SEGMENTS}, t0 = (int64_t)threadIdx.y * len;")
            w.line("const int64_t t1 = t0 + len < L ? t0 + len : L;  // this segment, in scan order")
            w.lines(f"{self.scan_t} total_{k} = {self.ident(n)};" for k, n in enumerate(self.scans))
            w.directive("#pragma unroll 8")
            with w.block("for (int64_t t = t0; live && t < t1; ++t)", comment="pass 1: the segment's total"):
                w.line(f"const int64_t e = (o * L + ({walk})) * inner + i;")
                inner = self._element_ctx(ctx)
                w.lines(self.elem_statements([n.args[0] for n in self.scans], inner))
                w.lines(f"total_{k} = sg_scan_op<{KIND_ID[n.attrs['kind']]}>(total_{k}, "
                        f"({self.scan_t})({self.expr(n.args[0], inner)}));" for k, n in enumerate(self.scans))
            w.lines(f"seg_total[{k}][threadIdx.y][threadIdx.x] = total_{k};" for k in range(len(self.scans)))
            w.line("__syncthreads();")
            for k, n in enumerate(self.scans):
                w.line(f"{self.scan_t} {self.state[n.id]} = {self.ident(n)};  // the segments before, in order")
                w.line(f"for (int y = 0; y < (int)threadIdx.y; ++y) {self.state[n.id]} = "
                       f"sg_scan_op<{KIND_ID[n.attrs['kind']]}>({self.state[n.id]}, seg_total[{k}][y][threadIdx.x]);")
            w.lines(self.column_sums_open())
            w.directive("#pragma unroll 8")
            with w.block("for (int64_t t = t0; live && t < t1; ++t)", comment="pass 2: the scan from the carry"):
                w.line(f"const int64_t e = (o * L + ({walk})) * inner + i;")
                w.lines(self._element(ctx, roots, True))
            if self.colreduces:  # a slot per (lanes of a column's group, segment)
                with w.block("if (live)"):
                    w.lines(self.column_sums_out(f"(lane / W) * {SEGMENTS} + threadIdx.y", f"lanes / W * {SEGMENTS}"))

    def write_tiles(self, w: CWriter) -> None:
        """The rows kernel: a block per row, the row in tiles of BLOCK * VEC elements; each thread
        one VEC-element chunk (one 16-byte access, coalesced over the warp), scanned in registers,
        the threads' totals scanned over the block (warp shuffles, then the warp totals), the
        tile's values combined with the carry of the tiles before it: one read, one write."""
        plan = self.plan
        ctx = Ctx()
        w.line("// scans along the last axis: a block per row, tiles of BLOCK * VEC elements, a VEC-element")
        w.line("// chunk per thread scanned in registers, the chunks' totals scanned over the block")
        w.line("template <typename T, int VEC>")
        w.line(f"__global__ void __launch_bounds__({plan.block})")
        w.line(f"{self.kname}_scan_rows(const {self.args_t} A, int64_t rows, int64_t L)")
        with w.block():
            w.lines(self._prologue(ctx))
            w.line(f"constexpr int NW = {plan.block} / 32;")
            w.line(f"__shared__ {self.scan_t} wsum[{len(self.scans)}][NW];")
            w.line("const int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5);")
            with w.block("for (int64_t row = blockIdx.x; row < rows; row += gridDim.x)"):
                w.lines(f"{self.scan_t} carry_{k} = {self.ident(n)};" for k, n in enumerate(self.scans))
                with w.block(f"for (int64_t base = 0; base < L; base += (int64_t){plan.block} * VEC)"):
                    self.write_tile_inputs(w, ctx)
                    self.write_chunk_scans(w)
                    self.write_warp_totals(w)
                    self.write_tile_outputs(w, ctx)
                    w.line("__syncthreads();  // wsum is reused by the next tile")

    def _tile_ctx(self, ctx: Ctx) -> Ctx:
        """Names for one element of a tile: the chunk's raw registers, [W] parameters by e % W."""
        inner = Ctx(dict(ctx.names))
        self._positions(inner)
        for key, nodes in self.elem_loads.items():
            pn = self.pointer_name(key)
            for node in nodes:
                if key[1] == "col":
                    inner.loads[node.id] = f"(acc_t)sg::to_acc({pn}[e % W])" if node.dtype == "float" \
                        else f"({self.ctype_var(node)})({pn}[e % W])"
                else:
                    inner.loads[node.id] = self.load_ref(node, f"r_{pn}")
        return inner

    def write_tile_element_loop(self, w: CWriter, comment: str, body: list[str]) -> None:
        """A loop over the chunk's VEC elements in scan order (pv: the element in memory order)."""
        w.line("#pragma unroll")
        with w.block("for (int v = 0; v < VEC; ++v)", comment=comment):
            w.line(f"const int pv = {'VEC - 1 - v' if self.plan.reverse else 'v'}; (void)pv;")
            w.line("const int64_t e = c0 + pv; (void)e;")
            w.lines(b.replace(".v[v]", ".v[pv]") for b in body)  # the raw registers in memory order

    def write_tile_inputs(self, w: CWriter, ctx: Ctx) -> None:
        """This thread's chunk of the tile read, and the scans' inputs at its elements (loc_k)."""
        w.line("const int64_t q0 = base + (int64_t)threadIdx.x * VEC;  // scan order")
        w.line("const bool live = q0 < L;  // L % VEC == 0: a chunk is whole or absent")
        w.line(f"const int64_t c0 = row * L + ({'L - q0 - VEC' if self.plan.reverse else 'q0'});  // memory")
        for key in (k for k in self.elem_loads if k[1] != "col"):
            pn = self.pointer_name(key)
            w.line(f"{self.raw_type(key)} r_{pn};")
            w.line(f"if (live) sg::load_raw<VEC>({pn} + c0, r_{pn});")
        w.lines(f"{self.scan_t} loc_{k}[VEC];" for k in range(len(self.scans)))
        inner = self._tile_ctx(ctx)
        body = self.elem_statements([n.args[0] for n in self.scans], inner)
        for k, n in enumerate(self.scans):
            body.append(f"loc_{k}[v] = live ? ({self.scan_t})({self.expr(n.args[0], inner)}) : {self.ident(n)};")
        self.write_tile_element_loop(w, "the scans' inputs", body)

    def write_chunk_scans(self, w: CWriter) -> None:
        """Each scan over the chunk in registers, then the chunks' totals over each warp (x_k)."""
        for k, n in enumerate(self.scans):
            ident, op = self.ident(n), f"sg_scan_op<{KIND_ID[n.attrs['kind']]}>"
            kept = f"pre_{k}" if n.attrs.get("exclusive") else "t_"
            w.line(f"// scan {k}: the chunk in registers, then the block over the chunks' totals")
            w.line(f"{self.scan_t} pre_{k} = {ident};  // this chunk's exclusive prefix in the chunk")
            w.line("#pragma unroll")
            w.line(f"for (int v = 0; v < VEC; ++v) {{ const {self.scan_t} t_ = {op}(pre_{k}, loc_{k}[v]); "
                   f"loc_{k}[v] = {kept}; pre_{k} = t_; }}")
            w.line(f"{self.scan_t} x_{k} = pre_{k};  // the chunk's total, scanned over the warp")
            w.line("#pragma unroll")
            w.line(f"for (int o = 1; o < 32; o <<= 1) {{ const {self.scan_t} y_ = __shfl_up_sync(0xffffffffu, x_{k}, o); "
                   f"if (lane >= o) x_{k} = {op}(y_, x_{k}); }}")
            w.line(f"if (lane == 31) wsum[{k}][warp] = x_{k};")

    def write_warp_totals(self, w: CWriter) -> None:
        """The warp totals scanned by the first warp, in place in wsum."""
        w.line("__syncthreads();")
        with w.block("if (warp == 0)", comment="the warp totals, scanned by the first warp"):
            for k, n in enumerate(self.scans):
                ident, op = self.ident(n), f"sg_scan_op<{KIND_ID[n.attrs['kind']]}>"
                # every scan declares w_: all but the last in braces of their own
                open_, close = ("{ ", " }") if k + 1 < len(self.scans) else ("", "")
                w.line(f"{open_}{self.scan_t} w_ = lane < NW ? wsum[{k}][lane] : {ident};")
                w.line("#pragma unroll")
                w.line(f"for (int o = 1; o < 32; o <<= 1) {{ const {self.scan_t} y_ = __shfl_up_sync(0xffffffffu, w_, o); "
                       f"if (lane >= o) w_ = {op}(y_, w_); }}")
                w.line(f"if (lane < NW) wsum[{k}][lane] = w_;{close}")
        w.line("__syncthreads();")

    def write_tile_outputs(self, w: CWriter, ctx: Ctx) -> None:
        """Each chunk's prefix from the carry, the warps before it and the lanes before it; the
        scans' values at its elements, the outputs, stored as one chunk."""
        for k, n in enumerate(self.scans):
            ident, op = self.ident(n), f"sg_scan_op<{KIND_ID[n.attrs['kind']]}>"
            w.line(f"{self.scan_t} xe_{k} = __shfl_up_sync(0xffffffffu, x_{k}, 1);")
            w.line(f"if (lane == 0) xe_{k} = {ident};")
            w.line(f"const {self.scan_t} before_{k} = {op}(carry_{k}, {op}(warp > 0 ? wsum[{k}][warp - 1] : {ident}, "
                   f"xe_{k}));  // everything before this chunk")
            w.line(f"carry_{k} = {op}(carry_{k}, wsum[{k}][NW - 1]);")
        w.lines(f"acc_t st_{i}[VEC];" for i in range(len(self.p.stores)))
        inner = self._tile_ctx(ctx)
        for k, n in enumerate(self.scans):
            inner.names[n.id] = f"sv_{k}"
        body = [f"const acc_t sv_{k} = {self.to_working()}sg_scan_op<{KIND_ID[n.attrs['kind']]}>(before_{k}, loc_{k}[v]);"
                for k, n in enumerate(self.scans)]
        body += self.elem_statements([s.value for s in self.p.stores], inner)
        for i, st in enumerate(self.p.stores):
            body.append(f"st_{i}[pv] = (acc_t)({self.expr(st.value, inner)});")
        self.write_tile_element_loop(w, "the values and the outputs", body)
        w.lines(f"if (live) sg::store_vec<VEC>(o_{i} + c0, st_{i});" for i in range(len(self.p.stores)))

    def emit_finalize(self) -> str:
        """The column sums' finalize (the row family's: the slots' partials summed in order, in
        double, then the [W] outputs' epilogue), or nothing."""
        return super().emit_finalize() if self.colreduces else ""

    def emit_host(self, dtypes: list[str]) -> str:
        from .... import abi

        plan = self.plan
        shape = self.scans[0].attrs["shape"]
        ctx = Ctx()
        size = [self.expr(d, ctx) for d in shape]
        outer = " * ".join(f"(int64_t){s}" for s in size[:plan.axis]) or "(int64_t)1"
        inner = " * ".join(f"(int64_t){s}" for s in size[plan.axis + 1:]) or "(int64_t)1"
        w = CWriter()
        w.line("template <typename T>")
        w.line(f"static cudaError_t {self.kname}_launch(const {self.args_t}& A, cudaStream_t stream"
               f"{launch_need_param(bool(self.colreduces))})")
        with w.block():
            w.line(f"const int64_t outer = {outer}, L = (int64_t){size[plan.axis]}, inner = {inner};")
            if self.colreduces:
                self.write_column_sums_launch(w)
            else:
                w.line("if (outer == 0 || L == 0 || inner == 0) return cudaSuccess;")
                w.line(f"const int64_t cap = (int64_t)sg::sm_count() * (2048 / {plan.block});  // one wave")
                if not plan.chained:
                    self.write_rows_launch(w)
                    self.write_segments_launch(w)
                w.line(f"const int64_t need = (outer * inner + {plan.block} - 1) / {plan.block};")
                w.line("const int64_t gx = need < cap ? need : cap;")
                w.line(f"{self.kname}_scan_lanes<T><<<(unsigned)gx, {plan.block}, 0, stream>>>(A, outer, L, inner);")
            w.line("return cudaGetLastError();")
        w.line()
        dispatch = self.dispatch_field()
        w.lines(entry_function(abi.entry_point(self.spec, self.direction), self.args_t, self.kname, dispatch, dtypes))
        if self.colreduces:
            w.line()
            w.lines(workspace_entry(self.kname, abi.workspace_function(self.spec, self.direction), self.args_t,
                                    dispatch, dtypes))
        return w.text()

    def write_column_sums_launch(self, w: CWriter) -> None:
        """With column sums: the lanes or segments kernel writing a partial per slot into the
        workspace, then the finalize summing the slots of each column (no rows kernel: a column
        sum needs a lane per column). No rows or an empty scan axis still write the [W] outputs."""
        plan, ncol = self.plan, len(self.colreduces)
        w.line(f"const int64_t W = {self.expr(self.p.width, Ctx())};")
        w.line("if (inner == 0 || W == 0) return cudaSuccess;")
        w.line("const bool empty = outer == 0 || L == 0;  // the sums are 0: the finalize alone")
        if plan.chained:
            w.line("const bool segmented = false;  // scans that feed each other: the lanes kernel")
        else:
            w.line(f"const bool segmented = outer * inner * 2 <= (int64_t)sg::sm_count() * {RESIDENT_THREADS} "
                   f"&& L >= {SEGMENTS_MIN_LENGTH};  // too few lanes: each lane's axis in segments")
        w.line(f"const int64_t cslots = empty ? 0 : outer * inner / W * (segmented ? {SEGMENTS} : 1);")
        w.line("// per-slot partials of the column sums, summed in slot order by the finalize")
        w.line(f"const size_t partial_bytes = sizeof(float) * (size_t)cslots * {ncol} * (size_t)W;")
        w.lines(take_workspace("partial_bytes"))
        w.line("float* partials = (float*)A.workspace;")
        with w.block("if (!empty && segmented)"):
            w.line("const int64_t gx = (outer * inner + 31) / 32;")
            w.line(f"{self.kname}_scan_segments<T><<<(unsigned)gx, dim3(32, {SEGMENTS}), 0, stream>>>"
                   f"(A, outer, L, inner, partials);")
        with w.chain("else if (!empty)"):
            w.line(f"const int64_t cap = (int64_t)sg::sm_count() * (2048 / {plan.block});  // one wave")
            w.line(f"const int64_t blocks = (outer * inner + {plan.block} - 1) / {plan.block};")
            w.line("const int64_t gx = blocks < cap ? blocks : cap;")
            w.line(f"{self.kname}_scan_lanes<T><<<(unsigned)gx, {plan.block}, 0, stream>>>(A, outer, L, inner, partials);")
        w.line("{ const cudaError_t e_ = cudaGetLastError(); if (e_ != cudaSuccess) return e_; }")
        w.line("const int64_t groups = 1;  // one group of all rows")
        w.line(f"const {self.args_t} args = A;")
        w.line(self.finalize_cols_launch())

    def write_segments_launch(self, w: CWriter) -> None:
        """The segments kernel's launch, taken when the lanes alone would not fill the GPU."""
        with w.block(f"if (outer * inner * 2 <= (int64_t)sg::sm_count() * {RESIDENT_THREADS} && L >= {SEGMENTS_MIN_LENGTH})",
                     comment="too few lanes: each lane's axis in segments"):
            w.line("const int64_t gx = (outer * inner + 31) / 32;")
            w.line(f"{self.kname}_scan_segments<T><<<(unsigned)gx, dim3(32, {SEGMENTS}), 0, stream>>>(A, outer, L, inner);")
            w.line("return cudaGetLastError();")

    def write_rows_launch(self, w: CWriter) -> None:
        """The rows kernel's launch, taken when the scanned axis is the last one."""
        block = self.plan.block
        conds = [f"sg::aligned16(A.{k[0]}.data)" for k in self.elem_loads if k[1] != "col"]
        conds += [f"sg::aligned16(A.{st.field}.data)" for st in self.p.stores]
        with w.block("if (inner == 1)", comment="the last axis: a block per row, tiles of 16-byte chunks"):
            w.line("constexpr int VEC = 16 / sizeof(T) > 0 ? 16 / sizeof(T) : 1;")
            w.line("const bool vec_ok = L % VEC == 0" + "".join(f" && {c}" for c in conds) + ";")
            w.line("const int64_t gx = outer < cap ? outer : cap;")
            w.line(f"if (vec_ok) {self.kname}_scan_rows<T, VEC><<<(unsigned)gx, {block}, 0, stream>>>(A, outer, L);")
            w.line(f"else {self.kname}_scan_rows<T, 1><<<(unsigned)gx, {block}, 0, stream>>>(A, outer, L);")
            w.line("return cudaGetLastError();")


__all__ = ["Prepended", "PrependedScan", "lower_prepended_view", "scan_directions", "Rev", "ValuesOnly", "lower_extreme", "ScanSuffix", "lower_suffix", "ScanPlan", "ScanEmitter", "plan_of", "lower_scan", "lower_rev", "interp_scan",
           "trace_decompositions"]
