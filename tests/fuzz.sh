#!/usr/bin/env bash
# Fuzzes one target: builds tests/fuzz_TARGET.c with libFuzzer, ASan and
# UBSan, and runs it for ${FUZZ_SECONDS:-60} seconds over a copy of the seed
# corpus tests/corpus/TARGET/. New inputs go to OUTDIR/corpus (never into
# the repository); a crash, leak or sanitizer report leaves its input in
# OUTDIR (crash-*, leak-*, ...) and fails the run. The last line is
# "1 passed, 0 failed" or "0 passed, 1 failed". Give each target its own
# OUTDIR.
#
#   usage: bash tests/fuzz.sh OUTDIR [TARGET]
#   TARGET: view (the default: view op sequences), import (ipcref_import
#           fed arbitrary bytes and fds), channel (a receiver's ring
#           written by a hostile producer) or returns (a producer's
#           ledger and channel control page written by a hostile consumer)
#   env:   FUZZ_SECONDS (60), FUZZ_CC (clang)
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD

result() {
  if [ "$1" = 0 ]; then echo "1 passed, 0 failed"; else echo "0 passed, 1 failed"; fi
  exit "$1"
}

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: bash tests/fuzz.sh OUTDIR [TARGET]" >&2
  result 2
fi
OUT=$1
TARGET=${2:-view}
case $TARGET in
  view) MAXLEN=512; TRACE=FUZZ_VIEW_TRACE ;;
  import) MAXLEN=4096; TRACE=FUZZ_IMPORT_TRACE ;;
  channel) MAXLEN=4200; TRACE=FUZZ_CHANNEL_TRACE ;;
  returns) MAXLEN=1024; TRACE=FUZZ_RETURNS_TRACE ;;
  *) echo "fuzz.sh: unknown target '$TARGET' (view, import, channel or returns)" >&2; result 2 ;;
esac
SRC=$ROOT/tests/fuzz_$TARGET.c
SEEDS=$ROOT/tests/corpus/$TARGET
mkdir -p "$OUT" || result 1
OUT=$(cd "$OUT" && pwd)
SECS=${FUZZ_SECONDS:-60}
CC=${FUZZ_CC:-clang}

if ! command -v "$CC" >/dev/null 2>&1; then
  echo "fuzz.sh: $CC not found"
  result 1
fi

BIN=$OUT/fuzz_$TARGET
echo "fuzz.sh: building $BIN"
if ! "$CC" -O1 -g -std=c11 -Wall -Wextra -Wpedantic -Werror \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -fno-omit-frame-pointer -I"$ROOT" "$SRC" -o "$BIN" -pthread \
  >"$OUT/build.log" 2>&1; then
  cat "$OUT/build.log"
  echo "fuzz.sh: build failed (is libclang-rt installed?)"
  result 1
fi

# A fresh working corpus: the seeds, then whatever the fuzzer finds.
CORPUS=$OUT/corpus
rm -rf "$CORPUS"
mkdir -p "$CORPUS"
cp "$SEEDS"/* "$CORPUS"/ || result 1
rm -f "$OUT"/crash-* "$OUT"/leak-* "$OUT"/timeout-* "$OUT"/oom-* \
  "$OUT"/slow-unit-* 2>/dev/null

echo "fuzz.sh: fuzzing for ${SECS}s over $(find "$CORPUS" -type f | wc -l) seeds"
# -print_funcs=0: naming a newly covered function starts a symbolizer whose
# pipes stay open, and the import target counts its fds after every input.
ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "$BIN" -max_total_time="$SECS" -timeout=20 -rss_limit_mb=2048 \
  -max_len="$MAXLEN" -print_final_stats=1 -print_funcs=0 \
  -artifact_prefix="$OUT/" "$CORPUS" >"$OUT/fuzz.log" 2>&1
rc=$?

if [ $rc -ne 0 ] || ls "$OUT"/crash-* "$OUT"/leak-* "$OUT"/timeout-* \
  "$OUT"/oom-* >/dev/null 2>&1; then
  tail -n 60 "$OUT/fuzz.log"
  art=$(find "$OUT" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' \
    -o -name 'timeout-*' -o -name 'oom-*' \) | head -n 1)
  echo "fuzz.sh: FAILED (exit $rc); replay with:"
  echo "  $TRACE=1 $BIN $art"
  result 1
fi
grep -E '^(#[0-9]+.*DONE|stat::number_of_executed_units|Done )' "$OUT/fuzz.log" | tail -n 3
echo "fuzz.sh: no findings; corpus now $(find "$CORPUS" -type f | wc -l) inputs"
result 0
