"""Shared honest code for the attacks-v4 kernels (each .cu is self-contained: the generator
pastes the prelude and the spec's honest forward/backward into every file)."""

PRELUDE = r'''
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>

namespace hk {
__device__ __forceinline__ float f(float v) { return v; }
__device__ __forceinline__ float f(__half v) { return __half2float(v); }
__device__ __forceinline__ float f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T cv(float v);
template <> __device__ __forceinline__ float cv<float>(float v) { return v; }
template <> __device__ __forceinline__ __half cv<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 cv<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <typename T> __device__ __forceinline__ float rnd(float v) { return f(cv<T>(v)); }
__device__ __forceinline__ float mx(float a, float b) { return (a > b || a != a) ? a : b; }  // NaN wins
__device__ __forceinline__ float wsum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float wmax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = mx(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// block-wide sum / max (blockDim.x a multiple of 32, <= 1024); every thread gets the result
__device__ __forceinline__ float bsum(float v) {
  __shared__ float sm[33];
  v = wsum(v);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (l == 0) sm[w] = v;
  __syncthreads();
  if (w == 0) {
    float t = l < nw ? sm[l] : 0.f;
    t = wsum(t);
    if (l == 0) sm[32] = t;
  }
  __syncthreads();
  return sm[32];
}
__device__ __forceinline__ float bmax(float v) {
  __shared__ float sm[33];
  v = wmax(v);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (l == 0) sm[w] = v;
  __syncthreads();
  if (w == 0) {
    float t = l < nw ? sm[l] : -INFINITY;
    t = wmax(t);
    if (l == 0) sm[32] = t;
  }
  __syncthreads();
  return sm[32];
}
__device__ __forceinline__ float gelu(float x) {
  const float k = 0.7978845608028654f;
  const float t = tanhf(k * (x + 0.044715f * x * x * x));
  return 0.5f * x * (1.f + t);
}
__device__ __forceinline__ float gelu_grad(float x) {
  if (fabsf(x) > 20.f) return isinf(x) ? __int_as_float(0x7fc00000) : (x > 0.f ? 1.f : 0.f);  // +-inf: NaN, as the reference
  const float k = 0.7978845608028654f;
  const float x2 = x * x;
  const float t = tanhf(k * (x + 0.044715f * x2 * x));
  return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * k * (1.f + 0.134145f * x2);
}
__device__ __forceinline__ float sigm(float g) { return 1.f / (1.f + expf(-g)); }
__device__ __forceinline__ uint64_t gtimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
static inline unsigned blocks_for(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > (1 << 20)) b = 1 << 20;
  return (unsigned)b;
}
static inline bool al16(const void* p) { return ((uintptr_t)p & 15u) == 0; }
static inline int esize(int32_t dt) { return dt == SPECGEN_FLOAT32 ? 4 : 2; }
static inline bool capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(s, &st);
  return st != cudaStreamCaptureStatusNone;
}
static inline int row_threads(int64_t D) { return D >= 16384 ? 1024 : D >= 2048 ? 512 : D >= 256 ? 256 : 128; }

// Keep freed stream-ordered allocations in the default pool (called eagerly, before any capture):
// without it every cudaMallocAsync below maps fresh memory.
static inline void pool_keep() {
  static bool done = false;
  if (done) return;
  done = true;
  int dev = 0; cudaMemPool_t pool;
  if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess) {
    uint64_t keep = ~0ull;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  }
  (void)cudaGetLastError();
}

// Deterministic column reduction: out[j] = sum_n term(n, j), n in [0, N), in a fixed order
// (row chunks summed per column, then the chunk partials in order).
template <typename F>
__global__ void col_part(F term, float* __restrict__ part, int64_t N, int64_t D, int64_t R) {
  const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= D) return;
  const int64_t n0 = blockIdx.y * R, n1 = n0 + R < N ? n0 + R : N;
  float s = 0.f;
  for (int64_t n = n0; n < n1; ++n) s += term(n, j);
  part[blockIdx.y * D + j] = s;
}
template <typename T>
__global__ void col_final(const float* __restrict__ part, T* __restrict__ out, int64_t D, int CH) {
  const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= D) return;
  float s = 0.f;
  for (int c = 0; c < CH; ++c) s += part[c * D + j];
  out[j] = cv<T>(s);
}
template <typename T, typename F>
static cudaError_t col_reduce(F term, T* out, int64_t N, int64_t D, cudaStream_t s) {
  if (D == 0) return cudaSuccess;
  const int CH = N < 64 ? (int)(N > 0 ? N : 1) : 64;
  const int64_t R = (N + CH - 1) / CH;
  float* part = nullptr;
  pool_keep();
  cudaError_t e = cudaMallocAsync((void**)&part, sizeof(float) * CH * D, s);
  if (e != cudaSuccess) return e;
  col_part<F><<<dim3((unsigned)((D + 127) / 128), CH), 128, 0, s>>>(term, part, N, D, R);
  col_final<T><<<(unsigned)((D + 127) / 128), 128, 0, s>>>(part, out, D, CH);
  cudaFreeAsync(part, s);
  return cudaGetLastError();
}
}  // namespace hk

#define HK_DISPATCH(dt, F, ...)                                        \
  switch (dt) {                                                        \
    case SPECGEN_FLOAT32: return F<float>(__VA_ARGS__);                \
    case SPECGEN_FLOAT16: return F<__half>(__VA_ARGS__);               \
    case SPECGEN_BFLOAT16: return F<__nv_bfloat16>(__VA_ARGS__);       \
    default: return cudaErrorInvalidValue;                             \
  }
'''

HONEST = {}

# ---------------------------------------------------------------- gelu_tanh
HONEST["gelu_tanh"] = r'''
template <typename T> __global__ void h_gelu_s(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = hk::cv<T>(hk::gelu(hk::f(x[i])));
}
template <typename T> __global__ void h_gelu_v(const T* __restrict__ x, T* __restrict__ y, int64_t nv) {
  constexpr int V = 16 / sizeof(T);
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nv; i += (int64_t)gridDim.x * blockDim.x) {
    uint4 r = __ldg(reinterpret_cast<const uint4*>(x) + i), o;
    const T* e = reinterpret_cast<const T*>(&r);
    T* oe = reinterpret_cast<T*>(&o);
#pragma unroll
    for (int v = 0; v < V; ++v) oe[v] = hk::cv<T>(hk::gelu(hk::f(e[v])));
    reinterpret_cast<uint4*>(y)[i] = o;
  }
}
template <typename T> static cudaError_t h_fwd_t(const gelu_tanh_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  constexpr int V = 16 / sizeof(T);
  const T* x = (const T*)a->x.data; T* y = (T*)a->out.data;
  if (hk::al16(x) && hk::al16(y) && n % V == 0) h_gelu_v<T><<<hk::blocks_for(n / V, 256), 256, 0, s>>>(x, y, n / V);
  else h_gelu_s<T><<<hk::blocks_for(n, 256), 256, 0, s>>>(x, y, n);
  return cudaGetLastError();
}
static cudaError_t honest_fwd(const gelu_tanh_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, h_fwd_t, a, s) }

template <typename T> __global__ void h_gelu_b(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ gx, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    gx[i] = hk::cv<T>(hk::f(g[i]) * hk::gelu_grad(hk::f(x[i])));
}
template <typename T> static cudaError_t h_bwd_t(const gelu_tanh_bwd_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  h_gelu_b<T><<<hk::blocks_for(n, 256), 256, 0, s>>>((const T*)a->x.data, (const T*)a->grad_out.data, (T*)a->grad_x.data, n);
  return cudaGetLastError();
}
static cudaError_t honest_bwd(const gelu_tanh_bwd_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, h_bwd_t, a, s) }
'''

# ---------------------------------------------------------------- bias_gelu
HONEST["bias_gelu"] = r'''
template <typename T> __global__ void h_bg_f(const T* __restrict__ x, const T* __restrict__ b, T* __restrict__ y, int64_t n, int64_t D) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float sv = hk::rnd<T>(hk::f(x[i]) + hk::f(b[i % D]));
    y[i] = hk::cv<T>(hk::gelu(sv));
  }
}
template <typename T> static cudaError_t h_fwd_t(const bias_gelu_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  h_bg_f<T><<<hk::blocks_for(n, 256), 256, 0, s>>>((const T*)a->x.data, (const T*)a->bias.data, (T*)a->out.data, n, a->D);
  return cudaGetLastError();
}
static cudaError_t honest_fwd(const bias_gelu_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, h_fwd_t, a, s) }

template <typename T> __global__ void h_bg_b(const T* __restrict__ x, const T* __restrict__ b, const T* __restrict__ g,
                                             T* __restrict__ gx, int64_t n, int64_t D) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float sv = hk::rnd<T>(hk::f(x[i]) + hk::f(b[i % D]));
    gx[i] = hk::cv<T>(hk::f(g[i]) * hk::gelu_grad(sv));
  }
}
template <typename T> struct BgTerm {
  const T* gx; int64_t D;
  __device__ float operator()(int64_t n, int64_t j) const { return hk::f(gx[n * D + j]); }
};
template <typename T> static cudaError_t h_bwd_t(const bias_gelu_bwd_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  h_bg_b<T><<<hk::blocks_for(n, 256), 256, 0, s>>>((const T*)a->x.data, (const T*)a->bias.data, (const T*)a->grad_out.data,
                                                   (T*)a->grad_x.data, n, a->D);
  return hk::col_reduce<T>(BgTerm<T>{(const T*)a->grad_x.data, a->D}, (T*)a->grad_bias.data, a->N, a->D, s);
}
static cudaError_t honest_bwd(const bias_gelu_bwd_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, h_bwd_t, a, s) }
'''

# ---------------------------------------------------------------- swiglu
HONEST["swiglu"] = r'''
template <typename T> __global__ void h_sw_s(const T* __restrict__ x, T* __restrict__ y, int64_t n, int64_t H) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / H, j = i - r * H;
    const float g = hk::f(x[r * 2 * H + j]), u = hk::f(x[r * 2 * H + H + j]);
    y[i] = hk::cv<T>(hk::rnd<T>(g * hk::sigm(g)) * u);
  }
}
template <typename T> __global__ void h_sw_v(const T* __restrict__ x, T* __restrict__ y, int64_t nv, int64_t Hv) {
  constexpr int V = 16 / sizeof(T);
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nv; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / Hv, j = i - r * Hv;
    const uint4* xr = reinterpret_cast<const uint4*>(x) + r * 2 * Hv;
    uint4 gr = __ldg(xr + j), ur = __ldg(xr + Hv + j), o;
    const T* ge = reinterpret_cast<const T*>(&gr); const T* ue = reinterpret_cast<const T*>(&ur);
    T* oe = reinterpret_cast<T*>(&o);
#pragma unroll
    for (int v = 0; v < V; ++v) { const float g = hk::f(ge[v]); oe[v] = hk::cv<T>(hk::rnd<T>(g * hk::sigm(g)) * hk::f(ue[v])); }
    reinterpret_cast<uint4*>(y)[i] = o;
  }
}
template <typename T> static cudaError_t h_fwd_t(const swiglu_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->H;
  if (n == 0) return cudaSuccess;
  constexpr int V = 16 / sizeof(T);
  const T* x = (const T*)a->x.data; T* y = (T*)a->out.data;
  if (hk::al16(x) && hk::al16(y) && a->H % V == 0) h_sw_v<T><<<hk::blocks_for(n / V, 256), 256, 0, s>>>(x, y, n / V, a->H / V);
  else h_sw_s<T><<<hk::blocks_for(n, 256), 256, 0, s>>>(x, y, n, a->H);
  return cudaGetLastError();
}
static cudaError_t honest_fwd(const swiglu_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, h_fwd_t, a, s) }

template <typename T> __global__ void h_sw_b(const T* __restrict__ x, const T* __restrict__ go, T* __restrict__ gx, int64_t n, int64_t H) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / H, j = i - r * H;
    const float g = hk::f(x[r * 2 * H + j]), u = hk::f(x[r * 2 * H + H + j]), d = hk::f(go[i]);
    const float sg = hk::sigm(g);
    const float act = hk::rnd<T>(g * sg);
    const float ga = hk::rnd<T>(d * u);
    gx[r * 2 * H + j] = hk::cv<T>(ga * sg * (1.f + g * (1.f - sg)));
    gx[r * 2 * H + H + j] = hk::cv<T>(d * act);
  }
}
template <typename T> static cudaError_t h_bwd_t(const swiglu_bwd_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->H;
  if (n == 0) return cudaSuccess;
  h_sw_b<T><<<hk::blocks_for(n, 256), 256, 0, s>>>((const T*)a->x.data, (const T*)a->grad_out.data, (T*)a->grad_x.data, n, a->H);
  return cudaGetLastError();
}
static cudaError_t honest_bwd(const swiglu_bwd_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, h_bwd_t, a, s) }
'''

# ---------------------------------------------------------------- rope
HONEST["rope"] = r'''
template <typename T> __global__ void h_rope_f(const T* __restrict__ x, const T* __restrict__ c, const T* __restrict__ sn,
                                               T* __restrict__ y, int64_t S, int64_t H, int64_t D) {
  const int64_t half = D / 2, n = S * H * half;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t k = i % half, sh = i / half, sp = sh / H;
    const float x1 = hk::f(x[sh * D + k]), x2 = hk::f(x[sh * D + half + k]);
    const float cc = hk::f(c[sp * half + k]), ss = hk::f(sn[sp * half + k]);
    y[sh * D + k] = hk::cv<T>(hk::rnd<T>(__fmul_rn(x1, cc)) - hk::rnd<T>(__fmul_rn(x2, ss)));
    y[sh * D + half + k] = hk::cv<T>(hk::rnd<T>(__fmul_rn(x2, cc)) + hk::rnd<T>(__fmul_rn(x1, ss)));
  }
}
template <typename T> static cudaError_t h_fwd_t(const rope_args* a, cudaStream_t s) {
  const int64_t n = a->S * a->H * (a->D / 2);
  if (n == 0) return cudaSuccess;
  h_rope_f<T><<<hk::blocks_for(n, 256), 256, 0, s>>>((const T*)a->x.data, (const T*)a->cos.data, (const T*)a->sin.data,
                                                     (T*)a->out.data, a->S, a->H, a->D);
  return cudaGetLastError();
}
static cudaError_t honest_fwd(const rope_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, h_fwd_t, a, s) }

template <typename T> __global__ void h_rope_bx(const T* __restrict__ g, const T* __restrict__ c, const T* __restrict__ sn,
                                                T* __restrict__ gx, int64_t S, int64_t H, int64_t D) {
  const int64_t half = D / 2, n = S * H * half;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t k = i % half, sh = i / half, sp = sh / H;
    const float g1 = hk::f(g[sh * D + k]), g2 = hk::f(g[sh * D + half + k]);
    const float cc = hk::f(c[sp * half + k]), ss = hk::f(sn[sp * half + k]);
    gx[sh * D + k] = hk::cv<T>(hk::rnd<T>(__fmul_rn(g1, cc)) + hk::rnd<T>(__fmul_rn(g2, ss)));
    gx[sh * D + half + k] = hk::cv<T>(hk::rnd<T>(__fmul_rn(g2, cc)) - hk::rnd<T>(__fmul_rn(g1, ss)));
  }
}
template <typename T> __global__ void h_rope_bt(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ gc,
                                                T* __restrict__ gs, int64_t S, int64_t H, int64_t D) {
  const int64_t half = D / 2, n = S * half;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t k = i % half, sp = i / half;
    float a1 = 0.f, a2 = 0.f, b1 = 0.f, b2 = 0.f;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t base = (sp * H + h) * D;
      const float x1 = hk::f(x[base + k]), x2 = hk::f(x[base + half + k]);
      const float g1 = hk::f(g[base + k]), g2 = hk::f(g[base + half + k]);
      a1 += hk::rnd<T>(g1 * x1); a2 += hk::rnd<T>(g2 * x2);
      b1 += hk::rnd<T>(g2 * x1); b2 += hk::rnd<T>(g1 * x2);
    }
    gc[i] = hk::cv<T>(hk::rnd<T>(a1) + hk::rnd<T>(a2));
    gs[i] = hk::cv<T>(hk::rnd<T>(b1) - hk::rnd<T>(b2));
  }
}
template <typename T> static cudaError_t h_bwd_t(const rope_bwd_args* a, cudaStream_t s) {
  const int64_t n = a->S * a->H * (a->D / 2);
  if (n == 0) return cudaSuccess;
  h_rope_bx<T><<<hk::blocks_for(n, 256), 256, 0, s>>>((const T*)a->grad_out.data, (const T*)a->cos.data, (const T*)a->sin.data,
                                                      (T*)a->grad_x.data, a->S, a->H, a->D);
  h_rope_bt<T><<<hk::blocks_for(a->S * (a->D / 2), 128), 128, 0, s>>>((const T*)a->x.data, (const T*)a->grad_out.data,
      (T*)a->grad_cos.data, (T*)a->grad_sin.data, a->S, a->H, a->D);
  return cudaGetLastError();
}
static cudaError_t honest_bwd(const rope_bwd_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, h_bwd_t, a, s) }
'''

# ---------------------------------------------------------------- softmax
HONEST["softmax"] = r'''
template <typename T> __global__ void h_sm_f(const T* __restrict__ x, T* __restrict__ y, int64_t D) {
  const T* xr = x + blockIdx.x * D; T* yr = y + blockIdx.x * D;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) m = hk::mx(m, hk::f(xr[j]));
  m = hk::bmax(m);
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) sum += expf(hk::f(xr[j]) - m);
  sum = hk::bsum(sum);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) yr[j] = hk::cv<T>(expf(hk::f(xr[j]) - m) / sum);
}
template <typename T> static cudaError_t h_fwd_t(const softmax_args* a, cudaStream_t s) {
  if (a->N * a->D == 0) return cudaSuccess;
  h_sm_f<T><<<(unsigned)a->N, hk::row_threads(a->D), 0, s>>>((const T*)a->x.data, (T*)a->out.data, a->D);
  return cudaGetLastError();
}
static cudaError_t honest_fwd(const softmax_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, h_fwd_t, a, s) }

template <typename T> __global__ void h_sm_b(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ gx, int64_t D) {
  const int64_t o = blockIdx.x * D;
  float dot = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) dot += hk::f(g[o + j]) * hk::f(y[o + j]);
  dot = hk::bsum(dot);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) gx[o + j] = hk::cv<T>(hk::f(y[o + j]) * (hk::f(g[o + j]) - dot));
}
template <typename T> static cudaError_t h_bwd_t(const softmax_bwd_args* a, cudaStream_t s) {
  if (a->N * a->D == 0) return cudaSuccess;
  h_sm_b<T><<<(unsigned)a->N, hk::row_threads(a->D), 0, s>>>((const T*)a->out.data, (const T*)a->grad_out.data, (T*)a->grad_x.data, a->D);
  return cudaGetLastError();
}
static cudaError_t honest_bwd(const softmax_bwd_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, h_bwd_t, a, s) }
'''

# ---------------------------------------------------------------- log_softmax
HONEST["log_softmax"] = r'''
template <typename T> __global__ void h_ls_f(const T* __restrict__ x, T* __restrict__ y, int64_t D) {
  const T* xr = x + blockIdx.x * D; T* yr = y + blockIdx.x * D;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) m = hk::mx(m, hk::f(xr[j]));
  m = hk::bmax(m);
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) sum += expf(hk::f(xr[j]) - m);
  sum = hk::bsum(sum);
  const float ls = logf(sum);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) yr[j] = hk::cv<T>((hk::f(xr[j]) - m) - ls);
}
template <typename T> static cudaError_t h_fwd_t(const log_softmax_args* a, cudaStream_t s) {
  if (a->N * a->D == 0) return cudaSuccess;
  h_ls_f<T><<<(unsigned)a->N, hk::row_threads(a->D), 0, s>>>((const T*)a->x.data, (T*)a->out.data, a->D);
  return cudaGetLastError();
}
static cudaError_t honest_fwd(const log_softmax_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, h_fwd_t, a, s) }

template <typename T> __global__ void h_ls_b(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ gx, int64_t D) {
  const int64_t o = blockIdx.x * D;
  float sg = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) sg += hk::f(g[o + j]);
  sg = hk::bsum(sg);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) gx[o + j] = hk::cv<T>(hk::f(g[o + j]) - expf(hk::f(y[o + j])) * sg);
}
template <typename T> static cudaError_t h_bwd_t(const log_softmax_bwd_args* a, cudaStream_t s) {
  if (a->N * a->D == 0) return cudaSuccess;
  h_ls_b<T><<<(unsigned)a->N, hk::row_threads(a->D), 0, s>>>((const T*)a->out.data, (const T*)a->grad_out.data, (T*)a->grad_x.data, a->D);
  return cudaGetLastError();
}
static cudaError_t honest_bwd(const log_softmax_bwd_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, h_bwd_t, a, s) }
'''

# ---------------------------------------------------------------- rmsnorm
HONEST["rmsnorm"] = r'''
template <typename T> __global__ void h_rms_f(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int64_t D, float eps) {
  const T* xr = x + blockIdx.x * D; T* yr = y + blockIdx.x * D;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) { const float v = hk::f(xr[j]); ss += v * v; }
  ss = hk::bsum(ss);
  const float r = rsqrtf(ss / (float)D + eps);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) yr[j] = hk::cv<T>(hk::f(xr[j]) * r * hk::f(w[j]));
}
template <typename T> static cudaError_t h_fwd_t(const rmsnorm_args* a, cudaStream_t s) {
  if (a->N * a->D == 0) return cudaSuccess;
  h_rms_f<T><<<(unsigned)a->N, hk::row_threads(a->D), 0, s>>>((const T*)a->x.data, (const T*)a->weight.data, (T*)a->out.data, a->D, (float)a->eps);
  return cudaGetLastError();
}
static cudaError_t honest_fwd(const rmsnorm_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, h_fwd_t, a, s) }

template <typename T> __global__ void h_rms_b(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ g,
                                              T* __restrict__ gx, float* __restrict__ rs, int64_t D, float eps) {
  const int64_t o = blockIdx.x * D;
  float ss = 0.f, dot = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float v = hk::f(x[o + j]);
    ss += v * v; dot += hk::f(g[o + j]) * hk::f(w[j]) * v;
  }
  ss = hk::bsum(ss); dot = hk::bsum(dot);
  const float r = rsqrtf(ss / (float)D + eps);
  if (threadIdx.x == 0) rs[blockIdx.x] = r;
  const float c = r * r * r * dot / (float)D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
    gx[o + j] = hk::cv<T>(r * hk::f(g[o + j]) * hk::f(w[j]) - c * hk::f(x[o + j]));
}
template <typename T> struct RmsWTerm {
  const T* x; const T* g; const float* rs; int64_t D;
  __device__ float operator()(int64_t n, int64_t j) const { return hk::f(g[n * D + j]) * (hk::f(x[n * D + j]) * rs[n]); }
};
template <typename T> static cudaError_t h_bwd_t(const rmsnorm_bwd_args* a, cudaStream_t s) {
  if (a->N * a->D == 0) return cudaSuccess;
  float* rs = nullptr;
  hk::pool_keep();
  cudaError_t e = cudaMallocAsync((void**)&rs, sizeof(float) * a->N, s);
  if (e != cudaSuccess) return e;
  h_rms_b<T><<<(unsigned)a->N, hk::row_threads(a->D), 0, s>>>((const T*)a->x.data, (const T*)a->weight.data,
      (const T*)a->grad_out.data, (T*)a->grad_x.data, rs, a->D, (float)a->eps);
  e = hk::col_reduce<T>(RmsWTerm<T>{(const T*)a->x.data, (const T*)a->grad_out.data, rs, a->D}, (T*)a->grad_weight.data, a->N, a->D, s);
  cudaFreeAsync(rs, s);
  return e != cudaSuccess ? e : cudaGetLastError();
}
static cudaError_t honest_bwd(const rmsnorm_bwd_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, h_bwd_t, a, s) }
'''

# ---------------------------------------------------------------- add_rmsnorm
HONEST["add_rmsnorm"] = r'''
template <typename T> __global__ void h_arms_f(const T* __restrict__ x, const T* __restrict__ res, const T* __restrict__ w,
                                               T* __restrict__ y, T* __restrict__ ro, int64_t D, float eps) {
  const int64_t o = blockIdx.x * D;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float v = hk::rnd<T>(hk::f(x[o + j]) + hk::f(res[o + j]));
    ss += v * v;
  }
  ss = hk::bsum(ss);
  const float r = rsqrtf(ss / (float)D + eps);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const T sv = hk::cv<T>(hk::f(x[o + j]) + hk::f(res[o + j]));
    ro[o + j] = sv;
    y[o + j] = hk::cv<T>(hk::f(sv) * r * hk::f(w[j]));
  }
}
template <typename T> static cudaError_t h_fwd_t(const add_rmsnorm_args* a, cudaStream_t s) {
  if (a->N * a->D == 0) return cudaSuccess;
  h_arms_f<T><<<(unsigned)a->N, hk::row_threads(a->D), 0, s>>>((const T*)a->x.data, (const T*)a->residual.data,
      (const T*)a->weight.data, (T*)a->out.data, (T*)a->residual_out.data, a->D, (float)a->eps);
  return cudaGetLastError();
}
static cudaError_t honest_fwd(const add_rmsnorm_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, h_fwd_t, a, s) }

template <typename T> __global__ void h_arms_b(const T* __restrict__ x, const T* __restrict__ res, const T* __restrict__ w,
                                               const T* __restrict__ g, const T* __restrict__ gro, T* __restrict__ gx,
                                               T* __restrict__ gres, float* __restrict__ rs, int64_t D, float eps) {
  const int64_t o = blockIdx.x * D;
  float ss = 0.f, dot = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float v = hk::rnd<T>(hk::f(x[o + j]) + hk::f(res[o + j]));
    ss += v * v; dot += hk::f(g[o + j]) * hk::f(w[j]) * v;
  }
  ss = hk::bsum(ss); dot = hk::bsum(dot);
  const float r = rsqrtf(ss / (float)D + eps);
  if (threadIdx.x == 0) rs[blockIdx.x] = r;
  const float c = r * r * r * dot / (float)D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float v = hk::rnd<T>(hk::f(x[o + j]) + hk::f(res[o + j]));
    const float gr = hk::rnd<T>(r * hk::f(g[o + j]) * hk::f(w[j]) - c * v);
    const T t = hk::cv<T>(gr + hk::f(gro[o + j]));
    gx[o + j] = t; gres[o + j] = t;
  }
}
template <typename T> struct ArmsWTerm {
  const T* x; const T* res; const T* g; const float* rs; int64_t D;
  __device__ float operator()(int64_t n, int64_t j) const {
    const float v = hk::rnd<T>(hk::f(x[n * D + j]) + hk::f(res[n * D + j]));
    return hk::f(g[n * D + j]) * (v * rs[n]);
  }
};
template <typename T> static cudaError_t h_bwd_t(const add_rmsnorm_bwd_args* a, cudaStream_t s) {
  if (a->N * a->D == 0) return cudaSuccess;
  float* rs = nullptr;
  hk::pool_keep();
  cudaError_t e = cudaMallocAsync((void**)&rs, sizeof(float) * a->N, s);
  if (e != cudaSuccess) return e;
  h_arms_b<T><<<(unsigned)a->N, hk::row_threads(a->D), 0, s>>>((const T*)a->x.data, (const T*)a->residual.data,
      (const T*)a->weight.data, (const T*)a->grad_out.data, (const T*)a->grad_residual_out.data, (T*)a->grad_x.data,
      (T*)a->grad_residual.data, rs, a->D, (float)a->eps);
  e = hk::col_reduce<T>(ArmsWTerm<T>{(const T*)a->x.data, (const T*)a->residual.data, (const T*)a->grad_out.data, rs, a->D},
                        (T*)a->grad_weight.data, a->N, a->D, s);
  cudaFreeAsync(rs, s);
  return e != cudaSuccess ? e : cudaGetLastError();
}
static cudaError_t honest_bwd(const add_rmsnorm_bwd_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, h_bwd_t, a, s) }
'''

# ---------------------------------------------------------------- layernorm_gelu
HONEST["layernorm_gelu"] = r'''
template <typename T> __device__ __forceinline__ void ln_stats(const T* xr, int64_t D, float eps, float& mu, float& r) {
  float sm = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) sm += hk::f(xr[j]);
  mu = hk::bsum(sm) / (float)D;
  float sq = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) { const float d = hk::f(xr[j]) - mu; sq += d * d; }
  r = rsqrtf(hk::bsum(sq) / (float)D + eps);
}
template <typename T> __global__ void h_lng_f(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                              T* __restrict__ y, int64_t D, float eps) {
  const T* xr = x + blockIdx.x * D; T* yr = y + blockIdx.x * D;
  float mu, r;
  ln_stats<T>(xr, D, eps, mu, r);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float yt = hk::rnd<T>((hk::f(xr[j]) - mu) * r * hk::f(w[j]) + hk::f(b[j]));
    yr[j] = hk::cv<T>(hk::gelu(yt));
  }
}
template <typename T> static cudaError_t h_fwd_t(const layernorm_gelu_args* a, cudaStream_t s) {
  if (a->N * a->D == 0) return cudaSuccess;
  h_lng_f<T><<<(unsigned)a->N, hk::row_threads(a->D), 0, s>>>((const T*)a->x.data, (const T*)a->weight.data,
      (const T*)a->bias.data, (T*)a->out.data, a->D, (float)a->eps);
  return cudaGetLastError();
}
static cudaError_t honest_fwd(const layernorm_gelu_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, h_fwd_t, a, s) }

template <typename T> __device__ __forceinline__ float lng_gy(const T* x, const T* w, const T* b, const T* g, int64_t i,
                                                              int64_t j, float mu, float r) {
  const float yt = hk::rnd<T>((hk::f(x[i]) - mu) * r * hk::f(w[j]) + hk::f(b[j]));
  return hk::rnd<T>(hk::f(g[i]) * hk::gelu_grad(yt));
}
template <typename T> __global__ void h_lng_b(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                              const T* __restrict__ g, T* __restrict__ gx, float* __restrict__ st,
                                              int64_t D, float eps) {
  const int64_t o = blockIdx.x * D;
  float mu, r;
  ln_stats<T>(x + o, D, eps, mu, r);
  float s1 = 0.f, s2 = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float gw = lng_gy<T>(x, w, b, g, o + j, j, mu, r) * hk::f(w[j]);
    s1 += gw; s2 += gw * (hk::f(x[o + j]) - mu) * r;
  }
  s1 = hk::bsum(s1) / (float)D; s2 = hk::bsum(s2) / (float)D;
  if (threadIdx.x == 0) { st[2 * blockIdx.x] = mu; st[2 * blockIdx.x + 1] = r; }
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float gw = lng_gy<T>(x, w, b, g, o + j, j, mu, r) * hk::f(w[j]);
    const float xh = (hk::f(x[o + j]) - mu) * r;
    gx[o + j] = hk::cv<T>(r * (gw - s1 - xh * s2));
  }
}
template <typename T> struct LngTerm {
  const T* x; const T* w; const T* b; const T* g; const float* st; int64_t D; bool for_w;
  __device__ float operator()(int64_t n, int64_t j) const {
    const float mu = st[2 * n], r = st[2 * n + 1];
    const float gy = lng_gy<T>(x, w, b, g, n * D + j, j, mu, r);
    return for_w ? gy * ((hk::f(x[n * D + j]) - mu) * r) : gy;
  }
};
template <typename T> static cudaError_t h_bwd_t(const layernorm_gelu_bwd_args* a, cudaStream_t s) {
  if (a->N * a->D == 0) return cudaSuccess;
  float* st = nullptr;
  hk::pool_keep();
  cudaError_t e = cudaMallocAsync((void**)&st, sizeof(float) * 2 * a->N, s);
  if (e != cudaSuccess) return e;
  const T* x = (const T*)a->x.data; const T* w = (const T*)a->weight.data; const T* b = (const T*)a->bias.data;
  const T* g = (const T*)a->grad_out.data;
  h_lng_b<T><<<(unsigned)a->N, hk::row_threads(a->D), 0, s>>>(x, w, b, g, (T*)a->grad_x.data, st, a->D, (float)a->eps);
  e = hk::col_reduce<T>(LngTerm<T>{x, w, b, g, st, a->D, true}, (T*)a->grad_weight.data, a->N, a->D, s);
  if (e == cudaSuccess) e = hk::col_reduce<T>(LngTerm<T>{x, w, b, g, st, a->D, false}, (T*)a->grad_bias.data, a->N, a->D, s);
  cudaFreeAsync(st, s);
  return e != cudaSuccess ? e : cudaGetLastError();
}
static cudaError_t honest_bwd(const layernorm_gelu_bwd_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, h_bwd_t, a, s) }
'''

# ---------------------------------------------------------------- cross_entropy
HONEST["cross_entropy"] = r'''
template <typename T> __device__ __forceinline__ float ce_lse(const T* xr, int64_t C) {
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) m = hk::mx(m, hk::f(xr[j]));
  m = hk::bmax(m);
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) sum += expf(hk::f(xr[j]) - m);
  sum = hk::bsum(sum);
  return m + logf(sum);
}
template <typename T> __global__ void h_ce_rows(const T* __restrict__ x, const int64_t* __restrict__ t, float* __restrict__ loss, int64_t C) {
  const T* xr = x + blockIdx.x * C;
  const float lse = ce_lse<T>(xr, C);
  if (threadIdx.x == 0) loss[blockIdx.x] = lse - hk::f(xr[t[blockIdx.x]]);
}
__global__ void h_ce_mean(const float* __restrict__ loss, float* __restrict__ out, int64_t N) {
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) s += loss[i];
  s = hk::bsum(s);
  if (threadIdx.x == 0) out[0] = s / (float)N;
}
template <typename T> static cudaError_t h_fwd_t(const cross_entropy_args* a, cudaStream_t s) {
  float* loss = nullptr;
  hk::pool_keep();
  cudaError_t e = cudaMallocAsync((void**)&loss, sizeof(float) * a->N, s);
  if (e != cudaSuccess) return e;
  h_ce_rows<T><<<(unsigned)a->N, hk::row_threads(a->C), 0, s>>>((const T*)a->logits.data, (const int64_t*)a->target.data, loss, a->C);
  h_ce_mean<<<1, 1024, 0, s>>>(loss, (float*)a->out.data, a->N);
  cudaFreeAsync(loss, s);
  return cudaGetLastError();
}
static cudaError_t honest_fwd(const cross_entropy_args* a, cudaStream_t s) { HK_DISPATCH(a->logits.dtype, h_fwd_t, a, s) }

template <typename T> __global__ void h_ce_b(const T* __restrict__ x, const int64_t* __restrict__ t, const float* __restrict__ go,
                                             T* __restrict__ gx, int64_t C, float invN) {
  const T* xr = x + blockIdx.x * C; T* gr = gx + blockIdx.x * C;
  const float lse = ce_lse<T>(xr, C);
  const float sc = go[0] * invN;
  const int64_t tt = t[blockIdx.x];
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
    gr[j] = hk::cv<T>(sc * (expf(hk::f(xr[j]) - lse) - (j == tt ? 1.f : 0.f)));
}
template <typename T> static cudaError_t h_bwd_t(const cross_entropy_bwd_args* a, cudaStream_t s) {
  h_ce_b<T><<<(unsigned)a->N, hk::row_threads(a->C), 0, s>>>((const T*)a->logits.data, (const int64_t*)a->target.data,
      (const float*)a->grad_out.data, (T*)a->grad_logits.data, a->C, 1.f / (float)a->N);
  return cudaGetLastError();
}
static cudaError_t honest_bwd(const cross_entropy_bwd_args* a, cudaStream_t s) { HK_DISPATCH(a->logits.dtype, h_bwd_t, a, s) }
'''

# ---------------------------------------------------------------- linear_bias_relu
HONEST["linear_bias_relu"] = r'''
// 64x64 output tile per block, 256 threads, 4x4 outputs each, K in steps of 16 through shared memory.
template <typename T, bool SKIP> __global__ void __launch_bounds__(256)
h_lbr(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
      int64_t N, int64_t K, int64_t M, const float* __restrict__ thr) {
  __shared__ float xs[16][64 + 4], ws[16][64 + 4];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t n0 = (int64_t)blockIdx.y * 64, m0 = (int64_t)blockIdx.x * 64;
  float acc[4][4] = {};
  const float th = SKIP ? thr[0] : 0.f;
  for (int64_t k0 = 0; k0 < K; k0 += 16) {
    int any = 0;
    for (int i = threadIdx.x; i < 64 * 16; i += 256) {
      const int r = i / 16, kk = i % 16;
      const int64_t n = n0 + r, m = m0 + r, k = k0 + kk;
      const float xv = (n < N && k < K) ? hk::f(x[n * K + k]) : 0.f;
      if (SKIP) any |= (n < N) && !(fabsf(xv) < th);  // NaN/Inf count as large
      xs[kk][r] = xv;
      ws[kk][r] = (m < M && k < K) ? hk::f(w[m * K + k]) : 0.f;
    }
    if (SKIP) { if (!__syncthreads_or(any)) { __syncthreads(); continue; } } else __syncthreads();
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) {
      float xa[4], wb[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) { xa[i] = xs[kk][ty * 4 + i]; wb[i] = ws[kk][tx * 4 + i]; }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(xa[i], wb[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t n = n0 + ty * 4 + i;
    if (n >= N) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t m = m0 + tx * 4 + j;
      if (m < M) { const float v = acc[i][j] + hk::f(b[m]); y[n * M + m] = hk::cv<T>(v > 0.f ? v : (v != v ? v : 0.f)); }
    }
  }
}
template <typename T> static cudaError_t h_fwd_t(const linear_bias_relu_args* a, cudaStream_t s) {
  if (a->N * a->M == 0) return cudaSuccess;
  const dim3 grid((unsigned)((a->M + 63) / 64), (unsigned)((a->N + 63) / 64));
  h_lbr<T, false><<<grid, 256, 0, s>>>((const T*)a->x.data, (const T*)a->weight.data, (const T*)a->bias.data,
                                       (T*)a->out.data, a->N, a->K, a->M, nullptr);
  return cudaGetLastError();
}
template <typename T> static cudaError_t h_fwd_t2(const linear_bias_relu_args* a, cudaStream_t s) { return h_fwd_t<T>(a, s); }
static cudaError_t honest_fwd(const linear_bias_relu_args* a, cudaStream_t s) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return h_fwd_t<float>(a, s);
    case SPECGEN_BFLOAT16: return h_fwd_t<__nv_bfloat16>(a, s);
    default: return cudaErrorInvalidValue;
  }
}
'''
