"""The CUDA helpers pasted into every generated kernel (a kernel file includes only CUDA
headers and its ABI header, so the helpers travel inside it). A Python string so it ships
in the wheel with the code."""

PRELUDE = r"""// ---- specgen builtin runtime helpers (inlined into every generated kernel) ----
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <stdint.h>
#include <math.h>
#include <atomic>

namespace sg {

// Math runs in fp32 for half types (fp64 for double); storage keeps the spec's dtype.
template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ int64_t to_acc(int64_t v) { return v; }
__device__ __forceinline__ int64_t to_acc(int32_t v) { return v; }

template <typename T> __device__ __forceinline__ T from_acc(float v);
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <typename T> __device__ __forceinline__ T from_acc(double v) { return (T)v; }

// VEC consecutive elements; one 16-byte transaction when VEC * sizeof(T) == 16 (the host
// checks alignment at run time: pointers may be offset views).
template <int VEC, typename T, typename A>
__device__ __forceinline__ void load_vec(const T* __restrict__ p, A (&out)[VEC]) {
  if constexpr (VEC * sizeof(T) == 16) {
    union { uint4 raw; T v[VEC]; } u;
    u.raw = __ldg(reinterpret_cast<const uint4*>(p));
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = (A)to_acc(u.v[i]);
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = (A)to_acc(p[i]);
  }
}

template <int VEC, typename T, typename A>
__device__ __forceinline__ void store_vec(T* __restrict__ p, const A (&in)[VEC]) {
  if constexpr (VEC * sizeof(T) == 16) {
    union { uint4 raw; T v[VEC]; } u;
#pragma unroll
    for (int i = 0; i < VEC; ++i) u.v[i] = from_acc<T>(in[i]);
    *reinterpret_cast<uint4*>(p) = u.raw;
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) p[i] = from_acc<T>(in[i]);
  }
}

// A 16-byte piece of a row kept in registers raw, in the storage dtype: 16-bit types take
// half the registers of their fp32 values, so twice the row fits per thread.
template <typename T, int VEC> struct alignas(VEC * sizeof(T) >= 16 ? 16 : alignof(T)) Raw { T v[VEC]; };

template <int VEC, typename T>
__device__ __forceinline__ void load_raw(const T* __restrict__ p, Raw<T, VEC>& out) {
  if constexpr (VEC * sizeof(T) == 16) {
    *reinterpret_cast<uint4*>(&out) = __ldg(reinterpret_cast<const uint4*>(p));
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) out.v[i] = p[i];
  }
}

// ITEMS_MAX: the most 16-byte chunks per thread (a power of two) whose raw registers and
// column partials fit `regs` 32-bit registers, at most `cap`.
__host__ __device__ constexpr int items_max(int regs, int words_per_item, int cap) {
  int fit = regs / (words_per_item > 0 ? words_per_item : 1);
  fit = fit < 1 ? 1 : (fit > cap ? cap : fit);
  int p = 1;
  while (p * 2 <= fit) p *= 2;
  return p;
}

// Blocks per SM that __launch_bounds__ asks for: `min_threads` resident threads (a cap of
// 65536 / min_threads registers), halved for a program whose one chunk of row alone exceeds
// the register budget (many inputs, column partials), which would otherwise spill.
__host__ __device__ constexpr int min_blocks(int block, int min_threads, int words_per_item, int regs) {
  const int want = words_per_item > regs ? min_threads / 2 : min_threads;
  return want / block > 0 ? want / block : 1;
}

// exp and tanh take the storage dtype T: stored in float32/float64, the accurate libm forms;
// stored in a 16-bit type (rounding 2^-9 for bf16, 2^-12 for fp16), the hardware ex2.approx
// (about 2 + 1.2|x| ulp of fp32) and tanh from it, far below that rounding. The bf16 GELU and
// softmax kernels were bound by expf/tanhf's instruction count, not by memory.
template <typename T = float> __device__ __forceinline__ float exp_(float x) {
  if constexpr (sizeof(T) == 2) return __expf(x); else return expf(x);
}
template <typename T = double> __device__ __forceinline__ double exp_(double x) { return exp(x); }
__device__ __forceinline__ float log_(float x) { return logf(x); }
__device__ __forceinline__ double log_(double x) { return log(x); }
// 16-bit storage: tanh(x) = 1 - 2 / (1 + e^2x), absolute error ~1e-7 (e^2x = inf gives 1,
// 0 gives -1, NaN stays NaN).
template <typename T = float> __device__ __forceinline__ float tanh_(float x) {
  if constexpr (sizeof(T) == 2) return 1.f - __fdividef(2.f, 1.f + __expf(2.f * x)); else return tanhf(x);
}
template <typename T = double> __device__ __forceinline__ double tanh_(double x) { return tanh(x); }
__device__ __forceinline__ float rsqrt_(float x) { return rsqrtf(x); }
__device__ __forceinline__ double rsqrt_(double x) { return 1.0 / sqrt(x); }
__device__ __forceinline__ float sqrt_(float x) { return sqrtf(x); }
__device__ __forceinline__ double sqrt_(double x) { return sqrt(x); }
__device__ __forceinline__ float erf_(float x) { return erff(x); }
__device__ __forceinline__ double erf_(double x) { return erf(x); }
__device__ __forceinline__ float pow_(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double pow_(double x, double y) { return pow(x, y); }
template <typename A> __device__ __forceinline__ A max_(A a, A b) { return (a > b || a != a) ? a : b; }  // NaN wins
template <typename A> __device__ __forceinline__ A min_(A a, A b) { return (a < b || a != a) ? a : b; }

// A reduction over the TPR threads that share a row. TPR <= 32: shuffles inside a part of a
// warp; TPR > 32 (the whole block): shuffles, then one value per warp through shared memory;
// TPR > BLOCK (a split row, sm_90+): then the cluster's TPR / BLOCK blocks combine their block
// values in rank order through distributed shared memory. Every order is fixed: deterministic.
template <int TPR, int BLOCK = TPR, typename A, typename Op>
__device__ __forceinline__ A group_reduce(A v, Op op, A* smem) {
  if constexpr (TPR <= 32) {
    const unsigned lane = threadIdx.x & 31u;
    const unsigned mask = TPR == 32 ? 0xffffffffu : (((1u << TPR) - 1u) << (lane / TPR * TPR));
#pragma unroll
    for (int o = TPR / 2; o > 0; o /= 2) v = op(v, __shfl_xor_sync(mask, v, o));
    return v;
  } else {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) smem[warp] = v;
    __syncthreads();
    if (warp == 0) {
      v = smem[0];
      for (int w = 1; w < BLOCK / 32; ++w) v = op(v, smem[w]);  // fixed order: deterministic
      smem[32] = v;
    }
    if constexpr (TPR > BLOCK) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
      cluster.sync();  // every block's value is in its smem[32]
      v = *cluster.map_shared_rank(smem + 32, 0);
      for (int r = 1; r < TPR / BLOCK; ++r) v = op(v, *cluster.map_shared_rank(smem + 32, r));
      cluster.sync();  // all have read before any block reuses smem
#else
      __trap();  // the host picks split rows only for code built for sm_90+ (clusters_ok)
#endif
    } else {
      __syncthreads();
      v = smem[32];
      __syncthreads();
    }
    return v;
  }
}

// Two reductions of a row group in one round (one set of barriers where two group_reduce
// calls take two): the same trees and orders as group_reduce, side by side in smem[0..66).
template <int TPR, int BLOCK = TPR, typename A, typename OpA, typename OpB>
__device__ __forceinline__ void group_reduce2(A& a, OpA op_a, A& b, OpB op_b, A* smem) {
  if constexpr (TPR <= 32) {
    const unsigned lane = threadIdx.x & 31u;
    const unsigned mask = TPR == 32 ? 0xffffffffu : (((1u << TPR) - 1u) << (lane / TPR * TPR));
#pragma unroll
    for (int o = TPR / 2; o > 0; o /= 2) {
      a = op_a(a, __shfl_xor_sync(mask, a, o));
      b = op_b(b, __shfl_xor_sync(mask, b, o));
    }
  } else {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
      a = op_a(a, __shfl_xor_sync(0xffffffffu, a, o));
      b = op_b(b, __shfl_xor_sync(0xffffffffu, b, o));
    }
    const int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) { smem[warp] = a; smem[33 + warp] = b; }
    __syncthreads();
    if (warp == 0) {
      a = smem[0];
      b = smem[33];
      for (int w = 1; w < BLOCK / 32; ++w) { a = op_a(a, smem[w]); b = op_b(b, smem[33 + w]); }
      smem[32] = a;
      smem[65] = b;
    }
    if constexpr (TPR > BLOCK) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
      cluster.sync();
      a = *cluster.map_shared_rank(smem + 32, 0);
      b = *cluster.map_shared_rank(smem + 65, 0);
      for (int r = 1; r < TPR / BLOCK; ++r) {
        a = op_a(a, *cluster.map_shared_rank(smem + 32, r));
        b = op_b(b, *cluster.map_shared_rank(smem + 65, r));
      }
      cluster.sync();
#else
      __trap();
#endif
    } else {
      __syncthreads();
      a = smem[32];
      b = smem[65];
      __syncthreads();
    }
  }
}

// Online max and sum of exp(a - max) over a streamed row (one read instead of two), fed one
// 16-byte chunk of VEC elements at a time: the running sum is rescaled once per chunk when
// the chunk's max exceeds the running max, then one exp per element (a per-element rescale
// branch and second exp bound the bf16 pass). NaN propagates as in the two-pass form; while
// the running max is -inf, elements equal to it add nothing. exp_<T>: see above.
template <typename T, int VEC, typename A>
__device__ __forceinline__ void online_add_vec(A& m, A& s, const A (&a)[VEC]) {
  A cm = a[0];
#pragma unroll
  for (int v = 1; v < VEC; ++v) cm = max_(cm, a[v]);
  if (cm > m || cm != cm) {
    s = m == (A)(-INFINITY) ? (A)0 : s * exp_(m - cm);
    m = cm;
  }
  if (m != (A)(-INFINITY)) {
#pragma unroll
    for (int v = 0; v < VEC; ++v) s += exp_<T>(a[v] - m);
  }
}

// p[0..VEC) += x (shared memory), in 16-byte accesses where the chunk is a multiple of 16
// bytes: a thread's VEC columns are contiguous, so lanes stride VEC words apart and scalar
// accesses would conflict VEC ways.
template <int VEC, typename A>
__device__ __forceinline__ void smem_add_vec(A* p, const A (&x)[VEC]) {
  constexpr int PER = 16 / (int)sizeof(A);
  if constexpr ((VEC * sizeof(A)) % 16 == 0) {
#pragma unroll
    for (int q = 0; q < VEC / PER; ++q) {
      uint4 raw = reinterpret_cast<uint4*>(p)[q];
      A* t = reinterpret_cast<A*>(&raw);
#pragma unroll
      for (int e = 0; e < PER; ++e) t[e] += x[q * PER + e];
      reinterpret_cast<uint4*>(p)[q] = raw;
    }
  } else {
#pragma unroll
    for (int v = 0; v < VEC; ++v) p[v] += x[v];
  }
}

struct Sum { template <typename A> __device__ A operator()(A a, A b) const { return a + b; } };
struct Max { template <typename A> __device__ A operator()(A a, A b) const { return max_(a, b); } };
struct Min { template <typename A> __device__ A operator()(A a, A b) const { return min_(a, b); } };

// Merge two (max, sum of exp(x - max)) pairs: the larger max, each sum rescaled to it. A pair
// with sum 0 (no elements, or only -inf) adds 0; NaN propagates through max_ and exp.
template <typename A>
__device__ __forceinline__ void online_merge(A& m, A& s, A m2, A s2) {
  const A mx = max_(m, m2);
  s = (s == (A)0 ? (A)0 : s * exp_(m - mx)) + (s2 == (A)0 ? (A)0 : s2 * exp_(m2 - mx));
  m = mx;
}

// Merge the (max, sum) pairs of a row group in one reduction round (one set of barriers, where
// a max then a rescaled sum took two): shuffles, then per warp through shared memory (66
// values), then, for a split row, per block of the cluster in rank order. Fixed orders:
// deterministic.
template <int TPR, int BLOCK = TPR, typename A>
__device__ __forceinline__ void group_online(A& m, A& s, A* smem) {
  if constexpr (TPR <= 32) {
    const unsigned lane = threadIdx.x & 31u;
    const unsigned mask = TPR == 32 ? 0xffffffffu : (((1u << TPR) - 1u) << (lane / TPR * TPR));
#pragma unroll
    for (int o = TPR / 2; o > 0; o /= 2) online_merge(m, s, __shfl_xor_sync(mask, m, o), __shfl_xor_sync(mask, s, o));
  } else {
#pragma unroll
    for (int o = 16; o > 0; o /= 2)
      online_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    const int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) { smem[warp] = m; smem[33 + warp] = s; }
    __syncthreads();
    if (warp == 0) {
      m = smem[0];
      s = smem[33];
      for (int w = 1; w < BLOCK / 32; ++w) online_merge(m, s, smem[w], smem[33 + w]);
      smem[32] = m;
      smem[65] = s;
    }
    if constexpr (TPR > BLOCK) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
      cluster.sync();
      m = *cluster.map_shared_rank(smem + 32, 0);
      s = *cluster.map_shared_rank(smem + 65, 0);
      for (int r = 1; r < TPR / BLOCK; ++r)
        online_merge(m, s, *cluster.map_shared_rank(smem + 32, r), *cluster.map_shared_rank(smem + 65, r));
      cluster.sync();
#else
      __trap();
#endif
    } else {
      __syncthreads();
      m = smem[32];
      s = smem[65];
      __syncthreads();
    }
  }
}

// Host caches are kept per device (a process may drive several GPUs, of different models) and
// hold only what the device itself answers, so two threads filling one entry at once store the
// same value: no plan or pointer is kept between calls.
constexpr int kMaxDevices = 64;

inline int current_device() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) device = 0;
  return device;
}

// Resident blocks per SM of one kernel instantiation at its block size (its registers and
// shared memory decide), asked once per instantiation and device: the grid is one full wave of
// persistent blocks, so no partial last wave leaves SMs idle.
template <auto Kernel>
inline int blocks_per_sm(int block) {
  static std::atomic<int> cached[kMaxDevices];
  std::atomic<int>& mine = cached[current_device()];
  int n = mine.load(std::memory_order_relaxed);
  if (n == 0) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, Kernel, block, 0) != cudaSuccess || n <= 0) n = 1;
    mine.store(n, std::memory_order_relaxed);
  }
  return n;
}

// One attribute of the current device, asked once per device; `fallback` where it cannot be asked.
template <cudaDeviceAttr Attribute>
inline int device_attribute(int fallback) {
  static std::atomic<int> cached[kMaxDevices];
  const int device = current_device();
  int value = cached[device].load(std::memory_order_relaxed);
  if (value == 0) {
    if (cudaDeviceGetAttribute(&value, Attribute, device) != cudaSuccess || value <= 0) value = fallback;
    cached[device].store(value, std::memory_order_relaxed);
  }
  return value;
}

// The most dynamic shared memory one block may opt in to on the current device (227 KB on the
// H100/H200, 99 KB on compute capability 12.0).
inline size_t smem_optin() { return (size_t)device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(48 * 1024); }

// The most dynamic shared memory Kernel may take on the current device: the device's opt-in
// limit less the kernel's static shared memory (CUDA refuses a maximum whose sum with the static
// bytes passes the limit; 0 where the kernel cannot be asked). Asked once a device: the hosts'
// gates ask it at every call, and cudaFuncGetAttributes is a driver call.
template <auto Kernel>
inline size_t dyn_smem_limit() {
  static std::atomic<size_t> cached[kMaxDevices];  // the limit + 1; 0 not asked yet
  const int device = current_device();
  size_t limit = cached[device].load(std::memory_order_relaxed);
  if (limit == 0) {
    cudaFuncAttributes fa;
    limit = 1 + (cudaFuncGetAttributes(&fa, Kernel) == cudaSuccess && fa.sharedSizeBytes < smem_optin()
                 ? smem_optin() - fa.sharedSizeBytes : 0);
    cached[device].store(limit, std::memory_order_relaxed);
  }
  return limit - 1;
}

// Kernel opted in to all the dynamic shared memory it may take, once a device, whatever this call
// needs: a limit set to one call's own bytes is lowered by another thread's call between this
// call's opt-in and its launch, which then fails. A call past the limit is refused here.
template <auto Kernel>
inline cudaError_t opt_in_smem(size_t smem) {
  static std::atomic<size_t> opted[kMaxDevices];  // the limit this device's kernel is opted in to + 1
  if (smem == 0) return cudaSuccess;
  const int device = current_device();
  size_t done = opted[device].load(std::memory_order_acquire);
  if (done == 0) {
    const size_t most = dyn_smem_limit<Kernel>();
    if (most == 0) return cudaErrorInvalidDeviceFunction;
    const cudaError_t e = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)most);
    if (e != cudaSuccess) return e;  // (two threads setting the same value race harmlessly)
    done = most + 1;
    opted[device].store(done, std::memory_order_release);
  }
  return smem < done ? cudaSuccess : cudaErrorInvalidValue;
}

// Blocks of Kernel an SM holds with `smem` bytes of dynamic shared memory (asked per call: it
// depends on the row width), past 48 KB after opting the kernel in.
template <auto Kernel>
inline int blocks_per_sm_dyn(int block, size_t smem) {
  int n = 0;
  opt_in_smem<Kernel>(smem);
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, Kernel, block, smem) != cudaSuccess || n <= 0) n = 1;
  return n;
}

// Launch Kernel with `smem` bytes of dynamic shared memory, opting it in past 48 KB.
template <auto Kernel, typename... Args>
inline cudaError_t launch_dyn(dim3 grid, int block, size_t smem, cudaStream_t stream, Args... args) {
  const cudaError_t e = opt_in_smem<Kernel>(smem);
  if (e != cudaSuccess) return e;
  Kernel<<<grid, dim3((unsigned)block), smem, stream>>>(args...);
  return cudaSuccess;
}

inline int sm_count() { return device_attribute<cudaDevAttrMultiProcessorCount>(132); }

// Whether a cluster of 8 blocks (the largest the kernels launch) of Kernel at its largest block
// can be placed on the current device: not where MIG or MPS leave a GPC too few SMs, where the
// launch would fail (the host then takes its path without clusters).
template <auto Kernel>
inline bool clusters_placeable(const cudaFuncAttributes& fa) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(8);
  cfg.blockDim = dim3((unsigned)fa.maxThreadsPerBlock);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 8;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, Kernel, &cfg);
  if (e != cudaSuccess) (void)cudaGetLastError();  // a query that failed leaves no error for the next launch
  return e == cudaSuccess && clusters > 0;
}

// Split rows (one row over a cluster of blocks) need a device of compute capability 9.0+, this
// kernel built for it (a package's arch list may hold only older code), and room for a cluster.
template <auto Kernel>
inline bool clusters_ok() {
  static std::atomic<int> cached[kMaxDevices];  // 0 unknown, 1 yes, 2 no
  const int device = current_device();
  int ok = cached[device].load(std::memory_order_relaxed);
  if (ok == 0) {
    int major = 0;
    cudaFuncAttributes fa;
    ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9
         && cudaFuncGetAttributes(&fa, Kernel) == cudaSuccess && fa.binaryVersion >= 90 && fa.ptxVersion >= 90
         && clusters_placeable<Kernel>(fa) ? 1 : 2;
    cached[device].store(ok, std::memory_order_relaxed);
  }
  return ok == 1;
}

// Launch with clusters of `cl` blocks along x (grid.x a multiple of cl) and `smem` bytes of dynamic
// shared memory a block (the kernel opted in before, where past 48 KB: launch_clusters_dyn): split
// rows and looped clusters (cl a constant, launch_cluster below), a few-row loss's one cluster (cl
// known at run time), a staged looped row.
template <typename... KArgs, typename... Args>
inline cudaError_t launch_clusters(void (*kernel)(KArgs...), dim3 grid, int block, int cl, size_t smem,
                                   cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3((unsigned)block);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = (unsigned)cl;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

template <int CL, typename... KArgs, typename... Args>
inline cudaError_t launch_cluster(void (*kernel)(KArgs...), dim3 grid, int block, cudaStream_t stream,
                                  Args... args) {
  return launch_clusters(kernel, grid, block, CL, 0, stream, args...);
}

// Clusters of `cl` blocks with `smem` bytes of dynamic shared memory a block, Kernel opted in first.
template <auto Kernel, typename... Args>
inline cudaError_t launch_clusters_dyn(dim3 grid, int block, int cl, size_t smem, cudaStream_t stream,
                                       Args... args) {
  const cudaError_t e = opt_in_smem<Kernel>(smem);
  if (e != cudaSuccess) return e;
  return launch_clusters(Kernel, grid, block, cl, smem, stream, args...);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace sg
// ---- end of helpers ----
"""


# Only in kernels with a moments pair (LayerNorm's mean and variance): the other kernels' text,
# committed and verified, stays byte for byte what it was.
PRELUDE_MOMENTS = r"""namespace sg {
// Merge two partial moments of a row: (count, sum, sum of squared deviations from their own
// mean), Chan et al.'s pairwise combination; an empty part (count 0) adds nothing.
template <typename A>
__device__ __forceinline__ void moments_merge(A& n, A& s, A& m2, A n2, A s2, A m22) {
  if (n2 == (A)0) return;
  if (n == (A)0) { n = n2; s = s2; m2 = m22; return; }
  const A total = n + n2;
  const A delta = s2 / n2 - s / n;
  m2 = m2 + m22 + delta * delta * (n * n2 / total);
  s = s + s2;
  n = total;
}

// Merge the moments of a row group in one reduction round (shuffles, per warp through 99
// values of shared memory, per block of a cluster in rank order): fixed orders, deterministic.
template <int TPR, int BLOCK = TPR, typename A>
__device__ __forceinline__ void group_moments(A& n, A& s, A& m2, A* smem) {
  if constexpr (TPR <= 32) {
    const unsigned lane = threadIdx.x & 31u;
    const unsigned mask = TPR == 32 ? 0xffffffffu : (((1u << TPR) - 1u) << (lane / TPR * TPR));
#pragma unroll
    for (int o = TPR / 2; o > 0; o /= 2)
      moments_merge(n, s, m2, __shfl_xor_sync(mask, n, o), __shfl_xor_sync(mask, s, o), __shfl_xor_sync(mask, m2, o));
  } else {
#pragma unroll
    for (int o = 16; o > 0; o /= 2)
      moments_merge(n, s, m2, __shfl_xor_sync(0xffffffffu, n, o), __shfl_xor_sync(0xffffffffu, s, o),
                    __shfl_xor_sync(0xffffffffu, m2, o));
    const int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) { smem[warp] = n; smem[33 + warp] = s; smem[66 + warp] = m2; }
    __syncthreads();
    if (warp == 0) {
      n = smem[0];
      s = smem[33];
      m2 = smem[66];
      for (int w = 1; w < BLOCK / 32; ++w) moments_merge(n, s, m2, smem[w], smem[33 + w], smem[66 + w]);
      smem[32] = n;
      smem[65] = s;
      smem[98] = m2;
    }
    if constexpr (TPR > BLOCK) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
      cluster.sync();
      n = *cluster.map_shared_rank(smem + 32, 0);
      s = *cluster.map_shared_rank(smem + 65, 0);
      m2 = *cluster.map_shared_rank(smem + 98, 0);
      for (int r = 1; r < TPR / BLOCK; ++r)
        moments_merge(n, s, m2, *cluster.map_shared_rank(smem + 32, r), *cluster.map_shared_rank(smem + 65, r),
                      *cluster.map_shared_rank(smem + 98, r));
      cluster.sync();
#else
      __trap();
#endif
    } else {
      __syncthreads();
      n = smem[32];
      s = smem[65];
      m2 = smem[98];
      __syncthreads();
    }
  }
}
}  // namespace sg
"""


# Only in kernels that call expm1 or log1p (ELU, SELU, softplus, Mish): the other kernels' text,
# committed and verified, stays byte for byte what it was.
PRELUDE_EXPM1_LOG1P = r"""namespace sg {
// 16-bit storage: expm1 and log1p from the hardware exp/log where they are accurate (|x| >= 2^-5:
// relative error under 1e-5) and a short Taylor series below (truncation under 1e-8), where
// e^x - 1 and log(1 + x) would cancel. ELU and SELU in bf16 were bound by expm1f's instruction
// count (77% of the neg() bandwidth on the H200, session 9).
template <typename T = float> __device__ __forceinline__ float expm1_(float x) {
  if constexpr (sizeof(T) == 2)
    return fabsf(x) < 0x1p-5f ? x * (1.f + x * (0.5f + x * (1.f / 6.f + x * (1.f / 24.f)))) : __expf(x) - 1.f;
  else return expm1f(x);
}
template <typename T = double> __device__ __forceinline__ double expm1_(double x) { return expm1(x); }
template <typename T = float> __device__ __forceinline__ float log1p_(float x) {
  if constexpr (sizeof(T) == 2)
    return fabsf(x) < 0x1p-5f ? x * (1.f - x * (0.5f - x * (1.f / 3.f - x * 0.25f))) : __logf(1.f + x);
  else return log1pf(x);
}
template <typename T = double> __device__ __forceinline__ double log1p_(double x) { return log1p(x); }
}  // namespace sg"""


# Only in kernels that divide by a per-row value (emit.div_per_row): the other kernels' text stays
# byte for byte what it was.
PRELUDE_MUL_RN = r"""namespace sg {
// x * (1/d) rounded on its own, as torch's division is: nvcc contracts a plain product with an
// add that follows into one FMA, and fma(-1.5, 1/3, 0.5) = -1.5e-8 where -1.5 / 3 + 0.5 = 0
// (times inf: inf where torch has NaN; hardswish_backward in bf16, session 34).
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
}  // namespace sg"""


# Only in kernels whose few rows finalize a loss in their own cluster (Variant.few_fin): the other
# kernels' text, committed and verified, stays byte for byte what it was.
PRELUDE_CLUSTER_N = r"""namespace sg {
// Launch with the whole grid (grid.x = cl <= 8 blocks, grid.y = 1) as one cluster, its size known
// only at run time: its blocks meet at cluster.sync() and read each other's shared memory.
template <typename... KArgs, typename... Args>
inline cudaError_t launch_cluster_n(void (*kernel)(KArgs...), dim3 grid, int block, int cl, cudaStream_t stream,
                                    Args... args) {
  return launch_clusters(kernel, grid, block, cl, 0, stream, args...);
}
}  // namespace sg"""


# Only in kernels of the `red_form` "tree" variant: the other kernels' text, committed and verified,
# stays byte for byte what it was.
PRELUDE_TREE = r"""namespace sg {
// A row group of one block (32 < TPR <= BLOCK): after the warps' shuffles and one barrier, every
// warp combines the BLOCK / 32 warp values itself, in a shuffle tree (one load per lane, not one
// warp's serial loop), and the result needs no broadcast through shared memory: two barriers where
// group_reduce takes three. The tree's order is fixed: deterministic, the same in every warp.
// Other TPR: group_reduce's own form.
template <int TPR, int BLOCK = TPR, typename A, typename Op>
__device__ __forceinline__ A group_reduce_tree(A v, Op op, A* smem) {
  if constexpr (TPR <= 32 || TPR > BLOCK) {
    return group_reduce<TPR, BLOCK>(v, op, smem);
  } else {
    constexpr int W = BLOCK / 32;  // a power of two, >= 2
    const int lane = (int)(threadIdx.x & 31);
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) smem[threadIdx.x >> 5] = v;
    __syncthreads();
    v = smem[lane & (W - 1)];
#pragma unroll
    for (int o = W / 2; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    v = __shfl_sync(0xffffffffu, v, 0);
    __syncthreads();  // every warp has read: smem is free
    return v;
  }
}

// A pair of values per thread (a, b), merged by merge(a, b, a2, b2) at every level of
// group_reduce_tree's form (smem[0..66)); a row group of one block, 32 < TPR <= BLOCK.
template <int TPR, int BLOCK, typename A, typename Merge>
__device__ __forceinline__ void group_pair_tree(A& a, A& b, Merge merge, A* smem) {
  constexpr int W = BLOCK / 32;
  const int lane = (int)(threadIdx.x & 31);
#pragma unroll
  for (int o = 16; o > 0; o /= 2) merge(a, b, __shfl_xor_sync(0xffffffffu, a, o), __shfl_xor_sync(0xffffffffu, b, o));
  if (lane == 0) { smem[threadIdx.x >> 5] = a; smem[33 + (threadIdx.x >> 5)] = b; }
  __syncthreads();
  a = smem[lane & (W - 1)];
  b = smem[33 + (lane & (W - 1))];
#pragma unroll
  for (int o = W / 2; o > 0; o /= 2) merge(a, b, __shfl_xor_sync(0xffffffffu, a, o), __shfl_xor_sync(0xffffffffu, b, o));
  a = __shfl_sync(0xffffffffu, a, 0);
  b = __shfl_sync(0xffffffffu, b, 0);
  __syncthreads();
}

// Two reductions of a row group in one round, as group_reduce_tree.
template <int TPR, int BLOCK = TPR, typename A, typename OpA, typename OpB>
__device__ __forceinline__ void group_reduce2_tree(A& a, OpA op_a, A& b, OpB op_b, A* smem) {
  if constexpr (TPR <= 32 || TPR > BLOCK) {
    group_reduce2<TPR, BLOCK>(a, op_a, b, op_b, smem);
  } else {
    group_pair_tree<TPR, BLOCK>(a, b, [&](A& x, A& y, A x2, A y2) { x = op_a(x, x2); y = op_b(y, y2); }, smem);
  }
}

// The (max, sum of exp) pair of a row group, as group_reduce_tree (online_merge at each level).
template <int TPR, int BLOCK = TPR, typename A>
__device__ __forceinline__ void group_online_tree(A& m, A& s, A* smem) {
  if constexpr (TPR <= 32 || TPR > BLOCK) {
    group_online<TPR, BLOCK>(m, s, smem);
  } else {
    group_pair_tree<TPR, BLOCK>(m, s, [](A& x, A& y, A x2, A y2) { online_merge(x, y, x2, y2); }, smem);
  }
}
}  // namespace sg"""


def with_optional_preludes(parts: list[str]) -> list[str]:
    """`parts` of a kernel's text with the optional prelude parts it calls placed after PRELUDE."""
    text = "\n".join(parts)
    extra = [PRELUDE_EXPM1_LOG1P] if "sg::expm1_<" in text or "sg::log1p_<" in text else []
    extra += [PRELUDE_MUL_RN] if "sg::mul_rn(" in text else []
    extra += [PRELUDE_CLUSTER_N] if "sg::launch_cluster_n(" in text else []
    extra += [PRELUDE_TREE] if "_tree<TPR, BLOCK>(" in text else []
    at = parts.index(PRELUDE) + 1
    return parts[:at] + extra + parts[at:]
