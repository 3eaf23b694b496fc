"""A child forked (os.fork) from a process that already has a Context:
it makes a Context of its own and shares through it; the parent's Context
is the parent's (using it in the child raises ipcref.Error EDEAD, never
crashes) and the parent's stats do not move."""

import os

import numpy as np
import pytest

import ipcref
from conftest import EDEAD, WAIT, abstract_path, seqpacket_pair


def _busy_parent(make_pair):
    """A parent context with something in every column: a buffer of its
    own, a peer, an array its consumer holds."""
    pair = make_pair()
    own = pair.prod.empty(100, "float64")
    own[:] = 1.5
    held, _ = pair.roundtrip(own[::2])
    return pair, own, held


def _child_shares_with_parent(sock, path):
    with ipcref.Context() as ctx:
        peer = ctx.adopt(sock)
        arr = ctx.empty((4, 5), "int32")
        arr[...] = np.arange(20).reshape(4, 5)
        peer.send(arr, meta={"pid": os.getpid()})
        peer.send(np.arange(3.0))
        back, meta = peer.recv(timeout=WAIT)
        assert meta == b"back" and back.tolist() == [10, 20]
        # and a listener of the child's own, which the parent connects to
        with ctx.listen(path) as lst:
            peer.send(np.zeros(1), meta=b"listening")
            with lst.accept(timeout=WAIT) as p2:
                p2.send(arr.T)
                p2.recv(timeout=WAIT)


def test_forked_child_with_its_own_context(procs, make_pair):
    pair, own, held = _busy_parent(make_pair)
    before = pair.prod.stats(), pair.cons.stats()
    a, b = seqpacket_pair()
    path = abstract_path()
    pid = procs.fork(_child_shares_with_parent, b, path, close=[a])
    b.close()
    with ipcref.Context() as ctx2:
        peer = ctx2.adopt(a)
        arr, meta = peer.recv(timeout=WAIT)
        assert meta == {"pid": pid} and peer.pid == pid
        assert arr.tolist() == np.arange(20).reshape(4, 5).tolist()
        x, _ = peer.recv(timeout=WAIT)
        assert x.tolist() == [0.0, 1.0, 2.0]
        peer.send(np.array([10, 20]), meta=b"back")
        _, meta = peer.recv(timeout=WAIT)
        assert meta == b"listening"
        with ctx2.connect(path) as p2:
            t, _ = p2.recv(timeout=WAIT)
            assert t.tolist() == np.arange(20).reshape(4, 5).T.tolist()
            p2.send(np.zeros(1))
            procs.expect_ok(pid)
        peer.close()
    # the parent's first contexts: untouched, and still working
    assert (pair.prod.stats(), pair.cons.stats()) == before
    assert held.tolist() == [1.5] * 50
    got, _ = pair.roundtrip(own[:3])
    assert got.tolist() == [1.5] * 3


def _sibling(sock, role):
    with ipcref.Context() as ctx:
        peer = ctx.adopt(sock)
        if role == "producer":
            arr = ctx.empty(1000, "uint16")
            arr[:] = np.arange(1000)
            peer.send([arr, arr[::-7]], meta=b"sib")
            peer.recv(timeout=WAIT)
        else:
            (x, y), meta = peer.recv(timeout=WAIT)
            assert meta == b"sib"
            assert x.tolist() == list(range(1000))
            assert y.tolist() == list(range(999, -1, -7))
            peer.send(np.zeros(1))


def test_forked_siblings_share(procs, make_pair):
    pair, own, held = _busy_parent(make_pair)
    before = pair.prod.stats(), pair.cons.stats()
    a, b = seqpacket_pair()
    p1 = procs.fork(_sibling, a, "producer", close=[b])
    p2 = procs.fork(_sibling, b, "consumer", close=[a])
    a.close(), b.close()
    procs.expect_ok(p2)
    procs.expect_ok(p1)
    assert (pair.prod.stats(), pair.cons.stats()) == before
    assert held.tolist() == [1.5] * 50


def _uses_parents_context(pair, own, report):
    """Every call on the parent's objects: Error EDEAD (or ValueError once
    closed), never a crash. Writes a line per call to `report`."""
    calls = [
        ("ctx.stats", lambda: pair.prod.stats()),
        ("ctx.empty", lambda: pair.prod.empty(3)),
        ("ctx.listen", lambda: pair.prod.listen(abstract_path())),
        ("ctx.connect", lambda: pair.prod.connect(abstract_path())),
        ("ctx.adopt", lambda: pair.prod.adopt(seqpacket_pair()[0])),
        ("peer.send copy", lambda: pair.tx.send(np.arange(3))),
        ("peer.send zero-copy", lambda: pair.tx.send(own)),
        ("peer.recv", lambda: pair.rx.recv(timeout=0)),
        ("peer.recv wait", lambda: pair.rx.recv(timeout=0.1)),
        ("peer.stats", lambda: pair.tx.stats()),
        ("peer.set_options", lambda: pair.tx.set_options(send_timeout=1)),
    ]
    bad = []
    for name, call in calls:
        try:
            call()
        except ipcref.Error as e:
            if (e.code, e.name) != (EDEAD, "EDEAD"):
                bad.append("%s: %d %s (%s)" % (name, e.code, e.name, e))
        except Exception as e:
            bad.append("%s: %s %s" % (name, type(e).__name__, e))
        else:
            bad.append("%s: no error" % name)
    # the parent's memory stays readable in the child
    assert own.tolist() == [1.5] * 100
    # closing the parent's objects in the child is harmless ...
    pair.tx.close(), pair.rx.close(), pair.prod.close(), pair.cons.close()
    with pytest.raises(ValueError):
        pair.prod.stats()
    # ... and the child's own context works
    with ipcref.Context() as ctx:
        e = ctx.empty(2)
        e[:] = 3
        assert ctx.stats()["live_bufs"] == 1
    os.write(report, ("\n".join(bad) + "\n").encode())


def test_parents_context_in_child_raises_edead(procs, make_pair):
    pair, own, held = _busy_parent(make_pair)
    before = pair.prod.stats(), pair.cons.stats()
    r, w = os.pipe()
    pid = procs.fork(_uses_parents_context, pair, own, w, close=[r])
    os.close(w)
    procs.expect_ok(pid)
    with os.fdopen(r) as f:
        bad = f.read().strip()
    assert bad == "", "calls that did not raise Error EDEAD:\n" + bad
    assert (pair.prod.stats(), pair.cons.stats()) == before
    got, _ = pair.roundtrip(own[:2])  # the parent's pair still works
    assert got.tolist() == [1.5, 1.5]


def _parents_fd_calls(pair, report):
    bad = []
    for name, call in [("ctx.fileno", pair.prod.fileno),
                       ("ctx.collect", pair.prod.collect),
                       ("peer.pid", lambda: pair.tx.pid),
                       ("peer.fileno", pair.rx.fileno)]:
        try:
            v = call()
        except ipcref.Error as e:
            if (e.code, e.name) != (EDEAD, "EDEAD"):
                bad.append("%s: %d %s" % (name, e.code, e.name))
        else:
            bad.append("%s: returned %r" % (name, v))
    os.write(report, ("\n".join(bad) + "\n").encode())


def test_parents_context_in_child_fileno_collect_pid(procs, make_pair):
    """fileno(), collect() and pid too raise Error EDEAD in the child (they
    once returned -1, 0 and 0 silently)."""
    pair, own, held = _busy_parent(make_pair)
    r, w = os.pipe()
    pid = procs.fork(_parents_fd_calls, pair, w, close=[r])
    os.close(w)
    procs.expect_ok(pid)
    with os.fdopen(r) as f:
        bad = f.read().strip()
    assert bad == "", bad


def _sends_parents_memory(sock, own):
    with ipcref.Context() as ctx, ctx.adopt(sock) as peer:
        peer.send(own[:4])  # memory the child inherited: to be copied
        peer.recv(timeout=WAIT)


def test_child_sends_parents_memory_through_its_own_context(procs,
                                                            make_pair):
    pair, own, held = _busy_parent(make_pair)
    a, b = seqpacket_pair()
    pid = procs.fork(_sends_parents_memory, b, own, close=[a])
    b.close()
    with ipcref.Context() as ctx, ctx.adopt(a) as peer:
        try:
            got, _ = peer.recv(timeout=WAIT)
            assert got.tolist() == [1.5] * 4
            peer.send(np.zeros(1))
        finally:
            code = procs.wait(pid)
    assert code == 0, "the child could not send (99: it raised)"


def _leave_the_with_block(lst):
    with lst:
        pass


def test_forked_child_closing_the_listener_keeps_its_path(procs, tmp_path):
    """A forked child that closes the parent's listener (leaving its
    `with` block) closes its copy of the socket only: the path, the
    parent's, stays (it was unlinked, and nobody could connect any more)."""
    path = str(tmp_path / "lst.sock")
    with ipcref.Context() as ctx, ctx.listen(path) as lst:
        procs.expect_ok(procs.fork(_leave_the_with_block, lst))
        assert os.path.exists(path)
        with ipcref.Context() as c2, c2.connect(path) as peer:
            with lst.accept(timeout=WAIT) as back:
                back.send(np.arange(2))
                assert peer.recv(timeout=WAIT)[0].tolist() == [0, 1]
    assert not os.path.exists(path)  # the parent's close removes it
