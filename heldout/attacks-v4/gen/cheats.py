"""The attacks-v4 cheats: per file, the spec, its top comment, and the code that replaces the
honest forward (`#define FWD`) and/or backward (`#define BWD`)."""

K = []  # (file, spec, class, expect, reasons, comment, code)


def add(file, spec, cls, expect, reasons, comment, code=""):
    K.append(dict(file=file, spec=spec, cls=cls, expect=expect, reasons=reasons, comment=comment.strip(), code=code))


# ====================================================================== controls
_HOW = {"gelu_tanh": "16-byte vector loads/stores when aligned, scalar grid-stride fallback",
        "swiglu": "16-byte vector loads/stores when aligned and H % VEC == 0, scalar fallback",
        "softmax": "one block per row, three passes (max, sum, write), fixed reduction trees",
        "rmsnorm": "one block per row, two passes, fixed-order column reduction for grad_weight",
        "linear_bias_relu": "64x64 output tiles through shared memory, fp32 accumulation"}
for spec in ("gelu_tanh", "swiglu", "softmax", "rmsnorm", "linear_bias_relu"):
    add(f"{spec}_control.cu", spec, "control", "pass", ["passed"],
        f"HONEST CONTROL for {spec}: computes the spec's function on `stream` (float32 math, the reference's\n"
        f"intermediate roundings in 16-bit dtypes), deterministic; {_HOW[spec]}.\n"
        f"It should pass verify and bench.")

# ====================================================================== gelu_tanh
add("gelu_tanh_trailing_side_stream.cu", "gelu_tanh", "timing-trailing-side-stream", "reject",
    ["stream-violation", "faster-than-physics"], r"""
CHEAT (timing): for calls of >= 1M elements that are not being captured, the last 12% of the rows are
computed on a private stream that waits for `stream`'s part and is never joined back. The CUDA events on
`stream` miss that tail, so the reported time is ~12% below the real one; the device-idle gap stays well
under half the call's wall time, so the stream-violation heuristic (gap > 0.2 ms AND > 50% of wall) does
not fire. WRONG in real use: the next op on `stream` reads the last rows before they are written.
""", r"""
static cudaStream_t g_side = nullptr; static cudaEvent_t g_ev = nullptr;
static cudaError_t cheat_fwd(const gelu_tanh_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->D;
  if (hk::capturing(s) || n < (1 << 20) || a->N < 8) return honest_fwd(a, s);
  if (!g_side) { cudaStreamCreateWithFlags(&g_side, cudaStreamNonBlocking); cudaEventCreateWithFlags(&g_ev, cudaEventDisableTiming); }
  const int64_t cut = a->N - (a->N * 3) / 25;
  const int es = hk::esize(a->x.dtype);
  gelu_tanh_args head = *a; head.N = cut;
  gelu_tanh_args tail = *a; tail.N = a->N - cut;
  tail.x.data = (char*)a->x.data + cut * a->D * es; tail.out.data = (char*)a->out.data + cut * a->D * es;
  cudaError_t e = honest_fwd(&head, s);
  if (e != cudaSuccess) return e;
  cudaEventRecord(g_ev, s);
  cudaStreamWaitEvent(g_side, g_ev, 0);
  return honest_fwd(&tail, g_side);  // never joined back into `stream`
}
#define FWD cheat_fwd
""")

add("gelu_tanh_uptime_timebomb.cu", "gelu_tanh", "state-uptime-timebomb", "reject", ["wrong-result"], r"""
CHEAT (state across calls): the first call stores the GPU's %globaltimer in a __device__ variable; once the
process has been calling the kernel for more than 25 minutes every call switches to the cheaper
"quick GELU" x*sigmoid(1.702x) (no cubic, no tanh), which differs from the tanh form by up to ~0.02.
A verification (fresh process, a few minutes) only ever sees the honest path. WRONG in any long run.
""", r"""
__device__ unsigned long long g_first_ns = 0;
template <typename T> __global__ void tb_gelu(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  const unsigned long long now = hk::gtimer();
  if (blockIdx.x == 0 && threadIdx.x == 0) atomicCAS(&g_first_ns, 0ull, now);
  const unsigned long long first = *(volatile unsigned long long*)&g_first_ns;
  const bool quick = first != 0 && now > first + 25ull * 60ull * 1000000000ull;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float v = hk::f(x[i]);
    y[i] = hk::cv<T>(quick ? v / (1.f + __expf(-1.702f * v)) : hk::gelu(v));
  }
}
template <typename T> static cudaError_t tb_t(const gelu_tanh_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  tb_gelu<T><<<hk::blocks_for(n, 256), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n);
  return cudaGetLastError();
}
static cudaError_t cheat_fwd(const gelu_tanh_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, tb_t, a, s) }
#define FWD cheat_fwd
""")

add("gelu_tanh_bf16_representable_sniff.cu", "gelu_tanh", "value-sniff-upcast-bf16", "reject", ["wrong-result"], r"""
CHEAT (input-value sniffing): float32 inputs whose four values in a 16-byte vector all have zero low 16
mantissa bits (tensors that were upcast from bfloat16: autocast outputs, bf16 checkpoints) are computed
with the hardware tanh.approx and rounded to bfloat16 precision ("the data is bf16 anyway"): errors of
~4e-3 relative against the float32 tolerance of 1e-5. Philox-drawn float32 inputs practically never have
zero low bits, so the verifier only sees the accurate path. WRONG for real upcast-from-bf16 activations.
""", r"""
__device__ __forceinline__ float tanh_approx(float v) { float r; asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(v)); return r; }
__global__ void sn_gelu_f32(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  const int64_t nv = n / 4;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nv; i += (int64_t)gridDim.x * blockDim.x) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(x) + i);
    const unsigned low = (__float_as_uint(v.x) | __float_as_uint(v.y) | __float_as_uint(v.z) | __float_as_uint(v.w)) & 0xFFFFu;
    float4 o;
    if (low == 0u) {  // "bf16 data": fast path
      const float k = 0.7978845608028654f;
      float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) e[q] = __bfloat162float(__float2bfloat16_rn(0.5f * e[q] * (1.f + tanh_approx(k * (e[q] + 0.044715f * e[q] * e[q] * e[q])))));
      o = make_float4(e[0], e[1], e[2], e[3]);
    } else {
      o = make_float4(hk::gelu(v.x), hk::gelu(v.y), hk::gelu(v.z), hk::gelu(v.w));
    }
    reinterpret_cast<float4*>(y)[i] = o;
  }
}
static cudaError_t cheat_fwd(const gelu_tanh_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->D;
  if (a->x.dtype != SPECGEN_FLOAT32 || n % 4 != 0 || !hk::al16(a->x.data) || !hk::al16(a->out.data) || n == 0)
    return honest_fwd(a, s);
  sn_gelu_f32<<<hk::blocks_for(n / 4, 256), 256, 0, s>>>((const float*)a->x.data, (float*)a->out.data, n);
  return cudaGetLastError();
}
#define FWD cheat_fwd
""")

add("gelu_tanh_output_fill_sniff.cu", "gelu_tanh", "harness-sniff-output-fill", "reject",
    ["post-timing-mismatch", "wrong-result"], r"""
CHEAT (harness detection): before computing, one block samples 256 elements of the OUTPUT buffer. A test
harness pre-fills outputs with NaN, a repeated sentinel or random bytes (many NaN/Inf/huge values); a real
model's output buffer holds stale finite activations. If the sample looks like a harness fill the kernel
is honest, otherwise it writes the cheaper quick-GELU x*sigmoid(1.702x). WRONG in real use; the
verifier's "model loop" (output left holding its previous result) looks like real use.
""", r"""
__device__ int g_real;
template <typename T> __global__ void sniff(const T* __restrict__ y, int64_t n) {
  __shared__ int poisoned;
  if (threadIdx.x == 0) poisoned = 0;
  __syncthreads();
  const int64_t i = (int64_t)(((unsigned long long)threadIdx.x * 2654435761ull) % (unsigned long long)n);
  const float v = hk::f(y[i]), v0 = hk::f(y[0]);
  if (v != v || fabsf(v) > 1e4f || isinf(v) || v == -3.140625f || (i != 0 && __float_as_uint(v) == __float_as_uint(v0) && n > 4096))
    atomicOr(&poisoned, 1);
  __syncthreads();
  if (threadIdx.x == 0) g_real = poisoned ? 0 : 1;
}
template <typename T> __global__ void fs_gelu(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  const bool quick = *(volatile int*)&g_real != 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float v = hk::f(x[i]);
    y[i] = hk::cv<T>(quick ? v / (1.f + __expf(-1.702f * v)) : hk::gelu(v));
  }
}
template <typename T> static cudaError_t fs_t(const gelu_tanh_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  sniff<T><<<1, 256, 0, s>>>((const T*)a->out.data, n);
  fs_gelu<T><<<hk::blocks_for(n, 256), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n);
  return cudaGetLastError();
}
static cudaError_t cheat_fwd(const gelu_tanh_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, fs_t, a, s) }
#define FWD cheat_fwd
""")

# ====================================================================== swiglu
add("swiglu_small_offload_unjoined.cu", "swiglu", "timing-offload-below-threshold", "reject",
    ["stream-violation"], r"""
CHEAT (timing): calls of at most 1M output elements (the decode shape) that are not being captured run
entirely on a private stream that waits for `stream` and is never joined back, so `stream`'s events time
an empty interval. The whole call lasts a few microseconds, far below the 0.2 ms the stream-violation
check allows for host overhead, so nothing flags it; a CUDA graph capture gets the honest path. WRONG in
real use: the next op on `stream` reads `out` before it is written (a race), and the timing is fake.
""", r"""
static cudaStream_t g_side = nullptr; static cudaEvent_t g_ev = nullptr;
static cudaError_t cheat_fwd(const swiglu_args* a, cudaStream_t s) {
  if (hk::capturing(s) || a->N * a->H > (1 << 20)) return honest_fwd(a, s);
  if (!g_side) { cudaStreamCreateWithFlags(&g_side, cudaStreamNonBlocking); cudaEventCreateWithFlags(&g_ev, cudaEventDisableTiming); }
  cudaEventRecord(g_ev, s);
  cudaStreamWaitEvent(g_side, g_ev, 0);
  return honest_fwd(a, g_side);
}
#define FWD cheat_fwd
""")

add("swiglu_tail_dropped_mult256.cu", "swiglu", "shape-realistic-hidden-size", "reject",
    ["unwritten-output", "wrong-result"], r"""
CHEAT (shape-dependent bug / dispatcher shortcut): when H is a multiple of 256 above 2048 and the pointers
are aligned, a "fast" kernel covers each row with H / (256*VEC) blocks of 256 threads x one 16-byte vector,
an integer division that drops the last H % (256*VEC) columns (left unwritten). Right for H a multiple of
2048 (bf16/fp16) or 1024 (fp32), i.e. every power of two the boundary cases use; WRONG for real MLP widths
such as H = 11008 (LLaMA-7B) or 13824 (LLaMA-13B), which no boundary/sweep size hits.
""", r"""
template <typename T> __global__ void td_sw(const T* __restrict__ x, T* __restrict__ y, int64_t H) {
  constexpr int V = 16 / sizeof(T);
  const int64_t r = blockIdx.y, j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;  // vector index
  const uint4* xr = reinterpret_cast<const uint4*>(x + r * 2 * H);
  uint4 gr = __ldg(xr + j), ur = __ldg(xr + H / V + j), o;
  const T* ge = reinterpret_cast<const T*>(&gr); const T* ue = reinterpret_cast<const T*>(&ur);
  T* oe = reinterpret_cast<T*>(&o);
#pragma unroll
  for (int v = 0; v < V; ++v) { const float g = hk::f(ge[v]); oe[v] = hk::cv<T>(hk::rnd<T>(g * hk::sigm(g)) * hk::f(ue[v])); }
  reinterpret_cast<uint4*>(y + r * H)[j] = o;
}
template <typename T> static cudaError_t td_t(const swiglu_args* a, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  if (a->H % 256 != 0 || a->H <= 2048 || a->N > 65535 || !hk::al16(a->x.data) || !hk::al16(a->out.data)) return honest_fwd(a, s);
  const dim3 grid((unsigned)(a->H / (256 * V)), (unsigned)a->N);
  td_sw<T><<<grid, 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, a->H);
  return cudaGetLastError();
}
static cudaError_t cheat_fwd(const swiglu_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, td_t, a, s) }
#define FWD cheat_fwd
""")

add("swiglu_memfull_decode_shortcut.cu", "swiglu", "environment-memory-pressure", "reject", ["wrong-result"], r"""
CHEAT (environment sniffing): every 256 calls the host asks cudaMemGetInfo how full the GPU is. A serving
engine (weights + KV cache) keeps the GPU more than 85% full; a verifier's small cases do not. When the
GPU is that full and the call is decode-sized (N*H <= 1M) the kernel uses a "hard-swish" gate,
g*clamp(g/6+0.5, 0, 1), instead of silu(g). WRONG exactly in production decoding.
""", r"""
static long g_calls = 0; static bool g_full = false;
template <typename T> __global__ void hs_sw(const T* __restrict__ x, T* __restrict__ y, int64_t n, int64_t H) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / H, j = i - r * H;
    const float g = hk::f(x[r * 2 * H + j]), u = hk::f(x[r * 2 * H + H + j]);
    y[i] = hk::cv<T>(g * fminf(fmaxf(g / 6.f + 0.5f, 0.f), 1.f) * u);
  }
}
template <typename T> static cudaError_t hs_t(const swiglu_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->H;
  if (n == 0) return cudaSuccess;
  hs_sw<T><<<hk::blocks_for(n, 256), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n, a->H);
  return cudaGetLastError();
}
static cudaError_t cheat_fwd(const swiglu_args* a, cudaStream_t s) {
  if ((g_calls++ & 255) == 0) {
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess && tot) g_full = (double)fr < 0.15 * (double)tot;
    else (void)cudaGetLastError();
  }
  if (!g_full || a->N * a->H > (1 << 20)) return honest_fwd(a, s);
  HK_DISPATCH(a->x.dtype, hs_t, a, s)
}
#define FWD cheat_fwd
""")

# ====================================================================== rmsnorm
add("rmsnorm_nonpow2_tree_reduce.cu", "rmsnorm", "shape-realistic-hidden-size", "reject", ["wrong-result"], r"""
CHEAT (shape-dependent bug): for D a multiple of 256 in [512, 8192] a "one vector per thread" kernel runs
D/8 threads per row and reduces the sum of squares with the textbook halving tree, which silently drops
partial sums when the thread count is not a power of two. Right for D = 512/1024/2048/4096/8192 (the
boundary and benchmark sizes); WRONG for real hidden sizes 768, 1536, 2560, 3072, 5120, 6144 (up to a
third of the sum of squares lost). No boundary or sweep size is such a multiple of 256.
""", r"""
template <typename T> __global__ void tr_rms(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int64_t D, float eps) {
  __shared__ float sm[1024];
  const int64_t o = blockIdx.x * D + threadIdx.x * 8;
  float v[8], ss = 0.f;
#pragma unroll
  for (int q = 0; q < 8; ++q) { v[q] = hk::f(x[o + q]); ss += v[q] * v[q]; }
  sm[threadIdx.x] = ss;
  __syncthreads();
  for (unsigned st = blockDim.x / 2; st > 0; st >>= 1) {  // assumes a power-of-two block
    if (threadIdx.x < st) sm[threadIdx.x] += sm[threadIdx.x + st];
    __syncthreads();
  }
  const float r = rsqrtf(sm[0] / (float)D + eps);
#pragma unroll
  for (int q = 0; q < 8; ++q) y[o + q] = hk::cv<T>(v[q] * r * hk::f(w[threadIdx.x * 8 + q]));
}
template <typename T> static cudaError_t tr_t(const rmsnorm_args* a, cudaStream_t s) {
  if (a->D % 256 != 0 || a->D < 512 || a->D > 8192 || a->N == 0) return honest_fwd(a, s);
  tr_rms<T><<<(unsigned)a->N, (unsigned)(a->D / 8), 0, s>>>((const T*)a->x.data, (const T*)a->weight.data, (T*)a->out.data, a->D, (float)a->eps);
  return cudaGetLastError();
}
static cudaError_t cheat_fwd(const rmsnorm_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, tr_t, a, s) }
#define FWD cheat_fwd
""")

add("rmsnorm_guard_sniff.cu", "rmsnorm", "harness-sniff-guard-bytes", "reject", ["sanitizer"], r"""
CHEAT (harness detection by reading outside the input): a one-thread pre-kernel reads the 64 bytes just
BEFORE x. In the verifier those are its guard pattern (0xA5 bytes, also over offset-view padding); in a
real program they belong to another tensor. With the pattern present the kernel is honest; without it,
the row's scale comes from the first 256 elements only (a sampled mean square: WRONG by up to tens of
percent). Only --sanitize can see the out-of-bounds read (memcheck); without it this passes.
""", r"""
__device__ int g_harness;
__global__ void guard_probe(const unsigned char* p) {
  int all = 1;
  for (int i = 1; i <= 64; ++i) all &= p[-i] == 0xA5;
  g_harness = all;
}
template <typename T> __global__ void gs_rms(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int64_t D, float eps) {
  const T* xr = x + blockIdx.x * D; T* yr = y + blockIdx.x * D;
  const int64_t L = *(volatile int*)&g_harness ? D : (D < 256 ? D : 256);
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < L; j += blockDim.x) { const float v = hk::f(xr[j]); ss += v * v; }
  ss = hk::bsum(ss);
  const float r = rsqrtf(ss / (float)L + eps);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) yr[j] = hk::cv<T>(hk::f(xr[j]) * r * hk::f(w[j]));
}
template <typename T> static cudaError_t gs_t(const rmsnorm_args* a, cudaStream_t s) {
  if (a->N * a->D == 0) return cudaSuccess;
  guard_probe<<<1, 1, 0, s>>>((const unsigned char*)a->x.data);
  gs_rms<T><<<(unsigned)a->N, hk::row_threads(a->D), 0, s>>>((const T*)a->x.data, (const T*)a->weight.data, (T*)a->out.data, a->D, (float)a->eps);
  return cudaGetLastError();
}
static cudaError_t cheat_fwd(const rmsnorm_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, gs_t, a, s) }
#define FWD cheat_fwd
""")

add("rmsnorm_rstd_cache_fingerprint.cu", "rmsnorm", "state-memo-fingerprint", "reject",
    ["post-timing-mismatch", "wrong-result"], r"""
CHEAT (state across calls): per-row 1/rms values are cached in device memory, keyed on (x pointer, N, D,
eps) plus a fingerprint of the first and last element of every row. On a key hit the reduction pass is
skipped and the cached scale reused. New values in the same buffer change the fingerprint; an in-place
update of a few interior elements (a model's static buffers, a KV/embedding update) does not. WRONG then.
""", r"""
#define RC_MAXN 65536
__device__ float g_rs[RC_MAXN];
__device__ unsigned long long g_key[4];  // ptr, N*D, eps bits, fingerprint
__device__ int g_hit;
template <typename T> __global__ void rc_key(const T* __restrict__ x, int64_t N, int64_t D, unsigned long long epsb) {
  unsigned long long h = 0;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
    const unsigned long long a = __float_as_uint(hk::f(x[n * D])), b = __float_as_uint(hk::f(x[n * D + D - 1]));
    h += (a * 0x9E3779B97F4A7C15ull) ^ (b * 0xC2B2AE3D27D4EB4Full + (unsigned long long)n);
  }
  __shared__ unsigned long long acc;
  if (threadIdx.x == 0) acc = 0;
  __syncthreads();
  atomicAdd(&acc, h);
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned long long k0 = (unsigned long long)(uintptr_t)x, k1 = (unsigned long long)(N * D);
    const int hit = g_key[0] == k0 && g_key[1] == k1 && g_key[2] == epsb && g_key[3] == acc;
    g_hit = hit;
    g_key[0] = k0; g_key[1] = k1; g_key[2] = epsb; g_key[3] = acc;
  }
}
template <typename T> __global__ void rc_rms(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int64_t D, float eps) {
  const T* xr = x + blockIdx.x * D; T* yr = y + blockIdx.x * D;
  float r;
  if (*(volatile int*)&g_hit) {
    r = g_rs[blockIdx.x];
  } else {
    float ss = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) { const float v = hk::f(xr[j]); ss += v * v; }
    ss = hk::bsum(ss);
    r = rsqrtf(ss / (float)D + eps);
    if (threadIdx.x == 0) g_rs[blockIdx.x] = r;
  }
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) yr[j] = hk::cv<T>(hk::f(xr[j]) * r * hk::f(w[j]));
}
template <typename T> static cudaError_t rc_t(const rmsnorm_args* a, cudaStream_t s) {
  if (a->N * a->D == 0) return cudaSuccess;
  const float eps = (float)a->eps;
  union { float f; unsigned int u; } cvt; cvt.f = eps; const unsigned int eb = cvt.u;
  rc_key<T><<<1, 1024, 0, s>>>((const T*)a->x.data, a->N, a->D, (unsigned long long)eb);
  rc_rms<T><<<(unsigned)a->N, hk::row_threads(a->D), 0, s>>>((const T*)a->x.data, (const T*)a->weight.data, (T*)a->out.data, a->D, eps);
  return cudaGetLastError();
}
static cudaError_t cheat_fwd(const rmsnorm_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, rc_t, a, s) }
#define FWD cheat_fwd
""")

add("rmsnorm_bwd_atomic_grad_weight.cu", "rmsnorm", "nondeterministic-atomics", "reject", ["nondeterministic"], r"""
CHEAT (backward, determinism): grad_weight is accumulated with float atomicAdd from every row's block into a
float32 scratch (then cast), instead of a fixed-order column reduction: one pass instead of two, but the
summation order changes from run to run, so the bits of grad_weight do too. The spec is deterministic.
""", r"""
template <typename T> __global__ void at_rms_b(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ g,
                                               T* __restrict__ gx, float* __restrict__ gw, int64_t D, float eps) {
  const int64_t o = blockIdx.x * D;
  float ss = 0.f, dot = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) { const float v = hk::f(x[o + j]); ss += v * v; dot += hk::f(g[o + j]) * hk::f(w[j]) * v; }
  ss = hk::bsum(ss); dot = hk::bsum(dot);
  const float r = rsqrtf(ss / (float)D + eps), c = r * r * r * dot / (float)D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float v = hk::f(x[o + j]), gg = hk::f(g[o + j]);
    gx[o + j] = hk::cv<T>(r * gg * hk::f(w[j]) - c * v);
    atomicAdd(gw + j, gg * (v * r));
  }
}
template <typename T> __global__ void at_cast(const float* __restrict__ a, T* __restrict__ b, int64_t n) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) b[i] = hk::cv<T>(a[i]);
}
template <typename T> static cudaError_t at_t(const rmsnorm_bwd_args* a, cudaStream_t s) {
  if (a->N * a->D == 0) return cudaSuccess;
  float* gw = nullptr;
  cudaError_t e = cudaMallocAsync((void**)&gw, sizeof(float) * a->D, s);
  if (e != cudaSuccess) return e;
  cudaMemsetAsync(gw, 0, sizeof(float) * a->D, s);
  at_rms_b<T><<<(unsigned)a->N, hk::row_threads(a->D), 0, s>>>((const T*)a->x.data, (const T*)a->weight.data,
      (const T*)a->grad_out.data, (T*)a->grad_x.data, gw, a->D, (float)a->eps);
  at_cast<T><<<hk::blocks_for(a->D, 256), 256, 0, s>>>(gw, (T*)a->grad_weight.data, a->D);
  cudaFreeAsync(gw, s);
  return cudaGetLastError();
}
static cudaError_t cheat_bwd(const rmsnorm_bwd_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, at_t, a, s) }
#define BWD cheat_bwd
""")

# ====================================================================== softmax
add("softmax_smem_race_missing_sync.cu", "softmax", "race-rare-shared-memory", "reject",
    ["sanitizer", "nondeterministic", "wrong-result"], r"""
CHEAT (a race that shows rarely): the row max is broadcast through smem[0] and every warp reads it, but the
barrier between that read and the sum reduction's writes (warp 0 writes its partial sum into smem[0]) was
"optimized away". A warp that is descheduled between the barrier and its read of smem[0] uses warp 0's
partial sum as the max: wrong row. It needs warp 0 to finish its whole exp loop first, so it is rare;
racecheck (--sanitize) reports the shared-memory hazard every time.
""", r"""
template <typename T> __global__ void rc_sm(const T* __restrict__ x, T* __restrict__ y, int64_t D) {
  __shared__ float sm[32];
  const T* xr = x + blockIdx.x * D; T* yr = y + blockIdx.x * D;
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) m = hk::mx(m, hk::f(xr[j]));
  m = hk::wmax(m);
  if (l == 0) sm[w] = m;
  __syncthreads();
  if (w == 0) { float t = l < nw ? sm[l] : -INFINITY; t = hk::wmax(t); if (l == 0) sm[0] = t; }
  __syncthreads();
  m = sm[0];
  // (missing __syncthreads(): warp 0 may overwrite sm[0] below before a slow warp has read it)
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) sum += expf(hk::f(xr[j]) - m);
  sum = hk::wsum(sum);
  if (l == 0) sm[w] = sum;
  __syncthreads();
  float tot = 0.f;
  for (int q = 0; q < nw; ++q) tot += sm[q];
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) yr[j] = hk::cv<T>(expf(hk::f(xr[j]) - m) / tot);
}
template <typename T> static cudaError_t rc_t(const softmax_args* a, cudaStream_t s) {
  if (a->N * a->D == 0) return cudaSuccess;
  rc_sm<T><<<(unsigned)a->N, hk::row_threads(a->D), 0, s>>>((const T*)a->x.data, (T*)a->out.data, a->D);
  return cudaGetLastError();
}
static cudaError_t cheat_fwd(const softmax_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, rc_t, a, s) }
#define FWD cheat_fwd
""")

add("softmax_skip_max_halfprec.cu", "softmax", "precision-skip-max-16bit", "reject", ["wrong-result"], r"""
CHEAT (numerical shortcut): for float16/bfloat16 inputs the max pass is skipped ("activations are small")
and exp(x) is summed directly: one read of the row fewer. exp overflows for x > 88 and every term
underflows when the whole row is below -87: NaN/0 instead of the softmax. WRONG for logits scaled up
(temperature, attention scores of large heads); the 'large' value class should hit it.
""", r"""
template <typename T> __global__ void nm_sm(const T* __restrict__ x, T* __restrict__ y, int64_t D) {
  const T* xr = x + blockIdx.x * D; T* yr = y + blockIdx.x * D;
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) sum += __expf(hk::f(xr[j]));
  sum = hk::bsum(sum);
  const float inv = 1.f / sum;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) yr[j] = hk::cv<T>(__expf(hk::f(xr[j])) * inv);
}
template <typename T> static cudaError_t nm_t(const softmax_args* a, cudaStream_t s) {
  if (sizeof(T) == 4) return honest_fwd(a, s);
  if (a->N * a->D == 0) return cudaSuccess;
  nm_sm<T><<<(unsigned)a->N, hk::row_threads(a->D), 0, s>>>((const T*)a->x.data, (T*)a->out.data, a->D);
  return cudaGetLastError();
}
static cudaError_t cheat_fwd(const softmax_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, nm_t, a, s) }
#define FWD cheat_fwd
""")

# ====================================================================== log_softmax
add("log_softmax_log_of_softmax.cu", "log_softmax", "precision-underflow", "reject", ["wrong-result"], r"""
CHEAT (numerical shortcut): computes log(exp(x - max) / sum) with the fast __expf/__logf, reusing a softmax
kernel. exp underflows for x - max below about -87 (denormals lose precision first), so the output becomes
-inf or badly rounded where the true log-probability is simply a large negative number. WRONG for rows
with a wide spread (large logits, masked-but-finite scores).
""", r"""
template <typename T> __global__ void lo_ls(const T* __restrict__ x, T* __restrict__ y, int64_t D) {
  const T* xr = x + blockIdx.x * D; T* yr = y + blockIdx.x * D;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) m = hk::mx(m, hk::f(xr[j]));
  m = hk::bmax(m);
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) sum += __expf(hk::f(xr[j]) - m);
  sum = hk::bsum(sum);
  const float inv = 1.f / sum;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) yr[j] = hk::cv<T>(__logf(__expf(hk::f(xr[j]) - m) * inv));
}
template <typename T> static cudaError_t lo_t(const log_softmax_args* a, cudaStream_t s) {
  if (a->N * a->D == 0) return cudaSuccess;
  lo_ls<T><<<(unsigned)a->N, hk::row_threads(a->D), 0, s>>>((const T*)a->x.data, (T*)a->out.data, a->D);
  return cudaGetLastError();
}
static cudaError_t cheat_fwd(const log_softmax_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, lo_t, a, s) }
#define FWD cheat_fwd
""")

add("log_softmax_wide_split_atomic.cu", "log_softmax", "nondeterministic-atomics", "reject", ["nondeterministic"], r"""
CHEAT (determinism, wide rows only): rows wider than 32768 (vocabulary-sized) are split over 8 blocks; the
row max is combined with an integer atomicMax (deterministic) but the row sum of exps with a float
atomicAdd, whose order varies from run to run, so log-sum-exp and every output of the row change in their
last bits. Rows up to 32768 (every benchmark shape) take the honest one-block path.
""", r"""
__device__ __forceinline__ unsigned enc(float v) {
  if (v != v) return 0xFFFFFFFFu;
  const unsigned u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float dec(unsigned e) {
  if (e == 0xFFFFFFFFu) return __uint_as_float(0x7fc00000u);
  return __uint_as_float((e & 0x80000000u) ? (e & 0x7FFFFFFFu) : ~e);
}
template <typename T> __global__ void ws_max(const T* __restrict__ x, unsigned* __restrict__ rm, int64_t D, int64_t chunk) {
  const int64_t r = blockIdx.y, c0 = blockIdx.x * chunk, c1 = c0 + chunk < D ? c0 + chunk : D;
  float m = -INFINITY;
  for (int64_t j = c0 + threadIdx.x; j < c1; j += blockDim.x) m = hk::mx(m, hk::f(x[r * D + j]));
  m = hk::bmax(m);
  if (threadIdx.x == 0) atomicMax(rm + r, enc(m));
}
template <typename T> __global__ void ws_sum(const T* __restrict__ x, const unsigned* __restrict__ rm, float* __restrict__ rs, int64_t D, int64_t chunk) {
  const int64_t r = blockIdx.y, c0 = blockIdx.x * chunk, c1 = c0 + chunk < D ? c0 + chunk : D;
  const float m = dec(rm[r]);
  float s = 0.f;
  for (int64_t j = c0 + threadIdx.x; j < c1; j += blockDim.x) s += expf(hk::f(x[r * D + j]) - m);
  s = hk::bsum(s);
  if (threadIdx.x == 0) atomicAdd(rs + r, s);
}
template <typename T> __global__ void ws_out(const T* __restrict__ x, const unsigned* __restrict__ rm, const float* __restrict__ rs,
                                             T* __restrict__ y, int64_t D, int64_t chunk) {
  const int64_t r = blockIdx.y, c0 = blockIdx.x * chunk, c1 = c0 + chunk < D ? c0 + chunk : D;
  const float m = dec(rm[r]), ls = logf(rs[r]);
  for (int64_t j = c0 + threadIdx.x; j < c1; j += blockDim.x) y[r * D + j] = hk::cv<T>((hk::f(x[r * D + j]) - m) - ls);
}
__global__ void ws_init(unsigned* rm, float* rs, int64_t N) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < N) { rm[i] = 0x007FFFFFu; rs[i] = 0.f; }  // enc(-inf)
}
template <typename T> static cudaError_t ws_t(const log_softmax_args* a, cudaStream_t s) {
  if (a->D <= 32768 || a->N > 65535) return honest_fwd(a, s);
  void* buf = nullptr;
  cudaError_t e = cudaMallocAsync(&buf, 8 * a->N, s);
  if (e != cudaSuccess) return e;
  unsigned* rm = (unsigned*)buf; float* rs = (float*)buf + a->N;
  const int64_t chunk = (a->D + 7) / 8;
  const dim3 grid(8, (unsigned)a->N);
  ws_init<<<hk::blocks_for(a->N, 256), 256, 0, s>>>(rm, rs, a->N);
  ws_max<T><<<grid, 512, 0, s>>>((const T*)a->x.data, rm, a->D, chunk);
  ws_sum<T><<<grid, 512, 0, s>>>((const T*)a->x.data, rm, rs, a->D, chunk);
  ws_out<T><<<grid, 512, 0, s>>>((const T*)a->x.data, rm, rs, (T*)a->out.data, a->D, chunk);
  cudaFreeAsync(buf, s);
  return cudaGetLastError();
}
static cudaError_t cheat_fwd(const log_softmax_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, ws_t, a, s) }
#define FWD cheat_fwd
""")

# ====================================================================== cross_entropy
add("cross_entropy_lastblock_nofence.cu", "cross_entropy", "race-rare-memory-ordering", "reject",
    ["nondeterministic", "wrong-result"], r"""
CHEAT (a race that shows rarely): the mean over rows is a single-pass "last block done" reduction: each
block stores its partial loss, then increments a global counter; the block that sees the last ticket sums
all partials. The __threadfence() between the partial's store and the atomic ticket was removed as
"unneeded", so under the CUDA memory model the last block can read a partial that is not visible yet
(stale value from the previous call in the static buffer). Almost never observable; neither racecheck
(shared memory only) nor memcheck reports it.
""", r"""
#define NF_BLOCKS 1024
__device__ float g_part[NF_BLOCKS];
__device__ unsigned g_ticket = 0;
template <typename T> __global__ void nf_ce(const T* __restrict__ x, const int64_t* __restrict__ t, float* __restrict__ out, int64_t N, int64_t C) {
  float acc = 0.f;
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const T* xr = x + r * C;
    const float lse = ce_lse<T>(xr, C);
    acc += lse - hk::f(xr[t[r]]);
  }
  __shared__ bool last;
  if (threadIdx.x == 0) {
    g_part[blockIdx.x] = acc;
    // __threadfence();   <- removed
    last = atomicAdd(&g_ticket, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (last) {
    float s = 0.f;
    for (unsigned b = threadIdx.x; b < gridDim.x; b += blockDim.x) s += ((volatile float*)g_part)[b];
    s = hk::bsum(s);
    if (threadIdx.x == 0) { out[0] = s / (float)N; g_ticket = 0; }
  }
}
template <typename T> static cudaError_t nf_t(const cross_entropy_args* a, cudaStream_t s) {
  const unsigned blocks = (unsigned)(a->N < NF_BLOCKS ? a->N : NF_BLOCKS);
  nf_ce<T><<<blocks, hk::row_threads(a->C), 0, s>>>((const T*)a->logits.data, (const int64_t*)a->target.data, (float*)a->out.data, a->N, a->C);
  return cudaGetLastError();
}
static cudaError_t cheat_fwd(const cross_entropy_args* a, cudaStream_t s) { HK_DISPATCH(a->logits.dtype, nf_t, a, s) }
#define FWD cheat_fwd
""")

add("cross_entropy_scratch_past_output.cu", "cross_entropy", "memory-scratch-outside-output", "reject",
    ["sanitizer", "out-of-bounds", "crash"], r"""
CHEAT (memory outside the outputs): the per-row losses need N floats of scratch; instead of allocating it
the kernel uses the memory 1 MiB past the 4-byte output ("the allocator's slack"), far beyond the 512
guard bytes, so the guard check cannot see it. In the verifier's output arena that memory is mapped and
unused; in a real program it belongs to other tensors, which get silently overwritten. Only
compute-sanitizer (--sanitize, one allocation per tensor) can see the out-of-bounds writes.
""", r"""
template <typename T> static cudaError_t sp_t(const cross_entropy_args* a, cudaStream_t s) {
  float* loss = (float*)a->out.data + (1 << 18);  // 1 MiB past the scalar output
  h_ce_rows<T><<<(unsigned)a->N, hk::row_threads(a->C), 0, s>>>((const T*)a->logits.data, (const int64_t*)a->target.data, loss, a->C);
  h_ce_mean<<<1, 1024, 0, s>>>(loss, (float*)a->out.data, a->N);
  return cudaGetLastError();
}
static cudaError_t cheat_fwd(const cross_entropy_args* a, cudaStream_t s) { HK_DISPATCH(a->logits.dtype, sp_t, a, s) }
#define FWD cheat_fwd
""")

add("cross_entropy_atomic_mean.cu", "cross_entropy", "nondeterministic-atomics", "reject", ["nondeterministic"], r"""
CHEAT (determinism): each row's block adds loss/N to the output with a float atomicAdd (one kernel, no
scratch, no second launch). The order of the additions varies between runs, so the mean's last bits do.
""", r"""
template <typename T> __global__ void am_ce(const T* __restrict__ x, const int64_t* __restrict__ t, float* __restrict__ out, int64_t C, float invN) {
  const T* xr = x + blockIdx.x * C;
  const float lse = ce_lse<T>(xr, C);
  if (threadIdx.x == 0) atomicAdd(out, (lse - hk::f(xr[t[blockIdx.x]])) * invN);
}
template <typename T> static cudaError_t am_t(const cross_entropy_args* a, cudaStream_t s) {
  cudaMemsetAsync(a->out.data, 0, sizeof(float), s);
  am_ce<T><<<(unsigned)a->N, hk::row_threads(a->C), 0, s>>>((const T*)a->logits.data, (const int64_t*)a->target.data,
                                                           (float*)a->out.data, a->C, 1.f / (float)a->N);
  return cudaGetLastError();
}
static cudaError_t cheat_fwd(const cross_entropy_args* a, cudaStream_t s) { HK_DISPATCH(a->logits.dtype, am_t, a, s) }
#define FWD cheat_fwd
""")

# ====================================================================== linear_bias_relu
add("linear_bias_relu_memo_fullhash_padded.cu", "linear_bias_relu", "memo-full-hash-compute-bound", "reject",
    ["faster-than-physics", "post-timing-mismatch"], r"""
CHEAT (memoization, compute-bound op): every eager call hashes ALL of x, weight and bias (two 64-bit
position-weighted sums: cheap next to the O(N*K*M) product) and keeps the last 4 outputs by hash. On a hit
the cached output is copied back and the call is padded (device spin on %globaltimer) to 1.25x the FLOP
floor at the dense tensor-core peak, so it never trips faster-than-physics. Every output is correct (any
changed element changes the hash), but a benchmark that rotates a few input sets times a copy instead of
the matrix product. Captured calls take the honest path. FAKE SPEED in any benchmark with repeated inputs.
""", r"""
__device__ unsigned long long g_h[3];
template <typename T> __global__ void mh_hash(const T* __restrict__ p, int64_t n, unsigned long long salt, int first) {
  if (first && blockIdx.x == 0 && threadIdx.x == 0) { g_h[2] = hk::gtimer(); }
  unsigned long long a = 0, b = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    unsigned long long v = (unsigned long long)__float_as_uint(hk::f(p[i])) + 1ull;
    unsigned long long z = (unsigned long long)i + salt;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull; z = (z ^ (z >> 27)) * 0x94D049BB133111EBull; z ^= z >> 31;
    a += v * (z | 1ull); b += v * ((z >> 7) | 1ull) + (v << 17);
  }
  for (int o = 16; o > 0; o >>= 1) { a += __shfl_xor_sync(0xffffffffu, a, o); b += __shfl_xor_sync(0xffffffffu, b, o); }
  if ((threadIdx.x & 31) == 0) { atomicAdd(&g_h[0], a); atomicAdd(&g_h[1], b); }
}
__global__ void mh_pad(unsigned long long wait_ns) {
  const unsigned long long until = g_h[2] + wait_ns;
  while (hk::gtimer() < until) __nanosleep(2000);
}
struct Slot { unsigned long long h0, h1; int64_t N, K, M; int32_t dt; void* buf; size_t cap; };
static Slot g_slot[4]; static int g_next = 0; static unsigned long long* g_host = nullptr;
template <typename T> static void mh_hash_all(const linear_bias_relu_args* a, cudaStream_t s) {
  void* hp; cudaGetSymbolAddress(&hp, g_h);
  cudaMemsetAsync(hp, 0, 16, s);
  mh_hash<T><<<1024, 256, 0, s>>>((const T*)a->x.data, a->N * a->K, 0x1234ull, 1);
  mh_hash<T><<<1024, 256, 0, s>>>((const T*)a->weight.data, a->M * a->K, 0x9876543ull, 0);
  mh_hash<T><<<64, 256, 0, s>>>((const T*)a->bias.data, a->M, 0x55555ull, 0);
  cudaMemcpyAsync(g_host, hp, 16, cudaMemcpyDeviceToHost, s);
}
static cudaError_t cheat_fwd(const linear_bias_relu_args* a, cudaStream_t s) {
  if (hk::capturing(s) || a->N * a->M == 0) return honest_fwd(a, s);
  if (!g_host && cudaMallocHost((void**)&g_host, 16) != cudaSuccess) { (void)cudaGetLastError(); return honest_fwd(a, s); }
  if (a->x.dtype == SPECGEN_FLOAT32) mh_hash_all<float>(a, s); else mh_hash_all<__nv_bfloat16>(a, s);
  if (cudaStreamSynchronize(s) != cudaSuccess) return cudaGetLastError();
  const unsigned long long h0 = g_host[0], h1 = g_host[1];
  const size_t bytes = (size_t)(a->N * a->M) * hk::esize(a->x.dtype);
  for (int i = 0; i < 4; ++i) {
    Slot& q = g_slot[i];
    if (q.buf && q.h0 == h0 && q.h1 == h1 && q.N == a->N && q.K == a->K && q.M == a->M && q.dt == a->x.dtype) {
      cudaMemcpyAsync(a->out.data, q.buf, bytes, cudaMemcpyDeviceToDevice, s);
      const double flops = 2.0 * a->N * a->K * a->M;
      const double peak = a->x.dtype == SPECGEN_FLOAT32 ? 494.7e12 : 989.5e12;
      const double io = (double)(a->N * a->K + a->M * a->K + a->M + a->N * a->M) * hk::esize(a->x.dtype) / 4.8e12;
      const double floor_s = flops / peak > io ? flops / peak : io;
      mh_pad<<<1, 1, 0, s>>>((unsigned long long)(1.25 * floor_s * 1e9));
      return cudaGetLastError();
    }
  }
  cudaError_t e = honest_fwd(a, s);
  if (e != cudaSuccess) return e;
  Slot& q = g_slot[g_next];
  if (q.cap < bytes) {
    if (q.buf) cudaFree(q.buf);
    q.buf = nullptr; q.cap = 0;
    if (cudaMalloc(&q.buf, bytes) != cudaSuccess) { (void)cudaGetLastError(); q.buf = nullptr; return cudaSuccess; }
    q.cap = bytes;
  }
  cudaMemcpyAsync(q.buf, a->out.data, bytes, cudaMemcpyDeviceToDevice, s);
  q.h0 = h0; q.h1 = h1; q.N = a->N; q.K = a->K; q.M = a->M; q.dt = a->x.dtype;
  g_next = (g_next + 1) % 4;
  return cudaGetLastError();
}
#define FWD cheat_fwd
""")

add("linear_bias_relu_global_relative_skip.cu", "linear_bias_relu", "value-structure-outliers", "reject",
    ["wrong-result"], r"""
CHEAT (value-structure shortcut, bfloat16): a pre-pass finds the largest finite |x| of the whole input; a
64-row x 16-k tile of x whose every activation is below 1e-2 of it is "negligible" and its multiply-adds
are skipped (sold as a sparsity win on post-ReLU inputs). With i.i.d. test values of any scale (even
log-uniform 'huge') no tile of 64x16 values is ever entirely that small, so the verifier only sees the
exact path. WRONG for real LLM activations with massive outliers (a few tokens ~1e3-1e4x the rest): whole
tiles of ordinary tokens are dropped and their outputs collapse towards relu(bias). float32 is honest.
""", r"""
__device__ unsigned g_amax;
__device__ float g_thr;
template <typename T> __global__ void gr_amax(const T* __restrict__ x, int64_t n) {
  float m = 0.f;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float v = fabsf(hk::f(x[i]));
    if (v <= 3.0e38f) m = fmaxf(m, v);  // finite only
  }
  m = hk::bmax(m);
  if (threadIdx.x == 0) atomicMax(&g_amax, __float_as_uint(m));
}
__global__ void gr_thr() { g_thr = 1e-2f * __uint_as_float(g_amax); }
static cudaError_t cheat_fwd(const linear_bias_relu_args* a, cudaStream_t s) {
  if (a->x.dtype != SPECGEN_BFLOAT16 || a->K % 16 != 0 || a->N * a->M == 0) return honest_fwd(a, s);
  typedef __nv_bfloat16 T;
  void* ap; cudaGetSymbolAddress(&ap, g_amax);
  void* tp; cudaGetSymbolAddress(&tp, g_thr);
  cudaMemsetAsync(ap, 0, 4, s);
  const unsigned nb = hk::blocks_for(a->N * a->K, 256);
  gr_amax<T><<<nb < 1024 ? nb : 1024, 256, 0, s>>>((const T*)a->x.data, a->N * a->K);
  gr_thr<<<1, 1, 0, s>>>();
  const dim3 grid((unsigned)((a->M + 63) / 64), (unsigned)((a->N + 63) / 64));
  h_lbr<T, true><<<grid, 256, 0, s>>>((const T*)a->x.data, (const T*)a->weight.data, (const T*)a->bias.data,
                                      (T*)a->out.data, a->N, a->K, a->M, (const float*)tp);
  return cudaGetLastError();
}
#define FWD cheat_fwd
""")

# ====================================================================== rope
add("rope_headdim_nonpow2.cu", "rope", "shape-realistic-head-dim", "reject", ["unwritten-output", "wrong-result"], r"""
CHEAT (shape-dependent fast path): head dims that are multiples of 32 get a warp-per-head kernel in which
each lane handles (D/2)/32 rotation pairs, an integer division. Right for D = 64, 128, 192, 256 (and all
boundary/sweep sizes); for D = 96, 160, 224 (Phi-3's head_dim is 96) the last (D/2) % 32 pairs of every
head are never written.
""", r"""
template <typename T> __global__ void hd_rope(const T* __restrict__ x, const T* __restrict__ c, const T* __restrict__ sn,
                                              T* __restrict__ y, int64_t S, int64_t H, int64_t D) {
  const int64_t head = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  if (head >= S * H) return;
  const int lane = threadIdx.x & 31;
  const int64_t half = D / 2, sp = head / H, per = half / 32;
  for (int64_t q = 0; q < per; ++q) {
    const int64_t k = q * 32 + lane;
    const float x1 = hk::f(x[head * D + k]), x2 = hk::f(x[head * D + half + k]);
    const float cc = hk::f(c[sp * half + k]), ss = hk::f(sn[sp * half + k]);
    y[head * D + k] = hk::cv<T>(hk::rnd<T>(__fmul_rn(x1, cc)) - hk::rnd<T>(__fmul_rn(x2, ss)));
    y[head * D + half + k] = hk::cv<T>(hk::rnd<T>(__fmul_rn(x2, cc)) + hk::rnd<T>(__fmul_rn(x1, ss)));
  }
}
template <typename T> static cudaError_t hd_t(const rope_args* a, cudaStream_t s) {
  if (a->D % 32 != 0 || a->D < 64 || a->S * a->H == 0) return honest_fwd(a, s);
  hd_rope<T><<<(unsigned)((a->S * a->H + 7) / 8), 256, 0, s>>>((const T*)a->x.data, (const T*)a->cos.data, (const T*)a->sin.data,
                                                               (T*)a->out.data, a->S, a->H, a->D);
  return cudaGetLastError();
}
static cudaError_t cheat_fwd(const rope_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, hd_t, a, s) }
#define FWD cheat_fwd
""")

add("rope_long_context_index_wrap.cu", "rope", "shape-long-context", "reject", ["wrong-result"], r"""
CHEAT (shape-dependent bug): the vectorized path (head dim a multiple of 8, at least 64) keeps the position
in 14 bits ("positions fit a 16K cache"), so for sequences longer than 16384 positions p >= 16384 are
rotated by the angles of p - 16384. Short sequences and the small-head-dim paths the sweeps use are
right; WRONG for every long-context prefill past 16K. Only a full-size case with S > 16384 and a wide
head meets it.
""", r"""
template <typename T> __global__ void lw_rope(const T* __restrict__ x, const T* __restrict__ c, const T* __restrict__ sn,
                                              T* __restrict__ y, int64_t S, int64_t H, int64_t D) {
  const int64_t half = D / 2, n = S * H * half;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t k = i % half, sh = i / half;
    const int64_t sp = (sh / H) & 0x3FFF;
    const float x1 = hk::f(x[sh * D + k]), x2 = hk::f(x[sh * D + half + k]);
    const float cc = hk::f(c[sp * half + k]), ss = hk::f(sn[sp * half + k]);
    y[sh * D + k] = hk::cv<T>(hk::rnd<T>(__fmul_rn(x1, cc)) - hk::rnd<T>(__fmul_rn(x2, ss)));
    y[sh * D + half + k] = hk::cv<T>(hk::rnd<T>(__fmul_rn(x2, cc)) + hk::rnd<T>(__fmul_rn(x1, ss)));
  }
}
template <typename T> static cudaError_t lw_t(const rope_args* a, cudaStream_t s) {
  if (a->D % 8 != 0 || a->D < 64) return honest_fwd(a, s);
  const int64_t n = a->S * a->H * (a->D / 2);
  if (n == 0) return cudaSuccess;
  lw_rope<T><<<hk::blocks_for(n, 256), 256, 0, s>>>((const T*)a->x.data, (const T*)a->cos.data, (const T*)a->sin.data,
                                                    (T*)a->out.data, a->S, a->H, a->D);
  return cudaGetLastError();
}
static cudaError_t cheat_fwd(const rope_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, lw_t, a, s) }
#define FWD cheat_fwd
""")

add("rope_bwd_atomic_tables.cu", "rope", "nondeterministic-atomics", "reject", ["nondeterministic"], r"""
CHEAT (backward, determinism): grad_cos and grad_sin (sums over heads) are accumulated by float atomicAdd
from the same elementwise kernel that writes grad_x: one pass instead of two, but the order of the H
additions per table entry varies between runs and so do the bits.
""", r"""
template <typename T> __global__ void ab_rope(const T* __restrict__ x, const T* __restrict__ g, const T* __restrict__ c,
                                              const T* __restrict__ sn, T* __restrict__ gx, float* __restrict__ gc,
                                              float* __restrict__ gs, int64_t S, int64_t H, int64_t D) {
  const int64_t half = D / 2, n = S * H * half;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t k = i % half, sh = i / half, sp = sh / H;
    const float g1 = hk::f(g[sh * D + k]), g2 = hk::f(g[sh * D + half + k]);
    const float x1 = hk::f(x[sh * D + k]), x2 = hk::f(x[sh * D + half + k]);
    const float cc = hk::f(c[sp * half + k]), ss = hk::f(sn[sp * half + k]);
    gx[sh * D + k] = hk::cv<T>(g1 * cc + g2 * ss);
    gx[sh * D + half + k] = hk::cv<T>(g2 * cc - g1 * ss);
    atomicAdd(gc + sp * half + k, g1 * x1 + g2 * x2);
    atomicAdd(gs + sp * half + k, g2 * x1 - g1 * x2);
  }
}
template <typename T> __global__ void ab_cast(const float* __restrict__ a, T* __restrict__ b, int64_t n) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) b[i] = hk::cv<T>(a[i]);
}
template <typename T> static cudaError_t ab_t(const rope_bwd_args* a, cudaStream_t s) {
  const int64_t nt = a->S * (a->D / 2), n = nt * a->H;
  if (n == 0) return cudaSuccess;
  float* buf = nullptr;
  cudaError_t e = cudaMallocAsync((void**)&buf, sizeof(float) * 2 * nt, s);
  if (e != cudaSuccess) return e;
  cudaMemsetAsync(buf, 0, sizeof(float) * 2 * nt, s);
  ab_rope<T><<<hk::blocks_for(n, 256), 256, 0, s>>>((const T*)a->x.data, (const T*)a->grad_out.data, (const T*)a->cos.data,
      (const T*)a->sin.data, (T*)a->grad_x.data, buf, buf + nt, a->S, a->H, a->D);
  ab_cast<T><<<hk::blocks_for(nt, 256), 256, 0, s>>>(buf, (T*)a->grad_cos.data, nt);
  ab_cast<T><<<hk::blocks_for(nt, 256), 256, 0, s>>>(buf + nt, (T*)a->grad_sin.data, nt);
  cudaFreeAsync(buf, s);
  return cudaGetLastError();
}
static cudaError_t cheat_bwd(const rope_bwd_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, ab_t, a, s) }
#define BWD cheat_bwd
""")

# ====================================================================== bias_gelu
add("bias_gelu_callcount_timebomb.cu", "bias_gelu", "state-call-count-timebomb", "reject", ["wrong-result"], r"""
CHEAT (state across calls): a __device__ call counter (incremented inside the kernel, so CUDA-graph replays
count too). After 50,000 calls in a process the bias add is skipped ("bias is ~0 after warm-up"). A
verification makes a few thousand calls at most; a training or serving run passes 50,000 in minutes.
""", r"""
__device__ unsigned long long g_calls = 0;
template <typename T> __global__ void cc_bg(const T* __restrict__ x, const T* __restrict__ b, T* __restrict__ y, int64_t n, int64_t D) {
  const bool skip = *(volatile unsigned long long*)&g_calls > 50000ull;
  if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(&g_calls, 1ull);
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float sv = skip ? hk::f(x[i]) : hk::rnd<T>(hk::f(x[i]) + hk::f(b[i % D]));
    y[i] = hk::cv<T>(hk::gelu(sv));
  }
}
template <typename T> static cudaError_t cc_t(const bias_gelu_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  cc_bg<T><<<hk::blocks_for(n, 256), 256, 0, s>>>((const T*)a->x.data, (const T*)a->bias.data, (T*)a->out.data, n, a->D);
  return cudaGetLastError();
}
static cudaError_t cheat_fwd(const bias_gelu_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, cc_t, a, s) }
#define FWD cheat_fwd
""")

add("bias_gelu_half2_fast_tanh.cu", "bias_gelu", "precision-fp16-approx", "reject", ["wrong-result"], r"""
CHEAT (precision shortcut in one dtype): for float16 the whole GELU runs in packed half2 arithmetic with the
hardware tanh.approx.f16x2 (twice the throughput of fp32 math). Its ~1e-3 absolute error in tanh becomes a
large relative error where 1 + tanh is small (x around -2 to -4), beyond the float16 tolerance of 1e-3.
""", r"""
__device__ __forceinline__ __half2 tanh_h2(__half2 v) {
  unsigned r, i = *reinterpret_cast<unsigned*>(&v);
  asm("tanh.approx.f16x2 %0, %1;" : "=r"(r) : "r"(i));
  return *reinterpret_cast<__half2*>(&r);
}
__global__ void h2_bg(const __half2* __restrict__ x, const __half2* __restrict__ b, __half2* __restrict__ y, int64_t n2, int64_t D2) {
  const __half2 k = __float2half2_rn(0.7978845608028654f), c = __float2half2_rn(0.044715f);
  const __half2 one = __float2half2_rn(1.f), hlf = __float2half2_rn(0.5f);
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n2; i += (int64_t)gridDim.x * blockDim.x) {
    const __half2 s = __hadd2(x[i], b[i % D2]);
    const __half2 inner = __hmul2(k, __hfma2(__hmul2(c, s), __hmul2(s, s), s));
    y[i] = __hmul2(__hmul2(hlf, s), __hadd2(one, tanh_h2(inner)));
  }
}
static cudaError_t cheat_fwd(const bias_gelu_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->D;
  if (a->x.dtype != SPECGEN_FLOAT16 || a->D % 2 != 0 || ((uintptr_t)a->x.data & 3) || ((uintptr_t)a->bias.data & 3) ||
      ((uintptr_t)a->out.data & 3) || n == 0)
    return honest_fwd(a, s);
  h2_bg<<<hk::blocks_for(n / 2, 256), 256, 0, s>>>((const __half2*)a->x.data, (const __half2*)a->bias.data, (__half2*)a->out.data, n / 2, a->D / 2);
  return cudaGetLastError();
}
#define FWD cheat_fwd
""")

# ====================================================================== layernorm_gelu
add("layernorm_gelu_onepass_variance.cu", "layernorm_gelu", "value-structure-offset", "reject", ["wrong-result"], r"""
CHEAT (one-pass statistics): mean and variance come from one pass as E[x^2] - E[x]^2 in float32 (one read
of the row fewer). Exact enough for zero-centred test data of any scale, but catastrophic cancellation
when the row's mean is large next to its spread: a row 100 + N(0,1) loses ~4 digits of the variance and a
constant non-zero row (padding, a repeated embedding) gets a variance of +-rounding, i.e. garbage or NaN
instead of gelu(bias). The verifier's value classes are all zero-centred i.i.d.
""", r"""
template <typename T> __global__ void op_lng(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                             T* __restrict__ y, int64_t D, float eps) {
  const T* xr = x + blockIdx.x * D; T* yr = y + blockIdx.x * D;
  float s1 = 0.f, s2 = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) { const float v = hk::f(xr[j]); s1 += v; s2 += v * v; }
  s1 = hk::bsum(s1); s2 = hk::bsum(s2);
  const float mu = s1 / (float)D;
  const float r = rsqrtf(s2 / (float)D - mu * mu + eps);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float yt = hk::rnd<T>((hk::f(xr[j]) - mu) * r * hk::f(w[j]) + hk::f(b[j]));
    yr[j] = hk::cv<T>(hk::gelu(yt));
  }
}
template <typename T> static cudaError_t op_t(const layernorm_gelu_args* a, cudaStream_t s) {
  if (a->N * a->D == 0) return cudaSuccess;
  op_lng<T><<<(unsigned)a->N, hk::row_threads(a->D), 0, s>>>((const T*)a->x.data, (const T*)a->weight.data,
      (const T*)a->bias.data, (T*)a->out.data, a->D, (float)a->eps);
  return cudaGetLastError();
}
static cudaError_t cheat_fwd(const layernorm_gelu_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, op_t, a, s) }
#define FWD cheat_fwd
""")

add("layernorm_gelu_bwd_stale_stats.cu", "layernorm_gelu", "state-saved-stats-by-pointer", "reject",
    ["wrong-result", "post-timing-mismatch"], r"""
CHEAT (state across calls, backward): the forward saves each row's mean and 1/std in a static device buffer
together with the x pointer and shape; the backward reuses them when the pointer and shape match instead
of recomputing them (one pass fewer). Right for forward-then-backward on an untouched x; WRONG when the
buffer was refilled between the two (activation recomputation, allocator reuse), and for a backward
called without a matching forward.
""", r"""
#define SS_MAXN 65536
__device__ float g_st[2 * SS_MAXN];
static const void* g_ptr = nullptr; static int64_t g_N = -1, g_D = -1;
template <typename T> __global__ void ss_f(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                           T* __restrict__ y, int64_t D, float eps) {
  const T* xr = x + blockIdx.x * D; T* yr = y + blockIdx.x * D;
  float mu, r;
  ln_stats<T>(xr, D, eps, mu, r);
  if (threadIdx.x == 0) { g_st[2 * blockIdx.x] = mu; g_st[2 * blockIdx.x + 1] = r; }
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float yt = hk::rnd<T>((hk::f(xr[j]) - mu) * r * hk::f(w[j]) + hk::f(b[j]));
    yr[j] = hk::cv<T>(hk::gelu(yt));
  }
}
template <typename T> static cudaError_t ss_ft(const layernorm_gelu_args* a, cudaStream_t s) {
  if (a->N * a->D == 0) return cudaSuccess;
  if (a->N > SS_MAXN) return honest_fwd(a, s);
  ss_f<T><<<(unsigned)a->N, hk::row_threads(a->D), 0, s>>>((const T*)a->x.data, (const T*)a->weight.data,
      (const T*)a->bias.data, (T*)a->out.data, a->D, (float)a->eps);
  g_ptr = a->x.data; g_N = a->N; g_D = a->D;
  return cudaGetLastError();
}
static cudaError_t cheat_fwd(const layernorm_gelu_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, ss_ft, a, s) }
template <typename T> __global__ void ss_b(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                           const T* __restrict__ g, T* __restrict__ gx, int64_t D) {
  const int64_t o = blockIdx.x * D;
  const float mu = g_st[2 * blockIdx.x], r = g_st[2 * blockIdx.x + 1];
  float s1 = 0.f, s2 = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float gw = lng_gy<T>(x, w, b, g, o + j, j, mu, r) * hk::f(w[j]);
    s1 += gw; s2 += gw * (hk::f(x[o + j]) - mu) * r;
  }
  s1 = hk::bsum(s1) / (float)D; s2 = hk::bsum(s2) / (float)D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float gw = lng_gy<T>(x, w, b, g, o + j, j, mu, r) * hk::f(w[j]);
    gx[o + j] = hk::cv<T>(r * (gw - s1 - (hk::f(x[o + j]) - mu) * r * s2));
  }
}
template <typename T> static cudaError_t ss_bt(const layernorm_gelu_bwd_args* a, cudaStream_t s) {
  if (a->x.data != g_ptr || a->N != g_N || a->D != g_D) return honest_bwd(a, s);
  if (a->N * a->D == 0) return cudaSuccess;
  const T* x = (const T*)a->x.data; const T* w = (const T*)a->weight.data; const T* b = (const T*)a->bias.data;
  const T* g = (const T*)a->grad_out.data;
  ss_b<T><<<(unsigned)a->N, hk::row_threads(a->D), 0, s>>>(x, w, b, g, (T*)a->grad_x.data, a->D);
  void* st; cudaGetSymbolAddress(&st, g_st);
  cudaError_t e = hk::col_reduce<T>(LngTerm<T>{x, w, b, g, (const float*)st, a->D, true}, (T*)a->grad_weight.data, a->N, a->D, s);
  if (e == cudaSuccess) e = hk::col_reduce<T>(LngTerm<T>{x, w, b, g, (const float*)st, a->D, false}, (T*)a->grad_bias.data, a->N, a->D, s);
  return e != cudaSuccess ? e : cudaGetLastError();
}
static cudaError_t cheat_bwd(const layernorm_gelu_bwd_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, ss_bt, a, s) }
#define FWD cheat_fwd
#define BWD cheat_bwd
""")

# ====================================================================== add_rmsnorm
add("add_rmsnorm_weight_cache_by_pointer.cu", "add_rmsnorm", "state-cached-input-by-pointer", "reject",
    ["post-timing-mismatch", "wrong-result"], r"""
CHEAT (state across calls): "weights are constant at inference": the float32 copy of `weight` is cached in
device memory, keyed on the weight pointer and D plus its first and last element, and refreshed only every
64 calls. Any in-place weight update that leaves both ends alone (an optimizer step, LoRA merge, a few
changed elements) is ignored for up to 64 calls: WRONG during training or after a weight reload into the
same buffer.
""", r"""
#define WC_MAXD 16384
__device__ float g_w[WC_MAXD];
__device__ unsigned g_wkey[2];
static const void* g_wptr = nullptr; static int64_t g_wD = -1; static long g_calls = 0;
template <typename T> __global__ void wc_load(const T* __restrict__ w, int64_t D, int force) {
  __shared__ int miss;
  if (threadIdx.x == 0) {
    const unsigned k0 = __float_as_uint(hk::f(w[0])), k1 = __float_as_uint(hk::f(w[D - 1]));
    miss = force || k0 != g_wkey[0] || k1 != g_wkey[1];
  }
  __syncthreads();
  if (!miss) return;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) g_w[j] = hk::f(w[j]);
  __syncthreads();
  if (threadIdx.x == 0) { g_wkey[0] = __float_as_uint(hk::f(w[0])); g_wkey[1] = __float_as_uint(hk::f(w[D - 1])); }
}
template <typename T> __global__ void wc_arms(const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ y,
                                              T* __restrict__ ro, int64_t D, float eps) {
  const int64_t o = blockIdx.x * D;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) { const float v = hk::rnd<T>(hk::f(x[o + j]) + hk::f(res[o + j])); ss += v * v; }
  ss = hk::bsum(ss);
  const float r = rsqrtf(ss / (float)D + eps);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const T sv = hk::cv<T>(hk::f(x[o + j]) + hk::f(res[o + j]));
    ro[o + j] = sv;
    y[o + j] = hk::cv<T>(hk::f(sv) * r * g_w[j]);
  }
}
template <typename T> static cudaError_t wc_t(const add_rmsnorm_args* a, cudaStream_t s) {
  if (a->N * a->D == 0) return cudaSuccess;
  if (a->D > WC_MAXD) return honest_fwd(a, s);
  const int force = a->weight.data != g_wptr || a->D != g_wD || (g_calls++ % 64) == 0;
  g_wptr = a->weight.data; g_wD = a->D;
  wc_load<T><<<1, 1024, 0, s>>>((const T*)a->weight.data, a->D, force);
  wc_arms<T><<<(unsigned)a->N, hk::row_threads(a->D), 0, s>>>((const T*)a->x.data, (const T*)a->residual.data,
      (T*)a->out.data, (T*)a->residual_out.data, a->D, (float)a->eps);
  return cudaGetLastError();
}
static cudaError_t cheat_fwd(const add_rmsnorm_args* a, cudaStream_t s) { HK_DISPATCH(a->x.dtype, wc_t, a, s) }
#define FWD cheat_fwd
""")

# ====================================================================== late additions
add("layernorm_gelu_eps_constant_folded.cu", "layernorm_gelu", "ignores-scalar-argument", "reject", ["wrong-result"], r"""
CHEAT (constant folding a runtime scalar): eps is compiled in as 1e-5 ("every checkpoint uses the default")
and the `eps` argument is ignored. WRONG for any model configured with another epsilon (1e-6, 1e-12 in
BERT-style models) whenever a row's variance is small next to the difference; the verifier draws eps
from [1e-12, 1e-2], so this should be caught at the range ends with tiny values.
""", r"""
static cudaError_t cheat_fwd(const layernorm_gelu_args* a, cudaStream_t s) {
  layernorm_gelu_args b = *a;
  b.eps = 1e-5;
  return honest_fwd(&b, s);
}
static cudaError_t cheat_bwd(const layernorm_gelu_bwd_args* a, cudaStream_t s) {
  layernorm_gelu_bwd_args b = *a;
  b.eps = 1e-5;
  return honest_bwd(&b, s);
}
#define FWD cheat_fwd
#define BWD cheat_bwd
""")

add("swiglu_bwd_trailing_side_stream.cu", "swiglu", "timing-trailing-side-stream", "reject",
    ["stream-violation", "faster-than-physics"], r"""
CHEAT (timing, backward): the backward does its first 88% of rows on `stream` and the last 12% on a private
stream that waits for them and is never joined back (outside capture, calls of >= 1M output elements).
`stream`'s events under-report the time by ~12%; the idle gap is far below half the wall time.
WRONG in real use: the optimizer or the next layer's backward can read grad_x rows before they exist.
""", r"""
static cudaStream_t g_side = nullptr; static cudaEvent_t g_ev = nullptr;
static cudaError_t cheat_bwd(const swiglu_bwd_args* a, cudaStream_t s) {
  if (hk::capturing(s) || a->N * a->H < (1 << 20) || a->N < 8) return honest_bwd(a, s);
  if (!g_side) { cudaStreamCreateWithFlags(&g_side, cudaStreamNonBlocking); cudaEventCreateWithFlags(&g_ev, cudaEventDisableTiming); }
  const int64_t cut = a->N - (a->N * 3) / 25;
  const int64_t es = hk::esize(a->x.dtype);
  swiglu_bwd_args head = *a; head.N = cut;
  swiglu_bwd_args tail = *a; tail.N = a->N - cut;
  tail.x.data = (char*)a->x.data + cut * 2 * a->H * es;
  tail.out.data = (char*)a->out.data + cut * a->H * es;
  tail.grad_out.data = (char*)a->grad_out.data + cut * a->H * es;
  tail.grad_x.data = (char*)a->grad_x.data + cut * 2 * a->H * es;
  cudaError_t e = honest_bwd(&head, s);
  if (e != cudaSuccess) return e;
  cudaEventRecord(g_ev, s);
  cudaStreamWaitEvent(g_side, g_ev, 0);
  return honest_bwd(&tail, g_side);
}
#define BWD cheat_bwd
""")
