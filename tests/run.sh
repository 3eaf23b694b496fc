#!/usr/bin/env bash
# The whole test suite: what `make test` runs. Every step prints one line;
# the output of a step that fails follows it. The last line is the sum:
# "N passed, N failed" (test binaries count their own cases, other steps
# count one each). IPCREF_REQUIRE_ALL=1 turns every skip into a failure.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
B=${BUILD_DIR:-$ROOT/build/test}
mkdir -p "$B"
LOG=$B/log
REQUIRE_ALL=${IPCREF_REQUIRE_ALL:-0}
PASSED=0
FAILED=0
SKIPPED=0

# The suites, as test names under tests/ (tests/NAME.c).
SUITE="test_buf test_threads test_view_model test_view_args test_wire test_share test_channel test_cache test_loop test_meta test_room test_map_caps test_share_threads test_hostile test_crash test_forward_death test_gpu test_table test_checked test_errors"
# The sharing layer's suite needs POSIX; without it the portable core runs.
THREADED="test_threads test_share_threads test_table" # also run under TSan
# The sharing suites run twice: over the channel (the default) and over the
# socket only (tests/path.h: IPCREF_TEST_PATH=socket).
BOTH_PATHS="test_share test_crash test_hostile test_share_threads"
WARN="-Wall -Wextra -Wpedantic -Werror"
export IPCREF_TEST_OPS=${IPCREF_TEST_OPS:-1000000}

have() { command -v "$1" >/dev/null 2>&1; }
pass() { PASSED=$((PASSED + ${2:-1})); printf 'ok    %s\n' "$1"; }
fail() {
  FAILED=$((FAILED + ${2:-1}))
  printf 'FAIL  %s\n' "$1"
  [ -s "$LOG" ] && sed 's/^/      | /' "$LOG" | tail -n 60
}
skip() {
  if [ "$REQUIRE_ALL" = 1 ]; then
    fail "$1 (skipped: $2; IPCREF_REQUIRE_ALL=1 forbids skips)"
  else
    SKIPPED=$((SKIPPED + 1)); printf 'skip  %s (%s)\n' "$1" "$2"
  fi
}

# step NAME CMD...: one check; passes when CMD exits 0.
step() {
  local name=$1; shift
  if "$@" >"$LOG" 2>&1; then pass "$name"; else fail "$name"; fi
}

# run_tests LABEL PREFIX-CMD... -- BINARIES...: runs each test binary and adds
# the counts from its "N passed, N failed" line.
run_tests() {
  local label=$1; shift
  local prefix=()
  while [ "$1" != "--" ]; do prefix+=("$1"); shift; done
  shift
  local bin p f rc
  for bin in "$@"; do
    timeout -k 5 "${TEST_TIMEOUT:-600}" "${prefix[@]}" "$B/$bin" >"$LOG" 2>&1
    rc=$?
    read -r p f < <(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$LOG" | tail -n 1)
    p=${p:-0}; f=${f:-0}
    if [ $rc -eq 0 ] && [ "$f" = 0 ] && [ "$p" -gt 0 ]; then
      pass "$label: $(basename "$bin") ($p cases)" "$p"
    else
      [ "$f" = 0 ] && f=1
      fail "$label: $(basename "$bin") (exit $rc, $p passed, $f failed)" "$f"
      PASSED=$((PASSED + p))
    fi
  done
}

# build_suite DIR CC FLAGS...: builds every suite test into $B/DIR.
build_suite() {
  local dir=$1 cc=$2; shift 2
  local t n=0 max=${BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}
  mkdir -p "$B/$dir"
  # As many compilers at once as there are CPUs: the builds are most of the
  # run's time.
  for t in $SUITE; do
    rm -f "$B/$dir/$t"
    "$cc" "$@" -I"$ROOT" "tests/$t.c" -o "$B/$dir/$t" -pthread -ldl >"$B/$dir/$t.build.log" 2>&1 &
    n=$((n + 1))
    if [ "$n" -ge "$max" ]; then wait -n; n=$((n - 1)); fi
  done
  wait
  for t in $SUITE; do
    if [ ! -x "$B/$dir/$t" ]; then
      cp "$B/$dir/$t.build.log" "$LOG"
      fail "build $dir/$t with $cc"
      return 1
    fi
  done
  return 0
}

suite_bins() { local d=$1 t; for t in $SUITE; do printf '%s ' "$d/$t"; done; }

# DLPack's C tests join the suite where <dlpack/dlpack.h> is installed.
if echo '#include <dlpack/dlpack.h>' | cc -E -x c - >/dev/null 2>&1; then
  SUITE="$SUITE test_dlpack"
  HAVE_DLPACK=1
else
  HAVE_DLPACK=0
fi

# ---------------------------------------------------------------- generated header
step "ipcref.h matches src/ (tools/amalgamate.py --check)" python3 tools/amalgamate.py --check

# ---------------------------------------------------------------- formatting
# The style is clang-format 14's (Debian 12's); another major version
# formats differently, so it is not asked.
CLANG_FORMAT_MAJOR=$(clang-format --version 2>/dev/null | sed -n 's/.*version \([0-9]*\).*/\1/p')
if [ "$CLANG_FORMAT_MAJOR" = 14 ]; then
  step "clang-format (make format-check)" make -s format-check
elif [ -n "$CLANG_FORMAT_MAJOR" ]; then
  skip "clang-format (make format-check)" "needs clang-format 14, found $CLANG_FORMAT_MAJOR"
else
  skip "clang-format (make format-check)" "clang-format 14 not installed: apt-get install clang-format"
fi

# ---------------------------------------------------------------- fake GPU drivers
# The device backends are tested against fake libcuda.so.1 / libamdhip64.so
# (tests/fake_gpu), built against the real CUDA and HIP headers. Each API's
# half (its fake driver, its part of the self-test and of test_gpu) runs
# where its headers are: build.sh finds them (CUDA_INC or $CUDA_HOME/include,
# else /usr/local/cuda/include; HIP_INC, else /usr/include) and lists the
# halves it built in $FAKE_GPU/apis, which test_gpu reads.
FAKE_GPU=$B/fake_gpu
export IPCREF_FAKE_GPU_DIR=$FAKE_GPU
CUDA_WHY="the CUDA toolkit's headers (cuda.h); set CUDA_HOME"
HIP_WHY="apt-get install libamdhip64-dev"
bash tests/fake_gpu/build.sh "$FAKE_GPU" >"$LOG" 2>&1
rc=$?
if [ -f "$FAKE_GPU/apis" ]; then
  GPU_APIS=" $(cat "$FAKE_GPU/apis") "
else
  GPU_APIS="unknown" # build.sh stopped early: test_gpu fails on it too
fi
case $GPU_APIS in *" cuda "*) HAVE_CUDA=1 ;; *) HAVE_CUDA=0 ;; esac
case $GPU_APIS in *" hip "*) HAVE_HIP=1 ;; *) HAVE_HIP=0 ;; esac
case $HAVE_CUDA$HAVE_HIP in
  11) GPU_WHAT="fake CUDA and HIP drivers build against <cuda.h> and <hip/hip_runtime_api.h>" ;;
  10) GPU_WHAT="fake CUDA driver builds against <cuda.h>" ;;
  01) GPU_WHAT="fake HIP driver builds against <hip/hip_runtime_api.h>" ;;
  *) GPU_WHAT="" ;;
esac
if [ $rc != 0 ]; then
  fail "fake GPU drivers build (tests/fake_gpu/build.sh)"
elif [ -n "$GPU_WHAT" ]; then
  pass "$GPU_WHAT"
fi
[ "$GPU_APIS" = unknown ] || [ $HAVE_CUDA = 1 ] || skip "CUDA half of the fake drivers and test_gpu" "$CUDA_WHY"
[ "$GPU_APIS" = unknown ] || [ $HAVE_HIP = 1 ] || skip "HIP half of the fake drivers and test_gpu" "$HIP_WHY"
if [ $rc = 0 ] && [ -n "$GPU_WHAT" ]; then
  printf '#!/bin/sh\nexec "%s/fake_gpu_selftest" "%s"\n' "$FAKE_GPU" "$FAKE_GPU" >"$FAKE_GPU/selftest.sh"
  chmod +x "$FAKE_GPU/selftest.sh"
  run_tests "fake drivers' self-test" -- fake_gpu/selftest.sh
fi
# With neither half test_gpu has no case to run.
if [ "$GPU_APIS" != unknown ] && [ $HAVE_CUDA$HAVE_HIP = 00 ]; then
  SUITE=$(echo " $SUITE " | sed 's/ test_gpu / /; s/^ //; s/ $//')
fi

# ---------------------------------------------------------------- the suite, gcc and clang at -O2
paths_bins() { local d=$1 t; for t in $BOTH_PATHS; do printf '%s ' "$d/$t"; done; }
if build_suite gcc gcc -O2 -std=c11 $WARN; then
  run_tests "gcc -O2" -- $(suite_bins gcc)
  IPCREF_TEST_PATH=socket run_tests "gcc -O2, socket only" -- $(paths_bins gcc)
  # make gpu-test's mode (the drivers found by name, no call log, no
  # knobs) with the fakes standing in for the real drivers.
  case " $SUITE " in *" test_gpu "*)
    LD_LIBRARY_PATH="$FAKE_GPU" IPCREF_GPU_REAL=1 \
      run_tests "gcc -O2, make gpu-test's flows on the fakes" -- gcc/test_gpu ;;
  esac
fi

# clang's sanitizer and libFuzzer runtimes come in their own package.
CLANG_MISSING="clang not installed: apt-get install clang libclang-rt-14-dev"
HAVE_SAN_RT=0
if have clang && echo 'int main(void){return 0;}' |
  clang -fsanitize=address,undefined,fuzzer-no-link -x c - -o "$B/san-probe" >/dev/null 2>&1; then
  HAVE_SAN_RT=1
fi
SAN_MISSING="clang's sanitizer runtimes missing: apt-get install libclang-rt-14-dev"
if have clang; then
  build_suite clang clang -O2 -std=c11 $WARN && run_tests "clang -O2" -- $(suite_bins clang)
else
  skip "clang -O2 suite" "$CLANG_MISSING"
fi

# ---------------------------------------------------------------- sanitizers
if have clang && [ $HAVE_SAN_RT = 1 ]; then
  SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
  if build_suite asan clang -O1 -g -std=c11 $WARN $SAN; then
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
      run_tests "ASan+UBSan" -- $(suite_bins asan)
    IPCREF_TEST_PATH=socket ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
      run_tests "ASan+UBSan, socket only" -- $(paths_bins asan)
  fi
  # The checked build (IPCREF_CHECKED: freed objects quarantined, every
  # call checked) runs the whole suite too, under the same sanitizers.
  build_suite checked clang -O1 -g -std=c11 $WARN $SAN -DIPCREF_CHECKED &&
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
      run_tests "ASan+UBSan, IPCREF_CHECKED" -- $(suite_bins checked)
  mkdir -p "$B/tsan"
  for t in $THREADED; do
    if clang -O1 -g -std=c11 $WARN -fsanitize=thread -I"$ROOT" "tests/$t.c" -o "$B/tsan/$t" -pthread >"$LOG" 2>&1; then
      TSAN_OPTIONS=halt_on_error=1 run_tests "TSan" -- "tsan/$t"
      case " $BOTH_PATHS " in
        *" $t "*) IPCREF_TEST_PATH=socket TSAN_OPTIONS=halt_on_error=1 run_tests "TSan, socket only" -- "tsan/$t" ;;
      esac
    else
      fail "build tsan/$t"
    fi
  done
else
  why=$CLANG_MISSING; have clang && why=$SAN_MISSING
  skip "ASan+UBSan suite" "$why"
  skip "ASan+UBSan, IPCREF_CHECKED suite" "$why"
  skip "TSan suite" "$why"
fi

# ---------------------------------------------------------------- valgrind
if have valgrind; then
  IPCREF_TEST_OPS=20000 IPCREF_UNDER_VALGRIND=1 run_tests "valgrind memcheck" \
    valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=all \
    --suppressions="$ROOT/tests/valgrind.supp" \
    --show-leak-kinds=all -- $(suite_bins gcc)
else
  skip "valgrind suite" "valgrind not installed: apt-get install valgrind"
fi

# ---------------------------------------------------------------- DLPack with real clients
[ $HAVE_DLPACK = 1 ] || skip "DLPack C tests" "<dlpack/dlpack.h> not installed: apt-get install libdlpack-dev"
# torch is optional, except under IPCREF_REQUIRE_ALL=1 (CI), where
# test_dlpack.py fails without it.
IPCREF_REQUIRE_ALL=$REQUIRE_ALL bash tests/dlpack_py/run.sh "$B/dlpack_py" >"$LOG" 2>&1
rc=$?
read -r p f < <(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$LOG" | tail -n 1)
if [ $rc = 77 ]; then
  skip "DLPack with numpy/torch (tests/dlpack_py)" "$(head -n 1 "$LOG")"
elif [ $rc = 0 ] && [ "${f:-1}" = 0 ] && [ "$REQUIRE_ALL" = 1 ] && grep -q 'skipped: torch' "$LOG"; then
  fail "DLPack with torch (tests/dlpack_py) (skipped: torch not installed; IPCREF_REQUIRE_ALL=1 forbids skips)"
elif [ $rc = 0 ] && [ "${f:-1}" = 0 ]; then
  pass "DLPack with numpy$(grep -q 'skipped: torch' "$LOG" && echo ' (torch not installed: skipped, optional)' || echo ' and torch') ($p cases)" 1
else
  fail "DLPack with numpy/torch (tests/dlpack_py)"
fi

# ---------------------------------------------------------------- the Python package
IPCREF_REQUIRE_ALL=$REQUIRE_ALL bash tests/python_check.sh "$B/python" >"$LOG" 2>&1
rc=$?
read -r p f < <(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$LOG" | tail -n 1)
if [ $rc = 77 ]; then
  skip "Python package (python/tests)" "$(head -n 1 "$LOG")"
elif [ $rc = 0 ] && [ "${f:-1}" = 0 ]; then
  pass "Python package: pytest and a venv install ($p cases)" "${p:-1}"
else
  fail "Python package (python/tests)" "${f:-1}"
  PASSED=$((PASSED + ${p:-0}))
fi

# ---------------------------------------------------------------- fuzzing
# Four targets at once on the two cores: view op sequences, and what
# crosses a process boundary: ipcref_import fed arbitrary bytes and fds, a
# receiver's channel ring written by a hostile producer, and a producer's
# ledger and channel control page written by a hostile consumer.
if have clang && [ $HAVE_SAN_RT = 1 ]; then
  for t in view import channel returns; do
    bash tests/fuzz.sh "$B/fuzz-$t" $t >"$B/fuzz-$t.log" 2>&1 &
    eval "FUZZ_PID_$t=\$!"
  done
  for t in view import channel returns; do
    eval "wait \$FUZZ_PID_$t"
    rc=$?
    cp "$B/fuzz-$t.log" "$LOG"
    case $t in
      view) what="view op sequences" ;;
      import) what="ipcref_import" ;;
      channel) what="the channel's ring" ;;
      returns) what="a consumer's ledger and control page" ;;
    esac
    if [ $rc = 0 ]; then pass "libFuzzer: $what, ${FUZZ_SECONDS:-60} s, no findings"; else fail "libFuzzer: $what"; fi
  done
else
  why=$CLANG_MISSING; have clang && why=$SAN_MISSING
  skip "libFuzzer" "$why"
fi

# ---------------------------------------------------------------- compile matrix
bash tests/compile/matrix.sh "$B/compile" >"$LOG" 2>&1
read -r p f < <(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$LOG" | tail -n 1)
if [ "${f:-1}" = 0 ]; then pass "compile matrix ($p builds)" "$p"; else fail "compile matrix" "${f:-1}"; PASSED=$((PASSED + ${p:-0})); fi
# What the matrix could not build here (a compiler or a header missing);
# with IPCREF_REQUIRE_ALL=1 the matrix counts those as failures itself.
while read -r what; do
  SKIPPED=$((SKIPPED + 1)); printf 'skip  compile matrix: %s\n' "$what"
done < <(sed -n 's/^skip  //p' "$LOG")

# ---------------------------------------------------------------- README, examples, install
step "README quick start compiles and runs" bash tests/readme_check.sh "$B/readme"
step "README's compile-time options match the manual in ipcref.h" python3 tests/options_check.py
rm -f "$B/demo/cuda_share" # make demo builds it where cuda.h is
step "examples build and run (make demo)" make -s demo BUILD_DIR="$B/demo"
if [ -x "$B/demo/cuda_share" ] && [ -f "$FAKE_GPU/libcuda.so.1" ]; then
  step "examples/cuda_share with the fake CUDA driver (device memory not host-readable)" \
    env IPCREF_CUDA_DRIVER="$FAKE_GPU/libcuda.so.1" FAKE_CUDA_HOSTPTR=none FAKE_CUDA_WORK_US=2000 "$B/demo/cuda_share"
elif [ $HAVE_CUDA = 1 ]; then
  fail "examples/cuda_share with the fake CUDA driver (not built, though <cuda.h> is there: see make demo and the fake's build)"
else
  : >"$LOG"
  skip "examples/cuda_share with the fake CUDA driver" "$CUDA_WHY"
fi
if have pkg-config; then
  step "make install: headers and ipcref.pc usable" bash tests/install_check.sh "$B/install"
else
  skip "make install check" "pkg-config not installed: apt-get install pkg-config"
fi

if [ "$SKIPPED" -gt 0 ]; then
  printf '%s passed, %s failed, %s skipped\n' "$PASSED" "$FAILED" "$SKIPPED"
else
  printf '%s passed, %s failed\n' "$PASSED" "$FAILED"
fi
[ "$FAILED" = 0 ]
