// spec: rmsnorm
// expect: sanitizer
// sanitize: yes
// The bug: the block reduction reads the per-warp partial sums from shared memory without a
// __syncthreads() after they are written: a read-after-write race between warps.
#include "_rmsnorm_common.h"
constexpr int kThreads = 256;
template <typename T> __global__ void k(const T* x, const T* w, T* y, int64_t D, float eps) {
  __shared__ float partial[kThreads / 32];
  const T* row = x + blockIdx.x * D;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += kThreads) { float v = load(row, j); ss += v * v; }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffff, ss, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  // missing: __syncthreads();
  float total = 0.f;
  for (int i = 0; i < kThreads / 32; ++i) total += partial[i];
  float rstd = rsqrtf(total / (float)D + eps);
  for (int64_t j = threadIdx.x; j < D; j += kThreads) store(y + blockIdx.x * D, j, load(row, j) * rstd * load(w, j));
}
extern "C" cudaError_t rmsnorm_forward(const rmsnorm_args* a, cudaStream_t s) {
  if (a->N == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k<T><<<(unsigned)a->N, kThreads, 0, s>>>((const T*)a->x.data, (const T*)a->weight.data,
                                                                 (T*)a->out.data, a->D, (float)a->eps));
  return cudaGetLastError();
}
STUB_BACKWARD
