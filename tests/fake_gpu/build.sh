#!/bin/sh
# Build ipcref's fake GPU drivers and their self-test into OUTDIR:
#   libcuda.so.1       SONAME libcuda.so.1      from fake_cuda.c
#   libamdhip64.so.5   SONAME libamdhip64.so.5  from fake_hip.c
#   libamdhip64.so     -> libamdhip64.so.5
#   fake_gpu_selftest  run as: OUTDIR/fake_gpu_selftest OUTDIR
# Usage: tests/fake_gpu/build.sh OUTDIR
#   CC=clang     another compiler (default gcc)
#   SANITIZE=1   build everything with -fsanitize=address,undefined
#   CUDA_INC=DIR where cuda.h is (default /usr/local/cuda/include)
set -eu
out=${1:?usage: build.sh OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
cc=${CC:-gcc}
cuda="-I${CUDA_INC:-/usr/local/cuda/include}"
hip="-D__HIP_PLATFORM_AMD__"
flags="-std=c11 -O1 -g -fPIC -Wall -Wextra -Werror"
if [ "${SANITIZE:-0}" = 1 ]; then
  flags="$flags -fsanitize=address,undefined -fno-sanitize-recover=undefined"
  flags="$flags -fno-omit-frame-pointer"
fi
mkdir -p "$out"
$cc $flags $cuda -shared -o "$out/libcuda.so.1" "$here/fake_cuda.c" -pthread \
  -Wl,-soname,libcuda.so.1 -Wl,--version-script="$here/fake_cuda.map"
$cc $flags $hip -shared -o "$out/libamdhip64.so.5" "$here/fake_hip.c" -pthread \
  -Wl,-soname,libamdhip64.so.5 -Wl,--version-script="$here/fake_hip.map"
ln -sf libamdhip64.so.5 "$out/libamdhip64.so"
$cc $flags $cuda $hip -o "$out/fake_gpu_selftest" "$here/selftest.c" \
  -ldl -pthread
