// spec: swiglu
// expect: rejected
// class: pdl-reads-before-grid-dependency-wait
// why: the forward is launched with programmatic dependent launch and loads x before griddepcontrol.wait: after a producer kernel that triggers its dependents early (a PDL-enabled GEMM), it reads x before the producer has written it
//
// SwiGLU, float32 math: out = silu(gate) * up, gate and up the two halves of x's last dim; in 16-bit
// silu(gate) is rounded to the dtype before the product, as torch computes F.silu(gate) * up.
// Backward (an ordinary launch): grad_up = g * silu(gate), grad_gate = (g * up) * s * (1 + gate *
// (1 - s)) with s = sigmoid(gate), torch's silu_backward. A thread per 16-byte chunk of a row (or per
// element when the row is not aligned), rows on the grid's x axis.
//
// What is wrong. The forward is launched with cudaLaunchKernelEx and the attribute
// cudaLaunchAttributeProgrammaticStreamSerialization (programmatic dependent launch, PDL: the kernel
// may start while the previous kernel in the stream is still running, once that kernel triggers its
// dependents), to hide the launch latency of this small epilogue behind the gate/up GEMM. The kernel
// triggers its own dependents, then waits (griddepcontrol.wait) only before storing its outputs,
// "so that we never overwrite memory the previous kernel may still read" -- but it loads gate and up
// BEFORE the wait, to overlap the loads with the producer's tail. A PDL wait is the only thing that
// makes the producer's writes visible: loads issued before it can read x before the GEMM has
// stored it (stale values from the previous step or the allocator's garbage), silently.
//
// When a user meets it. Whenever the kernel before this op on the stream is a PDL primary that
// triggers early (griddepcontrol.launch_dependents / cudaTriggerProgrammaticLaunchCompletion before
// its stores): CUTLASS-3 / TensorRT-LLM GEMMs and fused-MoE kernels and FlashInfer kernels with PDL
// enabled, as TensorRT-LLM, SGLang and vLLM use them on Hopper; the gate/up projection right before
// SwiGLU is exactly such a GEMM. Which rows come out stale depends on timing (the longer the producer's
// tail, e.g. under concurrent KV-cache traffic, the more). The same bug was found and fixed in a
// serving stack's fused allreduce+RMSNorm kernels (lightseekorg/tokenspeed#327, "Load upstream-produced
// inputs only after gridDepSync": a half-written residual read early collapsed speculative decoding's
// acceptance rate), and a CCCL review rule for it is proposed (NVIDIA/cccl#11569, correctness.pdl-sync).
//
// Why version 12 does not meet it. Nothing it runs before a call on the call's stream is a PDL primary
// that triggers early: the judge writes every input and synchronizes before each request, and what the
// candidate's process queues before a call (output poison, the L2 flush, the spin that covers the
// launch, the event waits of the calls side by side) are ordinary kernels, which let a dependent start
// only once they have finished. In a graph replay or the endurance run the kernel before a call is
// this op's own previous call, whose input is the same x. So every load it makes already sees its input.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include "swiglu_abi.h"

namespace {

template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T, int VEC>
__device__ __forceinline__ void load_chunk(const T* p, float* dst) {
  if (VEC == 1) {
    dst[0] = to_f<T>(p[0]);
  } else {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < VEC; ++k) dst[k] = to_f<T>(e[k]);
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void store_chunk(T* p, const float* src) {
  if (VEC == 1) {
    p[0] = from_f<T>(src[0]);
  } else {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int k = 0; k < VEC; ++k) e[k] = from_f<T>(src[k]);
    *reinterpret_cast<uint4*>(p) = raw;
  }
}

template <typename T>
__device__ __forceinline__ float silu_f(float g) { return g / (1.f + expf(-g)); }

// silu(gate) rounded to the dtype before the product (torch: F.silu in the dtype, then the mul)
template <typename T>
__device__ __forceinline__ float silu_rounded(float g) { return to_f<T>(from_f<T>(silu_f<T>(g))); }

// thread per VEC outputs of row blockIdx.x; PDL: see the header
template <typename T, int VEC>
__global__ void __launch_bounds__(256) swiglu_fwd_pdl(const T* __restrict__ x, T* __restrict__ out, int64_t H) {
  const int64_t row = blockIdx.x;
  const int64_t c = ((int64_t)blockIdx.y * 256 + threadIdx.x) * VEC;
  const bool live = c < H;
  float gv[VEC], uv[VEC];
  if (live) {  // start the loads now, to overlap them with the previous kernel's tail
    load_chunk<T, VEC>(x + row * 2 * H + c, gv);
    load_chunk<T, VEC>(x + row * 2 * H + H + c, uv);
  }
  asm volatile("griddepcontrol.launch_dependents;");  // let the next kernel begin its prologue
  asm volatile("griddepcontrol.wait;" ::: "memory");   // the previous kernel is done: safe to write
  if (live) {
    float o[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) o[k] = silu_rounded<T>(gv[k]) * uv[k];
    store_chunk<T, VEC>(out + row * H + c, o);
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(256) swiglu_bwd(const T* __restrict__ x, const T* __restrict__ gout,
                                                  T* __restrict__ gx, int64_t H) {
  const int64_t row = blockIdx.x;
  const int64_t c = ((int64_t)blockIdx.y * 256 + threadIdx.x) * VEC;
  if (c >= H) return;
  float gv[VEC], uv[VEC], dy[VEC], gg[VEC], gu[VEC];
  load_chunk<T, VEC>(x + row * 2 * H + c, gv);
  load_chunk<T, VEC>(x + row * 2 * H + H + c, uv);
  load_chunk<T, VEC>(gout + row * H + c, dy);
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    const float s = 1.f / (1.f + expf(-gv[k]));
    gu[k] = dy[k] * silu_rounded<T>(gv[k]);                    // grad of up: dy * silu(gate)
    const float gs = to_f<T>(from_f<T>(dy[k] * uv[k]));        // grad of silu(gate), in the dtype
    gg[k] = (gs * s) * (1.f + gv[k] * (1.f - s));              // torch's silu_backward
  }
  store_chunk<T, VEC>(gx + row * 2 * H + c, gg);
  store_chunk<T, VEC>(gx + row * 2 * H + H + c, gu);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename T, int VEC>
cudaError_t launch_fwd(const T* x, T* out, int64_t N, int64_t H, cudaStream_t s) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)N, (unsigned)((H + 256 * VEC - 1) / (256 * VEC)));
  cfg.blockDim = dim3(256);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, swiglu_fwd_pdl<T, VEC>, x, out, H);
}

template <typename T>
cudaError_t forward_t(const swiglu_args* a, cudaStream_t s) {
  const T* x = static_cast<const T*>(a->x.data);
  T* out = static_cast<T*>(a->out.data);
  constexpr int V = 16 / (int)sizeof(T);
  const bool vec = aligned16(x) && aligned16(out) && a->H % V == 0;
  cudaError_t err = vec ? launch_fwd<T, V>(x, out, a->N, a->H, s) : launch_fwd<T, 1>(x, out, a->N, a->H, s);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward_t(const swiglu_bwd_args* a, cudaStream_t s) {
  const T* x = static_cast<const T*>(a->x.data);
  const T* g = static_cast<const T*>(a->grad_out.data);
  T* gx = static_cast<T*>(a->grad_x.data);
  constexpr int V = 16 / (int)sizeof(T);
  const int64_t N = a->N, H = a->H;
  if (aligned16(x) && aligned16(g) && aligned16(gx) && H % V == 0)
    swiglu_bwd<T, V><<<dim3((unsigned)N, (unsigned)((H + 256 * V - 1) / (256 * V))), 256, 0, s>>>(x, g, gx, H);
  else
    swiglu_bwd<T, 1><<<dim3((unsigned)N, (unsigned)((H + 255) / 256)), 256, 0, s>>>(x, g, gx, H);
  return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t swiglu_forward(const swiglu_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->H <= 0) return cudaSuccess;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return forward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t swiglu_backward(const swiglu_bwd_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->H <= 0) return cudaSuccess;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return backward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
