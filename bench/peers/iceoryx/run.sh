#!/usr/bin/env bash
# W4 peers iceoryx and iceoryx_waitset (w4_iceoryx.c): Eclipse iceoryx's
# zero-copy publish/subscribe through its C binding, as Debian 12 ships it
# (packages iceoryx and libiceoryx-binding-c-dev, 2.0.x). Builds w4_iceoryx.c
# into a temporary folder, starts its own RouDi daemon (iox-roudi -c roudi.toml),
# runs every W4 variant x wait mode x size, and stops RouDi again: on exit, on
# an interrupt or a hang-up, and (through setpriv --pdeathsig) when this script
# itself is killed. Prints the W4 lines of ../w4_handoff.c's format, or
#   peer=iceoryx workload=<id> status=skipped reason=<why>
# when iceoryx is not installed or another RouDi runs.
# iceoryx 2.0 allows one RouDi per machine, at fixed names (/tmp/roudi,
# /tmp/iox-unique-roudi.lock, /dev/shm/iceoryx_mgmt, /dev/shm/<group>), which no
# option moves. So this script never touches a RouDi it did not start: when one
# runs (any user's), the iceoryx peers are skipped. Its own clients use names
# no one else does (runtime ipcref-w4-<pid>-a/-b, service ipcref_bench, instance
# <pid>), and the config is this folder's roudi.toml, not /etc/iceoryx.
# Usage: bash bench/peers/iceoryx/run.sh   (run_peers.sh runs it for W4)
# Knobs (env): W4_SIZES, W4_SECONDS, W4_VARIANTS, STEP_TIMEOUT, CC (as for the
#   other W4 peers); IOX_WAITS (default "poll waitset"), IOX_CONFIG (a RouDi
#   config, default roudi.toml here), IOX_INCLUDE (the folder that holds
#   iceoryx_binding_c/, default the newest /usr/include/iceoryx/v*).
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
W4_SIZES="${W4_SIZES:-4096,1048576,67108864}"
W4_SECONDS="${W4_SECONDS:-1.0}"
W4_VARIANTS="${W4_VARIANTS:-w4 w4_1cpu w4_2cpu}"
STEP_TIMEOUT="${STEP_TIMEOUT:-120}"
CC="${CC:-gcc}"
WAITS="${IOX_WAITS:-poll waitset}"
CONFIG="${IOX_CONFIG:-$HERE/roudi.toml}"

peer_of() { if [ "$1" = poll ]; then echo iceoryx; else echo "iceoryx_$1"; fi; }
skip_all() { # every variant and wait mode: skipped for reason $1
    local v w
    for v in $W4_VARIANTS; do
        for w in $WAITS; do
            echo "peer=$(peer_of "$w") workload=$v status=skipped reason=$1"
        done
    done
    exit 0
}

# ---- installed?
command -v iox-roudi >/dev/null 2>&1 || skip_all apt-get-install-iceoryx
INC="${IOX_INCLUDE:-}"
if [ -z "$INC" ]; then
    for d in /usr/include/iceoryx/v* /usr/local/include/iceoryx/v*; do
        [ -f "$d/iceoryx_binding_c/publisher.h" ] && INC=$d # the glob sorts: last = newest
    done
fi
if [ -z "$INC" ] || [ ! -f "$INC/iceoryx_binding_c/publisher.h" ]; then
    skip_all apt-get-install-libiceoryx-binding-c-dev
fi
command -v "$CC" >/dev/null 2>&1 || skip_all apt-get-install-gcc
[ -r "$CONFIG" ] || skip_all "no-roudi-config-at-$CONFIG"
# A loan larger than every mempool aborts the process: sizes above the largest
# pool are skipped. (The config's pools: `size = <bytes>` lines.)
LARGEST="$(awk -F= '/^[[:space:]]*size[[:space:]]*=/ { v = $2 + 0; if (v > m) m = v } END { print m + 0 }' "$CONFIG")"

# ---- someone else's RouDi?
OTHER="$(pgrep -x iox-roudi | tr '\n' ' ')"
[ -z "$OTHER" ] || skip_all "another-iox-roudi-runs(pid-${OTHER% })"
if [ -e /tmp/iox-unique-roudi.lock ] && command -v flock >/dev/null 2>&1 &&
    ! flock -n /tmp/iox-unique-roudi.lock true 2>/dev/null; then
    skip_all another-iox-roudi-holds-/tmp/iox-unique-roudi.lock
fi

BUILD="$(mktemp -d "${TMPDIR:-/tmp}/ipcref-iceoryx.XXXXXX")"
ROUDI_PID="" STEP_PID=""
dead_clients() { # the sockets our killed clients left in /tmp, one a line
    local f pid
    for f in /tmp/ipcref-w4-*-a /tmp/ipcref-w4-*-b /tmp/ipcref-w4-*-[ab].lock; do
        [ -O "$f" ] || continue
        pid="${f#/tmp/ipcref-w4-}"
        pid="${pid%%-*}"
        kill -0 "$pid" 2>/dev/null || echo "$f"
    done
}
stop_roudi() { # SIGTERM, then SIGKILL after 10 s; only the RouDi started here
    local rc shm
    [ -n "$ROUDI_PID" ] || return 0
    kill -TERM "$ROUDI_PID" 2>/dev/null
    for _ in $(seq 100); do
        kill -0 "$ROUDI_PID" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$ROUDI_PID" 2>/dev/null; then
        kill -KILL "$ROUDI_PID" 2>/dev/null
        echo "# iox-roudi $ROUDI_PID ignored SIGTERM for 10 s: killed" >&2
    fi
    wait "$ROUDI_PID" 2>/dev/null
    rc=$?
    ROUDI_PID=""
    # 0, or 143 when the SIGTERM came before its handler was in place
    [ $rc = 0 ] || [ $rc = 143 ] || {
        echo "# iox-roudi exited with status $rc: $(tail -c 300 "$BUILD/roudi.log" | tr '\n' ' ')" >&2
        # It did not remove its files: ours, unless another RouDi runs by now.
        pgrep -x iox-roudi >/dev/null && return 0
        for shm in iceoryx_mgmt $(sed -n 's/.*in the shared memory \[\(.*\)\].*/\1/p' "$BUILD/roudi.log"); do
            [ -O "/dev/shm/$shm" ] && rm -f "/dev/shm/$shm"
        done
        for f in /tmp/roudi /tmp/roudi.lock /tmp/iox-unique-roudi.lock; do
            [ -O "$f" ] && rm -f "$f"
        done
    }
    return 0
}
cleanup() {
    if [ -n "$STEP_PID" ]; then # timeout passes the TERM on: the clients leave RouDi
        kill -TERM "$STEP_PID" 2>/dev/null
        wait "$STEP_PID" 2>/dev/null
    fi
    # A client that could not leave: RouDi's monitoring drops it within about
    # 1.5 s; stopped before that, RouDi 2.0 aborts.
    [ -z "$(dead_clients)" ] || sleep 2
    stop_roudi
    dead_clients | xargs -r rm -f
    rm -rf "$BUILD"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP
trap 'exit 141' PIPE

# ---- build
if ! "$CC" -O2 -std=gnu11 -Wall -I"$INC" -I"$HERE/../.." "$HERE/w4_iceoryx.c" \
    -o "$BUILD/w4_iceoryx" -liceoryx_binding_c 2>"$BUILD/build.log"; then
    grep -q 'cannot find -liceoryx_binding_c' "$BUILD/build.log" &&
        skip_all apt-get-install-libiceoryx-binding-c-dev
    echo "# build of w4_iceoryx.c failed: $(head -c 300 "$BUILD/build.log" | tr '\n' ' ')"
    skip_all build-failed
fi

# ---- RouDi: ours, with this folder's config; RouDi maps and zero-fills its
# mempools before it says it is ready
DEATHSIG=()
command -v setpriv >/dev/null 2>&1 && DEATHSIG=(setpriv --pdeathsig TERM)
"${DEATHSIG[@]}" iox-roudi -c "$CONFIG" -l info -k 3 >"$BUILD/roudi.log" 2>&1 &
ROUDI_PID=$!
for _ in $(seq 300); do # up to 30 s
    grep -q 'RouDi is ready for clients' "$BUILD/roudi.log" && break
    kill -0 "$ROUDI_PID" 2>/dev/null || break
    sleep 0.1
done
if ! grep -q 'RouDi is ready for clients' "$BUILD/roudi.log"; then
    echo "# iox-roudi did not start: $(tail -c 300 "$BUILD/roudi.log" | tr '\n' ' ')"
    skip_all iox-roudi-did-not-start
fi
echo "# iceoryx $(dpkg-query -W -f '${Version}' iceoryx 2>/dev/null || echo '?'):" \
    "iox-roudi pid $ROUDI_PID, config ${CONFIG##*/}, largest chunk $LARGEST bytes"

# ---- measurements
for variant in $W4_VARIANTS; do
    pin=()
    case $variant in
        w4) as=(env -u W4_PIN "W4_ID=$variant") ;;
        w4_1cpu)
            as=(env -u W4_PIN "W4_ID=$variant")
            pin=(taskset -c 0)
            command -v taskset >/dev/null 2>&1 || {
                for w in $WAITS; do
                    echo "peer=$(peer_of "$w") workload=$variant status=skipped reason=apt-get-install-util-linux"
                done
                continue
            } ;;
        w4_2cpu) as=(env W4_PIN=split "W4_ID=$variant") ;;
        *) echo "# unknown W4 variant $variant"; continue ;;
    esac
    for wait_mode in $WAITS; do
        peer="$(peer_of "$wait_mode")"
        for size in ${W4_SIZES//,/ }; do
            if [ "$size" -gt "$LARGEST" ]; then
                echo "peer=$peer workload=$variant size=$size status=skipped reason=no-mempool-of-${size}-bytes-in-${CONFIG##*/}"
                continue
            fi
            if ! kill -0 "$ROUDI_PID" 2>/dev/null; then
                echo "peer=$peer workload=$variant size=$size status=failed reason=iox-roudi-died"
                continue
            fi
            # in the background, so that a signal reaches the traps at once
            timeout -k 5 "$STEP_TIMEOUT" "${as[@]}" "${pin[@]}" \
                "$BUILD/w4_iceoryx" "$wait_mode" "$size" "$W4_SECONDS" >"$BUILD/step.out" 2>&1 &
            STEP_PID=$!
            wait "$STEP_PID"
            rc=$?
            STEP_PID=""
            # iceoryx may log to stdout: anything but a result line becomes a note
            sed -e '/^peer=/b' -e '/^#/b' -e 's/^/# /' "$BUILD/step.out"
            [ $rc = 0 ] || grep -q '^peer=.* status=failed' "$BUILD/step.out" ||
                echo "peer=$peer workload=$variant size=$size status=failed reason=exit-$rc"
        done
    done
done
