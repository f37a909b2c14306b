"""The generated pip package: model (package_model), tree (emit_package), wheel (build_wheel),
Hugging Face kernel layout (write_hub_layout)."""
from .emit import emit_package, render_files
from .hub import write_hub_layout
from .model import DEFAULT_ARCH_LIST, PackageModel, package_model
from .wheel import build_wheel

__all__ = ["DEFAULT_ARCH_LIST", "PackageModel", "build_wheel", "emit_package", "package_model", "render_files",
           "write_hub_layout"]
