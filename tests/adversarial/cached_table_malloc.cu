// spec: gelu_tanh
// expect: forbidden-symbol
// The bug: the 16-bit forward gathers gelu from a table of all 65536 inputs, built by the first
// 16-bit call into memory it cudaMallocs and keeps in a host static for the process's life (per
// dtype, not per device or per call). Exact on one GPU one call at a time; a call on a second GPU
// reads the first GPU's memory, and a call on another stream that starts while the first call is
// still building the table reads it half built. Memory a call keeps past its return is what the
// workspace replaces: cudaMalloc and cudaFree are refused by their symbols before it runs.
#include "_gelu_common.h"
template <typename T> __device__ __forceinline__ T from_bits(unsigned short b);
template <> __device__ __forceinline__ __half from_bits<__half>(unsigned short b) { return __ushort_as_half(b); }
template <> __device__ __forceinline__ __nv_bfloat16 from_bits<__nv_bfloat16>(unsigned short b) {
  return __ushort_as_bfloat16(b);
}
template <typename T> __global__ void build(T* table) {
  GRID_STRIDE(i, 65536) {
    const T v = from_bits<T>((unsigned short)i);
    store(table, i, gelu(load(&v, 0)));
  }
}
template <typename T> __global__ void gather(const T* x, const T* table, T* y, int64_t n) {
  const unsigned short* bits = (const unsigned short*)x;
  GRID_STRIDE(i, n) y[i] = table[bits[i]];
}
template <typename T> __global__ void direct(const T* x, T* y, int64_t n) { GRID_STRIDE(i, n) store(y, i, gelu(load(x, i))); }
template <typename T> cudaError_t forward16(const gelu_tanh_args* a, cudaStream_t s, int64_t n, void*& table) {
  if (table == nullptr) {  // the first call of this dtype in the process, on whichever device is current
    cudaError_t e = cudaMalloc(&table, 65536 * sizeof(T));
    if (e != cudaSuccess) return e;
    build<T><<<256, 256, 0, s>>>((T*)table);
  }
  gather<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, (const T*)table, (T*)a->out.data, n);
  return cudaGetLastError();
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  static void* tables[2] = {nullptr, nullptr};
  const int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32:
      direct<float><<<blocks_for(n), 256, 0, s>>>((const float*)a->x.data, (float*)a->out.data, n);
      return cudaGetLastError();
    case SPECGEN_FLOAT16: return forward16<__half>(a, s, n, tables[0]);
    case SPECGEN_BFLOAT16: return forward16<__nv_bfloat16>(a, s, n, tables[1]);
    default: return cudaErrorInvalidValue;
  }
}
HONEST_BACKWARD
