"""Emit CUDA for row programs: one .cu per spec, both directions, every dtype.

Per direction: a row kernel `template <T, VEC, TPR, ITEMS>` (TPR threads per row, VEC
elements per 16-byte access, ITEMS vector chunks per thread held in registers, or
ITEMS == 0 for a looped pass that re-reads very wide rows), an optional finalize kernel
for reductions over rows (deterministic: per-slot partials, then a fixed-order sum), and
a host entry point that dispatches on the dtype and picks the schedule from the width.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ... import abi
from .ir import Node, Program, Store
from .prelude import PRELUDE


C_TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16", "float64": "double",
           "int64": "int64_t", "int32": "int32_t", "int16": "int16_t", "int8": "int8_t", "uint8": "uint8_t",
           "bool": "bool"}
DTYPE_ENUM = {"float32": "SPECGEN_FLOAT32", "float16": "SPECGEN_FLOAT16", "bfloat16": "SPECGEN_BFLOAT16",
              "float64": "SPECGEN_FLOAT64"}

# (TPR, ITEMS) schedules of the vectorized path, tried in order; the host takes the first
# whose capacity TPR * ITEMS * VEC covers the row. ITEMS None: the most 16-byte chunks of the
# row a thread may keep in registers for this program and dtype (ITEMS_MAX, a constexpr of
# the kernel), so a row is held by as few threads as possible: more rows per SM in flight,
# each thread with several 16-byte loads outstanding. ITEMS 0: the looped pass (rows too
# wide for registers), unrolled LOOP_UNROLL chunks deep.
NARROW = ((4, 1), (8, 1), (16, 1), (32, 1), (32, 2), (32, 4), (32, 8))  # rows of <= 32 threads, several per block
ROW_TPRS = (64, 128, 256, 512, 1024, 2048, 4096)  # threads per row held in registers (ITEMS_MAX chunks each)
# A row of up to `block_max` threads is one block (medium rows). Wider (split rows; sm_90+,
# programs that write elements and have no column reductions): the row stays in registers
# across a cluster of 2-8 blocks (see Variant.split_block_of), which combine their reductions
# through distributed shared memory: read once, where the looped pass reads it two or three
# times (softmax, cross-entropy backward over vocabulary-sized rows).
MAX_CLUSTER = 8  # the portable cluster size
SCALAR_SCHEDULES = ((32, 1), (256, 0))  # unaligned or odd widths
ROW_BLOCK = 128  # threads per block when several rows share a block (TPR <= 32)
LOOP_UNROLL = 4  # 16-byte chunks per thread in flight in the looped pass
REDUCE_INIT = {"sum": "(acc_t)0", "max": "(acc_t)(-INFINITY)", "min": "(acc_t)INFINITY"}
REDUCE_OP = {"sum": "sg::Sum()", "max": "sg::Max()", "min": "sg::Min()"}  # combiners of sg::group_reduce


@dataclass(frozen=True)
class Variant:
    """One point of the autotuner's space. Each field steers one shape class, so the tuner
    can keep the fastest per class and combine them (see `combine`):
    narrow rows (TPR <= 32): `row_block` threads per block, several rows each;
    medium rows (the row in registers): `data_regs` 32-bit registers per thread for the raw
    row (storage dtype) and column partials, at most `items_cap` 16-byte chunks;
    wide rows (looped): `loop_tpr` threads per row, `loop_unroll` chunks in flight each;
    split rows: `split_rows` False streams them by the looped pass instead.
    `persistent` True: one wave of blocks striding over rows instead of a block per row group
    (programs with column partials always take it: their partial bytes grow with the blocks).
    `reg_pair`: how a (max, sum of exp) pair is taken over a row in registers: "local" (each
    thread's exact max, then its sum of exp(x - max), independent exps; the threads' pairs
    merged in one reduction round), "online" (one online sweep, rescaling chunk by chunk: a
    serial chain), "twopass" (medium rows: max reduced over the row, then the sum: two rounds).
    `block_max`: threads of the widest row held by one block; wider rows in registers are
    split over a cluster (`split_block` threads per block, see split_block_of).
    `col_smem`: a medium row's column partials (weight gradients) accumulate in shared memory
    ([reduction][W] per block, each column one thread's: no atomics) instead of registers,
    so the row itself can take more registers (more chunks per thread, fewer threads).
    `min_threads`: threads an SM must keep resident (a register cap via __launch_bounds__)."""

    name: str
    row_block: int = ROW_BLOCK
    data_regs: int = 32
    items_cap: int = 8
    loop_tpr: int = 512
    loop_unroll: int = LOOP_UNROLL
    min_threads: int = 1024
    split_rows: bool = True
    persistent: bool = False
    reg_pair: str = "local"
    block_max: int = 1024
    split_block: int = 512
    col_smem: bool = False

    @property
    def schedules(self) -> tuple:
        rows = tuple((t, None) for t in ROW_TPRS if t <= self.block_max or self.split_rows)
        return NARROW + rows + ((self.loop_tpr, 0),)

    def is_split(self, tpr: int, items) -> bool:
        """A schedule whose row spans a cluster of blocks."""
        return items is None and tpr > self.block_max

    def split_block_of(self, tpr: int) -> int:
        """Threads per block of a split row of `tpr` threads: `split_block` (at most
        `block_max`), more when the row would otherwise need over MAX_CLUSTER blocks."""
        return max(min(self.split_block, self.block_max), tpr // MAX_CLUSTER)


DEFAULT_VARIANT = Variant("default")
VARIANTS = [
    DEFAULT_VARIANT,
    Variant("rows256", row_block=256),  # narrow: 8 warps of rows per block
    Variant("regs16", data_regs=16, items_cap=4),  # medium: twice the threads per row, more warps per SM
    Variant("loop1024", loop_tpr=1024, loop_unroll=2),  # wide: a whole 1024-thread block per row
    Variant("nosplit", split_rows=False),  # split: the looped pass instead of a cluster per row
    Variant("wave", persistent=True),  # medium: one wave of persistent blocks striding over rows
    # medium: (max, sum) in two exact sweeps; cross-entropy over 32768 classes in fp32 was 1.6x
    # slower with the online sweep than with these (results/2026-11-30-h200-release-v5)
    Variant("twopass", reg_pair="twopass"),
    Variant("online", reg_pair="online"),  # medium: v5's online sweep over a row in registers
    # medium and split: blocks of 256 threads, a row of more over a cluster of 2-8 of them: four
    # rows' quarters share an SM instead of one 1024-thread row waiting on its own barriers
    Variant("cl256", block_max=256, split_block=256),
    # medium rows with column partials (norm backwards): the partials in shared memory
    Variant("csmem", col_smem=True),
]
def variants_named(names: str) -> list[Variant]:
    """The VARIANTS named in a comma-separated list (empty: none); ValueError names the
    unknown ones and lists the known."""
    by_name = {v.name: v for v in VARIANTS}
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise ValueError(f"no variant {', '.join(unknown)}; variants: {', '.join(by_name)}")
    return [by_name[n] for n in wanted]


CLASS_FIELDS = {"narrow": ("row_block",),
                "medium": ("data_regs", "items_cap", "min_threads", "persistent", "reg_pair",
                           "block_max", "col_smem"),
                "wide": ("loop_tpr", "loop_unroll"), "split": ("split_rows", "split_block")}


def combine(winners: dict[str, Variant]) -> Variant:
    """One variant taking each class's fields from that class's winner."""
    fields = {}
    for cls, names in CLASS_FIELDS.items():
        source = winners.get(cls, DEFAULT_VARIANT)
        fields.update({n: getattr(source, n) for n in names})
    name = "+".join(f"{cls}:{v.name}" for cls, v in sorted(winners.items())) or DEFAULT_VARIANT.name
    return Variant(name, **fields)


def items_max(variant: Variant, words_per_item: int) -> int:
    """ITEMS_MAX of the kernel (mirrors sg::items_max): a power of two."""
    fit = max(1, min(variant.items_cap, variant.data_regs // max(1, words_per_item)))
    return 1 << (fit.bit_length() - 1)


def plan(variant: Variant, chunks: int, imax: int, split: bool = True) -> tuple[int, int]:
    """(TPR, ITEMS) the host picks for a vectorized row of `chunks` 16-byte chunks
    (mirrors the generated host code; `split`: the program and device allow split rows)."""
    for tpr, items in variant.schedules:
        if variant.is_split(tpr, items) and not split:
            continue
        if items == 0:
            return tpr, 0
        items = imax if items is None else items
        if items <= imax and chunks <= tpr * items:
            return tpr, items
    raise AssertionError("the schedule list ends with the looped pass")


def shape_class(tpr: int, items: int) -> str:
    return "wide" if items == 0 else "narrow" if tpr <= 32 else "split" if tpr > 1024 else "medium"


def dim_expr(d, prefix: str = "A.") -> str:
    if d.symbol is None:
        return f"(int64_t){d.add}"
    return f"((int64_t)({d.c_expr(prefix)}))"


def _float_literal(value: float) -> str:
    if math.isinf(value):
        return "(acc_t)INFINITY" if value > 0 else "(acc_t)(-INFINITY)"
    if math.isnan(value):
        return "(acc_t)NAN"
    return f"(acc_t){float(value)!r}"


@dataclass
class Ctx:
    """How to name values while emitting one scope."""

    names: dict[int, str] = field(default_factory=dict)  # node id -> C variable
    loads: dict[int, str] = field(default_factory=dict)  # elem load id -> expression for the current element


class DirectionEmitter:
    def __init__(self, spec, program: Program, direction: str):
        self.spec = spec
        self.p = program
        self.direction = direction
        self.args_t = abi.struct_name(spec, direction)
        self.kname = f"{spec.name}_{'fwd' if direction == 'forward' else 'bwd'}"
        self.nodes = program.nodes()
        self.by_id = {n.id: n for n in self.nodes}
        # Names count from 0 in program order, not from the process-wide node counter, so the
        # same spec gives the same source byte for byte in any process (kernels are committed).
        self.local_ids = {n.id: i for i, n in enumerate(self.nodes)}
        self.types = {f.name: f.tensor for f in abi.fields(spec, direction) if f.is_tensor}
        self.elem_loads = self._unique_loads()
        self.colreduces = [n for n in self.nodes if n.op == "colreduce"]
        self.col_smem = False  # set per variant by emit_row_kernel / emit_host
        self.globalreduces = [n for n in self.nodes if n.op == "globalreduce"]
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
        return (n.attrs["field"], n.attrs["kind"], self.expr(off, Ctx()) if off is not None else "0",
                tuple(str(d) for d in n.attrs.get("row_div", [])))

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
        if op == "load" and a["kind"] == "global":
            return f"(acc_t)sg::to_acc(*(const {self.ctype_of(a['field'])}*)A.{a['field']}.data)"
        if op == "load" and a["kind"] == "row":
            t = self.ctype_of(a["field"])
            conv = "(acc_t)sg::to_acc" if node.dtype == "float" else f"(int64_t)"
            return f"{conv}(((const {t}*)A.{a['field']}.data)[{self.row_index(a['row_div'])}])"
        args = [self.expr(x, ctx) for x in node.args]
        return self.op_expr(node, args)

    def op_expr(self, node: Node, x: list[str]) -> str:
        op = node.op
        binary = {"add": "+", "sub": "-", "mul": "*", "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">",
                  "ge": ">=", "and": "&&", "or": "||"}
        if op in binary:
            return f"({x[0]} {binary[op]} {x[1]})"
        if op == "div":
            if node.dtype == "int":
                return f"({x[0]} / {x[1]})"
            if node.level == "elem" and node.args[1].level in ("const", "global", "row"):
                # a per-row denominator: one reciprocal per row (the compiler hoists the common
                # 1/x), a multiply per element instead of an IEEE division (<= 1.5 ulp apart)
                return f"((acc_t)({x[0]}) * ((acc_t)1 / (acc_t)({x[1]})))"
            return f"((acc_t)({x[0]}) / (acc_t)({x[1]}))"
        if op == "floordiv":
            return f"({x[0]} / {x[1]})"  # sizes: non-negative
        if op == "pow":
            exponent = node.args[1]
            if exponent.op == "const" and exponent.attrs["value"] in (2, 2.0):
                return f"({x[0]} * {x[0]})"
            if exponent.op == "const" and exponent.attrs["value"] in (3, 3.0):
                return f"({x[0]} * {x[0]} * {x[0]})"
            return f"sg::pow_((acc_t)({x[0]}), (acc_t)({x[1]}))"
        # exp and tanh by the storage dtype T (fast forms for 16-bit storage: prelude)
        unary = {"exp": "sg::exp_<T>", "log": "sg::log_", "tanh": "sg::tanh_<T>", "rsqrt": "sg::rsqrt_",
                 "sqrt": "sg::sqrt_", "erf": "sg::erf_"}
        if op in unary:
            return f"{unary[op]}((acc_t)({x[0]}))"
        simple = {"neg": "(-{0})", "abs": "fabs((acc_t)({0}))", "not": "(!{0})",
                  "reciprocal": "((acc_t)1 / (acc_t)({0}))",
                  "sigmoid": "((acc_t)1 / ((acc_t)1 + sg::exp_<T>(-(acc_t)({0}))))",
                  "log1p": "log1p((acc_t)({0}))", "expm1": "expm1((acc_t)({0}))", "sin": "sin((acc_t)({0}))",
                  "cos": "cos((acc_t)({0}))", "exp2": "exp2((acc_t)({0}))", "floor": "floor((acc_t)({0}))",
                  "ceil": "ceil((acc_t)({0}))",
                  "sign": "(acc_t)(((acc_t)0 < (acc_t)({0})) - ((acc_t)({0}) < (acc_t)0))"}
        if op in simple:
            return simple[op].format(x[0])
        if op == "maximum":
            return f"sg::max_((acc_t)({x[0]}), (acc_t)({x[1]}))"
        if op == "minimum":
            return f"sg::min_((acc_t)({x[0]}), (acc_t)({x[1]}))"
        if op == "atan2":
            return f"atan2((acc_t)({x[0]}), (acc_t)({x[1]}))"
        if op == "fmod":
            return f"fmod((acc_t)({x[0]}), (acc_t)({x[1]}))"
        if op == "where":
            return f"({x[0]} ? {x[1]} : {x[2]})"
        if op == "cast":
            return {"float": f"(acc_t)({x[0]})", "int": f"(int64_t)({x[0]})", "bool": f"(({x[0]}) != 0)"}[
                node.dtype]
        raise AssertionError(f"emit: no expression for {op}")

    def ctype_var(self, node: Node) -> str:
        return {"float": "acc_t", "int": "int64_t", "bool": "bool"}[node.dtype]

    def row_index(self, row_div) -> str:
        if not row_div:
            return "row"
        span = " * ".join(dim_expr(d) for d in row_div)
        return f"(row / ({span}))"

    # ------------------------------------------------------------ scopes
    def closure(self, roots: list[Node], level: str) -> list[Node]:
        """Nodes of `level` needed by `roots`, in topo order. Reductions are boundaries:
        their results are values of the enclosing scope, not recomputed."""
        boundary = ("rowreduce", "gather", "colreduce", "globalreduce")
        want: set[int] = set()
        stack = list(roots)
        while stack:
            n = stack.pop()
            if n.id in want or n.level != level or n.op in boundary:
                continue
            want.add(n.id)
            stack.extend(n.args)
        return [n for n in self.nodes if n.id in want]

    def elem_statements(self, roots: list[Node], ctx: Ctx, indent: str) -> list[str]:
        lines = []
        for n in self.closure(roots, "elem"):
            if n.op == "load" or n.op == "iota":
                continue
            if n.id in ctx.names:
                continue
            name = self.var(n)
            lines.append(f"{indent}const {self.ctype_var(n)} {name} = {self.expr(n, ctx)};")
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

    def emit_pass(self, consumers: list[tuple], ctx_row: Ctx, stores: list[Store],
                  col_nodes: list[Node], modes: tuple = ("reg", "loop")) -> list[str]:
        """One sweep over the row's columns. consumers: (kind, node, accumulator) with kind
        sum|max|min (row reductions) or online (node: the max's operand, accumulator: the
        (max, sum) pair). Elem stores and col reductions are done in the final pass.
        mode reg: the row is in registers (ITEMS > 0); loop: it is streamed again."""
        roots = [n.args[0] if kind != "online" else n for kind, n, _ in consumers] + [s.value for s in stores] \
            + [c.args[0] for c in col_nodes]
        needed = {n.id for n in self.closure(roots, "elem")}
        loads = [(key, ns) for key, ns in self.elem_loads.items() if any(x.id in needed for x in ns)]
        out = []
        for mode in modes:
            body = []
            ind = "        "
            if mode == "reg":
                body.append("      #pragma unroll")
                body.append("      for (int k = 0; k < ITEMS; ++k) {")
                body.append("        const int64_t c = (int64_t)k * TPR + lane;")
                body.append("        if (c * VEC < W) {")
                slot = "r_{}[k]"
            else:
                # LOOP_UNROLL chunks per thread are loaded before any is used: several
                # 16-byte loads in flight per thread even though the row is streamed.
                body.append("      for (int64_t c0 = lane; c0 * VEC < W; c0 += (int64_t)UNROLL * TPR) {")
                for key, ns in loads:
                    body.append(f"        {self.raw_type(key)} l_{self.pointer_name(key)}[UNROLL];")
                body.append("        #pragma unroll")
                body.append("        for (int u = 0; u < UNROLL; ++u) {")
                body.append("          const int64_t c = c0 + (int64_t)u * TPR;")
                body.append("          if (c * VEC < W) {")
                for key, ns in loads:
                    pn = self.pointer_name(key)
                    body.append(f"            sg::load_raw<VEC>({pn} + c * VEC, l_{pn}[u]);")
                body.append("          }")
                body.append("        }")
                body.append("        #pragma unroll")
                body.append("        for (int u = 0; u < UNROLL; ++u) {")
                body.append("        const int64_t c = c0 + (int64_t)u * TPR;")
                body.append("        if (c * VEC < W) {")
                slot = "l_{}[u]"
            for i, s in enumerate(stores):
                body.append(f"{ind}acc_t st_{i}[VEC];")
            onlines = [(n, acc) for kind, n, acc in consumers if kind == "online"]
            for i, _ in enumerate(onlines):
                body.append(f"{ind}acc_t on_{i}[VEC];  // the chunk, fed to the online (max, sum) at once")
            if mode == "reg" and self.col_smem:
                for i, _ in enumerate(col_nodes):
                    body.append(f"{ind}acc_t ccl_{i}[VEC];  // this chunk's column terms (medium rows)")
            body.append(f"{ind}#pragma unroll")
            body.append(f"{ind}for (int v = 0; v < VEC; ++v) {{")
            inner = ind + "  "
            body.append(f"{inner}const int64_t j = c * VEC + v; (void)j;")
            ctx = Ctx(dict(ctx_row.names))
            for key, ns in loads:
                raw = slot.format(self.pointer_name(key))
                if mode == "reg" and key not in self.held_loads():  # a [W] parameter: read at use (L1)
                    raw = f"lz_{self.pointer_name(key)}"
                    body.insert(-3, f"{ind}{self.raw_type(key)} {raw}; sg::load_raw<VEC>("
                                    f"{self.pointer_name(key)} + c * VEC, {raw});")
                for n in ns:
                    ctx.loads[n.id] = self.load_ref(n, raw)
            body += self.elem_statements(roots, ctx, inner)
            for i, (n, _) in enumerate(onlines):
                body.append(f"{inner}on_{i}[v] = (acc_t)({self.expr(n, ctx)});")
            for kind, n, acc in consumers:
                if kind == "online":
                    continue
                val = self.expr(n.args[0], ctx)
                if kind == "sum":
                    body.append(f"{inner}{acc} += {val};")
                else:
                    body.append(f"{inner}{acc} = sg::{kind}_({acc}, (acc_t)({val}));")
            for i, s in enumerate(stores):
                body.append(f"{inner}st_{i}[v] = (acc_t)({self.expr(s.value, ctx)});")
            for i, c in enumerate(col_nodes):
                val = self.expr(c.args[0], ctx)
                if mode == "reg" and self.col_smem:
                    body.append(f"{inner}if constexpr (TPR > 32) ccl_{i}[v] = {val}; else cacc_{i}[k][v] += {val};")
                elif mode == "reg":
                    body.append(f"{inner}cacc_{i}[k][v] += {val};")
                else:
                    body.append(f"{inner}cpart_{i}[c * VEC + v] += {val};")
            body.append(f"{ind}}}")
            for i, (_, acc) in enumerate(onlines):
                body.append(f"{ind}sg::online_add_vec<T, VEC>({acc[0]}, {acc[1]}, on_{i});")
            if mode == "reg" and self.col_smem:
                for i, _ in enumerate(col_nodes):
                    body.append(f"{ind}if constexpr (TPR > 32) sg::smem_add_vec<VEC>(csm + {i} * W + c * VEC, ccl_{i});")
            for i, s in enumerate(stores):
                body.append(f"{ind}sg::store_vec<VEC>(o_{i} + c * VEC, st_{i});")
            body.append("        }")
            body.append("      }")
            if mode == "loop":
                body.append("      }")
            out.append(body)
        if len(out) == 1:
            return out[0]
        return ["      if constexpr (ITEMS > 0) {"] + out[0] + ["      } else {"] + out[1] + ["      }"]

    def online_partner(self, batch: list[Node], pending: list[Node]) -> tuple[Node, Node] | None:
        """(max(a), sum(exp(a - max))) that can share one online pass: a max in `batch` and its
        pending partner (softmax, log-softmax, logsumexp, cross-entropy), or None. The other
        reductions of the batch (cross-entropy backward's sum over the target column) ride
        along in the same pass."""
        for m in batch:
            if m.attrs["kind"] != "max":
                continue
            for n in pending:
                arg = n.args[0] if n.op == "rowreduce" else None
                if n.op == "rowreduce" and n.attrs["kind"] == "sum" and arg.op == "exp" \
                        and arg.args[0].op == "sub" and arg.args[0].args[0] is m.args[0] and arg.args[0].args[1] is m:
                    return m, n
        return None

    def emit_row_kernel(self, variant: Variant) -> str:
        self.col_smem = variant.col_smem and bool(self.colreduces)
        p = self.p
        lines: list[str] = []
        elem_stores = [s for s in p.stores if s.kind == "elem"]
        row_stores = [s for s in p.stores if s.kind == "row"]
        lines.append(f"// One row group of TPR threads per row; {self.describe_rows()}. BLOCK threads per block;")
        lines.append(f"// __launch_bounds__ keeps >= {variant.min_threads} threads resident per SM (a register cap).")
        lines.append("template <typename T, int VEC, int TPR, int ITEMS, int BLOCK>")
        lines.append(f"__global__ void __launch_bounds__(BLOCK, sg::min_blocks(BLOCK, {variant.min_threads}, "
                     f"{self.words_per_item_expr(not self.col_smem)}, {variant.data_regs}))")
        lines.append(f"{self.kname}_rows(const {self.args_t} A, float* __restrict__ partials, int64_t rows_per_group)")
        lines.append("{")
        lines.append("  using acc_t = typename sg::Acc<T>::type;")
        loads_words = " + ".join(f"(VEC * (int)sizeof({self.ctype_of(key[0])}) + 3) / 4" for key in self.elem_loads) or "1"
        lines.append("  // looped pass: chunks in flight per thread, within 8 registers of raw loads (no spills)")
        lines.append(f"  constexpr int UNROLL = sg::items_max(8, {loads_words}, {variant.loop_unroll});")
        lines.append("  __shared__ acc_t red_smem[66];  // one value per warp (33), or a (max, sum) pair (66)")
        lines.append("  (void)red_smem; (void)partials;")
        lines.append(f"  const int64_t W = {self.expr(p.width, Ctx())};")
        lines.append("  // CL > 1: a split row, over a cluster of CL blocks (block bx of nbx along x)")
        lines.append("  constexpr int CL = TPR > BLOCK ? TPR / BLOCK : 1;")
        lines.append("  const int lane = CL > 1 ? (int)(blockIdx.x % CL) * BLOCK + (int)threadIdx.x "
                     ": (int)(threadIdx.x % TPR);")
        lines.append("  const int rg = CL > 1 ? 0 : (int)(threadIdx.x / TPR);")
        lines.append("  const int rpb = CL > 1 ? 1 : (int)(blockDim.x / TPR);")
        lines.append("  const int64_t bx = blockIdx.x / CL, nbx = gridDim.x / CL;")
        lines.append("  const int64_t slot = ((int64_t)blockIdx.y * nbx + bx) * rpb + rg;")
        lines.append("  const int64_t slots = nbx * gridDim.y * rpb; (void)slots; (void)slot;")
        ctx = Ctx()
        for n in self.nodes:
            if n.level == "global" and n.op not in ("dim", "stride"):
                name = self.var(n)
                lines.append(f"  const {self.ctype_var(n)} {name} = {self.expr(n, ctx)};")
                ctx.names[n.id] = name
        if self.colreduces:
            lines.append("  // column partials: one slot per block (narrow rows merge their row groups at the end)")
            lines.append("  const int64_t cslot = (int64_t)blockIdx.y * nbx + bx;")
            lines.append("  const int64_t cslots = nbx * gridDim.y;")
        if self.col_smem:
            lines.append("  // medium rows: the column partials in shared memory, [reduction][W], sized at launch;")
            lines.append("  // each column is one thread's (one row per block), so no atomics and no barriers")
            lines.append("  extern __shared__ float col_smem[];")
            lines.append("  acc_t* const csm = reinterpret_cast<acc_t*>(col_smem); (void)csm;")
        for i, c in enumerate(self.colreduces):
            lines.append(f"  // column partials of {self.var(c)}: this thread's columns, summed over its rows")
            if self.col_smem:
                lines.append(f"  acc_t cacc_{i}[ITEMS > 0 && TPR <= 32 ? ITEMS : 1][VEC];")
                lines.append(f"  if constexpr (ITEMS > 0 && TPR > 32) for (int k = 0; k < ITEMS; ++k) {{ "
                             f"const int64_t c = (int64_t)k * TPR + lane; if (c * VEC < W) "
                             f"for (int v = 0; v < VEC; ++v) csm[{i} * W + c * VEC + v] = 0; }}")
                lines.append(f"  for (int k = 0; k < (ITEMS > 0 && TPR <= 32 ? ITEMS : 1); ++k) for (int v = 0; v < VEC; ++v) "
                             f"cacc_{i}[k][v] = 0;")
            else:
                lines.append(f"  acc_t cacc_{i}[ITEMS > 0 ? ITEMS : 1][VEC];")
                lines.append(f"  for (int k = 0; k < (ITEMS > 0 ? ITEMS : 1); ++k) for (int v = 0; v < VEC; ++v) "
                             f"cacc_{i}[k][v] = 0;")
            lines.append(f"  float* cpart_{i} = partials + ({i} * cslots + cslot) * W;")
            lines.append(f"  if constexpr (ITEMS == 0) for (int64_t c = lane; c * VEC < W; c += TPR) "
                         f"for (int v = 0; v < VEC; ++v) cpart_{i}[c * VEC + v] = 0.f;")
        for i, g in enumerate(self.globalreduces):
            lines.append(f"  acc_t gacc_{i} = 0;")
        lines.append("  // Rows of this group: [blockIdx.y * rows_per_group, +rows_per_group), strided over blocks.")
        lines.append("  for (int64_t local = bx * rpb + rg; local < rows_per_group; local += nbx * rpb) {")
        lines.append("    const int64_t row = (int64_t)blockIdx.y * rows_per_group + local;")
        for key, ns in self.elem_loads.items():
            fld, kind, off, div = key
            pn = self.pointer_name(key)
            ttype = self.types[fld]
            pitch = dim_expr(ttype.dims[-1])
            base = f"(const {self.ctype_of(fld)}*)A.{fld}.data"
            if kind == "col":
                lines.append(f"    const {self.ctype_of(fld)}* {pn} = {base} + {off};")
            else:
                lines.append(f"    const {self.ctype_of(fld)}* {pn} = {base} + "
                             f"{self.row_index(ns[0].attrs['row_div'])} * {pitch} + {off};")
        for i, s in enumerate(elem_stores):
            pitch = dim_expr(self.types[s.field].dims[-1])
            off = self.expr(s.offset, ctx) if s.offset is not None else "0"
            lines.append(f"    {self.ctype_of(s.field)}* o_{i} = ({self.ctype_of(s.field)}*)A.{s.field}.data + "
                         f"row * {pitch} + {off};")
        if self.elem_loads:
            lines.append("    // the row stays in registers across passes, raw in the storage dtype (half the")
            lines.append("    // registers of fp32 for 16-bit types), all ITEMS 16-byte loads issued up front")
        for key in self.held_loads():
            pn = self.pointer_name(key)
            lines.append(f"    {self.raw_type(key)} r_{pn}[ITEMS > 0 ? ITEMS : 1];")
        if self.elem_loads:
            lines.append("    if constexpr (ITEMS > 0) {")
            lines.append("      #pragma unroll")
            lines.append("      for (int k = 0; k < ITEMS; ++k) {")
            lines.append("        const int64_t c = (int64_t)k * TPR + lane;")
            lines.append("        if (c * VEC < W) {")
            for key in self.held_loads():
                pn = self.pointer_name(key)
                lines.append(f"          sg::load_raw<VEC>({pn} + c * VEC, r_{pn}[k]);")
            lines.append("        }")
            lines.append("      }")
            lines.append("    }")
        # row scope: compute row nodes, with passes for the reductions
        row_nodes = [n for n in self.nodes if n.level == "row"]
        done = set(ctx.names)
        pending = list(row_nodes)
        pass_no = 0
        while pending:
            progressed = False
            for n in list(pending):
                if n.op in ("rowreduce",):
                    continue
                if all(self.ready(a, done) for a in n.args) and (n.op != "gather" or self.gather_ready(n, done)):
                    lines += self.emit_row_node(n, ctx)
                    done.add(n.id)
                    pending.remove(n)
                    progressed = True
            batch = [n for n in pending if n.op == "rowreduce" and self.elem_ready(n.args[0], done)]
            if batch:
                pass_no += 1
                pair = self.online_partner(batch, pending)
                if pair is not None:
                    m, s = pair
                    mv, sv = self.var(m), self.var(s)
                    others = [(n.attrs["kind"], n, self.var(n)) for n in batch if n is not m]
                    with_others = "".join(f", {kind}" for kind, _, _ in others)
                    lines.append(f"    // pass {pass_no}: max and sum of exp(x - max){with_others} over the row")
                    for kind, n, acc in [("max", m, mv), ("sum", s, sv)] + others:
                        lines.append(f"    acc_t {acc} = {REDUCE_INIT[kind]};")
                    if variant.reg_pair == "twopass":
                        lines += self.emit_exact_pair(m, s, others, ctx)
                    else:
                        lines += self.emit_online_pair(m, s, others, ctx, "    ", variant.reg_pair == "local")
                    for n in [m, s] + [n for _, n, _ in others]:
                        ctx.names[n.id] = self.var(n)
                        done.add(n.id)
                        pending.remove(n)
                    progressed = True
                    continue
                lines.append(f"    // pass {pass_no}: {', '.join(n.attrs['kind'] for n in batch)} over the row")
                consumers = []
                for n in batch:
                    acc = self.var(n)
                    lines.append(f"    acc_t {acc} = {REDUCE_INIT[n.attrs['kind']]};")
                    consumers.append((n.attrs["kind"], n, acc))
                lines += self.emit_pass(consumers, ctx, [], [])
                lines += self.emit_group_reductions(consumers, "    ")
                for kind, n, acc in consumers:
                    ctx.names[n.id] = acc
                    done.add(n.id)
                    pending.remove(n)
                progressed = True
            if not progressed:
                raise AssertionError(f"emit: cannot schedule row nodes {pending}")
        if elem_stores or self.colreduces:
            lines.append("    // final pass: outputs" + (" and column partials" if self.colreduces else ""))
            lines += self.emit_pass([], ctx, elem_stores, self.colreduces)
        for s in row_stores:
            t = self.ctype_of(s.field)
            lines.append(f"    if (lane == 0) (({t}*)A.{s.field}.data)[row] = sg::from_acc<{t}>"
                         f"({self.expr(s.value, ctx)});")
        for i, g in enumerate(self.globalreduces):
            lines.append(f"    gacc_{i} += (acc_t)({self.expr(g.args[0], ctx)});")
        lines.append("  }")
        if self.colreduces:
            lines += self.emit_column_partials_out()
        for i, g in enumerate(self.globalreduces):
            base = f"{len(self.colreduces)} * cslots * W + " if self.colreduces else ""
            lines.append(f"  if (lane == 0) partials[{base}{i} * slots + slot] = (float)gacc_{i};")
        lines.append("}")
        return "\n".join(lines)

    def emit_exact_pair(self, m: Node, s: Node, others: list[tuple], ctx: Ctx) -> list[str]:
        """The `twopass` variant's (max, sum): a medium row (one block, in registers) takes the
        exact two sweeps, whose exps are independent of each other (the max and the batch's
        other reductions in one round, then the sum of exp(x - max)); narrow, split and
        streamed rows keep the online sweep, so the variant changes the medium class only."""
        mv, sv = self.var(m), self.var(s)
        lines = ["    if constexpr (ITEMS > 0 && TPR > 32 && TPR <= BLOCK) {  // medium row: the exact two-pass form"]
        lines += self.emit_pass([("max", m, mv)] + others, ctx, [], [], modes=("reg",))
        for kind, n, acc in [("max", m, mv)] + others:
            lines.append(f"      {acc} = sg::group_reduce<TPR, BLOCK>({acc}, {REDUCE_OP[kind]}, red_smem);")
        pass_ctx = Ctx(dict(ctx.names), dict(ctx.loads))
        pass_ctx.names[m.id] = mv
        lines += self.emit_pass([("sum", s, sv)], pass_ctx, [], [], modes=("reg",))
        lines.append(f"      {sv} = sg::group_reduce<TPR, BLOCK>({sv}, sg::Sum(), red_smem);")
        lines.append("    } else {  // one online sweep, one reduction round")
        lines += self.emit_online_pair(m, s, others, ctx, "      ")
        lines.append("    }")
        return lines

    @staticmethod
    def emit_group_reductions(consumers: list[tuple], indent: str) -> list[str]:
        """Reduce a batch's accumulators over the row group, two per round (one set of barriers
        for a pair: the RMSNorm backward's two sums took two)."""
        lines = []
        for i in range(0, len(consumers), 2):
            pair = consumers[i:i + 2]
            if len(pair) == 2:
                (ka, _, a), (kb, _, b) = pair
                lines.append(f"{indent}sg::group_reduce2<TPR, BLOCK>({a}, {REDUCE_OP[ka]}, {b}, {REDUCE_OP[kb]}, "
                             "red_smem);")
            else:
                kind, _, acc = pair[0]
                lines.append(f"{indent}{acc} = sg::group_reduce<TPR, BLOCK>({acc}, {REDUCE_OP[kind]}, red_smem);")
        return lines

    def emit_online_pair(self, m: Node, s: Node, others: list[tuple], ctx: Ctx, indent: str,
                         local: bool = False) -> list[str]:
        """One online pass (a read of a streamed row; one sweep of a row in registers) and one
        reduction round for the (max, sum) pair; the batch's other reductions ride along.
        `local`: a row in registers takes two sweeps of its registers instead (the thread's
        max, then its sum of exp(x - that max): no rescale chain, one exp per element)."""
        mv, sv = self.var(m), self.var(s)
        if local:
            pass_ctx = Ctx(dict(ctx.names), dict(ctx.loads))
            pass_ctx.names[m.id] = mv
            lines = ["      if constexpr (ITEMS > 0) {  // in registers: this thread's exact (max, sum)"]
            lines += self.emit_pass([("max", m, mv)] + others, ctx, [], [], modes=("reg",))
            lines.append(f"      if ({mv} != (acc_t)(-INFINITY)) {{  // else no element here adds anything")
            lines += self.emit_pass([("sum", s, sv)], pass_ctx, [], [], modes=("reg",))
            lines.append("      }")
            lines.append("      } else {  // streamed: one online sweep")
            lines += self.emit_pass([("online", m.args[0], (mv, sv))] + others, ctx, [], [], modes=("loop",))
            lines.append("      }")
        else:
            lines = self.emit_pass([("online", m.args[0], (mv, sv))] + others, ctx, [], [])
        lines.append(f"{indent}sg::group_online<TPR, BLOCK>({mv}, {sv}, red_smem);")
        return lines + self.emit_group_reductions(others, indent)

    def emit_column_partials_out(self) -> list[str]:
        """Write this block's column partials (register path; the looped path accumulated in
        place). Rows of one block (narrow rows: TPR <= 32, BLOCK / TPR row groups) cover the
        same columns, so their partials are summed in row-group order (deterministic) through
        shared memory into the block's one slot: a slot per row group wrote more partial bytes
        than the op moves (rope's cos/sin grads: 16 row groups of 64 columns per block)."""
        lines = ["  if constexpr (ITEMS > 0 && TPR > 32) {  // one row group per block: straight out"]
        for i, _ in enumerate(self.colreduces):
            lines.append("    for (int k = 0; k < ITEMS; ++k) {")
            lines.append("      const int64_t c = (int64_t)k * TPR + lane;")
            part = f"csm[{i} * W + c * VEC + v]" if self.col_smem else f"cacc_{i}[k][v]"
            lines.append(f"      if (c * VEC < W) for (int v = 0; v < VEC; ++v) cpart_{i}[c * VEC + v] = "
                         f"(float){part};")
            lines.append("    }")
        lines.append("  } else if constexpr (ITEMS > 0) {  // BLOCK / TPR row groups: summed in order")
        if not self.col_smem:
            lines.append("    extern __shared__ float col_smem[];  // [BLOCK / TPR][TPR * ITEMS * VEC], sized at launch")
        lines.append("    constexpr int CW = TPR * ITEMS * VEC;")
        for i, _ in enumerate(self.colreduces):
            lines.append("    for (int k = 0; k < ITEMS; ++k) {")
            lines.append("      const int64_t c = (int64_t)k * TPR + lane;")
            lines.append(f"      if (c * VEC < W) for (int v = 0; v < VEC; ++v) col_smem[rg * CW + c * VEC + v] = "
                         f"(float)cacc_{i}[k][v];")
            lines.append("    }")
            lines.append("    __syncthreads();")
            lines.append("    for (int64_t jj = threadIdx.x; jj < W; jj += BLOCK) {")
            lines.append("      float t = 0.f;")
            lines.append("      for (int r = 0; r < BLOCK / TPR; ++r) t += col_smem[r * CW + jj];")
            lines.append(f"      cpart_{i}[jj] = t;")
            lines.append("    }")
            lines.append("    __syncthreads();")
        lines.append("  }")
        return lines

    def describe_rows(self) -> str:
        rows = " * ".join(str(d) for d in self.p.row_dims) or "1"
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

    def emit_row_node(self, n: Node, ctx: Ctx) -> list[str]:
        name = self.var(n)
        if n.op == "gather":
            # Evaluate the column expression at one column per row, reading inputs directly.
            lines = [f"    {self.ctype_var(n)} {name};", "    {",
                     f"      const int64_t j = {self.expr(n.args[1], ctx)};"]
            inner = Ctx(dict(ctx.names))
            for key, ns in self.elem_loads.items():
                pn = self.pointer_name(key)
                for m in ns:
                    inner.loads[m.id] = f"(acc_t)sg::to_acc({pn}[j])"
            lines += self.elem_statements([n.args[0]], inner, "      ")
            lines.append(f"      {name} = {self.expr(n.args[0], inner)};")
            lines.append("    }")
            ctx.names[n.id] = name
            return lines
        line = f"    const {self.ctype_var(n)} {name} = {self.expr(n, ctx)};"
        ctx.names[n.id] = name
        return [line]

    # ------------------------------------------------------------ finalize kernels
    def post_stores(self) -> list[Store]:
        return [s for s in self.p.stores if s.kind in ("col", "global")]

    def emit_finalize(self) -> str:
        if not self.post_stores():
            return ""
        lines = []
        col = [s for s in self.post_stores() if s.kind == "col"]
        glob = [s for s in self.post_stores() if s.kind == "global"]
        ncol = len(self.colreduces)
        if col:  # grouped reductions (many groups of few slots each): a thread per column
            lines += self.finalize_cols_flat(col) if self.grouped_cols() else self.finalize_cols_tiled(col, ncol)
        if glob:
            lines.append("// One block sums the per-slot partials of each reduction over all rows: a fixed tree.")
            lines.append("template <typename T>")
            lines.append(f"__global__ void {self.kname}_finalize_global(const {self.args_t} A, "
                         "const float* __restrict__ partials, int64_t slots, int64_t cslots)")
            lines.append("{")
            lines.append("  using acc_t = typename sg::Acc<T>::type;")
            lines.append("  __shared__ double tree[256];")
            lines.append(f"  const int64_t W = {self.expr(self.p.width, Ctx())};")
            ctx = Ctx()
            for i, g in enumerate(self.globalreduces):
                lines.append("  {")
                lines.append("    double part = 0;")
                lines.append(f"    for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) "
                             f"part += partials[{ncol} * cslots * W + {i} * slots + s];")
                lines.append("    tree[threadIdx.x] = part;")
                lines.append("    __syncthreads();")
                lines.append("    for (int w = blockDim.x / 2; w > 0; w /= 2) {")
                lines.append("      if ((int)threadIdx.x < w) tree[threadIdx.x] += tree[threadIdx.x + w];")
                lines.append("      __syncthreads();")
                lines.append("    }")
                lines.append("  }")
                lines.append(f"  const acc_t {self.var(g)} = (acc_t)tree[0];")
                lines.append("  __syncthreads();")
                ctx.names[g.id] = self.var(g)
            lines.append("  if (threadIdx.x != 0) return;")
            for n in self.nodes:
                if n.level == "global" and n.op not in ("dim", "stride") and n.id not in ctx.names:
                    ctx.names[n.id] = self.var(n)
                    lines.append(f"  const {self.ctype_var(n)} {self.var(n)} = {self.expr_fresh(n, ctx)};")
            for s in glob:
                t = self.ctype_of(s.field)
                for n in self.closure([s.value], "post"):
                    if n.id not in ctx.names and n.op != "globalreduce":
                        ctx.names[n.id] = self.var(n)
                        lines.append(f"  const acc_t {self.var(n)} = {self.op_expr(n, [self.expr(a, ctx) for a in n.args])};")
                lines.append(f"  *({t}*)A.{s.field}.data = ({t})({self.expr(s.value, ctx)});")
            lines.append("}")
        return "\n".join(lines)

    def grouped_cols(self) -> bool:
        """Column reductions per group of rows (rope's cos/sin grads: a group of H rows per
        position), not one group of all rows: many groups of a few slots each."""
        return bool(self.p.group_div) and [str(d) for d in self.p.group_div] != [str(d) for d in self.p.row_dims]

    def finalize_cols_flat(self, col: list) -> list[str]:
        lines = []
        lines.append("// Sums of the per-slot column partials, in slot order (deterministic), then the epilogue:")
        lines.append("// a thread per column of a group (grouped reductions: many groups of few slots each).")
        lines.append("template <typename T>")
        lines.append(f"__global__ void {self.kname}_finalize_cols(const {self.args_t} A, "
                     "const float* __restrict__ partials, int64_t cslots, int64_t groups)")
        lines.append("{")
        lines.append("  using acc_t = typename sg::Acc<T>::type;")
        lines.append(f"  const int64_t W = {self.expr(self.p.width, Ctx())};")
        lines.append("  const int64_t per_group = cslots / groups;")
        lines.append("  for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < groups * W; "
                     "idx += (int64_t)gridDim.x * blockDim.x) {")
        lines.append("    const int64_t g = idx / W, j = idx % W;")
        ctx = Ctx()
        for i, c in enumerate(self.colreduces):
            # hundreds of slot partials in one float chain lose ~1e-5 relative: sum in double
            lines.append(f"    double {self.var(c)}_f64 = 0;")
            lines.append(f"    for (int64_t s = 0; s < per_group; ++s) {self.var(c)}_f64 += "
                         f"(double)partials[({i} * cslots + g * per_group + s) * W + j];")
            lines.append(f"    const acc_t {self.var(c)} = (acc_t){self.var(c)}_f64;")
            ctx.names[c.id] = self.var(c)
        lines += self.emit_col_epilogue(col, ctx, "    ")
        lines.append("  }")
        lines.append("}")
        return lines

    def finalize_cols_tiled(self, col: list, ncol: int) -> list[str]:
        lines = []
        lines.append("// Sums of the per-slot column partials, then the epilogue. A block takes 32 columns of one")
        lines.append("// group (coalesced rows of partials); its 8 warps sum every 8th slot, then warp 0 sums the")
        lines.append("// 8 in order: a fixed tree (deterministic) with 8x the loads in flight of a thread per column.")
        lines.append("template <typename T>")
        lines.append(f"__global__ void __launch_bounds__(256) {self.kname}_finalize_cols(const {self.args_t} A, "
                     "const float* __restrict__ partials, int64_t cslots, int64_t groups)")
        lines.append("{")
        lines.append("  using acc_t = typename sg::Acc<T>::type;")
        lines.append(f"  const int64_t W = {self.expr(self.p.width, Ctx())};")
        lines.append("  const int64_t per_group = cslots / groups;")
        lines.append(f"  __shared__ double fin[{ncol}][8][32];")
        lines.append("  const int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5);")
        lines.append("  const int64_t j = (int64_t)blockIdx.x * 32 + lane;")
        lines.append("  for (int64_t g = blockIdx.y; g < groups; g += gridDim.y) {")
        for i, c in enumerate(self.colreduces):
            # hundreds of slot partials in one float chain lose ~1e-5 relative: sum in double
            lines.append("    {")
            lines.append("      double part = 0;")
            lines.append("      if (j < W) {")
            lines.append("        #pragma unroll 4")
            lines.append(f"        for (int64_t s = warp; s < per_group; s += 8) "
                         f"part += (double)partials[({i} * cslots + g * per_group + s) * W + j];")
            lines.append("      }")
            lines.append(f"      fin[{i}][warp][lane] = part;")
            lines.append("    }")
        lines.append("    __syncthreads();")
        lines.append("    if (warp == 0 && j < W) {")
        ctx = Ctx()
        for i, c in enumerate(self.colreduces):
            lines.append(f"      double {self.var(c)}_f64 = fin[{i}][0][lane];")
            lines.append(f"      for (int w = 1; w < 8; ++w) {self.var(c)}_f64 += fin[{i}][w][lane];")
            lines.append(f"      const acc_t {self.var(c)} = (acc_t){self.var(c)}_f64;")
            ctx.names[c.id] = self.var(c)
        lines += self.emit_col_epilogue(col, ctx, "      ")
        lines.append("    }")
        lines.append("    __syncthreads();  // fin is reused by the next group")
        lines.append("  }")
        lines.append("}")
        return lines

    def emit_col_epilogue(self, col: list, ctx: Ctx, indent: str) -> list[str]:
        """The column outputs of group g, column j, from the summed partials named in ctx."""
        lines = []
        for s in col:
            t = self.ctype_of(s.field)
            pitch = dim_expr(self.types[s.field].dims[-1])
            off = self.expr(s.offset, ctx) if s.offset is not None else "0"
            for n in self.closure([s.value], "post"):
                if n.id not in ctx.names and n.op != "colreduce":
                    ctx.names[n.id] = self.var(n)
                    lines.append(f"{indent}const acc_t {self.var(n)} = "
                                 f"{self.op_expr(n, [self.expr(a, ctx) for a in n.args])};")
            lines.append(f"{indent}(({t}*)A.{s.field}.data)[g * {pitch} + {off} + j] = sg::from_acc<{t}>"
                         f"((acc_t)({self.expr(s.value, ctx)}));")
        return lines

    def expr_fresh(self, n: Node, ctx: Ctx) -> str:
        saved = ctx.names.pop(n.id, None)
        text = self.expr(n, ctx)
        if saved is not None:
            ctx.names[n.id] = saved
        return text

    # ------------------------------------------------------------ host side
    def words_per_item_expr(self, with_cols: bool = True) -> str:
        """C++: 32-bit registers one 16-byte chunk of the row costs a thread (raw loads, in
        their storage types, plus fp32/fp64 column partials unless `with_cols` is False)."""
        keys = self.elem_loads if with_cols else self.held_loads()
        terms = [f"(VEC * (int)sizeof({self.ctype_of(key[0])}) + 3) / 4" for key in keys]
        if self.colreduces and with_cols:
            terms.append(f"{len(self.colreduces)} * VEC * (int)sizeof(typename sg::Acc<T>::type) / 4")
        return " + ".join(terms) or "1"

    def held_loads(self) -> list:
        """Loads a row in registers holds from its first sweep on: all of them, except the [W]
        parameters (col loads) of a col_smem kernel, read again at each use (L1 hits)."""
        return [k for k in self.elem_loads if not (self.col_smem and k[1] == "col")]

    def narrow_max(self) -> str:
        return "ITEMS_NMAX" if self.col_smem else "ITEMS_MAX"

    def words_per_item(self, itemsize: int, vec: int) -> int:
        """Python mirror of words_per_item_expr for a float working dtype of `itemsize` bytes."""
        sizes = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4, "int16": 2,
                 "int8": 1, "uint8": 1, "bool": 1}
        words = 0
        for key in self.elem_loads:
            t = self.types[key[0]]
            size = itemsize if t.dtype is None else sizes[t.dtype]
            words += (vec * size + 3) // 4
        acc = 8 if itemsize == 8 else 4
        words += len(self.colreduces) * vec * acc // 4
        return max(words, 1)

    def split_allowed(self, variant: Variant) -> bool:
        """Split rows: one slot per cluster for row-level results; column partials (per thread,
        summed over its rows) have no split form; and a program that writes no elements (a
        loss) reads a streamed row once anyway, so splitting it only adds reduction rounds
        (cross-entropy forward was 0.56-0.67x slower split on the H200)."""
        return variant.split_rows and not self.colreduces and any(st.kind == "elem" for st in self.p.stores)

    @staticmethod
    def split_block_expr(variant: Variant) -> str:
        """C++ condition chain (without its last branch) giving the block of a split row by tpr."""
        splits = sorted({t for t, i in variant.schedules if variant.is_split(t, i)}, reverse=True)
        by_block: dict[int, int] = {}  # block -> the smallest tpr taking it
        for t in splits:
            by_block[variant.split_block_of(t)] = t
        parts, ordered = [], sorted(by_block.items(), key=lambda kv: -kv[1])
        for k, (block, smallest) in enumerate(ordered):
            bound = variant.block_max if k == len(ordered) - 1 else smallest - 1
            parts.append(f"items > 0 && tpr > {bound} ? {block}")  # a looped row (items 0) is one block
        return " : ".join(parts) or f"items > 0 && tpr > {variant.block_max} ? {variant.split_block}"

    @staticmethod
    def split_block_macro(variant: Variant) -> str:
        """The block of split row macro argument P (a literal when every split row takes one)."""
        splits = [t for t, i in variant.schedules if variant.is_split(t, i)]
        blocks = {variant.split_block_of(t) for t in splits}
        if len(blocks) <= 1:
            return str(blocks.pop() if blocks else variant.split_block)
        sb = min(variant.split_block, variant.block_max)
        return f"((P) / {MAX_CLUSTER} > {sb} ? (P) / {MAX_CLUSTER} : {sb})"

    def vec_schedules(self, variant: Variant) -> list[tuple]:
        return [s for s in variant.schedules if not variant.is_split(*s) or self.split_allowed(variant)]

    def schedule_chain(self, variant: Variant, action: str) -> list[str]:
        """An if-chain over the chosen (tpr, items) running `action` (a macro) per schedule;
        split rows run `action`_CL."""
        lines = ["  if (vec_ok) {"]
        first = True
        for tpr, items in self.vec_schedules(variant):
            kw = "if" if first else "else if"
            first = False
            if variant.is_split(tpr, items):
                lines.append(f"    {kw} (tpr == {tpr} && items == ITEMS_MAX) {action}_CL(VEC, {tpr}, ITEMS_MAX);")
                continue
            cond = f"items == {items}" if items is not None else "items == ITEMS_MAX"
            arg = "ITEMS_MAX" if items is None else str(items)
            if items is not None and items > 0:
                # a narrow schedule beyond ITEMS_MAX is never picked: do not instantiate it
                lines.append(f"    {kw} (tpr == {tpr} && {cond}) {{ if constexpr ({items} <= {self.narrow_max()}) "
                             f"{action}(VEC, {tpr}, {arg}); }}")
            else:
                lines.append(f"    {kw} (tpr == {tpr} && {cond}) {action}(VEC, {tpr}, {arg});")
        lines.append("  } else {")
        lines.append(f"    if (items == 1) {action}(1, 32, 1); else {action}(1, 256, 0);")
        lines.append("  }")
        return lines

    def emit_host(self, dtypes: list[str], variant: Variant = DEFAULT_VARIANT) -> str:
        p = self.p
        entry = abi.entry_point(self.spec, self.direction)
        rows = " * ".join(dim_expr(d) for d in p.row_dims) or "(int64_t)1"
        group = " * ".join(dim_expr(d) for d in (p.group_div or [])) or None
        lines = [f"template <typename T>", f"static cudaError_t {self.kname}_launch(const {self.args_t}& A, "
                 f"cudaStream_t stream)", "{"]
        lines.append(f"  const int64_t rows = {rows};")
        lines.append(f"  const int64_t W = {self.expr(p.width, Ctx())};")
        if group and self.colreduces:
            lines.append(f"  const int64_t rows_per_group = {group};")
        else:
            lines.append("  const int64_t rows_per_group = rows;")
        lines.append("  const int64_t groups = rows_per_group > 0 ? rows / rows_per_group : 0;")
        lines.append("  if (rows == 0 || W == 0) return cudaSuccess;")
        # alignment: every vector access must start on a 16-byte boundary
        conds = ["W % VEC == 0"]
        for key, ns in self.elem_loads.items():
            fld, kind, off, div = key
            conds.append(f"sg::aligned16(A.{fld}.data)")
            conds.append(f"({off}) % VEC == 0")
            if kind != "col":
                conds.append(f"{dim_expr(self.types[fld].dims[-1])} % VEC == 0")
        for s in p.stores:
            if s.kind == "elem":
                conds.append(f"sg::aligned16(A.{s.field}.data)")
                conds.append(f"{dim_expr(self.types[s.field].dims[-1])} % VEC == 0")
                if s.offset is not None:
                    conds.append(f"({self.expr(s.offset, Ctx())}) % VEC == 0")
        lines.append("  constexpr int VEC = 16 / sizeof(T) > 0 ? 16 / sizeof(T) : 1;")
        lines.append("  // Registers one 16-byte chunk of the row costs a thread: the raw row of each streamed")
        lines.append("  // input" + (" and the fp32 column partials" if self.colreduces else "") +
                     f"; ITEMS_MAX chunks fit the variant's {variant.data_regs} registers of row data.")
        self.col_smem = variant.col_smem and bool(self.colreduces)
        if self.col_smem:
            lines.append("  // (medium rows keep their column partials in shared memory: not counted; narrow")
            lines.append("  // rows keep them in registers: ITEMS_NMAX)")
            lines.append(f"  constexpr int WORDS = {self.words_per_item_expr(False)};")
            lines.append(f"  constexpr int ITEMS_NMAX = sg::items_max({variant.data_regs}, "
                         f"{self.words_per_item_expr()}, {variant.items_cap});")
        else:
            lines.append(f"  constexpr int WORDS = {self.words_per_item_expr()};")
        lines.append(f"  constexpr int ITEMS_MAX = sg::items_max({variant.data_regs}, WORDS, {variant.items_cap});")
        lines.append("  const bool vec_ok = " + "\n      && ".join(conds) + ";")
        lines.append("  const int64_t chunks = vec_ok ? W / VEC : W;")
        lines.append("  // Schedule: narrow rows share a block (TPR <= 32 threads per row); medium rows are held")
        lines.append("  // in registers by the fewest threads (ITEMS_MAX chunks each, one row per block); rows")
        lines.append(f"  // wider than {1024} threads x ITEMS_MAX chunks are streamed by a looped pass.")
        lines.append("  int tpr = 0, items = 0;")
        if self.col_smem:
            lines.append("  // medium rows: shared memory for the column partials, if the device gives a block that much")
            lines.append(f"  const size_t csm_bytes = (size_t){len(self.colreduces)} * (size_t)W * "
                         "sizeof(typename sg::Acc<T>::type);")
            lines.append("  const bool csm_ok = csm_bytes <= sg::smem_optin();")
        if self.split_allowed(variant):
            lines.append("  // split rows only where the row is wider than one block holds, on sm_90+ code")
            first = next(t for t, i in variant.schedules if variant.is_split(t, i))
            lines.append(f"  const bool split_ok = vec_ok && chunks > (int64_t){variant.block_max} * ITEMS_MAX && "
                         f"sg::clusters_ok<{self.kname}_rows<T, VEC, {first}, ITEMS_MAX, "
                         f"{variant.split_block_of(first)}>>();")
        lines.append("  if (vec_ok) {")
        for tpr, items in self.vec_schedules(variant):
            if variant.is_split(tpr, items):
                lines.append(f"    if (tpr == 0 && split_ok && chunks <= (int64_t){tpr} * ITEMS_MAX) "
                             f"{{ tpr = {tpr}; items = ITEMS_MAX; }}  // a cluster of "
                             f"{tpr // variant.split_block_of(tpr)} blocks")
            elif items == 0:
                lines.append(f"    if (tpr == 0) {{ tpr = {tpr}; items = 0; }}")
            elif items is None:
                fits = " && csm_ok" if self.col_smem else ""
                lines.append(f"    if (tpr == 0{fits} && chunks <= (int64_t){tpr} * ITEMS_MAX) "
                             f"{{ tpr = {tpr}; items = ITEMS_MAX; }}")
            else:
                lines.append(f"    if (tpr == 0 && {items} <= {self.narrow_max()} && chunks <= (int64_t){tpr * items}) "
                             f"{{ tpr = {tpr}; items = {items}; }}")
        lines.append("  } else {")
        lines.append("    if (chunks <= 32) { tpr = 32; items = 1; } else { tpr = 256; items = 0; }")
        lines.append("  }")
        rb = variant.row_block
        lines.append(f"  const int block = {self.split_block_expr(variant)} : tpr > 32 ? tpr : {rb};  "
                     "// TPR > 32: one row per block (or per cluster)")
        lines.append("  const int rpb = tpr >= block ? 1 : block / tpr;")
        lines.append("  const int cl = tpr > block ? tpr / block : 1;  // blocks per row")
        if variant.persistent or self.colreduces:
            lines.append("  // One wave of persistent blocks: as many as fit on the SMs at once (the instantiation's")
            lines.append("  // registers decide), each striding over rows; fewer when there are fewer rows.")
        else:
            lines.append("  // A block per row group (per row, past 32 threads per row), scheduled by the hardware:")
            lines.append("  // 4-14% faster than one wave of persistent blocks on the H200 (results/*-v4/variant_ab.md).")
        lines.append("  int per_sm = 1;")
        if self.col_smem:
            lines.append(f"#define SG_OCC(V, P, I) per_sm = sg::blocks_per_sm_dyn({self.kname}_rows<T, V, P, I, "
                         f"((P) > 32 ? (P) : {rb})>, block, (P) > 32 ? csm_bytes : 0)")
        else:
            lines.append(f"#define SG_OCC(V, P, I) per_sm = sg::blocks_per_sm<{self.kname}_rows<T, V, P, I, "
                         f"((P) > 32 ? (P) : {rb})>>(block)")
        lines.append("#define SG_OCC_CL(V, P, I) per_sm = 1")
        lines += self.schedule_chain(variant, "SG_OCC")
        lines.append("#undef SG_OCC")
        lines.append("#undef SG_OCC_CL")
        lines.append("  int64_t per_group_blocks = (rows_per_group + rpb - 1) / rpb;")
        lines.append("  const int64_t cap = (int64_t)sg::sm_count() * per_sm / (groups > 0 ? groups : 1);")
        lines.append("  int64_t gx = per_group_blocks < cap ? per_group_blocks : cap;")
        lines.append("  if (gx < 1) gx = 1;")
        if not variant.persistent and not self.colreduces:
            lines.append("  gx = per_group_blocks;  // not persistent")
        lines.append("  if (cl > 1) gx = per_group_blocks * cl;  // split rows: a cluster per row, one pass")
        lines.append("  const dim3 grid((unsigned)gx, (unsigned)groups);")
        lines.append("  const int64_t slots = gx / cl * groups * rpb; (void)slots;  // row groups: global reductions")
        lines.append("  const int64_t cslots = gx / cl * groups; (void)cslots;  // blocks: column reductions")
        ncol, nglob = len(self.colreduces), len(self.globalreduces)
        lines.append("  float* partials = nullptr;")
        if ncol or nglob:
            lines.append("  // per-slot partials of the reductions over rows, summed in slot order by the finalize")
            lines.append(f"  const size_t partial_bytes = sizeof(float) * ((size_t)cslots * {ncol} * (size_t)W "
                         f"+ (size_t)slots * {nglob});")
            lines.append("  cudaError_t err = cudaMallocAsync((void**)&partials, partial_bytes, stream);")
            lines.append("  if (err != cudaSuccess) return err;")
        lines.append("  const " + self.args_t + " args = A;")
        # narrow rows with column partials: shared memory to merge the block's row groups
        smem = f"((P) > 32 ? (size_t)0 : (size_t){rb} * (I) * (V) * sizeof(float))" if ncol else "0"
        if self.col_smem:
            smem = f"((P) > 32 ? csm_bytes : (size_t){rb} * (I) * (V) * sizeof(float))"
            lines.append(f"#define SG_LAUNCH(V, P, I) do {{ const cudaError_t e_ = sg::launch_dyn({self.kname}_rows<T, V, "
                         f"P, I, ((P) > 32 ? (P) : {rb})>, grid, block, {smem}, stream, args, partials, "
                         "rows_per_group); if (e_ != cudaSuccess) { (void)cudaGetLastError(); "
                         "cudaFreeAsync(partials, stream); return e_; } } while (0)")
        else:
            lines.append(f"#define SG_LAUNCH(V, P, I) {self.kname}_rows<T, V, P, I, ((P) > 32 ? (P) : {rb})>"
                         f"<<<grid, block, {smem}, stream>>>(args, partials, rows_per_group)")
        sb = self.split_block_macro(variant)
        lines.append(f"#define SG_LAUNCH_CL(V, P, I) do {{ const cudaError_t e_ = sg::launch_cluster<(P) / {sb}>("
                     f"{self.kname}_rows<T, V, P, I, {sb}>, grid, block, stream, args, partials, "
                     "rows_per_group); if (e_ != cudaSuccess) { (void)cudaGetLastError(); return e_; } } while (0)")
        lines += self.schedule_chain(variant, "SG_LAUNCH")
        lines.append("#undef SG_LAUNCH")
        lines.append("#undef SG_LAUNCH_CL")
        if ncol and any(s.kind == "col" for s in p.stores):
            if self.grouped_cols():
                lines.append(f"  {self.kname}_finalize_cols<T><<<(unsigned)((groups * W + 255) / 256 < 65535 ? "
                             f"(groups * W + 255) / 256 : 65535), 256, 0, stream>>>(args, partials, cslots, groups);")
            else:
                lines.append(f"  {self.kname}_finalize_cols<T><<<dim3((unsigned)((W + 31) / 32), (unsigned)(groups < "
                             f"65535 ? groups : 65535)), 256, 0, stream>>>(args, partials, cslots, groups);")
        if any(s.kind == "global" for s in p.stores):
            lines.append(f"  {self.kname}_finalize_global<T><<<1, 256, 0, stream>>>(args, partials, slots, "
                         f"{'cslots' if ncol else '0'});")
        if ncol or nglob:
            lines.append("  cudaFreeAsync(partials, stream);")
        lines.append("  return cudaGetLastError();")
        lines.append("}")
        dispatch = self.dispatch_field()
        lines.append("")
        lines.append(f'extern "C" cudaError_t {entry}(const {self.args_t}* a, cudaStream_t stream)')
        lines.append("{")
        if dispatch is None:
            lines.append(f"  return {self.kname}_launch<float>(*a, stream);")
        else:
            lines.append(f"  switch (a->{dispatch}.dtype) {{  // the spec's working dtype")
            for d in dtypes:
                lines.append(f"    case {DTYPE_ENUM[d]}: return {self.kname}_launch<{C_TYPES[d]}>(*a, stream);")
            lines.append("    default: return cudaErrorInvalidValue;")
            lines.append("  }")
        lines.append("}")
        return "\n".join(lines)

    def dispatch_field(self) -> str | None:
        for p in self.spec.signature.inputs:
            if p.type.dtype is None:
                return p.name
        return None


def emit_source(spec, programs: dict[str, Program], variant: Variant = DEFAULT_VARIANT) -> str:
    parts = [f"// {spec.name}.cu: generated by specgen's builtin generator from {Path(str(spec.path)).name}.",
             f"//   {spec.signature}",
             "// The reference was traced to primitive ops and lowered to a row program: every row of",
             "// the last dim is handled by a group of threads, reductions over the row stay on chip,",
             "// math runs in fp32 (fp64 for float64) and storage keeps the spec's dtype.",
             "// Deterministic: fixed reduction trees, no atomics.",
             f"// Schedule variant: {variant.name}.",
             f'#include "{abi.header_filename(spec)}"', PRELUDE]
    for direction, program in programs.items():
        em = DirectionEmitter(spec, program, direction)
        parts.append(f"// ======================= {direction} =======================")
        parts.append(em.emit_row_kernel(variant))
        parts.append(em.emit_finalize())
        parts.append(em.emit_host(list(spec.dtypes), variant))
    return "\n\n".join(p for p in parts if p) + "\n"
