// A kernel as specgen expects one: CUDA headers and the ABI header only.
#include <cuda_bf16.h>
#include "scale_abi.h"

template <typename T>
__global__ void scale_kernel(const T* x, T* out, float alpha, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = (T)((float)x[i] * alpha);
}

extern "C" cudaError_t scale_forward(const scale_args* a, cudaStream_t stream) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  int blocks = (int)((n + 255) / 256 < 65535 ? (n + 255) / 256 : 65535);
  if (a->x.dtype == SPECGEN_FLOAT32)
    scale_kernel<float><<<blocks, 256, 0, stream>>>((const float*)a->x.data, (float*)a->out.data,
                                                    (float)a->alpha, n);
  else if (a->x.dtype == SPECGEN_BFLOAT16)
    scale_kernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(
        (const __nv_bfloat16*)a->x.data, (__nv_bfloat16*)a->out.data, (float)a->alpha, n);
  else
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}
