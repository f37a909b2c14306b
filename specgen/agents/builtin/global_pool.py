"""Average pools whose window is the whole spatial extent, traced as the mean they are.

`F.avg_pool2d(x, (x.size(-2), x.size(-1)))` (GeM and other global pools written with the input's
own size as the window) is a mean over the trailing two axes with keepdim, but aten's op takes its
window as plain ints: the call fixed the traced sizes to their example values and the spec was
refused. While tracing, `F.avg_pool2d` and `F.avg_pool1d` see whether the window is the input's own
symbolic extent (stride the window, no padding, no divisor) and then take the mean; any other call
(a real window, plain sizes, another thread's eager call) goes to torch's op unchanged.
(`F.adaptive_avg_pool2d(x, 1)` needs nothing: its size is symbolic and torch decomposes it.)
"""
from __future__ import annotations

import contextlib
import threading

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true

_REAL = {"avg_pool1d": F.avg_pool1d, "avg_pool2d": F.avg_pool2d}
_lock = threading.Lock()
_active = 0


def _pair(value, k: int) -> list:
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    return items * k if len(items) == 1 else items


def _whole_window(x, axes: int, kernel_size, stride, padding, divisor_override) -> bool:
    """The window spans the last `axes` sizes of x, which are symbolic (a trace, not an eager call)."""
    if not isinstance(x, torch.Tensor) or x.dim() <= axes or divisor_override is not None:
        return False
    sizes = list(x.shape[-axes:])
    if not any(isinstance(s, torch.SymInt) for s in sizes):
        return False
    kernel = _pair(kernel_size, axes)
    strides = _pair(stride, axes) if stride not in (None, (), []) else kernel
    pads = _pair(padding, axes)
    return (len(kernel) == axes and all(statically_known_true(k == s) for k, s in zip(kernel, sizes))
            and all(statically_known_true(t == k) for t, k in zip(strides, kernel))
            and all(not isinstance(p, torch.SymInt) and p == 0 for p in pads))


def _pool(name: str, axes: int):
    real = _REAL[name]

    def pool(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
             *rest, **kwargs):
        divisor = kwargs.get("divisor_override", rest[0] if rest else None)
        if _whole_window(input, axes, kernel_size, stride, padding, divisor):
            return input.mean(dim=tuple(range(-axes, 0)), keepdim=True)
        return real(input, kernel_size, stride, padding, ceil_mode, count_include_pad, *rest, **kwargs)

    pool.__name__ = name
    return pool


@contextlib.contextmanager
def whole_window_pools():
    """F.avg_pool1d / F.avg_pool2d as above while inside (nested and concurrent traces share it)."""
    global _active
    with _lock:
        if _active == 0:
            F.avg_pool1d, F.avg_pool2d = _pool("avg_pool1d", 1), _pool("avg_pool2d", 2)
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                F.avg_pool1d, F.avg_pool2d = _REAL["avg_pool1d"], _REAL["avg_pool2d"]
