"""A split of a dim into a dim and a constant that the trace writes as an expression: unflatten(-1,
(n // 4, 4)) of a 4*K dim traces the 4 as n // (n // 4), a symbolic size constant at every size the
spec allows. axis_views took only a number for a literal, so the split was "not one dim and
constants" (held-out problems-v9's maxout, read after its first contact). CPU: the program against
the reference; the literal rule on SymInts; nvcc; GPU: the verifier."""
from __future__ import annotations

import pytest
import torch
from builtin_support import check_backward, check_forward, own_kernel_tests, own_spec
from torch.fx.experimental.proxy_tensor import make_fx

from specgen.agents.builtin.families import axis_views

OPS = ["maxout_groups_of_four"]


@pytest.mark.parametrize("dims", [{"N": 3, "K": 5}, {"N": 1, "K": 1}, {"N": 2, "K": 64}])
def test_maxout_matches_the_reference(dims):
    spec = own_spec("maxout_groups_of_four")
    check_forward(spec, dims)
    check_backward(spec, dims)


def test_a_constant_expression_is_literal_and_a_dim_is_not():
    seen = {}

    def f(x):
        n = x.shape[-1]
        seen["group"], seen["count"] = n // (n // 4), n // 4
        return x

    make_fx(f, tracing_mode="symbolic")(torch.randn(3, 44))
    assert axis_views._literal(seen["group"]) and not axis_views._literal(seen["count"])
    assert axis_views._literal(4) and not axis_views._literal(4.0)


test_the_kernels_compile_for_hopper, test_the_kernels_verify_on_the_gpu = own_kernel_tests(OPS)
