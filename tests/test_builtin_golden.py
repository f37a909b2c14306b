"""The committed builtin kernels rebuild byte for byte from their recorded variant (the lock's
verification record names it; a combined variant is `cls:variant+cls:variant`), so a change to
the generator that changes a committed kernel shows here and the kernel gets regenerated (and
verified and timed again) on a GPU.

OUT_OF_DATE lists the kernels the generator no longer produces as committed, each with why; a
kernel listed here must really differ (regenerating it removes it from the list)."""
from __future__ import annotations

from pathlib import Path

import pytest

from specgen.agents.builtin import build_source
from specgen.agents.builtin.schedule import variant_named
from specgen.agents.builtin.tune import recorded_variant
from specgen.lock import Lock
from specgen.spec import load_spec

SPECS = Path(__file__).resolve().parent.parent / "specs"
# every other kernel of record was regenerated on the H200 in session 12 (2026-12-02)
OUT_OF_DATE: dict[str, str] = {}
# cross_entropy was regenerated on the H200 in session 29 (2026-12-04): its forward saves the row's
# (max, logsum) for the backward (a float32 lse failed verifier version 6, session 28)
# softmax, log_softmax: the (max, sum) pair now gives NaN for a row of only -inf, as torch does
# (one line after the pair; their outputs are NaN there either way, so only the bytes differ);
# regenerate them on a GPU
for _op in ("softmax", "log_softmax"):
    OUT_OF_DATE[_op] = "one line after the (max, sum) pair: a row of only -inf sums to NaN"
# swiglu was regenerated on the H200 (torch 2.11) in session 11: torch 2.11 decomposes the sigmoid's
# backward through prims.reciprocal, torch 2.14 (here) through a division, so the traces differ
# cross_entropy's gather of the target logit now clamps an index outside [0, C) to an edge column
# (session 34: a -100 padding label reaches the kernel before the lazy range check reports it, and
# read 100 elements before the row, before the tensor in row 0)
OUT_OF_DATE["cross_entropy"] = "the target gather clamps an out-of-range index to the row"
OUT_OF_DATE["swiglu"] = "traced under torch 2.11 on the H200: its sigmoid backward decomposes through reciprocal"
# csmem's looped rows (I == 0) asked the medium rows' column-partials shared memory they never use, so
# past the device's opt-in (W over ~58K floats) the launch failed (session 35's review; the committed
# specs declare D <= 16384, inside the limit): only the launch macros' bytes differ
# rmsnorm and layernorm_gelu were regenerated on an H100 in session 39 (2026-12-05): verifier version
# 13 rejected the committed ones (cudaErrorInvalidValue at D = 12288 bfloat16 and at D = 6144 float16
# through offset views: their launches opted in past 48 KB only when the dynamic bytes passed 48 KB,
# forgetting the kernels' static bytes); layernorm_gelu's mean is now summed in double
# (emit.centering_sums: its first regeneration failed version 13 on float32 offset values).


# The shared runtime helpers (prelude.PRELUDE) changed after the kernels were verified: session 34
# keeps host caches per device and opts a kernel in to the device's whole shared memory (a limit set
# to one call's own bytes is lowered by another thread's call: verifier version 12's threads on new
# shapes). Every committed kernel's text outside that block must still rebuild byte for byte; the
# block itself is compared only when PRELUDE_OUT_OF_DATE is empty. Regenerate them on a GPU.
PRELUDE_OUT_OF_DATE = ("per-device host caches; shared memory opt-in to the device's limit (session 34); "
                       "the cluster gate asks whether a cluster of 8 can be placed (session 37)")
PRELUDE_CURRENT = {"rmsnorm", "layernorm_gelu"}  # regenerated since: its helpers are the generator's own (session 39)
PRELUDE_START, PRELUDE_END = "// ---- specgen builtin runtime helpers", "// ---- end of helpers ----\n"


def outside_prelude(text: str) -> tuple[str, str]:
    """(the kernel's text with its PRELUDE block cut out, the block)."""
    start = text.index(PRELUDE_START)
    end = text.index(PRELUDE_END, start) + len(PRELUDE_END)
    return text[:start] + text[end:], text[start:end]


def builtin_kernels():
    lock = Lock.load(SPECS)
    for op, entry in sorted(lock.entries.items()):
        if entry.kernel and entry.agent == "builtin":
            yield op, recorded_variant(entry)


@pytest.mark.parametrize("op, variant", list(builtin_kernels()), ids=lambda v: str(v))
def test_a_committed_builtin_kernel_rebuilds_from_its_recorded_variant(op, variant):
    source = build_source(load_spec(SPECS / f"{op}.yaml"), variant_named(variant))
    committed = (SPECS / "kernels" / f"{op}.cu").read_text()
    (source, new_helpers), (committed, old_helpers) = outside_prelude(source), outside_prelude(committed)
    if PRELUDE_OUT_OF_DATE and op not in PRELUDE_CURRENT:
        assert new_helpers != old_helpers, "the helpers rebuild byte for byte now: empty PRELUDE_OUT_OF_DATE"
    else:
        assert new_helpers == old_helpers, f"{op}: the runtime helpers changed; regenerate it or say why"
    if op in OUT_OF_DATE:
        assert source != committed, f"{op} rebuilds byte for byte now: remove it from OUT_OF_DATE"
    else:
        assert source == committed, (f"{op}: the generator no longer produces the committed kernel from variant "
                                     f"{variant}; regenerate it on a GPU (specgen build specs/) or list it in "
                                     f"OUT_OF_DATE with why")


def test_the_golden_set_is_the_committed_builtin_kernels():
    ops = {op for op, _ in builtin_kernels()}
    assert len(ops) >= 9 and set(OUT_OF_DATE) <= ops and PRELUDE_CURRENT <= ops
