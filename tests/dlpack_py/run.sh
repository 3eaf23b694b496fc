#!/usr/bin/env bash
# DLPack with real clients: builds tests/dlpack_py/dlpack_lib.c (ipcref.h as
# a shared library, strict warnings) and runs test_dlpack.py with the
# system Python, which hands ipcref views to NumPy (and PyTorch, when it is
# installed) and takes theirs, and shares views with a second Python process
# (received memory is read-only there unless the producer opens it).
#   run.sh OUTDIR
# Exit: 0 passed, 1 failed, 77 skipped (NumPy or the DLPack header missing).
# With IPCREF_REQUIRE_ALL=1 a missing PyTorch is a failure, not a skip.
# The script's last line is "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."
OUT=${1:-build/dlpack_py}
PY=${PYTHON_FOR_DLPACK:-/usr/bin/python3}
CC=${CC:-gcc}
mkdir -p "$OUT"

if [ ! -f /usr/include/dlpack/dlpack.h ] &&
   ! echo '#include <dlpack/dlpack.h>' | "$CC" -E -x c - >/dev/null 2>&1; then
  echo "skipped: <dlpack/dlpack.h> not found (apt-get install libdlpack-dev)"
  exit 77
fi
if ! "$PY" -c 'import numpy' >/dev/null 2>&1; then
  echo "skipped: numpy not installed for $PY (apt-get install python3-numpy)"
  exit 77
fi

LIB=$OUT/libipcref_dlpack_test.so
"$CC" -O2 -g -std=c11 -Wall -Wextra -Wpedantic -Werror -fPIC -shared \
  -fvisibility=hidden -I. tests/dlpack_py/dlpack_lib.c -o "$LIB" || {
  echo "build of $LIB failed"
  echo "0 passed, 1 failed"
  exit 1
}
exec "$PY" tests/dlpack_py/test_dlpack.py "$LIB"
