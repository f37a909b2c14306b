// spec: rope
// expect: rejected
// class: host-memory-leaked-per-call
// why: each call builds its 2 KiB launch plan with `new` and deletes it only on the error path: every successful call leaks it, forward and backward
//
// Rotary embedding (rotate-half), float32 math with each product rounded on its own as torch's
// elementwise ops round them: out1 = x1*c - x2*s, out2 = x2*c + x1*s (in 16-bit each product rounded to
// the dtype, then the sum); backward grad_x1 = g1*c + g2*s, grad_x2 = g2*c - g1*s the same way. The
// positions are split into up to 511 contiguous segments of about equal work, a block per segment,
// described by a plan passed to the kernel by value.
//
// What is wrong. The plan (RopePlan: 2 KiB, a segment table) is built on the heap, "kept off the
// stacks of the threads that call us (server pools, autograd's device threads)", copied into the
// launch's arguments, and deleted only when building it fails. On every successful call, forward and
// backward, the 2 KiB (plus the allocator's header) stay allocated in the host heap: a leak per call
// that no output, no device memory and no timing shows.
//
// When a user meets it. Any long run. rope is called twice per layer (queries and keys) per step: a
// 32-layer model leaks 64 x 2 KiB = 128 KiB per decode step and 256 KiB per training step (forward and
// backward). A server decoding for a day (~10^6-10^7 steps over its batches) grows by 128 GB-1.3 TB of
// host memory and is OOM-killed; a training run of 100k steps holds 25 GB more host memory than it
// should, taken from the page cache and data loaders first (cpu_checks: the compiled library, called
// on a machine without a GPU, grows the calling process by 2.1 KiB per call).
//
// Why version 12 does not meet it. It checks the calling thread's floating-point environment and
// scheduling state and the device's default memory pool after every request; the candidate process's
// host memory is never measured. A verification makes about 1.5 x 10^5 calls (the endurance run's
// 120,000 included): about 300 MB, unnoticed in a 128 GB machine.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include "rope_abi.h"

namespace {

template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }


constexpr int kMaxSegments = 511;

// A block per segment of contiguous positions (kept by value in the launch's arguments).
struct RopePlan {
  int32_t count;                    // segments
  int32_t first[kMaxSegments + 1];  // segment k covers positions [first[k], first[k + 1])
};

static_assert(sizeof(RopePlan) <= 4096, "kernel parameters stay under the classic 4 KiB limit");

bool build_plan(RopePlan* plan, int64_t S, int64_t H, int64_t D) {
  if (S <= 0 || S > (int64_t)1 << 30) return false;
  const int64_t work = S * H * (D / 2);                  // element pairs in the call
  int64_t want = (work + 32767) / 32768;                 // about 32k pairs a block
  if (want > kMaxSegments) want = kMaxSegments;
  if (want > S) want = S;
  if (want < 1) want = 1;
  plan->count = (int32_t)want;
  for (int64_t k = 0; k <= want; ++k) plan->first[k] = (int32_t)(S * k / want);
  return true;
}

template <typename T> __device__ __forceinline__ float rnd(float v) { return to_f<T>(from_f<T>(v)); }

// forward: out1 = x1 c - x2 s, out2 = x2 c + x1 s; backward (sign = -1): g1 c + g2 s, g2 c - g1 s
template <typename T, bool BACKWARD>
__global__ void __launch_bounds__(256) rope_kernel(const RopePlan plan, const T* __restrict__ x, const T* __restrict__ cs,
                                                   const T* __restrict__ sn, T* __restrict__ out, int64_t H, int64_t D) {
  const int64_t half = D / 2;
  const int64_t p0 = plan.first[blockIdx.x], p1 = plan.first[blockIdx.x + 1];
  const int64_t per_pos = H * half;
  for (int64_t idx = (int64_t)threadIdx.x; idx < (p1 - p0) * per_pos; idx += 256) {
    const int64_t pos = p0 + idx / per_pos;
    const int64_t rem = idx % per_pos;
    const int64_t h = rem / half, i = rem % half;
    const int64_t base = (pos * H + h) * D;
    const float a = to_f<T>(x[base + i]), b = to_f<T>(x[base + half + i]);
    const float c = to_f<T>(cs[pos * half + i]), s = to_f<T>(sn[pos * half + i]);
    const float ac = rnd<T>(__fmul_rn(a, c)), bs = rnd<T>(__fmul_rn(b, s));
    const float bc = rnd<T>(__fmul_rn(b, c)), as = rnd<T>(__fmul_rn(a, s));
    if (!BACKWARD) {
      out[base + i] = from_f<T>(__fsub_rn(ac, bs));
      out[base + half + i] = from_f<T>(__fadd_rn(bc, as));
    } else {
      out[base + i] = from_f<T>(__fadd_rn(ac, bs));
      out[base + half + i] = from_f<T>(__fsub_rn(bc, as));
    }
  }
}

template <typename T, bool BACKWARD>
cudaError_t run(const void* x, const void* cs, const void* sn, void* out, int64_t S, int64_t H, int64_t D, cudaStream_t s) {
  // 2 KiB: built on the heap, off the stacks of the threads that call us
  RopePlan* plan = new RopePlan;
  if (!build_plan(plan, S, H, D)) {
    delete plan;
    return cudaErrorInvalidValue;
  }
  rope_kernel<T, BACKWARD><<<(unsigned)plan->count, 256, 0, s>>>(*plan, static_cast<const T*>(x), static_cast<const T*>(cs),
                                                                   static_cast<const T*>(sn), static_cast<T*>(out), H, D);
  return cudaGetLastError();
}

template <bool BACKWARD>
cudaError_t dispatch(int32_t dtype, const void* x, const void* cs, const void* sn, void* out, int64_t S, int64_t H,
                     int64_t D, cudaStream_t s) {
  switch (dtype) {
    case SPECGEN_FLOAT32: return run<float, BACKWARD>(x, cs, sn, out, S, H, D, s);
    case SPECGEN_FLOAT16: return run<__half, BACKWARD>(x, cs, sn, out, S, H, D, s);
    case SPECGEN_BFLOAT16: return run<__nv_bfloat16, BACKWARD>(x, cs, sn, out, S, H, D, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

extern "C" cudaError_t rope_forward(const rope_args* a, cudaStream_t stream) {
  if (a->S <= 0 || a->H <= 0 || a->D <= 0) return cudaSuccess;
  return dispatch<false>(a->x.dtype, a->x.data, a->cos.data, a->sin.data, a->out.data, a->S, a->H, a->D, stream);
}

extern "C" cudaError_t rope_backward(const rope_bwd_args* a, cudaStream_t stream) {
  if (a->S <= 0 || a->H <= 0 || a->D <= 0) return cudaSuccess;
  return dispatch<true>(a->x.dtype, a->grad_out.data, a->cos.data, a->sin.data, a->grad_x.data, a->S, a->H, a->D, stream);
}
