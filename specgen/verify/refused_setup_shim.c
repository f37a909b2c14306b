/* specgen's refused-setup shim (verifier version 16; specgen/verify/refused_setup.py says why).
 *
 * LD_PRELOADed into one candidate process, it makes cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize,
 * ...) fail as it does under MPS or a vGPU profile that refuses the set-aside, and leaves every other
 * limit to the real function. The refusal is made by the real runtime, not pretended: the shim calls
 * the real cudaDeviceSetLimit with a limit no device supports, so the runtime itself returns its error
 * (cudaErrorUnsupportedLimit, the documented answer for a limit the active device does not support)
 * and records it as the calling thread's last error, as a refused set-aside does; that error is what
 * the caller gets back and what its next cudaGetLastError returns.
 *
 * The real function is the one of the runtime the kernel linked: looked up in the libcudart already
 * loaded under CUDART_SONAME (dlsym on that handle searches it and its dependencies, never this
 * shim), else the next definition after this shim in the global scope.
 *
 * Built by the judge with the system's C compiler (cc -shared -fPIC ... -ldl), cached by content. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdatomic.h>

#ifndef CUDART_SONAME
#define CUDART_SONAME "libcudart.so.13"
#endif

#define LIMIT_PERSISTING_L2 0x06      /* cudaLimitPersistingL2CacheSize (driver_types.h) */
#define LIMIT_NO_DEVICE_HAS 0x7fffff0 /* no cudaLimit/CUlimit has this value: refused by any device */
#define UNSUPPORTED_LIMIT 215         /* cudaErrorUnsupportedLimit */
#define ERROR_UNKNOWN 999             /* cudaErrorUnknown: no real function to forward to */

typedef int (*set_limit_fn)(int, size_t);

static _Atomic(set_limit_fn) real_fn;
static atomic_long refused_calls;     /* persisting-L2 set-asides refused */
static atomic_int last_refusal;       /* the code the last refusal returned */
static atomic_long unrecorded;        /* refusals the runtime did not record (it accepted the bad limit) */

static set_limit_fn real_set_limit(void) {
  set_limit_fn fn = atomic_load(&real_fn);
  if (fn == NULL) {
    void* runtime = dlopen(CUDART_SONAME, RTLD_LAZY | RTLD_NOLOAD);
    if (runtime != NULL) {
      fn = (set_limit_fn)dlsym(runtime, "cudaDeviceSetLimit");
      dlclose(runtime); /* (NOLOAD: only the reference taken above is dropped) */
    }
    if (fn == NULL) fn = (set_limit_fn)dlsym(RTLD_NEXT, "cudaDeviceSetLimit");
    if (fn != NULL) atomic_store(&real_fn, fn);
  }
  return fn;
}

int cudaDeviceSetLimit(int limit, size_t value) {
  set_limit_fn real = real_set_limit();
  if (limit != LIMIT_PERSISTING_L2) return real != NULL ? real(limit, value) : ERROR_UNKNOWN;
  atomic_fetch_add(&refused_calls, 1);
  int code = real != NULL ? real(LIMIT_NO_DEVICE_HAS, 0) : 0; /* the runtime records its own error */
  if (code == 0) { /* accepted (never seen): still refused, but nothing recorded it */
    atomic_fetch_add(&unrecorded, 1);
    code = UNSUPPORTED_LIMIT;
  }
  atomic_store(&last_refusal, code);
  return code;
}

/* What the shim did in this process: read by the tests and the candidate's process. */
long specgen_refused_setup_calls(void) { return atomic_load(&refused_calls); }
int specgen_refused_setup_code(void) { return atomic_load(&last_refusal); }
long specgen_refused_setup_unrecorded(void) { return atomic_load(&unrecorded); }
