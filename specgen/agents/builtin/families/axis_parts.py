"""Part totals of axis programs: sums over some atoms of S, one value per element of the others.

An affine normalization's parameter gradients are the case: GroupNorm's grad_weight[c] sums
g * xhat over the batch and over L (atoms B and L of S = [B, groups, C/groups, L], the output
spanning the atoms groups and C/groups), InstanceNorm's sums a per-(sample, channel) value over
the samples. The lowering (axis_reduce.part_total) makes each a `partreduce` node: a sum of an
element value (over="elem": the space is S) or of a kept value (over="row": the space is the
kept elements) over every atom of that space but the output's `atoms`.

Each group of part totals over the same atoms and space is one kernel, launched after the
reductions (it reads their results from the workspace like the elem pass does):

  <k>_part{q}     grid (KP, GS): a block per output element k (KP = the product of the output's
                  atoms) and split gs of its M summed elements; threads stride over the split's
                  elements, consecutive threads along the innermost summed atoms (coalesced when
                  the output's atoms are not innermost); a fixed shared-memory tree per block.
                  GS == 1: the block finishes k (the epilogue and the store); else it writes its
                  partial to the workspace and
  <k>_partsum{q}  a thread per k sums its GS partials in split order, then finishes k.

Deterministic (fixed trees, split order, no atomics); GS depends on the shape only.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...base import AgentRefused
from ..ctext import Ctx, arange_value, dim_expr
from ..cwriter import CWriter
from ..ir import Node, Store

BLOCK = 256
TARGET_BLOCKS = 2048  # splits until the grid has about this many blocks (shape-only: reproducible)
MIN_STEPS = 4  # each thread sums at least this many elements of its split


@dataclass
class PartGroup:
    """Part totals over the same output atoms and space, and the stores computed from them."""

    atoms: tuple[int, ...]
    over: str  # "elem" (S) or "row" (the kept elements)
    totals: list[Node]
    stores: list[Store]


def part_groups(totals: list[Node], stores: list[Store]) -> list[PartGroup]:
    groups: dict[tuple, PartGroup] = {}
    for t in totals:
        key = (t.attrs["atoms"], t.attrs["over"])
        groups.setdefault(key, PartGroup(key[0], key[1], [], [])).totals.append(t)
    for s in stores:
        mine = [g for g in groups.values() if any(_reads(s.value, t) for t in g.totals)]
        if len(mine) != 1:
            raise AssertionError(f"part store {s.field}: computed from {len(mine)} groups of part totals")
        mine[0].stores.append(s)
    return list(groups.values())


def _reads(root: Node, target: Node) -> bool:
    stack, seen = [root], set()
    while stack:
        n = stack.pop()
        if n is target:
            return True
        if n.id in seen:
            continue
        seen.add(n.id)
        stack.extend(n.args)
    return False


class PartWriter:
    """The kernels and launch statements of an AxisEmitter's part groups."""

    def __init__(self, em):
        self.em = em
        lay = em.lay
        self.atoms = list(lay.lead + lay.block + lay.inner)  # S's atoms (Dims), in order
        self.kept = [a for a in range(len(self.atoms)) if a not in lay.red_axes]

    # ------------------------------------------------------------ geometry
    def space(self, g: PartGroup) -> list[int]:
        return list(range(len(self.atoms))) if g.over == "elem" else self.kept

    def prod(self, idx) -> str:
        return " * ".join(dim_expr(self.atoms[a]) for a in idx) or "(int64_t)1"

    def stride(self, g: PartGroup, a: int) -> str:
        space = self.space(g)
        return self.prod(space[space.index(a) + 1:])

    def inner_run(self, g: PartGroup) -> list[int]:
        """The summed atoms after the last output atom: contiguous in the space."""
        space = self.space(g)
        return space[space.index(max(g.atoms)) + 1:]

    def outer(self, g: PartGroup) -> list[int]:
        """The summed atoms before the last output atom."""
        space = self.space(g)
        last = space.index(max(g.atoms))
        return [a for a in space[:last] if a not in g.atoms]

    def summed(self, g: PartGroup) -> list[int]:
        return [a for a in self.space(g) if a not in g.atoms]

    def geometry(self, q: int, g: PartGroup) -> list[str]:
        """The launcher's KP, M, RIN and the split (GS, chunk) of group q."""
        return [f"const int64_t KP{q} = {self.prod(g.atoms)}, M{q} = {self.prod(self.summed(g))}, "
                f"RIN{q} = {self.prod(self.inner_run(g))};",
                f"int64_t GS{q} = 1;",
                f"if (KP{q} > 0 && KP{q} < {TARGET_BLOCKS}) {{ GS{q} = ({TARGET_BLOCKS} + KP{q} - 1) / KP{q}; "
                f"const int64_t most = (M{q} + {BLOCK * MIN_STEPS - 1}) / {BLOCK * MIN_STEPS}; "
                f"if (GS{q} > most) GS{q} = most; if (GS{q} > 65535) GS{q} = 65535; if (GS{q} < 1) GS{q} = 1; }}",
                f"const int64_t chunk{q} = M{q} > 0 ? (M{q} + GS{q} - 1) / GS{q} : 1;",
                f"GS{q} = M{q} > 0 ? (M{q} + chunk{q} - 1) / chunk{q} : 1;"]

    def launch_geometry(self, base_slots: str) -> list[str]:
        """Every group's geometry and the workspace slots (8 bytes each) of their partials,
        after `base_slots`: poff{q} where group q's start, parts_end where they end."""
        lines = [f"const size_t poff0 = {base_slots};"]
        for q, g in enumerate(self.em.part_groups):
            lines += self.geometry(q, g)
            lines.append(f"const size_t poff{q + 1} = poff{q} + (GS{q} > 1 ? (size_t){len(g.totals)} * "
                         f"(size_t)GS{q} * (size_t)KP{q} : 0);")
        return lines

    def parts_end(self) -> str:
        return f"poff{len(self.em.part_groups)}"

    def any_output(self) -> str:
        return " || ".join(f"KP{q} > 0" for q in range(len(self.em.part_groups)))

    # ------------------------------------------------------------ kernels
    def write(self, w: CWriter) -> None:
        for q, g in enumerate(self.em.part_groups):
            self.write_finish(w, q, g)
            w.line()
            self.write_kernel(w, q, g)
            w.line()
            self.write_sum(w, q, g)
            w.line()

    def sums(self, g: PartGroup) -> list[str]:
        return [f"s{t}_" for t in range(len(g.totals))]

    def write_finish(self, w: CWriter, q: int, g: PartGroup) -> None:
        """Output element k of group q's stores from its totals (the epilogue)."""
        em = self.em
        params = "".join(f", typename sg::Acc<T>::type {s}" for s in self.sums(g))
        w.line("template <typename T>")
        w.line(f"__device__ __forceinline__ void {em.kname}_partfin{q}(const {em.args_t}& A, int64_t k{params})")
        with w.block():
            w.line("using acc_t = typename sg::Acc<T>::type;")
            ctx = Ctx()
            for t, s in zip(g.totals, self.sums(g)):
                ctx.names[t.id] = s
            for n in self.own_loads(g):  # a parameter over exactly the output's atoms: read at k
                # (a per-head scale's clamp gradient: grad_logit_scale = total * exp(clamped) * mask)
                ctx.loads[n.id] = arange_value(n, "k") if n.attrs.get("arange") else em.elem_load_expr(
                    n, "k", f"((const {em.ctype_of(n.attrs['field'])}*)A.{n.attrs['field']}.data)[k]")
            for n in em.closure([s.value for s in g.stores], "post"):
                if n.id not in ctx.names:
                    w.line(f"const {em.ctype_var(n)} {em.var(n)} = {em.expr(n, ctx)};")
                    ctx.names[n.id] = em.var(n)
            for s in g.stores:
                w.line(f"(({em.ctype_of(s.field)}*)A.{s.field}.data)[k] = "
                       f"{em.store_value(s.field, em.expr(s.value, ctx), s.value)};")

    def own_loads(self, g: PartGroup) -> list:
        """The part loads the stores' epilogue reads: each over exactly the group's atoms (any
        other would be a value of the summed elements, not of the output element)."""
        found, seen, stack = [], set(), [s.value for s in g.stores]
        while stack:
            n = stack.pop()
            if n.id in seen or n.op == "partreduce":
                continue
            seen.add(n.id)
            if n.op == "load" and n.level == "elem":
                if n.attrs["kind"] != "part" or tuple(n.attrs["atoms"]) != tuple(g.atoms):
                    raise AgentRefused(f"the epilogue of a part total reads {n.attrs['field']} over other atoms")
                found.append(n)
            stack.extend(n.args)
        return found

    def partial(self, q: int, t: int, index: str) -> str:
        return f"((acc_t*)((char*)ws + 8 * (poff + (size_t){t} * (size_t)GS * (size_t)KP)))[{index}]"

    def write_kernel(self, w: CWriter, q: int, g: PartGroup) -> None:
        em = self.em
        summed = ", ".join(str(self.atoms[a]) for a in self.summed(g))
        kept = ", ".join(str(self.atoms[a]) for a in g.atoms)
        w.line(f"// Part totals {q}: sums over {summed} of each "
               f"{'element' if g.over == 'elem' else 'kept element'}'s value, one per ({kept}):")
        w.line("// a block per output element k and split gs, a fixed tree; GS == 1 finishes k here.")
        w.line("template <typename T, bool NARROW>")
        w.line(f"__global__ void __launch_bounds__({BLOCK}) {em.kname}_part{q}(const {em.args_t} A, void* ws, "
               "int64_t O, int64_t R, int64_t I, int64_t GP, int64_t M, int64_t RIN, int64_t chunk, int64_t GS, "
               "size_t poff, sgx::FastDiv fr)")
        with w.block():
            w.line("using acc_t = typename sg::Acc<T>::type;")
            w.line("const int64_t K = O * I; (void)K; (void)GP; (void)R;")
            w.line("const int64_t k = blockIdx.x, gs = blockIdx.y, KP = gridDim.x;")
            w.line(f"const int64_t base = {self.base_expr(g)};")
            for line in em.rb_line():
                w.line(line)
            w.lines(f"acc_t {s} = 0;" for s in self.sums(g))
            w.line("const int64_t m_end = (gs + 1) * chunk < M ? (gs + 1) * chunk : M;")
            with w.block("for (int64_t m = gs * chunk + threadIdx.x; m < m_end; m += blockDim.x)"):
                w.line("int64_t qo;")
                w.line("if constexpr (NARROW) qo = fr.div((uint32_t)m); else qo = m / RIN;")
                w.line(f"const int64_t n0 = base + {self.outer_expr(g, 'qo')} + (m - qo * RIN);")
                self.write_position(w, g)
                self.write_values(w, g)
            w.line(f"__shared__ acc_t tree[{BLOCK}];")
            for s in self.sums(g):
                w.line(f"tree[threadIdx.x] = {s};")
                w.line("__syncthreads();")
                with w.block(f"for (int h = {BLOCK // 2}; h > 0; h >>= 1)"):
                    w.line("if ((int)threadIdx.x < h) tree[threadIdx.x] += tree[threadIdx.x + h];")
                    w.line("__syncthreads();")
                w.line(f"{s} = tree[0];")
                w.line("__syncthreads();")
            w.line("if (threadIdx.x != 0) return;")
            args = "".join(f", {s}" for s in self.sums(g))
            w.line(f"if (GS == 1) {{ {em.kname}_partfin{q}<T>(A, k{args}); return; }}")
            w.lines(f"{self.partial(q, t, 'gs * KP + k')} = {s};" for t, s in enumerate(self.sums(g)))

    def base_expr(self, g: PartGroup) -> str:
        """Output element k's offset in the space: its coordinate in each output atom."""
        terms = []
        for a in g.atoms:
            after = self.prod([b for b in g.atoms if b > a])
            terms.append(f"(k / ({after}) % {dim_expr(self.atoms[a])}) * ({self.stride(g, a)})")
        return " + ".join(terms)

    def outer_expr(self, g: PartGroup, index: str) -> str:
        """The offset of the outer summed atoms' coordinates in `index` (row-major over them)."""
        outer = self.outer(g)
        terms = []
        for a in outer:
            after = self.prod([b for b in outer if b > a])
            coord = f"({index} / ({after}))" if a == outer[0] else f"({index} / ({after}) % {dim_expr(self.atoms[a])})"
            terms.append(f"{coord} * ({self.stride(g, a)})")
        return "(" + " + ".join(terms) + ")" if terms else "0"

    def write_position(self, w: CWriter, g: PartGroup) -> None:
        """n0 as its kept element `row` and (over S) its place j along R."""
        if g.over == "row":
            w.line("const int64_t row = n0; (void)row;")
            return
        lay = self.em.lay
        if lay.ends:  # n0 = (a * O + o) * RB + b
            w.line("const int64_t b_ = n0 % RB, t_ = n0 / RB, o = t_ % O, a_ = t_ / O;")
            w.line("const int64_t row = o, j = a_ * RB + b_; (void)row; (void)j;")
        elif not lay.inner:  # I == 1
            w.line("const int64_t o = n0 / R, j = n0 - o * R, row = o; (void)row; (void)j;")
        else:  # n0 = (o * R + j) * I + i
            w.line("const int64_t o = n0 / (R * I), rem_ = n0 - o * R * I, j = rem_ / I;")
            w.line("const int64_t row = o * I + (rem_ - j * I); (void)row; (void)j;")

    def write_values(self, w: CWriter, g: PartGroup) -> None:
        em = self.em
        roots = [t.args[0] for t in g.totals]
        ctx = Ctx()
        if g.over == "elem":
            for ns in em.elem_loads.values():
                expr = em.elem_load_expr(ns[0], "n0")
                for n in ns:
                    ctx.loads[n.id] = expr
        for n in em.kept:
            ctx.names[n.id] = em.kept_name(n)
        w.lines(em.row_statements(roots, ctx))
        if g.over == "elem":
            w.lines(em.elem_statements(roots, ctx))
        w.lines(f"{s} += (acc_t)({em.expr(t.args[0], ctx)});" for t, s in zip(g.totals, self.sums(g)))

    def write_sum(self, w: CWriter, q: int, g: PartGroup) -> None:
        em = self.em
        w.line(f"// Part totals {q}, GS > 1: a thread per output element sums its splits in order, then finishes it.")
        w.line("template <typename T>")
        w.line(f"__global__ void {em.kname}_partsum{q}(const {em.args_t} A, void* ws, int64_t KP, int64_t GS, "
               "size_t poff)")
        with w.block():
            w.line("using acc_t = typename sg::Acc<T>::type;")
            with w.block("for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < KP; "
                         "k += (int64_t)gridDim.x * blockDim.x)"):
                for t, s in enumerate(self.sums(g)):
                    w.line(f"acc_t {s} = 0;")
                    w.line(f"for (int64_t gs = 0; gs < GS; ++gs) {s} += {self.partial(q, t, 'gs * KP + k')};")
                args = "".join(f", {s}" for s in self.sums(g))
                w.line(f"{em.kname}_partfin{q}<T>(A, k{args});")

    def write_launches(self, w: CWriter) -> None:
        for q, g in enumerate(self.em.part_groups):
            w.line(f"// part totals {q}: a block per (output element, split), then the splits' sum")
            with w.block(f"if (KP{q} > 0)"):
                w.line(f"const sgx::FastDiv fr{q}(RIN{q});")
                launch = (f"<<<dim3((unsigned)KP{q}, (unsigned)GS{q}), {BLOCK}, 0, stream>>>(args, ws, O, R, I, GP, "
                          f"M{q}, RIN{q}, chunk{q}, GS{q}, poff{q}, fr{q});")
                w.line(f"if (M{q} < ((int64_t)1 << 31)) {self.em.kname}_part{q}<T, true>{launch}")
                w.line(f"else {self.em.kname}_part{q}<T, false>{launch}")
                with w.block(f"if (GS{q} > 1)"):
                    w.line(f"const int64_t pb = (KP{q} + 255) / 256;")
                    w.line(f"{self.em.kname}_partsum{q}<T><<<(unsigned)(pb < 65535 ? pb : 65535), 256, 0, stream>>>"
                           f"(args, ws, KP{q}, GS{q}, poff{q});")
