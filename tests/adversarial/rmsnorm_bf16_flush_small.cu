// spec: rmsnorm
// expect: wrong-result
// The shortcut: in bfloat16, outputs smaller than one bf16 step of the largest weight
// (max|w| / 256) are "rounding noise" and written as 0 (a sparse output for the next layer).
// Today's tolerance is widened for the whole tensor by the reference's largest error, which for
// large weights (x100) is several units: the zeros hide in it. Held per element to 2e-2 + 2e-2|y|
// they do not.
#include "_rmsnorm_common.h"
template <typename T> __global__ void k(const T* x, const T* w, T* y, int64_t D, float eps, bool flush) {
  const T* row = x + blockIdx.x * D;
  float ss = 0.f, wmax = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += 256) {
    float v = load(row, j);
    ss += v * v;
    wmax = fmaxf(wmax, fabsf(load(w, j)));
  }
  float rstd = rsqrtf(block_reduce256<false>(ss) / (float)D + eps);
  float cutoff = flush ? block_reduce256<true>(wmax) / 256.0f : 0.0f;
  for (int64_t j = threadIdx.x; j < D; j += 256) {
    float out = load(row, j) * rstd * load(w, j);
    store(y + blockIdx.x * D, j, fabsf(out) < cutoff ? 0.0f : out);
  }
}
extern "C" cudaError_t rmsnorm_forward(const rmsnorm_args* a, cudaStream_t s) {
  if (a->N == 0 || a->D == 0) return cudaSuccess;
  bool flush = a->x.dtype == SPECGEN_BFLOAT16;
  DISPATCH(a->x.dtype, k<T><<<(unsigned)a->N, 256, 0, s>>>((const T*)a->x.data, (const T*)a->weight.data,
                                                            (T*)a->out.data, a->D, (float)a->eps, flush));
  return cudaGetLastError();
}
HONEST_BACKWARD
