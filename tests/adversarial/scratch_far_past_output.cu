// spec: gelu_tanh
// expect: out-of-bounds
// The cheat: the kernel keeps a per-block flag it needs between two launches, and rather than
// allocating it, puts it 1 MiB past the end of the output ("the allocator's slack"), far beyond
// any few hundred guard bytes. The outputs are right; in a real program those bytes belong to
// another tensor, which is silently overwritten. The verifier guards every unused byte of the
// output arena, so the write is seen without compute-sanitizer.
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, int64_t n, int* flags) {
  GRID_STRIDE(i, n) store(y, i, gelu(load(x, i)));
  if (threadIdx.x == 0) flags[blockIdx.x] = 1;
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  size_t bytes = (size_t)n * (a->x.dtype == SPECGEN_FLOAT32 ? 4 : 2);
  int* flags = (int*)((char*)a->out.data + ((bytes + (1 << 20) + 255) & ~(size_t)255));
  int blocks = blocks_for(n) < 64 ? blocks_for(n) : 64;
  DISPATCH(a->x.dtype, k<T><<<blocks, 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n, flags));
  return cudaGetLastError();
}
HONEST_BACKWARD
