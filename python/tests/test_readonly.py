"""Read-only sharing (the default) and writable shares, across real
processes: a consumer cannot change what its producer shared, unless the
producer made its Context with writable_shares=True."""

import ctypes
import faulthandler
import os
import resource
import signal

import numpy as np
import pytest

import ipcref
from conftest import WAIT, read_byte, seqpacket_pair


def test_received_array_is_read_only(pair):
    buf = pair.prod.empty((3, 4), "int32")
    buf[...] = 7
    for obj in (buf, buf.T, np.arange(12).reshape(3, 4)):
        got, _ = pair.roundtrip(obj)
        assert got.flags.writeable is False
        with pytest.raises(ValueError, match="read-only"):
            got[0, 0] = 1
        with pytest.raises(ValueError):
            got.setflags(write=True)
        with pytest.raises(ValueError):
            np.add(got, 1, out=got)
        with pytest.raises(TypeError):
            memoryview(got)[0, 0] = 1
    assert (buf == 7).all()
    # a private copy is writable
    got, _ = pair.roundtrip(buf, copy=True)
    assert got.flags.writeable
    got[0, 0] = -1
    assert buf[0, 0] == 7


def _read_only_consumer(sock, report):
    ctx = ipcref.Context()
    peer = ctx.adopt(sock)
    got, _ = peer.recv(timeout=WAIT)
    assert not got.flags.writeable
    for attempt in (lambda: got.__setitem__(0, 1),
                    lambda: got.setflags(write=True),
                    lambda: np.copyto(got, 5),
                    lambda: got.fill(3)):
        try:
            attempt()
        except ValueError:
            pass
        else:
            return 3  # a write was let through
    assert got.tolist() == [7, 7, 7, 7]
    os.write(report, b"k")
    # Past numpy, straight to the address: the mapping itself is read-only,
    # so this faults here instead of changing the producer's memory.
    faulthandler.disable()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    ctypes.memmove(got.ctypes.data, b"\1\1\1\1", 4)
    return 4  # the write went through


def test_consumer_cannot_write_producer_memory(procs):
    a, b = seqpacket_pair()
    r, w = os.pipe()
    pid = procs.fork(_read_only_consumer, b, w, close=[a, r])
    b.close(), os.close(w)
    with ipcref.Context() as ctx:
        peer = ctx.adopt(a)
        buf = ctx.empty(4, "int32")
        buf[:] = 7
        peer.send(buf)
        assert read_byte(r) == b"k"  # numpy refused every write, no signal
        code = procs.wait(pid)
        assert code in (-signal.SIGSEGV, -signal.SIGBUS), code
        assert buf.tolist() == [7, 7, 7, 7]
        peer.close()
    os.close(r)


def _writing_consumer(sock):
    ctx = ipcref.Context()
    peer = ctx.adopt(sock)
    got, meta = peer.recv(timeout=WAIT)
    assert got.flags.writeable, "writable_shares: the consumer may write"
    got[1:3] = [41, 42]
    copied, _ = peer.recv(timeout=WAIT)  # memory ipcref copied: writable too
    assert copied.flags.writeable
    copied[:] = 0
    peer.send(np.array([1]), meta=b"written")
    peer.recv(timeout=WAIT)


def test_writable_shares_across_processes(procs):
    """With Context(writable_shares=True) the consumer's array is writable
    and its writes land in the producer's memory (as torch.multiprocessing
    shares)."""
    a, b = seqpacket_pair()
    pid = procs.fork(_writing_consumer, b, close=[a])
    b.close()
    with ipcref.Context(writable_shares=True) as ctx:
        peer = ctx.adopt(a)
        buf = ctx.empty(4, "int64")
        buf[:] = 7
        src = np.arange(5)
        peer.send(buf)
        peer.send(src)
        _, meta = peer.recv(timeout=WAIT)
        assert meta == b"written"
        assert buf.tolist() == [7, 41, 42, 7]
        assert src.tolist() == [0, 1, 2, 3, 4]  # the copy was written, not src
        peer.send(np.zeros(1))
        procs.expect_ok(pid)
        peer.close()


def test_default_is_not_writable_shares(make_pair):
    ro, rw = make_pair(), make_pair(writable_shares=True)
    for p, want in ((ro, False), (rw, True)):
        got, _ = p.roundtrip(p.prod.empty(3))
        assert got.flags.writeable is want


def test_dlpack_of_read_only_memory_raises_error(pair):
    """__dlpack__ of memory this process may not write raises ipcref.Error
    (ENEEDCOPY, as the library's own DLPack export of such memory): it
    once raised a TypeError, the Error built with one argument of its
    three."""
    pair.tx.send(pair.prod.empty((4,), "float32"))
    got, _ = pair.rx.recv(timeout=WAIT)
    buf = got.base.obj if isinstance(got.base, memoryview) else got.base
    assert buf.readonly
    with pytest.raises(ipcref.Error) as ei:
        buf.__dlpack__()
    e = ei.value
    assert (e.code, e.name) == (-12, "ENEEDCOPY") and "read-only" in e.message
