"""Probe: one op bound through PyTorch's stable ABI, schema/fake/CPU path in Python."""
import torch

LIB = torch.library.Library("stable_probe", "FRAGMENT")
torch.library.define("stable_probe::scale", "(Tensor x, float alpha=2.0) -> Tensor", lib=LIB)


@torch.library.impl("stable_probe::scale", "CPU", lib=LIB)
def _scale_cpu(x, alpha=2.0):
    return (x * alpha).contiguous()


@torch.library.register_fake("stable_probe::scale", lib=LIB)
def _scale_fake(x, alpha=2.0):
    torch._check(x.dim() == 2, lambda: "x must be 2-d")
    return x.new_empty(x.shape)


try:  # the CUDA kernels; a torch without CUDA still gets the CPU path
    from . import _C  # noqa: F401
    HAS_CUDA_KERNELS = True
except ImportError as error:  # pragma: no cover - depends on the install
    HAS_CUDA_KERNELS = False
    _LOAD_ERROR = error


def scale(x: torch.Tensor, alpha: float = 2.0) -> torch.Tensor:
    """out = alpha * x for x: Tensor[N, D] (float32, bfloat16)."""
    return torch.ops.stable_probe.scale(x, alpha)
