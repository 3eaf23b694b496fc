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
    if [ "$REQUIRE_ALL" = 1 ]; then FAILED=$((FAILED + 1)); echo "FAIL  $cc missing"; fi
    pkg=clang; [ "$cc" = g++ ] && pkg=g++; [ "$cc" = gcc ] && pkg=gcc
    echo "skip  $cfg ($cc not installed: apt-get install $pkg)"; continue
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
    check "$cfg: ipcref_cuda.h and ipcref_hip.h with the core, run" \
      sh -c "$cfg $WARN $HERE/backends.c -o $OUT/$tag.backends -pthread -ldl && $OUT/$tag.backends"
  }
done

# The backends against the drivers' own headers (CUDA 13's cuda.h needs C11:
# it has anonymous unions). Both headers are required where CI runs.
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
for cfg in "gcc -std=c11" "clang -std=c11" "g++ -std=c++11 -x c++" "clang++ -std=c++11 -x c++"; do
  cc=${cfg%% *}
  command -v "$cc" >/dev/null 2>&1 || continue
  tag=$(echo "$cfg" | tr -c 'a-z0-9+\n' '_')
  if [ ! -f "$CUDA_INC/cuda.h" ] || [ ! -f /usr/include/hip/hip_runtime_api.h ]; then
    if [ "$REQUIRE_ALL" = 1 ]; then FAILED=$((FAILED + 1)); echo "FAIL  $cfg: driver headers missing"; fi
    echo "skip  $cfg: <cuda.h> in $CUDA_INC or <hip/hip_runtime_api.h> missing"; continue
  fi
  # shellcheck disable=SC2086
  check "$cfg: backends against <cuda.h> and <hip/hip_runtime_api.h>" \
    sh -c "$cfg $WARN -I$HERE -I$CUDA_INC -D__HIP_PLATFORM_AMD__ $HERE/backends_real.c -o $OUT/$tag.real -pthread -ldl && $OUT/$tag.real"
done

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
