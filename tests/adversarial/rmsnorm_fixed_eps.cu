// spec: rmsnorm
// expect: wrong-result
// The shortcut: eps is the compile-time constant 1e-6 (the spec's default) and the argument is
// ignored. Today the verifier always passes the default; with eps drawn from [1e-7, 1e-5] and
// small inputs (mean square comparable to eps) the results are off.
#include "_rmsnorm_common.h"
template <typename T> __global__ void k(const T* x, const T* w, T* y, int64_t D) {
  const T* row = x + blockIdx.x * D;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += 256) { float v = load(row, j); ss += v * v; }
  float rstd = rsqrtf(block_reduce256<false>(ss) / (float)D + 1e-6f);
  for (int64_t j = threadIdx.x; j < D; j += 256) store(y + blockIdx.x * D, j, load(row, j) * rstd * load(w, j));
}
extern "C" cudaError_t rmsnorm_forward(const rmsnorm_args* a, cudaStream_t s) {
  if (a->N == 0 || a->D == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k<T><<<(unsigned)a->N, 256, 0, s>>>((const T*)a->x.data, (const T*)a->weight.data,
                                                            (T*)a->out.data, a->D));
  return cudaGetLastError();
}
HONEST_BACKWARD
