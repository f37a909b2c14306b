"""Shared fixtures and markers: GPU tests skip cleanly without CUDA, nvcc tests without nvcc."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "specs"


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _has_nvcc() -> bool:
    try:
        from specgen.toolchain import find_cuda_toolkit

        find_cuda_toolkit()
        return True
    except Exception:
        return shutil.which("nvcc") is not None


def pytest_collection_modifyitems(config, items):
    cuda = _has_cuda()
    nvcc = None
    for item in items:
        if "gpu" in item.keywords and not cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "nvcc" in item.keywords:
            if nvcc is None:
                nvcc = _has_nvcc()
            if not nvcc:
                item.add_marker(pytest.mark.skip(reason="needs the CUDA toolkit (nvcc)"))


@pytest.fixture
def specs_dir() -> Path:
    return SPECS
