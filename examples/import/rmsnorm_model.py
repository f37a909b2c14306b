"""RMSNorm with a learned scale, written the way public kernel benchmarks (KernelBench) write
their problems: a `Model`, `get_inputs()` for the forward's example inputs and
`get_init_inputs()` for the constructor's.

`specgen import examples/import/rmsnorm_model.py -o specs-import/` turns it into a spec whose
inputs are `x` and the module's parameter `weight`; `specgen build specs-import/` then makes a
verified kernel and a wheel from it (on a GPU machine).
"""
import torch
import torch.nn as nn

batch_size = 16384
hidden_size = 4096
eps = 1e-6


class Model(nn.Module):
    """RMSNorm over the last dimension with a learned per-feature scale."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def get_inputs():
    return [torch.randn(batch_size, hidden_size)]


def get_init_inputs():
    return [hidden_size, eps]
