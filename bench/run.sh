#!/usr/bin/env bash
# ipcref benchmarks next to the peers, in one run on one machine: builds bench/<wl>_*.c with -O2
# into a temp dir (removed on exit), runs them, then the peers (bench/peers/run_peers.sh, see
# bench/peers/README.md) restricted to the same workloads; prints every result line on stdout,
# then the ratio table of bench/ratios.py.
# Usage: bash bench/run.sh
# Knobs (env): WORKLOADS (default "w1 w2 w3 w4 lines w5 w6 limbo reclaim doorbell"; also the
#              peers' ONLY; doorbell is bench/doorbell.c, what waking a sleeper costs with each
#              primitive the channel's doorbell could be, DOORBELL_N round trips each; lines is
#              bench/lines.c, W4's chan_spin hand-off with the library's shared-memory traffic
#              and none of its code, W4_SECONDS per row: the protocol's floor (and a more
#              compact protocol's, row ipcref_lines_compact); maps is
#              bench/maps.c, a hand-off with 1, 100 and 1000 segments mapped, MAPS_REPS
#              each), PEERS
#              (the peers' folder, default bench/peers; it holds run_peers.sh, or a run_all.sh that
#              takes the same knobs), W1_N, W1_REPS, W23_REPS (W2 and W3 repetitions, ours and
#              the peers'), W4_SECONDS (timed seconds per peer and size), W4_SIZES (comma
#              separated), W4_VARIANTS (scheduler setups: w4 w4_1cpu w4_2cpu; these W4 knobs
#              are the peers' too), W4_MODES (ipcref's W4 modes, default "ipcref first
#              chan_spin chan_sockack chan_nospin chan_auto"), W4_SPIN_US (the consumer's spin
#              in chan_spin and chan_sockack, default 50), W4_TPUT_N (hand-offs of the w4_tput
#              throughput rows, default 1000000; 0: no throughput rows), W4_RING_BYTES (the
#              channel's ring in ipcref's W4 rows, default unset: the library's), W4_ROUNDS
#              (ipcref's W4 rows, all of them, this many times over, default 1: on a shared
#              machine, where a row's figure drifts 50 % within minutes, ratios.py takes the
#              median of the rounds), RECLAIM_ROUNDS (rounds per block count, default 30), RECLAIM_BLOCK (bytes per
#              block, default 256), W5_SECONDS (timed seconds per row, default 1.0),
#              W5_SIZES (comma separated, default 4, 24, 64 and 256 MiB), W5_VARIANTS (setups:
#              w5_1cpu w5_2cpu w5_frames), W5_STREAMS (seq inflight4 mixed), W5_MIN_ITEMS (timed
#              items at least, default 8), W5_MAX_BYTES (a row ends once it streamed this much,
#              past W5_MIN_ITEMS; default 2 GiB), W5_FRAMES (frames per w5_frames row, default
#              300; all W5 knobs but W5_FRAMES are the peers' too), W6_SECONDS (timed seconds per
#              row, default 1.0), W6_SIZES (the fresh stream's sizes, comma separated, default 4,
#              24 and 64 MiB), W6_MIN_ITEMS (timed items at least, default 8), W6_WINDOW (items in
#              flight, default 1), W6_WORKLOADS (default "fresh resend dataloader"), W6_DL_WORKERS
#              (DataLoader workers, default 4), W6_DL_BATCH (bytes per batch, default 24 MiB),
#              W6_DL_BATCHES (batches per epoch, default 32), W6_DL_EPOCHS (default 3; all W6
#              knobs are the peers' too), W6_MAKE (default 1: `make python` before W6; 0: use
#              build/python as it is), PY (the interpreter of W6 and of the Python peers, default
#              /usr/bin/python3), STEP_TIMEOUT, CC, OUT (also keep the raw result lines in this
#              file). The peers take more: CXX, RUSTC, W4_IOX (run_peers.sh).
# W4 runs as bench/peers/run_peers.sh runs its W4 peers: for each variant, each mode of
# bench/w4_handoff.c (W4_MODES: ipcref and first, the socket path; chan_spin, chan_sockack,
# chan_nospin and chan_auto, the channel; peer ipcref_<mode> but for ipcref) and each size (the
# modes of one size one after the other), one process: w4 as is, w4_1cpu under `taskset -c 0`,
# w4_2cpu with W4_PIN=split (producer and consumer on two CPUs); W4_ID names the variant. Then
# the throughput rows once, unpinned: tput_chan and tput_sock, W4_TPUT_N hand-offs of 4096 bytes
# each (workload w4_tput).
# W5 runs the same way: for each setup, each mode of bench/w5_stream.c (ipcref: a fresh tensor per
# item, reused: the bound), each stream (seq, inflight4, mixed) and each size, one process:
# w5_1cpu under `taskset -c 0`, w5_2cpu with W5_PIN=split; W5_ID names the setup and the
# workload id printed is <setup>_<stream>. w5_frames starts two programs per mode, unpinned:
# `w5_stream frames-recv SOCK` in the background, then `w5_stream frames-send MODE SOCK FRAMES`,
# which connects to it (SOCK: an AF_UNIX socket path in the build folder).
# W6 (Python to Python) is bench/w6_python.py, run by PY with build/python first on PYTHONPATH
# (built by `make python` unless W6_MAKE=0): rows ipcref_py (the package's API) and
# ipcref_dropin / ipcref_dropin_empty (torch.multiprocessing and DataLoader through
# ipcref.torch.install()); when the package does not import, its rows
# print status=skipped. Its peers are bench/peers/w6_python.py's.
# To add a workload: add bench/<wl>.c or bench/<wl>_*.c printing `peer=ipcref workload=<id> ...`
# lines, give its arguments in args_for below, and add it to WORKLOADS.
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
PEERS="${PEERS:-$HERE/peers}"
WORKLOADS="${WORKLOADS:-w1 w2 w3 w4 lines maps w5 w6 limbo reclaim doorbell}"
MAPS_REPS="${MAPS_REPS:-200000}"
CC="${CC:-gcc}"
STEP_TIMEOUT="${STEP_TIMEOUT:-120}"
export W1_N="${W1_N:-10000000}" W1_REPS="${W1_REPS:-5}" W23_REPS="${W23_REPS:-7}"
export W4_SECONDS="${W4_SECONDS:-1.0}" W4_SIZES="${W4_SIZES:-4096,1048576,67108864}"
export W4_VARIANTS="${W4_VARIANTS:-w4 w4_1cpu w4_2cpu}"
W4_MODES="${W4_MODES:-ipcref first chan_spin chan_sockack chan_nospin chan_auto}"
export W4_SPIN_US="${W4_SPIN_US:-50}" W4_TPUT_N="${W4_TPUT_N:-1000000}"
W4_ROUNDS="${W4_ROUNDS:-1}"
export W5_SECONDS="${W5_SECONDS:-1.0}" W5_SIZES="${W5_SIZES:-4194304,25165824,67108864,268435456}"
export W5_VARIANTS="${W5_VARIANTS:-w5_1cpu w5_2cpu w5_frames}"
export W5_STREAMS="${W5_STREAMS:-seq inflight4 mixed}" W5_MIN_ITEMS="${W5_MIN_ITEMS:-8}"
export W5_MAX_BYTES="${W5_MAX_BYTES:-2147483648}" W5_FRAMES="${W5_FRAMES:-300}"
export W6_SECONDS="${W6_SECONDS:-1.0}" W6_SIZES="${W6_SIZES:-4194304,25165824,67108864}"
export W6_MIN_ITEMS="${W6_MIN_ITEMS:-8}" W6_WINDOW="${W6_WINDOW:-1}"
export W6_WORKLOADS="${W6_WORKLOADS:-fresh resend dataloader}" W6_DL_WORKERS="${W6_DL_WORKERS:-4}"
export W6_DL_BATCH="${W6_DL_BATCH:-25165824}" W6_DL_BATCHES="${W6_DL_BATCHES:-32}"
export W6_DL_EPOCHS="${W6_DL_EPOCHS:-3}"
W6_MAKE="${W6_MAKE:-1}"
# PY given and not there: no Python rows; the default: /usr/bin/python3, else python3
if [ -z "${PY:-}" ]; then
    PY=/usr/bin/python3
    [ -x "$PY" ] || PY="$(command -v python3 || echo /nonexistent/python3)"
fi
export PY
RECLAIM_ROUNDS="${RECLAIM_ROUNDS:-30}" RECLAIM_BLOCK="${RECLAIM_BLOCK:-256}"

BUILD="$(mktemp -d "${TMPDIR:-/tmp}/ipcref-bench.XXXXXX")"
trap 'rm -rf "$BUILD"' EXIT
RAW="$BUILD/results.txt"

args_for() { # the command-line arguments of workload $1's program
    case $1 in
        w1) echo "$W1_N $W1_REPS" ;;
        w2 | w3) echo "$W23_REPS" ;;
        limbo) echo "5" ;;
        lines) echo "$W4_SECONDS" ;;
        maps) echo "$MAPS_REPS" ;;
        reclaim) echo "$RECLAIM_ROUNDS $RECLAIM_BLOCK" ;;
        *) echo "" ;;
    esac
}

run_w4() { # run_w4 EXE: W4_ROUNDS rounds of run_w4_round, then the throughput rows
    local exe=$1 mode rc _
    for _ in $(seq "$W4_ROUNDS"); do run_w4_round "$exe"; done
    [ "$W4_TPUT_N" != 0 ] || return 0
    for _ in $(seq "$W4_ROUNDS"); do # throughput: unpinned, once a round
        for mode in tput_chan tput_sock; do
            env -u W4_PIN timeout -k 5 "$STEP_TIMEOUT" "$exe" "$mode" 4096 "$W4_TPUT_N"
            rc=$?
            [ $rc -eq 0 ] ||
                echo "peer=ipcref_$mode workload=w4_tput size=4096 status=failed reason=exit-$rc"
        done
    done
}

run_w4_round() { # run_w4_round EXE: every W4 variant x size x mode, one time-limited process each
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
        # sizes outside, modes inside: the rows that one size's goals compare (ipcref and its
        # channel rows) run one after the other, seconds apart
        for size in ${W4_SIZES//,/ }; do
            for mode in $W4_MODES; do
                peer=ipcref_$mode; [ "$mode" = ipcref ] && peer=ipcref
                W4_ID=$variant timeout -k 5 "$STEP_TIMEOUT" "${pinning[@]}" \
                    "$exe" "$mode" "$size" "$W4_SECONDS"
                rc=$?
                [ $rc -eq 0 ] ||
                    echo "peer=$peer workload=$variant size=$size status=failed reason=exit-$rc"
            done
        done
    done
}

run_w5() { # run_w5 EXE: every W5 setup x mode x stream x size, one time-limited process each
    local exe=$1 setup mode stream size sizes peer rc
    local -a pinning
    for setup in $W5_VARIANTS; do
        case $setup in
            w5_frames) run_w5_frames "$exe"; continue ;;
            w5_1cpu)
                if ! command -v taskset >/dev/null 2>&1; then
                    echo "peer=ipcref workload=w5_1cpu status=skipped reason=apt-get-install-util-linux"
                    continue
                fi
                pinning=(env -u W5_PIN taskset -c 0) ;;
            w5_2cpu) pinning=(env W5_PIN=split) ;;
            *) echo "# unknown W5 variant $setup"; continue ;;
        esac
        for mode in ipcref reused; do
            peer=ipcref; [ $mode = reused ] && peer=ipcref_reused
            for stream in $W5_STREAMS; do
                sizes=$W5_SIZES; [ "$stream" = mixed ] && sizes=0
                for size in ${sizes//,/ }; do
                    W5_ID=$setup timeout -k 5 "$STEP_TIMEOUT" "${pinning[@]}" \
                        "$exe" "$mode" "$stream" "$size" "$W5_SECONDS"
                    rc=$?
                    [ $rc -eq 0 ] ||
                        echo "peer=$peer workload=${setup}_$stream size=$size status=failed reason=exit-$rc"
                done
            done
        done
    done
}

run_w5_frames() { # run_w5_frames EXE: per mode, the consumer program, then the producer program
    local exe=$1 mode peer rc crc cpid sock="$BUILD/w5_frames.sock"
    for mode in ipcref reused; do
        peer=ipcref; [ $mode = reused ] && peer=ipcref_reused
        rm -f "$sock"
        timeout -k 5 "$STEP_TIMEOUT" "$exe" frames-recv "$sock" &
        cpid=$!
        timeout -k 5 "$STEP_TIMEOUT" "$exe" frames-send "$mode" "$sock" "$W5_FRAMES"
        rc=$?
        wait $cpid
        crc=$?
        if [ $rc -ne 0 ]; then
            echo "peer=$peer workload=w5_frames status=failed reason=exit-$rc"
        elif [ $crc -ne 0 ]; then
            echo "peer=$peer workload=w5_frames status=failed reason=consumer-exit-$crc"
        fi
    done
    rm -f "$sock"
}

run_w6() { # ipcref's W6 rows: bench/w6_python.py, with the package from build/python
    local rc wl wls="${W6_WORKLOADS// /,}"
    if [ ! -x "$PY" ]; then
        for wl in $W6_WORKLOADS; do
            echo "peer=ipcref_py workload=w6_$wl status=skipped reason=apt-get-install-python3"
        done
        return
    fi
    if [ "$W6_MAKE" != 0 ]; then
        if ! command -v make >/dev/null 2>&1; then
            echo "# make python: no make (apt-get install make); build/python as it is"
        elif ! make -C "$REPO" -s python PY="$PY" BUILD_DIR=build >"$BUILD/make_python.log" 2>&1; then
            echo "# make python failed: $(tail -c 300 "$BUILD/make_python.log" | tr '\n' ' ')"
        fi
    fi
    PYTHONPATH="$REPO/build/python${PYTHONPATH:+:$PYTHONPATH}" timeout -k 5 "$STEP_TIMEOUT" \
        "$PY" "$HERE/w6_python.py" ipcref_py,ipcref_dropin "$wls"
    rc=$?
    [ $rc -eq 0 ] || echo "peer=ipcref_py workload=w6 status=failed reason=exit-$rc"
}

{
    echo "# ipcref bench: WORKLOADS=\"$WORKLOADS\" W1_N=$W1_N W1_REPS=$W1_REPS W23_REPS=$W23_REPS W4_SECONDS=$W4_SECONDS W4_SIZES=$W4_SIZES W4_VARIANTS=\"$W4_VARIANTS\" W4_MODES=\"$W4_MODES\" W4_SPIN_US=$W4_SPIN_US W4_TPUT_N=$W4_TPUT_N W4_RING_BYTES=${W4_RING_BYTES:-default} W4_ROUNDS=$W4_ROUNDS W5_SECONDS=$W5_SECONDS W5_SIZES=$W5_SIZES W5_VARIANTS=\"$W5_VARIANTS\" W5_STREAMS=\"$W5_STREAMS\" W5_MIN_ITEMS=$W5_MIN_ITEMS W5_MAX_BYTES=$W5_MAX_BYTES W5_FRAMES=$W5_FRAMES W6_SECONDS=$W6_SECONDS W6_SIZES=$W6_SIZES W6_MIN_ITEMS=$W6_MIN_ITEMS W6_WINDOW=$W6_WINDOW W6_WORKLOADS=\"$W6_WORKLOADS\" W6_DL_WORKERS=$W6_DL_WORKERS W6_DL_BATCH=$W6_DL_BATCH W6_DL_BATCHES=$W6_DL_BATCHES W6_DL_EPOCHS=$W6_DL_EPOCHS PY=$PY RECLAIM_ROUNDS=$RECLAIM_ROUNDS RECLAIM_BLOCK=$RECLAIM_BLOCK MAPS_REPS=$MAPS_REPS cc=$($CC -dumpfullversion 2>/dev/null || echo none)"
    # ---- ours
    for wl in $WORKLOADS; do
        if [ "$wl" = w6 ]; then
            run_w6
            continue
        fi
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
            if [ "$wl" = w5 ]; then
                run_w5 "$exe"
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
