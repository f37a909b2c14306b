// The one translation unit that includes torch headers: binds scale_forward to
// torch.ops.stable_probe.scale through PyTorch's stable ABI (no ATen, no libtorch_python).
#include <Python.h>

#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/headeronly/core/ScalarType.h>

#include <cuda_runtime.h>
#include <vector>

#include "scale_abi.h"

extern "C" {
// An empty module: importing it runs the static registrations below.
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, NULL};
  return PyModule_Create(&module_def);
}
}

namespace {
using torch::stable::Tensor;
using torch::headeronly::ScalarType;

specgen_tensor to_arg(const Tensor& t) {
  specgen_tensor a{};
  a.data = t.data_ptr();
  a.ndim = static_cast<int32_t>(t.dim());
  for (int64_t i = 0; i < t.dim(); ++i) {
    a.sizes[i] = t.size(i);
    a.strides[i] = t.stride(i);
  }
  a.dtype = t.scalar_type() == ScalarType::Float ? SPECGEN_FLOAT32 : SPECGEN_BFLOAT16;
  return a;
}

Tensor scale_cuda(const Tensor& x_in, double alpha) {
  STD_TORCH_CHECK(x_in.is_cuda(), "stable_probe.scale: x must be a CUDA tensor");
  STD_TORCH_CHECK(x_in.dim() == 2, "stable_probe.scale: x must be 2-d [N, D], got ", x_in.dim(), "-d");
  STD_TORCH_CHECK(x_in.scalar_type() == ScalarType::Float || x_in.scalar_type() == ScalarType::BFloat16,
                  "stable_probe.scale: x must be float32 or bfloat16");
  torch::stable::accelerator::DeviceGuard guard(x_in.get_device_index());
  Tensor x = torch::stable::contiguous(x_in);
  std::vector<int64_t> shape = {x.size(0), x.size(1)};
  Tensor out = torch::stable::new_empty(x, shape, x.scalar_type());

  scale_args args{};
  args.x = to_arg(x);
  args.alpha = alpha;
  args.N = x.size(0);
  args.D = x.size(1);
  args.out = to_arg(out);

  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(x.get_device_index(), &stream));
  cudaError_t err = scale_forward(&args, static_cast<cudaStream_t>(stream));
  STD_TORCH_CHECK(err == cudaSuccess, "stable_probe.scale: kernel failed: ", cudaGetErrorString(err));
  return out;
}
}  // namespace

STABLE_TORCH_LIBRARY_IMPL(stable_probe, CUDA, m) {
  m.impl("scale", TORCH_BOX(&scale_cuda));
}
