#!/usr/bin/env bash
# ipcref benchmarks next to the peers, in one run on one machine: builds bench/<wl>_*.c with -O2
# into a temp dir (removed on exit), runs them, then the peers' run_all.sh restricted to the same
# workloads; prints every result line on stdout, then the ratio table of bench/ratios.py.
# Usage: bash bench/run.sh
# Knobs (env): WORKLOADS (default "w1 w2 w3"; also the peers' ONLY), PEERS (default
#              <repo>/../shared/peers), W1_N, W1_REPS, W23_REPS (W2 and W3 repetitions, ours and
#              the peers'), STEP_TIMEOUT, CC, OUT (also keep the raw result lines in this file).
# To add a workload: add bench/<wl>_*.c printing `peer=ipcref workload=<id> ...` lines, give its
# arguments in args_for below, and add it to WORKLOADS.
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
PEERS="${PEERS:-$REPO/../shared/peers}"
WORKLOADS="${WORKLOADS:-w1 w2 w3}"
CC="${CC:-gcc}"
STEP_TIMEOUT="${STEP_TIMEOUT:-120}"
export W1_N="${W1_N:-10000000}" W1_REPS="${W1_REPS:-5}" W23_REPS="${W23_REPS:-7}"

BUILD="$(mktemp -d "${TMPDIR:-/tmp}/ipcref-bench.XXXXXX")"
trap 'rm -rf "$BUILD"' EXIT
RAW="$BUILD/results.txt"

args_for() { # the command-line arguments of workload $1's program
    case $1 in
        w1) echo "$W1_N $W1_REPS" ;;
        w2 | w3) echo "$W23_REPS" ;;
        *) echo "" ;;
    esac
}

{
    echo "# ipcref bench: WORKLOADS=\"$WORKLOADS\" W1_N=$W1_N W1_REPS=$W1_REPS W23_REPS=$W23_REPS cc=$($CC -dumpfullversion 2>/dev/null || echo none)"
    # ---- ours
    for wl in $WORKLOADS; do
        found=0
        for src in "$HERE/${wl}"_*.c; do
            [ -e "$src" ] || continue
            found=1
            exe="$BUILD/$(basename "$src" .c)"
            if ! "$CC" -O2 -std=c11 -Wall -Wextra -Wpedantic -Werror -pthread -I"$REPO" \
                    "$src" -o "$exe" 2>"$exe.log"; then
                echo "# build of $(basename "$src") failed: $(head -c 300 "$exe.log" | tr '\n' ' ')"
                echo "peer=ipcref workload=$wl status=failed reason=build"
                continue
            fi
            # shellcheck disable=SC2046  # the arguments are meant to split
            timeout -k 5 "$STEP_TIMEOUT" "$exe" $(args_for "$wl")
            rc=$?
            [ $rc -eq 0 ] || echo "peer=ipcref workload=$wl status=failed reason=exit-$rc"
        done
        [ $found = 1 ] || echo "peer=ipcref workload=$wl status=skipped reason=no-bench-program"
    done
    # ---- peers, same workloads
    if [ -f "$PEERS/run_all.sh" ]; then
        ONLY="$WORKLOADS" STEP_TIMEOUT="$STEP_TIMEOUT" bash "$PEERS/run_all.sh"
    else
        echo "# peers not found at $PEERS"
    fi
} | tee "$RAW"

[ -z "${OUT:-}" ] || cp "$RAW" "$OUT"
echo
python3 "$HERE/ratios.py" "$RAW"
