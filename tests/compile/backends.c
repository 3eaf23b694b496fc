/* Both device backends, implementation and all, in one file with the core:
 * no driver headers needed; without a driver each open says ENODEV. */
#ifndef __cplusplus
#define _GNU_SOURCE
#endif
#define IPCREF_IMPLEMENTATION
#define IPCREF_CUDA_IMPLEMENTATION
#define IPCREF_HIP_IMPLEMENTATION
#include "ipcref.h"
#include "ipcref_cuda.h"
#include "ipcref_hip.h"

int main(void) {
  ipcref_cuda *cu = NULL;
  ipcref_hip *hip = NULL;
  if (ipcref_cuda_open("/nonexistent/libcuda.so.1", &cu) != IPCREF_ENODEV ||
      ipcref_cuda_error()[0] == 0)
    return 1;
  if (ipcref_hip_open("/nonexistent/libamdhip64.so", &hip) != IPCREF_ENODEV ||
      ipcref_hip_error()[0] == 0)
    return 1;
  return cu == NULL && hip == NULL ? 0 : 1;
}
