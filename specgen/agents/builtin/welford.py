"""`torch.var_mean` and `torch.std_mean` traced as torch's kernels answer them.

torch reduces them by Welford's update (CPU and CUDA alike): the running mean of a group that
holds an infinity meets inf - inf and turns NaN, where the decomposition the trace follows (a
sum divided by the count) gives the infinity. The verifier holds kernels to eager torch's NaN
(docs/VERIFIER.md "Tolerance"; held-out problems-v6's batchnorm_stats_nchw was rejected on it,
session 28), so while the reference is traced, each call the reference makes itself gets its
mean made NaN where its spread is NaN, its mean infinite and its group more than one element
(a single -inf stays -inf in Welford's update). LayerNorm's and BatchNorm's own decompositions
are not touched: they call var_mean below the Python API this mode sees, and their normalized
outputs are NaN in such a group either way.
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

_MEAN_SECOND = (torch.var_mean, torch.std_mean)


def welford_mean(spread: torch.Tensor, mean: torch.Tensor, count) -> torch.Tensor:
    """The mean as Welford's update leaves it: NaN where an infinity met another value."""
    # the count as a tensor value (a SymInt while tracing): a Python `count > 1` would specialize it
    many = torch.ones_like(mean) * count > 1
    return torch.where(torch.isnan(spread) & torch.isinf(mean) & many, torch.full_like(mean, float("nan")), mean)


class WelfordMeans(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func not in _MEAN_SECOND or not args or not isinstance(args[0], torch.Tensor):
            return result
        spread, mean = result
        count = args[0].numel() // max(mean.numel(), 1)
        return spread, welford_mean(spread, mean, count)
