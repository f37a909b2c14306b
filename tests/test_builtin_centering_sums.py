"""A row sum whose mean is subtracted from the row (LayerNorm's sum(x) before sum((x - mean)^2))
accumulates in double (emit.DirectionEmitter.centering_sums).

A float32 sum of an uncentred row errs by ulps of the whole sum. Emulated in float32 on the CPU at
the case verifier version 13 rejected (layernorm_gelu backward, N=3 D=16384, offset values: x, weight
and bias 20-63 from 0), the worst grad_bias element over 60 draws reached 0.8-1.09 of the tolerance
with the mean summed in float32 (any order: torch's, 32, 128 or 1024 strided partials), 0.34 with
the sum in double (session 39). The CPU interpreter checks the arithmetic here; the GPU verifies.
"""
from pathlib import Path

import pytest

from specgen.agents.builtin.emit import DirectionEmitter
from specgen.agents.builtin.generator import lower_spec
from specgen.agents.builtin.schedule import variant_named
from specgen.spec import load_spec

SPECS = Path(__file__).resolve().parent.parent / "specs"


def emitter(op: str, direction: str, variant: str = "csmem") -> DirectionEmitter:
    spec = load_spec(SPECS / f"{op}.yaml")
    return DirectionEmitter(spec, lower_spec(spec)[direction], direction, variant_named(variant))


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_layernorms_mean_sum_is_a_double_and_its_other_sums_are_not(direction):
    e = emitter("layernorm_gelu", direction)
    centering = e.centering_sums()
    assert len(centering) == 1  # the mean's sum, and not the variance's
    (mean_sum,) = [n for n in e.nodes if n.id in centering]
    assert e.acc_type(mean_sum) == "double"
    others = [n for n in e.nodes if n.op == "rowreduce" and n.id not in centering]
    assert others and all(e.acc_type(n) == "acc_t" for n in others)


@pytest.mark.parametrize("op", ["rmsnorm", "softmax", "cross_entropy"])
def test_rows_without_a_centred_second_sum_keep_their_accumulator(op):
    for direction in ("forward", "backward"):
        assert emitter(op, direction).centering_sums() == set()


def test_the_moments_variant_keeps_its_own_merge():
    assert emitter("layernorm_gelu", "forward", "moments").centering_sums() == set()
