"""ipcref: numpy arrays and torch tensors between processes, zero copy.

A producer makes arrays in shared memory (``Context.empty``), fills them and
sends them to peers (``Peer.send``); a consumer receives arrays over the same
memory (``Peer.recv``). Every hand-off takes a lease that the consumer gives
back when its last reference to the array goes, with no system call; a
consumer that dies gives back what it held; the producer never waits for a
consumer. Arrays that do not live in ipcref memory are copied once into a
shared block when sent.

    import ipcref
    with ipcref.Context() as ctx, ctx.listen("@frames") as lst:
        peer = lst.accept()
        a = ctx.empty((1080, 1920), "float32")
        a.fill(1.0)
        peer.send(a, meta={"frame": 0})

    with ipcref.Context() as ctx, ctx.connect("@frames") as peer:
        a, meta = peer.recv()          # a numpy array, read-only here

Metadata is bytes, or None, a bool, int, float, str, bytes, or lists,
tuples and dicts of these (numpy numbers go as Python ones), in a form
whose decoding runs no code; anything else is pickled, and unpickled on
receipt only with ``recv(unpickle=True)`` (trusted peers only: unpickling
runs whatever code the sender chose).

Errors are ``ipcref.Error`` (``.code``, ``.name``, ``.message``), with
``Timeout`` (also a ``TimeoutError``), ``WouldBlock`` (a
``BlockingIOError``) and ``PeerGone`` (a ``ConnectionError``).
"""

import operator
import os
import pickle
import socket as _socket
import struct

import numpy as _np

from . import _ipcref

__all__ = ["Context", "Peer", "Listener", "Error", "Timeout", "WouldBlock",
           "PeerGone", "META_MAX", "MAX_BATCH", "DTYPES"]

META_MAX = _ipcref.META_MAX - 1  # bytes of user metadata (one is ours)
MAX_BATCH = _ipcref.MAX_VIEWS


class Error(Exception):
    """A call the library refused: ``code`` (negative, as in ipcref.h),
    ``name`` ("EPEER") and ``message`` (what the library said)."""

    def __init__(self, code, name, message):
        super().__init__(message)
        self.code, self.name, self.message = code, name, message


class Timeout(Error, TimeoutError):
    """Nothing came within the timeout (or, with timeout=0, nothing now)."""


class WouldBlock(Error, BlockingIOError):
    """A non-blocking peer cannot go on now: wait for its fileno()."""


class PeerGone(Error, ConnectionError):
    """The other side hung up, died, or was refused."""


_ipcref._set_errors(Error, Timeout, WouldBlock, PeerGone)

# ipcref's dtype codes (ipcref.h's ipcref_dtype), by name.
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
          "uint32", "uint64", "float16", "bfloat16", "float32", "float64",
          "complex64", "complex128")
_CODE = {name: i for i, name in enumerate(DTYPES)}
_NUMPY_CODE = {_np.dtype(n): i for i, n in enumerate(DTYPES) if n != "bfloat16"}

_torch = None
_TORCH_CODE = {}


def _load_torch():
    """torch, imported on first need (it is optional); None if absent."""
    global _torch
    if _torch is None:
        try:
            import torch
        except ImportError:
            return None
        _torch = torch
        for name in DTYPES:
            t = getattr(torch, name, None)
            if t is not None:
                _TORCH_CODE[t] = _CODE[name]
    return _torch


def _dtype_code(dtype):
    """ipcref's code for a dtype given as a name, numpy or torch dtype."""
    if isinstance(dtype, str) and dtype in _CODE:
        return _CODE[dtype]
    torch = _torch or (_load_torch() if "torch" in repr(type(dtype)) else None)
    if torch is not None and isinstance(dtype, torch.dtype):
        if dtype in _TORCH_CODE:
            return _TORCH_CODE[dtype]
        raise TypeError("ipcref cannot share torch dtype %s" % dtype)
    try:
        return _NUMPY_CODE[_np.dtype(dtype)]
    except (TypeError, KeyError):
        raise TypeError("ipcref cannot share dtype %r (it shares %s)"
                        % (dtype, ", ".join(DTYPES))) from None


# ---- metadata: our first byte says what was sent, the rest is the user's

_BATCH, _TORCH, _RAW, _PICKLED, _VALUE = 1, 2, 4, 8, 16
_PLAIN = b"\0"  # one numpy array, no metadata
_BF16 = _CODE["bfloat16"]

# The safe form (_VALUE): None, bool, int, float, str, bytes, and lists,
# tuples and dicts of them, each a tag byte and its body (sizes and counts
# as LEB128); a numpy bool, integer or float goes as the Python one.
# Decoding it makes only those types: no code of the sender's runs,
# whatever the bytes say.
_DEPTH = 32  # nesting
_F64 = struct.Struct("<d")
_CONTAINER = {list: b"l", tuple: b"t", dict: b"d"}


class _NotValue(Exception):
    """A value the safe form does not hold (it is pickled then)."""


def _put_size(n, out):
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)


def _put(v, out, depth):
    t = type(v)
    if v is None:
        out += b"N"
    elif t is bool:
        out += b"T" if v else b"F"
    elif t is float:
        out += b"f" + _F64.pack(v)
    elif t in (int, str, bytes):
        if t is int:
            body = v.to_bytes((v.bit_length() + 8) // 8, "little",
                              signed=True)
        else:
            body = v.encode("utf-8", "surrogatepass") if t is str else v
        out += b"i" if t is int else b"s" if t is str else b"b"
        _put_size(len(body), out)
        out += body
    elif t in _CONTAINER and depth < _DEPTH:
        out += _CONTAINER[t]
        _put_size(len(v), out)
        for x in (y for kv in v.items() for y in kv) if t is dict else v:
            _put(x, out, depth + 1)
    elif isinstance(v, _np.generic) and v.dtype.kind in "biuf":
        item = v.item()  # a longdouble's is a longdouble again: pickled
        if type(item) not in (bool, int, float):
            raise _NotValue
        _put(item, out, depth)
    else:
        raise _NotValue


def _get_size(b, i):
    n = shift = 0
    while True:
        c = b[i]
        i += 1
        n |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return n, i
        if shift > 28:
            raise ValueError("a size of more than 4 bytes")


def _get(b, i, depth):
    tag = b[i:i + 1]
    i += 1
    if tag in (b"N", b"T", b"F"):
        return {b"N": None, b"T": True, b"F": False}[tag], i
    if tag == b"f":
        return _F64.unpack_from(b, i)[0], i + _F64.size
    if tag in (b"i", b"s", b"b"):
        n, i = _get_size(b, i)
        body = b[i:i + n]
        if len(body) != n:
            raise ValueError("cut short")
        if tag == b"i":
            v = int.from_bytes(body, "little", signed=True)
        else:
            v = body.decode("utf-8", "surrogatepass") if tag == b"s" \
                else bytes(body)
        return v, i + n
    if tag in (b"l", b"t", b"d") and depth < _DEPTH:
        n, i = _get_size(b, i)
        items = []
        for _ in range(2 * n if tag == b"d" else n):
            x, i = _get(b, i, depth + 1)
            items.append(x)
        if tag == b"d":
            return dict(zip(items[::2], items[1::2])), i
        return (items if tag == b"l" else tuple(items)), i
    raise ValueError("tag %r at byte %d" % (tag, i - 1))


def _meta_encode(meta, batch, torch):
    flags = (_BATCH if batch else 0) | (_TORCH if torch else 0)
    if meta is None:
        body = b""
    elif isinstance(meta, (bytes, bytearray, memoryview)):
        flags |= _RAW
        body = bytes(meta)
    else:
        out = bytearray()
        try:
            _put(meta, out, 0)
            flags |= _VALUE
            body = bytes(out)
        except _NotValue:  # the receiver needs recv(unpickle=True)
            flags |= _PICKLED
            body = pickle.dumps(meta, protocol=pickle.HIGHEST_PROTOCOL)
    if len(body) > META_MAX:
        raise ValueError("metadata of %d bytes: at most %d travel with a "
                         "message" % (len(body), META_MAX))
    return bytes((flags,)) + body


def _meta_decode(raw, unpickle):
    """(flags, the user's metadata); Error (EPROTO) when it cannot be
    decoded, or came pickled and ``unpickle`` is false."""
    if not raw:
        return 0, None
    flags, body = raw[0], raw[1:]
    if flags & _RAW:
        return flags, body
    if flags & _VALUE:
        try:
            meta, end = _get(body, 0, 0)
            if end != len(body):
                raise ValueError("%d bytes past its end" % (len(body) - end))
        except Exception as e:
            raise Error(-5, "EPROTO", "malformed metadata (%s): the message "
                        "is dropped" % e) from None
        return flags, meta
    if flags & _PICKLED:
        if not unpickle:
            raise Error(-5, "EPROTO", "the metadata came pickled, and "
                        "unpickling runs whatever code the sender chose: "
                        "recv(unpickle=True) takes it from a trusted peer; "
                        "the message is dropped")
        try:
            return flags, pickle.loads(body)
        except Exception as e:
            raise Error(-5, "EPROTO", "the metadata could not be unpickled "
                        "(%s: %s): the message is dropped"
                        % (type(e).__name__, e)) from e
    return flags, None


def _as_torch(buf, copy):
    torch = _load_torch()
    if torch is None:
        raise ImportError("like='torch' needs torch, which is not installed")
    if buf.readonly and not copy:
        raise Error(-4, "EBUSY",
                    "this memory is shared read-only by its producer, and "
                    "torch has no read-only tensors: recv(copy=True) for a "
                    "private copy, or a producer Context(writable_shares="
                    "True) to share writable memory as torch.multiprocessing"
                    " does")
    if copy:
        buf = buf._private()
    if buf.dtype == _CODE["bool"]:  # torch 1.x takes no DLPack bool
        return torch.utils.dlpack.from_dlpack(buf._dlpack_u8()).view(
            torch.bool)
    return torch.utils.dlpack.from_dlpack(buf)


def _as_numpy(buf, copy):
    if buf.dtype == _CODE["bfloat16"]:
        raise TypeError("numpy has no bfloat16: receive it with like='torch'")
    a = _np.asarray(buf)
    return a.copy() if copy else a


def _ms(timeout):
    """Seconds (None or inf: forever) as the library's milliseconds (-1:
    forever), clamped to what a C int holds."""
    if timeout is None or timeout == float("inf"):
        return -1
    if timeout != timeout:
        raise ValueError("timeout is NaN")
    return int(min(max(0, timeout * 1000), 2**31 - 1))


# ---- send side: what an object is, to the extension


def _describe(obj):
    """(item for _Peer._send, is_torch) of one array or tensor."""
    if isinstance(obj, _np.ndarray):
        if obj.dtype not in _NUMPY_CODE:
            raise TypeError("ipcref cannot share numpy dtype %s" % obj.dtype)
        return obj, False
    torch = _load_torch() if "torch" in type(obj).__module__ else None
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.device.type != "cpu":
            raise ValueError("a %s tensor: this package sends CPU tensors"
                             % obj.device.type)
        if obj.layout != torch.strided:
            raise TypeError("a %s tensor: ipcref sends dense (strided) "
                            "tensors: send t.to_dense()" % obj.layout)
        if obj.dtype not in _TORCH_CODE:
            raise TypeError("ipcref cannot share torch dtype %s" % obj.dtype)
        if obj.is_conj() or obj.is_neg():  # lazy bits the memory lacks
            obj = obj.resolve_conj().resolve_neg()
        return (obj.data_ptr(), _TORCH_CODE[obj.dtype], tuple(obj.shape),
                tuple(obj.stride()), obj), True
    raise TypeError("send takes a numpy array, a torch CPU tensor, or a list "
                    "of them, not %s" % type(obj).__name__)


class Peer:
    """The other side of a connection: send and receive arrays."""

    def __init__(self, raw, ctx):
        self._raw, self._ctx = raw, ctx
        self._kept = None  # a message a refused conversion left

    def send(self, obj, meta=None):
        """Sends an array or tensor, or a list/tuple of up to MAX_BATCH of
        them in one message, with optional metadata (at most META_MAX
        bytes): bytes travel as they are; None, bools, ints, floats, str,
        bytes and lists, tuples and dicts of them in a safe form (numpy
        numbers as Python ones); anything else is pickled, which the
        receiver takes only with ``recv(unpickle=True)``. Zero copy for
        memory made by ``Context.empty`` (or received); any other memory is
        copied once into a new shared block. Raises WouldBlock (a
        non-blocking socket is full), Timeout, PeerGone, Error; nothing is
        sent then."""
        if meta is None and type(obj) is _np.ndarray and \
                obj.dtype in _NUMPY_CODE:  # the common case, kept short
            self._peer()._send([obj], _PLAIN)
            return
        batch = isinstance(obj, (list, tuple))
        objs = list(obj) if batch else [obj]
        if not objs:
            raise ValueError("send: an empty batch")
        items, torch = [], False
        for o in objs:
            item, is_torch = _describe(o)
            items.append(item)
            torch = torch or is_torch
        self._peer()._send(items, _meta_encode(meta, batch, torch))

    def recv(self, timeout=None, like=None, copy=False, unpickle=False):
        """Receives one message: ``(obj, meta)``, obj an array, or a list
        when a batch was sent. ``like``: "numpy" or "torch" (default: what
        the sender sent). ``timeout`` in seconds (None or inf: wait; 0:
        poll). Arrays of memory this process may not write are read-only
        numpy arrays; torch has no such tensors, so ``like="torch"`` of such
        memory raises Error unless ``copy=True``; the message is kept then,
        and the next recv returns it. Metadata that came pickled is
        unpickled only with ``unpickle=True``: for trusted peers only, as
        unpickling runs whatever code the sender chose. Metadata that cannot
        be decoded (malformed, pickled without ``unpickle``, or failing to
        unpickle) raises Error (name "EPROTO") once, and the message is
        dropped: the next recv gets the next one. Raises Timeout, PeerGone,
        Error."""
        if like is None and not copy and self._kept is None:
            try:  # the common case, kept short: one numpy array, no meta
                bufs, raw = self._peer()._recv(_ms(timeout))
            except WouldBlock as e:  # nothing now (timeout=0)
                raise Timeout(e.code, e.name, e.message) from None
            if raw == _PLAIN and len(bufs) == 1 and \
                    bufs[0].dtype != _BF16:
                return _np.asarray(bufs[0]), None
        elif like not in (None, "numpy", "torch"):
            raise ValueError("like is 'numpy' or 'torch', not %r" % (like,))
        elif self._kept is not None:  # refused by a call before: its turn
            bufs, raw = self._kept
        else:
            ms = _ms(timeout)
            try:
                bufs, raw = self._peer()._recv(ms)
            except WouldBlock as e:  # nothing now (timeout=0)
                raise Timeout(e.code, e.name, e.message) from None
        self._kept = None  # metadata that fails to decode drops the message
        try:
            flags, meta = _meta_decode(raw, unpickle)
        except Error:
            del bufs  # given back now, not once the exception is gone
            raise
        if like is None:
            like = "torch" if flags & _TORCH else "numpy"
        convert = _as_torch if like == "torch" else _as_numpy
        try:
            out = [convert(b, copy) for b in bufs]
        except Exception:
            self._kept = (bufs, raw)  # nothing lost: the next recv has it
            raise
        return (out if flags & _BATCH or len(out) > 1 else out[0]), meta

    def set_options(self, send_timeout=None, hello_timeout=None,
                    max_bytes_held=None, ring_bytes=None, spin_us=None,
                    max_maps=None, max_mapped_bytes=None):
        """The peer's options (None: the default): ``send_timeout`` (s) a
        blocking send waits for room at most; ``hello_timeout`` (s) the other
        side's hello may take; ``max_bytes_held``, the bytes of our arrays
        the other side may hold: a send past it waits for returns (a
        non-blocking peer raises WouldBlock, and its fileno() wakes when
        room comes back); ``ring_bytes``, the size of the shared-memory
        channel this side's hand-offs take (default 64 KiB; 1 for none, the
        socket then carries everything); ``spin_us``, how long a receive
        that finds nothing spins before it sleeps (0: never; default: where
        it pays, see the C library's IPCREF_SPIN_AUTO); ``max_maps`` and
        ``max_mapped_bytes``, how many segments (and their bytes) the other
        side's messages may keep mapped here: a message past them is
        refused (Error, name "ERANGE"), its arrays given back to the sender,
        and the next one that fits comes (default: no cap)."""
        def opt(s):  # 0: the default; inf: the longest a C int holds
            if s is None:
                return 0
            ms = _ms(s)
            return 2**31 - 1 if ms < 0 else max(1, ms)

        def size(name, n):  # 0: the default
            n = int(n or 0)
            if n < 0:
                raise ValueError("%s must be 0 or more (None: the default)"
                                 % name)
            return n
        spin = -1 if spin_us is None else int(spin_us)
        if spin < 0 and spin_us is not None:
            raise ValueError("spin_us must be 0 or more (None: the default)")
        self._peer()._set_options(opt(send_timeout), opt(hello_timeout),
                                  size("max_bytes_held", max_bytes_held),
                                  size("ring_bytes", ring_bytes), spin,
                                  size("max_maps", max_maps),
                                  size("max_mapped_bytes", max_mapped_bytes))

    def fileno(self):
        """An fd readable whenever recv(timeout=0) has something to say, for
        selectors and asyncio loops."""
        return self._peer().fileno()

    @property
    def pid(self):
        """The pid of the process on the other side."""
        return self._peer()._pid()

    def stats(self):
        """What the other side holds of ours: leases, bytes_held, ... ."""
        return self._peer().stats()

    def close(self):
        """Closes the connection (what it holds stays leased until it lets
        go, or dies)."""
        if self._raw is not None:
            self._raw.close()
            self._raw = None

    def _peer(self):
        if self._raw is None:
            raise ValueError("this Peer is closed")
        return self._raw

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Listener:
    """A listening socket at a path; ``accept`` gives peers (non-blocking
    ones when the listener is: ``blocking=False``, for event loops, whose
    sends raise WouldBlock instead of waiting on a consumer)."""

    def __init__(self, ctx, path, blocking=True):
        self._ctx, self.path = ctx, path
        self._fd = ctx._raw()._listen(path)
        self._pid = os.getpid()  # only it unlinks the path (not a fork)
        if not blocking:
            os.set_blocking(self._fd, False)

    def accept(self, timeout=None):
        """The next peer to connect (Timeout if none within timeout s)."""
        if self._fd < 0:
            raise ValueError("this Listener is closed")
        ms = _ms(timeout)
        return Peer(self._ctx._raw()._accept(self._fd, ms), self._ctx)

    def fileno(self):
        return self._fd

    def close(self):
        """Closes the socket, and removes its path (not in the abstract
        namespace) in the process that listened, never in a forked
        child: the parent may still listen there."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            if not self.path.startswith("@") and os.getpid() == self._pid:
                try:
                    os.unlink(self.path)
                except OSError:
                    pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Context:
    """The library's state in this process: shared memory, peers, leases.
    Options (keywords; 0 means the default): segment_size, max_bytes,
    segment_cache, writable_shares (consumers may write what they get, as
    with torch.multiprocessing), isolate (a segment per array), ledger_slots,
    max_maps and max_mapped_bytes (what all peers may keep mapped here: see
    Peer.set_options). A negative size is refused (ValueError).
    """

    _SIZES = ("segment_size", "max_bytes", "segment_cache", "ledger_slots",
              "max_maps", "max_mapped_bytes")

    def __init__(self, **options):
        for name in self._SIZES:  # the C side takes them unsigned
            if int(options.get(name) or 0) < 0:
                raise ValueError("%s must be 0 or more (0: the default)"
                                 % name)
        self._ctx = _ipcref._Context(**options)

    def empty(self, shape, dtype="float32", like="numpy"):
        """An uninitialized array in shared memory: fill it, then send it
        (the fill is the only copy)."""
        # Every check first: a refusal must leave no segment made.
        if like not in ("numpy", "torch"):
            raise ValueError("like is 'numpy' or 'torch', not %r" % (like,))
        code = _dtype_code(dtype)
        if like == "numpy" and code == _BF16:
            raise TypeError("numpy has no bfloat16: like='torch'")
        if like == "torch":
            if _load_torch() is None:
                raise ImportError("like='torch' needs torch, which is not "
                                  "installed")
            if code not in _TORCH_CODE.values():
                raise TypeError("this torch has no %s" % DTYPES[code])
        try:  # one size (an int, a numpy integer): 1-d
            shape = (operator.index(shape),)
        except TypeError:
            pass
        dims = tuple(operator.index(s) for s in shape)  # 2.5 is no size
        buf = self._raw()._empty(code, dims)
        return (_as_numpy if like == "numpy" else _as_torch)(buf, False)

    def listen(self, path, blocking=True):
        """A Listener at ``path`` ("@name": the abstract namespace)."""
        return Listener(self, path, blocking)

    def connect(self, path):
        """A Peer connected to the listener at ``path`` (PeerGone: nobody
        listens there)."""
        return Peer(self._raw()._connect(path), self)

    def adopt(self, sock):
        """A Peer over a connected AF_UNIX socket (SOCK_SEQPACKET or
        SOCK_STREAM), which it takes over (the socket object is detached)."""
        if not isinstance(sock, _socket.socket):
            raise TypeError("adopt takes a socket.socket")
        if sock.family != _socket.AF_UNIX:
            raise ValueError("adopt takes an AF_UNIX socket")
        return Peer(self._raw()._adopt(sock.detach()), self)

    def stats(self):
        return self._raw().stats()

    def collect(self):
        """Frees what consumers gave back; returns the bytes freed."""
        return self._raw().collect()

    def fileno(self):
        """An fd readable when a process this context deals with dies."""
        return self._raw().fileno()

    def close(self):
        """Frees the context (arrays made or received stay valid).
        RuntimeError, and nothing freed, while another thread is in a call
        on it or on one of its peers."""
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None

    def _raw(self):
        if self._ctx is None:
            raise ValueError("this Context is closed")
        return self._ctx

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
