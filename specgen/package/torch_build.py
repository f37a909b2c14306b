"""The installed torch a wheel build compiles against, read from its files without importing it.

`import torch` takes 3-4 s on the 2-core CI machine, and `specgen build` needed only three facts
from it in its own process (the extension compiles in a child that imports torch anyway): the
version and CUDA build (`torch/version.py`, plain assignments) and the C++ ABI, which is the
spelling of `std::string` in libc10's symbols (`std::__cxx11::basic_string` under the new ABI,
`Ss` under the old). Falls back to importing torch when a file is not where a wheel puts it.
"""
from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class TorchBuild:
    version: str  # torch.__version__, e.g. "2.14.1+cu130"
    cuda: str | None  # torch.version.cuda; None for a CPU build
    cxx11_abi: bool  # torch._C._GLIBCXX_USE_CXX11_ABI

    def id(self) -> str:
        return f"torch {self.version} cxx11abi={int(self.cxx11_abi)} cuda={self.cuda}"


@lru_cache(maxsize=1)
def installed_torch_build() -> TorchBuild | None:
    """The installed torch's build, or None without torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    try:
        return _from_files(root)
    except (OSError, ValueError, SyntaxError):
        return _from_import()


def _from_files(root: Path) -> TorchBuild:
    values = {}
    for node in ast.parse((root / "version.py").read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id in ("__version__", "cuda") and node.value is not None:
            values[target.id] = ast.literal_eval(node.value)
    if "__version__" not in values:
        raise ValueError(f"no __version__ in {root / 'version.py'}")
    library = next((p for p in (root / "lib").glob("libc10.*") if p.suffix in (".so", ".dylib")), None)
    if library is None:
        raise OSError(f"no libc10 under {root / 'lib'}")
    return TorchBuild(values["__version__"], values.get("cuda"), b"__cxx1112basic_string" in library.read_bytes())


def _from_import() -> TorchBuild:
    import torch

    return TorchBuild(torch.__version__, torch.version.cuda, bool(torch._C._GLIBCXX_USE_CXX11_ABI))
