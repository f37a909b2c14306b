/* specgen's slow-runtime shim (verifier version 16; specgen/verify/slow_runtime.py says why).
 *
 * LD_PRELOADed into one candidate process, it makes the CUDA runtime calls a kernel's host code
 * makes between reading its host state and launching wait a random 0..MAX_DELAY_US microseconds
 * (a busy wait: a sleep's timer slack is itself ~50 us) before the real function runs. A race
 * between host threads in that code (a buffer claimed for two callers and used by a third, a plan
 * read without the lock) is a few instructions wide at full speed and tens of microseconds wide
 * here. The launch configuration push of `<<<...>>>` is one of them: it runs before the launch's
 * arguments are copied, so a plan written by another thread meanwhile is what gets launched.
 *
 * Each real function is the one of the runtime the kernel linked: looked up in the libcudart already
 * loaded under CUDART_SONAME, else the next definition after this shim in the global scope. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#ifndef CUDART_SONAME
#define CUDART_SONAME "libcudart.so.13"
#endif
#ifndef MAX_DELAY_US
#define MAX_DELAY_US 40
#endif
#define NO_RUNTIME 999 /* cudaErrorUnknown: no real function to forward to */

typedef struct { unsigned x, y, z; } dim3_t; /* dim3, passed by value as the runtime takes it */

static atomic_long delayed_calls;
static _Thread_local uint64_t draw;

static void wait_a_little(void) {
  if (draw == 0) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    draw = ((uint64_t)(uintptr_t)&draw ^ (uint64_t)now.tv_nsec ^ 0x9E3779B97F4A7C15ull) | 1;
  }
  draw ^= draw << 13; draw ^= draw >> 7; draw ^= draw << 17; /* xorshift64, per thread */
  const long wait_ns = (long)(draw % (MAX_DELAY_US + 1)) * 1000;
  atomic_fetch_add(&delayed_calls, 1);
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  do {
    clock_gettime(CLOCK_MONOTONIC, &now);
  } while ((now.tv_sec - start.tv_sec) * 1000000000L + (now.tv_nsec - start.tv_nsec) < wait_ns);
}

static void* real(const char* name) {
  void* fn = NULL;
  void* runtime = dlopen(CUDART_SONAME, RTLD_LAZY | RTLD_NOLOAD);
  if (runtime != NULL) {
    fn = dlsym(runtime, name);
    dlclose(runtime); /* (NOLOAD: only the reference taken above is dropped) */
  }
  return fn != NULL ? fn : dlsym(RTLD_NEXT, name);
}

#define SLOWED(ret, fail, name, params, args)                  \
  typedef ret (*name##_fn) params;                             \
  static _Atomic(name##_fn) real_##name;                       \
  ret name params {                                            \
    name##_fn fn = atomic_load(&real_##name);                  \
    if (fn == NULL) {                                          \
      fn = (name##_fn)real(#name);                             \
      atomic_store(&real_##name, fn);                          \
    }                                                          \
    wait_a_little();                                           \
    return fn != NULL ? fn args : (fail);                      \
  }

/* `<<<...>>>`: the configuration pushed before the arguments are copied, then the launch */
SLOWED(unsigned, 1u, __cudaPushCallConfiguration, (dim3_t g, dim3_t b, size_t smem, void* s), (g, b, smem, s))
SLOWED(int, NO_RUNTIME, __cudaLaunchKernel, (const void* k, dim3_t g, dim3_t b, void** a, size_t smem, void* s),
       (k, g, b, a, smem, s))
SLOWED(int, NO_RUNTIME, cudaLaunchKernel, (const void* f, dim3_t g, dim3_t b, void** a, size_t smem, void* s),
       (f, g, b, a, smem, s))
SLOWED(int, NO_RUNTIME, cudaLaunchKernelExC, (const void* config, const void* f, void** a), (config, f, a))
/* what a host plan asks before it launches */
SLOWED(int, NO_RUNTIME, cudaGetDevice, (int* device), (device))
SLOWED(int, NO_RUNTIME, cudaDeviceGetAttribute, (int* value, int attribute, int device), (value, attribute, device))
SLOWED(int, NO_RUNTIME, cudaOccupancyMaxActiveBlocksPerMultiprocessor, (int* n, const void* f, int block, size_t smem),
       (n, f, block, smem))
SLOWED(int, NO_RUNTIME, cudaFuncGetAttributes, (void* attributes, const void* f), (attributes, f))
SLOWED(int, NO_RUNTIME, cudaFuncSetAttribute, (const void* f, int attribute, int value), (f, attribute, value))
/* stream-ordered memory and copies on `stream` */
SLOWED(int, NO_RUNTIME, cudaMallocAsync, (void** p, size_t n, void* s), (p, n, s))
SLOWED(int, NO_RUNTIME, cudaFreeAsync, (void* p, void* s), (p, s))
SLOWED(int, NO_RUNTIME, cudaMemsetAsync, (void* p, int v, size_t n, void* s), (p, v, n, s))
SLOWED(int, NO_RUNTIME, cudaMemcpyAsync, (void* d, const void* src, size_t n, int kind, void* s), (d, src, n, kind, s))
SLOWED(int, NO_RUNTIME, cudaGetLastError, (void), ())

/* Runtime calls this shim delayed in this process: read by the tests. */
long specgen_slow_runtime_calls(void) { return atomic_load(&delayed_calls); }
