"""Helpers for the builtin generator's family tests: a spec's lowered programs run by the
CPU interpreter (float64) against its reference and the reference's autograd."""
from __future__ import annotations

from pathlib import Path

import torch

from specgen.agents.builtin.cpu_check import check_backward, check_forward  # noqa: F401 - the tests' helpers
from specgen.spec import load_spec

OWN = Path(__file__).resolve().parent / "builtin_specs"


def own_spec(name: str):
    return load_spec(OWN / f"{name}.yaml")


def compiles_for_hopper(spec) -> None:
    """The generated source compiles with nvcc for sm_90 (raises with nvcc's message otherwise)."""
    from specgen.agents.builtin import build_source
    from specgen.agents.builtin.generator import compile_source

    compile_source(spec, build_source(spec), arch="sm_90")


def verifies_on_the_gpu(spec) -> None:
    """The generated kernel passes the verifier (a GPU test)."""
    from specgen.agents.builtin import build_source
    from specgen.verify import verify_kernel

    verdict = verify_kernel(spec, build_source(spec))
    assert verdict.passed, verdict.summary()


def own_kernel_tests(names: list[str]):
    """The two tests of a file of own specs, for a module to bind (`test_the_kernels_compile_for_hopper,
    test_the_kernels_verify_on_the_gpu = own_kernel_tests(OPS)`): each spec's kernel compiles for
    sm_90 (nvcc), and passes the verifier (a GPU)."""
    import pytest

    @pytest.mark.nvcc
    @pytest.mark.parametrize("name", names)
    def compiles(name):
        compiles_for_hopper(own_spec(name))

    @pytest.mark.gpu
    @pytest.mark.nvcc
    @pytest.mark.parametrize("name", names)
    def verifies(name):
        verifies_on_the_gpu(own_spec(name))

    return compiles, verifies


def without_saved(path: Path, tmp_path: Path):
    """The spec at `path` with its `saved:` block dropped: the example specs declare saved values
    since session 12, and the tests compare against the same op recomputing its statistics."""
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    data.pop("saved", None)
    plain = Path(tmp_path) / Path(path).name
    plain.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_spec(plain)


def logcumsumexp_backward_as_the_kernel(x, g, out, round_value: bool = True):
    """logcumsumexp's backward as the emitted kernel computes it: log|g| - out in float32, the
    reversed log-sum-exp carried in float64, then (round_value) rounded to float32 before + x, or
    kept in float64 for the sum (session 24's form, which failed the H200's huge values)."""
    lowest = torch.tensor(torch.finfo(torch.float32).min)
    grad = torch.zeros_like(x)
    for sign in (1, -1):
        shifted = torch.where(g * sign > 0, g.abs().log(), lowest) - out
        carried = shifted.double().flip(-1).logcumsumexp(-1).flip(-1)
        total = carried.float() + x if round_value else (carried + x.double()).float()
        grad = grad + sign * total.exp()
    return grad
