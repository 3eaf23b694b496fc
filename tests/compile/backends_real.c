/* The backends against the drivers' real headers, included first: their
 * types are used, and (in C) every entry point is checked against the
 * header's prototype. */
#ifndef __cplusplus
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <hip/hip_runtime_api.h>
#include "backends.c"
