#!/usr/bin/env bash
# The peers of ipcref's benchmarks: what its users would use otherwise, measured
# with the same workloads (README.md here). Builds the C, C++ and Rust peers with
# -O2 into a temporary folder (removed on exit), runs the workloads asked for and
# prints one line per measurement on stdout:
#   peer=<name> workload=<id> size=<bytes> metric=<ns_per_op|GBps|us_per_handoff> value=<number> [k=v ...]
# Lines that start with '#' are notes. A peer whose tool is missing prints
#   peer=<name> workload=<id> status=skipped reason=apt-get-install-<package>
# and the others run; a crash or a time-out prints `status=failed`.
# Usage: bash bench/peers/run_peers.sh   (bench/run.sh runs it after ipcref's own)
# Knobs (env): ONLY (workloads, default "w1 w2 w3 w4 w5 w6"), W1_N, W1_REPS, W23_REPS,
#   W4_SECONDS, W4_SIZES (comma separated), W4_VARIANTS ("w4 w4_1cpu w4_2cpu"),
#   W4_IOX (0: leave the iceoryx peers out), W5_SECONDS, W5_SIZES (comma
#   separated), W5_VARIANTS ("w5_1cpu w5_2cpu w5_frames"; w5_frames has no
#   peers), W5_STREAMS ("seq inflight4 mixed"), W5_MIN_ITEMS, W5_MAX_BYTES
#   W6_SECONDS, W6_SIZES (comma separated), W6_MIN_ITEMS, W6_WINDOW,
#   W6_WORKLOADS ("fresh resend dataloader"), W6_DL_WORKERS, W6_DL_BATCH,
#   W6_DL_BATCHES, W6_DL_EPOCHS (w6_python.py tells what they are)
#   (bench/run.sh has their defaults too), STEP_TIMEOUT (seconds per step),
#   PY (default /usr/bin/python3, the interpreter Debian's numpy and torch
#   install for), CC, CXX, RUSTC; iceoryx/run.sh lists its own.
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# PY given and not there: no Python peers; the default: /usr/bin/python3, else python3
if [ -z "${PY:-}" ]; then
    PY=/usr/bin/python3
    [ -x "$PY" ] || PY="$(command -v python3 || echo /nonexistent/python3)"
fi
CC="${CC:-gcc}" CXX="${CXX:-g++}" RUSTC="${RUSTC:-rustc}"
ONLY="${ONLY:-w1 w2 w3 w4 w5 w6}"
STEP_TIMEOUT="${STEP_TIMEOUT:-120}"
W1_N="${W1_N:-10000000}" W1_REPS="${W1_REPS:-5}" W23_REPS="${W23_REPS:-7}"
export W4_SECONDS="${W4_SECONDS:-1.0}" W4_SIZES="${W4_SIZES:-4096,1048576,67108864}"
export W4_VARIANTS="${W4_VARIANTS:-w4 w4_1cpu w4_2cpu}" STEP_TIMEOUT CC
export W5_SECONDS="${W5_SECONDS:-1.0}" W5_SIZES="${W5_SIZES:-4194304,25165824,67108864,268435456}"
export W5_VARIANTS="${W5_VARIANTS:-w5_1cpu w5_2cpu w5_frames}"
export W5_STREAMS="${W5_STREAMS:-seq inflight4 mixed}" W5_MIN_ITEMS="${W5_MIN_ITEMS:-8}"
export W5_MAX_BYTES="${W5_MAX_BYTES:-2147483648}"
export W6_SECONDS="${W6_SECONDS:-1.0}" W6_SIZES="${W6_SIZES:-4194304,25165824,67108864}"
export W6_MIN_ITEMS="${W6_MIN_ITEMS:-8}" W6_WINDOW="${W6_WINDOW:-1}"
export W6_WORKLOADS="${W6_WORKLOADS:-fresh resend dataloader}" W6_DL_WORKERS="${W6_DL_WORKERS:-4}"
export W6_DL_BATCH="${W6_DL_BATCH:-25165824}" W6_DL_BATCHES="${W6_DL_BATCHES:-32}"
export W6_DL_EPOCHS="${W6_DL_EPOCHS:-3}"

BUILD="$(mktemp -d "${TMPDIR:-/tmp}/ipcref-peers.XXXXXX")"
trap 'rm -rf "$BUILD"' EXIT

have() { command -v "$1" >/dev/null 2>&1; }
wants() { case " $ONLY " in *" $1 "*) return 0 ;; esac; return 1; }
skipped() { # skipped PEER WORKLOAD REASON; w2 and w3 stand for their workload ids
    local wl
    case $2 in
        w2) set -- "$1" "w2_slice w2_transpose" "$3" ;;
        w3) set -- "$1" "w3_transpose w3_stride2" "$3" ;;
    esac
    for wl in $2; do echo "peer=$1 workload=$wl status=skipped reason=$3"; done
}
step() { # step PEER WORKLOAD command...: time-limited; a non-zero exit is a failed line
    local peer=$1 wl=$2 rc
    shift 2
    timeout -k 5 "$STEP_TIMEOUT" "$@"
    rc=$?
    [ $rc -eq 0 ] || echo "peer=$peer workload=$wl status=failed reason=exit-$rc"
}
build() { # build NAME compiler args...: 0 when built; a failure is a note
    local name=$1
    shift
    "$@" 2>"$BUILD/$name.log" && return 0
    echo "# build of $name failed: $(head -c 300 "$BUILD/$name.log" | tr '\n' ' ')"
    return 1
}
# Whether PY can import module $1, without importing it (torch takes seconds).
py_finds() {
    "$PY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)' \
        "$1" 2>/dev/null
}

echo "# peers: $(uname -sr) nproc=$(nproc) cc=$($CC -dumpfullversion 2>/dev/null || echo none)" \
    "c++=$($CXX -dumpfullversion 2>/dev/null || echo none)" \
    "rustc=$( ("$RUSTC" --version 2>/dev/null || echo "- none") | cut -d' ' -f2)" \
    "python=$PY ($("$PY" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null || echo none))"

# ---- W1: clone + drop of a shared handle
if wants w1; then
    if ! have "$CC"; then
        skipped c_atomic "w1a w1b" apt-get-install-gcc
    elif build w1_atomic "$CC" -O2 -std=gnu11 -pthread -I"$HERE/.." \
        "$HERE/w1_atomic.c" -o "$BUILD/w1_atomic"; then
        step c_atomic w1 "$BUILD/w1_atomic" "$W1_N" "$W1_REPS"
    else
        echo "peer=c_atomic workload=w1 status=failed reason=build"
    fi
    if ! have "$CXX"; then
        skipped cpp_shared_ptr_st w1a apt-get-install-g++
        skipped cpp_shared_ptr "w1a w1b" apt-get-install-g++
    elif build w1_shared_ptr "$CXX" -O2 -std=c++17 -pthread "$HERE/w1_shared_ptr.cpp" \
        -o "$BUILD/w1_shared_ptr"; then
        step cpp_shared_ptr w1 "$BUILD/w1_shared_ptr" "$W1_N" "$W1_REPS"
    else
        echo "peer=cpp_shared_ptr workload=w1 status=failed reason=build"
    fi
    if ! have "$RUSTC"; then
        skipped rust_arc "w1a w1b" apt-get-install-rustc
    elif build w1_arc "$RUSTC" -C opt-level=2 --edition 2021 "$HERE/w1_arc.rs" \
        -o "$BUILD/w1_arc"; then
        step rust_arc w1 "$BUILD/w1_arc" "$W1_N" "$W1_REPS"
    else
        echo "peer=rust_arc workload=w1 status=failed reason=build"
    fi
fi

# ---- W2 views, W3 materialize: numpy and torch (each script prints its own
# skipped lines when its library does not import), and C's memcpy
for wl in w2 w3; do
    wants $wl || continue
    script="$HERE/w2_views.py"
    [ $wl = w3 ] && script="$HERE/w3_copy.py"
    if [ ! -x "$PY" ]; then
        [ $wl = w2 ] && skipped python_timeit_empty w2_empty apt-get-install-python3
        for lib in numpy torch; do
            skipped $lib $wl apt-get-install-python3-$lib
            [ $wl = w3 ] && skipped ${lib}_prealloc $wl apt-get-install-python3-$lib
        done
    else
        [ $wl = w2 ] && step python_timeit_empty w2 "$PY" "$script" empty "$W23_REPS"
        for lib in numpy torch; do
            if py_finds $lib; then
                step $lib $wl "$PY" "$script" $lib "$W23_REPS"
            else
                skipped $lib $wl apt-get-install-python3-$lib
                [ $wl = w3 ] && skipped ${lib}_prealloc $wl apt-get-install-python3-$lib
            fi
        done
    fi
done
if wants w3; then
    if ! have "$CC"; then
        skipped c_memcpy w3 apt-get-install-gcc
        skipped c_memcpy_fresh w3 apt-get-install-gcc
    elif build w3_memcpy "$CC" -O2 -std=gnu11 -I"$HERE/.." "$HERE/w3_memcpy.c" \
        -o "$BUILD/w3_memcpy"; then
        step c_memcpy w3 "$BUILD/w3_memcpy" "$W23_REPS"
    else
        echo "peer=c_memcpy workload=w3 status=failed reason=build"
    fi
fi

# ---- W4: a buffer handed to another process, in each scheduler setup
if wants w4; then
    C_W4=0
    if ! have "$CC"; then
        echo "# W4 C peers: no C compiler"
    elif build w4_handoff "$CC" -O2 -std=gnu11 -I"$HERE/.." "$HERE/w4_handoff.c" \
        -o "$BUILD/w4_handoff"; then
        C_W4=1
    fi
    PY_PEERS=py_pipe_msg64,py_shm_pipe
    if [ -x "$PY" ] && py_finds torch; then PY_PEERS=$PY_PEERS,torch_mp_fd,torch_mp_fs; fi
    for variant in $W4_VARIANTS; do
        pin=()
        case "$variant" in
            w4) as=(env -u W4_PIN "W4_ID=$variant") ;;
            w4_1cpu)
                if ! have taskset; then
                    skipped all "$variant" apt-get-install-util-linux
                    continue
                fi
                as=(env -u W4_PIN "W4_ID=$variant")
                pin=(taskset -c 0) ;;
            w4_2cpu) as=(env W4_PIN=split "W4_ID=$variant") ;;
            *) echo "# unknown W4 variant $variant"; continue ;;
        esac
        for mode in pipe_copy socket_copy memfd_scm msg64 msg64_2sock shm_spin; do
            if [ $C_W4 = 0 ]; then
                skipped "c_$mode" "$variant" apt-get-install-gcc
                continue
            fi
            for size in ${W4_SIZES//,/ }; do
                step "c_$mode" "$variant" "${as[@]}" "${pin[@]}" \
                    "$BUILD/w4_handoff" $mode "$size" "$W4_SECONDS"
            done
        done
        if [ ! -x "$PY" ]; then
            for p in py_pipe_msg64 py_shm_pipe; do skipped $p "$variant" apt-get-install-python3; done
        else
            step py_w4 "$variant" "${as[@]}" "${pin[@]}" \
                "$PY" "$HERE/w4_handoff.py" "$PY_PEERS" "$W4_SIZES" "$W4_SECONDS"
        fi
        case $PY_PEERS in
            *torch*) ;;
            *) for p in torch_mp_fd torch_mp_fs; do skipped $p "$variant" apt-get-install-python3-torch; done ;;
        esac
    done
    # iceoryx runs its own daemon, once for every variant; not under `timeout`
    # (each of its steps is), so that an interrupt reaches its clean-up at once.
    if [ "${W4_IOX:-1}" != 0 ]; then
        bash "$HERE/iceoryx/run.sh"
    fi
fi
# ---- W5: a stream of fresh tensors, in each scheduler setup (w5_frames is
# ipcref's own two programs: no peer). One process per peer, stream and size
# for the C peer; one per peer for the Python ones (torch imported once).
w5_ids() { # the workload ids of setup $1: <setup>_<stream>
    local s
    for s in $W5_STREAMS; do printf '%s_%s ' "$1" "$s"; done
}
if wants w5; then
    C_W5=0
    if ! have "$CC"; then
        echo "# W5 C peer: no C compiler"
    elif build w5_memfd "$CC" -O2 -std=gnu11 -I"$HERE/.." "$HERE/w5_memfd.c" \
        -o "$BUILD/w5_memfd"; then
        C_W5=1
    fi
    PY_W5=py_shm
    if [ -x "$PY" ] && py_finds torch; then PY_W5="py_shm torch_mp_fd torch_mp_fs"; fi
    for variant in $W5_VARIANTS; do
        pin=()
        case "$variant" in
            w5_frames) continue ;;
            w5_1cpu)
                if ! have taskset; then
                    skipped all "$(w5_ids "$variant")" apt-get-install-util-linux
                    continue
                fi
                as=(env -u W5_PIN "W5_ID=$variant")
                pin=(taskset -c 0) ;;
            w5_2cpu) as=(env W5_PIN=split "W5_ID=$variant") ;;
            *) echo "# unknown W5 variant $variant"; continue ;;
        esac
        for stream in $W5_STREAMS; do
            if [ $C_W5 = 0 ]; then
                skipped c_memfd_fresh "${variant}_$stream" apt-get-install-gcc
                continue
            fi
            sizes=$W5_SIZES
            [ "$stream" = mixed ] && sizes=0
            for size in ${sizes//,/ }; do
                step c_memfd_fresh "${variant}_$stream" "${as[@]}" "${pin[@]}" \
                    "$BUILD/w5_memfd" "$stream" "$size" "$W5_SECONDS"
            done
        done
        if [ ! -x "$PY" ]; then
            skipped py_shm "$(w5_ids "$variant")" apt-get-install-python3
        else
            for p in $PY_W5; do
                step "$p" "$variant" "${as[@]}" "${pin[@]}" "$PY" "$HERE/w5_stream.py" \
                    "$p" "${W5_STREAMS// /,}" "$W5_SIZES" "$W5_SECONDS"
            done
        fi
        case $PY_W5 in
            *torch*) ;;
            *) for p in torch_mp_fd torch_mp_fs; do
                   skipped $p "$(w5_ids "$variant")" apt-get-install-python3-torch
               done ;;
        esac
    done
fi
# ---- W6: Python to Python (fresh tensors, one small tensor re-sent, a
# DataLoader epoch); one process per peer, which prints its own skipped lines
# when numpy or torch does not import and runs the W6_WORKLOADS it has.
if wants w6; then
    for p in torch_mp_fd torch_mp_fs mp_shared_memory numpy_pipe torch_dataloader; do
        if [ ! -x "$PY" ]; then
            has="fresh resend"
            [ $p = torch_dataloader ] && has=dataloader
            for wl in $W6_WORKLOADS; do
                case " $has " in
                    *" $wl "*) echo "peer=$p workload=w6_$wl status=skipped reason=apt-get-install-python3" ;;
                esac
            done
            continue
        fi
        step "$p" w6 "$PY" "$HERE/w6_python.py" "$p" "${W6_WORKLOADS// /,}"
    done
fi
echo "# peers: done in ${SECONDS}s"
