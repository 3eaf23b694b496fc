/* The backends against the drivers' real headers, included first: their
 * types are used, and (in C) every entry point is checked against the
 * header's prototype. Each header is included where its macro is defined
 * (tests/compile/matrix.sh defines those it finds): REAL_CUDA_H <cuda.h>,
 * REAL_HIP_H <hip/hip_runtime_api.h> (with -D__HIP_PLATFORM_AMD__). */
#ifndef __cplusplus
#define _GNU_SOURCE
#endif
#if !defined(REAL_CUDA_H) && !defined(REAL_HIP_H)
#error "define REAL_CUDA_H and/or REAL_HIP_H (tests/compile/matrix.sh)"
#endif
#ifdef REAL_CUDA_H
#include <cuda.h>
#endif
#ifdef REAL_HIP_H
#include <hip/hip_runtime_api.h>
#endif
#include "backends.c"
