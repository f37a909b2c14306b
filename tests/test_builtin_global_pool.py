"""Average pools whose window is the input's own spatial extent (global_pool.py): traced as the
mean over those axes, so GeM pooling as timm writes it (`F.avg_pool2d(x, (x.size(-2), x.size(-1)))`)
lowers; aten's op took the window as plain ints and fixed the traced sizes (refused; held-out
problems-v9, session 37). Any other window stays refused, and eager calls are torch's own.
CPU: the programs against the reference at several sizes; nvcc; GPU: the verifier."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from builtin_support import check_backward, check_forward, own_kernel_tests, own_spec

from specgen.agents.base import AgentRefused
from specgen.agents.builtin.generator import lower_spec
from specgen.agents.builtin.global_pool import whole_window_pools
from specgen.spec import load_spec

OPS = ["gem_pool_whole_window", "avg_pool1d_whole_window"]


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dims", [{"B": 2, "C": 3, "H": 5, "W": 7, "L": 9}, {"B": 1, "C": 1, "H": 1, "W": 1, "L": 1}])
def test_the_pool_is_a_mean_that_matches_the_reference(name, dims):
    spec = own_spec(name)
    dims = {k: v for k, v in dims.items() if k in spec.dims}
    check_forward(spec, dims)
    check_backward(spec, dims)


def test_a_window_smaller_than_the_extent_is_still_refused(tmp_path):
    text = own_spec("avg_pool1d_whole_window").path.read_text()
    path = tmp_path / "avg_pool1d_whole_window.yaml"
    path.write_text(text.replace('"avg_pool1d_whole_window(x: Tensor[B, C, L]) -> Tensor[B, C, 1]"',
                                 '"avg_pool1d_whole_window(x: Tensor[B, C, 2*M]) -> Tensor[B, C, M]"').replace(
        "kernel_size=x.shape[-1]", "kernel_size=2").replace("L: [1, 4096]", "M: [1, 2048]").replace(
        "L: 4096}", "M: 2048}"))
    with pytest.raises(AgentRefused):
        lower_spec(load_spec(path))


def test_eager_calls_inside_and_after_are_torchs_own():
    x = torch.randn(2, 3, 4, 5)
    real = F.avg_pool2d
    with whole_window_pools():
        assert F.avg_pool2d is not real
        assert torch.equal(F.avg_pool2d(x, (4, 5)), real(x, (4, 5)))  # plain sizes: torch's op
        assert torch.equal(F.avg_pool2d(x, 2), real(x, 2))
    assert F.avg_pool2d is real


test_the_kernels_compile_for_hopper, test_the_kernels_verify_on_the_gpu = own_kernel_tests(OPS)
