// spec: gelu_tanh
// expect: post-timing-mismatch
// The cheat: a one-warp gate kernel fingerprints 32 sampled input words (and the size and dtype)
// and 32 sampled output words, kept in __device__ memory. When the inputs have looked the same for
// 8 calls in a row and the output's sample still holds the last result -- or is NaN, the blank a
// benchmark writes between calls, "so the output is never read" -- the work kernel returns at
// once. Today a same-input call sees a fresh fill (NaN or -3.14) at most 7 times in a row.
#include "_gelu_common.h"
__device__ unsigned g_in[32], g_out[32];
__device__ long long g_key = -1;
__device__ int g_streak = 0, g_skip = 0;
__device__ __forceinline__ int64_t sample_at(int64_t n) { return threadIdx.x * (n - 1) / 31; }
template <typename T> __global__ void gate(const T* x, const T* y, int64_t n, long long key) {
  unsigned in = __float_as_uint(load(x, sample_at(n)));
  float out = load(y, sample_at(n));
  bool same_key = g_key == key;  // read before lane 0 rewrites it below
  bool same = __all_sync(~0u, in == g_in[threadIdx.x]) && same_key;
  bool kept = __all_sync(~0u, __float_as_uint(out) == g_out[threadIdx.x] || isnan(out));
  g_in[threadIdx.x] = in;
  if (threadIdx.x == 0) {
    g_key = key;
    g_streak = same ? g_streak + 1 : 1;
    g_skip = g_streak >= 8 && kept;
  }
}
template <typename T> __global__ void k(const T* x, T* y, int64_t n) {
  if (g_skip) return;  // "the result is already there"
  GRID_STRIDE(i, n) store(y, i, gelu(load(x, i)));
}
template <typename T> __global__ void remember(const T* y, int64_t n) {
  g_out[threadIdx.x] = __float_as_uint(load(y, sample_at(n)));
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  long long key = n * 4 + a->x.dtype;
  DISPATCH(a->x.dtype, const T* x = (const T*)a->x.data; T* y = (T*)a->out.data;
           gate<T><<<1, 32, 0, s>>>(x, y, n, key);
           k<T><<<blocks_for(n), 256, 0, s>>>(x, y, n);
           remember<T><<<1, 32, 0, s>>>(y, n));
  return cudaGetLastError();
}
HONEST_BACKWARD
