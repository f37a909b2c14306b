// spec: layernorm_gelu
// expect: reject
// class: scratch-parked-in-a-private-memory-pool
//
// LayerNorm (affine) then GELU (tanh), forward and backward. Forward: one block of 256 threads per row;
// mean and variance summed in double (two passes), rstd = 1 / sqrt(var + eps) in float32, z = (x - mean)
// * rstd * w + b rounded to the working dtype (as torch's layer_norm output), out = gelu(z) in float32
// rounded once. Backward: the row statistics recomputed; gz = grad * gelu'(z) rounded to the dtype (as
// torch's autograd does); grad_x = rstd * (gz w - mean(gz w) - xhat * mean(gz w xhat)); grad_weight and
// grad_bias from double column partials over 128-row chunks, added in a fixed order. The row pass stages
// every xhat (float32, N x D) so that the column pass does not recompute statistics: the staging comes
// from a memory pool of the kernel's own (cudaMemPoolCreate once per device, release threshold at its
// maximum "so that repeated calls do not map and unmap it"), cudaMallocFromPoolAsync / cudaFreeAsync on
// `stream` every call, for calls of up to 2^27 elements (512 MiB of staging; larger calls recompute).
//
// What is wrong: a pool whose release threshold is its maximum keeps every byte ever freed to it: after
// the first large backward the process holds up to 512 MiB (256 MiB at 16384 x 4096) of GPU memory that
// nothing else can use, for the rest of its life: PyTorch's caching allocator cannot reuse it,
// torch.cuda.memory_allocated()/memory_reserved() do not show it, torch.cuda.empty_cache() cannot free it.
//
// Trigger a user meets: training near the GPU's memory limit (the usual case: batch size and activation
// checkpointing tuned to fit): the first backward of a LayerNorm+GELU block parks 256-512 MiB and a later
// peak (the optimizer step, evaluation, a longer batch) runs out of memory; a server sizing its KV cache
// from free memory after warm-up loses the same. A ViT/BERT-style MLP epilogue at 16k tokens x 4096.
//
// Why the verifier does not meet it: its memory checks read the device's default pool (bytes in use:
// 0 after every call; the high-water mark of the parked-scratch check: nothing passes through it) and
// its no-memory checks swap the device's current pool, which cudaMallocFromPoolAsync on a pool of the
// kernel's own never uses (the calls succeed with the right outputs). Nothing reads the device's free
// memory or the candidate's other pools, and cudaMemPoolCreate / cudaMallocFromPoolAsync are not among
// the refused symbols (only reading a pool's attributes is).
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

#include <mutex>

#include "layernorm_gelu_abi.h"

namespace {

// ---------------------------------------------------------------- element access
// 16-bit values are widened to float32, computed in float32 and rounded to nearest once.
[[maybe_unused]] __device__ __forceinline__ float to_f(float v) { return v; }
[[maybe_unused]] __device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
[[maybe_unused]] __device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// max that propagates NaN, as torch's amax/max do
[[maybe_unused]] __device__ __forceinline__ float max_nan(float a, float b) { return (a > b || a != a) ? a : b; }

template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

[[maybe_unused]] __device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum in a fixed order (bitwise deterministic); every thread gets the result. `sh` holds 32 values.
template <typename V>
__device__ __forceinline__ V block_sum(V v, V* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    V r = lane < warps ? sh[lane] : V(0);
    r = warp_sum(r);
    if (lane == 0) sh[0] = r;
  }
  __syncthreads();
  return sh[0];
}

[[maybe_unused]] __device__ __forceinline__ float block_max(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float r = lane < warps ? sh[lane] : -INFINITY;
    r = warp_max(r);
    if (lane == 0) sh[0] = r;
  }
  __syncthreads();
  return sh[0];
}

}  // namespace

namespace {

constexpr float kBeta = 0.7978845608028654f;
constexpr float kKappa = 0.044715f;
constexpr int kThreads = 256;
constexpr int kChunk = 128;
constexpr int64_t kStageMax = int64_t(1) << 27;
constexpr int kMaxDevices = 64;

__device__ __forceinline__ float gelu_f(float z) { return 0.5f * z * (1.f + tanhf(kBeta * (z + kKappa * (z * z * z)))); }

__device__ __forceinline__ float gelu_grad_f(float z) {
  const float z_sq = z * z;
  const float t = tanhf(kBeta * (z + kKappa * (z_sq * z)));
  return 0.5f * (1.f + t) + 0.5f * z * (1.f - t * t) * (kBeta * (1.f + 3.f * kKappa * z_sq));
}

// mean and rstd of a row: sums in double, two passes
template <typename T>
__device__ __forceinline__ float2 row_stats(const T* __restrict__ xr, int64_t D, float eps, double* sh) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) s += (double)to_f(xr[i]);
  const double mean = block_sum(s, sh) / (double)D;
  double q = 0.0;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) {
    const double d = (double)to_f(xr[i]) - mean;
    q += d * d;
  }
  const double var = block_sum(q, sh) / (double)D;
  return make_float2((float)mean, 1.f / sqrtf((float)var + eps));
}

template <typename T>
__global__ void __launch_bounds__(kThreads) ln_fwd(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                                   T* __restrict__ y, int64_t D, float eps) {
  __shared__ double sh[32];
  const int64_t base = (int64_t)blockIdx.x * D;
  const float2 st = row_stats(x + base, D, eps, sh);
  for (int64_t i = threadIdx.x; i < D; i += kThreads) {
    const float z = to_f(from_f<T>((to_f(x[base + i]) - st.x) * st.y * to_f(w[i]) + to_f(b[i])));
    y[base + i] = from_f<T>(gelu_f(z));
  }
}

// the row pass of the backward: grad_x, and xhat staged (stage != nullptr) or the row's stats kept
template <typename T>
__global__ void __launch_bounds__(kThreads) ln_bwd_rows(const T* __restrict__ x, const T* __restrict__ w,
                                                        const T* __restrict__ b, const T* __restrict__ g,
                                                        T* __restrict__ gx, float* __restrict__ stage,
                                                        float2* __restrict__ stats, int64_t D, float eps) {
  __shared__ double shd[32];
  __shared__ float shf[32];
  const int64_t base = (int64_t)blockIdx.x * D;
  const float2 st = row_stats(x + base, D, eps, shd);
  float s1 = 0.f, s2 = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) {
    const float xh = (to_f(x[base + i]) - st.x) * st.y;
    const float z = to_f(from_f<T>(xh * to_f(w[i]) + to_f(b[i])));
    const float gz = to_f(from_f<T>(to_f(g[base + i]) * gelu_grad_f(z)));
    const float gxh = gz * to_f(w[i]);
    s1 += gxh;
    s2 += gxh * xh;
    if (stage != nullptr) stage[base + i] = xh;
  }
  s1 = block_sum(s1, shf) / (float)D;
  s2 = block_sum(s2, shf) / (float)D;
  if (stats != nullptr && threadIdx.x == 0) stats[blockIdx.x] = st;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) {
    const float xh = (to_f(x[base + i]) - st.x) * st.y;
    const float z = to_f(from_f<T>(xh * to_f(w[i]) + to_f(b[i])));
    const float gz = to_f(from_f<T>(to_f(g[base + i]) * gelu_grad_f(z)));
    gx[base + i] = from_f<T>(st.y * (gz * to_f(w[i]) - s1 - xh * s2));
  }
}

// column partials of gz * xhat and gz over kChunk rows, in double; xhat from the staging or the kept stats
template <typename T>
__global__ void __launch_bounds__(kThreads) ln_bwd_cols(const T* __restrict__ x, const T* __restrict__ w,
                                                        const T* __restrict__ b, const T* __restrict__ g,
                                                        const float* __restrict__ stage, const float2* __restrict__ stats,
                                                        double2* __restrict__ part, int64_t N, int64_t D) {
  const int64_t c = (int64_t)blockIdx.y * kThreads + threadIdx.x;
  if (c >= D) return;
  const int64_t r0 = (int64_t)blockIdx.x * kChunk, r1 = r0 + kChunk < N ? r0 + kChunk : N;
  const float wc = to_f(w[c]), bc = to_f(b[c]);
  double aw = 0.0, ab = 0.0;
  for (int64_t r = r0; r < r1; ++r) {
    const float xh = stage != nullptr ? stage[r * D + c] : (to_f(x[r * D + c]) - stats[r].x) * stats[r].y;
    const float z = to_f(from_f<T>(xh * wc + bc));
    const float gz = to_f(from_f<T>(to_f(g[r * D + c]) * gelu_grad_f(z)));
    aw += (double)gz * (double)xh;
    ab += (double)gz;
  }
  part[(int64_t)blockIdx.x * D + c] = make_double2(aw, ab);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) ln_bwd_sum(const double2* __restrict__ part, T* __restrict__ gw,
                                                       T* __restrict__ gb, int64_t parts, int64_t D) {
  const int64_t c = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (c >= D) return;
  double aw = 0.0, ab = 0.0;
  for (int64_t k = 0; k < parts; ++k) {
    aw += part[k * D + c].x;
    ab += part[k * D + c].y;
  }
  gw[c] = from_f<T>((float)aw);
  gb[c] = from_f<T>((float)ab);
}

int64_t parts_of(int64_t N) { return (N + kChunk - 1) / kChunk; }
size_t part_bytes(int64_t N, int64_t D) { return (size_t)(parts_of(N) * D) * sizeof(double2); }
size_t stats_offset(int64_t N, int64_t D) { return (part_bytes(N, D) + 255) / 256 * 256; }

// the staging pool of a device: created once, kept for the process, every freed byte kept
std::mutex g_pool_lock;
cudaMemPool_t g_pool[kMaxDevices] = {};

cudaMemPool_t staging_pool() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return nullptr;
  std::lock_guard<std::mutex> hold(g_pool_lock);
  if (g_pool[device] == nullptr) {
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t pool = nullptr;
    if (cudaMemPoolCreate(&pool, &props) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    uint64_t keep = ~0ull;  // repeated calls do not map and unmap their staging
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    g_pool[device] = pool;
  }
  return g_pool[device];
}

template <typename T>
cudaError_t forward(const layernorm_gelu_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  ln_fwd<T><<<(unsigned)a->N, kThreads, 0, stream>>>((const T*)a->x.data, (const T*)a->weight.data,
                                                    (const T*)a->bias.data, (T*)a->out.data, a->D, (float)a->eps);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const layernorm_gelu_bwd_args* a, cudaStream_t stream) {
  const int64_t N = a->N, D = a->D;
  if (N <= 0 || D <= 0) return cudaSuccess;
  if (a->workspace == nullptr || (size_t)a->workspace_bytes < stats_offset(N, D) + (size_t)N * sizeof(float2)) {
    return cudaErrorInvalidValue;
  }
  double2* part = (double2*)a->workspace;
  float2* stats = (float2*)((char*)a->workspace + stats_offset(N, D));
  float* stage = nullptr;
  cudaMemPool_t pool = N * D <= kStageMax ? staging_pool() : nullptr;
  if (pool != nullptr) {
    const cudaError_t e = cudaMallocFromPoolAsync((void**)&stage, (size_t)(N * D) * sizeof(float), pool, stream);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      stage = nullptr;  // no staging: recompute from the kept statistics
    }
  }
  ln_bwd_rows<T><<<(unsigned)N, kThreads, 0, stream>>>((const T*)a->x.data, (const T*)a->weight.data,
                                                      (const T*)a->bias.data, (const T*)a->grad_out.data,
                                                      (T*)a->grad_x.data, stage, stats, D, (float)a->eps);
  const dim3 grid((unsigned)parts_of(N), (unsigned)((D + kThreads - 1) / kThreads));
  ln_bwd_cols<T><<<grid, kThreads, 0, stream>>>((const T*)a->x.data, (const T*)a->weight.data, (const T*)a->bias.data,
                                                (const T*)a->grad_out.data, stage, stats, part, N, D);
  ln_bwd_sum<T><<<(unsigned)((D + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      part, (T*)a->grad_weight.data, (T*)a->grad_bias.data, parts_of(N), D);
  const cudaError_t launched = cudaGetLastError();
  if (stage != nullptr) {
    const cudaError_t e = cudaFreeAsync(stage, stream);
    if (launched == cudaSuccess && e != cudaSuccess) return e;
  }
  return launched;
}

}  // namespace

extern "C" size_t layernorm_gelu_backward_workspace(const layernorm_gelu_bwd_args* a) {
  if (a->N <= 0 || a->D <= 0) return 0;
  return stats_offset(a->N, a->D) + (size_t)a->N * sizeof(float2);
}

extern "C" cudaError_t layernorm_gelu_forward(const layernorm_gelu_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward<float>(a, stream);
    case SPECGEN_FLOAT16: return forward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t layernorm_gelu_backward(const layernorm_gelu_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward<float>(a, stream);
    case SPECGEN_FLOAT16: return backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
