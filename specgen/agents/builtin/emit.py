"""Emit CUDA for row programs: one .cu per spec, both directions, every dtype.

Per direction: a row kernel `template <T, VEC, TPR, ITEMS>` (TPR threads per row, VEC
elements per 16-byte access, ITEMS vector chunks per thread held in registers, or
ITEMS == 0 for a looped pass that re-reads very wide rows), an optional finalize kernel
for reductions over rows (deterministic: per-slot partials, then a fixed-order sum), and
a host entry point that dispatches on the dtype and picks the schedule from the width.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, NamedTuple

from ... import abi
from .ctext import C_TYPES, Ctx, _float_literal, dim_expr, piece_index, pitch_expr, rows_piece_index
from .cwriter import UNIT, CWriter
from .emit_finalize import FinalizeEmitter
from .emit_host import HostEmitter
from .emit_pretotal import PretotalEmitter
from .ir import Node, Program, Store, reciprocal_is_normal
from .ops import OPS
from .optimize import mark_fused_pairs
from .prelude import PRELUDE, PRELUDE_MOMENTS, with_optional_preludes
from .schedule import DEFAULT_VARIANT, Variant

REDUCE_INIT = {"sum": "(acc_t)0", "max": "(acc_t)(-INFINITY)", "min": "(acc_t)INFINITY"}
REDUCE_OP = {"sum": "sg::Sum()", "max": "sg::Max()", "min": "sg::Min()"}  # combiners of sg::group_reduce


# The row kernel's passes keep the layout they had before CWriter, as committed kernels carry
# its bytes (changing them means re-verifying those kernels on the GPU): a pass sits at
# PASS_LEVEL whatever encloses it (`pass_level`), some of its blocks keep their bodies at their
# braces' depth (`unindented`), and the streamed sweep's chunk loop closes one level out.
PASS_LEVEL = 3  # one level inside the row loop's body


@contextmanager
def pass_level(w: CWriter) -> Iterator[None]:
    """Write at PASS_LEVEL, then back at the writer's own level."""
    level, w.level = w.level, PASS_LEVEL
    try:
        yield
    finally:
        w.level = level


@contextmanager
def unindented(w: CWriter, opened) -> Iterator[None]:
    """`opened` (a `w.block` or `w.chain`) with its body at the braces' depth, not one deeper."""
    with opened:
        w.level -= 1
        try:
            yield
        finally:
            w.level += 1


class Sweep(NamedTuple):
    """One pass's parts, shared by its sweeps (in registers, streamed)."""
    consumers: list[tuple]  # (kind, node, accumulator): see write_pass
    ctx_row: Ctx
    stores: list[Store]
    col_nodes: list[Node]
    roots: list[Node]  # the elem values the pass needs
    loads: list[tuple]  # (load key, nodes) of the elem loads it reads
    chained: list[str]  # streamed sums kept as a partial per chunk in flight
    kahan: bool


def div_per_row(x: str, d: str, guarded: bool = True) -> str:
    """C for x / d with d the same for a whole row (or launch): a multiply by 1/d, one reciprocal
    per row (the compiler hoists it), instead of an IEEE division per element (<= 1.5 ulp apart),
    where 1/d is a normal float; the division itself where it is not: |d| < 2^-126 (a row
    norm or sum of a lone subnormal: 1/d is inf, and x * inf was inf where x / d is +-1) or
    |d| > 2^126 (1/d subnormal, bits lost). d = 0, inf or NaN divide alike either way. The
    float limits serve double too (a double 1/d outside them only takes the exact division).
    The product is sg::mul_rn (prelude.PRELUDE_MUL_RN): never contracted into an FMA with an add
    that follows, so a quotient that cancels exactly (x / 3 + 0.5 at x = -1.5) stays 0."""
    r = f"((acc_t)1 / (acc_t)({d}))"
    if not guarded:  # 1/d is normal whenever finite (ir.reciprocal_is_normal): the multiply alone
        return f"sg::mul_rn((acc_t)({x}), {r})"
    return (f"((fabs({r}) >= (acc_t)1.17549435e-38f && fabs({r}) <= (acc_t)3.40282347e+38f) "
            f"? sg::mul_rn((acc_t)({x}), {r}) : (acc_t)({x}) / (acc_t)({d}))")


class DirectionEmitter(HostEmitter, FinalizeEmitter, PretotalEmitter):
    """One direction of a spec: its row kernel here, the finalize, host and prologue code in the mixins."""

    def __init__(self, spec, program: Program, direction: str, variant: Variant = DEFAULT_VARIANT):
        self.spec = spec
        self.p = program
        self.direction = direction
        self.args_t = abi.struct_name(spec, direction)
        self.kname = f"{spec.name}_{'fwd' if direction == 'forward' else 'bwd'}"
        mark_fused_pairs(program)  # the fused patterns the row kernel takes together (idempotent)
        self.nodes = program.nodes()
        self.by_id = {n.id: n for n in self.nodes}
        # Names count from 0 in program order, not from the process-wide node counter, so the
        # same spec gives the same source byte for byte in any process (kernels are committed).
        self.local_ids = {n.id: i for i, n in enumerate(self.nodes)}
        self.types = {f.name: f.tensor for f in abi.fields(spec, direction) if f.is_tensor}
        self.elem_loads = self._unique_loads()
        self.colreduces = [n for n in self.nodes if n.op == "colreduce"]
        self.variant = variant
        self.col_smem = variant.col_smem and bool(self.colreduces)
        self.globalreduces = [n for n in self.nodes if n.op == "globalreduce"]
        self.pretotals = [n for n in self.nodes if n.op == "pretotal"]  # sums before the row pass
        self.users: dict[int, list[Node]] = {}
        for n in self.nodes:
            for a in n.args:
                self.users.setdefault(a.id, []).append(n)

    # ------------------------------------------------------------ naming
    def var(self, node: Node) -> str:
        base = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in (node.name or node.op))
        local = self.local_ids.setdefault(node.id, len(self.local_ids))
        return f"{base}_{local}"

    def ctype_of(self, fld: str) -> str:
        t = self.types[fld]
        return "T" if t.dtype is None else C_TYPES[t.dtype]

    def load_key(self, n: Node):
        off = n.attrs.get("offset")
        piece = n.attrs.get("rows_piece")  # piece k of n along a row dim: a load of its own
        return (n.attrs["field"], n.attrs["kind"], self.expr(off, Ctx()) if off is not None else "0",
                tuple(str(d) for d in n.attrs.get("row_div", [])) + ((f"piece {piece}",) if piece else ()))

    def _unique_loads(self) -> dict:
        """Elem/col loads, shared when they read the same tensor at the same offset."""
        found: dict = {}
        for n in self.nodes:
            if n.op == "load" and n.level == "elem":
                found.setdefault(self.load_key(n), []).append(n)
        return found

    # ------------------------------------------------------------ expressions
    def expr(self, node: Node, ctx: Ctx) -> str:
        if node.id in ctx.names:
            return ctx.names[node.id]
        if node.id in ctx.loads:
            return ctx.loads[node.id]
        op, a = node.op, node.attrs
        if op == "const":
            v = a["value"]
            if node.dtype == "bool":
                return "true" if v else "false"
            if node.dtype == "int":
                return f"(int64_t){int(v)}"
            return _float_literal(v)
        if op == "scalar":
            return f"(acc_t)A.{a['field']}"
        if op == "dim":
            return dim_expr(a["dim"])
        if op == "iota":
            return "j"
        if op == "rowiota":  # the row's index along row dim `axis` (row dims after it: a span each)
            dims = self.p.row_dims
            span = " * ".join(dim_expr(d) for d in dims[a["axis"] + 1:]) or "1"
            return f"((row / ({span})) % {dim_expr(dims[a['axis']])})"
        if op == "pretotal":
            return self.pretotal_expr(node)
        if op == "load" and a["kind"] == "global":
            return f"(acc_t)sg::to_acc(*(const {self.ctype_of(a['field'])}*)A.{a['field']}.data)"
        if op == "load" and a["kind"] in ("row", "colpick", "piece"):  # one value per row, at its index
            if a["kind"] == "row":  # a per-row piece ([B, 2C] read as rows [B, C]) at its rows of the field
                index = rows_piece_index(a["rows_piece"], self.p.row_dims) if a.get("rows_piece") \
                    else self.row_index(a["row_div"])
            elif a["kind"] == "colpick":  # column k of a row (a box's coordinate of [N, 4])
                index = f"{self.row_index(a['row_div'])} * {pitch_expr(self.p, self.types[a['field']])} + {a['col']}"
            else:  # the axis family: position k of n along a dim
                index = piece_index(a["field"], a["piece"])
            conv = "(acc_t)sg::to_acc" if node.dtype == "float" else "(int64_t)"
            return f"{conv}(((const {self.ctype_of(a['field'])}*)A.{a['field']}.data)[{index}])"
        args = [self.expr(x, ctx) for x in node.args]
        return self.op_expr(node, args)

    def op_expr(self, node: Node, x: list[str]) -> str:
        """C for an elementwise node over operand texts `x`: ops.py's template, or the rule of an op
        whose C depends on its node (div, floordiv, pow, cast)."""
        op = node.op
        if op == "mul" and node.dtype == "float" and self.shifted_by_its_max(node):
            # softmax(x * scale): x * scale - max(x * scale) contracted into fma(x, scale, -max) is the
            # exact product minus the rounded one: at huge values +-1e30, so exp gave inf or 0 where the
            # max's own element should give 1 (size_scaled_softmax at bfloat16 `huge`, the H200,
            # session 37). The product rounded once (never contracted) is the value the max saw.
            return f"sg::mul_rn((acc_t)({x[0]}), (acc_t)({x[1]}))"
        template = OPS[op].c if op in OPS else None
        if template is not None:
            return template.format(*x)
        if op == "div":
            if node.dtype == "int":
                return f"({x[0]} / {x[1]})"
            if node.level == "elem" and node.args[1].level in ("const", "global", "row"):
                return div_per_row(x[0], x[1], guarded=not reciprocal_is_normal(node.args[1]))
            return f"((acc_t)({x[0]}) / (acc_t)({x[1]}))"
        if op == "floordiv":
            return f"({x[0]} / {x[1]})"  # sizes: non-negative
        if op == "remainder":  # Python's %: C's remainder moved to the divisor's sign (torch.remainder)
            a, b = (x[0], x[1]) if node.dtype == "int" else (f"(acc_t)({x[0]})", f"(acc_t)({x[1]})")
            r = f"({a} % {b})" if node.dtype == "int" else f"fmod({a}, {b})"
            return f"({r} + (({r} != 0 && (({r} < 0) != ({b} < 0))) ? {b} : ({b}) * 0))"
        if op == "pow":
            exponent = node.args[1]
            if exponent.op == "const" and exponent.attrs["value"] in (2, 2.0):
                return f"({x[0]} * {x[0]})"
            if exponent.op == "const" and exponent.attrs["value"] in (3, 3.0):
                return f"({x[0]} * {x[0]} * {x[0]})"
            return f"sg::pow_((acc_t)({x[0]}), (acc_t)({x[1]}))"
        if op == "cast":
            return {"float": f"(acc_t)({x[0]})", "int": f"(int64_t)({x[0]})", "bool": f"(({x[0]}) != 0)"}[
                node.dtype]
        raise AssertionError(f"emit: no expression for {op}")

    def ctype_var(self, node: Node) -> str:
        return {"float": "acc_t", "int": "int64_t", "bool": "bool"}[node.dtype]

    def shifted_by_its_max(self, node: Node) -> bool:
        """An elem value a row max (or min) reduces: the softmax shift subtracts that max from it."""
        users = getattr(self, "users", {}).get(node.id, [])
        return node.level == "elem" and any(u.op == "rowreduce" and u.attrs.get("kind") in ("max", "min")
                                            for u in users)

    def row_index(self, row_div) -> str:
        if not row_div:
            return "row"
        span = " * ".join(dim_expr(d) for d in row_div)
        return f"(row / ({span}))"

    # ------------------------------------------------------------ scopes
    def closure(self, roots: list[Node], level: str) -> list[Node]:
        """Nodes of `level` needed by `roots`, in topo order. Reductions are boundaries:
        their results are values of the enclosing scope, not recomputed."""
        boundary = ("rowreduce", "gather", "colreduce", "globalreduce", "pretotal")
        want: set[int] = set()
        stack = list(roots)
        while stack:
            n = stack.pop()
            if n.id in want or n.level != level or n.op in boundary:
                continue
            want.add(n.id)
            stack.extend(n.args)
        return [n for n in self.nodes if n.id in want]

    def elem_statements(self, roots: list[Node], ctx: Ctx) -> list[str]:
        """Statements naming the elem values `roots` need (those ctx does not name yet), in topo order."""
        lines = []
        for n in self.closure(roots, "elem"):
            if n.op == "load" or n.op == "iota":
                continue
            if n.id in ctx.names:
                continue
            name = self.var(n)
            lines.append(f"const {self.ctype_var(n)} {name} = {self.expr(n, ctx)};")
            ctx.names[n.id] = name
        return lines

    # ------------------------------------------------------------ the row kernel
    def pointer_name(self, key) -> str:
        fld, kind, off, div = key
        index = list(self.elem_loads).index(key)
        return f"p_{fld}_{index}"

    def load_ref(self, node: Node, raw: str) -> str:
        """An elem load read from its raw register copy, widened to the math type."""
        if node.dtype == "float":
            return f"(acc_t)sg::to_acc({raw}.v[v])"
        return f"({self.ctype_var(node)})({raw}.v[v])"

    def raw_type(self, key) -> str:
        return f"sg::Raw<{self.ctype_of(key[0])}, VEC>"

    def write_pass(self, w: CWriter, consumers: list[tuple], ctx_row: Ctx, stores: list[Store],
                   col_nodes: list[Node], modes: tuple = ("reg", "loop")) -> None:
        """One sweep over the row's columns. consumers: (kind, node, accumulator) with kind
        sum|max|min (row reductions) or online (node: the max's operand, accumulator: the
        (max, sum) pair). Elem stores and col reductions are done in the final pass.
        mode reg: the row is in registers (ITEMS > 0); loop: it is streamed again; both: the
        two, chosen by ITEMS."""
        roots = [n.args[0] if kind != "online" else n for kind, n, _ in consumers] + [s.value for s in stores] \
            + [c.args[0] for c in col_nodes]
        needed = {n.id for n in self.closure(roots, "elem")}
        loads = [(key, ns) for key, ns in self.elem_loads.items() if any(x.id in needed for x in ns)]
        # the `chains` and `kahan` variants: a streamed row's float sums keep one partial per chunk
        # in flight (shorter sequential chains), `kahan` each compensated: float32 sums of wide
        # rows as precise as torch's pairwise ones (nvcc keeps IEEE order without fast math)
        chained = [acc for kind, n, acc in consumers if kind == "sum" and self.acc_type(n) == "acc_t"] \
            if self.variant.loop_sums != "plain" else []
        sweep = Sweep(consumers, ctx_row, stores, col_nodes, roots, loads, chained, self.variant.loop_sums == "kahan")
        with pass_level(w):  # wherever it is called from (the layout committed kernels carry)
            if modes == ("reg",):
                self.write_reg_sweep(w, sweep)
            elif modes == ("loop",):
                self.write_loop_sweep(w, sweep)
            else:
                with unindented(w, w.block("if constexpr (ITEMS > 0)")):
                    self.write_reg_sweep(w, sweep)
                with unindented(w, w.chain("else")):
                    self.write_loop_sweep(w, sweep)

    def write_reg_sweep(self, w: CWriter, sweep: Sweep) -> None:
        """The row in registers: this thread's chunks k, held raw in r_<pointer>[k]."""
        w.line("#pragma unroll")
        with w.block("for (int k = 0; k < ITEMS; ++k)"):
            self.write_chunk(w, sweep, "reg", "(int64_t)k * TPR + lane", "r_{}[k]")

    def write_loop_sweep(self, w: CWriter, sweep: Sweep) -> None:
        """The row streamed again: UNROLL chunks per thread loaded before any is used (several
        16-byte loads in flight per thread even though the row is streamed), then each consumed."""
        for acc in sweep.chained:
            w.line(f"acc_t {acc}_c[UNROLL];  // a sum per chunk in flight: chains UNROLL times shorter")
            w.line(f"for (int u = 0; u < UNROLL; ++u) {acc}_c[u] = (acc_t)0;")
            if sweep.kahan:
                w.line(f"acc_t {acc}_k[UNROLL];  // each partial's compensation (Kahan)")
                w.line(f"for (int u = 0; u < UNROLL; ++u) {acc}_k[u] = (acc_t)0;")
        with w.block("for (int64_t c0 = lane; c0 * VEC < W; c0 += (int64_t)UNROLL * TPR)"):
            w.lines(f"{self.raw_type(key)} l_{self.pointer_name(key)}[UNROLL];" for key, _ in sweep.loads)
            self.write_chunk_loads(w, "for (int u = 0; u < UNROLL; ++u)", "c0 + (int64_t)u * TPR",
                                   [(self.pointer_name(key), f"l_{self.pointer_name(key)}[u]") for key, _ in sweep.loads],
                                   staged={self.pointer_name(key) for key in self.staged_keys()})
            w.line("#pragma unroll")
            # this loop's body at its own depth, its `}` one level out: committed kernels carry these bytes
            w.verbatim(w.indent + "for (int u = 0; u < UNROLL; ++u) {")
            self.write_chunk(w, sweep, "loop", "c0 + (int64_t)u * TPR", "l_{}[u]")
            w.verbatim(UNIT * (w.level - 1) + "}")
        w.lines(f"for (int u = 0; u < UNROLL; ++u) {acc} += {acc}_c[u];" for acc in sweep.chained)

    def write_chunk_loads(self, w: CWriter, loop: str, position: str, targets: list[tuple[str, str]],
                          staged: set = frozenset()) -> None:
        """Raw 16-byte loads of this thread's chunks (`loop` over them, chunk c at `position`),
        each (pointer, register) of `targets`, all issued before any is used; the `staged`
        pointers read from a looped cluster's shared memory (write_stage_row) in that instantiation."""
        w.line("#pragma unroll")
        with w.block(loop):
            w.line(f"const int64_t c = {position};")
            with w.block("if (c * VEC < W)"):
                w.lines(f"if constexpr (TPR > BLOCK) {dst} = s_{pn}[(c / TPR) * BLOCK + threadIdx.x]; "
                        f"else sg::load_raw<VEC>({pn} + c * VEC, {dst});" if pn in staged else
                        f"sg::load_raw<VEC>({pn} + c * VEC, {dst});" for pn, dst in targets)

    def write_chunk(self, w: CWriter, sweep: Sweep, mode: str, position: str, slot: str) -> None:
        """Chunk c (VEC elements at `position`) of the row: its raw loads read from `slot`
        (a register array, `{}` the pointer's name), its elements, then what the chunk feeds at
        once (the online pair, medium rows' shared column partials, the stores)."""
        w.line(f"const int64_t c = {position};")
        with unindented(w, w.block("if (c * VEC < W)")):
            w.lines(f"acc_t st_{i}[VEC];" for i, _ in enumerate(sweep.stores))
            onlines = [(n, acc) for kind, n, acc in sweep.consumers if kind == "online"]
            w.lines(f"acc_t on_{i}[VEC];  // the chunk, fed to the online (max, sum) at once"
                    for i, _ in enumerate(onlines))
            col_smem = mode == "reg" and self.col_smem
            if col_smem:
                w.lines(f"acc_t ccl_{i}[VEC];  // this chunk's column terms (medium rows)"
                        for i, _ in enumerate(sweep.col_nodes))
            raws = {}
            for key, _ in sweep.loads:
                pn = self.pointer_name(key)
                raws[key] = slot.format(pn)
                if mode == "reg" and key not in self.held_loads():  # a [W] parameter: read at use (L1)
                    raws[key] = f"lz_{pn}"
                    w.line(f"{self.raw_type(key)} lz_{pn}; sg::load_raw<VEC>({pn} + c * VEC, lz_{pn});")
            w.line("#pragma unroll")
            with w.block("for (int v = 0; v < VEC; ++v)"):
                self.write_element(w, sweep, mode, raws, onlines)
            w.lines(f"sg::online_add_vec<T, VEC>({acc[0]}, {acc[1]}, on_{i});" for i, (_, acc) in enumerate(onlines))
            if col_smem:
                w.lines(f"if constexpr (TPR > 32) sg::smem_add_vec<VEC>(csm + {i} * W + c * VEC, ccl_{i});"
                        for i, _ in enumerate(sweep.col_nodes))
            w.lines(f"sg::store_vec<VEC>(o_{i} + c * VEC, st_{i});" for i, _ in enumerate(sweep.stores))

    def write_element(self, w: CWriter, sweep: Sweep, mode: str, raws: dict, onlines: list[tuple]) -> None:
        """Element v of the chunk: its values, then its terms into the reductions, stores and column partials."""
        w.line("const int64_t j = c * VEC + v; (void)j;")
        ctx = Ctx(dict(sweep.ctx_row.names))
        for key, ns in sweep.loads:
            for n in ns:
                ctx.loads[n.id] = self.load_ref(n, raws[key])
        w.lines(self.elem_statements(sweep.roots, ctx))
        w.lines(f"on_{i}[v] = (acc_t)({self.expr(n, ctx)});" for i, (n, _) in enumerate(onlines))
        for kind, n, acc in sweep.consumers:
            if kind != "online":
                w.line(self.accumulate(sweep, mode, kind, acc, self.expr(n.args[0], ctx)))
        w.lines(f"st_{i}[v] = (acc_t)({self.expr(s.value, ctx)});" for i, s in enumerate(sweep.stores))
        for i, c in enumerate(sweep.col_nodes):
            val = self.expr(c.args[0], ctx)
            if mode == "reg" and self.col_smem:
                w.line(f"if constexpr (TPR > 32) ccl_{i}[v] = {val}; else cacc_{i}[k][v] += {val};")
            elif mode == "reg":
                w.line(f"cacc_{i}[k][v] += {val};")
            else:
                w.line(f"cpart_{i}[c * VEC + v] += {val};")

    def accumulate(self, sweep: Sweep, mode: str, kind: str, acc: str, val: str) -> str:
        """The statement adding one element's `val` into reduction `acc` (a streamed sum of the
        `chains` and `kahan` variants: into this chunk's partial)."""
        chained = kind == "sum" and mode == "loop" and acc in sweep.chained
        if chained and sweep.kahan:
            return (f"{{ const acc_t y_ = ({val}) - {acc}_k[u]; const acc_t t_ = {acc}_c[u] + y_; "
                    f"{acc}_k[u] = (t_ - {acc}_c[u]) - y_; {acc}_c[u] = t_; }}")
        if chained:
            return f"{acc}_c[u] += {val};"
        if kind == "sum":
            return f"{acc} += {val};"
        return f"{acc} = sg::{kind}_({acc}, (acc_t)({val}));"

    def moments_partner(self, batch: list[Node], pending: list[Node]):
        """(sum, sum of squared deviations, mean) of one row: s1 = sum(x) in `batch` and a pending
        s2 = sum((x - s1 / W)^2) (LayerNorm's mean and variance), or None; the pattern is matched
        by optimize.mark_fused_pairs. A row in registers takes them in one merge round (each
        thread's exact moments, Chan's combination)."""
        for s1 in batch:
            for s2 in pending:
                if s2.op == "rowreduce" and s2.attrs.get("moments_of") == s1.id:
                    return s1, s2, self.by_id[s2.attrs["moments_mean"]]
        return None

    def centering_sums(self) -> set[int]:
        """Ids of the row sums whose mean is subtracted from the row before a second sum (LayerNorm's
        sum(x) before sum((x - mean)^2); optimize.mark_fused_pairs marks them). Outside the `moments`
        variant they accumulate in double: a float32 sum of an uncentred row (features 20-60 times
        their spread away from 0) errs by ulps of the whole sum, and that mean's error, through
        LayerNorm's weight and GELU's curvature, took a float32 backward past the verifier's
        tolerance (verifier version 13's offset values, session 39: 1 element of grad_bias at
        0.55% on the H100). Doubles cost the memory-bound row nothing on sm_90's FP64 units."""
        if self.variant.moments:
            return set()
        return {n.attrs["moments_of"] for n in self.nodes if n.op == "rowreduce" and "moments_of" in n.attrs}

    def acc_type(self, node: Node) -> str:
        """The C type of a row reduction's accumulator: acc_t, or double for a centering sum."""
        return "double" if node.id in self.centering_sums() else "acc_t"

    def has_moments(self) -> bool:
        rows = [n for n in self.nodes if n.op == "rowreduce"]
        return any(self.moments_partner([n], rows) is not None for n in rows)

    def write_moments(self, w: CWriter, moments, batch: list[Node], pass_no: int, ctx: Ctx) -> list[Node]:
        """A row's sum and sum of squared deviations from its mean. In registers: this thread's
        sum and count, its exact local mean, its sum of squared deviations from that, then one
        merge round (sg::group_moments) instead of a reduction of the sum, the mean, a second
        sweep and a second reduction. Streamed: the two sweeps. Returns the nodes computed."""
        s1, s2, mean = moments
        v1, v2 = self.var(s1), self.var(s2)
        others = [(n.attrs["kind"], n, self.var(n)) for n in batch if n is not s1]
        with_others = "".join(f", {kind}" for kind, _, _ in others)
        w.line(f"// pass {pass_no}: sum and squared deviations from the mean{with_others} over the row")
        w.lines(f"acc_t {acc} = {REDUCE_INIT[kind]};" for kind, n, acc in [("sum", s1, v1), ("sum", s2, v2)] + others)
        local = Ctx(dict(ctx.names), dict(ctx.loads))
        local.names[mean.id] = "wmean"
        with w.block("if constexpr (ITEMS > 0)", comment="in registers: this thread's exact moments, one round"):
            w.line("acc_t wn = 0;")
            w.line("for (int k = 0; k < ITEMS; ++k) if (((int64_t)k * TPR + lane) * VEC < W) wn += (acc_t)VEC;")
            self.write_pass(w, [("sum", s1, v1)] + others, ctx, [], [], modes=("reg",))
            w.line(f"const acc_t wmean = wn > (acc_t)0 ? {v1} / wn : (acc_t)0;")
            self.write_pass(w, [("sum", s2, v2)], local, [], [], modes=("reg",))
            w.line(f"sg::group_moments<TPR, BLOCK>(wn, {v1}, {v2}, moments_smem);")
            self.write_group_reductions(w, others)
        with w.chain("else", comment="streamed: the sum, then the squared deviations from the row's mean"):
            self.write_pass(w, [("sum", s1, v1)] + others, ctx, [], [], modes=("loop",))
            self.write_group_reductions(w, [("sum", s1, v1)] + others)
            w.line(f"const acc_t wmean = {self.op_expr(mean, [v1, self.expr(mean.args[1], ctx)])};")
            self.write_pass(w, [("sum", s2, v2)], local, [], [], modes=("loop",))
            self.write_group_reductions(w, [("sum", s2, v2)])
        return [s1, s2] + [n for n in batch if n is not s1]

    def online_partner(self, batch: list[Node], pending: list[Node]) -> tuple[Node, Node] | None:
        """(max(a), sum(exp(a - max))) that can share one online pass: a max in `batch` and its
        pending partner (softmax, log-softmax, logsumexp, cross-entropy; matched by
        optimize.mark_fused_pairs), or None. The other reductions of the batch (cross-entropy
        backward's sum over the target column) ride along in the same pass."""
        for m in batch:
            for n in pending:
                if n.op == "rowreduce" and n.attrs.get("online_max") == m.id:
                    return m, n
        return None

    def emit_row_kernel(self) -> str:
        w = CWriter()
        self.write_row_signature(w)
        with w.block():
            self.write_row_setup(w)
            ctx = Ctx()
            for n in self.nodes:
                if n.level == "global" and n.op not in ("dim", "stride"):
                    name = self.var(n)
                    w.line(f"const {self.ctype_var(n)} {name} = {self.expr(n, ctx)};")
                    ctx.names[n.id] = name
            self.write_column_partials_setup(w)
            w.lines(f"acc_t gacc_{i} = 0;" for i, _ in enumerate(self.globalreduces))
            w.line("// Rows of this group: [blockIdx.y * rows_per_group, +rows_per_group), strided over blocks.")
            with w.block("for (int64_t local = bx * rpb + rg; local < rows_per_group; local += nbx * rpb)"):
                self.write_row(w, ctx)
            if self.colreduces:
                self.write_column_partials_out(w)
            if self.finalizes_in_cluster(self.variant):
                self.write_cluster_finalize(w, ctx)
            for i, g in enumerate(self.globalreduces):
                base = f"{len(self.colreduces)} * cslots * W + " if self.colreduces else ""
                w.line(f"if (lane == 0) partials[{base}{i} * slots + slot] = (float)gacc_{i};")
        return w.text()

    def write_row_signature(self, w: CWriter) -> None:
        variant = self.variant
        w.line(f"// One row group of TPR threads per row; {self.describe_rows()}. BLOCK threads per block;")
        w.line(f"// __launch_bounds__ keeps >= {variant.min_threads} threads resident per SM (a register cap).")
        few_flag = ", bool FEW = false" if self.few_pair_own(variant) else ""
        w.line(f"template <typename T, int VEC, int TPR, int ITEMS, int BLOCK{few_flag}>")
        min_blocks = (f"sg::min_blocks(BLOCK, {variant.min_threads}, {self.words_per_item_expr(not self.col_smem)}, "
                      f"{variant.data_regs})")
        if variant.loop_cluster > 1:  # a looped cluster's block (TPR > BLOCK, ITEMS == 0): no register cap; a
            # staged one is alone on its SM, and the cap spilled (a review of loopstage, session 36)
            min_blocks = f"(TPR > BLOCK && ITEMS == 0) ? 1 : {min_blocks}"
        w.line(f"__global__ void __launch_bounds__(BLOCK, {min_blocks})")
        w.line(f"{self.kname}_rows(const {self.args_t} A, float* __restrict__ partials, int64_t rows_per_group)")

    def write_row_setup(self, w: CWriter) -> None:
        """The kernel's constants: the looped pass's unroll, the reduction scratch, the row width,
        and this thread's place (lane in its row group, the row group, its partials' slot)."""
        variant = self.variant
        w.line("using acc_t = typename sg::Acc<T>::type;")
        loads_words = " + ".join(f"(VEC * (int)sizeof({self.ctype_of(key[0])}) + 3) / 4" for key in self.elem_loads) or "1"
        w.line("// looped pass: chunks in flight per thread, within 8 registers of raw loads (no spills)")
        w.line(f"constexpr int UNROLL = sg::items_max(8, {loads_words}, {variant.loop_unroll});")
        w.line("__shared__ acc_t red_smem[66];  // one value per warp (33), or a (max, sum) pair (66)")
        if variant.moments and self.has_moments():
            w.line("__shared__ acc_t moments_smem[99];  // (count, sum, squared deviations) per warp")
        if self.centering_sums():
            w.line("__shared__ double red_smem_d[33];  // the centering sums' warp values (double)")
            w.line("(void)red_smem_d;")
        w.line("(void)red_smem; (void)partials;")
        w.lines(self.pretotal_view())
        w.line(f"const int64_t W = {self.expr(self.p.width, Ctx())};")
        self.write_stage_setup(w)
        w.line("// CL > 1: a split row, over a cluster of CL blocks (block bx of nbx along x)")
        w.line("constexpr int CL = TPR > BLOCK ? TPR / BLOCK : 1;")
        w.line("const int lane = CL > 1 ? (int)(blockIdx.x % CL) * BLOCK + (int)threadIdx.x "
               ": (int)(threadIdx.x % TPR);")
        w.line("const int rg = CL > 1 ? 0 : (int)(threadIdx.x / TPR);")
        w.line("const int rpb = CL > 1 ? 1 : (int)(blockDim.x / TPR);")
        w.line("const int64_t bx = blockIdx.x / CL, nbx = gridDim.x / CL;")
        w.line("const int64_t slot = ((int64_t)blockIdx.y * nbx + bx) * rpb + rg;")
        w.line("const int64_t slots = nbx * gridDim.y * rpb; (void)slots; (void)slot;")

    def write_stage_setup(self, w: CWriter) -> None:
        """A staged looped cluster's shared memory: per staged load, SJ chunks of each of the
        block's threads (thread tid's chunk j at j * BLOCK + tid: its own, so no barrier)."""
        staged = self.staged_keys()
        if not staged:
            return
        w.line("// a looped cluster's row staged in shared memory (the instantiation TPR > BLOCK, ITEMS == 0)")
        w.line("extern __shared__ __align__(16) unsigned char sg_stage[];")
        w.line("const int64_t SJ = (W / VEC + TPR - 1) / TPR;  // chunks a thread stages")
        w.line("size_t stage_at = 0; (void)stage_at;")
        for key in staged:
            raw, pn = self.raw_type(key), self.pointer_name(key)
            w.line(f"{raw}* s_{pn} = reinterpret_cast<{raw}*>(sg_stage + stage_at); (void)s_{pn};")
            w.line(f"stage_at += (size_t)SJ * BLOCK * ((sizeof({raw}) + 15) / 16 * 16);")

    def write_stage_row(self, w: CWriter) -> None:
        """The staging sweep of a looped cluster's row: this thread's chunks, read from HBM once."""
        staged = self.staged_keys()
        if not staged:
            return
        w.line("// a looped cluster stages the row once: each sweep below reads shared memory, not HBM")
        with w.block("if constexpr (ITEMS == 0 && TPR > BLOCK)"):
            with w.block("for (int64_t c0 = lane; c0 * VEC < W; c0 += (int64_t)UNROLL * TPR)"):
                w.lines(f"{self.raw_type(key)} l_{self.pointer_name(key)}[UNROLL];" for key in staged)
                self.write_chunk_loads(w, "for (int u = 0; u < UNROLL; ++u)", "c0 + (int64_t)u * TPR",
                                       [(self.pointer_name(key), f"l_{self.pointer_name(key)}[u]") for key in staged])
                w.line("#pragma unroll")
                with w.block("for (int u = 0; u < UNROLL; ++u)"):
                    w.line("const int64_t c = c0 + (int64_t)u * TPR;")
                    with w.block("if (c * VEC < W)"):
                        w.lines(f"s_{self.pointer_name(key)}[(c / TPR) * BLOCK + threadIdx.x] = "
                                f"l_{self.pointer_name(key)}[u];" for key in staged)

    def write_column_partials_setup(self, w: CWriter) -> None:
        """Column reductions' slots and accumulators, zeroed (registers or shared memory; a
        streamed row accumulates straight into its partials)."""
        if self.colreduces:
            w.line("// column partials: one slot per block (narrow rows merge their row groups at the end)")
            w.line("const int64_t cslot = (int64_t)blockIdx.y * nbx + bx;")
            w.line("const int64_t cslots = nbx * gridDim.y;")
        if self.col_smem:
            w.line("// medium rows: the column partials in shared memory, [reduction][W], sized at launch;")
            w.line("// each column is one thread's (one row per block), so no atomics and no barriers")
            w.line("extern __shared__ float col_smem[];")
            w.line("acc_t* const csm = reinterpret_cast<acc_t*>(col_smem); (void)csm;")
        for i, c in enumerate(self.colreduces):
            w.line(f"// column partials of {self.var(c)}: this thread's columns, summed over its rows")
            if self.col_smem:
                w.line(f"acc_t cacc_{i}[ITEMS > 0 && TPR <= 32 ? ITEMS : 1][VEC];")
                w.line(f"if constexpr (ITEMS > 0 && TPR > 32) for (int k = 0; k < ITEMS; ++k) {{ "
                       f"const int64_t c = (int64_t)k * TPR + lane; if (c * VEC < W) "
                       f"for (int v = 0; v < VEC; ++v) csm[{i} * W + c * VEC + v] = 0; }}")
                w.line(f"for (int k = 0; k < (ITEMS > 0 && TPR <= 32 ? ITEMS : 1); ++k) for (int v = 0; v < VEC; ++v) "
                       f"cacc_{i}[k][v] = 0;")
            else:
                w.line(f"acc_t cacc_{i}[ITEMS > 0 ? ITEMS : 1][VEC];")
                w.line(f"for (int k = 0; k < (ITEMS > 0 ? ITEMS : 1); ++k) for (int v = 0; v < VEC; ++v) "
                       f"cacc_{i}[k][v] = 0;")
            w.line(f"float* cpart_{i} = partials + ({i} * cslots + cslot) * W;")
            w.line(f"if constexpr (ITEMS == 0) for (int64_t c = lane; c * VEC < W; c += TPR) "
                   f"for (int v = 0; v < VEC; ++v) cpart_{i}[c * VEC + v] = 0.f;")

    def write_row(self, w: CWriter, ctx: Ctx) -> None:
        """One row: its pointers, its raw loads into registers, its row values and reductions
        (pass by pass), the final pass's outputs, its row stores and its terms of the global reductions."""
        p = self.p
        elem_stores = [s for s in p.stores if s.kind == "elem"]
        w.line("const int64_t row = (int64_t)blockIdx.y * rows_per_group + local;")
        for key, ns in self.elem_loads.items():
            fld, kind, off, div = key
            base = f"(const {self.ctype_of(fld)}*)A.{fld}.data"
            if kind == "col":
                w.line(f"const {self.ctype_of(fld)}* {self.pointer_name(key)} = {base} + {off};")
            else:
                piece = ns[0].attrs.get("rows_piece")
                at = rows_piece_index(piece, p.row_dims) if piece else self.row_index(ns[0].attrs["row_div"])
                w.line(f"const {self.ctype_of(fld)}* {self.pointer_name(key)} = {base} + "
                       f"{at} * {pitch_expr(p, self.types[fld])} + {off};")
        for i, s in enumerate(elem_stores):
            pitch = pitch_expr(p, self.types[s.field])
            off = self.expr(s.offset, ctx) if s.offset is not None else "0"
            at = rows_piece_index(s.piece, p.row_dims) if s.piece else "row"  # a row piece: its rows of the field
            w.line(f"{self.ctype_of(s.field)}* o_{i} = ({self.ctype_of(s.field)}*)A.{s.field}.data + "
                   f"{at} * {pitch} + {off};")
        if self.elem_loads:
            w.line("// the row stays in registers across passes, raw in the storage dtype (half the")
            w.line("// registers of fp32 for 16-bit types), all ITEMS 16-byte loads issued up front")
        w.lines(f"{self.raw_type(key)} r_{self.pointer_name(key)}[ITEMS > 0 ? ITEMS : 1];" for key in self.held_loads())
        if self.elem_loads:
            with w.block("if constexpr (ITEMS > 0)"):
                self.write_chunk_loads(w, "for (int k = 0; k < ITEMS; ++k)", "(int64_t)k * TPR + lane",
                                       [(self.pointer_name(key), f"r_{self.pointer_name(key)}[k]")
                                        for key in self.held_loads()])
        self.write_stage_row(w)
        self.write_row_scope(w, ctx)
        if elem_stores or self.colreduces:
            w.line("// final pass: outputs" + (" and column partials" if self.colreduces else ""))
            self.write_pass(w, [], ctx, elem_stores, self.colreduces)
        for s in (s for s in p.stores if s.kind == "row"):
            t = self.ctype_of(s.field)
            at = rows_piece_index(s.piece, p.row_dims) if s.piece else "row"  # per-row pieces: [B, 2C] of rows [B, C]
            # an int expression (an index) is cast; from_acc takes floats (a row reduction's acc_t, any dtype)
            put = f"({t})" if s.value.dtype != "float" and s.value.op != "rowreduce" else f"sg::from_acc<{t}>"
            w.line(f"if (lane == 0) (({t}*)A.{s.field}.data)[{at}] = {put}({self.expr(s.value, ctx)});")
        w.lines(f"gacc_{i} += (acc_t)({self.expr(g.args[0], ctx)});" for i, g in enumerate(self.globalreduces))

    def write_row_scope(self, w: CWriter, ctx: Ctx) -> None:
        """The row's values in dependency order: each row node once its operands are, and the
        row reductions ready together in one pass over the row."""
        done = set(ctx.names)
        pending = [n for n in self.nodes if n.level == "row"]
        pass_no = 0
        while pending:
            progressed = False
            for n in list(pending):
                if n.op in ("rowreduce",):
                    continue
                if all(self.ready(a, done) for a in n.args) and (n.op != "gather" or self.gather_ready(n, done)):
                    self.write_row_node(w, n, ctx)
                    done.add(n.id)
                    pending.remove(n)
                    progressed = True
            batch = [n for n in pending if n.op == "rowreduce" and self.elem_ready(n.args[0], done)]
            if batch:
                pass_no += 1
                for n in self.write_reduction_pass(w, batch, pending, pass_no, ctx):
                    ctx.names[n.id] = self.var(n)
                    done.add(n.id)
                    pending.remove(n)
                progressed = True
            if not progressed:
                raise AssertionError(f"emit: cannot schedule row nodes {pending}")

    def write_reduction_pass(self, w: CWriter, batch: list[Node], pending: list[Node], pass_no: int,
                             ctx: Ctx) -> list[Node]:
        """A pass computing the row reductions of `batch` (and a pending partner they fuse with:
        LayerNorm's moments, softmax's (max, sum)). Returns the nodes it computed."""
        moments = self.moments_partner(batch, pending) if self.variant.moments else None
        if moments is not None:
            return self.write_moments(w, moments, batch, pass_no, ctx)
        pair = self.online_partner(batch, pending)
        if pair is not None:
            return self.write_max_sum_pass(w, pair, batch, pass_no, ctx)
        w.line(f"// pass {pass_no}: {', '.join(n.attrs['kind'] for n in batch)} over the row")
        consumers = [(n.attrs["kind"], n, self.var(n)) for n in batch]
        w.lines(f"{self.acc_type(n)} {acc} = {REDUCE_INIT[kind]};" for kind, n, acc in consumers)
        self.write_pass(w, consumers, ctx, [], [])
        self.write_group_reductions(w, consumers)
        return batch

    def write_max_sum_pass(self, w: CWriter, pair: tuple[Node, Node], batch: list[Node], pass_no: int,
                           ctx: Ctx) -> list[Node]:
        """A row's max and sum of exp(x - max) in one pass (the batch's other reductions ride
        along), in the variant's form. Returns the nodes computed."""
        variant = self.variant
        m, s = pair
        mv, sv = self.var(m), self.var(s)
        others = [(n.attrs["kind"], n, self.var(n)) for n in batch if n is not m]
        with_others = "".join(f", {kind}" for kind, _, _ in others)
        w.line(f"// pass {pass_no}: max and sum of exp(x - max){with_others} over the row")
        w.lines(f"acc_t {acc} = {REDUCE_INIT[kind]};" for kind, n, acc in [("max", m, mv), ("sum", s, sv)] + others)
        if variant.reg_pair == "twopass" or self.few_pair_own(variant):
            self.write_exact_pair(w, m, s, others, ctx, variant)
        else:
            self.write_online_pair(w, m, s, others, ctx, variant.reg_pair == "local")
        # the pair skips elements equal to a -inf running max (empty threads, masked runs), so a
        # row of only -inf sums to 0 where torch sums exp(-inf - -inf) = NaN: unseen through
        # x - max (NaN there either way), seen once the sum is stored (a saved log-sum)
        w.line(f"if ({mv} == (acc_t)(-INFINITY)) {sv} = (acc_t)NAN;  // a row of only -inf, as torch sums it")
        return [m, s] + [n for _, n, _ in others]

    def group(self, kind: str) -> str:
        """The row group's reduction call (reduce, reduce2, online): the variant's `red_form`."""
        tree = "_tree" if self.variant.red_form == "tree" else ""
        return f"sg::group_{kind}{tree}<TPR, BLOCK>"

    def write_exact_pair(self, w: CWriter, m: Node, s: Node, others: list[tuple], ctx: Ctx, variant: Variant) -> None:
        """The `twopass` variant's (max, sum): a medium row (one block, in registers) takes the
        exact two sweeps, whose exps are independent of each other (the max and the batch's
        other reductions in one round, then the sum of exp(x - max)); narrow and split rows in
        registers keep the default's form ("local": one merge round of each thread's exact pair)
        and streamed rows the online sweep, so the variant changes the medium class only (until
        session 17 the others took the online sweep in registers too: softmax's split rows of
        131072 were 2-4% slower for it on the H200).
        `few_pair` "twopass": the few-row blocks (FEW) take the same form, whatever the rest do."""
        mv, sv = self.var(m), self.var(s)
        medium = variant.reg_pair == "twopass"
        if self.few_pair_own(variant):
            when = "FEW || (ITEMS > 0 && TPR > 32 && TPR <= BLOCK)" if medium else "FEW"
            header, comment = f"if constexpr ({when})", f"{'medium or ' if medium else ''}few-row block: the exact two-pass form"
        else:
            header, comment = "if constexpr (ITEMS > 0 && TPR > 32 && TPR <= BLOCK)", "medium row: the exact two-pass form"
        with w.block(header, comment=comment):
            self.write_pass(w, [("max", m, mv)] + others, ctx, [], [], modes=("reg",))
            w.lines(f"{acc} = {self.group('reduce')}({acc}, {REDUCE_OP[kind]}, red_smem);"
                    for kind, n, acc in [("max", m, mv)] + others)
            pass_ctx = Ctx(dict(ctx.names), dict(ctx.loads))
            pass_ctx.names[m.id] = mv
            self.write_pass(w, [("sum", s, sv)], pass_ctx, [], [], modes=("reg",))
            w.line(f"{sv} = {self.group('reduce')}({sv}, sg::Sum(), red_smem);")
        local = variant.reg_pair in ("local", "twopass")  # "online" keeps its own sweep
        with w.chain("else", comment="the other rows' own (max, sum) form" if local
                     else "one online sweep, one reduction round"):
            self.write_online_pair(w, m, s, others, ctx, local)

    def write_group_reductions(self, w: CWriter, consumers: list[tuple]) -> None:
        """Reduce a batch's accumulators over the row group, two per round (one set of barriers
        for a pair: the RMSNorm backward's two sums took two)."""
        doubles = [c for c in consumers if c[0] == "sum" and self.acc_type(c[1]) == "double"]
        w.lines(f"{acc} = {self.group('reduce')}({acc}, sg::Sum(), red_smem_d);" for _, _, acc in doubles)
        consumers = [c for c in consumers if c not in doubles]
        for i in range(0, len(consumers), 2):
            pair = consumers[i:i + 2]
            if len(pair) == 2:
                (ka, _, a), (kb, _, b) = pair
                w.line(f"{self.group('reduce2')}({a}, {REDUCE_OP[ka]}, {b}, {REDUCE_OP[kb]}, red_smem);")
            else:
                kind, _, acc = pair[0]
                w.line(f"{acc} = {self.group('reduce')}({acc}, {REDUCE_OP[kind]}, red_smem);")

    def write_online_pair(self, w: CWriter, m: Node, s: Node, others: list[tuple], ctx: Ctx,
                          local: bool = False) -> None:
        """One online pass (a read of a streamed row; one sweep of a row in registers) and one
        reduction round for the (max, sum) pair; the batch's other reductions ride along.
        `local`: a row in registers takes two sweeps of its registers instead (the thread's
        max, then its sum of exp(x - that max): no rescale chain, one exp per element)."""
        mv, sv = self.var(m), self.var(s)
        online = [("online", m.args[0], (mv, sv))] + others
        if local:
            pass_ctx = Ctx(dict(ctx.names), dict(ctx.loads))
            pass_ctx.names[m.id] = mv
            with pass_level(w):  # like the sweeps inside (the layout committed kernels carry)
                with unindented(w, w.block("if constexpr (ITEMS > 0)",
                                           comment="in registers: this thread's exact (max, sum)")):
                    self.write_pass(w, [("max", m, mv)] + others, ctx, [], [], modes=("reg",))
                    with unindented(w, w.block(f"if ({mv} != (acc_t)(-INFINITY))",
                                               comment="else no element here adds anything")):
                        self.write_pass(w, [("sum", s, sv)], pass_ctx, [], [], modes=("reg",))
                with unindented(w, w.chain("else", comment="streamed: one online sweep")):
                    self.write_pass(w, online, ctx, [], [], modes=("loop",))
        else:
            self.write_pass(w, online, ctx, [], [])
        w.line(f"{self.group('online')}({mv}, {sv}, red_smem);")
        self.write_group_reductions(w, others)

    def write_column_partials_out(self, w: CWriter) -> None:
        """Write this block's column partials (register path; the looped path accumulated in
        place). Rows of one block (narrow rows: TPR <= 32, BLOCK / TPR row groups) cover the
        same columns, so their partials are summed in row-group order (deterministic) through
        shared memory into the block's one slot: a slot per row group wrote more partial bytes
        than the op moves (rope's cos/sin grads: 16 row groups of 64 columns per block)."""
        with w.block("if constexpr (ITEMS > 0 && TPR > 32)", comment="one row group per block: straight out"):
            for i, _ in enumerate(self.colreduces):
                part = f"csm[{i} * W + c * VEC + v]" if self.col_smem else f"cacc_{i}[k][v]"
                with w.block("for (int k = 0; k < ITEMS; ++k)"):
                    w.line("const int64_t c = (int64_t)k * TPR + lane;")
                    w.line(f"if (c * VEC < W) for (int v = 0; v < VEC; ++v) cpart_{i}[c * VEC + v] = (float){part};")
        with w.chain("else if constexpr (ITEMS > 0)", comment="BLOCK / TPR row groups: summed in order"):
            if not self.col_smem:
                w.line("extern __shared__ float col_smem[];  // [BLOCK / TPR][TPR * ITEMS * VEC], sized at launch")
            w.line("constexpr int CW = TPR * ITEMS * VEC;")
            for i, _ in enumerate(self.colreduces):
                with w.block("for (int k = 0; k < ITEMS; ++k)"):
                    w.line("const int64_t c = (int64_t)k * TPR + lane;")
                    w.line(f"if (c * VEC < W) for (int v = 0; v < VEC; ++v) col_smem[rg * CW + c * VEC + v] = "
                           f"(float)cacc_{i}[k][v];")
                w.line("__syncthreads();")
                with w.block("for (int64_t jj = threadIdx.x; jj < W; jj += BLOCK)"):
                    w.line("float t = 0.f;")
                    w.line("for (int r = 0; r < BLOCK / TPR; ++r) t += col_smem[r * CW + jj];")
                    w.line(f"cpart_{i}[jj] = t;")
                w.line("__syncthreads();")

    def describe_rows(self) -> str:
        rows = " * ".join(str(d) for d in self.p.row_dims) or "1"
        if self.p.fold > 1:  # trailing axes folded into the row (lower.trailing_fold)
            full = max(self.types.values(), key=lambda t: t.ndim)
            return f"rows = {rows}, columns = {' * '.join(str(d) for d in self.p.pitch_dims(full))}"
        return f"rows = {rows}, columns = {self.p.width.attrs.get('dim', self.p.width_example)}"

    def ready(self, n: Node, done: set) -> bool:
        return n.level in ("const", "global") or n.id in done or n.level == "elem" and self.elem_ready(n, done)

    def elem_ready(self, n: Node, done: set) -> bool:
        for m in self.closure([n], "elem") or [n]:
            for a in m.args:
                if a.level == "row" and a.id not in done:
                    return False
        if n.level == "row":
            return n.id in done
        return True

    def gather_ready(self, n: Node, done: set) -> bool:
        return self.elem_ready(n.args[0], done) and self.ready(n.args[1], done)

    def write_row_node(self, w: CWriter, n: Node, ctx: Ctx) -> None:
        name = self.var(n)
        if n.op == "gather":
            # the column expression evaluated at one column per row, reading the inputs directly
            w.line(f"{self.ctype_var(n)} {name};")
            with w.block():
                # an index outside [0, W) (a -100 padding label the package's lazy range check has
                # not reported yet) reads an edge column, never memory outside the row
                w.line(f"const int64_t at = {self.expr(n.args[1], ctx)};")
                w.line("const int64_t j = at < 0 ? 0 : (at >= W ? W - 1 : at);")
                inner = Ctx(dict(ctx.names))
                for key, ns in self.elem_loads.items():
                    pn = self.pointer_name(key)
                    for m in ns:
                        inner.loads[m.id] = f"(acc_t)sg::to_acc({pn}[j])"
                w.lines(self.elem_statements([n.args[0]], inner))
                w.line(f"{name} = {self.expr(n.args[0], inner)};")
        else:
            w.line(f"const {self.ctype_var(n)} {name} = {self.expr(n, ctx)};")
        ctx.names[n.id] = name

    # ------------------------------------------------------------ finalize kernels


def emit_source(spec, programs: dict[str, Program], variant: Variant = DEFAULT_VARIANT) -> str:
    parts = [f"// {spec.name}.cu: generated by specgen's builtin generator from {Path(str(spec.path)).name}.",
             f"//   {spec.signature}",
             "// The reference was traced to primitive ops and lowered to a row program: every row of",
             "// the last dim is handled by a group of threads, reductions over the row stay on chip,",
             "// math runs in fp32 (fp64 for float64) and storage keeps the spec's dtype.",
             "// Deterministic: fixed reduction trees, no atomics.",
             f"// Schedule variant: {variant.name}.",
             f'#include "{abi.header_filename(spec)}"', PRELUDE]
    from .families import emitter_for  # the one dispatch point of the kernel families

    emitters = {direction: emitter_for(spec, program, direction, variant)
                for direction, program in programs.items()}
    if variant.moments and any(em.has_moments() for em in emitters.values()):
        parts.append(PRELUDE_MOMENTS)
    for direction, em in emitters.items():
        parts.append(f"// ======================= {direction} =======================")
        parts.append(em.emit_pretotals())
        parts.append(em.emit_row_kernel())
        parts.append(em.emit_finalize())
        parts.append(em.emit_host(list(spec.dtypes)))
    return "\n\n".join(p for p in with_optional_preludes(parts) if p) + "\n"
