"""Bad input from Python: a clear exception, nothing sent, nothing leaked
(the context's stats unchanged)."""

import gc
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import ipcref
from conftest import RESULT_NAMES, WAIT, abstract_path, holding, \
    seqpacket_pair

BAD_OBJECTS = {
    "list_of_ints": [1, 2, 3],
    "str": "abc",
    "bytes": b"abc",
    "dict": {"a": np.zeros(1)},
    "int": 5,
    "none": None,
    "memoryview": memoryview(b"abcd"),
    "numpy_scalar": np.float32(1.0),
    "object_array": np.array([1, "a", None], dtype=object),
    "float128": np.zeros(3, dtype=np.longdouble),
    "datetime64": np.zeros(3, dtype="datetime64[s]"),
    "timedelta64": np.zeros(3, dtype="timedelta64[ms]"),
    "unicode_array": np.array(["ab", "cd"]),
    "bytes_array": np.array([b"ab", b"cd"]),
    "structured": np.zeros(2, dtype=[("a", "i4"), ("b", "f8")]),
    "big_endian": np.zeros(3, dtype=">i4"),
    "list_with_str": [np.zeros(2), "x"],
    "nested_list": [[np.zeros(2)]],
}


@pytest.mark.parametrize("name", sorted(BAD_OBJECTS))
def test_send_refuses_what_it_cannot_share(pair, name):
    before = holding(pair.prod)
    with pytest.raises(TypeError) as ei:
        pair.tx.send(BAD_OBJECTS[name])
    assert str(ei.value)
    assert holding(pair.prod) == before
    assert pair.nothing_waits()


def test_send_refuses_nine_dimensions(pair):
    before = holding(pair.prod)
    with pytest.raises((TypeError, ValueError), match="8"):
        pair.tx.send(np.zeros((1,) * 9, np.float32))
    with pytest.raises((TypeError, ValueError), match="8"):
        pair.tx.send(np.zeros((1,) * 32))  # numpy's own maximum
    got, _ = pair.roundtrip(np.arange(2.0).reshape((1,) * 7 + (2,)))
    assert got.shape == (1,) * 7 + (2,)
    del got
    pair.prod.collect()
    assert holding(pair.prod)["live_slots"] == before["live_slots"]


def test_empty_refuses_bad_shapes_and_dtypes(pair):
    ctx = pair.prod
    before = holding(ctx)
    for shape in [(-1,), (3, -2), -5]:
        with pytest.raises((ValueError, ipcref.Error)):
            ctx.empty(shape)
    with pytest.raises(ValueError, match="8"):
        ctx.empty((1,) * 9)
    for huge in [(1 << 62,), (1 << 40, 1 << 40)]:
        with pytest.raises((ValueError, MemoryError, ipcref.Error)):
            ctx.empty(huge, "float64")
    for dtype in ["float128", np.longdouble, object, "datetime64[s]", "U4",
                  "nonsense", np.dtype(">i4")]:
        with pytest.raises(TypeError, match="cannot share"):
            ctx.empty(3, dtype)
    with pytest.raises(TypeError):
        ctx.empty(3, "bfloat16")  # numpy has none
    with pytest.raises(ValueError, match="like"):
        ctx.empty(3, like="jax")
    with pytest.raises((TypeError, ValueError)):
        ctx.empty("abc")
    assert holding(ctx) == before


def test_empty_refuses_float_dims(pair):
    """(2.5,) is no shape: TypeError, as numpy's empty (it once made a
    2-element array)."""
    with pytest.raises(TypeError):
        pair.prod.empty((2.5,))


def test_closed_peer(pair):
    pair.tx.close()
    pair.tx.close()  # twice is fine
    for call in (lambda: pair.tx.send(np.zeros(1)),
                 lambda: pair.tx.recv(timeout=0),
                 lambda: pair.tx.fileno(),
                 lambda: pair.tx.stats(),
                 lambda: pair.tx.pid,
                 lambda: pair.tx.set_options(send_timeout=1)):
        with pytest.raises(ValueError, match="closed"):
            call()
    # the other side sees the hang-up
    with pytest.raises(ipcref.PeerGone) as ei:
        pair.rx.recv(timeout=WAIT)
    assert isinstance(ei.value, ConnectionError)
    with pytest.raises(ipcref.PeerGone):
        pair.rx.send(np.zeros(1))
    assert pair.prod.stats()["peers"] == 0


def test_closed_context(pair):
    ctx = pair.cons
    kept = pair.roundtrip(np.arange(3))[0]
    ctx.close()
    ctx.close()  # twice is fine
    for call in (lambda: ctx.stats(), lambda: ctx.empty(3),
                 lambda: ctx.collect(), lambda: ctx.fileno(),
                 lambda: ctx.connect(abstract_path()),
                 lambda: ctx.listen(abstract_path()),
                 lambda: ctx.adopt(seqpacket_pair()[0]),
                 # its peers closed with it
                 lambda: pair.rx.recv(timeout=0),
                 lambda: pair.rx.send(np.zeros(1)),
                 lambda: pair.rx.fileno()):
        with pytest.raises(ValueError, match="closed"):
            call()
    # what it received stays valid
    assert kept.tolist() == [0, 1, 2]
    with pytest.raises(ipcref.PeerGone):
        pair.tx.send(np.zeros(1))


def test_closed_listener(pair):
    lst = pair.prod.listen(abstract_path())
    lst.close()
    lst.close()
    with pytest.raises(ValueError, match="closed"):
        lst.accept(timeout=0)


def test_with_statements_close():
    with ipcref.Context() as ctx:
        with ctx.listen(abstract_path()) as lst:
            pass
        a, b = seqpacket_pair()
        with ctx.adopt(a) as peer:
            pass
        b.close()
    for call in (ctx.stats, lambda: peer.fileno(), lambda: lst.accept(0)):
        with pytest.raises(ValueError):
            call()


def test_recv_timeout_waits_then_raises_timeout(pair):
    t0 = time.monotonic()
    with pytest.raises(ipcref.Timeout) as ei:
        pair.rx.recv(timeout=0.2)
    took = time.monotonic() - t0
    assert 0.15 <= took < 5, took
    assert isinstance(ei.value, TimeoutError)
    assert isinstance(ei.value, ipcref.Error)
    assert ei.value.code == -9
    assert pair.nothing_waits()


def test_recv_poll_nothing_raises_timeout(pair):
    """recv(timeout=0) with nothing there: Timeout (a TimeoutError), at
    once, losing nothing; before the hellos too."""
    with pytest.raises(ipcref.Timeout):
        pair.rx.recv(timeout=0)
    pair.nothing_waits()
    t0 = time.monotonic()
    with pytest.raises(ipcref.Timeout) as ei:
        pair.rx.recv(timeout=0)
    assert time.monotonic() - t0 < 1
    assert isinstance(ei.value, TimeoutError)
    assert pair.nothing_waits()


def test_infinite_timeouts_wait(pair):
    """timeout=float("inf") waits with no limit, as None (it raised
    OverflowError); in set_options it is the longest one there is."""
    inf = float("inf")
    pair.tx.set_options(send_timeout=inf, hello_timeout=inf)
    pair.tx.send(np.arange(3))
    got, _ = pair.rx.recv(timeout=inf)
    assert got.tolist() == [0, 1, 2]
    path = abstract_path()
    with pair.prod.listen(path) as lst, pair.cons.connect(path) as p:
        with lst.accept(timeout=inf) as q:
            q.send(np.arange(2), meta=b"inf")
            assert p.recv(timeout=inf, like="numpy")[1] == b"inf"
    with pytest.raises(ValueError):
        pair.rx.recv(timeout=float("nan"))
    assert pair.nothing_waits()


def test_accept_timeout(pair):
    with pair.prod.listen(abstract_path()) as lst:
        with pytest.raises(ipcref.Timeout):
            lst.accept(timeout=0.1)


def test_connect_to_nobody(pair):
    before = holding(pair.prod)
    fds = len(os.listdir("/proc/self/fd"))
    for path in (abstract_path(), "/nonexistent-dir/ipcref-test.sock"):
        with pytest.raises(ipcref.PeerGone) as ei:
            pair.prod.connect(path)
        assert isinstance(ei.value, ConnectionError)
        assert ei.value.code == -8
    assert holding(pair.prod) == before
    assert len(os.listdir("/proc/self/fd")) == fds


def test_listen_twice_on_one_path(pair):
    path = abstract_path()
    with pair.prod.listen(path):
        with pytest.raises(ipcref.Error):
            pair.cons.listen(path)


def test_adopt_refuses_bad_sockets(pair):
    ctx = pair.prod
    before = holding(ctx)
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(TypeError):
        ctx.adopt(5)
    with socket.socket() as inet:
        with pytest.raises(ValueError, match="AF_UNIX"):
            ctx.adopt(inet)
    with pytest.raises(ipcref.Error):
        ctx.adopt(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
    d1, d2 = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with pytest.raises(ipcref.Error):
        ctx.adopt(d1)
    d2.close()
    assert holding(ctx) == before
    assert len(os.listdir("/proc/self/fd")) == fds  # adopt closed them


def test_stream_socket_round_trip():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ipcref.Context() as p, ipcref.Context() as c:
        tx, rx = p.adopt(a), c.adopt(b)
        e = p.empty((3, 3), "int16")
        e[...] = np.arange(9).reshape(3, 3)
        tx.send([e.T, np.arange(4)], meta=b"s" * ipcref.META_MAX)
        (x, y), meta = rx.recv(timeout=WAIT)
        assert x.tolist() == np.arange(9).reshape(3, 3).T.tolist()
        assert y.tolist() == [0, 1, 2, 3] and len(meta) == ipcref.META_MAX


def test_recv_bad_like_raises(pair):
    pair.tx.send(np.arange(3))
    with pytest.raises(ValueError, match="like"):
        pair.rx.recv(timeout=WAIT, like="jax")


def test_recv_bad_like_keeps_the_message(pair):
    """`like` is checked before receiving: a bad one loses nothing (it once
    took the message off the peer and dropped it)."""
    pair.tx.send(np.arange(3), meta=b"keep me")
    with pytest.raises(ValueError):
        pair.rx.recv(timeout=WAIT, like="jax")
    got, meta = pair.rx.recv(timeout=WAIT)
    assert meta == b"keep me" and got.tolist() == [0, 1, 2]


def test_send_timeout_when_consumer_holds_too_much(pair):
    """max_bytes_held: a send past it waits up to send_timeout, then
    raises Timeout and sends nothing; once the consumer lets go, sends go."""
    pair.tx.set_options(send_timeout=0.2, max_bytes_held=100_000)
    held, _ = pair.roundtrip(np.zeros(16384, np.float32))  # 64 KiB held
    before = holding(pair.prod)
    t0 = time.monotonic()
    with pytest.raises(ipcref.Timeout):
        pair.tx.send(np.zeros(16384, np.float32))
    assert 0.1 < time.monotonic() - t0 < 10
    assert holding(pair.prod) == before
    assert pair.tx.stats()["bytes_held"] == 65536
    del held
    got, _ = pair.roundtrip(np.ones(16384, np.float32))
    assert got.sum() == 16384
    pair.tx.set_options()  # back to the defaults


def test_map_caps(make_pair):
    """max_maps on the receiving peer: a message that would keep more
    mapped is refused (Error, ERANGE), its array given back to the sender,
    and with room the next one comes."""
    pair = make_pair(isolate=True)  # a segment per array
    pair.rx.set_options(max_maps=2)  # the ledger and one segment
    kept, _ = pair.roundtrip(np.arange(4))
    pair.tx.send(np.arange(8))
    with pytest.raises(ipcref.Error) as ei:
        pair.rx.recv(timeout=WAIT)
    assert ei.value.name == "ERANGE"
    assert pair.rx.stats()["maps"] == 2
    assert pair.tx.stats()["leases"] == 1  # the refused one came back
    pair.rx.set_options(max_maps=3)
    got, _ = pair.roundtrip(np.arange(8))
    assert got.tolist() == list(range(8)) and kept.tolist() == [0, 1, 2, 3]
    assert pair.rx.stats()["maps"] == 3
    for name in ("max_maps", "max_mapped_bytes", "max_bytes_held",
                 "ring_bytes"):
        with pytest.raises(ValueError):
            pair.rx.set_options(**{name: -1})


def test_context_map_caps():
    """max_maps on the receiving Context caps all its peers together."""
    prod = ipcref.Context(isolate=True)
    cons = ipcref.Context(max_maps=2)  # the ledger and one segment
    a, b = seqpacket_pair()
    tx, rx = prod.adopt(a), cons.adopt(b)
    try:
        tx.send(np.arange(4))
        kept, _ = rx.recv(timeout=WAIT)
        tx.send(np.arange(8))
        with pytest.raises(ipcref.Error) as ei:
            rx.recv(timeout=WAIT)
        assert ei.value.name == "ERANGE"
        assert cons.stats()["maps_in"] == 2
        assert kept.tolist() == [0, 1, 2, 3]
        del kept
    finally:
        for o in (tx, rx, prod, cons):
            o.close()
    for name in ipcref.Context._SIZES:  # unsigned in C: -1 would be huge
        with pytest.raises(ValueError):
            ipcref.Context(**{name: -1})


def test_error_attributes(pair):
    with pytest.raises(ipcref.Error) as ei:
        pair.prod.empty((-1,))
    e = ei.value
    assert isinstance(e.code, int) and e.code < 0
    assert isinstance(e.name, str) and e.name.startswith("E")
    assert e.message and str(e) == e.message
    assert issubclass(ipcref.Timeout, TimeoutError)
    assert issubclass(ipcref.WouldBlock, BlockingIOError)
    assert issubclass(ipcref.PeerGone, ConnectionError)
    for cls in (ipcref.Timeout, ipcref.WouldBlock, ipcref.PeerGone):
        assert issubclass(cls, ipcref.Error)


def test_error_names_match_codes(pair):
    """Error.name is ipcref.h's name of Error.code."""
    errors = []
    for call in (lambda: pair.prod.empty((-1,)),          # ERANGE
                 lambda: pair.rx.recv(timeout=0.05),      # ETIMEDOUT
                 lambda: pair.prod.connect(abstract_path())):  # EPEER
        try:
            call()
        except ipcref.Error as e:
            errors.append(e)
    pair.nothing_waits()
    pair.tx.send(pair.prod.empty(2))
    try:
        pair.rx.recv(timeout=WAIT, like="torch")  # read-only: refused
    except ipcref.Error as e:
        errors.append(e)
    except ImportError:
        pass
    assert len(errors) >= 3
    for e in errors:
        assert e.name == RESULT_NAMES[e.code], (e.code, e.name, e.message)


def test_empty_refusals_make_no_segment():
    """Context.empty checks all its arguments before it allocates: a
    refused call leaves no segment behind (like= and a bfloat16 for numpy
    were once checked after the array was made)."""
    calls = [lambda: ctx.empty(1000, "uint8", like="bad"),
             lambda: ctx.empty(1000, "bfloat16"),
             lambda: ctx.empty(1000, "bfloat16", like="numpy"),
             lambda: ctx.empty(1000, "float128"),
             lambda: ctx.empty((1000, 2.5))]
    try:
        import torch
        if not hasattr(torch, "uint16"):  # torch 1.x: no such tensors
            calls.append(lambda: ctx.empty(1000, "uint16", like="torch"))
    except ImportError:
        calls.append(lambda: ctx.empty(1000, "uint8", like="torch"))
    with ipcref.Context() as ctx:
        for call in calls:
            with pytest.raises((TypeError, ValueError, ImportError)):
                call()
        s = ctx.stats()
        assert (s["segment_bytes"], s["cached_bytes"], s["live_bufs"]) == \
            (0, 0, 0)


def test_sizes_past_the_c_type_are_refused(pair):
    """A size option too large for its C field raises OverflowError (it was
    once cut to its low bits: max_bytes=2**64+1 a budget of 1 byte,
    ledger_slots=2**32 the default)."""
    size_max = 2 * sys.maxsize + 1
    for name, big in [("ledger_slots", 2**32), ("ledger_slots", 2**32 + 4096),
                      ("max_bytes", 2**64 + 1), ("segment_size", 2**64 + 4096),
                      ("segment_cache", size_max + 1), ("max_maps", 2**64),
                      ("max_mapped_bytes", 2**70)]:
        with pytest.raises(OverflowError, match=name):
            ipcref.Context(**{name: big})
    before = pair.tx.stats()
    for name in ("max_bytes_held", "ring_bytes", "max_maps",
                 "max_mapped_bytes"):
        with pytest.raises(OverflowError, match=name):
            pair.tx.set_options(**{name: 2**64 + 1})
    assert pair.tx.stats() == before
    with pytest.raises(ValueError):  # the extension's own check, too
        ipcref._ipcref._Context(max_bytes=-1)
    ipcref.Context(max_bytes=size_max).close()  # the largest is taken
    pair.tx.set_options(max_bytes_held=size_max)
    got, _ = pair.roundtrip(np.arange(1000))
    assert got.sum() == 499500
    pair.tx.set_options()


def test_stats_keep_no_reference(pair):
    """stats() gives each value to its dict (each once kept one reference
    more: a leak per value per call)."""
    kept = pair.prod.empty(1 << 16, "uint8")
    s = pair.prod.stats()
    big = [k for k, v in s.items() if v > 256]  # not a shared small int
    assert "segment_bytes" in big and "live_bytes" in big
    for k in big:  # the dict's and the argument's (out of the assert,
        n = sys.getrefcount(s[k])  # which pytest keeps its values of)
        assert n == 2, k
    del kept


def test_context_close_refused_while_a_call_runs_on_it(pair):
    """close() while another thread is inside a call on the Context that
    let go of the GIL (accept, waiting for a peer) is refused with
    RuntimeError, as for a Peer in use: it once freed the context under
    the call. Once the call is over, close goes."""
    ctx, path, got = pair.prod, abstract_path(), []
    lst = ctx.listen(path)
    t = threading.Thread(target=lambda: got.append(lst.accept(timeout=WAIT)))
    interval = sys.getswitchinterval()
    gc.collect()  # no collection (finalizers may let go of the GIL)
    gc.disable()
    sys.setswitchinterval(1e3)  # no forced switch: only a blocking call
    try:  # lets the GIL go, so start() returns once accept waits
        t.start()
    finally:
        sys.setswitchinterval(interval)
        gc.enable()
    try:
        with pytest.raises(RuntimeError, match="another thread"):
            ctx.close()
        assert ctx.stats()["peers"] == 1  # still open, its peer too
    finally:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.connect("\0" + path[1:])  # accept returns
            t.join(WAIT)
    assert not t.is_alive() and len(got) == 1
    ctx.close()
    with pytest.raises(ValueError, match="closed"):
        got[0].fileno()  # closed with its context
    lst.close()


# Run in a process of its own (under valgrind where there is one): a
# receive whose second allocation of a _Buffer fails. Only the extension
# is loaded, so no _Buffer lives before the receive and the registry of
# them must grow for the first one.
_NOMEM_RECV = """
import importlib.util, socket, sys
import _testcapi
spec = importlib.util.spec_from_file_location("_ipcref", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
prod, cons = m._Context(), m._Context()
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
tx, rx = prod._adopt(a.detach()), cons._adopt(b.detach())
src = bytes(range(256))
for k in range(1, 40):  # the k-th allocation from now fails
    tx._send([src, src[::-1]], b"x")
    _testcapi.set_nomemory(k, k + 1)
    try:
        bufs, meta = rx._recv(5000)
        break
    except MemoryError:
        assert cons.stats()["imported_bufs"] == 0
    finally:
        _testcapi.remove_mem_hooks()
assert meta == b"x" and k > 1
assert [bytes(memoryview(x)) for x in bufs] == [src, src[::-1]]
assert cons.stats()["imported_bufs"] == 2
del bufs
assert cons.stats()["imported_bufs"] == 0
print("ok")
"""


def test_recv_out_of_memory_releases_each_view_once(tmp_path):
    """A receive whose arrays cannot all be made (out of memory) raises
    MemoryError and releases each view it got once: it once released the
    one whose _Buffer could not be registered twice (a use after free,
    which valgrind sees)."""
    pytest.importorskip("_testcapi")
    script = tmp_path / "nomem_recv.py"
    script.write_text(_NOMEM_RECV)
    cmd = [sys.executable, str(script), ipcref._ipcref.__file__]
    env = dict(os.environ)
    if shutil.which("valgrind"):
        cmd = ["valgrind", "-q", "--error-exitcode=3"] + cmd
        env["PYTHONMALLOC"] = "malloc"
    r = subprocess.run(cmd, capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr
