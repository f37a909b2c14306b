"""Shared pieces of the agent tests: a spec/task, scripted kernels, a scripted Evaluator.

The ScriptedEvaluator is a test double for the GPU half (verify, measure): it judges a
candidate by a marker comment in its source, so a scenario reads as a script of answers.
"""
from __future__ import annotations

from pathlib import Path

from specgen import abi
from specgen.agents.base import Candidate, KernelTask
from specgen.agents.evaluate import CompileResult, Evaluator, Verdict
from specgen.spec import load_spec

SPEC_YAML = """\
name: scale_add
description: y = 2 * x + 1, elementwise.
signature: "scale_add(x: Tensor[N]) -> Tensor[N]"
dtypes: [float32]
dims: {N: [1, 1048576]}
reference: |
  def reference(x):
      return 2 * x + 1
benchmark:
  - {N: 1048576}
"""

KERNEL_TEMPLATE = """\
#include <cuda_runtime.h>
#include "scale_add_abi.h"
// MARKER
__global__ void scale_add_kernel(const float* x, float* y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i] + 1.0f;
}
extern "C" cudaError_t scale_add_forward(const scale_add_args* a, cudaStream_t stream) {
  int64_t n = a->N;
  scale_add_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(
      (const float*)a->x.data, (float*)a->out.data, n);
  return cudaGetLastError();
}
"""


def kernel(marker: str) -> str:
    return KERNEL_TEMPLATE.replace("MARKER", marker)


def answer(marker: str, prose: str = "Here is the kernel.") -> str:
    return f"{prose}\n\n```cuda\n{kernel(marker)}```\n"


BROKEN = kernel("BROKEN").replace("2.0f * x[i]", "2.0f * x[i] flaot")
WRONG = kernel("WRONG").replace("2.0f", "3.0f")
SLOW = kernel("SLOW")
MEDIUM = kernel("MEDIUM")
FAST = kernel("FAST")

DIAGNOSTIC = 'scale_add.cu(6): error: identifier "flaot" is undefined'
COUNTEREXAMPLE = {"shape": "N=4097", "dtype": "float32", "seed": 1234, "max_abs_error": 4097.0,
                  "max_rel_error": 0.33, "where": "everywhere (first element 0)"}
TIMINGS = {
    "SLOW": {"kernel_us": 500.0, "eager_us": 200.0, "compile_us": 150.0, "roofline_fraction": 0.1},
    "MEDIUM": {"kernel_us": 150.0, "eager_us": 200.0, "compile_us": 150.0, "roofline_fraction": 0.42},
    "FAST": {"kernel_us": 80.0, "eager_us": 200.0, "compile_us": 150.0, "roofline_fraction": 0.91},
}


def make_task(tmp_path: Path) -> KernelTask:
    path = tmp_path / "scale_add.yaml"
    path.write_text(SPEC_YAML)
    spec = load_spec(path)
    return KernelTask(spec=spec, header=abi.header_text(spec), header_name=abi.header_filename(spec))


class ScriptedEvaluator(Evaluator):
    """Compiles, verifies and times by the marker in the source (BROKEN, WRONG, SLOW, ...)."""

    def __init__(self, can_verify: bool = True):
        self.can_verify = can_verify
        self.compiled: list[str] = []

    def compile(self, candidate: Candidate) -> CompileResult:
        self.compiled.append(candidate.source)
        if "BROKEN" in candidate.source:
            return CompileResult(False, None, f"nvcc failed to compile scale_add.cu (1 error):\n{DIAGNOSTIC}")
        return CompileResult(True, Path("/nonexistent/" + _marker(candidate.source) + ".so"))

    def verify(self, candidate: Candidate, library: Path) -> Verdict:
        if library.stem == "WRONG":
            return Verdict(False, "max abs error 4097 exceeds atol=1e-05 + rtol=1e-05*|ref|",
                           counterexample=dict(COUNTEREXAMPLE), report="float32 N=4097: FAILED")
        return Verdict(True, record={"passed": True})

    def measure(self, candidate: Candidate, library: Path) -> dict:
        return dict(TIMINGS[library.stem])


def _marker(source: str) -> str:
    for marker in ("WRONG", "SLOW", "MEDIUM", "FAST"):
        if f"// {marker}" in source:
            return marker
    return "FAST"
