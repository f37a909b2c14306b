/* Hand-written stand-in for the generated <op>_abi.h (ABI version 1, docs/ARCHITECTURE.md).
 * op: scale(x: Tensor[N, D], alpha: float = 2.0) -> Tensor[N, D] */
#pragma once
#include <stdint.h>
#include <stdbool.h>
#include <cuda_runtime.h>

#ifndef SPECGEN_ABI_COMMON
#define SPECGEN_ABI_COMMON
#define SPECGEN_ABI_VERSION 1
#define SPECGEN_MAX_DIMS 8
typedef enum specgen_dtype { SPECGEN_FLOAT32 = 0, SPECGEN_FLOAT16 = 1, SPECGEN_BFLOAT16 = 2,
  SPECGEN_FLOAT64 = 3, SPECGEN_INT64 = 4, SPECGEN_INT32 = 5, SPECGEN_INT16 = 6,
  SPECGEN_INT8 = 7, SPECGEN_UINT8 = 8, SPECGEN_BOOL = 9 } specgen_dtype;
typedef struct specgen_tensor {
  void* data;
  int64_t sizes[SPECGEN_MAX_DIMS];
  int64_t strides[SPECGEN_MAX_DIMS];
  int32_t ndim;
  int32_t dtype;
} specgen_tensor;
#endif

typedef struct scale_args {
  specgen_tensor x;
  double alpha;
  int64_t N;
  int64_t D;
  specgen_tensor out;
} scale_args;

#ifdef __cplusplus
extern "C" {
#endif
cudaError_t scale_forward(const scale_args* a, cudaStream_t stream);
#ifdef __cplusplus
}
#endif
