"""The host side of a direction: the launcher that checks alignment, picks the schedule from
the row width (mirrored by schedule.plan), sizes the grid and the partials, launches the row
kernel and the finalize, and the C entry point that dispatches on the dtype.
A mixin of emit.DirectionEmitter."""
from __future__ import annotations

from ... import abi
from ...inputs import TORCH_DTYPES
from .ctext import Ctx, dim_expr, entry_function, launch_need_param, pitch_expr, take_workspace, workspace_entry
from .cwriter import CWriter
from .schedule import (FEW_FIN_ROWS, FEW_MIN_CHUNKS, FEW_MIN_ELEMS, FEW_TPRS, FEW_WAVES, MAX_CLUSTER, Variant,
                       few_block_tprs, items_max)


class HostEmitter:
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

    def staged_keys(self) -> list:
        """Loads a staged looped cluster (Variant.loop_stage) keeps in shared memory: the per-row
        ones (a [W] parameter stays in L2). None for a program without row reductions: its one
        sweep reads each value once, and a staged block alone on its SM would stream at a fraction
        of the default's occupancy (a review of loopstage, session 36)."""
        if not (self.variant.loop_stage and self.loop_cluster_on(self.variant)) or self.row_free():
            return []
        return [k for k in self.elem_loads if k[1] != "col"]

    def stage_bytes_expr(self) -> str:
        """C++: the shared memory a block of a staged looped cluster asks (mirrors the kernel's)."""
        lcl = self.variant.loop_tpr * self.variant.loop_cluster
        per_chunk = " + ".join(f"(sizeof({self.raw_type(k)}) + 15) / 16 * 16" for k in self.staged_keys())
        return f"(size_t)((chunks + {lcl} - 1) / {lcl}) * {self.variant.loop_tpr} * ({per_chunk})"

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

    def few_allowed(self, variant: Variant) -> bool:
        """Few rows over clusters (schedule.FEW_TPRS): any program without column partials
        (those have no split form). Unlike split rows, losses take it too: a handful of rows is
        latency-bound, not read twice."""
        if not variant.few_rows or self.colreduces:
            return False
        if self.row_free() or self.few_block_form(variant):
            return True
        # with row reductions only where some dtype's plain schedule reaches FEW_MIN_ELEMS a thread
        # (else the kernel would carry instantiations no call takes)
        vecs = {16 // TORCH_DTYPES[d].itemsize: TORCH_DTYPES[d].itemsize for d in self.spec.dtypes}
        return any(items_max(variant, self.words_per_item(size, vec)) * vec >= FEW_MIN_ELEMS for vec, size in vecs.items())

    def few_block_form(self, variant: Variant) -> bool:
        """A few row as one block (`few_form` "block") is for programs with row reductions (fewer
        rounds than a cluster's); a program without keeps the cluster, one chunk a thread: at 8 x
        4096 on the H200 the block form made swiglu 1.34-1.51x and cross-entropy's backward
        1.11-1.31x slower (results/2026-12-02-h200-session16, call 1)."""
        return variant.few_form == "block" and not self.row_free()

    def few_pair_own(self, variant: Variant) -> bool:
        """Few-row blocks with their own (max, sum) form: an instantiation flag FEW."""
        reductions = [n for n in self.nodes if n.op == "rowreduce"]
        return (variant.few_pair != "same" and variant.few_pair != variant.reg_pair and self.few_allowed(variant)
                and self.few_block_form(variant) and self.online_partner(reductions, reductions) is not None)

    def few_macros_own(self, variant: Variant) -> bool:
        """Few-row blocks launched by their own macros (SG_*_FEWB): their own instantiation (FEW),
        or a launch that may run the grid as one cluster (finalizes_in_cluster)."""
        return self.few_pair_own(variant) or self.finalizes_in_cluster(variant)

    def few_block_kernel(self, variant: Variant, vec: str, tpr: str, items: str) -> str:
        """The few-row block form's instantiation: FEW set when it has its own (max, sum) form."""
        flag = ", true" if self.few_pair_own(variant) else ""
        return f"{self.kname}_rows<T, {vec}, {tpr}, {items}, {tpr}{flag}>"

    def write_few_rows_choice(self, w: CWriter) -> None:
        """C++: `few` and, when taken, its (tpr, items), after the plain schedule is chosen (see
        schedule.few_rows_tpr, its Python mirror)."""
        if self.few_block_form(self.variant):
            tprs = few_block_tprs(self.variant)
            sizes = " : ".join(f"chunks <= {2 * t} ? {t}" for t in tprs[:-1]) + (" : " if len(tprs) > 1 else "")
            # a block per row: rows up to FEW_WAVES per SM (64 rows of 4096 bf16 took 0.75x eager's
            # log-softmax in the medium schedule's 64-thread rows: results/2026-12-02-h200-session14)
            few_rows = f"vec_ok && rows <= {FEW_WAVES} * (int64_t)sg::sm_count() && chunks >= {FEW_MIN_CHUNKS}"
            w.line(f"// few rows (decode sizes): while the rows fit in {FEW_WAVES} waves of a block per SM, a row "
                   f"of {FEW_MIN_CHUNKS}-{2 * tprs[-1]} chunks takes a whole block, 2 chunks per thread")
            w.line(f"const bool few = {few_rows} && chunks <= {2 * tprs[-1]} && 2 <= ITEMS_MAX;")
            w.line(f"if (few) {{ tpr = {sizes}{tprs[-1]}; items = 2; }}")
            return
        few_rows = (f"vec_ok && rows * {MAX_CLUSTER} <= {FEW_WAVES} * (int64_t)sg::sm_count() && "
                    f"chunks >= {FEW_MIN_CHUNKS}")
        first = f"{self.kname}_rows<T, VEC, {FEW_TPRS[0]}, 1, {FEW_TPRS[0] // MAX_CLUSTER}>"
        serial = "true" if self.row_free() else f"items * VEC >= {FEW_MIN_ELEMS}"
        sizes = " : ".join(f"chunks <= {t} ? {t}" for t in FEW_TPRS[:-1])
        why = ("no row reductions: the row's blocks need not meet" if self.row_free() else
               f"a row reduction: the cluster's rounds pay off only over {FEW_MIN_ELEMS}+ elements per thread")
        w.line(f"// few rows (decode sizes): while rows x {MAX_CLUSTER} blocks fit in {FEW_WAVES} waves of a block per SM,")
        w.line(f"// a row of {FEW_MIN_CHUNKS}-{FEW_TPRS[-1]} chunks spreads over a cluster of {MAX_CLUSTER} blocks, "
               "one chunk per thread")
        w.line(f"// ({why})")
        w.line(f"const bool few = {few_rows} && chunks <= {FEW_TPRS[-1]} && {serial} && sg::clusters_ok<{first}>();")
        w.line(f"if (few) {{ tpr = {sizes} : {FEW_TPRS[-1]}; items = 1; }}")

    def row_free(self) -> bool:
        """No reduction over a row: a row's blocks never combine anything."""
        return not any(n.op == "rowreduce" for n in self.nodes)

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
        return [s for s in variant.schedules if (self.loop_cluster_on(variant) if variant.is_loop_cluster(*s)
                                                 else not variant.is_split(*s) or self.split_allowed(variant))]

    def loop_cluster_on(self, variant: Variant) -> bool:
        """Few wide rows may loop over a cluster of blocks (Variant.loop_cluster) in a program that
        writes elements. Column partials come too: a looped row adds its terms straight into its
        slot's partials, each column one thread's, and the blocks of a cluster hold distinct columns
        (lane spans the cluster), so a slot per cluster is summed as a slot per block was (LayerNorm
        over [C, H, W]'s backward: 128 rows of 4M, one block each, 0.53x eager in session 34).
        A loss (no elem stores) keeps its block: its row-level sums go to a slot per block."""
        return variant.loop_cluster > 1 and any(st.kind == "elem" for st in self.p.stores)

    def write_schedule_chain(self, w: CWriter, variant: Variant, action: str) -> None:
        """An if-chain over the chosen (tpr, items) running `action` (a macro) per schedule;
        split rows run `action`_CL, looped clusters `action`_LCL, few rows `action`_FEW."""
        vec_rows = "else if (vec_ok)"
        if self.few_allowed(variant) and self.few_block_form(variant):  # the plain row kernel, 2 chunks a thread
            act = f"{action}_FEWB" if self.few_macros_own(variant) else action
            chain = " else ".join(f"if (tpr == {t}) {act}(VEC, {t}, 2);" for t in few_block_tprs(variant))
            w.line(f"if (few) {{ if constexpr (2 <= ITEMS_MAX) {{ {chain} }} }}")
        elif self.few_allowed(variant):
            chain = " else ".join(f"if (tpr == {t}) {action}_FEW(VEC, {t});" for t in FEW_TPRS[:-1])
            w.line(f"if (few) {{ {chain} else {action}_FEW(VEC, {FEW_TPRS[-1]}); }}")
        else:
            vec_rows = "if (vec_ok)"
        with w.block(vec_rows):
            for k, (tpr, items) in enumerate(self.vec_schedules(variant)):
                w.line(("if" if k == 0 else "else if") + " " + self.schedule_case(variant, action, tpr, items))
        with w.chain("else"):
            w.line(f"if (items == 1) {action}(1, 32, 1); else {action}(1, 256, 0);")

    def schedule_case(self, variant: Variant, action: str, tpr: int, items) -> str:
        """One branch of the schedule chain, after its `if`: the condition and the macro call."""
        if variant.is_loop_cluster(tpr, items):
            return f"(tpr == {tpr} && items == 0) {action}_LCL(VEC, {tpr}, 0);"
        if variant.is_split(tpr, items):
            return f"(tpr == {tpr} && items == ITEMS_MAX) {action}_CL(VEC, {tpr}, ITEMS_MAX);"
        cond = f"items == {items}" if items is not None else "items == ITEMS_MAX"
        arg = "ITEMS_MAX" if items is None else str(items)
        if items is not None and items > 0:  # a narrow schedule beyond ITEMS_MAX is never picked: not instantiated
            return (f"(tpr == {tpr} && {cond}) {{ if constexpr ({items} <= {self.narrow_max()}) "
                    f"{action}(VEC, {tpr}, {arg}); }}")
        return f"(tpr == {tpr} && {cond}) {action}(VEC, {tpr}, {arg});"

    def emit_host(self, dtypes: list[str]) -> str:
        """The launcher `<kname>_launch<T>`, the extern "C" entry point, and the size function
        when the launch needs a workspace."""
        w = CWriter()
        has_workspace = bool(self.colreduces or self.globalreduces or self.pretotals)
        w.line("template <typename T>")
        w.line(f"static cudaError_t {self.kname}_launch(const {self.args_t}& A, "
               f"cudaStream_t stream{launch_need_param(has_workspace)})")
        with w.block():
            self.write_sizes(w)
            self.write_vector_check(w)
            self.write_schedule_choice(w)
            self.write_block_shape(w)
            self.write_grid(w)
            self.write_partials(w)
            self.write_launches(w)
            w.line("return cudaGetLastError();")
        dispatch = self.dispatch_field()
        w.line()
        w.lines(entry_function(abi.entry_point(self.spec, self.direction), self.args_t, self.kname, dispatch, dtypes))
        if has_workspace:
            w.line()
            w.lines(workspace_entry(self.kname, abi.workspace_function(self.spec, self.direction), self.args_t,
                                    dispatch, dtypes))
        return w.text()

    def write_sizes(self, w: CWriter) -> None:
        """rows, W and the row groups (column reductions per group of rows); nothing to do when empty."""
        p = self.p
        rows = " * ".join(dim_expr(d) for d in p.row_dims) or "(int64_t)1"
        group = " * ".join(dim_expr(d) for d in (p.group_div or [])) or None
        w.line(f"const int64_t rows = {rows};")
        w.line(f"const int64_t W = {self.expr(p.width, Ctx())};")
        w.line(f"const int64_t rows_per_group = {group if group and self.colreduces else 'rows'};")
        w.line("const int64_t groups = rows_per_group > 0 ? rows / rows_per_group : 0;")
        w.line("if (rows == 0 || W == 0) return cudaSuccess;")

    def vector_conditions(self) -> list[str]:
        """C++ conditions for 16-byte accesses: every vector access starts on a 16-byte boundary."""
        p = self.p
        conds = ["W % VEC == 0"]
        for key in self.elem_loads:
            fld, kind, off, div = key
            conds.append(f"sg::aligned16(A.{fld}.data)")
            conds.append(f"({off}) % VEC == 0")
            if kind != "col":
                conds.append(f"{pitch_expr(p, self.types[fld])} % VEC == 0")
        for s in p.stores:
            if s.kind == "elem":
                conds.append(f"sg::aligned16(A.{s.field}.data)")
                conds.append(f"{pitch_expr(p, self.types[s.field])} % VEC == 0")
                if s.offset is not None:
                    conds.append(f"({self.expr(s.offset, Ctx())}) % VEC == 0")
        return conds

    def write_vector_check(self, w: CWriter) -> None:
        """VEC, the chunks a thread can hold in the variant's registers (ITEMS_MAX), vec_ok, chunks."""
        variant = self.variant
        conds = self.vector_conditions()
        w.line("constexpr int VEC = 16 / sizeof(T) > 0 ? 16 / sizeof(T) : 1;")
        w.line("// Registers one 16-byte chunk of the row costs a thread: the raw row of each streamed")
        w.line("// input" + (" and the fp32 column partials" if self.colreduces else "") +
               f"; ITEMS_MAX chunks fit the variant's {variant.data_regs} registers of row data.")
        if self.col_smem:
            w.line("// (medium rows keep their column partials in shared memory: not counted; narrow")
            w.line("// rows keep them in registers: ITEMS_NMAX)")
            w.line(f"constexpr int WORDS = {self.words_per_item_expr(False)};")
            w.line(f"constexpr int ITEMS_NMAX = sg::items_max({variant.data_regs}, "
                   f"{self.words_per_item_expr()}, {variant.items_cap});")
        else:
            w.line(f"constexpr int WORDS = {self.words_per_item_expr()};")
        w.line(f"constexpr int ITEMS_MAX = sg::items_max({variant.data_regs}, WORDS, {variant.items_cap});")
        w.line("const bool vec_ok = " + "\n    && ".join(conds) + ";")
        w.line("const int64_t chunks = vec_ok ? W / VEC : W;")

    def write_schedule_choice(self, w: CWriter) -> None:
        """(tpr, items) from the row's chunks: the C++ of schedule.plan, then the few-rows override."""
        variant = self.variant
        w.line("// Schedule: narrow rows share a block (TPR <= 32 threads per row); medium rows are held")
        w.line("// in registers by the fewest threads (ITEMS_MAX chunks each, one row per block); rows")
        w.line("// wider than 1024 threads x ITEMS_MAX chunks are streamed by a looped pass.")
        w.line("int tpr = 0, items = 0;")
        if self.col_smem:
            w.line("// medium rows: shared memory for the column partials, if the device gives a block that much")
            w.line(f"const size_t csm_bytes = (size_t){len(self.colreduces)} * (size_t)W * "
                   "sizeof(typename sg::Acc<T>::type);")
            first = next(t for t, i in variant.schedules if i is None)
            w.line(f"const bool csm_ok = csm_bytes <= sg::dyn_smem_limit<{self.kname}_rows<T, VEC, {first}, ITEMS_MAX, "
                   f"{first}>>();  // (the medium rows' static scratch is the same at every TPR)")
        if self.split_allowed(variant):
            w.line("// split rows only where the row is wider than one block holds, on sm_90+ code")
            first = next(t for t, i in variant.schedules if variant.is_split(t, i))
            w.line(f"const bool split_ok = vec_ok && chunks > (int64_t){variant.block_max} * ITEMS_MAX && "
                   f"sg::clusters_ok<{self.kname}_rows<T, VEC, {first}, ITEMS_MAX, "
                   f"{variant.split_block_of(first)}>>();")
        if self.loop_cluster_on(variant):
            kernel = f"{self.kname}_rows<T, VEC, {variant.loop_tpr * variant.loop_cluster}, 0, {variant.loop_tpr}>"
            few_rows = "rows <= 2 * (int64_t)sg::sm_count()"
            if self.staged_keys():
                w.line(f"// wide rows: a looped row over a cluster of {variant.loop_cluster} blocks, staged in their shared")
                w.line("// memory (each thread its own chunks), where it fits a block's opt-in")
                w.line(f"const size_t stage_bytes = {self.stage_bytes_expr()};")
                rows_ok = f"stage_bytes <= sg::dyn_smem_limit<{kernel}>()"
                if self.colreduces:  # a slot of column partials per cluster: rows of them past one wave would be
                    # the input's size again (a review of loopstage, session 36); the few rows only
                    rows_ok += f" && {few_rows}"
            else:
                w.line(f"// few wide rows (at most two a SM): a looped row over a cluster of {variant.loop_cluster} blocks")
                rows_ok = few_rows
            w.line(f"const bool loop_cl_ok = vec_ok && {rows_ok} && sg::clusters_ok<{kernel}>();")
        with w.block("if (vec_ok)"):
            for tpr, items in self.vec_schedules(variant):
                w.line(self.schedule_pick(variant, tpr, items))
        with w.chain("else"):
            w.line("if (chunks <= 32) { tpr = 32; items = 1; } else { tpr = 256; items = 0; }")
        if self.few_allowed(variant):
            self.write_few_rows_choice(w)

    def schedule_pick(self, variant: Variant, tpr: int, items) -> str:
        """The statement taking schedule (tpr, items) when no earlier one was taken and the row fits it."""
        if variant.is_loop_cluster(tpr, items):
            return f"if (tpr == 0 && loop_cl_ok) {{ tpr = {tpr}; items = 0; }}  // a cluster of {variant.loop_cluster} blocks"
        if variant.is_split(tpr, items):
            return (f"if (tpr == 0 && split_ok && chunks <= (int64_t){tpr} * ITEMS_MAX) "
                    f"{{ tpr = {tpr}; items = ITEMS_MAX; }}  // a cluster of "
                    f"{tpr // variant.split_block_of(tpr)} blocks")
        if items == 0:
            return f"if (tpr == 0) {{ tpr = {tpr}; items = 0; }}"
        if items is None:
            fits = " && csm_ok" if self.col_smem else ""
            return f"if (tpr == 0{fits} && chunks <= (int64_t){tpr} * ITEMS_MAX) {{ tpr = {tpr}; items = ITEMS_MAX; }}"
        return (f"if (tpr == 0 && {items} <= {self.narrow_max()} && chunks <= (int64_t){tpr * items}) "
                f"{{ tpr = {tpr}; items = {items}; }}")

    def few_over_clusters(self, variant: Variant) -> bool:
        """Few rows spread over clusters (their own block size and macros), not the block form."""
        return self.few_allowed(variant) and not self.few_block_form(variant)

    def write_block_shape(self, w: CWriter) -> None:
        """block (threads), rpb (rows per block) and cl (blocks per row) of the chosen schedule."""
        variant = self.variant
        few_on = self.few_allowed(variant)
        # a few row's block: a cluster's share of the row, or (the block form) the whole row, never
        # split even when wider than the medium rows' blocks (fewtwo under cl256)
        few_block = f"few ? tpr / {MAX_CLUSTER} : " if self.few_over_clusters(variant) else \
            "few ? tpr : " if few_on else ""
        # (not for persistent blocks: their grid comes from an occupancy asked once per instantiation)
        narrow_spread = few_on and not variant.persistent
        const = "" if narrow_spread else "const "
        looped = f"items == 0 && tpr > {variant.loop_tpr} ? {variant.loop_tpr} : " if self.loop_cluster_on(variant) else ""
        w.line(f"{const}int block = {few_block}{looped}{self.split_block_expr(variant)} : tpr > 32 ? tpr : "
               f"{variant.row_block};  // TPR > 32: one row per block (or per cluster)")
        if narrow_spread:
            w.line("// few narrow rows (decode sizes): smaller blocks, down to one warp, until the rows fill the SMs")
            w.line("if (tpr <= 32) while (block > 32 && rows * tpr < (int64_t)block * sg::sm_count()) block /= 2;")
        w.line("const int rpb = tpr >= block ? 1 : block / tpr;")
        w.line("const int cl = tpr > block ? tpr / block : 1;  // blocks per row")

    def write_grid(self, w: CWriter) -> None:
        """The grid: a block per row group, or one persistent wave (the occupancy of the chosen
        instantiation); the slots of the reductions over rows."""
        variant, rb = self.variant, self.variant.row_block
        if variant.persistent or self.colreduces:
            w.line("// One wave of persistent blocks: as many as fit on the SMs at once (the instantiation's")
            w.line("// registers decide), each striding over rows; fewer when there are fewer rows.")
        else:
            w.line("// A block per row group (per row, past 32 threads per row), scheduled by the hardware:")
            w.line("// 4-14% faster than one wave of persistent blocks on the H200 (results/*-v4/variant_ab.md).")
        w.line("int per_sm = 1;")
        if self.col_smem:
            occupancy = (f"(V, P, I) per_sm = sg::blocks_per_sm_dyn<{self.kname}_rows<T, V, P, I, "
                         f"((P) > 32 ? (P) : {rb})>>(block, (P) > 32 && (I) > 0 ? csm_bytes : 0)")
        else:
            occupancy = f"(V, P, I) per_sm = sg::blocks_per_sm<{self.kname}_rows<T, V, P, I, ((P) > 32 ? (P) : {rb})>>(block)"
        macros = {"SG_OCC": occupancy, "SG_OCC_CL": "(V, P, I) per_sm = 1"}
        if self.loop_cluster_on(variant):
            macros["SG_OCC_LCL"] = "(V, P, I) per_sm = 1"
        if self.few_over_clusters(variant):
            macros["SG_OCC_FEW"] = "(V, P) per_sm = 1"
        if self.few_macros_own(variant):
            macros["SG_OCC_FEWB"] = (f"(V, P, I) per_sm = sg::blocks_per_sm<"
                                     f"{self.few_block_kernel(variant, 'V', 'P', 'I')}>(block)")
        self.write_with_macros(w, "SG_OCC", macros)
        w.line("int64_t per_group_blocks = (rows_per_group + rpb - 1) / rpb;")
        w.line("const int64_t cap = (int64_t)sg::sm_count() * per_sm / (groups > 0 ? groups : 1);")
        w.line("int64_t gx = per_group_blocks < cap ? per_group_blocks : cap;")
        w.line("if (gx < 1) gx = 1;")
        if not variant.persistent and not self.colreduces:
            w.line("gx = per_group_blocks;  // not persistent")
        w.line("if (cl > 1) gx = per_group_blocks * cl;  // split rows: a cluster per row, one pass")
        w.line("const dim3 grid((unsigned)gx, (unsigned)groups);")
        w.line("const int64_t slots = gx / cl * groups * rpb; (void)slots;  // row groups: global reductions")
        w.line("const int64_t cslots = gx / cl * groups; (void)cslots;  // blocks: column reductions")

    def write_with_macros(self, w: CWriter, action: str, macros: dict[str, str]) -> None:
        """`#define` each macro (name -> its parameters and body), the schedule chain calling
        `action`'s macros, then `#undef` them all."""
        for name, body in macros.items():
            w.directive(f"#define {name}{body}")
        self.write_schedule_chain(w, self.variant, action)
        for name in macros:
            w.directive(f"#undef {name}")

    def write_partials(self, w: CWriter) -> None:
        """The workspace of the reductions over rows (per-slot partials), or none; fin_cluster
        where few rows may finalize in their own cluster instead."""
        variant = self.variant
        ncol, nglob = len(self.colreduces), len(self.globalreduces)
        fin_cluster = self.finalizes_in_cluster(variant)
        if fin_cluster:
            first = self.few_block_kernel(variant, "VEC", str(few_block_tprs(variant)[0]), "2")
            w.line(f"// few rows of a loss ({FEW_FIN_ROWS} at most, a block each): the grid runs as one cluster whose")
            w.line("// first block sums the partials and writes the result: no finalize launch, no workspace")
            w.line(f"const bool fin_cluster = few && groups == 1 && gx <= {FEW_FIN_ROWS} && sg::clusters_ok<{first}>();")
        npre = len(self.pretotals)
        if npre:  # never with fin_cluster (finalizes_in_cluster): the kernels find sg_pre before partials
            w.line("// the prologue's sums over all rows (doubles), then the reductions' per-slot partials")
            w.line(f"const size_t partial_bytes = sizeof(double) * {npre} + sizeof(float) * ((size_t)cslots * "
                   f"{ncol} * (size_t)W + (size_t)slots * {nglob});")
            w.lines(take_workspace("partial_bytes"))
            w.line("double* pre = (double*)A.workspace;")
            w.line(f"float* partials = (float*)(pre + {npre});")
        elif ncol or nglob:
            w.line("// per-slot partials of the reductions over rows, summed in slot order by the finalize")
            none = "fin_cluster ? (size_t)0 : " if fin_cluster else ""
            w.line(f"const size_t partial_bytes = {none}sizeof(float) * ((size_t)cslots * {ncol} * (size_t)W "
                   f"+ (size_t)slots * {nglob});")
            w.lines(take_workspace("partial_bytes"))
            w.line("float* partials = (float*)A.workspace;")
        else:
            w.line("float* partials = nullptr;")
        w.line(f"const {self.args_t} args = A;")

    def write_launches(self, w: CWriter) -> None:
        """The row kernel's launch for the chosen schedule, then the finalize kernels."""
        variant, rb, ncol = self.variant, self.variant.row_block, len(self.colreduces)
        fail = "if (e_ != cudaSuccess) { (void)cudaGetLastError(); return e_; }"
        # narrow rows with column partials: shared memory to merge the block's row groups
        smem = f"((P) > 32 ? (size_t)0 : (size_t){rb} * (I) * (V) * sizeof(float))" if ncol else "0"
        if self.col_smem:  # (a looped row, I == 0, adds into its partials in place: no shared memory,
            # where asking csm_bytes failed the launch past the device's opt-in, W over ~58K floats)
            smem = f"((P) > 32 ? ((I) > 0 ? csm_bytes : (size_t)0) : (size_t){rb} * (I) * (V) * sizeof(float))"
            launch = (f"(V, P, I) do {{ const cudaError_t e_ = sg::launch_dyn<{self.kname}_rows<T, V, "
                      f"P, I, ((P) > 32 ? (P) : {rb})>>(grid, block, {smem}, stream, args, partials, "
                      f"rows_per_group); {fail} }} while (0)")
        else:
            launch = (f"(V, P, I) {self.kname}_rows<T, V, P, I, ((P) > 32 ? (P) : {rb})>"
                      f"<<<grid, block, {smem}, stream>>>(args, partials, rows_per_group)")
        sb = self.split_block_macro(variant)
        macros = {"SG_LAUNCH": launch,
                  "SG_LAUNCH_CL": (f"(V, P, I) do {{ const cudaError_t e_ = sg::launch_cluster<(P) / {sb}>("
                                   f"{self.kname}_rows<T, V, P, I, {sb}>, grid, block, stream, args, partials, "
                                   f"rows_per_group); {fail} }} while (0)")}
        if self.loop_cluster_on(variant):
            lt = variant.loop_tpr
            launch = (f"sg::launch_clusters_dyn<{self.kname}_rows<T, V, P, I, {lt}>>(grid, block, (P) / {lt}, stage_bytes, "
                      if self.staged_keys() else f"sg::launch_cluster<(P) / {lt}>({self.kname}_rows<T, V, P, I, {lt}>, "
                      "grid, block, ")
            macros["SG_LAUNCH_LCL"] = (f"(V, P, I) do {{ const cudaError_t e_ = {launch}stream, args, partials, "
                                       f"rows_per_group); {fail} }} while (0)")
        if self.few_over_clusters(variant):
            macros["SG_LAUNCH_FEW"] = (f"(V, P) do {{ const cudaError_t e_ = sg::launch_cluster<{MAX_CLUSTER}>("
                                       f"{self.kname}_rows<T, V, P, 1, (P) / {MAX_CLUSTER}>, grid, block, stream, "
                                       f"args, partials, rows_per_group); {fail} }} while (0)")
        kernel = self.few_block_kernel(variant, "V", "P", "I")
        fin_cluster = self.finalizes_in_cluster(variant)
        if fin_cluster:  # few-row blocks: maybe one cluster that finalizes (partials nullptr)
            macros["SG_LAUNCH_FEWB"] = (f"(V, P, I) do {{ if (fin_cluster) {{ const cudaError_t e_ = "
                                        f"sg::launch_cluster_n({kernel}, grid, block, (int)gx, stream, args, "
                                        f"(float*)nullptr, rows_per_group); {fail} }} "
                                        f"else {kernel}<<<grid, block, 0, stream>>>(args, partials, rows_per_group); "
                                        "} while (0)")
        elif self.few_pair_own(variant):  # few-row blocks: their own instantiation (their own (max, sum) form)
            macros["SG_LAUNCH_FEWB"] = f"(V, P, I) {kernel}<<<grid, block, 0, stream>>>(args, partials, rows_per_group)"
        self.write_pretotal_launch(w)
        self.write_with_macros(w, "SG_LAUNCH", macros)
        if ncol and any(s.kind == "col" for s in self.p.stores):
            w.line(self.finalize_cols_launch())
        if any(s.kind == "global" for s in self.p.stores):
            unless = "if (!fin_cluster) " if fin_cluster else ""
            w.line(f"{unless}{self.kname}_finalize_global<T><<<1, 256, 0, stream>>>(args, partials, slots, "
                   f"{'cslots' if ncol else '0'});")

    def dispatch_field(self) -> str | None:
        for p in self.spec.signature.inputs:
            if p.type.dtype is None:
                return p.name
        return None
