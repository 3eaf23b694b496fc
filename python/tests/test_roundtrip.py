"""Round trips: every dtype numpy shares with ipcref, every layout, 0-d and
empty arrays, batches, metadata; copies from foreign memory, zero copy from
ipcref memory; and the same across real processes."""


import pickle

import numpy as np
import pytest

import ipcref
from conftest import WAIT, abstract_path, holding, poll_until, \
    seqpacket_pair

NUMPY_DTYPES = [n for n in ipcref.DTYPES if n != "bfloat16"]


def sample(dtype, shape, seed=0):
    """Deterministic values spanning the dtype's range."""
    return np.asarray(_sample(np.dtype(dtype), shape, seed))


def _sample(dt, shape, seed):
    rng = np.random.default_rng(seed)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=shape, dtype=dt,
                            endpoint=True)
    if dt.kind == "f":
        return (rng.standard_normal(shape) * 1000).astype(dt)
    assert dt.kind == "c"
    return (rng.standard_normal(shape) * 100 +
            1j * rng.standard_normal(shape) * 100).astype(dt)


# Layouts of a (6, 8) array: name -> the view sent.
LAYOUTS = {
    "contiguous": lambda a: a,
    "rows_step2": lambda a: a[::2],
    "cols_step3": lambda a: a[:, ::3],
    "transposed": lambda a: a.T,
    "offset_slice": lambda a: a[1:5, 2:7],
    "negative_rows": lambda a: a[::-1],
    "negative_cols": lambda a: a[:, ::-2],
    "negative_both_offset": lambda a: a[4:0:-1, 6:1:-2],
    "column": lambda a: a[:, 3],
    "reshaped_3d_permuted": lambda a: a.reshape(2, 3, 8).transpose(2, 0, 1),
    "scalar_view_0d": lambda a: a[2, 5, ...],
    "broadcast_zero_stride": lambda a: np.broadcast_to(a[1], (4, 8)),
    "empty_rows": lambda a: a[3:3],
    "empty_cols": lambda a: a[:3, 5:5],
}
SHAPE = (6, 8)


def check_same(got, want):
    assert isinstance(got, np.ndarray)
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert np.array_equal(got, want)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_memory_is_copied(pair, dtype, layout):
    """Memory ipcref did not make is copied once: values, dtype and shape
    arrive, and a later write to the source does not."""
    src = sample(dtype, SHAPE)
    view = LAYOUTS[layout](src)
    want = view.copy()
    got, meta = pair.roundtrip(view)
    assert meta is None
    check_same(got, want)
    src[...] = sample(dtype, SHAPE, seed=1)
    check_same(got, want)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_context_memory_is_zero_copy(pair, dtype, layout):
    """A view of Context.empty memory travels as a view of the same memory:
    the receiver sees what the producer writes later, and the send made no
    block of its own."""
    buf = pair.prod.empty(SHAPE, dtype)
    assert buf.flags.c_contiguous and buf.flags.writeable
    buf[...] = sample(dtype, SHAPE)
    view = LAYOUTS[layout](buf)
    bufs_before = pair.prod.stats()["live_bufs"]
    got, _ = pair.roundtrip(view)
    check_same(got, view)
    assert pair.prod.stats()["live_bufs"] == bufs_before
    buf[...] = sample(dtype, SHAPE, seed=1)
    check_same(got, LAYOUTS[layout](sample(dtype, SHAPE, seed=1)))


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_zero_d_and_empty(pair, dtype):
    for shape in [(), (0,), (3, 0), (0, 4, 2)]:
        a = sample(dtype, shape)
        got, _ = pair.roundtrip(a)
        check_same(got, a)
        e = pair.prod.empty(shape, dtype)
        e[...] = a
        got, _ = pair.roundtrip(e)
        check_same(got, a)


def test_context_empty_shapes(pair):
    ctx = pair.prod
    assert ctx.empty(5).shape == (5,) and ctx.empty(5).dtype == np.float32
    assert ctx.empty((), "int8").shape == ()
    assert ctx.empty((2, 0, 3), np.int16).shape == (2, 0, 3)
    assert ctx.empty((1,) * 8, "uint8").shape == (1,) * 8
    assert ctx.empty((2, 3), np.dtype("complex64")).dtype == np.complex64


def test_context_empty_takes_integer_like_sizes(pair):
    """One size of any integer type is a 1-d shape (np.int64(3) raised
    TypeError: it is no Python int, nor iterable)."""
    ctx = pair.prod
    assert ctx.empty(np.int64(3)).shape == (3,)
    assert ctx.empty(np.uint8(2), "int8").shape == (2,)
    assert ctx.empty((np.int32(2), np.int64(4))).shape == (2, 4)
    with pytest.raises(TypeError):
        ctx.empty(2.0)


def test_a_copy_only_needs_the_context_for_the_send(pair):
    """The copy made for foreign memory lives in the receiver's hands only:
    once it is dropped, the producer has nothing leased."""
    got, _ = pair.roundtrip(np.arange(1000, dtype=np.int32))
    assert pair.prod.stats()["live_slots"] >= 1
    del got
    pair.prod.collect()
    s = pair.prod.stats()
    assert s["live_slots"] == 0 and s["limbo_blocks"] == 0


def test_received_memory_is_forwarded_zero_copy(make_pair):
    """What a process received it can send on without a copy: a third
    process sees the producer's later writes."""
    first = make_pair()
    a, b = seqpacket_pair()
    last = ipcref.Context()
    fwd, end = first.cons.adopt(a), last.adopt(b)
    try:
        buf = first.prod.empty(10, "int16")
        buf[:] = np.arange(10)
        got, _ = first.roundtrip(buf)
        fwd.send(got[2:8:2], meta=b"fwd")
        z, meta = end.recv(timeout=WAIT)
        assert meta == b"fwd" and z.tolist() == [2, 4, 6]
        buf[4] = 99
        assert z.tolist() == [2, 99, 6]
        assert first.cons.stats()["live_bufs"] == 0  # no copy was made
        del got, z
        first.prod.collect()
        assert first.prod.stats()["live_slots"] == 0
    finally:
        fwd.close(), end.close(), last.close()


# ---- batches


def test_batch_of_max_size(pair):
    n = ipcref.MAX_BATCH
    assert n >= 2
    srcs = [sample(NUMPY_DTYPES[i % len(NUMPY_DTYPES)], (i + 1, 3), seed=i)
            for i in range(n)]
    zc = pair.prod.empty((4, 5), "float64")
    zc[...] = sample("float64", (4, 5), seed=77)
    items = [s if i % 3 else s.T for i, s in enumerate(srcs)]
    items[1] = zc[::-1]
    got, meta = pair.roundtrip(items, meta={"n": n})
    assert meta == {"n": n}
    assert isinstance(got, list) and len(got) == n
    for g, want in zip(got, items):
        check_same(g, want)


def test_batch_forms(pair):
    one, two = np.arange(3), np.ones((2, 2), np.float32)
    got, _ = pair.roundtrip([one])
    assert isinstance(got, list) and len(got) == 1
    check_same(got[0], one)
    got, _ = pair.roundtrip((one, two))
    assert isinstance(got, list) and len(got) == 2
    check_same(got[1], two)
    got, _ = pair.roundtrip(one)
    assert isinstance(got, np.ndarray)
    # two batches in a row: each recv returns its own whole list
    pair.tx.send([one, two], meta=b"a")
    pair.tx.send([two, one, one], meta=b"b")
    g1, m1 = pair.rx.recv(timeout=WAIT)
    g2, m2 = pair.rx.recv(timeout=WAIT)
    assert (m1, len(g1), m2, len(g2)) == (b"a", 2, b"b", 3)
    check_same(g2[0], two)


def test_batch_over_max_is_refused_and_nothing_sent(pair):
    items = [np.arange(i + 1) for i in range(ipcref.MAX_BATCH + 1)]
    items[0] = pair.prod.empty(4)
    before = holding(pair.prod)
    with pytest.raises(ValueError, match=str(ipcref.MAX_BATCH)):
        pair.tx.send(items)
    with pytest.raises(ValueError, match="empty batch"):
        pair.tx.send([])
    assert holding(pair.prod) == before
    assert pair.nothing_waits()


def test_batch_with_one_bad_item_sends_nothing(pair):
    before = holding(pair.prod)
    with pytest.raises(TypeError):
        pair.tx.send([np.arange(3), pair.prod.empty(2), "not an array"])
    with pytest.raises(TypeError):  # refused in C, after a copy was made
        pair.tx.send([np.arange(3), np.zeros((1,) * 9)])
    with pytest.raises(TypeError):
        pair.tx.send([np.arange(3), np.zeros(2, dtype=object)])
    assert holding(pair.prod) == before
    assert pair.nothing_waits()


# ---- metadata


@pytest.mark.parametrize("meta, want", [
    (None, None),
    (b"", b""),
    (b"\x00\xffraw bytes", b"\x00\xffraw bytes"),
    (bytearray(b"ba"), b"ba"),
    (memoryview(b"mv"), b"mv"),
    ({"frame": 7, "name": "cam0", "shape": (1080, 1920)},
     {"frame": 7, "name": "cam0", "shape": (1080, 1920)}),
    ("a str", "a str"),
    (0, 0),
    ([True, False, None, -1.5, -(2 ** 70), "\u00e9\U0001f600", b"\0"],
     [True, False, None, -1.5, -(2 ** 70), "\u00e9\U0001f600", b"\0"]),
    ({1: (2, (3, [])), (4, "k"): {b"b": {}}, None: ()},
     {1: (2, (3, [])), (4, "k"): {b"b": {}}, None: ()}),
    ({"mean": np.float64(1.5), "n": np.uint64(2 ** 63), "ok": np.bool_(1)},
     {"mean": 1.5, "n": 2 ** 63, "ok": True}),
], ids=["none", "empty_bytes", "bytes", "bytearray", "memoryview", "dict",
        "str", "zero", "list_of_scalars", "nested_keys", "numpy_numbers"])
def test_metadata(pair, meta, want):
    got, m = pair.roundtrip(np.arange(2), meta=meta)
    assert m == want and type(m) is type(want)
    assert repr(m) == repr(want)  # tuples stay tuples, int keys ints


# Metadata with a flag byte of ours and a body, as a hostile sender sends
# it: 8 says pickled, 16 the safe form.
_RAN = []


def _record(what):
    _RAN.append(what)


class _Evil:
    def __reduce__(self):
        return _record, ("the sender's code ran here",)


def test_pickled_metadata_is_not_unpickled_by_default(pair):
    """A pickle in the metadata runs the sender's code where it is
    unpickled: recv refuses it (Error EPROTO, the message dropped, nothing
    run) unless asked recv(unpickle=True), for trusted peers."""
    pair.tx._peer()._send([np.arange(2)], b"\x08" + pickle.dumps(_Evil()))
    with pytest.raises(ipcref.Error, match="unpickle=True") as ei:
        pair.rx.recv(timeout=WAIT)
    assert ei.value.name == "EPROTO" and _RAN == []
    assert pair.nothing_waits()
    pair.tx.send(np.arange(2), meta={1, 2})  # no safe form: pickled
    with pytest.raises(ipcref.Error, match="unpickle=True"):
        pair.rx.recv(timeout=WAIT)
    assert pair.nothing_waits()
    got, m = pair.roundtrip(np.arange(2), meta={1, 2}, unpickle=True)
    assert m == {1, 2} and got.tolist() == [0, 1]
    got, m = pair.roundtrip(np.arange(2), meta=[3], unpickle=True)
    assert m == [3]
    assert _RAN == []


_UNIMPORTABLE = b"\x08cipcref_no_such_module\nThing\n."


@pytest.mark.parametrize("raw, kw", [
    (b"\x10", {}), (b"\x10l\x05N", {}), (b"\x10NN", {}),
    (b"\x10s\x02\xff\xfe", {}), (b"\x10d\x01l\x00N", {}),
    (b"\x10i\xff\xff\xff\xff\xff\x01", {}),
    (b"\x10" + b"l\x01" * 100 + b"N", {}), (_UNIMPORTABLE, {}),
    (_UNIMPORTABLE, {"unpickle": True}), (b"\x08junk", {"unpickle": True})],
    ids=["empty", "short_list", "trailing", "bad_utf8", "unhashable_key",
         "huge_size", "deep", "pickled", "pickled_unimportable",
         "pickled_junk"])
def test_undecodable_metadata_raises_once(pair, raw, kw):
    """Metadata that cannot be decoded raises Error EPROTO once; the
    message is dropped (its lease given back) and the next one comes (a
    pickle that failed raised the same for ever, every later message stuck
    behind it)."""
    pair.tx._peer()._send([np.arange(1000)], raw)
    with pytest.raises(ipcref.Error) as ei:
        pair.rx.recv(timeout=WAIT, **kw)
    assert ei.value.name == "EPROTO"
    assert pair.nothing_waits()
    assert poll_until(lambda: pair.prod.stats()["live_slots"] == 0,
                      tick=pair.prod.collect)


def test_metadata_at_the_limit(pair):
    body = bytes(range(256)) * (ipcref.META_MAX // 256 + 1)
    got, m = pair.roundtrip(np.arange(2), meta=body[:ipcref.META_MAX])
    assert m == body[:ipcref.META_MAX]


def test_metadata_over_the_limit_sends_nothing(pair):
    before = holding(pair.prod)
    with pytest.raises(ValueError, match=str(ipcref.META_MAX)):
        pair.tx.send(np.arange(2), meta=b"x" * (ipcref.META_MAX + 1))
    with pytest.raises(ValueError):
        pair.tx.send(pair.prod.empty(3), meta={"big": "y" * ipcref.META_MAX})
    assert holding(pair.prod) == before
    assert pair.nothing_waits()


# ---- across real processes

CROSS = [(d, lay, zc) for d in NUMPY_DTYPES
         for lay in ("contiguous", "transposed", "negative_both_offset",
                     "scalar_view_0d", "empty_cols")
         for zc in (False, True)]


def _cross_consumer(sock):
    ctx = ipcref.Context()
    peer = ctx.adopt(sock)
    for i, (dtype, layout, _) in enumerate(CROSS):
        got, meta = peer.recv(timeout=WAIT)
        want = LAYOUTS[layout](sample(dtype, SHAPE, seed=i))
        assert meta == {"i": i, "dtype": dtype}, meta
        check_same(got, want)
        assert not got.flags.writeable
        if i % 7 == 0:  # back to its producer, zero copy
            peer.send(got, meta=i)
    batch, meta = peer.recv(timeout=WAIT)
    assert meta == b"batch" and len(batch) == ipcref.MAX_BATCH
    for k, g in enumerate(batch):
        check_same(g, np.full((k, 2), k, np.int32))
    peer.send(np.array(sum(int(g.sum()) for g in batch)), meta=b"sum")
    peer.recv(timeout=WAIT)  # the parent's go-ahead to exit


def test_cross_process_roundtrip(procs):
    a, b = seqpacket_pair()
    pid = procs.fork(_cross_consumer, b, close=[a])
    b.close()
    with ipcref.Context() as ctx:
        peer = ctx.adopt(a)
        keep = []
        for i, (dtype, layout, zc) in enumerate(CROSS):
            src = sample(dtype, SHAPE, seed=i)
            if zc:
                buf = ctx.empty(SHAPE, dtype)
                buf[...] = src
                src = buf
            keep.append(src)
            peer.send(LAYOUTS[layout](src), meta={"i": i, "dtype": dtype})
            if i % 7 == 0:
                back, meta = peer.recv(timeout=WAIT)
                assert meta == i
                check_same(back, LAYOUTS[layout](sample(dtype, SHAPE, i)))
        peer.send([np.full((k, 2), k, np.int32)
                   for k in range(ipcref.MAX_BATCH)], meta=b"batch")
        total, meta = peer.recv(timeout=WAIT)
        assert meta == b"sum"
        assert int(total) == sum(k * k * 2 for k in range(ipcref.MAX_BATCH))
        assert peer.pid == pid
        peer.send(np.zeros(1))
        procs.expect_ok(pid)
        peer.close()


def _connecting_producer(path):
    with ipcref.Context() as ctx, ctx.connect(path) as peer:
        frame = ctx.empty((48, 64), "uint8")
        frame[...] = np.arange(64, dtype=np.uint8)
        peer.send([frame, np.arange(5.0)], meta={"frame": 0})
        peer.send(frame[::2, ::-1], meta={"frame": 1})
        peer.recv(timeout=WAIT)  # hold on until the parent has read


def test_cross_process_listen_connect(procs):
    path = abstract_path()
    with ipcref.Context() as ctx, ctx.listen(path) as lst:
        pid = procs.fork(_connecting_producer, path)
        with lst.accept(timeout=WAIT) as peer:
            assert peer.pid == pid
            (frame, xs), meta = peer.recv(timeout=WAIT)
            assert meta == {"frame": 0}
            want = np.broadcast_to(np.arange(64, dtype=np.uint8), (48, 64))
            check_same(frame, want)
            check_same(xs, np.arange(5.0))
            f1, meta = peer.recv(timeout=WAIT)
            assert meta == {"frame": 1}
            check_same(f1, want[::2, ::-1])
            peer.send(np.zeros(1))
            procs.expect_ok(pid)
            # the producer is gone; what it sent stays readable
            check_same(frame, want)


OTHER_CONTEXT_BUG = (
    "bug: the extension's registry of live buffers is per process, not per "
    "Context: memory made by another Context (one of this process, or the "
    "parent's in a forked child) is found there and sent as a view, which "
    "the library refuses (Error EINVAL 'a view of a buffer of another "
    "context'), where send's docstring says memory that is not the "
    "context's is copied once")


def test_memory_of_another_context_is_copied(pair):
    with ipcref.Context() as other:
        arr = other.empty(5, "int32")
        arr[:] = np.arange(5)
        got, _ = pair.roundtrip(arr[::-1])
        assert got.tolist() == [4, 3, 2, 1, 0]


def test_reinterpreted_view_keeps_its_dtype(pair):
    """An array over Context memory in another dtype than the one it was
    made in (a.view(np.int32) of float32 memory) travels in its own dtype,
    zero copy (it once arrived in the memory's dtype: int32 as float32,
    uint8 refused); one whose offset its dtype cannot reach is copied."""
    a = pair.prod.empty((4,), "float32")
    a[:] = [1, 2, 3, 4]
    u8 = a.view(np.uint8)
    bufs = pair.prod.stats()["live_bufs"]
    for view in (a.view(np.int32), u8, a.view(np.float64), u8[2:10:2],
                 u8[4:].view(np.int16).reshape(2, 3)[:, ::-1]):
        got, _ = pair.roundtrip(view)
        check_same(got, view)
        assert pair.prod.stats()["live_bufs"] == bufs  # zero copy
    odd = u8[1:9].view(np.float64)  # at byte 1: no float64 view of it
    got, _ = pair.roundtrip(odd)
    check_same(got, odd)
    assert got.tobytes() == u8[1:9].tobytes()


def _buffer_of(arr):
    """The extension's _Buffer under a received array."""
    base = arr.base
    return base.obj if isinstance(base, memoryview) else base


def test_buffer_protocol_simple_request_of_strided_memory(pair):
    """A consumer that asks for plain bytes (PyBUF_SIMPLE, as hashlib)
    gets them only of C-contiguous memory: of a strided view it gets a
    BufferError (it once read len bytes on from the first element, past
    the view)."""
    import hashlib
    a = pair.prod.empty((64,), "uint8")
    a[:] = np.arange(64)
    got, _ = pair.roundtrip(a)
    assert hashlib.sha256(_buffer_of(got)).digest() == \
        hashlib.sha256(a.tobytes()).digest()
    for view in (a[::-1], a[::2], a.reshape(8, 8).T):
        got, _ = pair.roundtrip(view)
        buf = _buffer_of(got)
        with pytest.raises(BufferError):
            hashlib.sha256(buf)
        assert memoryview(buf).tobytes() == view.tobytes()  # strides asked
        assert np.asarray(buf).tolist() == view.tolist()


def test_buffer_protocol_honours_request_flags(pair):
    """Each request gets the layout it asked for, or a BufferError: a
    contiguity it lacks is refused, shape and strides are given only when
    asked for."""
    tb = pytest.importorskip("_testbuffer")
    e = pair.prod.empty((3, 4), "int16")
    e[...] = np.arange(12).reshape(3, 4)
    C, F, ANY = (tb.PyBUF_C_CONTIGUOUS, tb.PyBUF_F_CONTIGUOUS,
                 tb.PyBUF_ANY_CONTIGUOUS)
    cases = [  # view, the requests it satisfies, those it does not
        (e, [tb.PyBUF_SIMPLE, tb.PyBUF_ND, tb.PyBUF_STRIDES, C, ANY], [F]),
        (e.T, [tb.PyBUF_STRIDES, F, ANY], [tb.PyBUF_SIMPLE, tb.PyBUF_ND, C]),
        (e[:, ::2], [tb.PyBUF_STRIDES, tb.PyBUF_FULL_RO],
         [tb.PyBUF_SIMPLE, tb.PyBUF_ND, C, F, ANY, tb.PyBUF_CONTIG_RO]),
    ]
    for view, ok, refused in cases:
        got, _ = pair.roundtrip(view)
        buf = _buffer_of(got)
        for flags in ok:
            nd = tb.ndarray(buf, getbuf=flags | tb.PyBUF_FORMAT)
            if flags & tb.PyBUF_ND:
                assert nd.tolist() == view.tolist()
            else:  # shape not asked for: the bytes, flat
                assert nd.tobytes() == view.tobytes()
        for flags in refused:
            with pytest.raises(BufferError):
                tb.ndarray(buf, getbuf=flags | tb.PyBUF_FORMAT)
        with pytest.raises(BufferError, match="may not write"):
            tb.ndarray(buf, getbuf=tb.PyBUF_WRITABLE)
    got, _ = pair.roundtrip(e)  # what was not asked for is not given
    buf = _buffer_of(got)
    nd = tb.ndarray(buf, getbuf=tb.PyBUF_ND | tb.PyBUF_FORMAT)
    assert nd.shape == (3, 4) and nd.strides == ()
    nd = tb.ndarray(buf, getbuf=tb.PyBUF_SIMPLE)
    assert nd.shape == () and nd.strides == () and nd.nbytes == e.nbytes


def test_connecting_again_while_holding_an_array():
    """A consumer that keeps an array from a connection it closed, and
    connects to the same producer again, receives on the new connection:
    the producer's segment is mapped anew (it was refused as retired)."""
    prod, cons = ipcref.Context(), ipcref.Context()
    a = prod.empty((1024,), "uint8")
    kept = []
    for rnd in range(3):
        s1, s2 = seqpacket_pair()
        pa, pb = prod.adopt(s1), cons.adopt(s2)
        a[:] = rnd
        pa.send(a)
        got, _ = pb.recv(timeout=WAIT)
        assert got[7] == rnd
        kept.append(got)
        pa.close()
        pb.close()
    assert [int(k[0]) for k in kept] == [2, 2, 2]  # one block, shared
    del kept, got
    cons.close()
    prod.close()


def test_numpy_scalars_outside_the_safe_form_are_pickled(pair):
    """A numpy longdouble (its item() is a longdouble again) goes pickled,
    as anything else outside the safe form: it recursed until Python's
    limit, and nothing was sent."""
    import ipcref as _i
    meta = {"lr": np.longdouble(1) / 1024}
    pair.tx.send(np.zeros(2, np.float32), meta=meta)
    with pytest.raises(_i.Error):
        pair.rx.recv(timeout=WAIT)  # pickled: not unpickled by default
    pair.tx.send(np.zeros(2, np.float32), meta=meta)
    _, got = pair.rx.recv(timeout=WAIT, unpickle=True)
    assert got == meta and type(got["lr"]) is np.longdouble
