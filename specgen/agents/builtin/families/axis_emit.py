"""CUDA for axis programs (axis_reduce.py): S viewed as [O, R, I], reduced over R.

Per direction, up to four kernels, all deterministic (fixed trees and orders, no atomics):
  <k>_reduce   blocks of TX x TY threads (TX * TY = 256): TX threads along the kept inner
               axis I (coalesced; TX = 1 when I == 1, the block then reads 16-byte vectors of
               the contiguous reduced axis), TY threads striding over a chunk of R; a warp's
               partials merged by shuffles, then a fixed shared-memory tree over the 8 warps.
               When the kept elements give few blocks (a reduction to a scalar, a middle axis
               with small O * I), R is split over G blocks (grid.y) that write per-chunk
               partials to a workspace;
  <k>_rows     (variant axisrows; I == 1, many short rows) a warp per kept element instead;
  <k>_combine  (G > 1) a thread per kept element merges its G partials in chunk order;
  <k>_elem     (elem stores: backward) a flat grid-stride pass over S reading the kept values
               (reduction results from the workspace, row inputs such as grad_out);
  <k>_fused    (variant axisfused; I == 1, G == 1, no totals) all of the above for one kept
               element in one block of 512 threads: each phase in turn, then the row's elem
               stores, the row's re-reads from L2.
The reduce or combine kernel finishes a kept element: its epilogue, its row stores, and its
reduction results into the workspace for the elem pass. G depends on the shape only.
Variant moments: a variance's squared deviations (and a backward's co-moment with a gradient)
swept with the mean's sum, merged by Chan's formula (moments_pairs, co_moments): one phase fewer.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from .... import abi
from ..ctext import Ctx, arange_value, dim_expr, entry_function, piece_index, launch_need_param, take_workspace, workspace_entry
from ..cwriter import CWriter
from ..emit import DirectionEmitter
from ..ir import Node, Store
from ..optimize import squared_deviations
from ..prelude import PRELUDE, PRELUDE_MOMENTS, with_optional_preludes
from ..schedule import DEFAULT_VARIANT, Variant
from .axis_parts import PartWriter, part_groups
from .axis_reduce import AxisProgram

BLOCK = 256
TARGET_BLOCKS = 2048  # R is split until the grid has about this many blocks (shape-only: reproducible)
MIN_STEPS = 4  # each thread takes at least this many steps of its chunk
FUSED_BLOCK = 512  # the fused kernel's threads per kept element (one block a row, 2 or more an SM)
FUSED_L2_BYTES = 24 << 20  # rows in flight in the fused kernel: their bytes kept under about half of L2

def launch_plan(O: int, R: int, I: int, itemsize: int, *, aligned: bool = True, vi_ok: bool = True,
                ends_rb: int | None = None, rows_max: int = 0) -> dict:
    """The reduce kernels' geometry the generated host code picks for [O, R, I] (a Python
    mirror of write_launch, for the tests and the tuner): TX threads along I with VI kept
    elements each, 16-byte reads along R (vec_r) when I == 1, R split into G chunks of `chunk`;
    `rows`: a warp per kept element (the variant's axis_rows = `rows_max`, one-phase programs)."""
    vec = max(1, 16 // itemsize)
    vi = vec if vi_ok and ends_rb is None and vec > 1 and I % vec == 0 and I >= 32 * vec and aligned else 1
    iv = I // vi
    tx = next(t for t in (32, 16, 8, 4, 2, 1) if iv >= t or t == 1)
    vec_r = tx == 1 and vec > 1 and R % vec == 0 and aligned and (ends_rb is None or ends_rb % vec == 0)
    tiles = -(-I // (tx * vi))
    blocks = O * tiles
    step = (BLOCK // tx) * (vec if vec_r else 1)
    g = 1
    if blocks < TARGET_BLOCKS:
        g = -(-TARGET_BLOCKS // blocks)
        g = max(1, min(g, -(-R // (step * MIN_STEPS)), 65535))
    chunk = max(1, -(-(-(-R // g)) // step) * step)
    g = max(1, -(-R // chunk))
    rows = ends_rb is None and I == 1 and O >= TARGET_BLOCKS and 0 < R <= rows_max
    return {"TX": tx, "VI": vi, "vec_r": vec_r, "tiles": tiles, "G": g, "chunk": chunk, "rows": rows}


def elem_mode(O: int, R: int, I: int, itemsize: int, *, ends_rb: int | None = None, aligned: bool = True,
              elem_vec: bool = False) -> int:
    """The elem pass's MODE the generated launcher picks (a Python mirror of write_elem_launch, for
    the tests): 1 VEC along I, 2 VEC along R (or RB), 3 VEC flat elements at their own positions
    (variant axiselemvec), 0 one element at a time."""
    vec = max(1, 16 // itemsize)
    if vec == 1 or (O * R * I) % vec or not aligned:
        return 0
    if ends_rb is not None:
        return 2 if ends_rb % vec == 0 else 3 if elem_vec else 0
    return 1 if I % vec == 0 else 2 if I == 1 and R % vec == 0 else 3 if elem_vec else 0


HELPERS = r"""namespace sgx {
// Arg-reductions as torch breaks ties: the first index of the extreme; NaN is the extreme
// (the first NaN wins). Order-free: the index decides ties, so any merge order agrees.
template <bool MAX, typename A>
__device__ __forceinline__ bool arg_better(A v, int64_t i, A bv, int64_t bi) {
  const bool vn = v != v, bn = bv != bv;
  if (vn || bn) return vn && (!bn || i < bi);
  if (MAX ? v > bv : v < bv) return true;
  return v == bv && i < bi;
}

// A thread's own elements come in increasing index order: a later one wins only when strictly
// better or when it is the first NaN. No index compare per element (the thread's index starts at
// its first element's, its value at the init: an all -inf run keeps its first index).
template <bool MAX, typename A>
__device__ __forceinline__ bool arg_step(A v, A bv) {
  return (MAX ? v > bv : v < bv) || (v != v && bv == bv);
}

// n / d for 0 <= n < 2^31 with a multiply-high and a shift (PyTorch's IntDivider): the flat
// pass's index math without 64-bit divisions (tens of instructions each) per 16-byte vector.
struct FastDiv {
  uint32_t d, m, s;
  __host__ __device__ FastDiv() : d(1), m(1), s(0) {}
  __host__ explicit FastDiv(int64_t dd) {
    d = dd > 0 ? (uint32_t)dd : 1u;
    s = 0;
    while (s < 32 && (1ull << s) < d) ++s;
    m = (uint32_t)(((1ull << 32) * ((1ull << s) - d)) / d + 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const { return (__umulhi(n, m) + n) >> s; }
};
}  // namespace sgx"""


# Only in kernels with a co-moment (families/axis_emit.py co_moments): the others' text stays as it was.
COMOMENTS = r"""namespace sgx {
// Merge two parts' (count, sum of x, squared deviations of x, sum of g, co-moment of g and x):
// Chan et al.'s pairwise combination, as sg::moments_merge, with the co-moment's cross term.
template <typename A>
__device__ __forceinline__ void comoments_merge(A& n, A& s, A& m2, A& t, A& c, A n2, A s2, A m22, A t2, A c2) {
  if (n2 == (A)0) return;
  if (n == (A)0) { n = n2; s = s2; m2 = m22; t = t2; c = c2; return; }
  const A total = n + n2, f = n * n2 / total;
  const A dx = s2 / n2 - s / n, dg = t2 / n2 - t / n;
  m2 = m2 + m22 + dx * dx * f;
  c = c + c2 + dx * dg * f;
  s = s + s2;
  t = t + t2;
  n = total;
}
}  // namespace sgx"""


def _reads_a_reduction(n: Node) -> bool:
    """Does `n`'s value need a reduction's result (so it cannot be swept in the first phase)?"""
    seen, stack = set(), [n]
    while stack:
        m = stack.pop()
        if m.id in seen:
            continue
        seen.add(m.id)
        if m.op in ("rowreduce", "globalreduce"):
            return True
        stack.extend(m.args)
    return False


def _dims_of_count(n: Node) -> list[str] | None:
    """The dims whose product `n` is (through casts and products), sorted; None for anything else."""
    if n.op == "cast":
        return _dims_of_count(n.args[0])
    if n.op == "dim":
        return [str(n.attrs["dim"])]
    if n.op == "mul":
        a, b = _dims_of_count(n.args[0]), _dims_of_count(n.args[1])
        return None if a is None or b is None else sorted(a + b)
    return None


def _scope(ctx: Ctx) -> Ctx:
    """A copy of `ctx` for a C scope of its own: the names it declares stay in it."""
    return Ctx(dict(ctx.names), dict(ctx.loads))


class AxisEmitter(DirectionEmitter):
    def __init__(self, spec, program: AxisProgram, direction: str, variant: Variant = DEFAULT_VARIANT):
        super().__init__(spec, program, direction)
        self.merge_form = variant.axis_merge  # "warp" (shuffles, then the warps' tree) or "tree" (over TY)
        self.rows_max = variant.axis_rows  # R up to which a warp takes a kept element (I == 1); 0: never
        self.fused = variant.axis_fused  # a block per kept element through every phase (I == 1, G == 1)
        self.elem_vec = variant.axis_elem_vec  # the elem pass's MODE 3 (VEC flat elements, own positions)
        self.batch = variant.axis_batch  # the reduce kernel's sweep: several steps' reads before their updates
        self.lay = program.layout
        self.reduces = [n for n in self.nodes if n.op == "rowreduce"]
        self.aliases = self.arg_pairs(program)  # torch.max's values: its argmax's running value
        self.reduces = [n for n in self.reduces if n.id not in self.aliases]
        # variant moments: {sum of squared deviations id: (the sum, the mean)} taken in one sweep
        self.pairs = self.moments_pairs() if variant.moments else {}
        # {s2 id: (s3, sg)}: s3 = sum(g * (x - mean)), a co-moment merged with the pair (sg = sum(g))
        self.co = self.co_moments()
        self.co_ids = {s3.id for s3, _ in self.co.values()}
        # sums swept a step at a time by their pair (their operands kept per step in <name>_x)
        self.pair_sums = {s1.id for s1, _ in self.pairs.values()} | {sg.id for _, sg in self.co.values()}
        self.elem_stores = [s for s in program.stores if s.kind == "elem"]
        self.row_stores = [s for s in program.stores if s.kind in ("row", "piece")]
        self.global_stores = [s for s in program.stores if s.kind == "global" and s.value.level != "post"]
        self.total_stores = [s for s in program.stores if s.kind == "global" and s.value.level == "post"]
        self.totals = [n for n in self.nodes if n.op == "globalreduce"]  # sums over every kept element
        # sums over some atoms, one per element of the others (an affine norm's weight gradient):
        # grouped by (kept atoms, element or kept space), a kernel each after the reductions
        self.part_groups = part_groups([n for n in self.nodes if n.op == "partreduce"],
                                       [s for s in program.stores if s.kind == "part"])
        # workspace slots (8 bytes each per kept element): partials (value, and index for
        # arg kinds) per reduction, then each reduction's result when the elem pass reads it
        self.pslots = {}
        for n in self.reduces:
            self.pslots[n.id] = sum(len(self.running_values(m)) for m in self.reduces[:self.reduces.index(n)])
        self.npartial = sum(len(self.running_values(n)) for n in self.reduces)
        self.phases = self.phase_list()
        self.kept = self.kept_reduces()
        self.parts = PartWriter(self)

    def arg_pairs(self, program: AxisProgram) -> dict[int, Node]:
        """{values node id: its arg-reduction} for torch.max/min over a dim, whose values are the
        operand at the index the arg-reduction finds (its running value, NaN first as torch):
        one reduction instead of two, in one-phase programs with no elem pass (the forward)."""
        if any(s.kind == "elem" for s in program.stores):
            return {}
        pairs = {}
        for n in self.reduces:
            if n.attrs.get("arg_pair"):
                arg = next((m for m in self.reduces if m.attrs["kind"] == "arg" + n.attrs["kind"]
                            and m.args[0].id == n.args[0].id), None)
                if arg is not None:
                    pairs[n.id] = arg
        if any(a.args[0].op == "rowreduce" for a in pairs.values()):
            return {}  # an operand from another phase: keep both reductions
        return pairs

    def moments_pairs(self) -> dict[int, tuple[Node, Node]]:
        """{s2 id: (s1, mean)} for s2 = sum((x - s1 / count)^2), s1 = sum(x) and count the number
        of reduced elements (InstanceNorm's and GroupNorm's variance): s2 is then the sum of
        squared deviations from the exact mean, which the moments of each thread's chunks merged
        by Chan's formula give in the sum's own sweep (one read of x fewer)."""
        reduced = sorted(str(d) for d in self.lay.red_dims)
        pairs = {}
        for s2 in self.reduces:
            found = squared_deviations(s2) if s2.dtype == "float" else None
            if found is None:
                continue
            s1, mean, count = found
            if s1.dtype == "float" and s1 in self.reduces and s1.id not in {a.id for a, _ in pairs.values()} \
                    and _dims_of_count(count) == reduced:
                pairs[s2.id] = (s1, mean)
        return pairs

    def co_moments(self) -> dict[int, tuple[Node, Node]]:
        """{s2 id: (s3, sg)} for a pair's s3 = sum(g * (x - mean)) (the pair's own deviation node)
        with sg = sum(g) another reduction and g free of reductions (InstanceNorm's backward):
        s3 is the co-moment sum((g - mean(g)) * (x - mean)), merged with the pair by Chan's
        formula, so the backward's second sweep over x and g goes too. (An infinite g gives NaN
        here where torch's sum gives +-inf: docs/ARCHITECTURE.md.)"""
        co, taken = {}, {s1.id for s1, _ in self.pairs.values()}  # a sum is swept by one pair at most
        for s2, (s1, mean) in self.pairs.items():
            dev = self.by_id[s2].args[0].args[0]
            if _reads_a_reduction(dev.args[0]):  # x after a reduction: s1 in a later phase than sum(g)
                continue
            for s3 in self.reduces:
                t = s3.args[0]
                if s3.attrs["kind"] != "sum" or t.op != "mul" or s3.id in self.pairs or s3.id in taken:
                    continue
                g = t.args[1] if t.args[0] is dev else t.args[0] if t.args[1] is dev else None
                if g is None or g is dev or _reads_a_reduction(g):
                    continue
                sg = next((m for m in self.reduces if m.attrs["kind"] == "sum" and m.args[0] is g
                           and m.dtype == "float" and m.id not in self.pairs and m.id not in taken), None)
                if sg is not None:
                    co[s2] = (s3, sg)
                    taken |= {s3.id, sg.id}
                    break
        return co

    # ------------------------------------------------------------ plan (read by tests and the host)
    def phase_list(self) -> list[list[Node]]:
        """Reductions grouped by depth: a reduction whose operand needs another's result (a
        variance from its mean, cosine similarity's normalized product) sweeps after it."""
        joins = {s2: s1.id for s2, (s1, _) in self.pairs.items()}
        joins |= {s3.id: self.pairs[s2][0].id for s2, (s3, _) in self.co.items()}
        depth: dict[int, int] = {}
        for n in self.nodes:  # topological order
            below = [depth[a.id] for a in n.args if a.id in depth]
            d = max(below, default=0)
            depth[n.id] = d + 1 if n.op == "rowreduce" else d
            if n.id in joins:  # squared deviations or a co-moment: in the pair's sum's sweep (moments)
                depth[n.id] = depth[joins[n.id]]
        phases: dict[int, list[Node]] = {}
        for n in self.reduces:
            phases.setdefault(depth[n.id], []).append(n)
        return [phases[k] for k in sorted(phases)]

    def kept_reduces(self) -> list[Node]:
        """Reductions whose results go through the workspace: those the elem pass reads, and
        every reduction of a phase before the last (later phases read them)."""
        early = {n.id for phase in self.phases[:-1] for n in phase}
        roots = [s.value for s in self.elem_stores] + [t.args[0] for g in self.part_groups for t in g.totals]
        want, stack = set(), list(roots)
        while stack:
            n = stack.pop()
            if n.id in want:
                continue
            want.add(n.id)
            if n.op != "rowreduce":
                stack.extend(n.args)
        return [n for n in self.reduces if n.id in want or n.id in early]

    def plan(self) -> dict:
        return {"reduce": bool(self.reduces), "elem": bool(self.elem_stores), "totals": len(self.totals),
                "kinds": [n.attrs["kind"] for n in self.reduces], "partial_slots": self.npartial,
                "phases": [[n.attrs["kind"] for n in phase] for phase in self.phases],
                "kept_slots": len(self.kept), "layout": self.lay.describe(),
                "values_from_arg": sorted(a.attrs["kind"] for a in self.aliases.values()),
                "fused": self.fused_allowed(), "moments": len(self.pairs), "co_moments": len(self.co),
                "elem_vec": self.elem_vec and bool(self.elem_stores),
                "batched_reads": [None if (ls := self.batch_loads(p)) is None else sorted(ns[0].attrs["field"] for ns in ls)
                                  for p in range(len(self.phases))],
                **({"part_totals": [(g.over, g.atoms, len(g.totals)) for g in self.part_groups]}
                   if self.part_groups else {})}

    def total_slot(self, t: int) -> int:
        """The workspace slot (after the kept slots) of a total's per-kept-element values."""
        return len(self.kept) + t

    # ------------------------------------------------------------ pieces
    def acc_type(self, n: Node) -> str:
        """The accumulator of a reduction's value (an arg-reduction's value is its operand's)."""
        return "acc_t" if n.dtype == "float" or self.is_arg(n) else "int64_t"

    def is_arg(self, n: Node) -> bool:
        return n.attrs["kind"].startswith("arg")

    def running_values(self, n: Node) -> list[tuple[str, str]]:
        """A reduction's running values as (name, C type): its value, then an arg-reduction's index."""
        v = self.var(n)
        if n.id in self.pairs:  # the squared deviations, then the count (the sum: its pair's value)
            return [(v, "acc_t"), (f"{v}_n", "acc_t")]
        return [(v, self.acc_type(n))] + ([(f"{v}_i", "int64_t")] if self.is_arg(n) else [])

    def partials(self, n: Node) -> list[tuple[str, str, str]]:
        """A reduction's running values as (name, C type, its split partials in the workspace)."""
        return [(name, t, self.ws_ptr(self.pslots[n.id] + k, t, True))
                for k, (name, t) in enumerate(self.running_values(n))]

    def finish_call(self, p: int, value: Callable[[str], str]) -> str:
        """Phase p's finish of kept element `row`, each running value read as `value(name)`."""
        values = "".join(f", {value(name)}" for n in self.phases[p] for name, _ in self.running_values(n))
        return f"{self.kname}_finish{p}<T>(A, ws, row, K, G, GP{values});"

    def init(self, n: Node) -> str:
        kind = n.attrs["kind"]
        if kind == "sum":
            return f"({self.acc_type(n)})0"
        if kind == "prod":
            return f"({self.acc_type(n)})1"
        return {"max": "(acc_t)(-INFINITY)", "min": "(acc_t)INFINITY", "argmax": "(acc_t)(-INFINITY)",
                "argmin": "(acc_t)INFINITY"}[kind]

    def update(self, n: Node, v: str, val: str, idx: str, vi: str | None = None) -> str:
        """`v` (and its index `vi`, default `v_i`) take the value `val` at index `idx`."""
        kind = n.attrs["kind"]
        vi = vi or f"{v}_i"
        if kind == "sum":
            return f"{v} += ({self.acc_type(n)})({val});"
        if kind == "prod":
            return f"{v} *= ({self.acc_type(n)})({val});"
        if kind == "max":
            return f"{v} = sg::max_({v}, (acc_t)({val}));"
        if kind == "min":
            return f"{v} = sg::min_({v}, (acc_t)({val}));"
        m = "true" if kind == "argmax" else "false"
        return (f"{{ const acc_t c_ = (acc_t)({val}); const int64_t ci_ = {idx}; "
                f"if (sgx::arg_better<{m}>(c_, ci_, {v}, {vi})) {{ {v} = c_; {vi} = ci_; }} }}")

    def merge(self, n: Node, v: str, other: str, other_i: str = "", vi: str | None = None) -> str:
        return self.update(n, v, other, other_i, vi)

    def merge_stmt(self, n: Node, mine: Callable[[str], str], other: Callable[[str], str]) -> str:
        """Reduction n's running values (each named `mine(name)`) merged with another part's
        (`other(name)`). A moments pair merges as one (count, sum, squared deviations): the sum's
        own statement is empty."""
        if n.id in self.pair_sums or n.id in self.co_ids:
            return ""
        v = self.var(n)
        if n.id in self.pairs:
            s = self.var(self.pairs[n.id][0])
            if n.id in self.co:
                c, t = (self.var(m) for m in self.co[n.id])
                names = [f"{v}_n", s, v, t, c]
                return (f"sgx::comoments_merge({', '.join(mine(x) for x in names)}, "
                        f"{', '.join(other(x) for x in names)});")
            return (f"sg::moments_merge({mine(v + '_n')}, {mine(s)}, {mine(v)}, "
                    f"{other(v + '_n')}, {other(s)}, {other(v)});")
        if self.is_arg(n):
            return self.merge(n, mine(v), other(v), other(f"{v}_i"), mine(f"{v}_i"))
        return self.merge(n, mine(v), other(v))

    def ws_ptr(self, slot: int, ctype: str, partial: bool) -> str:
        base = f"(size_t){slot} * (size_t)G * (size_t)K" if partial else \
            f"((size_t){self.npartial} * (size_t)GP + (size_t){slot}) * (size_t)K"
        return f"(({ctype}*)((char*)ws + 8 * ({base})))"

    def part_index(self, n: Node, index: str) -> str:
        """A parameter over some atoms of S: its element at flat element `index` of S, from that
        element's coordinate in each of its atoms (row-major in the parameter)."""
        atoms = list(self.lay.lead + self.lay.block + self.lay.inner)
        mine = n.attrs["atoms"]
        terms = []
        for a in mine:
            after_s = " * ".join(dim_expr(d) for d in atoms[a + 1:]) or "(int64_t)1"
            after_p = " * ".join(dim_expr(atoms[b]) for b in mine if b > a) or "(int64_t)1"
            terms.append(f"((int64_t)({index}) / ({after_s}) % {dim_expr(atoms[a])}) * ({after_p})")
        return " + ".join(terms) or "0"

    def elem_load_expr(self, n: Node, index: str, raw: str | None = None) -> str:
        """Load `n`'s value at element `index` (or from `raw`, a value already read), as its type."""
        if n.attrs.get("arange"):  # torch.arange over one atom: the element's coordinate along it
            return arange_value(n, self.part_index(n, index))
        t = self.ctype_of(n.attrs["field"])
        if n.attrs["kind"] == "part":
            index = self.part_index(n, index)
        raw = raw or f"((const {t}*)A.{n.attrs['field']}.data)[{index}]"
        return f"(acc_t)sg::to_acc({raw})" if n.dtype == "float" else f"({self.ctype_var(n)})({raw})"

    def vec_loads(self, roots: list[Node] | None = None) -> list[Node]:
        """Elem loads in the working dtype (those `roots` read, when given): read VEC at a time
        on the vector paths."""
        used = None if roots is None else {n.id for n in self.closure(roots, "elem")}
        return [ns[0] for ns in self.elem_loads.values()
                if ns[0].dtype == "float" and self.types[ns[0].attrs["field"]].dtype is None
                and ns[0].attrs["kind"] != "part"  # read at computed indices, one at a time
                and (used is None or any(n.id in used for n in ns))]

    def bind_loads(self, ctx: Ctx, index: str, roots: list[Node], vec_index: str = "v") -> None:
        """Each elem load's value for the current element (from the vector read of `roots`' loads)."""
        vecs = {n.id for n in self.vec_loads(roots)}
        for key, ns in self.elem_loads.items():
            first = ns[0]
            name = f"ld_{first.attrs['field']}"
            expr = f"{name}[{vec_index}]" if first.id in vecs else self.elem_load_expr(first, index)
            for n in ns:
                ctx.loads[n.id] = expr

    def row_nodes(self, roots: list[Node], earlier: set | None = None) -> list[Node]:
        """Row-level nodes `roots` need, through elem nodes too (a per-element expression's
        per-row factors), reductions being boundaries (those in `earlier`, results of earlier
        phases, are included: read once); in topological order."""
        want: set[int] = set()
        stack = list(roots)
        seen: set[int] = set()
        while stack:
            n = stack.pop()
            if n.id in seen:
                continue
            seen.add(n.id)
            if n.level == "row" and (n.op != "rowreduce" or n.id in (earlier or ())):
                want.add(n.id)
            if n.op in ("rowreduce", "globalreduce"):
                continue
            stack.extend(n.args)
        return [n for n in self.nodes if n.id in want]

    def row_statements(self, roots: list[Node], ctx: Ctx) -> list[str]:
        """Each row-level value once per kept element, named (not inlined per element)."""
        lines = []
        for n in self.row_nodes(roots):
            if n.id in ctx.names:
                continue
            name = self.var(n)
            lines.append(f"const {self.ctype_var(n)} {name} = {self.expr(n, ctx)};")
            ctx.names[n.id] = name
        return lines

    def scalar_store(self, s: Store, ctx: Ctx) -> str:
        """A global store: the output's single element."""
        return (f"*(({self.ctype_of(s.field)}*)A.{s.field}.data) = "
                f"{self.store_value(s.field, self.expr(s.value, ctx), s.value)};")

    def store_value(self, field: str, value: str, node: Node) -> str:
        t = self.ctype_of(field)
        if node.dtype == "float" and t not in ("int64_t", "int32_t", "int16_t", "int8_t", "uint8_t", "bool"):
            return f"sg::from_acc<{t}>((acc_t)({value}))"
        return f"({t})({value})"

    # ------------------------------------------------------------ kernels
    def sizes(self) -> list[str]:
        """The launcher's O, R, I (and RB) statements."""
        prod = lambda ds: " * ".join(dim_expr(d) for d in ds) or "(int64_t)1"
        lay = self.lay
        if lay.ends:  # [RA, O, RB] reduced over RA and RB
            return [f"const int64_t O = {prod(lay.block)};", f"const int64_t RB = {prod(lay.inner)};",
                    f"const int64_t R = {prod(lay.lead)} * RB;", "const int64_t I = 1;"]
        return [f"const int64_t O = {prod(lay.lead)};", f"const int64_t R = {prod(lay.block)};",
                f"const int64_t I = {prod(lay.inner)};"]

    def rb_line(self) -> list[str]:
        """RB (the reduced trailing extent) inside a kernel of an `ends` layout."""
        if not self.lay.ends:
            return []
        prod = " * ".join(dim_expr(d) for d in self.lay.inner) or "(int64_t)1"
        return [f"const int64_t RB = {prod};"]

    def kept_name(self, n: Node, row: str = "row") -> str:
        """A reduction's result read back from its kept slot."""
        q = self.kept.index(n)
        return f"{self.ws_ptr(q, 'int64_t' if self.is_arg(n) else self.acc_type(n), False)}[{row}]"

    def earlier(self, p: int, ctx: Ctx) -> None:
        """Results of the phases before `p`, read from the workspace."""
        for phase in self.phases[:p]:
            for n in phase:
                ctx.names[n.id] = self.kept_name(n)

    def write_finish(self, w: CWriter, p: int) -> None:
        """The epilogue of one kept element `row` from its reductions' values (phase p)."""
        params = "".join(f", {t.replace('acc_t', 'typename sg::Acc<T>::type')} {name}"
                         for n in self.phases[p] for name, t in self.running_values(n))
        w.line("template <typename T>")
        w.line(f"__device__ __forceinline__ void {self.kname}_finish{p}(const {self.args_t}& A, void* ws, int64_t row, "
               f"int64_t K, int64_t G, int64_t GP{params})")
        with w.block():
            w.line("using acc_t = typename sg::Acc<T>::type;")
            w.line("(void)ws; (void)K; (void)G; (void)GP;")
            ctx = Ctx()
            self.earlier(p, ctx)
            for n in self.phases[p]:
                ctx.names[n.id] = f"{self.var(n)}_i" if self.is_arg(n) else self.var(n)
            for alias, arg in self.aliases.items():
                if arg in self.phases[p]:
                    ctx.names[alias] = self.var(arg)  # the values: the arg-reduction's own running value
            if p == len(self.phases) - 1:  # the outputs wait for the last phase
                self.write_finish_outputs(w, ctx)
            for n in self.phases[p]:
                if n in self.kept:
                    w.line(f"{self.kept_name(n)} = {ctx.names[n.id]};")

    def write_finish_outputs(self, w: CWriter, ctx: Ctx) -> None:
        """A kept element's outputs: its totals' values into their slots, its row stores, and
        the global stores (written once, by row 0)."""
        roots = [s.value for s in self.row_stores + self.global_stores] + [t.args[0] for t in self.totals]
        w.lines(self.row_statements(roots, ctx))
        for t, n in enumerate(self.totals):
            w.line(f"{self.ws_ptr(self.total_slot(t), 'acc_t', False)}[row] = (acc_t)({self.expr(n.args[0], ctx)});")
        for s in self.row_stores:
            at = "row" if s.piece is None else piece_index(s.field, s.piece)
            w.line(f"(({self.ctype_of(s.field)}*)A.{s.field}.data)[{at}] = "
                   f"{self.store_value(s.field, self.expr(s.value, ctx), s.value)};")
        if self.global_stores:
            with w.block("if (row == 0)"):
                w.lines(self.scalar_store(s, ctx) for s in self.global_stores)

    def vi_allowed(self, p: int) -> bool:
        """VI > 1 (16-byte reads along I) where the tree's shared memory stays small: at most
        8 KB of values (16-bit storage: VI = 8 fp32 values a thread) and 16 KB of indices per
        reduction of the phase, 48 KB in all."""
        need = sum(16 if t == "int64_t" else 8 for n in self.phases[p] for _, t in self.running_values(n))
        return not self.lay.ends and need <= 48

    def write_row_arrays(self, w: CWriter, roots: list[Node], ctx: Ctx) -> None:
        """Row-level values once per kept element of the thread (VI of them), as arrays."""
        earlier = {n.id for phase in self.phases for n in phase if n.id in ctx.names}
        nodes = [n for n in self.row_nodes(roots, earlier) if n.id not in ctx.names or n.id in earlier]
        if not nodes:
            return
        w.lines(f"{self.ctype_var(n)} {self.var(n)}[VI];" for n in nodes)
        w.directive("#pragma unroll")
        with w.block("for (int u = 0; u < VI; ++u)"):
            w.line("const int64_t row = row0 + u; (void)row;")
            for n in nodes:
                w.line(f"{self.var(n)}[u] = {self.expr(n, ctx)};")
                ctx.names[n.id] = f"{self.var(n)}[u]"

    def write_reduce(self, w: CWriter, p: int) -> None:
        """One phase's sweep. A thread holds VI consecutive kept elements along I (VI > 1:
        16-byte reads along I) or, when I == 1, reads VEC consecutive elements of R."""
        reduces = self.phases[p]
        w.line(f"// Reduce (phase {p}): TX threads along I (VI elements each), {BLOCK} / TX along a chunk of R")
        w.line("// (VEC > 1: I == 1, 16-byte reads along R).")
        w.line("template <typename T, int VEC, int TX, int VI>")
        w.line(f"__global__ void __launch_bounds__({BLOCK}) {self.kname}_reduce{p}(const {self.args_t} A, void* ws, "
               "int64_t O, int64_t R, int64_t I, int64_t G, int64_t chunk)")
        with w.block():
            self.write_reduce_prologue(w, reduces)
            with w.block("for (int64_t b = blockIdx.x; b < O * tiles; b += gridDim.x)"):
                w.line("const int64_t o = b / tiles, i = (b % tiles) * TW + (int64_t)tx * VI;")
                w.line("const bool live = i < I;  // VI > 1: I % VI == 0, all VI live")
                w.line("const int64_t row0 = o * I + i; (void)row0;")
                for n in reduces:
                    self.write_running_decls(w, n)
                    w.directive("#pragma unroll")
                    w.line(f"for (int u = 0; u < VI; ++u) {{ {self.running_init(n, 'u')} }}")
                with w.block("if (live)"):
                    self.write_sweep(w, p, "(int64_t)ty", "TY", batch=self.batch)
                self.write_block_merge(w, reduces)
                self.write_reduce_results(w, p)
                w.line("__syncthreads();  // the tree's smem is reused by the next kept tile")

    def write_reduce_prologue(self, w: CWriter, reduces: list[Node]) -> None:
        """The block's shape, this block's chunk of R, and the tree's shared memory."""
        w.line("using acc_t = typename sg::Acc<T>::type;")
        w.line(f"constexpr int TY = {BLOCK} / TX;")
        w.line("constexpr int TW = TX * VI;  // kept elements of a tile")
        w.line("const int tx = threadIdx.x, ty = threadIdx.y;")
        w.line("const int64_t K = O * I;")
        w.line("const int64_t GP = G > 1 ? G : 0; (void)GP;")
        w.lines(self.rb_line())
        w.line("const int64_t tiles = (I + TW - 1) / TW;")
        w.line("const int64_t g = blockIdx.y;")
        w.line("const int64_t r0 = g * chunk, r1 = r0 + chunk < R ? r0 + chunk : R;")
        w.line("constexpr int WT = " + ("32 / TX;  // rows of ty a warp holds (the block: 8 warps)"
                                       if self.merge_form == "warp" else "1;  // the tree runs over TY"))
        for n in reduces:
            w.lines(f"__shared__ {t} sm_{name}[TY / WT][TW];" for name, t in self.running_values(n))

    def write_running_decls(self, w: CWriter, n: Node) -> None:
        """A reduction's running values, one per kept element of the thread."""
        w.lines(f"{t} {name}[VI];" for name, t in self.running_values(n))

    def running_init(self, n: Node, u: str) -> str:
        """Kept element `u`'s running values set to the reduction's identity (no index yet)."""
        v = self.var(n)
        rest = f" {v}_i[{u}] = INT64_MAX;" if self.is_arg(n) else f" {v}_n[{u}] = 0;" if n.id in self.pairs else ""
        return f"{v}[{u}] = {self.init(n)};" + rest

    def write_smem_tree(self, w: CWriter, reduces: list[Node]) -> None:
        """The partials in shared memory merged by a fixed tree over its rows, into row 0."""
        w.line("__syncthreads();")
        with w.block("for (int s = TY / WT / 2; s > 0; s >>= 1)", comment="a fixed tree over smem's rows"):
            with w.block("if (ty < s)"):
                w.directive("#pragma unroll")
                with w.block("for (int u = 0; u < VI; ++u)"):
                    w.line("const int c = tx * VI + u;")
                    if self.pairs:  # a pair's merge writes its sum's value too: every read first
                        self.write_tree_merges_together(w, reduces)
                    else:
                        self.write_tree_merges(w, reduces)
            w.line("__syncthreads();")

    def write_tree_merges(self, w: CWriter, reduces: list[Node]) -> None:
        """One step of the smem tree: each reduction's value (and index) read, merged, written."""
        for n in reduces:
            v = self.var(n)
            w.line(f"{self.acc_type(n)} {v}_m = sm_{v}[ty][c];")
            if self.is_arg(n):
                w.line(f"int64_t {v}_m_i = sm_{v}_i[ty][c];")
            w.line(self.merge(n, f"{v}_m", f"sm_{v}[ty + s][c]", f"sm_{v}_i[ty + s][c]", f"{v}_m_i"))
            w.line(f"sm_{v}[ty][c] = {v}_m;")
            if self.is_arg(n):
                w.line(f"sm_{v}_i[ty][c] = {v}_m_i;")

    def write_tree_merges_together(self, w: CWriter, reduces: list[Node]) -> None:
        """One step of the smem tree for a phase with a moments pair: every running value read,
        then the merges, then the writes (a pair's merge updates its sum as well)."""
        values = [(name, t) for n in reduces for name, t in self.running_values(n)]
        w.lines(f"{t} {name}_m = sm_{name}[ty][c];" for name, t in values)
        for n in reduces:
            line = self.merge_stmt(n, lambda name: f"{name}_m", lambda name: f"sm_{name}[ty + s][c]")
            if line:
                w.line(line)
        w.lines(f"sm_{name}[ty][c] = {name}_m;" for name, _ in values)

    def write_reduce_results(self, w: CWriter, p: int) -> None:
        """The tree's results: finished here when R is not split (G == 1), else this chunk's
        partials into the workspace for the combine kernel."""
        with w.block("if (ty == 0 && live)"):
            w.directive("#pragma unroll")
            with w.block("for (int u = 0; u < VI; ++u)"):
                w.line("const int c = tx * VI + u;")
                w.line("const int64_t row = row0 + u;")
                w.line("if (G == 1) " + self.finish_call(p, lambda name: f"sm_{name}[0][c]"))
                with w.block("else"):
                    for n in self.phases[p]:
                        w.lines(f"{ptr}[g * K + row] = sm_{name}[0][c];" for name, _, ptr in self.partials(n))

    def write_sweep(self, w: CWriter, p: int, first: str, step: str, batch: bool = False) -> None:
        """A thread's sweep over its chunk of R (in `live`): the thread's first element at
        r0 + first * VEC, `step` threads apart; each reduction's running value per kept element.
        `batch` (variant axisbatch): several steps' reads issued before their updates."""
        reduces = self.phases[p]
        start = f"r0 + {first} * VEC"
        if any(self.is_arg(n) for n in reduces) and not self.lay.ends:  # arg_step's start: the first index
            with w.block(f"if ({start} < r1)"):
                w.lines(f"for (int u = 0; u < VI; ++u) {self.var(n)}_i[u] = {start};"
                        for n in reduces if self.is_arg(n))
        ctx = Ctx()
        self.earlier(p, ctx)
        operands = self.sweep_operands(reduces)
        self.write_row_arrays(w, operands, ctx)
        if self.lay.ends:  # j = a * RB + b, tracked without a division per step
            w.line(f"int64_t ja = ({start}) / RB, jb = ({start}) % RB;")
        pairs = [n for n in reduces if n.id in self.pairs]
        loads = self.batch_loads(p) if batch else None
        if loads is not None:
            self.write_batched_sweep(w, reduces, ctx, operands, loads, start, step)
            return
        w.lines(f"acc_t {self.var(n)}_cnt = 0;  // this thread's elements so far (each kept one's)" for n in pairs)
        w.directive("#pragma unroll 4")
        with w.block(f"for (int64_t j0 = {start}; j0 < r1; j0 += (int64_t){step} * VEC)"):
            w.line("const int64_t base = (ja * O + o) * RB + jb; (void)base;" if self.lay.ends
                   else "const int64_t base = (o * R + j0) * I + i; (void)base;")
            self.write_vec_loads(w, operands, "VEC * VI", "base")
            w.lines(f"acc_t {self.var(n)}_x[VEC * VI];  // the step's values of a pair's sum"
                    for n in reduces if n.id in self.pair_sums)
            self.write_step_updates(w, reduces, ctx, "j0")
            for n in pairs:
                self.write_chunk_moments(w, n)
            if self.lay.ends:
                w.line(f"jb += (int64_t){step} * VEC;")
                w.line("if (jb >= RB) { ja += jb / RB; jb %= RB; }")
        for n in pairs:
            w.directive("#pragma unroll")
            w.line(f"for (int u = 0; u < VI; ++u) {self.var(n)}_n[u] = {self.var(n)}_cnt;")

    def batch_loads(self, p: int) -> list[list[Node]] | None:
        """The elem loads (each a list of nodes reading one field and index) phase p's reduce
        kernel reads SB steps ahead (variant axisbatch); None where its sweep is not batched: the
        variant off, a two-ended layout (j tracked as a pair), a moments pair (merged a step at a time)."""
        reduces = self.phases[p]
        if not self.batch or self.lay.ends or any(n.id in self.pairs for n in reduces):
            return None
        used = {n.id for n in self.closure(self.sweep_operands(reduces), "elem")}
        return [ns for ns in self.elem_loads.values()
                if ns[0].attrs["kind"] != "part" and any(n.id in used for n in ns)]

    def write_batched_sweep(self, w: CWriter, reduces: list[Node], ctx: Ctx, operands: list[Node],
                            loads: list[list[Node]], start: str, step: str) -> None:
        """The sweep SB steps at a time: every read of the SB steps first (raw, in the storage
        dtype), then their updates in index order, then the last steps one at a time. A sweep
        whose update branches (logf, expf's special cases) otherwise waits on each step's reads
        alone: log-cosh's float32 mean streamed at 3.6 TB/s where torch.compile read 4.3
        (held-out problems-v7, session 34; the SASS kept one step's two 16-byte reads in flight)."""
        vecs = {n.id for n in self.vec_loads(operands)}
        sizes = " + ".join("sizeof(T)" if ns[0].id in vecs else f"sizeof({self.ctype_of(ns[0].attrs['field'])})"
                           for ns in loads) or "0"
        with w.block():
            w.line(f"constexpr int STEP_BYTES = VEC * VI * (int)({sizes});  // one step's reads")
            w.line("constexpr int SB = STEP_BYTES <= 32 ? 4 : STEP_BYTES <= 64 ? 2 : 1;  // up to 128 bytes in flight")
            w.line(f"int64_t j0 = {start};")
            with w.block(f"for (; j0 + (int64_t)(SB - 1) * {step} * VEC < r1; j0 += (int64_t)SB * {step} * VEC)"):
                for ns in loads:
                    f = ns[0].attrs["field"]
                    w.line(f"sg::Raw<T, VEC * VI> rw_{f}[SB];" if ns[0].id in vecs
                           else f"{self.ctype_of(f)} rw_{f}[SB][VEC * VI];")
                w.directive("#pragma unroll")
                with w.block("for (int s_ = 0; s_ < SB; ++s_)"):
                    w.line(f"const int64_t base = (o * R + j0 + (int64_t)s_ * {step} * VEC) * I + i;")
                    for ns in loads:
                        f, t = ns[0].attrs["field"], self.ctype_of(ns[0].attrs["field"])
                        if ns[0].id in vecs:
                            w.line(f"sg::load_raw<VEC * VI>((const T*)A.{f}.data + base, rw_{f}[s_]);")
                        else:
                            w.directive("#pragma unroll")
                            w.line(f"for (int k_ = 0; k_ < VEC * VI; ++k_) rw_{f}[s_][k_] = "
                                   f"((const {t}*)A.{f}.data)[base + (k_ / VI) * I + k_ % VI];")
                bound = {}
                for ns in loads:
                    f = ns[0].attrs["field"]
                    raw = f"rw_{f}[s_].v[v * VI + u]" if ns[0].id in vecs else f"rw_{f}[s_][v * VI + u]"
                    bound.update({n.id: self.elem_load_expr(n, "", raw) for n in ns})
                w.directive("#pragma unroll")
                with w.block("for (int s_ = 0; s_ < SB; ++s_)"):
                    w.line(f"const int64_t js = j0 + (int64_t)s_ * {step} * VEC;")
                    w.line("const int64_t base = (o * R + js) * I + i; (void)base;")
                    self.write_step_updates(w, reduces, _scope(ctx), "js", bound)
            with w.block(f"for (; j0 < r1; j0 += (int64_t){step} * VEC)", comment="the last steps, one at a time"):
                w.line("const int64_t base = (o * R + j0) * I + i; (void)base;")
                self.write_vec_loads(w, operands, "VEC * VI", "base")
                self.write_step_updates(w, reduces, _scope(ctx), "j0")

    def write_step_updates(self, w: CWriter, reduces: list[Node], ctx: Ctx, first: str,
                           bound: dict | None = None) -> None:
        """A step's VEC x VI elements from element `first` of R: each reduction updated."""
        w.directive("#pragma unroll")
        with w.block("for (int v = 0; v < VEC; ++v)"):
            w.line(f"const int64_t j = {first} + v; (void)j;")
            w.directive("#pragma unroll")
            with w.block("for (int u = 0; u < VI; ++u)"):
                w.line("const int64_t row = row0 + u; (void)row;")
                self.write_sweep_updates(w, reduces, ctx, bound)

    def sweep_operands(self, reduces: list[Node]) -> list[Node]:
        """What a sweep reads for `reduces`: each one's operand, but a moments pair's squares and a
        co-moment's product are merged from their sums' values (write_chunk_moments)."""
        return [n.args[0] for n in reduces if n.id not in self.pairs and n.id not in self.co_ids]

    def write_chunk_moments(self, w: CWriter, n: Node) -> None:
        """A step's VEC values of each kept element (all in range: R and the chunks are whole
        steps) as one part of exact moments (their sum, their squared deviations from their own
        mean), merged into the running ones by Chan's formula; the count is the same for every
        kept element of the thread, so the divisions are once a step."""
        v, total = self.var(n), self.var(self.pairs[n.id][0])
        x = f"{total}_x"
        with w.block():
            w.line(f"const acc_t f_ = {v}_cnt * (acc_t)VEC / ({v}_cnt + (acc_t)VEC);  // n * VEC / (n + VEC)")
            w.line(f"const acc_t r_ = {v}_cnt > (acc_t)0 ? (acc_t)1 / {v}_cnt : (acc_t)0;")
            w.directive("#pragma unroll")
            with w.block("for (int u = 0; u < VI; ++u)"):
                w.line("acc_t cs_ = 0, c2_ = 0;")
                w.line(f"for (int v = 0; v < VEC; ++v) cs_ += {x}[v * VI + u];")
                w.line("const acc_t cm_ = cs_ * ((acc_t)1 / (acc_t)VEC);")
                w.line(f"for (int v = 0; v < VEC; ++v) {{ const acc_t d_ = {x}[v * VI + u] - cm_; c2_ += d_ * d_; }}")
                w.line(f"const acc_t dl_ = cm_ - {total}[u] * r_;  // the part's mean minus the running mean")
                if n.id in self.co:  # the co-moment with g: the same merge with g's part
                    c, t = (self.var(m) for m in self.co[n.id])
                    w.line("acc_t gs_ = 0, cc_ = 0;")
                    w.line(f"for (int v = 0; v < VEC; ++v) gs_ += {t}_x[v * VI + u];")
                    w.line("const acc_t gm_ = gs_ * ((acc_t)1 / (acc_t)VEC);")
                    w.line(f"for (int v = 0; v < VEC; ++v) cc_ += ({t}_x[v * VI + u] - gm_) * ({x}[v * VI + u] - cm_);")
                    w.line(f"{c}[u] += cc_ + dl_ * ((gm_ - {t}[u] * r_) * f_);")
                    w.line(f"{t}[u] += gs_;")
                w.line(f"{v}[u] += c2_ + dl_ * (dl_ * f_);  // f_ first: 0 on the first step, where dl_^2 may overflow")
                w.line(f"{total}[u] += cs_;")
            w.line(f"{v}_cnt += (acc_t)VEC;")

    def write_vec_loads(self, w: CWriter, roots: list[Node], width: str, at: str) -> None:
        """The vector reads (`width` elements from element `at`) of the loads `roots` read."""
        for n in self.vec_loads(roots):
            f = n.attrs["field"]
            w.line(f"acc_t ld_{f}[{width}];")
            w.line(f"sg::load_vec<{width}>((const {self.ctype_of(f)}*)A.{f}.data + {at}, ld_{f});")

    def write_sweep_updates(self, w: CWriter, reduces: list[Node], ctx: Ctx, bound: dict | None = None) -> None:
        """Element j of kept element u: the reductions' operands, each running value updated
        (`bound`: loads already read, {node id: its value})."""
        operands = self.sweep_operands(reduces)
        self.bind_loads(ctx, "base + v * I + u", operands, vec_index="v * VI + u")
        ctx.loads.update(bound or {})
        w.lines(self.elem_statements(operands, ctx))
        for n in reduces:
            v = self.var(n)
            if n.id in self.pairs or n.id in self.co_ids:  # merged a step at a time (write_chunk_moments)
                continue
            if n.id in self.pair_sums:
                w.line(f"{v}_x[v * VI + u] = (acc_t)({self.expr(n.args[0], ctx)});")
                continue
            if self.is_arg(n) and not self.lay.ends:  # in index order: arg_step, no index compare
                m = "true" if n.attrs["kind"] == "argmax" else "false"
                w.line(f"{{ const acc_t c_ = (acc_t)({self.expr(n.args[0], ctx)}); "
                       f"const bool tk_ = sgx::arg_step<{m}>(c_, {v}[u]); {v}[u] = tk_ ? c_ : {v}[u]; "
                       f"{v}_i[u] = tk_ ? j : {v}_i[u]; }}")
            else:
                w.line(self.update(n, f"{v}[u]", self.expr(n.args[0], ctx), "j", f"{v}_i[u]"))

    def write_block_merge(self, w: CWriter, reduces: list[Node]) -> None:
        """A block's partials merged into smem row 0: by warps first (merge_form "warp") or all
        into shared memory, then the fixed tree."""
        if self.merge_form == "warp":
            self.write_warp_merge(w, reduces)
        else:
            self.write_to_smem(w, reduces)
        self.write_smem_tree(w, reduces)

    def write_warp_merge(self, w: CWriter, reduces: list[Node]) -> None:
        """A warp's rows of ty merged by shuffles (xor offsets >= TX keep tx), its first row's
        lanes writing the warp's partials: the smem tree then spans 8 warps (4 barriers where a
        tree over TY of 256 took 9; held-out argmax over rows of 4096 ran at 0.67x eager)."""
        w.directive("#pragma unroll")
        with w.block("for (int u = 0; u < VI; ++u)"):
            # not unrolled: unrolled, ptxas kept float32's 16-byte TX = 1 reduce at 32 registers and
            # spilled its loop invariants (frobenius_norm); at most 5 steps once per kept tile
            w.directive("#pragma unroll 1")
            with w.block("for (int off = 16; off >= TX; off >>= 1)"):
                w.lines(self.shuffle_merges(reduces, "u"))
            with w.block("if (ty % WT == 0)"):
                for n in reduces:
                    w.lines(f"sm_{name}[ty / WT][tx * VI + u] = {name}[u];" for name, _ in self.running_values(n))

    def shuffle_merges(self, reduces: list[Node], u: str) -> list[str]:
        """Each reduction's value of kept element `u` merged with the lane `off` away (and its
        index, for an arg-reduction: the full tie rule across threads)."""
        lines = []
        for n in reduces:
            v = self.var(n)
            other = f"__shfl_xor_sync(0xffffffffu, {v}[{u}], off)"
            if n.id in self.pair_sums or n.id in self.co_ids:
                continue
            if n.id in self.pairs:
                names = [self.var(self.pairs[n.id][0]), f"{v}_n", v] + [self.var(m) for m in self.co.get(n.id, ())]
                lines.append("{ " + " ".join(f"const acc_t o{k}_ = __shfl_xor_sync(0xffffffffu, {nm}[{u}], off);"
                                             for k, nm in enumerate(names))
                             + " " + self.merge_stmt(n, lambda nm: f"{nm}[{u}]",
                                                     lambda nm: f"o{names.index(nm)}_") + " }")
                continue
            if self.is_arg(n):
                lines.append(f"{{ const {self.acc_type(n)} o_ = {other}; const int64_t oi_ = "
                             f"__shfl_xor_sync(0xffffffffu, {v}_i[{u}], off); "
                             f"{self.merge(n, f'{v}[{u}]', 'o_', 'oi_', f'{v}_i[{u}]')} }}")
            else:
                lines.append(f"{{ const {self.acc_type(n)} o_ = {other}; {self.merge(n, f'{v}[{u}]', 'o_')} }}")
        return lines

    def write_to_smem(self, w: CWriter, reduces: list[Node]) -> None:
        """Every thread's partials into shared memory, for the tree over TY."""
        w.directive("#pragma unroll")
        with w.block("for (int u = 0; u < VI; ++u)"):
            for n in reduces:
                w.lines(f"sm_{name}[ty][tx * VI + u] = {name}[u];" for name, _ in self.running_values(n))

    def rows_allowed(self) -> bool:
        """The warp-per-element kernel: one phase (no earlier results to read back), no
        two-ended layout, the variant asks for it."""
        return self.rows_max > 0 and len(self.phases) == 1 and not self.lay.ends

    def write_rows(self, w: CWriter, p: int) -> None:
        """A warp per kept element when I == 1, R is short (up to `axis_rows`) and there are many
        (O >= TARGET_BLOCKS, so G == 1): 8 elements a block, lanes along R with 16-byte reads,
        merged by shuffles; no shared memory, no barrier. Many short rows (262144 of 4096) spent a 256-thread block's life on
        latency and barriers for 16 KB each (amax_rows_indices, session 18)."""
        reduces = self.phases[p]
        w.line(f"// Reduce (phase {p}), a warp per kept element (I == 1, short R): 8 a block, no barrier.")
        w.line("template <typename T, int VEC>")
        w.line(f"__global__ void __launch_bounds__({BLOCK}) {self.kname}_rows{p}(const {self.args_t} A, void* ws, "
               "int64_t O, int64_t R)")
        with w.block():
            w.line("using acc_t = typename sg::Acc<T>::type;")
            w.line("constexpr int VI = 1;")
            w.line("const int lane = threadIdx.y & 31;")
            w.line("const int64_t I = 1, K = O, G = 1, GP = 0, r0 = 0, r1 = R, i = 0; (void)GP; (void)i;")
            with w.block(f"for (int64_t b = blockIdx.x; b * {BLOCK // 32} < O; b += gridDim.x)"):
                w.line(f"const int64_t o = b * {BLOCK // 32} + (threadIdx.y >> 5);")
                w.line("const bool live = o < O;  // the same for a whole warp: its shuffles stay converged")
                w.line("const int64_t row0 = o; (void)row0;")
                for n in reduces:
                    self.write_running_decls(w, n)
                    w.line(self.running_init(n, "0"))
                with w.block("if (live)"):
                    self.write_sweep(w, p, "(int64_t)lane", "32")
                w.directive("#pragma unroll 1")
                with w.block("for (int off = 16; off >= 1; off >>= 1)"):
                    w.lines(self.shuffle_merges(reduces, "0"))
                with w.block("if (lane == 0 && live)"):
                    w.line("const int64_t row = row0;")
                    w.line(self.finish_call(p, lambda name: f"{name}[0]"))

    def fused_allowed(self) -> bool:
        """The one-kernel form (variant axisfused): reductions, a one-ended layout, no totals
        (their sum over every kept element needs a kernel after all rows)."""
        return self.fused and bool(self.reduces) and not self.lay.ends and not self.totals and not self.part_groups

    def write_fused(self, w: CWriter) -> None:
        """A block per kept element (I == 1, R not split): each phase's sweep, merge and finish in
        turn (a barrier between: the next phase reads the finish's results), then the elem stores
        of the row. The row's later reads come from L2 while it is still there: the launcher caps
        the rows in flight (FUSED_L2_BYTES), where the reduce / elem kernels re-read it from HBM."""
        w.line(f"// Fused (variant axisfused): a block of {FUSED_BLOCK} threads per kept element (I == 1, R not")
        w.line("// split) through every phase, then the row's elem stores; the row's re-reads hit L2.")
        w.line("template <typename T, int VEC, int EVEC>  // VEC: the sweeps' reads; EVEC: the elem pass's")
        # two blocks an SM at least: under the default bound ptxas spilled float32's VEC kernel at 40 registers
        w.line(f"__global__ void __launch_bounds__({FUSED_BLOCK}, 2) {self.kname}_fused(const {self.args_t} A, "
               "void* ws, int64_t O, int64_t R)")
        with w.block():
            w.line("using acc_t = typename sg::Acc<T>::type;")
            w.line(f"constexpr int TX = 1, VI = 1, TY = {FUSED_BLOCK}, TW = 1; (void)TW;")
            w.line("const int tx = 0, ty = threadIdx.y; (void)tx;")
            w.line("const int64_t I = 1, K = O, G = 1, GP = 0, r0 = 0, r1 = R, i = 0; (void)K; (void)GP; (void)i;")
            w.line("constexpr int WT = " + ("32;  // a warp's rows of ty merged by shuffles first"
                                           if self.merge_form == "warp" else "1;  // the tree runs over TY"))
            for n in self.reduces:
                w.lines(f"__shared__ {t} sm_{name}[TY / WT][TW];" for name, t in self.running_values(n))
            with w.block("for (int64_t o = blockIdx.x; o < O; o += gridDim.x)"):
                w.line("const int64_t row0 = o; (void)row0;")
                for p, reduces in enumerate(self.phases):
                    with w.block(comment=f"phase {p}: " + ", ".join(n.attrs["kind"] for n in reduces)):
                        for n in reduces:
                            self.write_running_decls(w, n)
                            w.line(self.running_init(n, "0"))
                        self.write_sweep(w, p, "(int64_t)ty", "TY")
                        self.write_block_merge(w, reduces)
                        with w.block("if (ty == 0)"):
                            w.line("const int c = 0;")
                            w.line("const int64_t row = row0;")
                            w.line(self.finish_call(p, lambda name: f"sm_{name}[0][c]"))
                        w.line("__syncthreads();  // the finish's results seen by the block; the tree's smem free")
                if self.elem_stores:
                    self.write_fused_elem(w)

    def write_fused_elem(self, w: CWriter) -> None:
        """The elem stores of kept element o's row, EVEC consecutive elements a thread a step."""
        with w.block("for (int64_t j0 = (int64_t)ty * EVEC; j0 < R; j0 += (int64_t)TY * EVEC)"):
            w.line("const int64_t n0 = o * R + j0;")
            self.write_elem_chunk(w, "EVEC", row="o", j="j0 + v")

    def write_fused_launch(self, w: CWriter) -> None:
        """The fused kernel's launch where it applies (I == 1, G == 1), then return: the sweeps
        read VEC along R where the loads are aligned (vec_r), the elem pass where its stores are
        too; at most FUSED_L2_BYTES of rows in flight, but two blocks an SM (rows too long for L2
        gain nothing from fewer, and one 512-thread block an SM reads at a quarter occupancy)."""
        row_loads = max(1, len(self.vec_loads()))
        with w.block("if (I == 1 && G == 1 && K > 0)", comment="variant axisfused: one kernel"):
            w.line(f"const bool evec = vec_r && {self.stores_aligned()};")
            w.line(f"const int64_t row_bytes = R * (int64_t)sizeof(T) * {row_loads};")
            w.line(f"int64_t cap = (int64_t){FUSED_L2_BYTES} / (row_bytes > 0 ? row_bytes : 1);")
            w.line("if (cap < 2 * (int64_t)sg::sm_count()) cap = 2 * (int64_t)sg::sm_count();")
            w.line("const int64_t fb = O < cap ? O : cap;")
            w.line("const unsigned fgrid = (unsigned)(fb < (1 << 30) ? fb : (1 << 30));")
            launch = f"<<<fgrid, dim3(1, {FUSED_BLOCK}), 0, stream>>>(args, ws, O, R);"
            w.line(f"if (evec) {self.kname}_fused<T, VEC, VEC>{launch}")
            w.line(f"else if (vec_r) {self.kname}_fused<T, VEC, 1>{launch}")
            w.line(f"else {self.kname}_fused<T, 1, 1>{launch}")
            w.line("return cudaGetLastError();")

    def write_combine(self, w: CWriter, p: int) -> None:
        """Phase p's split partials (G > 1): each kept element's merged in chunk order, then finished."""
        w.line("// Combine: a thread per kept element merges its G chunk partials in chunk order.")
        w.line("template <typename T>")
        w.line(f"__global__ void {self.kname}_combine{p}(const {self.args_t} A, void* ws, int64_t K, int64_t G)")
        with w.block():
            w.line("using acc_t = typename sg::Acc<T>::type;")
            w.line("const int64_t GP = G;")
            with w.block("for (int64_t row = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; row < K; "
                         "row += (int64_t)gridDim.x * blockDim.x)"):
                for n in self.phases[p]:
                    w.lines(f"{t} {name} = {ptr}[row];" for name, t, ptr in self.partials(n))
                with w.block("for (int64_t g = 1; g < G; ++g)"):
                    ptrs = {name: ptr for n in self.phases[p] for name, _, ptr in self.partials(n)}
                    for n in self.phases[p]:
                        line = self.merge_stmt(n, lambda name: name, lambda name: f"{ptrs[name]}[g * K + row]")
                        w.lines([line] if line else [])  # empty: merged by its moments pair
                w.line(self.finish_call(p, lambda name: name))

    def write_total(self, w: CWriter) -> None:
        """One block sums each total's per-kept-element values in a fixed order, then the epilogue."""
        w.line("// Total: one block sums the kept elements' values of each total (a fixed tree), then the")
        w.line("// epilogue of the scalar outputs.")
        w.line("template <typename T>")
        w.line(f"__global__ void __launch_bounds__(1024) {self.kname}_total(const {self.args_t} A, void* ws, "
               "int64_t K, int64_t GP)")
        with w.block():
            w.line("using acc_t = typename sg::Acc<T>::type;")
            w.line("__shared__ acc_t tree[1024];")
            ctx = Ctx()
            for t, n in enumerate(self.totals):
                self.write_total_sum(w, t)
                w.line(f"const acc_t {self.var(n)} = tree[0];")
                w.line("__syncthreads();")
                ctx.names[n.id] = self.var(n)
            w.line("if (threadIdx.x != 0) return;")
            for n in self.closure([s.value for s in self.total_stores], "post"):
                if n.id not in ctx.names:
                    w.line(f"const {self.ctype_var(n)} {self.var(n)} = {self.expr(n, ctx)};")
                    ctx.names[n.id] = self.var(n)
            w.lines(self.scalar_store(s, ctx) for s in self.total_stores)

    def write_total_sum(self, w: CWriter, t: int) -> None:
        """Total t's values summed into tree[0]: a strided pass per thread, then a fixed tree."""
        with w.block():
            w.line("acc_t part = 0;")
            w.line(f"for (int64_t r = threadIdx.x; r < K; r += blockDim.x) part += "
                   f"{self.ws_ptr(self.total_slot(t), 'acc_t', False)}[r];")
            w.line("tree[threadIdx.x] = part;")
            w.line("__syncthreads();")
            with w.block("for (int w = 512; w > 0; w >>= 1)"):
                w.line("if ((int)threadIdx.x < w) tree[threadIdx.x] += tree[threadIdx.x + w];")
                w.line("__syncthreads();")

    def write_elem(self, w: CWriter) -> None:
        """The flat pass over S for the elem stores (reading the kept reductions' results)."""
        w.line("// Elem: a flat grid-stride pass over S. MODE 1: VEC consecutive elements along I (I % VEC")
        w.line("// == 0); MODE 2: along R (I == 1, R % VEC == 0); MODE 0: one element at a time." +
               (" MODE 3: VEC" if self.elem_vec else ""))
        if self.elem_vec:
            w.line("// consecutive flat elements, each at its own kept element and place along R (any I).")
        w.line("// NARROW (N < 2^31): the index math in 32 bits through FastDiv.")
        w.line("template <typename T, int VEC, int MODE, bool NARROW>")
        w.line(f"__global__ void __launch_bounds__({BLOCK}) {self.kname}_elem(const {self.args_t} A, void* ws, "
               "int64_t O, int64_t R, int64_t I, int64_t GP, sgx::FastDiv f1, sgx::FastDiv f2)")
        with w.block():
            w.line("using acc_t = typename sg::Acc<T>::type;")
            w.line("const int64_t K = O * I, N = O * R * I; (void)K; (void)GP;")
            with w.block("for (int64_t n0 = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * VEC; n0 < N; "
                         "n0 += (int64_t)gridDim.x * blockDim.x * VEC)"):
                # RB one level out of the loop's body: the bytes the committed kernels were built with
                for line in self.rb_line():
                    w.verbatim("  " + line)
                self.write_elem_position(w)
                if self.elem_vec:
                    self.write_elem_positions(w)
                    self.write_elem_chunk(w, "VEC", row="MODE == 3 ? prow_[v] : o * I + i0 + (MODE == 1 ? v : 0)",
                                          j="MODE == 3 ? pj_[v] : j0 + (MODE == 2 ? v : 0)")
                else:
                    self.write_elem_chunk(w, "VEC", row="o * I + i0 + (MODE == 1 ? v : 0)", j="j0 + (MODE == 2 ? v : 0)")
                if self.global_stores and not self.reduces:
                    ctx = Ctx()
                    with w.block("if (n0 == 0)"):
                        w.lines(self.scalar_store(s, ctx) for s in self.global_stores)

    def write_elem_chunk(self, w: CWriter, width: str, row: str, j: str) -> None:
        """`width` consecutive elements from flat element n0: the vector reads, each element's
        values (its kept element `row`, its place `j` along R, both C in v), the vector stores."""
        roots = [s.value for s in self.elem_stores]
        self.write_vec_loads(w, roots, width, "n0")
        fields = dict.fromkeys(s.field for s in self.elem_stores)
        w.lines(f"acc_t st_{f}[{width}];" if self.store_is_vec(f) else f"// {f}: stored one at a time"
                for f in fields)
        w.directive("#pragma unroll")
        with w.block(f"for (int v = 0; v < {width}; ++v)"):
            w.line(f"const int64_t row = {row}; (void)row;")
            w.line(f"const int64_t j = {j}; (void)j;")
            self.write_elem_values(w, roots)
        w.lines(f"sg::store_vec<{width}>(({self.ctype_of(f)}*)A.{f}.data + n0, st_{f});"
                for f in fields if self.store_is_vec(f))

    def write_elem_position(self, w: CWriter) -> None:
        """Flat element n0 as its kept element (o, i0) and its place j0 along R."""
        ends = self.lay.ends
        w.line(f"const int64_t D1 = {'RB' if ends else 'I'}, D2 = {'O' if ends else 'R'};")
        w.line("int64_t q, q2;")
        w.line("if constexpr (NARROW) { q = f1.div((uint32_t)n0); q2 = f2.div((uint32_t)q); }")
        w.line("else { q = n0 / D1; q2 = q / D2; }")
        w.line("const int64_t r1 = n0 - q * D1, r2 = q - q2 * D2;")
        w.line("const int64_t o = r2, j0 = q2 * RB + r1, i0 = 0; (void)j0;  // n0 = (a * O + o) * RB + b" if ends
               else "const int64_t o = q2, j0 = r2, i0 = r1; (void)j0;  // n0 = (o * R + j) * I + i")

    def write_elem_positions(self, w: CWriter) -> None:
        """MODE 3: each of the VEC flat elements from n0 as its kept element and place along R,
        stepping from n0's position (no division per element)."""
        w.line("int64_t prow_[VEC], pj_[VEC]; (void)prow_; (void)pj_;")
        with w.block("if constexpr (MODE == 3)"):
            if self.lay.ends:  # n = (a * O + o) * RB + b, j = a * RB + b, I == 1
                w.line("int64_t a_ = q2, b_ = r1, o_ = o;")
                w.directive("#pragma unroll")
                with w.block("for (int v = 0; v < VEC; ++v)"):
                    w.line("prow_[v] = o_;")
                    w.line("pj_[v] = a_ * RB + b_;")
                    w.line("if (++b_ == RB) { b_ = 0; if (++o_ == O) { o_ = 0; ++a_; } }")
            else:  # n = (o * R + j) * I + i
                w.line("int64_t o_ = o, j_ = j0, i_ = i0;")
                w.directive("#pragma unroll")
                with w.block("for (int v = 0; v < VEC; ++v)"):
                    w.line("prow_[v] = o_ * I + i_;")
                    w.line("pj_[v] = j_;")
                    w.line("if (++i_ == I) { i_ = 0; if (++j_ == R) { j_ = 0; ++o_; } }")

    def write_elem_values(self, w: CWriter, roots: list[Node]) -> None:
        """Element n0 + v: its values from the loads and the kept reductions' results, then its
        stores (into the vector to store, or one at a time)."""
        ctx = Ctx()
        self.bind_loads(ctx, "n0 + v", roots)
        for n in self.kept:
            ctx.names[n.id] = self.kept_name(n)
        w.lines(self.row_statements(roots, ctx))
        w.lines(self.elem_statements(roots, ctx))
        for s in self.elem_stores:
            value = self.expr(s.value, ctx)
            if self.store_is_vec(s.field):
                w.line(f"st_{s.field}[v] = (acc_t)({value});")
            else:
                w.line(f"(({self.ctype_of(s.field)}*)A.{s.field}.data)[n0 + v] = "
                       f"{self.store_value(s.field, value, s.value)};")

    def stores_aligned(self) -> str:
        """C: every output the elem pass stores 16 bytes at a time is 16-byte aligned."""
        fields = dict.fromkeys(s.field for s in self.elem_stores if self.store_is_vec(s.field))
        return " && ".join(f"sg::aligned16(A.{f}.data)" for f in fields) or "true"

    def store_is_vec(self, field: str) -> bool:
        return self.types[field].dtype is None and all(s.value.dtype == "float" for s in self.elem_stores
                                                       if s.field == field)

    # ------------------------------------------------------------ host
    def write_launch(self, w: CWriter, dtypes: list[str]) -> None:
        """The launcher `<kname>_launch<T>` (the split of R, the workspace, the reduce and
        element kernels' launches), the extern "C" entry point and, with a workspace, the size function."""
        vi_ok = all(self.vi_allowed(p) for p in range(len(self.phases))) if self.reduces else False
        w.line("template <typename T>")
        w.line(f"static cudaError_t {self.kname}_launch(const {self.args_t}& A, cudaStream_t stream"
               f"{launch_need_param(self.has_workspace)})")
        with w.block():
            w.lines(self.sizes())
            w.line("const int64_t K = O * I, N = O * R * I;")
            if not self.part_groups:
                w.line("if (N == 0 && K == 0) return cudaSuccess;")
            w.line("constexpr int VEC = 16 / sizeof(T) > 0 ? 16 / sizeof(T) : 1;")
            aligned = " && ".join(f"sg::aligned16(A.{n.attrs['field']}.data)" for n in self.vec_loads()) or "true"
            w.line(f"const bool loads_aligned = {aligned};")
            w.line("int64_t G = 1, chunk = R > 0 ? R : 1;")
            w.line("int TX = 1, VI = 1;")
            w.line("bool vec_r = false;")
            if self.reduces:
                self.write_reduce_split(w, vi_ok)
            w.line("const int64_t GP = G > 1 ? G : 0;")
            if self.part_groups:
                w.lines(self.parts.launch_geometry(f"((size_t){self.npartial} * (size_t)GP + "
                                                   f"{len(self.kept) + len(self.totals)}) * (size_t)K"))
                w.line(f"if (N == 0 && K == 0 && !({self.parts.any_output()})) return cudaSuccess;")
                w.line(f"const size_t ws_bytes = 8 * {self.parts.parts_end()};")
            elif self.has_workspace:
                w.line(f"const size_t ws_bytes = 8 * ((size_t){self.npartial} * (size_t)GP + "
                       f"{len(self.kept) + len(self.totals)}) * (size_t)K;")
            if self.has_workspace:
                w.lines(take_workspace("ws_bytes"))
                w.line("void* ws = ws_bytes ? A.workspace : nullptr;")
            else:
                w.line("void* ws = nullptr;")
            w.line(f"const {self.args_t} args = A;")
            if self.fused_allowed():
                self.write_fused_launch(w)
            if self.reduces:
                with w.block("if (K > 0)"):
                    self.write_reduce_launches(w, vi_ok)
            if self.elem_stores or (self.global_stores and not self.reduces):
                self.write_elem_launch(w)
            self.parts.write_launches(w)
            w.line("return cudaGetLastError();")
        w.line()
        dispatch = self.dispatch_field()
        w.lines(entry_function(abi.entry_point(self.spec, self.direction), self.args_t, self.kname, dispatch, dtypes))
        if self.has_workspace:
            w.line()
            w.lines(workspace_entry(self.kname, abi.workspace_function(self.spec, self.direction), self.args_t,
                                    dispatch, dtypes))

    def write_reduce_split(self, w: CWriter, vi_ok: bool) -> None:
        """TX threads along I (VI elements each), vec_r, and the split of R over G blocks of `chunk` each."""
        w.line("// a wide kept axis: 32 threads along I, each reading 16 bytes (VI elements) per step")
        w.line(f"if ({'true' if vi_ok else 'false'} && VEC > 1 && I % VEC == 0 && I >= 32 * VEC && loads_aligned) "
               "VI = VEC;")
        w.line("const int64_t IV = I / VI;")
        w.line("TX = IV >= 32 ? 32 : IV >= 16 ? 16 : IV >= 8 ? 8 : IV >= 4 ? 4 : IV >= 2 ? 2 : 1;")
        w.line("vec_r = TX == 1 && VEC > 1 && R % VEC == 0 && loads_aligned"
               + (" && RB % VEC == 0;" if self.lay.ends else ";"))
        w.line(f"const int64_t tiles = (I + TX * VI - 1) / (TX * VI), blocks = O * tiles, "
               f"step = (int64_t)({BLOCK} / TX) * (vec_r ? VEC : 1);")
        w.line(f"// few kept tiles: split R over G blocks (about {TARGET_BLOCKS} blocks in all, each thread at")
        w.line(f"// least {MIN_STEPS} steps); G depends on the shape only, so results are reproducible")
        with w.block(f"if (blocks < {TARGET_BLOCKS})"):
            w.line(f"G = ({TARGET_BLOCKS} + blocks - 1) / blocks;")
            w.line(f"const int64_t most = (R + step * {MIN_STEPS} - 1) / (step * {MIN_STEPS});")
            w.line("if (G > most) G = most;")
            w.line("if (G > 65535) G = 65535;")
            w.line("if (G < 1) G = 1;")
        w.line("chunk = (R + G - 1) / G;")
        w.line("chunk = (chunk + step - 1) / step * step;")
        w.line("if (chunk < 1) chunk = 1;")
        w.line("G = (R + chunk - 1) / chunk;")
        w.line("if (G < 1) G = 1;")

    def write_reduce_launches(self, w: CWriter, vi_ok: bool) -> None:
        """Each phase's reduce kernel (or, for many short contiguous rows, its warp-per-row
        kernel), its combine over the G splits, then the totals."""
        w.line("const int64_t tiles = (I + TX * VI - 1) / (TX * VI);")
        w.line("const dim3 grid((unsigned)(O * tiles < (1 << 30) ? O * tiles : (1 << 30)), (unsigned)G);")
        rows = self.rows_allowed()
        for p in range(len(self.phases)):
            w.line(f"// phase {p}: " + ", ".join(n.attrs["kind"] for n in self.phases[p]))
            if rows:  # a warp per kept element: 8 a block
                # many rows only: a few (decode) keep a block each, all their loads in flight at once
                with w.block(f"if (I == 1 && O >= {TARGET_BLOCKS} && R <= {self.rows_max})"):
                    w.line(f"const int64_t rb = (O + {BLOCK // 32 - 1}) / {BLOCK // 32};")
                    w.line("const unsigned rgrid = (unsigned)(rb < (1 << 30) ? rb : (1 << 30));")
                    w.line(f"if (vec_r) {self.kname}_rows{p}<T, VEC><<<rgrid, dim3(1, {BLOCK}), 0, stream>>>"
                           "(args, ws, O, R);")
                    w.line(f"else {self.kname}_rows{p}<T, 1><<<rgrid, dim3(1, {BLOCK}), 0, stream>>>(args, ws, O, R);")
            for tx in (1, 2, 4, 8, 16, 32):
                with w.block(f"{'if' if tx == 1 and not rows else 'else if'} (TX == {tx})"):
                    w.lines(self.reduce_launch(p, tx, vi_ok))
            with w.block("if (G > 1)"):
                w.line("const int64_t cb = (K + 255) / 256;")
                w.line(f"{self.kname}_combine{p}<T><<<(unsigned)(cb < 65535 ? cb : 65535), 256, 0, stream>>>"
                       "(args, ws, K, G);")
        if self.totals:
            w.line(f"{self.kname}_total<T><<<1, 1024, 0, stream>>>(args, ws, K, GP);")

    def reduce_launch(self, p: int, tx: int, vi_ok: bool) -> list[str]:
        """Phase p's reduce kernel launched for TX == tx: by vec_r (TX 1) or VI (TX 32) where they apply."""
        kernel = f"{self.kname}_reduce{p}<T, "
        launch = f"<<<grid, dim3({tx}, {BLOCK // tx}), 0, stream>>>(args, ws, O, R, I, G, chunk);"
        if tx == 1:
            return [f"if (vec_r) {kernel}VEC, 1, 1>{launch}", f"else {kernel}1, 1, 1>{launch}"]
        if tx == 32 and vi_ok:
            return [f"if (VI > 1) {kernel}1, 32, VEC>{launch}", f"else {kernel}1, 32, 1>{launch}"]
        return [f"{kernel}1, {tx}, 1>{launch}"]

    def write_elem_launch(self, w: CWriter) -> None:
        """The element kernel's launch: its vector mode, 32-bit index math where N allows it."""
        w.line(f"const bool vec_ok = VEC > 1 && N % VEC == 0 && loads_aligned && {self.stores_aligned()};")
        other = 3 if self.elem_vec else 0  # VEC flat elements at their own positions, or one at a time
        if self.lay.ends:  # (the default's text as it was)
            w.line("const int mode = !vec_ok ? 0 : RB % VEC == 0 ? 2 : 3;  // VEC along RB, else at own positions"
                   if self.elem_vec else "const int mode = vec_ok && RB % VEC == 0 ? 2 : 0;  // VEC along RB")
        else:
            w.line(f"const int mode = !vec_ok ? 0 : I % VEC == 0 ? 1 : (I == 1 && R % VEC == 0) ? 2 : {other};")
        w.line("const int64_t per = mode ? VEC : 1;")
        w.line("int64_t eb = (N / per + 255) / 256;")
        w.line("if (eb > (1 << 20)) eb = 1 << 20;")
        w.line("if (eb < 1) eb = 1;")
        w.line(f"const sgx::FastDiv f1({'RB' if self.lay.ends else 'I'}), f2({'O' if self.lay.ends else 'R'});")
        w.line("const bool narrow = N < ((int64_t)1 << 31);")
        launch = "<<<(unsigned)eb, 256, 0, stream>>>(args, ws, O, R, I, GP, f1, f2);"
        w.directive(f"#define SG_ELEM(V, M) do {{ if (narrow) {self.kname}_elem<T, V, M, true>{launch} "
                    f"else {self.kname}_elem<T, V, M, false>{launch} }} while (0)")
        w.line("if (mode == 1) SG_ELEM(VEC, 1);")
        w.line("else if (mode == 2) SG_ELEM(VEC, 2);")
        if self.elem_vec:
            w.line("else if (mode == 3) SG_ELEM(VEC, 3);")
        w.line("else SG_ELEM(1, 0);")
        w.directive("#undef SG_ELEM")

    @property
    def has_workspace(self) -> bool:
        """Partials of split reductions, or kept/total slots: bytes the framework's workspace holds."""
        return self.npartial > 0 or len(self.kept) + len(self.totals) > 0 or bool(self.part_groups)

    def emit(self, dtypes: list[str]) -> str:
        w = CWriter()
        if self.reduces:
            for p in range(len(self.phases)):
                self.write_finish(w, p)
                w.line()
                self.write_reduce(w, p)
                w.line()
                self.write_combine(w, p)
                w.line()
                if self.rows_allowed():
                    self.write_rows(w, p)
                    w.line()
            if self.fused_allowed():
                self.write_fused(w)
                w.line()
        if self.totals:
            self.write_total(w)
            w.line()
        if self.elem_stores or (self.global_stores and not self.reduces):
            self.write_elem(w)
            w.line()
        self.parts.write(w)
        self.write_launch(w, dtypes)
        return w.text()


def emit_axis_source(spec, programs: dict[str, AxisProgram], variant: Variant = DEFAULT_VARIANT) -> str:
    first = next(iter(programs.values()))
    parts = [f"// {spec.name}.cu: generated by specgen's builtin generator from {Path(str(spec.path)).name}.",
             f"//   {spec.signature}",
             "// The reference was traced to primitive ops and lowered to an axis program: the tensor is",
             f"// viewed as [O, R, I] ({first.layout.describe()}) and reduced over R; math runs in fp32",
             "// (fp64 for float64), storage keeps the spec's dtype. Deterministic: fixed reduction",
             "// trees and chunk orders (split reductions go through a workspace), no atomics.",
             f'#include "{abi.header_filename(spec)}"', PRELUDE, HELPERS]
    emitters = {direction: AxisEmitter(spec, program, direction, variant) for direction, program in programs.items()}
    if any(em.pairs for em in emitters.values()):
        parts.append(PRELUDE_MOMENTS)
    if any(em.co for em in emitters.values()):
        parts.append(COMOMENTS)
    for direction, em in emitters.items():
        parts.append(f"// ======================= {direction} =======================")
        parts.append(em.emit(list(spec.dtypes)))
    return "\n\n".join(with_optional_preludes(parts)) + "\n"
