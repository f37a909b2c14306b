// spec: gelu_tanh
// expect: nondeterministic
// The bug: blocks take their tiles from a ticket counter in the framework's workspace (a dynamic
// tile order), the last block to finish sets the counter back to 0 "for the next call", and the
// counter is zeroed only on the process's first call: the kernel trusts its workspace to keep
// state between calls. The workspace is scratch for one call with any contents on entry (the
// caching allocator hands the block to other tensors in between); the verifier fills it with
// random bytes before every call, so from the second call on the tickets start past the last
// tile and nothing is written (run B of the first case differs from run A).
#include "_gelu_common.h"
struct Tickets { unsigned int next, done; };
template <typename T> __global__ void k(const T* x, T* y, int64_t n, int64_t tiles, Tickets* t) {
  __shared__ unsigned int tile;
  if (threadIdx.x == 0) tile = atomicAdd(&t->next, 1u);
  __syncthreads();
  const int64_t i = (int64_t)tile * blockDim.x + threadIdx.x;
  if (tile < tiles && i < n) store(y, i, gelu(load(x, i)));
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&t->done, 1u) == gridDim.x - 1) { t->next = 0; t->done = 0; }  // "clean for the next call"
  }
}
extern "C" size_t gelu_tanh_forward_workspace(const gelu_tanh_args* a) { return sizeof(Tickets); }
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  static bool zeroed = false;
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  if (a->workspace_bytes < (int64_t)sizeof(Tickets)) return cudaErrorInvalidValue;
  Tickets* t = (Tickets*)a->workspace;
  if (!zeroed) {
    cudaError_t e = cudaMemsetAsync(t, 0, sizeof(Tickets), s);
    if (e != cudaSuccess) return e;
    zeroed = true;
  }
  const int64_t tiles = (n + 255) / 256;
  DISPATCH(a->x.dtype, k<T><<<(unsigned)tiles, 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n, tiles, t));
  return cudaGetLastError();
}
HONEST_BACKWARD
