"""The prologue kernel of a direction with pretotals (pretotal.py): sums over all rows of per-row
values known before the row pass (a mask's count), written to the head of the workspace, which
every later kernel of the launch reads as `sg_pre[k]`. A mixin of emit.DirectionEmitter.

Workspace layout when there are pretotals: [npre doubles][the reductions' float partials]; the
kernels take `partials` (just past the doubles), so sg_pre sits right before it and no kernel
signature changes. Deterministic: one block, each thread its rows in order, a fixed tree."""
from __future__ import annotations

from .ctext import Ctx
from .cwriter import CWriter
from .ir import Node, walk

PROLOGUE_THREADS = 1024  # one block; a power of two for the tree


class PretotalEmitter:
    pretotals: list[Node]  # the direction's pretotal nodes, in program order (DirectionEmitter.__init__)

    def pretotal_expr(self, node: Node) -> str:
        k = self.pretotals.index(node)
        return f"(acc_t)sg_pre[{k}]" if node.dtype == "float" else f"(int64_t)sg_pre[{k}]"

    def pretotal_view(self) -> list[str]:
        """A kernel's definition of sg_pre (nothing without pretotals)."""
        n = len(self.pretotals)
        if not n:
            return []
        return [f"const double* sg_pre = reinterpret_cast<const double*>(partials) - {n};  "
                "// the prologue's sums over all rows (pretotal.py)", "(void)sg_pre;"]

    def emit_pretotals(self) -> str:
        totals = self.pretotals
        if not totals:
            return ""
        w = CWriter()
        w.line("// Sums over all rows that the per-element values need, before the row pass: one block,")
        w.line("// each thread sums its rows in order, then a fixed tree (deterministic), in double.")
        w.line("template <typename T>")
        w.line(f"__global__ void __launch_bounds__({PROLOGUE_THREADS}) {self.kname}_pretotals(const {self.args_t} A, "
               "double* __restrict__ pre, int64_t rows)")
        with w.block():
            w.line("using acc_t = typename sg::Acc<T>::type;")
            w.line(f"__shared__ double tree[{PROLOGUE_THREADS}];")
            w.line(f"const int64_t W = {self.expr(self.p.width, Ctx())}; (void)W;")
            for k, total in enumerate(totals):
                with w.block():
                    w.line("double part = 0;")
                    with w.block("for (int64_t row = threadIdx.x; row < rows; row += blockDim.x)"):
                        ctx = Ctx()
                        self.write_prologue_gathers(w, total.args[0], ctx)
                        w.line(f"part += (double)({self.expr(total.args[0], ctx)});")
                    w.line("tree[threadIdx.x] = part;")
                    w.line("__syncthreads();")
                    with w.block(f"for (int w = {PROLOGUE_THREADS // 2}; w > 0; w /= 2)"):
                        w.line("if ((int)threadIdx.x < w) tree[threadIdx.x] += tree[threadIdx.x + w];")
                        w.line("__syncthreads();")
                    w.line(f"if (threadIdx.x == 0) pre[{k}] = tree[0];")
                    w.line("__syncthreads();  // tree is reused by the next sum")
        return w.text()

    def write_prologue_gathers(self, w: CWriter, summand: Node, ctx: Ctx) -> None:
        """The summand's gathers (a [W] parameter at the row's index: pretotal.column_only), each
        read directly at its column, as the row kernel's gathers read their inputs."""
        for n in self.nodes:
            if n.op != "gather" or not self.reaches(summand, n):
                continue
            name = self.var(n)
            w.line(f"{self.ctype_var(n)} {name};")
            with w.block():
                w.line(f"const int64_t at = {self.expr(n.args[1], ctx)};")
                w.line("const int64_t j = at < 0 ? 0 : (at >= W ? W - 1 : at);  // as the row kernel's gathers")
                inner = Ctx(dict(ctx.names))
                for m in self.nodes:
                    if m.op == "load" and m.level == "elem" and self.reaches(n.args[0], m):
                        off = self.expr(m.attrs["offset"], Ctx()) if m.attrs.get("offset") is not None else "0"
                        inner.loads[m.id] = (f"(acc_t)sg::to_acc(((const {self.ctype_of(m.attrs['field'])}*)"
                                             f"A.{m.attrs['field']}.data)[{off} + j])")
                w.line(f"{name} = {self.expr(n.args[0], inner)};")
            ctx.names[n.id] = name

    @staticmethod
    def reaches(root: Node, target: Node) -> bool:
        return any(n is target for n in walk(root))

    def write_pretotal_launch(self, w: CWriter) -> None:
        if self.pretotals:
            w.line(f"{self.kname}_pretotals<T><<<1, {PROLOGUE_THREADS}, 0, stream>>>(args, pre, rows);")
