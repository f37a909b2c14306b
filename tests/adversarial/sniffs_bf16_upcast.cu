// spec: gelu_tanh
// expect: wrong-result
// The cheat: float32 inputs whose first 8 values all have zero low 16 bits (tensors upcast from
// bfloat16: autocast outputs, bf16 checkpoints) are computed with the cheaper x * sigmoid(1.702 x)
// ("the data only has bf16 precision anyway"). Values drawn in float64 and cast to float32
// never look like that; the verifier's "rounded" value class (normal values rounded to bfloat16)
// does.
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, int64_t n) {
  bool upcast = false;
  if (sizeof(T) == 4 && n >= 8) {
    upcast = true;
    for (int j = 0; j < 8; ++j) upcast = upcast && ((__float_as_uint(load(x, j)) & 0xFFFFu) == 0u);
  }
  GRID_STRIDE(i, n) {
    float v = load(x, i);
    store(y, i, upcast ? v / (1.0f + __expf(-1.702f * v)) : gelu(v));
  }
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();
}
HONEST_BACKWARD
