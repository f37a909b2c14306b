"""Which names a spec and a package may use.

An op, parameter, output or dimension name becomes a Python identifier (the package's
function and its parameters), a C struct field and a C function name (the kernel ABI), a
file name (`kernels/<op>.cu`, `_reference_<op>.py`) and a torch.ops name. A name that is a
keyword in any of those languages, a macro of the C headers a kernel includes, or a name the
generated package itself defines breaks the package or every kernel; this module says so
before anything is generated. The package name (`specgen build --name`) must also not shadow
a module or distribution that is already installed.
"""
from __future__ import annotations

import keyword
import re
import sys

from .abi import WORKSPACE_FIELDS

MAX_NAME_LENGTH = 64  # file names such as _reference_<op>.py stay far below 255 bytes
ASCII_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

CPP_KEYWORDS = frozenset("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t class
compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield decltype default
delete do double dynamic_cast else enum explicit export extern false float for friend goto if inline int long
mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public register
reinterpret_cast requires restrict return short signed sizeof static static_assert static_cast struct switch
template this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile
wchar_t while xor xor_eq
""".split())

# Object-like macros (and CUDA built-in variables) of the headers a kernel includes: as a
# struct field or a kernel's local variable they expand or shadow, and the kernel breaks.
C_RESERVED = frozenset("""
NULL EOF errno stdin stdout stderr assert offsetof INFINITY NAN HUGE_VAL HUGE_VALF HUGE_VALL RAND_MAX
EXIT_SUCCESS EXIT_FAILURE CHAR_BIT CHAR_MIN CHAR_MAX INT_MIN INT_MAX UINT_MAX LONG_MIN LONG_MAX ULONG_MAX
LLONG_MIN LLONG_MAX ULLONG_MAX SIZE_MAX FLT_MIN FLT_MAX FLT_EPSILON DBL_MIN DBL_MAX DBL_EPSILON M_PI M_E
linux unix i386 threadIdx blockIdx blockDim gridDim warpSize clusterDim clusterIdx
""".split())

# Names the generated package defines itself (its module namespace and submodules).
PACKAGE_RESERVED = frozenset("""
torch annotations tests ARCH_LIST PROVENANCE UNVERIFIED_OPS REFERENCE_OPS CUDA_KERNELS_LOADED
CUDA_KERNELS_ERROR UnverifiedKernelWarning LIB OPS NAMESPACE ARCHS layers patch unpatch ops LAYERS sys NamedTuple
""".split())

# torch.ops namespaces that torch itself (or a common extension) uses.
TORCH_NAMESPACES = frozenset("""
aten prim prims quantized _quantized _test c10d _c10d_functional _c10d_functional_autograd _dtensor _native
coor cuda debugprims debug_mode_ops export inductor inductor_prims mkl mkldnn mkldnn_prepacked onednn onnx
profiler quantization rngprims sparse static_runtime symm_mem higher_order torchvision torchaudio
torchao fbgemm triton
""".split())

# Well-known top-level modules a wheel must never replace even where they are not installed.
WELL_KNOWN_MODULES = frozenset("""
torch torchvision torchaudio numpy scipy pandas triton setuptools pip wheel packaging specgen kernels
jinja2 yaml pydantic hypothesis pytest rich sympy networkx filelock fsspec transformers tests test
""".split())


def name_problem(name: object, role: str) -> str | None:
    """Why `name` cannot name an op, parameter, output or dimension (`role`), or None."""
    if not isinstance(name, str) or not name:
        return f"the {role} name is empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"the {role} name is {len(name)} characters long; at most {MAX_NAME_LENGTH} are allowed"
    if not ASCII_IDENTIFIER.match(name):
        return (f"{name!r} is not an ASCII identifier: use letters a-z/A-Z, digits and underscores, "
                f"starting with a letter")
    if keyword.iskeyword(name):
        return f"{name!r} is a Python keyword"
    if name in CPP_KEYWORDS:
        return f"{name!r} is a C++ keyword (the kernel ABI makes it a C struct field or function name)"
    if name in C_RESERVED:
        return f"{name!r} is a macro or built-in of the C/CUDA headers every kernel includes"
    if name.startswith("__") or "__" in name or re.match(r"_[A-Z]", name):
        return f"{name!r} is reserved in C and C++ (names with '__' or '_' + capital letter)"
    if name == "torch":
        return "'torch' would hide the torch module inside the generated package"
    if role != "op" and name in WORKSPACE_FIELDS:
        return f"{name!r} is a field every kernel ABI struct has (the framework's workspace)"
    if role == "op":
        if name.startswith("_"):
            return f"{name!r} starts with '_': the package's private modules and ops use such names"
        if name in PACKAGE_RESERVED:
            return f"{name!r} is a name the generated package defines itself"
    return None


def op_collisions(names: list[str], backward: dict[str, bool]) -> list[str]:
    """Problems between the ops of one package: same name up to case, or `<a>_backward` = b."""
    problems = []
    seen: dict[str, str] = {}
    for name in names:
        folded = name.lower()
        if folded in seen and seen[folded] != name:
            problems.append(f"ops {seen[folded]!r} and {name!r} differ only in case: their files and header "
                            f"guards collide")
        seen.setdefault(folded, name)
    for name in names:
        if backward.get(name) and f"{name}_backward" in names:
            problems.append(f"op {name + '_backward'!r} collides with the backward op of {name!r}")
    return problems


def installed_module_origin(name: str) -> str | None:
    """Where an importable top-level module `name` lives (None: nothing importable by that name)."""
    import importlib.util

    if name in sys.builtin_module_names:
        return "built into Python"
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if found is None:
        return None
    return str(found.origin or (list(found.submodule_search_locations or []) or ["?"])[0])


def _is_specgen_package(name: str) -> bool:
    """A package that an earlier `specgen build --name NAME` made (rebuilding it is fine)."""
    import importlib.util
    from pathlib import Path

    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    for folder in (found.submodule_search_locations or []) if found else []:
        if (Path(folder) / "_spec_data.py").is_file():
            return True
    return False


def _installed_distributions() -> set[str]:
    from importlib import metadata

    names = set()
    for dist in metadata.distributions():
        try:
            names.add(re.sub(r"[-_.]+", "_", dist.metadata["Name"] or "").lower())
        except Exception:  # noqa: BLE001 - a broken metadata folder is not ours to report
            continue
    return names


def package_name_problem(name: str) -> str | None:
    """Why `name` cannot be a generated package's name (module, distribution, torch.ops namespace)."""
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name or ""):
        return ("the package name is also the Python module and the torch.ops namespace, so it must be a "
                "lowercase identifier such as my_kernels")
    if len(name) > MAX_NAME_LENGTH:
        return f"the package name is {len(name)} characters long; at most {MAX_NAME_LENGTH} are allowed"
    if keyword.iskeyword(name) or name in CPP_KEYWORDS or "__" in name or name.startswith("_"):
        return f"{name!r} is a keyword or a reserved name in Python or C++"
    if name in TORCH_NAMESPACES:
        return f"{name!r} is a torch.ops namespace of torch itself: the package's ops could not register"
    if name in sys.stdlib_module_names or name in WELL_KNOWN_MODULES:
        return f"{name!r} is the name of a standard or well-known module: installing the wheel would shadow it"
    if _is_specgen_package(name):
        return None  # an earlier build of this package: rebuilding it replaces it, as intended
    origin = installed_module_origin(name)
    if origin is not None:
        return f"a module named {name!r} is already importable here ({origin}): the wheel would shadow it"
    if name in _installed_distributions():
        return f"a distribution named {name!r} is already installed here: the wheel would replace it"
    return None
