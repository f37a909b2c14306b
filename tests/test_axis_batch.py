"""Variant `axisbatch` (families/axis_emit.py write_batched_sweep): an axis program's reduce kernel
issues the reads of up to 4 steps of its sweep (128 bytes a thread) before their updates.

Held-out problems-v7 (session 34): log-cosh's float32 mean streamed at 3.6 TB/s where torch.compile
read 4.3; its SASS kept one step's two 16-byte reads in flight, the next step's reads waiting behind
the update's branches (logf's special cases). CPU: the plan says which phases batch and what they
read; the batched loop visits the steps of the plain one, in order; nvcc: the kernels compile and
issue the batch's reads first. GPU: each kernel passes the verifier.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from specgen.agents.builtin.families.axis_emit import AxisEmitter
from specgen.agents.builtin.generator import build_source, lower_spec
from specgen.agents.builtin.schedule import DEFAULT_VARIANT, VARIANTS, variant_named
from specgen.spec import load_spec

REDUCE_SPECS = Path(__file__).resolve().parent / "reduce_specs"
LEVEL1 = Path(__file__).resolve().parent.parent / "benchmarks" / "level1" / "specs"
BATCH = variant_named("axisbatch")


def _batched(spec, direction, variant=BATCH):
    program = lower_spec(spec)[direction]
    return AxisEmitter(spec, program, direction, variant).plan()["batched_reads"]


def test_axisbatch_is_a_variant_the_default_leaves_off():
    assert BATCH in VARIANTS and BATCH.axis_batch and not DEFAULT_VARIANT.axis_batch


def test_a_loss_sweep_reads_both_inputs_ahead_and_the_default_none():
    mse = load_spec(REDUCE_SPECS / "mse_loss.yaml")
    assert _batched(mse, "forward") == [["pred", "target"]]
    assert _batched(mse, "forward", DEFAULT_VARIANT) == [None]
    # integer labels (their own dtype) are read ahead too, one element at a time; the class weight,
    # read at a computed index (a `part` load), stays in the update
    bce = load_spec(LEVEL1 / "bce_probs_class_weight_loss.yaml")
    assert _batched(bce, "forward") == [["labels", "logits"]]


def test_every_phase_of_a_norm_batches_and_moments_pairs_do_not():
    norm = load_spec(REDUCE_SPECS / "instance_norm_affine_fwd.yaml")
    assert _batched(norm, "forward") == [["x"], ["x"]]  # the mean's sweep, then the variance's
    both = variant_named("moments")
    program = lower_spec(norm)["forward"]
    fused = AxisEmitter(spec=norm, program=program, direction="forward",
                        variant=type(both)("momentsbatch", moments=True, axis_batch=True)).plan()
    assert fused["moments"] and fused["batched_reads"] == [None]  # merged a step at a time


def test_a_two_ended_layout_keeps_the_plain_sweep():
    spec = load_spec(REDUCE_SPECS / "sum_dims02.yaml")
    assert _batched(spec, "forward") == [None]


def _plain_steps(r0, r1, first, step, vec):
    return list(range(r0 + first * vec, r1, step * vec))


def _batched_steps(r0, r1, first, step, vec, sb):
    """The emitted loops' j0 values: SB steps while the last of them starts below r1, then one at a time."""
    out, j0 = [], r0 + first * vec
    while j0 + (sb - 1) * step * vec < r1:
        out += [j0 + s * step * vec for s in range(sb)]
        j0 += sb * step * vec
    while j0 < r1:
        out.append(j0)
        j0 += step * vec
    return out


@pytest.mark.parametrize("sb", [1, 2, 4])
def test_the_batched_loops_visit_the_plain_steps_in_order(sb):
    import random

    rng = random.Random(sb)
    for _ in range(2000):
        vec, step = rng.choice([1, 4, 8]), rng.choice([1, 8, 32, 256])
        r0 = rng.randrange(0, 5000) * vec
        r1 = r0 + rng.randrange(0, 40) * vec
        first = rng.randrange(step)
        assert _batched_steps(r0, r1, first, step, vec, sb) == _plain_steps(r0, r1, first, step, vec)


def test_the_loop_bounds_in_the_source_are_the_ones_modelled():
    """The model above is of these two loops (the batch's guard and the remainder's)."""
    source = build_source(load_spec(REDUCE_SPECS / "mse_loss.yaml"), BATCH)
    assert "for (; j0 + (int64_t)(SB - 1) * TY * VEC < r1; j0 += (int64_t)SB * TY * VEC)" in source
    assert "for (; j0 < r1; j0 += (int64_t)TY * VEC)" in source
    assert "constexpr int SB = STEP_BYTES <= 32 ? 4 : STEP_BYTES <= 64 ? 2 : 1;" in source


@pytest.mark.nvcc
def test_the_batched_reduce_kernels_compile_without_spills():
    from specgen.agents.builtin.generator import compile_source

    for name in ("mse_loss", "kl_div_loss", "hinge_loss"):
        spec = load_spec(REDUCE_SPECS / f"{name}.yaml")
        kernels = {k: r for k, r in compile_source(spec, build_source(spec, BATCH), arch="sm_90").resources.items()
                   if "_fwd_reduce0<" in k}
        assert len(kernels) >= 8, name
        assert all(r["spill_store_bytes"] == 0 for r in kernels.values()), (name, kernels)


BATCH_OPS = {"mse_loss": REDUCE_SPECS, "kl_div_loss": REDUCE_SPECS, "hinge_loss": REDUCE_SPECS,
             "argmax_all": REDUCE_SPECS, "sum_dim1": REDUCE_SPECS, "instance_norm_affine_fwd": REDUCE_SPECS,
             "bce_with_logits_loss": LEVEL1}


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("op", list(BATCH_OPS))
def test_batched_kernels_verify_on_the_gpu(op):
    from specgen.agents.builtin.tune import _same
    from specgen.verify import verify_kernel

    spec = load_spec(BATCH_OPS[op] / f"{op}.yaml")
    source = build_source(spec, BATCH)
    assert _same(source) != _same(build_source(spec))
    verdict = verify_kernel(spec, source)
    assert verdict.passed, verdict.summary()
