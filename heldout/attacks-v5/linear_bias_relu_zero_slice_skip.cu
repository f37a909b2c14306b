// spec: linear_bias_relu
// expect: rejected
// class: value-structure-not-drawn
// A plain 64x64-tile SIMT GEMM with a float accumulator, bias and ReLU (exact within tolerance), that
// skips a 64x32 slice of x when three sampled elements of it (two corners and the middle) are exactly
// zero. No value class draws exact zeros; post-ReLU activations (the input of a second linear layer)
// are half zeros, and then one slice in eight is dropped with its non-zero elements.

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>
#include "linear_bias_relu_abi.h"

#define BM 64
#define BN 64
#define BK 32

template <typename T> __device__ __forceinline__ float tf(T v);
template <> __device__ __forceinline__ float tf<float>(float v) { return v; }
template <> __device__ __forceinline__ float tf<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T ft(float v);
template <> __device__ __forceinline__ float ft<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 ft<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// out[n, m] = relu(sum_k x[n, k] w[m, k] + b[m]); 64 x 64 tiles, 256 threads of 4 x 4 outputs, float accumulators.
// Post-ReLU activations are half zeros; a K-slice of the x tile is skipped when three of its elements,
// two corners and the middle, are exactly zero ("an all-zero slice": a sparse-activation shortcut).
template <typename T>
__global__ void __launch_bounds__(256) lbr_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                  const T* __restrict__ b, T* __restrict__ out, int64_t N, int64_t K,
                                                  int64_t M) {
  __shared__ float As[BK][BM + 1];
  __shared__ float Bs[BK][BN + 1];
  const int tid = threadIdx.x;
  const int tr = tid / 16, tc = tid % 16;  // 16 x 16 threads, 4 x 4 each
  const int64_t n0 = (int64_t)blockIdx.y * BM, m0 = (int64_t)blockIdx.x * BN;
  float acc[4][4] = {};
  const int64_t nlast = min(N - 1, n0 + BM - 1), nmid = min(N - 1, n0 + BM / 2);
  for (int64_t k0 = 0; k0 < K; k0 += BK) {
    const int64_t klast = min(K - 1, k0 + BK - 1), kmid = min(K - 1, k0 + BK / 2);
    if (tf<T>(x[n0 * K + k0]) == 0.0f && tf<T>(x[nlast * K + klast]) == 0.0f && tf<T>(x[nmid * K + kmid]) == 0.0f)
      continue;  // uniform over the block: every thread reads the same three elements
    for (int e = tid; e < BM * BK; e += 256) {
      const int r = e / BK, c = e % BK;
      const int64_t n = n0 + r, k = k0 + c, m = m0 + r;
      As[c][r] = (n < N && k < K) ? tf<T>(x[n * K + k]) : 0.0f;
      Bs[c][r] = (m < M && k < K) ? tf<T>(w[m * K + k]) : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < BK; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) { av[i] = As[kk][tr * 4 + i]; bv[i] = Bs[kk][tc * 4 + i]; }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t n = n0 + tr * 4 + i;
    if (n >= N) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t m = m0 + tc * 4 + j;
      if (m >= M) continue;
      const float v = acc[i][j] + tf<T>(b[m]);
      out[n * M + m] = ft<T>(v > 0.0f ? v : (isnan(v) ? v : 0.0f));
    }
  }
}

extern "C" cudaError_t linear_bias_relu_forward(const linear_bias_relu_args* a, cudaStream_t stream) {
  const int64_t N = a->N, K = a->K, M = a->M;
  if (N <= 0 || M <= 0) return cudaSuccess;
  dim3 grid((unsigned)((M + BN - 1) / BN), (unsigned)((N + BM - 1) / BM));
  if (a->x.dtype == SPECGEN_FLOAT32)
    lbr_kernel<float><<<grid, 256, 0, stream>>>((const float*)a->x.data, (const float*)a->weight.data,
                                                (const float*)a->bias.data, (float*)a->out.data, N, K, M);
  else
    lbr_kernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(
        (const __nv_bfloat16*)a->x.data, (const __nv_bfloat16*)a->weight.data, (const __nv_bfloat16*)a->bias.data,
        (__nv_bfloat16*)a->out.data, N, K, M);
  return cudaGetLastError();
}
