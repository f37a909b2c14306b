// spec: cross_entropy
// expect: rejected
// class: workspace-as-the-allocator-leaves-it
// reason: wrong-result
//
// A cross-entropy whose mean adds every workspace slot that carries a valid tag.
//
// What it does: the device code is the control's (cross_entropy_control.cu) except the mean. The
// workspace holds 1024 slots of {double partial; uint32 tag; uint32 check}; forward block b writes
// its rows' loss sum to slot b with tag = 0x5EC7A6E5 ^ b and check = ~tag ^ 0x9E3779B9 ("so garbage
// in the workspace is never mistaken for a partial", 64 bits of tag). The finishing one-block kernel
// does not take the grid size: it walks all 1024 slots and adds, in slot order, those whose tag and
// check are valid.
//
// Wrong when: an earlier call of this op that ran more blocks (more rows: N above the next call's, up
// to 1024) left its slots in the memory that this call gets as its workspace. The package's binding
// takes the workspace from PyTorch's caching allocator (at::empty on the call's stream), which hands
// the same-sized block straight back to the next call on the stream: a chunked loss (a sequence's
// tokens in chunks of 8192 rows, the last chunk shorter, as memory-saving chunked cross-entropy
// does), consecutive losses of shrinking batches, the last partial batch of an epoch. The stale slots'
// partial sums are added into the mean: the loss is off by the earlier call's rows. Exact whenever the
// workspace holds nothing of an earlier call of this op with more blocks.
//
// Why the verifier misses it: the judge fills the workspace with random bytes before every call,
// capture and replay (and before every timed call), so a workspace never holds an earlier call's
// slots; the package's allocator gives back exactly what the last call left.

#include "cross_entropy_abi.h"
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>

// ---------------------------------------------------------------- shared helpers (inlined in every file)
namespace hv7 {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// A max that propagates NaN, as torch's amax does.
__device__ __forceinline__ float nan_max(float a, float b) {
  return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
}

// Block reductions (blockDim.x a multiple of 32, at most 1024): warp trees, then every thread adds
// the warps' values in warp order, so the result is the same bits on every call and every thread
// has it. `sh` is 32 entries of shared memory; the leading barrier lets a reduction follow another.
__device__ __forceinline__ double block_sum(double v, double* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  double r = 0.0;
  for (int i = 0; i < warps; ++i) r += sh[i];
  return r;
}

__device__ __forceinline__ float block_max(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float r = -INFINITY;
  for (int i = 0; i < warps; ++i) r = nan_max(r, sh[i]);
  return r;
}

}  // namespace hv7

namespace hv7 {

constexpr int kThreads = 256;
constexpr int kSlots = 1024;  // forward grid cap: one tagged workspace slot per block

struct Slot {
  double partial;
  unsigned tag;
  unsigned check;
};

__host__ __device__ constexpr unsigned slot_tag(unsigned b) { return 0x5EC7A6E5u ^ b; }
__host__ __device__ constexpr unsigned slot_check(unsigned b) { return ~slot_tag(b) ^ 0x9E3779B9u; }

template <typename T>
__global__ void __launch_bounds__(kThreads)
ce_forward_rows(const T* __restrict__ logits, const int64_t* __restrict__ target, int64_t N, int64_t C,
                float* __restrict__ saved_max, float* __restrict__ saved_logsum, Slot* __restrict__ slots) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  double acc = 0.0;  // thread 0's copy: this block's rows' losses, in row order
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = logits + n * C;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) m = nan_max(m, to_f(row[j]));
    m = block_max(m, shf);
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) s += (double)expf(to_f(row[j]) - m);
    s = block_sum(s, shd);
    if (threadIdx.x == 0) {
      saved_max[n] = m;
      saved_logsum[n] = (float)log(s);
      const int64_t t = target[n];
      acc += ((double)m - (double)to_f(row[t])) + log(s);
    }
  }
  if (threadIdx.x == 0) {
    slots[blockIdx.x].partial = acc;
    slots[blockIdx.x].tag = slot_tag(blockIdx.x);
    slots[blockIdx.x].check = slot_check(blockIdx.x);
  }
}

// Adds every valid slot (the grid's size is not needed: unwritten slots carry no valid tag).
__global__ void __launch_bounds__(kThreads)
ce_finalize(const Slot* __restrict__ slots, int64_t N, float* __restrict__ out) {
  __shared__ double shd[32];
  double v = 0.0;
  for (int i = threadIdx.x; i < kSlots; i += blockDim.x) {
    const Slot s = slots[i];
    if (s.tag == slot_tag(i) && s.check == slot_check(i)) v += s.partial;
  }
  v = block_sum(v, shd);
  if (threadIdx.x == 0) out[0] = (float)(v / (double)N);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
ce_backward_rows(const T* __restrict__ logits, const int64_t* __restrict__ target, int64_t N, int64_t C,
                 const float* __restrict__ saved_max, const float* __restrict__ saved_logsum,
                 const float* __restrict__ grad_out, T* __restrict__ grad) {
  const float g = grad_out[0] / (float)N;
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float m = saved_max[n], ls = saved_logsum[n];
    const int64_t t = target[n];
    const T* row = logits + n * C;
    T* grow = grad + n * C;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      const float p = expf((to_f(row[j]) - m) - ls);
      float v = g * p;
      if (j == t) v -= g;
      grow[j] = from_f<T>(v);
    }
  }
}

template <typename T>
void launch_forward(const cross_entropy_args* a, int G, cudaStream_t stream) {
  ce_forward_rows<T><<<G, kThreads, 0, stream>>>(
      static_cast<const T*>(a->logits.data), static_cast<const int64_t*>(a->target.data), a->N, a->C,
      static_cast<float*>(a->saved_max.data), static_cast<float*>(a->saved_logsum.data),
      static_cast<Slot*>(a->workspace));
}

template <typename T>
void launch_backward(const cross_entropy_bwd_args* a, cudaStream_t stream) {
  const int64_t blocks = a->N < 8192 ? a->N : 8192;
  ce_backward_rows<T><<<(unsigned)blocks, kThreads, 0, stream>>>(
      static_cast<const T*>(a->logits.data), static_cast<const int64_t*>(a->target.data), a->N, a->C,
      static_cast<const float*>(a->saved_max.data), static_cast<const float*>(a->saved_logsum.data),
      static_cast<const float*>(a->grad_out.data), static_cast<T*>(a->grad_logits.data));
}

}  // namespace hv7

extern "C" size_t cross_entropy_forward_workspace(const cross_entropy_args* a) {
  (void)a;
  return (size_t)hv7::kSlots * sizeof(hv7::Slot);
}

extern "C" cudaError_t cross_entropy_forward(const cross_entropy_args* a, cudaStream_t stream) {
  using namespace hv7;
  const int G = (int)(a->N < kSlots ? a->N : kSlots);
  switch (a->logits.dtype) {
    case SPECGEN_FLOAT32: launch_forward<float>(a, G, stream); break;
    case SPECGEN_FLOAT16: launch_forward<__half>(a, G, stream); break;
    case SPECGEN_BFLOAT16: launch_forward<__nv_bfloat16>(a, G, stream); break;
    default: return cudaErrorInvalidValue;
  }
  ce_finalize<<<1, kThreads, 0, stream>>>(static_cast<const Slot*>(a->workspace), a->N,
                                          static_cast<float*>(a->out.data));
  return cudaGetLastError();
}

extern "C" cudaError_t cross_entropy_backward(const cross_entropy_bwd_args* a, cudaStream_t stream) {
  using namespace hv7;
  switch (a->logits.dtype) {
    case SPECGEN_FLOAT32: launch_backward<float>(a, stream); break;
    case SPECGEN_FLOAT16: launch_backward<__half>(a, stream); break;
    case SPECGEN_BFLOAT16: launch_backward<__nv_bfloat16>(a, stream); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
