"""The finalize kernels of a direction: reductions over rows (weight gradients, a loss) summed
from the row kernel's per-slot partials in a fixed order (deterministic), then their epilogue.
A mixin of emit.DirectionEmitter."""
from __future__ import annotations

from .ctext import Ctx, pitch_expr
from .cwriter import CWriter
from .ir import Node, Store
from .schedule import FEW_FIN_ROWS


class FinalizeEmitter:
    def post_stores(self) -> list[Store]:
        return [s for s in self.p.stores if s.kind in ("col", "global")]

    def emit_finalize(self) -> str:
        if not self.post_stores():
            return ""
        w = CWriter()
        col = [s for s in self.post_stores() if s.kind == "col"]
        if col:  # grouped reductions (many groups of few slots each): a thread per column
            if self.grouped_cols():
                self.write_finalize_cols_flat(w, col)
            else:
                self.write_finalize_cols_tiled(w, col)
        if any(s.kind == "global" for s in self.post_stores()):
            self.write_finalize_global(w)
        return w.text()

    def write_finalize_global(self, w: CWriter) -> None:
        """One block: each reduction over all rows summed from its slots in a 256-wide tree, then the epilogue."""
        ncol = len(self.colreduces)
        w.line("// One block sums the per-slot partials of each reduction over all rows: a fixed tree.")
        w.line("template <typename T>")
        w.line(f"__global__ void {self.kname}_finalize_global(const {self.args_t} A, "
               "const float* __restrict__ partials, int64_t slots, int64_t cslots)")
        with w.block():
            w.line("using acc_t = typename sg::Acc<T>::type;")
            w.line("__shared__ double tree[256];")
            w.lines(self.pretotal_view())
            w.line(f"const int64_t W = {self.expr(self.p.width, Ctx())};")
            ctx = Ctx()
            for i, g in enumerate(self.globalreduces):
                with w.block():
                    w.line("double part = 0;")
                    w.line(f"for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) "
                           f"part += partials[{ncol} * cslots * W + {i} * slots + s];")
                    w.line("tree[threadIdx.x] = part;")
                    w.line("__syncthreads();")
                    with w.block("for (int w = blockDim.x / 2; w > 0; w /= 2)"):
                        w.line("if ((int)threadIdx.x < w) tree[threadIdx.x] += tree[threadIdx.x + w];")
                        w.line("__syncthreads();")
                w.line(f"const acc_t {self.var(g)} = (acc_t)tree[0];")
                w.line("__syncthreads();")
                ctx.names[g.id] = self.var(g)
            w.line("if (threadIdx.x != 0) return;")
            w.lines(self.global_epilogue(ctx))

    def global_epilogue(self, ctx: Ctx) -> list[str]:
        """Statements writing the outputs of the reductions over all rows, named in ctx: the
        global-level values they need (those ctx does not name yet), then each store."""
        lines = []
        for n in self.nodes:
            if n.level == "global" and n.op not in ("dim", "stride") and n.id not in ctx.names:
                ctx.names[n.id] = self.var(n)
                lines.append(f"const {self.ctype_var(n)} {self.var(n)} = {self.expr_fresh(n, ctx)};")
        for s in (s for s in self.post_stores() if s.kind == "global"):
            t = self.ctype_of(s.field)
            for n in self.closure([s.value], "post"):
                if n.id not in ctx.names and n.op != "globalreduce":
                    ctx.names[n.id] = self.var(n)
                    lines.append(f"const acc_t {self.var(n)} = {self.op_expr(n, [self.expr(a, ctx) for a in n.args])};")
            lines.append(f"*({t}*)A.{s.field}.data = ({t})({self.expr(s.value, ctx)});")
        return lines

    def finalizes_in_cluster(self, variant) -> bool:
        """Few rows may finalize their reductions over all rows in their own cluster (the row
        kernel's tail, `partials == nullptr`; schedule.few_finalized_in_cluster): the block form, and
        reductions over all rows only (no column reductions)."""
        return (variant.few_fin == "cluster" and bool(self.globalreduces) and not self.colreduces
                and not self.pretotals
                and self.few_allowed(variant) and self.few_block_form(variant))

    def write_cluster_finalize(self, w: CWriter, ctx: Ctx) -> None:
        """The row kernel's tail for few rows launched as one cluster of at most FEW_FIN_ROWS blocks
        (a row each): the first block sums the blocks' partials in the finalize kernel's tree order
        (the same bits as finalize_global: its 256-wide tree over <= 8 slots adds zeros first), then
        writes the outputs. `ctx` names the row kernel's global-level values."""
        n = len(self.globalreduces)
        with w.block("if constexpr (TPR == BLOCK)"):
            with w.block("if (partials == nullptr)",
                         comment="few rows, the grid one cluster (the host's fin_cluster): finalized here"):
                w.directive("#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900")
                w.line(f"__shared__ float fin_part[{n}];  // this block's partials (its row's)")
                w.lines(f"if (threadIdx.x == 0) fin_part[{i}] = (float)gacc_{i};" for i in range(n))
                w.line("cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();")
                w.line("cluster.sync();  // every block's partials are in its shared memory")
                with w.block("if (cluster.block_rank() == 0 && threadIdx.x == 0)"):
                    w.line("const int blocks = (int)cluster.num_blocks();")
                    self.write_cluster_sums(w, ctx)
                w.line("cluster.sync();  // the first block has read every block's shared memory")
                w.directive("#else")
                w.line("__trap();  // the host launches it so only for code built for sm_90+ (clusters_ok)")
                w.directive("#endif")
                w.line("return;")

    def write_cluster_sums(self, w: CWriter, ctx: Ctx) -> None:
        """The first block's sums of the cluster's partials (a FEW_FIN_ROWS-wide tree each), then the epilogue."""
        fin_ctx = Ctx(dict(ctx.names), dict(ctx.loads))
        for i, g in enumerate(self.globalreduces):
            t = f"tree_{i}"
            w.line(f"double {t}[{FEW_FIN_ROWS}];")
            w.line(f"for (int r = 0; r < {FEW_FIN_ROWS}; ++r) {t}[r] = r < blocks ? "
                   f"(double)*cluster.map_shared_rank(fin_part + {i}, r) : 0.0;")
            w.line(f"for (int w = {FEW_FIN_ROWS // 2}; w > 0; w /= 2) for (int r = 0; r < w; ++r) "
                   f"{t}[r] += {t}[r + w];")
            w.line(f"const acc_t {self.var(g)} = (acc_t){t}[0];")
            fin_ctx.names[g.id] = self.var(g)
        w.lines(self.global_epilogue(fin_ctx))

    def grouped_cols(self) -> bool:
        """Column reductions per group of rows (rope's cos/sin grads: a group of H rows per
        position), not one group of all rows: many groups of a few slots each."""
        return bool(self.p.group_div) and [str(d) for d in self.p.group_div] != [str(d) for d in self.p.row_dims]

    def finalize_cols_launch(self) -> str:
        """The host's launch statement of the column finalize, in the geometry its form assumes."""
        if self.grouped_cols():  # a thread per (group, column)
            return (f"{self.kname}_finalize_cols<T><<<(unsigned)((groups * W + 255) / 256 < 65535 ? "
                    f"(groups * W + 255) / 256 : 65535), 256, 0, stream>>>(args, partials, cslots, groups);")
        # 32 columns per block of 8 warps, groups along y
        return (f"{self.kname}_finalize_cols<T><<<dim3((unsigned)((W + 31) / 32), (unsigned)(groups < "
                f"65535 ? groups : 65535)), 256, 0, stream>>>(args, partials, cslots, groups);")

    def write_finalize_cols_flat(self, w: CWriter, col: list) -> None:
        w.line("// Sums of the per-slot column partials, in slot order (deterministic), then the epilogue:")
        w.line("// a thread per column of a group (grouped reductions: many groups of few slots each).")
        w.line("template <typename T>")
        w.line(f"__global__ void {self.kname}_finalize_cols(const {self.args_t} A, "
               "const float* __restrict__ partials, int64_t cslots, int64_t groups)")
        with w.block():
            w.line("using acc_t = typename sg::Acc<T>::type;")
            w.line(f"const int64_t W = {self.expr(self.p.width, Ctx())};")
            w.line("const int64_t per_group = cslots / groups;")
            w.lines(self.pretotal_view())
            with w.block("for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < groups * W; "
                         "idx += (int64_t)gridDim.x * blockDim.x)"):
                w.line("const int64_t g = idx / W, j = idx % W;")
                ctx = Ctx()
                for i, c in enumerate(self.colreduces):
                    # hundreds of slot partials in one float chain lose ~1e-5 relative: sum in double
                    w.line(f"double {self.var(c)}_f64 = 0;")
                    w.line(f"for (int64_t s = 0; s < per_group; ++s) {self.var(c)}_f64 += "
                           f"(double)partials[({i} * cslots + g * per_group + s) * W + j];")
                    w.line(f"const acc_t {self.var(c)} = (acc_t){self.var(c)}_f64;")
                    ctx.names[c.id] = self.var(c)
                w.lines(self.col_epilogue(col, ctx))

    def write_finalize_cols_tiled(self, w: CWriter, col: list) -> None:
        w.line("// Sums of the per-slot column partials, then the epilogue. A block takes 32 columns of one")
        w.line("// group (coalesced rows of partials); its 8 warps sum every 8th slot, then warp 0 sums the")
        w.line("// 8 in order: a fixed tree (deterministic) with 8x the loads in flight of a thread per column.")
        w.line("template <typename T>")
        w.line(f"__global__ void __launch_bounds__(256) {self.kname}_finalize_cols(const {self.args_t} A, "
               "const float* __restrict__ partials, int64_t cslots, int64_t groups)")
        with w.block():
            w.line("using acc_t = typename sg::Acc<T>::type;")
            w.line(f"const int64_t W = {self.expr(self.p.width, Ctx())};")
            w.line("const int64_t per_group = cslots / groups;")
            w.lines(self.pretotal_view())
            w.line(f"__shared__ double fin[{len(self.colreduces)}][8][32];")
            w.line("const int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5);")
            w.line("const int64_t j = (int64_t)blockIdx.x * 32 + lane;")
            with w.block("for (int64_t g = blockIdx.y; g < groups; g += gridDim.y)"):
                for i in range(len(self.colreduces)):
                    # hundreds of slot partials in one float chain lose ~1e-5 relative: sum in double
                    with w.block():
                        w.line("double part = 0;")
                        with w.block("if (j < W)"):
                            w.line("#pragma unroll 4")
                            w.line(f"for (int64_t s = warp; s < per_group; s += 8) "
                                   f"part += (double)partials[({i} * cslots + g * per_group + s) * W + j];")
                        w.line(f"fin[{i}][warp][lane] = part;")
                w.line("__syncthreads();")
                with w.block("if (warp == 0 && j < W)"):
                    ctx = Ctx()
                    for i, c in enumerate(self.colreduces):
                        w.line(f"double {self.var(c)}_f64 = fin[{i}][0][lane];")
                        w.line(f"for (int w = 1; w < 8; ++w) {self.var(c)}_f64 += fin[{i}][w][lane];")
                        w.line(f"const acc_t {self.var(c)} = (acc_t){self.var(c)}_f64;")
                        ctx.names[c.id] = self.var(c)
                    w.lines(self.col_epilogue(col, ctx))
                w.line("__syncthreads();  // fin is reused by the next group")

    def col_epilogue(self, col: list, ctx: Ctx) -> list[str]:
        """Statements writing the column outputs of group g, column j, from the summed partials named in ctx."""
        lines = []
        self.name_column_loads([s.value for s in col], ctx)
        for s in col:
            t = self.ctype_of(s.field)
            pitch = pitch_expr(self.p, self.types[s.field])
            off = self.expr(s.offset, ctx) if s.offset is not None else "0"
            for n in self.closure([s.value], "post"):
                if n.id not in ctx.names and n.op != "colreduce":
                    ctx.names[n.id] = self.var(n)
                    lines.append(f"const acc_t {self.var(n)} = "
                                 f"{self.op_expr(n, [self.expr(a, ctx) for a in n.args])};")
            lines.append(f"(({t}*)A.{s.field}.data)[g * {pitch} + {off} + j] = sg::from_acc<{t}>"
                         f"((acc_t)({self.expr(s.value, ctx)}));")
        return lines

    def name_column_loads(self, roots: list, ctx: Ctx) -> None:
        """A [W] parameter the epilogue reads (a gradient through |alpha * c| is sign(alpha) times a
        column sum): read at column j. Only column loads can be: the epilogue has no row."""
        seen, stack = set(), list(roots)
        while stack:
            n = stack.pop()
            if n.id in seen or n.id in ctx.names or n.op == "colreduce":
                continue
            seen.add(n.id)
            if n.op == "load" and n.level == "elem":
                assert n.attrs["kind"] == "col", f"emit: a column epilogue reads {n.attrs['field']} per row"
                fld, off = n.attrs["field"], n.attrs.get("offset")
                at = f"{self.expr(off, ctx)} + j" if off is not None else "j"
                conv = "(acc_t)sg::to_acc" if n.dtype == "float" else f"({self.ctype_var(n)})"
                ctx.loads[n.id] = f"{conv}(((const {self.ctype_of(fld)}*)A.{fld}.data)[{at}])"
            stack.extend(n.args)

    def expr_fresh(self, n: Node, ctx: Ctx) -> str:
        saved = ctx.names.pop(n.id, None)
        text = self.expr(n, ctx)
        if saved is not None:
            ctx.names[n.id] = saved
        return text
