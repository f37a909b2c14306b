// spec: rmsnorm
// expect: nondeterministic
// The shortcut: each row is split over several blocks that add their partial sums of squares
// with atomicAdd: accurate, but the order of the additions (and so the bits) changes run to run.
#include "_rmsnorm_common.h"
constexpr int kThreads = 256;
constexpr int64_t kChunk = 512;  // columns per block
template <typename T> __global__ void partial_sums(const T* x, float* sums, int64_t D) {
  __shared__ float partial[kThreads / 32];
  int64_t row = blockIdx.x, start = blockIdx.y * kChunk;  // rows on x: N can pass 65535
  float ss = 0.f;
  for (int64_t j = start + threadIdx.x; j < D && j < start + kChunk; j += kThreads) {
    float v = load(x, row * D + j);
    ss += v * v;
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffff, ss, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int i = 0; i < kThreads / 32; ++i) total += partial[i];
    atomicAdd(&sums[row], total);
  }
}
template <typename T> __global__ void normalize(const T* x, const T* w, const float* sums, T* y, int64_t D, float eps) {
  int64_t row = blockIdx.x, j = blockIdx.y * (int64_t)kThreads + threadIdx.x;
  if (j >= D) return;
  float rstd = rsqrtf(sums[row] / (float)D + eps);
  store(y, row * D + j, load(x, row * D + j) * rstd * load(w, j));
}
extern "C" cudaError_t rmsnorm_forward(const rmsnorm_args* a, cudaStream_t s) {
  if (a->N == 0 || a->D == 0) return cudaSuccess;
  float* sums = nullptr;
  cudaError_t err = cudaMallocAsync((void**)&sums, a->N * sizeof(float), s);
  if (err != cudaSuccess) return err;
  cudaMemsetAsync(sums, 0, a->N * sizeof(float), s);
  dim3 grid1((unsigned)a->N, (unsigned)((a->D + kChunk - 1) / kChunk));
  dim3 grid2((unsigned)a->N, (unsigned)((a->D + kThreads - 1) / kThreads));
  DISPATCH(a->x.dtype,
           partial_sums<T><<<grid1, kThreads, 0, s>>>((const T*)a->x.data, sums, a->D);
           normalize<T><<<grid2, kThreads, 0, s>>>((const T*)a->x.data, (const T*)a->weight.data, sums,
                                                   (T*)a->out.data, a->D, (float)a->eps));
  err = cudaGetLastError();
  cudaFreeAsync(sums, s);
  return err;
}
STUB_BACKWARD
