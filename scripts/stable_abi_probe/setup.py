"""Build the stable-ABI probe: one abi3 (cp39) wheel for any torch >= 2.10 and Python >= 3.9."""
import os

# torch's own guess of CUDA_HOME can be wrong (an nvcc wrapper on PATH): say it explicitly,
# before torch.utils.cpp_extension reads it at import time.
if "CUDA_HOME" not in os.environ and os.path.exists("/usr/local/cuda/bin/nvcc"):
    os.environ["CUDA_HOME"] = "/usr/local/cuda"

from setuptools import setup  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CUDAExtension  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("stable_probe", "csrc")

TORCH_TARGET = "-DTORCH_TARGET_VERSION=0x020a000000000000"  # the stable ABI as of torch 2.10
ARCH_LIST = os.environ.get("PROBE_ARCH_LIST", "8.0;9.0+PTX")
# torch adds -D__CUDA_NO_HALF_CONVERSIONS__ and friends to every nvcc call; kernels are
# written and verified with plain nvcc, so undo them (user flags come after torch's).
PLAIN_NVCC = ["-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
              "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__"]


def gencode_flags(arch_list: str) -> list[str]:
    flags = []
    for arch in arch_list.replace(",", ";").split(";"):
        num = arch.replace("+PTX", "").replace(".", "")
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
        if arch.endswith("+PTX"):
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return flags


# glibc >= 2.38 would otherwise bind strtoul to __isoc23_strtoul (see csrc/glibc_compat.h)
COMPAT = ["-include", os.path.join(HERE, CSRC, "glibc_compat.h")]

setup(
    name="stable_probe",
    version="0.0.1",
    packages=["stable_probe"],
    ext_modules=[
        CUDAExtension(
            "stable_probe._C",
            [os.path.join(CSRC, "binding.cpp"), os.path.join(CSRC, "scale.cu")],
            include_dirs=[os.path.join(HERE, CSRC)],
            extra_compile_args={
                # USE_CUDA declares aoti_torch_get_current_cuda_stream in the shim header.
                "cxx": ["-O2", TORCH_TARGET, "-DUSE_CUDA", "-DPy_LIMITED_API=0x03090000"] + COMPAT,
                "nvcc": ["-O3"] + PLAIN_NVCC + gencode_flags(ARCH_LIST) + COMPAT,
            },
            py_limited_api=True,
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
    install_requires=["torch>=2.10"],
)
