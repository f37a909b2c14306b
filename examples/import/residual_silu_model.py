"""A KernelBench-style problem (Model / get_inputs / get_init_inputs) that specgen was not tuned
on: a residual add, SiLU and a constant scale, as a block's tail would have it. The GPU stage
`import_report` imports it, builds it and reports it (issue 15's end-to-end check)."""
import torch
import torch.nn.functional as F
from torch import nn


class Model(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return F.silu(x + residual) * self.scale


batch, hidden = 4096, 4096


def get_inputs():
    return [torch.randn(batch, hidden), torch.randn(batch, hidden)]


def get_init_inputs():
    return [0.5]
