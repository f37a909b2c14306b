"""The flat pointwise family: a program with no row structure (no reduction, no per-row
value, no column index, no [W] parameter, no concatenation) is one loop over the flat element
index of its outputs, whatever their rank or row width.

A [W] parameter (a bias over rows) keeps the row form: there a thread keeps its columns'
parameter chunks in registers over its rows, where the flat loop loads a chunk of the parameter
beside every chunk of the input. bias_gelu's forward at [16384 x 8192] bf16 on the H200: 137.6 us
in rows, 153.8 us flat with a `% W` per chunk, 176.0 us flat with the column kept incrementally
(benchmarks/results/2026-12-02-h200-session12).

One grid for the launch: BLOCK threads per block, each thread UNROLL 16-byte chunks in
flight per input (all loads issued before any math), a grid of a block per BLOCK x UNROLL
chunks, capped at `waves` waves of resident blocks (x the SMs x blocks per SM) that then
stride over the rest. The default (one chunk per thread, up to 4096 waves: no cap in practice)
is aten's shape; the variants of the tuner try more chunks per thread over fewer waves. The vector
path needs 16-byte aligned pointers only (and a row width that is a multiple of VEC when a
per-channel parameter is read): a total size that is not a multiple of VEC takes its last
(< VEC) elements in a scalar tail over the flat index, so an odd width stays vectorized.
Math in fp32 (fp64 for float64); storage in the spec's dtype.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ctext import Ctx, dim_expr, entry_function
from ..cwriter import CWriter
from ..ir import Program
from ..schedule import DEFAULT_VARIANT

BLOCK = 256
UNROLL = DEFAULT_VARIANT.flat_unroll  # the default variant's launch shape (schedule.py says why)
WAVES = DEFAULT_VARIANT.flat_waves


@dataclass(frozen=True)
class FlatPlan:
    """What the flat kernel of one direction does (the tests and the tuner read this)."""

    loads: tuple  # ABI fields read per element (same shape as the outputs)
    bcasts: tuple  # ABI fields broadcast over other dims (per channel): read at the element's coordinates
    stores: tuple  # ABI fields written per element
    block: int = BLOCK
    unroll: int = UNROLL
    waves: int = WAVES

    def grid(self, n: int, vec: int, sm_count: int = 132, per_sm: int = 8) -> int:
        """Blocks launched for `n` elements (mirrors the host code)."""
        chunks = (n + vec - 1) // vec
        need = (chunks + self.block * self.unroll - 1) // (self.block * self.unroll)
        return max(1, min(need, sm_count * per_sm * self.waves))


_NOT_FLAT = {"rowreduce", "gather", "colreduce", "globalreduce", "iota", "scan"}


def plan_of(program: Program, variant=None) -> FlatPlan | None:
    """The flat plan of `program`, or None when it needs the row machinery."""
    if not program.stores or any(s.kind != "elem" or s.offset is not None or s.piece is not None
                                 for s in program.stores):
        return None  # (a store into row pieces of its field: the row form's addressing)
    if program.group_div:
        return None
    loads, bcasts = [], []
    for n in program.nodes():
        if n.op in _NOT_FLAT or n.level in ("row", "post"):
            return None
        if n.op == "load" and n.level == "elem":
            if n.attrs.get("offset") is not None or n.attrs.get("row_div") or n.attrs.get("rows_piece") \
                    or n.attrs["kind"] == "col":
                return None  # (a [W] parameter: the row form keeps it in registers, see above)
            target = bcasts if n.attrs["kind"] == "bcast" else loads
            if n.attrs["field"] not in target:
                target.append(n.attrs["field"])
    tuning = {} if variant is None else {"unroll": variant.flat_unroll, "waves": variant.flat_waves}
    return FlatPlan(tuple(loads), tuple(bcasts), tuple(s.field for s in program.stores), **tuning)


def _emitter_base():
    from ..emit import DirectionEmitter

    return DirectionEmitter


class FlatEmitter(_emitter_base()):
    """A direction emitted as one flat grid: the row emitter's expressions, its own loop."""

    def __init__(self, spec, program: Program, direction: str, variant, plan: FlatPlan):
        super().__init__(spec, program, direction, variant)
        self.plan = plan

    def describe_rows(self) -> str:
        return "flat: every element of the outputs, row structure ignored"

    def _globals(self, ctx: Ctx) -> list[str]:
        """Statements naming the program's global-level values (in ctx)."""
        lines = []
        for n in self.nodes:
            if n.level == "global" and n.op not in ("dim", "stride"):
                name = self.var(n)
                lines.append(f"const {self.ctype_var(n)} {name} = {self.expr(n, ctx)};")
                ctx.names[n.id] = name
        return lines

    def streamed(self) -> list:
        """Loads read as 16-byte chunks (not the broadcast ones, read per element)."""
        return [k for k in self.elem_loads if k[1] != "bcast"]

    def bcast_index(self, key, e: str, name: str) -> list[str]:
        """C statements setting `name` to the index into broadcast tensor `key` of element `e`
        of the [rows..., W] shape: the coordinates of the dims it spans, in its own strides."""
        n = self.elem_loads[key][0]
        sizes = [dim_expr(d) for d in self.p.row_dims] + ["W"]
        w = CWriter()
        w.line(f"int64_t {name} = 0;")
        with w.block():
            w.line(f"int64_t r_ = {e}, st_ = 1; (void)st_;")
            for size, present in reversed(list(zip(sizes, n.attrs["present"]))):
                if present:
                    w.line(f"{name} += (r_ % {size}) * st_; st_ *= {size};")
                w.line(f"r_ /= {size};")
        return w.to_lines()

    def _element(self, ctx: Ctx, raws: dict, out: str) -> list[str]:
        """Statements computing every store at one element whose loads read `raws[key]`;
        store i's value goes to `out.format(i)`."""
        inner = Ctx(dict(ctx.names))
        for key, ns in self.elem_loads.items():
            for n in ns:
                inner.loads[n.id] = raws[key] if key[1] == "bcast" else self.load_ref(n, raws[key])
        roots = [s.value for s in self.p.stores]
        lines = self.elem_statements(roots, inner)
        for i, s in enumerate(self.p.stores):
            lines.append(f"{out.format(i)} = (acc_t)({self.expr(s.value, inner)});")
        return lines

    def emit_row_kernel(self) -> str:
        p, plan = self.p, self.plan
        w = CWriter()
        w.line(f"// {self.describe_rows()}: UNROLL 16-byte chunks per thread in flight, a grid-stride loop")
        w.line("// over VEC-element chunks, then the last n % VEC elements one by one.")
        w.line("template <typename T, int VEC>")
        w.line(f"__global__ void __launch_bounds__({plan.block})")
        w.line(f"{self.kname}_flat(const {self.args_t} A, int64_t n)")
        with w.block():
            w.line("using acc_t = typename sg::Acc<T>::type;")
            w.line(f"constexpr int UNROLL = {plan.unroll};")
            w.line(f"const int64_t W = {self.expr(p.width, Ctx())}; (void)W;")
            ctx = Ctx()
            w.lines(self._globals(ctx))
            for key in self.elem_loads:
                fld = key[0]
                w.line(f"const {self.ctype_of(fld)}* __restrict__ {self.pointer_name(key)} = "
                       f"(const {self.ctype_of(fld)}*)A.{fld}.data;")
            for i, s in enumerate(p.stores):
                t = self.ctype_of(s.field)
                w.line(f"{t}* __restrict__ o_{i} = ({t}*)A.{s.field}.data;")
            w.line("const int64_t nvec = n / VEC;")
            w.line("const int64_t step = (int64_t)gridDim.x * blockDim.x * UNROLL;")
            with w.block("for (int64_t c0 = (int64_t)blockIdx.x * blockDim.x * UNROLL + threadIdx.x; c0 < nvec; "
                         "c0 += step)"):
                self.write_chunks(w, ctx)
            # the tail: the last n % VEC elements, one per thread of the first block
            with w.block("for (int64_t e = nvec * VEC + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; "
                         "e += (int64_t)gridDim.x * blockDim.x)"):
                self.write_tail_element(w, ctx)
        return w.text()

    def write_chunks(self, w: CWriter, ctx: Ctx) -> None:
        """A thread's UNROLL chunks: every load issued first, then the math and the stores."""
        for key in self.streamed():
            w.line(f"{self.raw_type(key)} l_{self.pointer_name(key)}[UNROLL];")
        w.line("#pragma unroll")
        with w.block("for (int u = 0; u < UNROLL; ++u)"):
            w.line("const int64_t c = c0 + (int64_t)u * blockDim.x;")
            with w.block("if (c < nvec)"):
                for key in self.streamed():
                    pn = self.pointer_name(key)
                    w.line(f"sg::load_raw<VEC>({pn} + c * VEC, l_{pn}[u]);")
        w.line("#pragma unroll")
        with w.block("for (int u = 0; u < UNROLL; ++u)"):
            w.line("const int64_t c = c0 + (int64_t)u * blockDim.x;")
            with w.block("if (c < nvec)"):
                for i, _ in enumerate(self.p.stores):
                    w.line(f"acc_t st_{i}[VEC];")
                raws = {key: f"l_{self.pointer_name(key)}[u]" for key in self.streamed()}
                masks: dict = {}  # one index per pattern of spanned dims (the [C] statistics share one)
                for key in self.elem_loads:
                    if key[1] == "bcast":  # a chunk lies in one row (W % VEC == 0): one base index per chunk
                        pn, present = self.pointer_name(key), self.elem_loads[key][0].attrs["present"]
                        if present not in masks:
                            masks[present] = f"b_{len(masks)}"
                            w.lines(self.bcast_index(key, "c * VEC", masks[present]))
                        step = " + v" if present[-1] else ""
                        raws[key] = self._bcast_ref(key, f"{pn}[{masks[present]}{step}]")
                w.line("#pragma unroll")
                with w.block("for (int v = 0; v < VEC; ++v)"):
                    w.lines(self._element(ctx, raws, "st_{}[v]"))
                for i, _ in enumerate(self.p.stores):
                    w.line(f"sg::store_vec<VEC>(o_{i} + c * VEC, st_{i});")

    def write_tail_element(self, w: CWriter, ctx: Ctx) -> None:
        """Element `e` of the tail, read and written one by one."""
        tails, masks = {}, {}
        for key in self.elem_loads:
            pn = self.pointer_name(key)
            if key[1] == "bcast":
                present = self.elem_loads[key][0].attrs["present"]
                if present not in masks:
                    masks[present] = f"b_{len(masks)}"
                    w.lines(self.bcast_index(key, "e", masks[present]))
                tails[key] = self._bcast_ref(key, f"{pn}[{masks[present]}]")
                continue
            w.line(f"sg::Raw<{self.ctype_of(key[0])}, 1> t_{pn}; t_{pn}.v[0] = {pn}[e];")
            tails[key] = f"t_{pn}"
        for i, _ in enumerate(self.p.stores):
            w.line(f"acc_t st_{i}[1];")
        with w.block():
            w.line("constexpr int v = 0;")
            w.lines(self._element(ctx, tails, "st_{}[0]"))
        for i, _ in enumerate(self.p.stores):
            w.line(f"sg::store_vec<1>(o_{i} + e, st_{i});")

    def _bcast_ref(self, key, element: str) -> str:
        n = self.elem_loads[key][0]
        return f"(acc_t)sg::to_acc({element})" if n.dtype == "float" else f"({self.ctype_var(n)})({element})"

    def emit_finalize(self) -> str:
        return ""

    def emit_host(self, dtypes: list[str]) -> str:
        from .... import abi

        p, plan = self.p, self.plan
        rows = " * ".join(dim_expr(d) for d in p.row_dims) or "(int64_t)1"
        conds = [f"sg::aligned16(A.{key[0]}.data)" for key in self.streamed()]
        conds += [f"sg::aligned16(A.{s.field}.data)" for s in p.stores]
        if plan.bcasts:
            conds.append("W % VEC == 0")
        w = CWriter()
        w.line("template <typename T>")
        w.line(f"static cudaError_t {self.kname}_launch(const {self.args_t}& A, cudaStream_t stream)")
        with w.block():
            w.line(f"const int64_t W = {self.expr(p.width, Ctx())};")
            w.line(f"const int64_t n = {rows} * W;")
            w.line("if (n == 0) return cudaSuccess;")
            w.line("constexpr int VEC = 16 / sizeof(T) > 0 ? 16 / sizeof(T) : 1;")
            w.line("// 16-byte accesses need aligned pointers (offset views may not be); the total size need")
            w.line("// not be a multiple of VEC (scalar tail)")
            w.line("const bool vec_ok = " + ("\n    && ".join(conds) or "true") + ";")
            w.line(f"constexpr int BLOCK = {plan.block};")
            w.line("const int vec = vec_ok ? VEC : 1;")
            w.line(f"const int64_t need = ((n + vec - 1) / vec + (int64_t)BLOCK * {plan.unroll} - 1) / "
                   f"((int64_t)BLOCK * {plan.unroll});")
            w.line("// a block per BLOCK x UNROLL chunks, at most `waves` waves of resident blocks, striding over the rest")
            w.line(f"const int per_sm = vec_ok ? sg::blocks_per_sm<{self.kname}_flat<T, VEC>>(BLOCK)"
                   f" : sg::blocks_per_sm<{self.kname}_flat<T, 1>>(BLOCK);")
            w.line(f"const int64_t cap = (int64_t)sg::sm_count() * per_sm * {plan.waves};")
            w.line("const int64_t gx = need < cap ? (need > 0 ? need : 1) : cap;")
            w.line(f"if (vec_ok) {self.kname}_flat<T, VEC><<<(unsigned)gx, BLOCK, 0, stream>>>(A, n);")
            w.line(f"else {self.kname}_flat<T, 1><<<(unsigned)gx, BLOCK, 0, stream>>>(A, n);")
            w.line("return cudaGetLastError();")
        w.line()
        w.lines(entry_function(abi.entry_point(self.spec, self.direction), self.args_t, self.kname,
                               self.dispatch_field(), dtypes))
        return w.text()
