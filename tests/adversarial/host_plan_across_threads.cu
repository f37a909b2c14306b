// spec: gelu_tanh
// expect: wrong-result
// The bug: the host code keeps its launch plan (the pointers, the element count, the grid) in one
// `static` struct between calls, as a "plan cache" does: each call fills it in, asks the device
// for its SM count (host work between the plan and the launch, as an occupancy query is), then
// launches from the plan. From one host thread it is right, every time. From two threads at the
// same time (a multi-threaded server, nn.DataParallel; ctypes and torch let go of the GIL around
// the call) one thread's launch uses the other's plan: its own outputs are left unwritten, or a
// plan torn between two shapes writes past the other call's outputs. Caught by the verifier's
// calls from two host threads (verifier version 8); every single-thread check passes it (held-out
// rope, session 30, did the same with its plan).
#include "_gelu_common.h"
struct Plan { const void* x; void* out; int64_t n; int blocks; int dtype; };
static Plan g_plan;
template <typename T> __global__ void direct(const T* x, T* y, int64_t n) { GRID_STRIDE(i, n) store(y, i, gelu(load(x, i))); }
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  g_plan.x = a->x.data;
  g_plan.out = a->out.data;
  g_plan.n = a->N * a->D;
  g_plan.dtype = a->x.dtype;
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  int64_t blocks = blocks_for(g_plan.n);
  g_plan.blocks = (int)(blocks < 8 * sms ? blocks : 8 * sms);
  if (g_plan.n == 0) return cudaSuccess;
  DISPATCH(g_plan.dtype, direct<T><<<g_plan.blocks, 256, 0, s>>>((const T*)g_plan.x, (T*)g_plan.out, g_plan.n));
  return cudaGetLastError();
}
HONEST_BACKWARD
