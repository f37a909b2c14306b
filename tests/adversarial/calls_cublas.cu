// spec: linear_bias_relu
// expect: forbidden-symbol
// The cheat: hands the matrix product to cuBLAS, which the spec does not allow (libraries: none).
#include "linear_bias_relu_abi.h"
// cuBLAS's own prototypes (declared here so the test needs no cuBLAS headers to compile).
typedef struct cublasContext* cublasHandle_t;
extern "C" int cublasCreate_v2(cublasHandle_t* handle);
extern "C" int cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream);
extern "C" int cublasSgemm_v2(cublasHandle_t, int, int, int, int, int, const float*, const float*, int,
                              const float*, int, const float*, float*, int);
extern "C" cudaError_t linear_bias_relu_forward(const linear_bias_relu_args* a, cudaStream_t s) {
  static cublasHandle_t handle = nullptr;
  if (!handle) cublasCreate_v2(&handle);
  cublasSetStream_v2(handle, s);
  const float one = 1.f, zero = 0.f;
  // out^T (M x N) = weight (M x K) . x^T (K x N), column-major view of the row-major tensors
  cublasSgemm_v2(handle, 1, 0, (int)a->M, (int)a->N, (int)a->K, &one, (const float*)a->weight.data, (int)a->K,
                 (const float*)a->x.data, (int)a->K, &zero, (float*)a->out.data, (int)a->M);
  return cudaGetLastError();
}
