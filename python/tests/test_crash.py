"""Processes that die: a consumer SIGKILLed while it holds arrays gives back
every lease (the producer's collect() sees to it); a producer that exits or
is killed leaves its consumer's arrays intact, byte for byte."""

import os
import select
import signal
import time

import numpy as np
import pytest

import ipcref
from conftest import WAIT, poll_until, read_byte, seqpacket_pair

N_MSGS = 12
SIZE = 64 * 1024  # bytes per array


def pattern(i, n=SIZE // 8):
    """The bytes of message i: distinct per message and per position."""
    return (np.arange(n, dtype=np.uint64) * np.uint64(2654435761)
            + np.uint64(i * 7919)).astype(np.uint64)


def _holding_consumer(sock, report):
    ctx = ipcref.Context()
    peer = ctx.adopt(sock)
    held = []
    for _ in range(N_MSGS + 1):
        held.append(peer.recv(timeout=WAIT)[0])
    os.write(report, b"k")
    time.sleep(120)  # holds on until killed
    return 5


def test_killed_consumer_gives_back_its_leases(procs):
    a, b = seqpacket_pair()
    r, w = os.pipe()
    pid = procs.fork(_holding_consumer, b, w, close=[a, r])
    b.close(), os.close(w)
    with ipcref.Context() as ctx:
        peer = ctx.adopt(a)
        own = []
        for i in range(N_MSGS):
            if i % 2:
                arr = ctx.empty(SIZE // 8, "uint64")  # zero copy
                arr[:] = pattern(i)
                own.append(arr)
            else:
                arr = pattern(i)  # copied into a block of ours
            peer.send(arr[::-1] if i % 3 == 0 else arr, meta=i)
        peer.send([pattern(100, 16), own[0][:16]], meta=b"batch")
        read_byte(r)
        s = ctx.stats()
        assert s["live_slots"] >= N_MSGS, s
        assert peer.stats()["leases"] >= N_MSGS
        assert peer.stats()["alive"] is True

        os.kill(pid, signal.SIGKILL)
        assert procs.wait(pid) == -signal.SIGKILL
        # The context's fd tells that a process it deals with died.
        rd, _, _ = select.select([ctx.fileno()], [], [], WAIT)
        assert rd, "ctx.fileno() not readable after its consumer died"

        def reclaimed():
            s = ctx.stats()
            return s["live_slots"] == 0 and s["limbo_blocks"] == 0 \
                and s["limbo_bytes"] == 0
        assert poll_until(reclaimed, timeout=10, tick=ctx.collect), \
            ctx.stats()
        # what the producer itself holds is still there and intact
        assert ctx.stats()["live_bufs"] == len(own)
        for k, arr in enumerate(own):
            assert np.array_equal(arr, pattern(2 * k + 1))
        with pytest.raises(ipcref.PeerGone):
            peer.send(np.zeros(1))
        assert peer.stats()["alive"] is False
        peer.close()
        del own, arr
        ctx.collect()
        assert ctx.stats()["live_bufs"] == 0
    os.close(r)


def _exiting_producer(sock, go, how):
    ctx = ipcref.Context(isolate=(how == "isolated"))
    peer = ctx.adopt(sock)
    for i in range(N_MSGS):
        if i % 2:
            arr = ctx.empty(SIZE // 8, "uint64")
            arr[:] = pattern(i)
        else:
            arr = pattern(i)
        peer.send(arr if i % 3 else arr[::-1], meta=i)
    read_byte(go)  # the consumer received the first N_MSGS
    for i in range(N_MSGS, 2 * N_MSGS):  # queued, received after we are gone
        arr = ctx.empty(SIZE // 8, "uint64")
        arr[:] = pattern(i)
        peer.send(arr, meta=i)
    if how == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(0)  # nothing closed: the process just ends


@pytest.mark.parametrize("how", ["exits", "killed", "isolated"])
def test_consumer_keeps_arrays_of_a_dead_producer(procs, how):
    a, b = seqpacket_pair()
    r, w = os.pipe()
    pid = procs.fork(_exiting_producer, b, r, how, close=[a, w])
    b.close(), os.close(r)

    def expected(i):
        p = pattern(i)
        return p if i % 3 or i >= N_MSGS else p[::-1]

    with ipcref.Context() as ctx:
        peer = ctx.adopt(a)
        got = []
        for i in range(N_MSGS):
            arr, meta = peer.recv(timeout=WAIT)
            assert meta == i
            got.append(arr)
        # Read while the producer lives and exits under our feet.
        os.write(w, b"g")
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            for i, arr in enumerate(got):
                assert np.array_equal(arr, expected(i)), i
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                procs.pids.remove(pid)
                break
        else:
            pytest.fail("the producer did not end")
        # What it sent before it ended arrives whole.
        for i in range(N_MSGS, 2 * N_MSGS):
            arr, meta = peer.recv(timeout=WAIT)
            assert meta == i
            got.append(arr)
        with pytest.raises(ipcref.PeerGone):
            peer.recv(timeout=WAIT)
        ctx.collect()
        junk = [np.full(SIZE // 8, 0xAB, np.uint64) for _ in range(64)]
        for i, arr in enumerate(got):
            assert np.array_equal(arr, expected(i)), "message %d changed" % i
        del junk
        peer.close()
        ctx.collect()
        for i, arr in enumerate(got):  # still mapped while we hold them
            assert arr.dtype == np.uint64 and arr.shape == (SIZE // 8,)
        del got, arr
        ctx.collect()
        assert ctx.stats()["mapped_segments"] == 0
    os.close(w)
