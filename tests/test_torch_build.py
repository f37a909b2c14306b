"""specgen build reads the installed torch's build from its files (no 3-4 s import)."""
from __future__ import annotations

import pytest

from specgen.package import torch_build
from specgen.package.torch_build import TorchBuild, _from_files


def _fake_torch(root, version_py: str, c10: bytes | None):
    (root / "lib").mkdir(parents=True)
    (root / "version.py").write_text(version_py)
    if c10 is not None:
        (root / "lib" / "libc10.so").write_bytes(c10)
    return root


def test_the_files_say_what_importing_torch_says():
    pytest.importorskip("torch")
    torch_build.installed_torch_build.cache_clear()
    assert torch_build.installed_torch_build() == torch_build._from_import()


def test_version_cuda_and_abi_from_a_torch_tree(tmp_path):
    new = _fake_torch(tmp_path / "a", "from typing import Optional\n__version__ = '2.9.0+cu128'\n"
                      "cuda: Optional[str] = '12.8'\n", b"\x7fELF..._ZNSt7__cxx1112basic_stringIcSt11char_traits...")
    assert _from_files(new) == TorchBuild("2.9.0+cu128", "12.8", True)
    old = _fake_torch(tmp_path / "b", "__version__ = '2.4.0'\ncuda = None\n", b"\x7fELF..._ZNKSs4sizeEv...")
    assert _from_files(old) == TorchBuild("2.4.0", None, False)
    assert TorchBuild("2.4.0", None, False).id() == "torch 2.4.0 cxx11abi=0 cuda=None"


def test_a_tree_without_its_files_is_an_error_the_caller_falls_back_on(tmp_path):
    with pytest.raises(OSError, match="no libc10"):
        _from_files(_fake_torch(tmp_path / "c", "__version__ = '2.9.0'\n", None))
    with pytest.raises(ValueError, match="no __version__"):
        _from_files(_fake_torch(tmp_path / "d", "cuda = '13.0'\n", b"x"))
