#!/usr/bin/env bash
# The compile matrix: every way a user builds ipcref.h, each with
# -Wall -Wextra -Wpedantic -Werror. Prints a line per build and a closing
# "N passed, N failed". Usage: matrix.sh OUTDIR
set -u
cd "$(dirname "$0")/../.."
OUT=${1:-build/compile}
mkdir -p "$OUT"
HERE=tests/compile
WARN="-Wall -Wextra -Wpedantic -Werror -I."
PASSED=0
FAILED=0
REQUIRE_ALL=${IPCREF_REQUIRE_ALL:-0}

# skip NAME REASON: a build that cannot be tried here; a failure under
# IPCREF_REQUIRE_ALL=1 (tests/run.sh repeats the skip lines).
skip() {
  if [ "$REQUIRE_ALL" = 1 ]; then
    FAILED=$((FAILED + 1)); echo "FAIL  $1 (skipped: $2; IPCREF_REQUIRE_ALL=1 forbids skips)"
  else
    echo "skip  $1 ($2)"
  fi
}

check() { # check NAME CMD...
  local name=$1; shift
  if "$@" >"$OUT/last.log" 2>&1; then
    PASSED=$((PASSED + 1)); echo "ok    $name"
  else
    FAILED=$((FAILED + 1)); echo "FAIL  $name"; sed 's/^/      | /' "$OUT/last.log" | head -30
  fi
}

# Every compiler and standard. C++ compiles the same .c files as C++.
CONFIGS=("gcc -std=c99" "gcc -std=c11" "clang -std=c99" "clang -std=c11"
         "g++ -std=c++11 -x c++" "clang++ -std=c++11 -x c++")
for cfg in "${CONFIGS[@]}"; do
  cc=${cfg%% *}
  if ! command -v "$cc" >/dev/null 2>&1; then
    pkg=clang; [ "$cc" = g++ ] && pkg=g++; [ "$cc" = gcc ] && pkg=gcc
    skip "$cfg" "$cc not installed: apt-get install $pkg"; continue
  fi
  tag=$(echo "$cfg" | tr -c 'a-z0-9+\n' '_')
  # shellcheck disable=SC2086
  {
    check "$cfg: header only, no implementation" $cfg $WARN -c $HERE/decl_only.c -o "$OUT/$tag.decl.o"
    check "$cfg: declarations then implementation, runs" \
      sh -c "$cfg $WARN $HERE/impl.c -o $OUT/$tag.impl && $OUT/$tag.impl"
    check "$cfg: two translation units link and run" \
      sh -c "$cfg $WARN $HERE/two_tu_a.c $HERE/two_tu_b.c -o $OUT/$tag.two && $OUT/$tag.two"
    check "$cfg: IPCREF_STATIC" sh -c "$cfg $WARN $HERE/static.c -o $OUT/$tag.static && $OUT/$tag.static"
    check "$cfg: IPCREF_CHECKED, two translation units, runs" \
      sh -c "$cfg $WARN -DIPCREF_CHECKED $HERE/two_tu_a.c $HERE/two_tu_b.c -o $OUT/$tag.checked && $OUT/$tag.checked"
    check "$cfg: partial allocator macros are refused" \
      sh -c "$cfg $WARN -c $HERE/alloc_partial.c -o $OUT/$tag.partial.o 2>&1 | grep -q 'IPCREF_FREE, or none'"
    if echo '#include <dlpack/dlpack.h>' | $cc -E -x c - >/dev/null 2>&1; then
      check "$cfg: <dlpack/dlpack.h> after ipcref.h: one error, naming it" \
        sh -c "! $cfg $WARN -c $HERE/dlpack_late.c -o $OUT/$tag.late.o >$OUT/$tag.late.log 2>&1 &&
               grep -q ipcref_include_dlpack_h_before_ipcref_h $OUT/$tag.late.log &&
               [ \$(grep -c 'error:' $OUT/$tag.late.log) = 1 ] || { cat $OUT/$tag.late.log; exit 1; }"
    else
      skip "$cfg: <dlpack/dlpack.h> after ipcref.h" "apt-get install libdlpack-dev"
    fi
    check "$cfg: ipcref_cuda.h and ipcref_hip.h with the core, run" \
      sh -c "$cfg $WARN $HERE/backends.c -o $OUT/$tag.backends -pthread -ldl && $OUT/$tag.backends"
  }
done

# The backends against the drivers' own headers (CUDA 13's cuda.h needs C11:
# it has anonymous unions), each where its header is found, as
# tests/fake_gpu/build.sh finds them: <cuda.h> in CUDA_INC, else
# $CUDA_HOME/include, else /usr/local/cuda/include; <hip/hip_runtime_api.h>
# in HIP_INC, else /usr/include. Both are required where CI runs.
if [ -z "${CUDA_INC:-}" ]; then
  CUDA_INC=/usr/local/cuda/include
  if [ -n "${CUDA_HOME:-}" ] && [ -f "$CUDA_HOME/include/cuda.h" ]; then CUDA_INC=$CUDA_HOME/include; fi
fi
HIP_INC=${HIP_INC:-/usr/include}
REAL_CONFIGS=("gcc -std=c11" "clang -std=c11" "g++ -std=c++11 -x c++" "clang++ -std=c++11 -x c++")
real() { # real LABEL FLAGS: backends_real.c with each compiler there is
  local cfg cc tag
  for cfg in "${REAL_CONFIGS[@]}"; do
    cc=${cfg%% *}
    command -v "$cc" >/dev/null 2>&1 || continue
    tag=$(echo "$cfg $1" | tr -c 'a-z0-9+\n' '_')
    # shellcheck disable=SC2086
    check "$cfg: backends against $1" \
      sh -c "$cfg $WARN -I$HERE $2 $HERE/backends_real.c -o $OUT/$tag.real -pthread -ldl && $OUT/$tag.real"
  done
}
cuda_flags="-I$CUDA_INC -DREAL_CUDA_H"
# -I/usr/include would reorder the system's own directories (C++ breaks)
hip_flags="-D__HIP_PLATFORM_AMD__ -DREAL_HIP_H"
[ "$HIP_INC" = /usr/include ] || hip_flags="$hip_flags -I$HIP_INC"
have_cuda=0; have_hip=0
[ -f "$CUDA_INC/cuda.h" ] && have_cuda=1
[ -f "$HIP_INC/hip/hip_runtime_api.h" ] && have_hip=1
if [ $have_cuda = 1 ]; then
  real "<cuda.h>" "$cuda_flags"
else
  skip "backends against <cuda.h>" "no cuda.h in $CUDA_INC: the CUDA toolkit's headers (cuda.h); set CUDA_HOME"
fi
if [ $have_hip = 1 ]; then
  real "<hip/hip_runtime_api.h>" "$hip_flags"
else
  skip "backends against <hip/hip_runtime_api.h>" "no hip/hip_runtime_api.h in $HIP_INC: apt-get install libamdhip64-dev"
fi
# And both in one translation unit, where both are.
if [ $have_cuda = 1 ] && [ $have_hip = 1 ]; then
  real "<cuda.h> and <hip/hip_runtime_api.h>" "$cuda_flags $hip_flags"
fi

# IPCREF_NO_SHARING: strict C99 (no _GNU_SOURCE), and the object may only
# need these libc symbols: no POSIX calls at all (calloc: compilers turn
# malloc and memset into it).
ALLOWED='^(malloc|calloc|realloc|free|memcpy|memmove|memset|memcmp|abort|__assert_fail|fprintf|fwrite|fputs|stderr|__stack_chk_fail)$'
for cc in gcc clang; do
  command -v $cc >/dev/null 2>&1 || continue
  check "$cc -std=c99: IPCREF_NO_SHARING builds with libc only" sh -c "
    $cc -std=c99 -O2 $WARN -c $HERE/no_sharing.c -o $OUT/$cc.noshare.o &&
    bad=\$(nm -u $OUT/$cc.noshare.o | awk '{print \$2}' | grep -Ev '$ALLOWED'); [ -z \"\$bad\" ] ||
    { echo \"unexpected symbols: \$bad\"; exit 1; }"
done

echo "$PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
