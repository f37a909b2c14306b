// spec: rmsnorm
// expect: wrong-result
// The shortcut: a "tuned" path for rows of 5000 <= D < 6000 estimates the mean square from the
// first 4096 columns only (one pass over a power-of-two prefix). Today's sizes never fall in that
// band (its edge sizes are powers of two +-1 and a few odd ones; the seeded random sizes miss it);
// a geometric sweep of D with steps of ~8% cannot.
#include "_rmsnorm_common.h"
template <typename T> __global__ void k(const T* x, const T* w, T* y, int64_t D, float eps) {
  const T* row = x + blockIdx.x * D;
  int64_t seen = D >= 5000 && D < 6000 ? 4096 : D;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < seen; j += 256) { float v = load(row, j); ss += v * v; }
  float rstd = rsqrtf(block_reduce256<false>(ss) / (float)seen + eps);
  for (int64_t j = threadIdx.x; j < D; j += 256) store(y + blockIdx.x * D, j, load(row, j) * rstd * load(w, j));
}
extern "C" cudaError_t rmsnorm_forward(const rmsnorm_args* a, cudaStream_t s) {
  if (a->N == 0 || a->D == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k<T><<<(unsigned)a->N, 256, 0, s>>>((const T*)a->x.data, (const T*)a->weight.data,
                                                            (T*)a->out.data, a->D, (float)a->eps));
  return cudaGetLastError();
}
HONEST_BACKWARD
