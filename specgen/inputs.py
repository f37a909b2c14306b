"""Concrete inputs for a signature: sizes for its dims, tensors in several value distributions.

Shared by `specgen check` (small CPU inputs), the verifier and the benchmark, so all of
them agree on what a valid input is.
"""
from __future__ import annotations

import random
from typing import Iterable

import torch

from .signature import Param, Signature, TensorType

TORCH_DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
    "uint8": torch.uint8, "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}

# name -> (scale, transform): what the verifier draws values from.
DISTRIBUTIONS = ("normal", "large", "tiny", "negative", "uniform")


def default_scalar(param: Param):
    if param.has_default:
        return param.default
    return {"float": 0.5, "int": 1, "bool": False}[param.type.kind]


def sample_dims(sig: Signature, ranges: dict[str, tuple[int, int]], rng: random.Random,
                cap: int | None = None) -> dict[str, int]:
    """Random sizes within the ranges (capped at `cap` for small checks), honouring divisibility."""
    divisors = sig.symbol_divisors()
    dims = {}
    for symbol in sig.symbols():
        lo, hi = ranges[symbol]
        if cap is not None:
            hi = max(lo, min(hi, cap))
        step = divisors.get(symbol, 1)
        first = -(-lo // step) * step
        last = hi // step * step
        if last < first:  # the cap cut below the first multiple: take the smallest legal one
            last = first
        dims[symbol] = rng.randrange(first, last + 1, step)
    return dims


def _values(shape: tuple[int, ...], distribution: str, gen: torch.Generator) -> torch.Tensor:
    base = torch.randn(shape, generator=gen, dtype=torch.float64)
    if distribution == "normal":
        return base
    if distribution == "large":
        return base * 100.0
    if distribution == "tiny":
        return base * 1e-3
    if distribution == "negative":
        return -base.abs() - 0.01
    if distribution == "uniform":
        return torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1
    raise ValueError(f"unknown distribution {distribution!r}; known: {', '.join(DISTRIBUTIONS)}")


def make_tensor(ttype: TensorType, dims: dict[str, int], dtype: str, *, distribution: str,
                gen: torch.Generator, device: str | torch.device = "cpu") -> torch.Tensor:
    shape = ttype.shape(dims)
    name = ttype.dtype_for(dtype)
    if ttype.value_range is not None:
        lo, hi = (d.resolve(dims) for d in ttype.value_range)
        hi = max(hi, lo + 1)
        tensor = torch.randint(lo, hi, shape, generator=gen, dtype=torch.int64)
    elif name == "bool":
        tensor = torch.rand(shape, generator=gen) < 0.5
    elif name in ("int64", "int32", "int16", "int8", "uint8"):
        tensor = torch.randint(0, 100, shape, generator=gen, dtype=torch.int64)
    else:
        tensor = _values(shape, distribution, gen)
    return tensor.to(TORCH_DTYPES[name]).to(device)


def make_inputs(sig: Signature, dims: dict[str, int], dtype: str, *, seed: int = 0, distribution: str = "normal",
                device: str | torch.device = "cpu", scalars: dict | None = None) -> dict[str, object]:
    """Arguments by name, in signature order: tensors for tensor params, values for scalars."""
    gen = torch.Generator().manual_seed(seed)
    args: dict[str, object] = {}
    for param in sig.params:
        if param.is_tensor:
            args[param.name] = make_tensor(param.type, dims, dtype, distribution=distribution, gen=gen, device=device)
        else:
            args[param.name] = (scalars or {}).get(param.name, default_scalar(param))
    return args


def expected_outputs(sig: Signature, dims: dict[str, int], dtype: str) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Shape and dtype of each output. In float64 (the verifier's truth) floating outputs are all float64."""
    def out_dtype(t: TensorType) -> torch.dtype:
        if dtype == "float64" and t.is_floating:
            return torch.float64
        return TORCH_DTYPES[t.dtype_for(dtype)]
    return [(o.type.shape(dims), out_dtype(o.type)) for o in sig.outputs]


def as_tuple(result) -> tuple:
    if isinstance(result, (tuple, list)):
        return tuple(result)
    return (result,)


def output_problems(sig: Signature, outputs: Iterable, dims: dict[str, int], dtype: str) -> list[str]:
    """How the outputs differ from what the signature promises (count, type, shape, dtype)."""
    outputs = list(outputs)
    expected = expected_outputs(sig, dims, dtype)
    if len(outputs) != len(expected):
        return [f"returned {len(outputs)} output(s), the signature declares {len(expected)}"]
    problems = []
    for out, (shape, tdtype), decl in zip(outputs, expected, sig.outputs):
        if not isinstance(out, torch.Tensor):
            problems.append(f"output {decl.name!r} is a {type(out).__name__}, not a tensor")
            continue
        if tuple(out.shape) != shape:
            problems.append(f"output {decl.name!r} has shape {tuple(out.shape)}, the signature says "
                            f"{decl.type} = {shape} for {_dims_text(dims)}")
        if out.dtype != tdtype:
            problems.append(f"output {decl.name!r} has dtype {DTYPE_NAMES.get(out.dtype, out.dtype)}, "
                            f"the signature says {DTYPE_NAMES[tdtype]}")
    return problems


def _dims_text(dims: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in dims.items())


def upcast(args: dict[str, object]) -> dict[str, object]:
    """Floating tensors to float64: the precise reference runs on the same values."""
    return {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in args.items()}
