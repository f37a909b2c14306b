"""The builtin generator's schedules: which (TPR, ITEMS) a row gets, and the variants the
autotuner tries (each steers one shape class; `combine` merges the per-class winners).

`plan` mirrors the host code `emit_host` generates, for the tuner and the tests.
"""
from __future__ import annotations

from dataclasses import dataclass

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
ROW_BLOCK = 128  # threads per block when several rows share a block (TPR <= 32)
LOOP_UNROLL = 4  # 16-byte chunks per thread in flight in the looped pass
# Few rows (decode sizes: a handful of tokens): a block per row leaves most SMs idle and each
# thread with a long serial chain (on the H200, 8 rows of 4096 bf16: swiglu 3.4 us in 8 blocks
# of 128 threads, torch.compile's 32 blocks 1.1 us; softmax 4.8 us in 8 blocks of 64 threads).
# So while rows x MAX_CLUSTER blocks fit in FEW_WAVES waves of one block per SM, a row of
# FEW_MIN_CHUNKS to FEW_TPRS[-1] 16-byte chunks spreads over a cluster of MAX_CLUSTER blocks,
# one chunk per thread (TPR the next of FEW_TPRS, blocks of TPR / MAX_CLUSTER threads): always
# for a program without row reductions, and for one with them only where the plain schedule
# gives a thread FEW_MIN_ELEMS elements or more, as the cluster's reduction rounds cost about
# 0.4 us (benchmarks/decode_ab.py, session 11: swiglu 1.3-2.1x, softmax and cross-entropy
# forward bf16 (64 elements a thread) 1.2-1.5x faster; rmsnorm forward and softmax backward
# (32) 0.75-0.85x).
FEW_TPRS = (256, 512, 1024, 2048)
FEW_MIN_CHUNKS = 129
FEW_MIN_ELEMS = 64
FEW_BLOCK_TPRS = (128, 256, 512, 1024)  # the block form: TPR for rows of up to 2 x TPR chunks
FEW_WAVES = 2
FEW_FIN_ROWS = MAX_CLUSTER  # few rows finalized in their own cluster (`few_fin`): a portable cluster's blocks
H200_SMS = 132  # the SM count the Python mirrors assume when no GPU is asked


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
    `moments` True: a row's mean and squared deviations (LayerNorm) from each thread's exact
    moments merged in one round (sg::group_moments) instead of two reduction rounds; in axis
    programs, the squared deviations swept with the mean's sum (families/axis_emit.py).
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
    moments: bool = False
    # flat pointwise kernels (families/flat.py): 16-byte chunks in flight per thread, and the grid's
    # cap in waves of resident blocks. One chunk per thread beat four chunks over one persistent
    # wave on the H200 by 8% in float32 and 2.3x in bfloat16 (residual SiLU, 4096 x 4096, session 7);
    # a block per 256 chunks with no cap in practice (aten's grid: no striding loop) beat the old cap
    # of 64 waves by 4-5% at 6.4 GB and reaches 100.8% / 99.5% of x.neg()'s bandwidth in float32 /
    # bfloat16, where 64 waves gave 96.1% / 96.6% (hardsigmoid, benchmarks/flat_study.py, session 16)
    flat_unroll: int = 1
    flat_waves: int = 4096
    # few rows (decode sizes): a row over a cluster of blocks, one chunk per thread (FEW_TPRS);
    # `few_form` "block": one block per row instead, of FEW_BLOCK_TPRS threads, 2 chunks each (programs
    # with row reductions; the others keep the clusters)
    few_rows: bool = True
    few_form: str = "cluster"
    # few rows in the block form: "same" takes the medium rows' (max, sum) form (`reg_pair`);
    # "twopass" the exact two rounds (a max round, then a sum round: no exps in the merge), as
    # its own instantiation (template flag FEW), so the medium rows keep theirs
    few_pair: str = "same"
    # few rows in the block form, of a program with a reduction over all rows (a mean loss): "cluster"
    # runs up to FEW_FIN_ROWS rows' blocks as one cluster whose first block sums their partials and
    # writes the result (one launch); "launch" leaves that to the finalize kernel (a second launch,
    # 1.36 us of cross-entropy's 4.3 at 8 x 4096 on the H200, session 16)
    few_fin: str = "cluster"
    # a row group of one block (medium and few rows): how its warps' values are combined. "serial":
    # warp 0 loops over them and broadcasts the result through shared memory (three barriers);
    # "tree": every warp combines them in a shuffle tree (two barriers, a different order of sums).
    # To time at decode sizes (softmax 2.1 us against Liger's 1.6, session 17), not in VARIANTS yet.
    red_form: str = "serial"
    # wide rows (looped): how a float sum is kept over the sweep. "plain": one accumulator per
    # thread; "chains": UNROLL partials, one per chunk in flight, added at the end of the sweep
    # (sequential chains UNROLL times shorter); "kahan": those partials, each compensated (Kahan)
    loop_sums: str = "plain"
    # axis programs (families/axis_emit.py): how a block's TY partials of a kept element merge.
    # "warp": shuffles within each warp, then a shared-memory tree over the 8 warps (4 barriers);
    # "tree": a shared-memory tree over all TY (up to 9 barriers; the form until session 18)
    axis_merge: str = "warp"
    # axis programs with I == 1 (a kept element's R elements contiguous): R up to which a warp takes
    # a kept element, 8 a block, with no shared memory or barrier (families/axis_emit.py write_rows);
    # 0: never (the block-per-element kernel)
    axis_rows: int = 0
    # axis programs with I == 1 whose R is not split: one block per kept element runs every phase's
    # sweep and then the elem stores of its row in one kernel (families/axis_emit.py write_fused),
    # so the row's second and third reads can hit L2 (InstanceNorm / GroupNorm: three reads of x
    # through three kernels, 0.75x eager on a held-out InstanceNorm, session 23)
    axis_fused: bool = False
    # axis programs: the elem pass (a backward's broadcast over the reduced axes) on a kept axis that
    # VEC does not divide (mean over dim 1 of [B, C, 4095]) takes VEC consecutive flat elements a
    # thread with each element's own position (MODE 3: 16-byte reads and stores, VEC independent
    # kept-value reads in flight) instead of one element a thread (MODE 0). MODE 0 keeps one 4-byte
    # store and one dependent read in flight per thread: Little's law caps it near a quarter of HBM
    # (held-out v5: a middle-axis backward at 23-39% of HBM, 0.38-0.43x torch.compile, session 24)
    axis_elem_vec: bool = False
    # axis programs: the reduce kernel's sweep issues the reads of up to 4 steps (128 bytes a thread)
    # before their updates. One step's reads were in flight where the update branches (log-cosh's
    # float32 mean: 3.6 TB/s, torch.compile 4.3; held-out problems-v7, session 34)
    axis_batch: bool = False
    # wide rows when they are few (at most two a SM, e.g. LayerNorm over [C, H, W]: 128 rows of 4M):
    # a looped row over a cluster of `loop_cluster` blocks of `loop_tpr` threads instead of one block
    # (sm_90+, programs that write elements; column partials a slot per cluster). One 512-thread block per
    # row left each SM one block's loads in flight: 30% of HBM (held-out problems-v7, session 34)
    loop_cluster: int = 1
    # a looped cluster's row staged in shared memory (each block its part, each thread its own
    # chunks) by one streaming sweep, which every later sweep reads instead of HBM: the looped pass
    # read a row twice (softmax over 393216-wide rows at 65% of copy); for any number of rows,
    # wherever the staged bytes fit a block's opt-in
    loop_stage: bool = False

    @property
    def schedules(self) -> tuple:
        rows = tuple((t, None) for t in ROW_TPRS if t <= self.block_max or self.split_rows)
        clustered = ((self.loop_tpr * self.loop_cluster, 0),) if self.loop_cluster > 1 else ()
        return NARROW + rows + clustered + ((self.loop_tpr, 0),)

    def is_split(self, tpr: int, items) -> bool:
        """A schedule whose row spans a cluster of blocks."""
        return items is None and tpr > self.block_max

    def is_loop_cluster(self, tpr: int, items) -> bool:
        """A looped row over a cluster of `loop_cluster` blocks (few wide rows)."""
        return items == 0 and tpr > self.loop_tpr

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
    # wide rows, at most two a SM: a looped row over a cluster of 8 blocks (early: the tuner tries
    # VARIANTS in order within its budget, and only specs with wide benchmark rows try this one)
    Variant("loopcl", loop_cluster=8),
    # wide rows of any count whose row fits 8 blocks' shared memory: the looped cluster, staged
    Variant("loopstage", loop_cluster=8, loop_stage=True),
    Variant("nosplit", split_rows=False),  # split: the looped pass instead of a cluster per row
    Variant("wave", persistent=True),  # medium: one wave of persistent blocks striding over rows
    # medium: (max, sum) in two exact sweeps; cross-entropy over 32768 classes in fp32 was 1.6x
    # slower with the online sweep than with these (results/2026-11-30-h200-release-v5)
    Variant("twopass", reg_pair="twopass"),
    Variant("online", reg_pair="online"),  # medium: v5's online sweep over a row in registers
    # medium and split: blocks of 256 threads, a row of more over a cluster of 2-8 of them: four
    # rows' quarters share an SM instead of one 1024-thread row waiting on its own barriers
    Variant("cl256", block_max=256, split_block=256),
    # cl256's blocks with the exact two rounds for (max, sum) (a max round, then the sum: no exps in
    # the merge): softmax forward bf16 at 16384 x 4096 69.5 us against cl256's 75.3, cross-entropy
    # forward 0.82-0.90x cl256's time at 16384 x 4096 and 4096 x 8192 (session 16, calls 2-3);
    # its narrow and split rows in registers keep the default's pair form (emit.write_exact_pair)
    Variant("cl256two", block_max=256, split_block=256, reg_pair="twopass"),
    # medium rows with column partials (norm backwards): the partials in shared memory
    Variant("csmem", col_smem=True),
    # medium: LayerNorm's mean and variance in one merge round; 1.3-1.55x slower than two rounds
    # on the H200 (Chan's merge per shuffle level; results/2026-11-30-h200-moments-tune)
    Variant("moments", moments=True),
    # flat pointwise: two chunks in flight per thread over 32 waves, or four over one persistent
    # wave (the default before session 7), or one over at most 64 waves
    Variant("flat2w32", flat_unroll=2, flat_waves=32),
    # two chunks a thread on the uncapped grid (aten's float32 launch): softplus at 6.4 GB ran at
    # 97% / 100% of the copy bandwidth (fp32 / bf16) against the default's 93% / 94%, where
    # hardsigmoid's cheap math had favoured one chunk (results/2026-12-02-h200-session18, call 2)
    Variant("flat2w4096", flat_unroll=2),
    Variant("flat1w64", flat_waves=64),  # the default until session 16
    Variant("flat4w1", flat_unroll=4, flat_waves=1),
    # few rows: a block per row (the medium schedule) instead of a cluster of blocks per row
    Variant("nofew", few_rows=False),
    # few rows: a whole block per row, 2 chunks a thread (Liger's softmax shape: 256 threads of 16
    # bf16 for 4096), with or without row reductions; to time against the clusters by decode_ab.py
    Variant("fewblock", few_form="block"),
    # few rows: the block form with the exact two rounds for (max, sum). Softmax forward at 8 x 4096
    # bf16: 2.07 us against fewblock's 2.87 and the clusters' 3.15 (results/2026-12-02-h200-session14)
    Variant("fewtwo", few_form="block", few_pair="twopass"),
    # wide rows: a sum per chunk in flight, or those compensated (held-out layernorm_2d_affine was
    # refused at `huge` float32 inputs: 512 chains of 258 sequential adds over a 131967-wide row;
    # on the H200 `chains` cut layernorm_hw_affine's refusals there from 19/72 to 7/72 at the same
    # time, results/2026-12-02-h200-session13/precision_ab.json)
    Variant("chains", loop_sums="chains"),
    Variant("kahan", loop_sums="kahan"),
    # axis programs: the shared-memory tree over all TY threads (the form before session 18)
    Variant("axistree", axis_merge="tree"),
    # axis programs: a warp per kept element for rows of up to 16384 (not run on a GPU yet)
    Variant("axisrows", axis_rows=16384),
    # axis programs: a block per kept element through every phase and the elem stores (one launch)
    Variant("axisfused", axis_fused=True),
    # axis programs: a variance's sum of squared deviations in its mean's sweep (Chan's merge of each
    # step's exact moments: one read of x fewer for InstanceNorm / GroupNorm / BatchNorm forwards; the
    # `moments` variant does this alone), with the fused kernel too
    Variant("axisfusedmom", axis_fused=True, moments=True),
    # axis programs: the elem pass VEC flat elements a thread on kept axes VEC does not divide
    Variant("axiselemvec", axis_elem_vec=True),
    # axis programs: several steps' reads in flight before their updates (not run on a GPU yet)
    Variant("axisbatch", axis_batch=True),
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
                           "block_max", "col_smem", "moments", "red_form", "axis_merge", "axis_rows", "axis_fused",
                           "axis_elem_vec", "axis_batch"),
                "wide": ("loop_tpr", "loop_unroll", "loop_sums", "loop_cluster", "loop_stage"), "split": ("split_rows", "split_block"),
                "flat": ("flat_unroll", "flat_waves"), "few": ("few_rows", "few_form", "few_pair", "few_fin")}


def combine(winners: dict[str, Variant]) -> Variant:
    """One variant taking each class's fields from that class's winner."""
    fields = {}
    for cls, names in CLASS_FIELDS.items():
        source = winners.get(cls, DEFAULT_VARIANT)
        fields.update({n: getattr(source, n) for n in names})
    name = "+".join(f"{cls}:{v.name}" for cls, v in sorted(winners.items())) or DEFAULT_VARIANT.name
    return Variant(name, **fields)


def combined_parts(name: str) -> dict[str, str]:
    """The inverse of combine's name: shape class -> variant name ({} for a plain name)."""
    if ":" not in name:
        return {}
    return dict(part.split(":", 1) for part in name.split("+"))


def variant_named(name: str) -> Variant:
    """A variant by its name: one of VARIANTS, or a combination of them (`cls:name+cls:name`)."""
    parts = combined_parts(name)
    if not parts:
        return variants_named(name)[0]
    return combine({cls: variants_named(variant)[0] for cls, variant in parts.items()})


def items_max(variant: Variant, words_per_item: int) -> int:
    """ITEMS_MAX of the kernel (mirrors sg::items_max): a power of two."""
    fit = max(1, min(variant.items_cap, variant.data_regs // max(1, words_per_item)))
    return 1 << (fit.bit_length() - 1)


def plan(variant: Variant, chunks: int, imax: int, split: bool = True) -> tuple[int, int]:
    """(TPR, ITEMS) the host picks for a vectorized row of `chunks` 16-byte chunks
    (mirrors the generated host code; `split`: the program and device allow split rows)."""
    for tpr, items in variant.schedules:
        if variant.is_split(tpr, items) and not split or variant.is_loop_cluster(tpr, items):
            continue  # a looped cluster depends on the rows (unknown here): the one-block loop, same class
        if items == 0:
            return tpr, 0
        items = imax if items is None else items
        if items <= imax and chunks <= tpr * items:
            return tpr, items
    raise AssertionError("the schedule list ends with the looped pass")


def few_block_tprs(variant: Variant) -> list[int]:
    """Threads per row of the block form of few rows: up to the medium rows' `block_max`, or
    any with its own (max, sum) form (`few_pair`: an instantiation of its own; under cl256's
    256-thread medium blocks a float32 row of 4096 would otherwise miss the form)."""
    return [t for t in FEW_BLOCK_TPRS if t <= variant.block_max or variant.few_pair != "same"]


def few_rows_tpr(variant: Variant, rows: int, chunks: int, sms: int, *, row_free: bool = True,
                 plain_elems: int = FEW_MIN_ELEMS, imax: int = 8) -> int | None:
    """TPR of the few-rows schedule for `rows` rows of `chunks` 16-byte chunks on `sms` SMs
    (None: not taken). `row_free`: the program has no row reductions; `plain_elems`: elements a
    thread holds in the plain schedule (ITEMS x VEC); `imax`: the kernel's ITEMS_MAX. Mirrors
    the generated host code, where the program and device allow it."""
    block = variant.few_form == "block" and not row_free  # (HostEmitter.few_block_form says why)
    # a row takes a cluster of MAX_CLUSTER blocks, or one block in the block form: either way
    # while the rows' blocks fit in FEW_WAVES waves of one block per SM
    blocks = rows if block else rows * MAX_CLUSTER
    if not variant.few_rows or blocks > FEW_WAVES * sms or not FEW_MIN_CHUNKS <= chunks <= FEW_TPRS[-1]:
        return None
    if block:  # a block per row, 2 chunks each
        fits = [t for t in few_block_tprs(variant) if chunks <= 2 * t]
        return fits[0] if fits and imax >= 2 else None
    if not row_free and plain_elems < FEW_MIN_ELEMS:
        return None
    return next(t for t in FEW_TPRS if chunks <= t)


def few_finalized_in_cluster(variant: Variant, rows: int, groups: int, few_tpr: int | None, *,
                             global_reductions: bool, column_reductions: bool, row_free: bool = False) -> bool:
    """Whether a few-rows launch (few_tpr: few_rows_tpr's answer) of a program with reductions over
    all rows finalizes them in its own cluster (no finalize launch, no workspace): the block form
    (programs with row reductions: `row_free` as few_rows_tpr has it), one group, at most
    FEW_FIN_ROWS rows (a block each), no column reductions. Mirrors the host code (`fin_cluster`),
    on sm_90+ code."""
    block = variant.few_form == "block" and not row_free  # (HostEmitter.few_block_form)
    return (variant.few_fin == "cluster" and block and few_tpr is not None and global_reductions
            and not column_reductions and groups == 1 and 1 <= rows <= FEW_FIN_ROWS)


def shape_class(tpr: int, items: int) -> str:
    return "wide" if items == 0 else "narrow" if tpr <= 32 else "split" if tpr > 1024 else "medium"
