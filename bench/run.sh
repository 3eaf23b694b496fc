#!/usr/bin/env bash
# ipcref benchmarks next to the peers, in one run on one machine: builds bench/<wl>_*.c with -O2
# into a temp dir (removed on exit), runs them, then the peers (bench/peers/run_peers.sh, see
# bench/peers/README.md) restricted to the same workloads; prints every result line on stdout,
# then the ratio table of bench/ratios.py.
# Usage: bash bench/run.sh
# Knobs (env): WORKLOADS (default "w1 w2 w3 w4 limbo reclaim"; also the peers' ONLY), PEERS (the
#              peers' folder, default bench/peers; it holds run_peers.sh, or a run_all.sh that
#              takes the same knobs), W1_N, W1_REPS, W23_REPS (W2 and W3 repetitions, ours and
#              the peers'), W4_SECONDS (timed seconds per peer and size), W4_SIZES (comma
#              separated), W4_VARIANTS (scheduler setups: w4 w4_1cpu w4_2cpu; all W4 knobs are
#              the peers' too), RECLAIM_ROUNDS (rounds per block count, default 30), RECLAIM_BLOCK
#              (bytes per block, default 256), STEP_TIMEOUT, CC, OUT (also keep the raw result lines
#              in this file). The peers take more: PY, CXX, RUSTC, W4_IOX (run_peers.sh).
# W4 runs as bench/peers/run_peers.sh runs its W4 peers: for each variant, each mode of
# bench/w4_handoff.c (ipcref, first) and each size, one process: w4 as is, w4_1cpu under
# `taskset -c 0`, w4_2cpu with W4_PIN=split (producer and consumer on two CPUs); W4_ID names the
# variant.
# To add a workload: add bench/<wl>.c or bench/<wl>_*.c printing `peer=ipcref workload=<id> ...`
# lines, give its arguments in args_for below, and add it to WORKLOADS.
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
PEERS="${PEERS:-$HERE/peers}"
WORKLOADS="${WORKLOADS:-w1 w2 w3 w4 limbo reclaim}"
CC="${CC:-gcc}"
STEP_TIMEOUT="${STEP_TIMEOUT:-120}"
export W1_N="${W1_N:-10000000}" W1_REPS="${W1_REPS:-5}" W23_REPS="${W23_REPS:-7}"
export W4_SECONDS="${W4_SECONDS:-1.0}" W4_SIZES="${W4_SIZES:-4096,1048576,67108864}"
export W4_VARIANTS="${W4_VARIANTS:-w4 w4_1cpu w4_2cpu}"
RECLAIM_ROUNDS="${RECLAIM_ROUNDS:-30}" RECLAIM_BLOCK="${RECLAIM_BLOCK:-256}"

BUILD="$(mktemp -d "${TMPDIR:-/tmp}/ipcref-bench.XXXXXX")"
trap 'rm -rf "$BUILD"' EXIT
RAW="$BUILD/results.txt"

args_for() { # the command-line arguments of workload $1's program
    case $1 in
        w1) echo "$W1_N $W1_REPS" ;;
        w2 | w3) echo "$W23_REPS" ;;
        limbo) echo "5" ;;
        reclaim) echo "$RECLAIM_ROUNDS $RECLAIM_BLOCK" ;;
        *) echo "" ;;
    esac
}

run_w4() { # run_w4 EXE: every W4 variant x mode x size, one time-limited process each
    local exe=$1 variant mode size peer rc
    local -a pinning
    for variant in $W4_VARIANTS; do
        case $variant in
            w4) pinning=(env -u W4_PIN) ;;
            w4_1cpu)
                if ! command -v taskset >/dev/null 2>&1; then
                    echo "peer=ipcref workload=w4_1cpu status=skipped reason=apt-get-install-util-linux"
                    continue
                fi
                pinning=(env -u W4_PIN taskset -c 0) ;;
            w4_2cpu) pinning=(env W4_PIN=split) ;;
            *) echo "# unknown W4 variant $variant"; continue ;;
        esac
        for mode in ipcref first; do
            peer=ipcref; [ $mode = first ] && peer=ipcref_first
            for size in ${W4_SIZES//,/ }; do
                W4_ID=$variant timeout -k 5 "$STEP_TIMEOUT" "${pinning[@]}" \
                    "$exe" "$mode" "$size" "$W4_SECONDS"
                rc=$?
                [ $rc -eq 0 ] ||
                    echo "peer=$peer workload=$variant size=$size status=failed reason=exit-$rc"
            done
        done
    done
}

{
    echo "# ipcref bench: WORKLOADS=\"$WORKLOADS\" W1_N=$W1_N W1_REPS=$W1_REPS W23_REPS=$W23_REPS W4_SECONDS=$W4_SECONDS W4_SIZES=$W4_SIZES W4_VARIANTS=\"$W4_VARIANTS\" RECLAIM_ROUNDS=$RECLAIM_ROUNDS RECLAIM_BLOCK=$RECLAIM_BLOCK cc=$($CC -dumpfullversion 2>/dev/null || echo none)"
    # ---- ours
    for wl in $WORKLOADS; do
        found=0
        for src in "$HERE/${wl}.c" "$HERE/${wl}"_*.c; do
            [ -e "$src" ] || continue
            found=1
            exe="$BUILD/$(basename "$src" .c)"
            if ! "$CC" -O2 -std=c11 -Wall -Wextra -Wpedantic -Werror -pthread -I"$REPO" \
                    "$src" -o "$exe" 2>"$exe.log"; then
                echo "# build of $(basename "$src") failed: $(head -c 300 "$exe.log" | tr '\n' ' ')"
                echo "peer=ipcref workload=$wl status=failed reason=build"
                continue
            fi
            if [ "$wl" = w4 ]; then
                run_w4 "$exe"
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
    peers_sh="$PEERS/run_peers.sh"
    [ -f "$peers_sh" ] || peers_sh="$PEERS/run_all.sh"
    if [ -f "$peers_sh" ]; then
        ONLY="$WORKLOADS" STEP_TIMEOUT="$STEP_TIMEOUT" CC="$CC" bash "$peers_sh"
    else
        echo "# no peers: neither run_peers.sh nor run_all.sh in $PEERS"
    fi
    echo "# bench: done in ${SECONDS}s"
} | tee "$RAW"

[ -z "${OUT:-}" ] || cp "$RAW" "$OUT"
echo
python3 "$HERE/ratios.py" "$RAW"
