#!/bin/sh
# shellcheck disable=SC2086 # $flags, $cuda, $hip, $selftest: lists of words
# Build ipcref's fake GPU drivers and their self-test into OUTDIR. Each API's
# half is built where its headers are found, and only there:
#   libcuda.so.1       SONAME libcuda.so.1      from fake_cuda.c  (<cuda.h>)
#   libamdhip64.so.5   SONAME libamdhip64.so.5  from fake_hip.c
#   libamdhip64.so     -> libamdhip64.so.5          (<hip/hip_runtime_api.h>)
#   fake_gpu_selftest  the halves built; run as: OUTDIR/fake_gpu_selftest OUTDIR
#   apis               one line naming the halves built: "cuda hip", "cuda",
#                      "hip" or nothing (tests/test_gpu.c runs those). It is
#                      written before anything is compiled, so a half whose
#                      build fails is still expected there, and fails.
# What an earlier run left in OUTDIR is removed first, so that nothing stale
# stands in for a half not built or a build that failed. A half that fails
# to build does not stop the rest; the exit status is then non-zero.
# Finding no headers is not an error. fake_cuda.c #includes fake_cuda_vmm.c
# and fake_cuda_pool.c (and fake_core.h, fake_vmm.h, fake_pool.h);
# fake_hip.c #includes fake_hip_vmm.c and fake_hip_pool.c (and fake_core.h,
# fake_vmm.h, fake_pool.h); selftest.c #includes selftest_vmm.c,
# selftest_pool.c, selftest_hip_vmm.c and selftest_hip_pool.c: those are not
# compiled on their own.
# Usage: tests/fake_gpu/build.sh OUTDIR
#   CC=clang     another compiler (default gcc)
#   SANITIZE=1   build everything with -fsanitize=address,undefined
#   CUDA_INC=DIR where cuda.h is (default $CUDA_HOME/include if it has
#                cuda.h, else /usr/local/cuda/include); no cuda.h there: no
#                CUDA half
#   HIP_INC=DIR  where hip/hip_runtime_api.h is (default /usr/include, where
#                Debian's libamdhip64-dev puts it); not there: no HIP half
set -eu
out=${1:?usage: build.sh OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
cc=${CC:-gcc}
if [ -z "${CUDA_INC:-}" ]; then
  CUDA_INC=/usr/local/cuda/include
  if [ -n "${CUDA_HOME:-}" ] && [ -f "$CUDA_HOME/include/cuda.h" ]; then
    CUDA_INC=$CUDA_HOME/include
  fi
fi
HIP_INC=${HIP_INC:-/usr/include}
flags="-std=c11 -O1 -g -fPIC -Wall -Wextra -Werror"
if [ "${SANITIZE:-0}" = 1 ]; then
  flags="$flags -fsanitize=address,undefined -fno-sanitize-recover=undefined"
  flags="$flags -fno-omit-frame-pointer"
fi
mkdir -p "$out"
rm -f "$out/libcuda.so.1" "$out/libamdhip64.so.5" "$out/libamdhip64.so" \
  "$out/fake_gpu_selftest" "$out/apis"

apis=""
selftest=""
if [ -f "$CUDA_INC/cuda.h" ]; then
  apis="cuda"
  cuda="-I$CUDA_INC"
  selftest="$selftest -DFAKE_GPU_CUDA $cuda"
else
  echo "no cuda.h in $CUDA_INC (CUDA_INC, CUDA_HOME): CUDA half not built"
fi
if [ -f "$HIP_INC/hip/hip_runtime_api.h" ]; then
  apis="${apis:+$apis }hip"
  hip="-D__HIP_PLATFORM_AMD__"
  # -I/usr/include would reorder the system's own directories
  [ "$HIP_INC" = /usr/include ] || hip="$hip -I$HIP_INC"
  selftest="$selftest -DFAKE_GPU_HIP $hip"
else
  echo "no hip/hip_runtime_api.h in $HIP_INC (HIP_INC): HIP half not built"
fi
echo "$apis" >"$out/apis"

status=0
case " $apis " in *" cuda "*)
  $cc $flags $cuda -shared -o "$out/libcuda.so.1" "$here/fake_cuda.c" -pthread \
    -Wl,-soname,libcuda.so.1 -Wl,--version-script="$here/fake_cuda.map" ||
    { status=1; echo "the fake libcuda.so.1 did not build"; } ;;
esac
case " $apis " in *" hip "*)
  { $cc $flags $hip -shared -o "$out/libamdhip64.so.5" "$here/fake_hip.c" -pthread \
    -Wl,-soname,libamdhip64.so.5 -Wl,--version-script="$here/fake_hip.map" &&
    ln -sf libamdhip64.so.5 "$out/libamdhip64.so"; } ||
    { status=1; echo "the fake libamdhip64.so.5 did not build"; } ;;
esac
if [ -n "$apis" ]; then
  $cc $flags $selftest -o "$out/fake_gpu_selftest" "$here/selftest.c" \
    -ldl -pthread || { status=1; echo "fake_gpu_selftest did not build"; }
fi
echo "built: ${apis:-nothing}$([ $status = 0 ] || echo ' (with failures)')"
exit $status
