"""Event loops and threads: Peer.fileno() with selectors, and the GIL
released while a receive waits."""

import os
import selectors
import threading
import time

import numpy as np
import pytest

import ipcref
from conftest import WAIT, abstract_path, holding, seqpacket_pair


def drain(peer, sel):
    """Takes the wake-ups that carry no message (the other side's hello):
    after it, the fd is quiet until something is sent."""
    deadline = time.monotonic() + WAIT
    while sel.select(0):
        with pytest.raises((ipcref.Timeout, ipcref.WouldBlock)):
            peer.recv(timeout=0)
        assert time.monotonic() < deadline, "fd stays readable"


def test_fileno_with_selectors(pair):
    fd = pair.rx.fileno()
    assert isinstance(fd, int) and fd >= 0
    assert pair.rx.fileno() == fd  # the same every call
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        pair.nothing_waits()
        drain(pair.rx, sel)
        assert sel.select(0) == []
        pair.tx.send(np.arange(3), meta=b"one")
        assert sel.select(WAIT), "not readable after a send"
        got, meta = pair.rx.recv(timeout=0)
        assert meta == b"one" and got.tolist() == [0, 1, 2]
        assert sel.select(0) == []


def test_fileno_batches(pair):
    """A batch wakes the fd once and one recv returns the whole list; two
    queued batches, two receives."""
    with selectors.DefaultSelector() as sel:
        sel.register(pair.rx.fileno(), selectors.EVENT_READ)
        pair.nothing_waits()
        drain(pair.rx, sel)
        n = ipcref.MAX_BATCH
        pair.tx.send([np.full(3, k) for k in range(n)], meta=b"b1")
        pair.tx.send((np.zeros(1), pair.prod.empty(2)), meta=b"b2")
        assert sel.select(WAIT)
        got, meta = pair.rx.recv(timeout=0)
        assert meta == b"b1" and len(got) == n
        assert [g.tolist() for g in got] == [[k] * 3 for k in range(n)]
        assert sel.select(WAIT), "the second batch does not wake the fd"
        got, meta = pair.rx.recv(timeout=0)
        assert meta == b"b2" and len(got) == 2
        assert sel.select(0) == []
        with pytest.raises(ipcref.Timeout):
            pair.rx.recv(timeout=0)


def _paced_producer(sock, n):
    with ipcref.Context() as ctx, ctx.adopt(sock) as peer:
        for i in range(n):
            time.sleep(0.02)
            if i % 2:
                peer.send([np.full(4, i), np.full(2, -i)], meta=i)
            else:
                peer.send(np.full(4, i), meta=i)
        peer.recv(timeout=WAIT)


def test_fileno_event_loop_across_processes(procs):
    """An event loop that only receives when the fd says so gets every
    message, whole, from another process."""
    a, b = seqpacket_pair()
    n = 10
    pid = procs.fork(_paced_producer, a, n, close=[b])
    a.close()
    with ipcref.Context() as ctx, ctx.adopt(b) as peer, \
            selectors.DefaultSelector() as sel:
        sel.register(peer.fileno(), selectors.EVENT_READ)
        got = []
        deadline = time.monotonic() + WAIT
        while len(got) < n:
            assert time.monotonic() < deadline, got
            for _ in sel.select(1.0):
                try:
                    obj, meta = peer.recv(timeout=0)
                except (ipcref.Timeout, ipcref.WouldBlock):
                    continue  # a wake-up with no message (the hello)
                got.append((meta, obj))
        for i, (meta, obj) in enumerate(got):
            assert meta == i
            if i % 2:
                assert [o.tolist() for o in obj] == [[i] * 4, [-i] * 2]
            else:
                assert obj.tolist() == [i] * 4
        peer.send(np.zeros(1))
        procs.expect_ok(pid)


def test_gil_released_while_recv_waits(pair):
    """A thread blocked in recv(timeout=5) does not stop the others: a
    counter runs on, the main thread sends, and the receive returns."""
    pair.nothing_waits()
    count = [0]
    stop = threading.Event()
    result = []

    def counter():
        while not stop.is_set():
            count[0] += 1
            time.sleep(0.001)

    def receiver():
        try:
            result.append(pair.rx.recv(timeout=5))
        except BaseException as e:  # reported below
            result.append(e)

    rt = threading.Thread(target=receiver)
    ct = threading.Thread(target=counter)
    rt.start()
    time.sleep(0.05)  # the receiver is in recv now
    ct.start()
    t0 = time.monotonic()
    c0 = count[0]
    time.sleep(0.5)
    assert count[0] - c0 >= 20, "the counter stalled while recv waited"
    assert rt.is_alive() and not result
    pure_python = sum(range(100000))  # the main thread runs too
    assert pure_python == 4999950000
    pair.tx.send(np.arange(4), meta=b"wake")
    rt.join(WAIT)
    stop.set()
    ct.join(WAIT)
    assert not rt.is_alive()
    assert time.monotonic() - t0 < 4.5, "recv did not return on the send"
    assert not isinstance(result[0], BaseException), result[0]
    got, meta = result[0]
    assert meta == b"wake" and got.tolist() == [0, 1, 2, 3]


def test_gil_released_while_timing_out(pair):
    pair.nothing_waits()
    count = [0]
    stop = threading.Event()

    def counter():
        while not stop.is_set():
            count[0] += 1
            time.sleep(0.001)

    ct = threading.Thread(target=counter)
    ct.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(ipcref.Timeout):
            pair.rx.recv(timeout=0.5)
        assert time.monotonic() - t0 >= 0.4
    finally:
        stop.set()
        ct.join(WAIT)
    assert count[0] >= 20


def test_one_peer_one_thread_at_a_time(pair):
    """A second thread's call on a Peer in use is refused (RuntimeError),
    not raced; the Peer works on after."""
    pair.nothing_waits()
    result = []
    t = threading.Thread(
        target=lambda: result.append(pair.rx.recv(timeout=WAIT)))
    t.start()
    time.sleep(0.2)
    with pytest.raises(RuntimeError, match="another thread"):
        pair.rx.recv(timeout=0)
    with pytest.raises(RuntimeError):
        pair.rx.close()  # not while in use
    with pytest.raises(RuntimeError):
        pair.cons.close()  # nor its context
    pair.tx.send(np.ones(2), meta=b"x")
    t.join(WAIT)
    assert not t.is_alive() and result[0][1] == b"x"
    got, _ = pair.roundtrip(np.zeros(3))
    assert got.tolist() == [0, 0, 0]


def test_threads_with_their_own_peers():
    """Threads each on their own Peer (of one Context) run side by side."""
    a, b = seqpacket_pair()
    c, d = seqpacket_pair()
    with ipcref.Context() as prod, ipcref.Context() as cons:
        tx1, tx2 = prod.adopt(a), prod.adopt(c)
        rx1, rx2 = cons.adopt(b), cons.adopt(d)
        errors = []

        def pump(tx, rx, k):
            try:
                for i in range(300):
                    arr = prod.empty(64, "int32") if i % 2 else np.empty(64)
                    arr[:] = i * k
                    tx.send(arr, meta=i)
                    got, meta = rx.recv(timeout=WAIT)
                    assert meta == i and (got == i * k).all()
            except BaseException as e:
                errors.append(e)

        ts = [threading.Thread(target=pump, args=(tx1, rx1, 1)),
              threading.Thread(target=pump, args=(tx2, rx2, 2))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(WAIT)
        assert not any(t.is_alive() for t in ts)
        assert errors == []
        for p in (tx1, tx2, rx1, rx2):
            p.close()
        prod.collect()
        assert prod.stats()["live_slots"] == 0


def test_non_blocking_peer_would_block_then_wakes_for_room(pair):
    """A peer accepted from a blocking=False listener never waits: a send
    past max_bytes_held raises WouldBlock (a BlockingIOError) and sends
    nothing; its fileno() wakes once the consumer lets go, and the send
    goes then."""
    lst = pair.prod.listen(abstract_path(), blocking=False)
    try:
        rx = pair.cons.connect(lst.path)
        with selectors.DefaultSelector() as sel:
            sel.register(lst.fileno(), selectors.EVENT_READ)
            assert sel.select(WAIT)
        tx = lst.accept(timeout=0)
    finally:
        lst.close()
    with tx, rx:
        tx.set_options(max_bytes_held=100_000)
        tx.send(np.zeros(16384, np.float32))  # 64 KiB: under the cap
        held, _ = rx.recv(timeout=WAIT)
        before = holding(pair.prod)
        with pytest.raises(ipcref.WouldBlock) as ei:
            tx.send(np.ones(16384, np.float32))
        assert isinstance(ei.value, BlockingIOError)
        del ei  # its traceback holds this frame: a cycle keeping `got`
        assert holding(pair.prod) == before
        with pytest.raises(ipcref.Timeout):
            rx.recv(timeout=0)  # nothing was sent
        with selectors.DefaultSelector() as sel:
            sel.register(tx.fileno(), selectors.EVENT_READ)
            del held
            assert sel.select(WAIT), "no wake-up when room came back"
        tx.send(np.ones(16384, np.float32))
        got, _ = rx.recv(timeout=WAIT)
        assert got.sum() == 16384


def test_listen_on_a_filesystem_path(pair, tmp_path):
    path = str(tmp_path / "ipcref.sock")
    with pair.prod.listen(path) as lst:
        assert os.path.exists(path)
        with pair.cons.connect(path) as rx, lst.accept(timeout=WAIT) as tx:
            tx.send(np.arange(3), meta=b"fs")
            got, meta = rx.recv(timeout=WAIT)
            assert meta == b"fs" and got.tolist() == [0, 1, 2]
    assert not os.path.exists(path)  # close unlinks it
    with pytest.raises(ipcref.PeerGone):
        pair.cons.connect(path)


def test_very_long_timeouts(pair):
    pair.tx.send(np.arange(2))
    got, _ = pair.rx.recv(timeout=1e7)
    assert got.tolist() == [0, 1]
