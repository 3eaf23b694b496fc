"""torch tensors: every dtype torch shares with ipcref (bfloat16 included,
which numpy lacks), layouts, read-only memory and copy=True, and
writable shares."""

import numpy as np
import pytest

import ipcref
from conftest import WAIT

torch = pytest.importorskip("torch")

TORCH_DTYPES = [n for n in ipcref.DTYPES if hasattr(torch, n)]


def tsample(name, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, name)
    if dt == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    if dt.is_complex:
        return torch.randn(shape, generator=g, dtype=dt) * 100
    if dt.is_floating_point:
        return (torch.randn(shape, generator=g) * 100).to(dt)
    info = torch.iinfo(dt)
    return torch.randint(info.min, info.max, shape, generator=g, dtype=dt)


TLAYOUTS = {
    "contiguous": lambda t: t,
    "rows_step2": lambda t: t[::2],
    "transposed": lambda t: t.t(),
    "offset_slice": lambda t: t[1:5, 2:7],
    "permuted_3d": lambda t: t.reshape(2, 3, 8).permute(2, 0, 1),
    "expanded": lambda t: t[1].expand(4, 8),
    "scalar_0d": lambda t: t[2, 5],
    "empty": lambda t: t[:, 3:3],
}
SHAPE = (6, 8)


def other_value(t):
    """A value of t's dtype other than t's (a 0-d tensor)."""
    if t.dtype == torch.bool:
        return ~t
    seven = torch.tensor(7).to(t.dtype)
    return seven if not torch.equal(seven, t) else torch.tensor(9).to(t.dtype)


def check_same(got, want):
    assert isinstance(got, torch.Tensor)
    assert got.dtype == want.dtype
    assert tuple(got.shape) == tuple(want.shape)
    assert torch.equal(got, want)


@pytest.mark.parametrize("layout", sorted(TLAYOUTS))
@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_torch_copy_true_from_default_producer(pair, dtype, layout):
    """Torch memory (copied into ipcref memory on send) comes back with
    recv(copy=True) as a private, writable tensor; bfloat16 too (its copy
    once failed with BufferError: bfloat16 has no buffer format)."""
    src = tsample(dtype, SHAPE)
    view = TLAYOUTS[layout](src)
    want = view.clone()
    got, meta = pair.roundtrip(view, copy=True, meta={"t": 1})
    assert meta == {"t": 1}
    check_same(got, want)
    src.copy_(tsample(dtype, SHAPE, seed=1))  # the source changes ...
    check_same(got, want)  # ... the copy does not
    if got.numel():
        idx = (0,) * got.dim()
        new = other_value(got[idx])
        got[idx] = new  # private and writable
        assert torch.equal(got[idx], new)


@pytest.mark.parametrize("layout", sorted(TLAYOUTS))
@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_torch_zero_copy_writable_shares(make_pair, dtype, layout):
    """From a Context(writable_shares=True), a tensor of Context.empty memory
    arrives as a torch tensor over the same memory (the default for what was
    sent as torch): each side sees the other's writes. bool too (torch 1.x
    takes no DLPack bool: it once failed with 'Unsupported code 6')."""
    pair = make_pair(writable_shares=True)
    buf = pair.prod.empty(SHAPE, dtype, like="torch")
    assert isinstance(buf, torch.Tensor) and buf.dtype == getattr(torch, dtype)
    buf.copy_(tsample(dtype, SHAPE))
    view = TLAYOUTS[layout](buf)
    got, _ = pair.roundtrip(view)
    check_same(got, view)
    buf.copy_(tsample(dtype, SHAPE, seed=1))
    check_same(got, TLAYOUTS[layout](tsample(dtype, SHAPE, seed=1)))
    if got.numel() and layout != "expanded":  # an expanded view repeats
        idx = (0,) * got.dim()
        new = other_value(got[idx])
        got[idx] = new  # the consumer writes: the producer sees it
        assert torch.equal(view[idx], new)


def test_torch_read_only_needs_copy(pair):
    """Default producers share read-only memory; torch has no read-only
    tensors: like='torch' is refused with an ipcref.Error naming copy=True,
    the message is kept, and recv(copy=True) gives it as a private
    writable tensor."""
    buf = pair.prod.empty((3, 4), "float32")
    buf[...] = np.arange(12).reshape(3, 4)
    pair.tx.send(buf, meta=b"ro")
    with pytest.raises(ipcref.Error, match=r"copy=True") as ei:
        pair.rx.recv(timeout=WAIT, like="torch")
    assert ei.value.code < 0 and ei.value.name.startswith("E")
    t, meta = pair.rx.recv(timeout=WAIT, like="torch", copy=True)
    assert meta == b"ro"  # the refused message, kept
    assert isinstance(t, torch.Tensor)
    assert torch.equal(t, torch.arange(12.0).reshape(3, 4))
    t[0, 0] = -1  # private
    assert buf[0, 0] == 0
    buf[0, 1] = 50  # and no longer shared
    assert t[0, 1] == 1

    pair.tx.send(torch.ones(3), meta=b"t")  # sent as torch: the default
    with pytest.raises(ipcref.Error, match=r"copy=True"):
        pair.rx.recv(timeout=WAIT)
    with pytest.raises(ipcref.Error):  # refused again: still kept
        pair.rx.recv(timeout=WAIT)
    a, meta = pair.rx.recv(timeout=WAIT, like="numpy")  # read-only numpy
    assert meta == b"t" and a.tolist() == [1.0] * 3
    assert not a.flags.writeable
    assert pair.nothing_waits()
    # nothing left leased once all is dropped (the exception's traceback
    # holds recv's frame, and with it the arrays it had)
    del t, a, ei
    pair.prod.collect()
    assert pair.prod.stats()["live_slots"] == 0


def test_bfloat16_refused_as_numpy_is_kept(pair):
    src = tsample("bfloat16", (4, 3))
    pair.tx.send(src, meta=b"bf")
    with pytest.raises(TypeError, match="bfloat16"):
        pair.rx.recv(timeout=WAIT, like="numpy")
    got, meta = pair.rx.recv(timeout=WAIT, copy=True)
    assert meta == b"bf"
    check_same(got, src)


def test_torch_like_numpy_and_back(pair):
    a, _ = pair.roundtrip(torch.arange(6, dtype=torch.int32), like="numpy")
    assert isinstance(a, np.ndarray) and a.dtype == np.int32
    assert a.tolist() == list(range(6)) and not a.flags.writeable
    t, _ = pair.roundtrip(np.arange(4.0), like="torch", copy=True)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float64


def test_torch_batch_mixed(pair):
    items = [torch.arange(3), np.arange(4, dtype=np.int16), torch.ones(2, 2)]
    got, _ = pair.roundtrip(items, copy=True)
    assert isinstance(got, list) and len(got) == 3
    assert all(isinstance(g, torch.Tensor) for g in got)
    assert torch.equal(got[1], torch.arange(4, dtype=torch.int16))
    got, _ = pair.roundtrip(items, like="numpy")
    assert all(isinstance(g, np.ndarray) for g in got)


def test_bfloat16_round_trip_writable_shares(make_pair):
    pair = make_pair(writable_shares=True)
    src = tsample("bfloat16", (5, 7))
    got, _ = pair.roundtrip(src.t())  # torch memory: copied
    check_same(got, src.t())
    with pytest.raises(TypeError, match="bfloat16"):
        pair.roundtrip(src, like="numpy")


def test_bfloat16_from_context_empty(pair):
    buf = pair.prod.empty((2, 3), "bfloat16", like="torch")
    assert buf.dtype == torch.bfloat16
    with pytest.raises(TypeError):
        pair.prod.empty(3, "bfloat16")  # numpy has no bfloat16


@pytest.mark.filterwarnings("ignore:ComplexHalf")
def test_torch_dtypes_absent_from_numpy_are_refused(pair):
    with pytest.raises(TypeError):
        pair.tx.send(torch.zeros(2, dtype=torch.complex32))
    with pytest.raises(TypeError):
        pair.tx.send(torch.quantize_per_tensor(torch.zeros(2), 1.0, 0,
                                               torch.qint8))
    assert pair.nothing_waits()


def test_torch_lazy_conj_and_neg_views(pair):
    """torch's lazy conjugate and negative bits travel resolved (the
    storage alone once went: silently wrong values)."""
    c = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj()
    assert c.is_conj()
    got, _ = pair.roundtrip(c, copy=True)
    assert torch.equal(got, c.resolve_conj())
    n = torch.tensor([1.0, 2.0])._neg_view()
    got, _ = pair.roundtrip(n, copy=True)
    assert torch.equal(got, n.resolve_neg())


# A CUDA tensor needs a GPU; without one, torch's "meta" device stands in
# (no skip, so that a run that forbids skips passes on a machine without).
DEVICES = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_non_cpu_tensor_refused(pair, device):
    before = pair.prod.stats()
    with pytest.raises(ValueError, match=device):
        pair.tx.send(torch.zeros(2, device=device))
    with pytest.raises(ValueError, match=device):
        pair.tx.send([torch.zeros(2), torch.zeros(2, device=device)])
    assert pair.prod.stats()["live_slots"] == before["live_slots"]
    assert pair.nothing_waits()


@pytest.mark.filterwarnings("ignore:Sparse CSR")
def test_sparse_tensor_refused_clearly(pair):
    before = pair.prod.stats()["live_slots"]
    for t in (torch.eye(3).to_sparse(), torch.eye(3).to_sparse_csr()):
        with pytest.raises((TypeError, ValueError), match="sparse"):
            pair.tx.send(t)
    assert pair.prod.stats()["live_slots"] == before
    assert pair.nothing_waits()
