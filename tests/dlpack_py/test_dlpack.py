#!/usr/bin/python3
"""DLPack with real clients: NumPy (required) and PyTorch (when installed;
required when IPCREF_REQUIRE_ALL=1).

    test_dlpack.py path/to/libdlpack_test.so
    test_dlpack.py path/to/libdlpack_test.so --consumer ro|rw FD   (internal)

The library (tests/dlpack_py/dlpack_lib.c, built from ipcref.h) makes
ipcref views; this script hands them to numpy.from_dlpack and
torch.utils.dlpack.from_dlpack and checks values, shape, strides and that
no byte was copied, then that dropping the consumer's array drops our
strong count. The other way, NumPy arrays and torch tensors go into ipcref
views; the values are read back through ipcref, and the producer's deleter
must run exactly once, when the view is released.

Received memory: this process shares a view (it is the producer) with a
consumer, a second Python process started with --consumer over a socket.
A consumer maps what it receives read-only: numpy and torch get an
exception from the legacy export, never a tensor whose write would kill the
process, and the producer's bytes stay as they were. With the producer's
writable_shares, torch's t.add_(1) in the consumer is seen by the producer.
A consumer killed by a signal (SIGSEGV) is a failure.

Prints one line per check group, then "N passed, N failed"; exits 1 on any
failure.
"""
import ctypes
import gc
import os
import socket
import subprocess
import sys
import time

import numpy as np

# ipcref dtypes, in the order of ipcref_dtype.
BOOL, I8, I16, I32, I64, U8, U16, U32, U64, F16, BF16, F32, F64, C64, C128 = range(15)
DTYPE_NAMES = ["bool", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64",
               "f16", "bf16", "f32", "f64", "c64", "c128"]
NUMPY_DTYPES = {BOOL: np.bool_, I8: np.int8, I16: np.int16, I32: np.int32,
                I64: np.int64, U8: np.uint8, U16: np.uint16, U32: np.uint32,
                U64: np.uint64, F16: np.float16, F32: np.float32,
                F64: np.float64, C64: np.complex64, C128: np.complex128}
ITEMSIZE = [1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8, 8, 16]
MAX_DIMS = 16  # at least IPCREF_MAX_DIMS

passed = 0
failed = 0
notes = []


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("    FAIL: " + what)
    return cond


# ---------------------------------------------------------------- the library

CONSUMER = len(sys.argv) == 5 and sys.argv[2] == "--consumer"
if len(sys.argv) != 2 and not CONSUMER:
    sys.exit("usage: test_dlpack.py path/to/libdlpack_test.so")
# PyDLL: the GIL stays held during calls, so a producer's deleter (NumPy's
# decrefs its array) may run inside them.
lib = ctypes.PyDLL(sys.argv[1])
P = ctypes.c_void_p
I64P = ctypes.POINTER(ctypes.c_int64)
lib.dl_view_new.restype = P
lib.dl_view_new.argtypes = [ctypes.c_int, ctypes.c_int, I64P]
lib.dl_view_transpose.restype = P
lib.dl_view_transpose.argtypes = [P, ctypes.c_int, ctypes.c_int]
lib.dl_view_slice.restype = P
lib.dl_view_slice.argtypes = [P, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
lib.dl_view_flip.restype = P
lib.dl_view_flip.argtypes = [P, ctypes.c_int]
lib.dl_view_select.restype = P
lib.dl_view_select.argtypes = [P, ctypes.c_int, ctypes.c_int64]
lib.dl_view_free.restype = None
lib.dl_view_free.argtypes = [P]
lib.dl_strong_count.restype = ctypes.c_long
lib.dl_strong_count.argtypes = [P]
lib.dl_view_info.restype = ctypes.c_int
lib.dl_view_info.argtypes = [P, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int), I64P, I64P]
lib.dl_view_addr.restype = ctypes.c_size_t
lib.dl_view_addr.argtypes = [P]
lib.dl_view_read.restype = ctypes.c_int64
lib.dl_view_read.argtypes = [P, P, ctypes.c_int64]
lib.dl_view_writable.restype = ctypes.c_int
lib.dl_view_writable.argtypes = [P]
lib.dl_to_dlpack.restype = P
lib.dl_to_dlpack.argtypes = [P]
lib.dl_call_deleter.restype = None
lib.dl_call_deleter.argtypes = [P]
lib.dl_deleter_calls.restype = ctypes.c_long
lib.dl_deleter_calls.argtypes = []
lib.dl_from_dlpack.restype = P
lib.dl_from_dlpack.argtypes = [P, ctypes.POINTER(ctypes.c_int)]
lib.dl_strerror.restype = ctypes.c_char_p
lib.dl_strerror.argtypes = [ctypes.c_int]
IP = ctypes.POINTER(ctypes.c_int)
lib.dl_install_hook.restype = None
lib.dl_install_hook.argtypes = []
lib.dl_last_error.restype = ctypes.c_char_p
lib.dl_last_error.argtypes = []
lib.dl_to_dlpack_err.restype = P
lib.dl_to_dlpack_err.argtypes = [P, IP]
lib.dl_ctx_new.restype = P
lib.dl_ctx_new.argtypes = [ctypes.c_int, IP]
lib.dl_ctx_free.restype = None
lib.dl_ctx_free.argtypes = [P]
lib.dl_peer_new.restype = P
lib.dl_peer_new.argtypes = [P, ctypes.c_int, IP]
lib.dl_peer_free.restype = None
lib.dl_peer_free.argtypes = [P]
lib.dl_shared_view_new.restype = P
lib.dl_shared_view_new.argtypes = [P, ctypes.c_int, ctypes.c_int, I64P, IP]
lib.dl_send.restype = ctypes.c_int
lib.dl_send.argtypes = [P, P]
lib.dl_recv.restype = P
lib.dl_recv.argtypes = [P, ctypes.c_int, IP]
lib.dl_view_private_copy.restype = P
lib.dl_view_private_copy.argtypes = [P, IP]
lib.dl_view_same_buffer.restype = ctypes.c_int
lib.dl_view_same_buffer.argtypes = [P, P]
lib.dl_install_hook()
ENEEDCOPY = -12

# The capsule protocol. Capsules are passed by address (id()). Their
# destructor is in the C library (dl_capsule_destructor): it runs while a
# consumer's exception may be set, where a ctypes callback cannot.
api = ctypes.pythonapi
api.PyCapsule_New.restype = ctypes.py_object
api.PyCapsule_New.argtypes = [P, ctypes.c_char_p, P]
api.PyCapsule_IsValid.restype = ctypes.c_int
api.PyCapsule_IsValid.argtypes = [P, ctypes.c_char_p]
api.PyCapsule_GetPointer.restype = P
api.PyCapsule_GetPointer.argtypes = [P, ctypes.c_char_p]
api.PyCapsule_SetName.restype = ctypes.c_int
api.PyCapsule_SetName.argtypes = [P, ctypes.c_char_p]
# Names live as long as the module: a capsule keeps a pointer to its name.
DLTENSOR = b"dltensor"
USED = b"used_dltensor"

CAPSULE_DESTRUCTOR = ctypes.cast(lib.dl_capsule_destructor, P)


class ExportError(BufferError):
    """ipcref_view_to_dlpack refused: .code is its result, and the message
    what the error hook heard (for ENEEDCOPY, the ways out)."""

    def __init__(self, code, message):
        BufferError.__init__(self, "ipcref_view_to_dlpack: %s: %s"
                             % (lib.dl_strerror(code).decode(), message))
        self.code = code


def capsule_of(view):
    """A "dltensor" capsule of our legacy export of view, or ExportError."""
    err = ctypes.c_int()
    lib.dl_last_error()  # forget what came before
    mt = lib.dl_to_dlpack_err(view, ctypes.byref(err))
    if not mt:
        raise ExportError(err.value, lib.dl_last_error().decode())
    return api.PyCapsule_New(mt, DLTENSOR, CAPSULE_DESTRUCTOR)


class Exported:
    """What numpy.from_dlpack and torch's from_dlpack take: an object with
    __dlpack__ and __dlpack_device__. Each __dlpack__ call is one export."""

    def __init__(self, view):
        self.view = view

    def __dlpack__(self, stream=None):
        return capsule_of(self.view)

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU, device 0


def view_info(v):
    dt, nd = ctypes.c_int(), ctypes.c_int()
    shape = (ctypes.c_int64 * MAX_DIMS)()
    strides = (ctypes.c_int64 * MAX_DIMS)()
    lib.dl_view_info(v, ctypes.byref(dt), ctypes.byref(nd), shape, strides)
    return dt.value, tuple(shape[:nd.value]), tuple(strides[:nd.value])


def view_bytes(v):
    dt, shape, _ = view_info(v)
    n = int(np.prod(shape, dtype=np.int64)) * ITEMSIZE[dt]
    buf = ctypes.create_string_buffer(max(n, 1))
    got = lib.dl_view_read(v, buf, n)
    return buf.raw[:got] if got >= 0 else None


def new_view(dt, shape):
    arr = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    v = lib.dl_view_new(dt, len(shape), arr)
    assert v, "dl_view_new failed"
    return v


def pattern_values(n):
    """The pattern of dlpack_lib.c, element k, per dtype family."""
    k = np.arange(n, dtype=np.int64)
    return {
        "bool": k % 3 == 0,
        "signed": k % 100 - 50,
        "unsigned": k % 200,
        "float": ((k % 64) - 32) * 0.25,
        "complex": k * 0.5 - 1j * (k % 7),
    }


def family(dt):
    if dt == BOOL:
        return "bool"
    if dt in (I8, I16, I32, I64):
        return "signed"
    if dt in (U8, U16, U32, U64):
        return "unsigned"
    if dt in (C64, C128):
        return "complex"
    return "float"


def expected_numpy(dt, shape):
    n = int(np.prod(shape, dtype=np.int64))
    return pattern_values(n)[family(dt)].astype(NUMPY_DTYPES[dt]).reshape(shape)


# The strided cases: (name, op on an ipcref view, the same op in numpy).
SHAPE = (3, 4, 5)
CASES = [
    ("contiguous", lambda v: None, lambda a: a),
    ("transposed", lambda v: lib.dl_view_transpose(v, 0, 2), lambda a: a.transpose(2, 1, 0)),
    ("sliced step 2", lambda v: lib.dl_view_slice(v, 1, 1, 4, 2), lambda a: a[:, 1:4:2, :]),
    ("flipped (negative stride)", lambda v: lib.dl_view_flip(v, 2), lambda a: a[:, :, ::-1]),
    ("selected (offset)", lambda v: lib.dl_view_select(v, 0, 2), lambda a: a[2]),
    ("empty", lambda v: lib.dl_view_slice(v, 0, 2, 2, 1), lambda a: a[2:2]),
]


def derive(base, op):
    d = op(base)
    return d if d is not None else None


# ---------------------------------------------------------------- ipcref -> numpy

def numpy_consumes(dt):
    """Every strided case of dtype dt goes into numpy.from_dlpack."""
    base = new_view(dt, SHAPE)
    expected_base = expected_numpy(dt, SHAPE)
    for name, op, np_op in CASES:
        what = "ipcref->numpy %s %s" % (DTYPE_NAMES[dt], name)
        d = op(base)
        v = d if d else base
        count = lib.dl_strong_count(base)
        arr = np.from_dlpack(Exported(v))
        exp = np_op(expected_base)
        _, shape, strides = view_info(v)
        check(arr.dtype == NUMPY_DTYPES[dt], what + ": dtype " + str(arr.dtype))
        check(arr.shape == shape == exp.shape, what + ": shape %s" % (arr.shape,))
        check(arr.strides == tuple(s * ITEMSIZE[dt] for s in strides),
              what + ": strides %s vs %s" % (arr.strides, strides))
        check(np.array_equal(arr, exp), what + ": values")
        if arr.size:
            check(arr.ctypes.data == lib.dl_view_addr(v), what + ": not zero-copy")
        check(lib.dl_strong_count(base) == count + 1, what + ": export holds a reference")
        del arr
        gc.collect()
        check(lib.dl_strong_count(base) == count, what + ": deleting the array drops it")
        if d:
            lib.dl_view_free(d)
    check(lib.dl_strong_count(base) == 1, "ipcref->numpy %s: all references back" % DTYPE_NAMES[dt])
    lib.dl_view_free(base)


def numpy_refuses(dt, why):
    """A dtype this NumPy cannot take: a clean error and our reference back."""
    base = new_view(dt, SHAPE)
    try:
        np.from_dlpack(Exported(base))
        ok = False
    except (BufferError, TypeError, RuntimeError, ValueError):
        ok = True
    gc.collect()
    check(ok, "numpy refuses %s (%s)" % (DTYPE_NAMES[dt], why))
    check(lib.dl_strong_count(base) == 1,
          "numpy refusing %s drops the export's reference" % DTYPE_NAMES[dt])
    lib.dl_view_free(base)


# ---------------------------------------------------------------- producers -> ipcref

def import_capsule(cap):
    """Consumes a "dltensor" capsule into an ipcref view: (view, err)."""
    ptr = api.PyCapsule_GetPointer(id(cap), DLTENSOR)
    err = ctypes.c_int()
    v = lib.dl_from_dlpack(ptr, ctypes.byref(err))
    if v:
        api.PyCapsule_SetName(id(cap), USED)  # ours now
    return v, err.value


def check_imported(v, dt, ref, addr, what):
    """The view has ref's dtype, shape, strides and values, at addr."""
    got_dt, shape, strides = view_info(v)
    check(got_dt == dt, what + ": dtype %s" % DTYPE_NAMES[got_dt])
    check(shape == tuple(ref.shape), what + ": shape %s" % (shape,))
    check(tuple(s * ITEMSIZE[dt] for s in strides) == tuple(ref.strides),
          what + ": strides %s vs bytes %s" % (strides, ref.strides))
    raw = view_bytes(v)
    check(raw == np.ascontiguousarray(ref).tobytes(), what + ": values")
    if ref.size:
        check(lib.dl_view_addr(v) == addr, what + ": not zero-copy")


def numpy_produces(dt):
    """NumPy arrays (strided too) go into ipcref views and back out."""
    base = expected_numpy(dt, SHAPE)
    for name, _, np_op in CASES:
        what = "numpy->ipcref %s %s" % (DTYPE_NAMES[dt], name)
        arr = np_op(base)
        refs = sys.getrefcount(arr)
        calls = lib.dl_deleter_calls()
        cap = arr.__dlpack__()
        v, err = import_capsule(cap)
        del cap
        if not check(v, what + ": import failed: %s" % lib.dl_strerror(err).decode()):
            continue
        check(lib.dl_deleter_calls() == calls, what + ": deleter ran too early")
        check(sys.getrefcount(arr) == refs + 1, what + ": the tensor holds the array")
        check_imported(v, dt, arr, arr.ctypes.data, what)
        # And back to numpy: the same memory, through both hand-offs.
        back = np.from_dlpack(Exported(v))
        check(np.array_equal(back, arr), what + ": round trip values")
        if arr.size:
            check(back.ctypes.data == arr.ctypes.data, what + ": round trip copied")
        lib.dl_view_free(v)
        check(lib.dl_deleter_calls() == calls, what + ": deleter ran while numpy holds it")
        del back
        gc.collect()
        check(lib.dl_deleter_calls() == calls + 1, what + ": deleter ran %d times"
              % (lib.dl_deleter_calls() - calls))
        check(sys.getrefcount(arr) == refs, what + ": numpy's reference not released")


def numpy_import_errors():
    """A tensor ipcref refuses stays the producer's: not consumed, and its
    deleter runs once, when the capsule goes (not by us)."""
    arr = np.arange(6, dtype=np.float32)
    refs = sys.getrefcount(arr)
    calls = lib.dl_deleter_calls()
    err = ctypes.c_int()
    # A NULL tensor.
    check(not lib.dl_from_dlpack(None, ctypes.byref(err)) and err.value == -1,
          "import NULL: EINVAL")
    # A real numpy tensor with lanes forced to 2 (DLTensor.dtype.lanes).
    cap = arr.__dlpack__()
    ptr = api.PyCapsule_GetPointer(id(cap), DLTENSOR)
    # DLTensor: data (8), device (8), ndim (4), dtype at offset 20: code,
    # bits, lanes (uint16 at 22).
    lanes = ctypes.c_uint16.from_address(ptr + 22)
    lanes.value = 2
    v = lib.dl_from_dlpack(ptr, ctypes.byref(err))
    check(not v and err.value == -1, "import lanes=2: EINVAL (got %d)" % err.value)
    lanes.value = 1
    check(lib.dl_deleter_calls() == calls, "refused import: deleter not called")
    del cap  # numpy's capsule destructor deletes it (through our counter)
    gc.collect()
    check(lib.dl_deleter_calls() == calls + 1, "refused import: producer deletes once")
    check(sys.getrefcount(arr) == refs, "refused import: no reference leaked")


# ---------------------------------------------------------------- torch

def torch_tests(torch):
    import torch.utils.dlpack as tud
    tdt = {I8: torch.int8, I16: torch.int16, I32: torch.int32, I64: torch.int64,
           U8: torch.uint8, F16: torch.float16, BF16: torch.bfloat16,
           F32: torch.float32, F64: torch.float64, C64: torch.complex64,
           C128: torch.complex128, BOOL: torch.bool}

    def expected_torch(dt, shape):
        n = int(np.prod(shape, dtype=np.int64))
        vals = pattern_values(n)[family(dt)]
        if dt == BF16:
            return torch.tensor(vals.astype(np.float32)).to(torch.bfloat16).reshape(shape)
        return torch.from_numpy(vals.astype(NUMPY_DTYPES[dt])).reshape(shape)

    torch_ops = {
        "contiguous": lambda a: a,
        "transposed": lambda a: a.permute(2, 1, 0),
        "sliced step 2": lambda a: a[:, 1:4:2, :],
        "selected (offset)": lambda a: a[2],
        "empty": lambda a: a[2:2],
    }
    for dt in sorted(tdt):
        # Does this torch take and give the dtype at all? (1.x: no bool.)
        try:
            tud.to_dlpack(torch.zeros(1, dtype=tdt[dt]))
            supported = True
        except (RuntimeError, TypeError):
            supported = False
        if not supported:
            base = new_view(dt, SHAPE)
            try:
                tud.from_dlpack(Exported(base))
                ok = False
            except (RuntimeError, TypeError, BufferError):
                ok = True
            gc.collect()
            check(ok, "torch refuses %s" % DTYPE_NAMES[dt])
            check(lib.dl_strong_count(base) == 1, "torch refusing %s drops our reference"
                  % DTYPE_NAMES[dt])
            lib.dl_view_free(base)
            notes.append("torch %s has no %s in DLPack: checked that it refuses cleanly"
                         % (torch.__version__, DTYPE_NAMES[dt]))
            continue
        base = new_view(dt, SHAPE)
        expected_base = expected_torch(dt, SHAPE)
        for name, op, _ in CASES:
            if name not in torch_ops:
                continue  # torch has no negative strides
            what = "ipcref->torch %s %s" % (DTYPE_NAMES[dt], name)
            d = op(base)
            v = d if d else base
            count = lib.dl_strong_count(base)
            t = tud.from_dlpack(Exported(v))
            exp = torch_ops[name](expected_base)
            _, shape, strides = view_info(v)
            check(t.dtype == tdt[dt], what + ": dtype")
            check(tuple(t.shape) == shape, what + ": shape")
            check(tuple(t.stride()) == strides, what + ": strides %s vs %s" % (t.stride(), strides))
            check(torch.equal(t, exp), what + ": values")
            if t.numel():
                check(t.data_ptr() == lib.dl_view_addr(v), what + ": not zero-copy")
            check(lib.dl_strong_count(base) == count + 1, what + ": export holds a reference")
            del t
            gc.collect()
            check(lib.dl_strong_count(base) == count, what + ": deleting the tensor drops it")
            if d:
                lib.dl_view_free(d)
        lib.dl_view_free(base)

        # torch -> ipcref -> torch.
        for name, f in torch_ops.items():
            what = "torch->ipcref %s %s" % (DTYPE_NAMES[dt], name)
            t = f(expected_torch(dt, SHAPE))
            calls = lib.dl_deleter_calls()
            cap = tud.to_dlpack(t)
            v, err = import_capsule(cap)
            del cap
            if not check(v, what + ": import failed: %s" % lib.dl_strerror(err).decode()):
                continue
            got_dt, shape, strides = view_info(v)
            check(got_dt == dt, what + ": dtype")
            check(shape == tuple(t.shape), what + ": shape")
            if t.numel():  # torch exports made-up strides for empty tensors
                check(strides == tuple(t.stride()), what + ": strides")
            raw = view_bytes(v)
            if dt == BF16:
                ref = t.contiguous().view(torch.int16).numpy().tobytes()
            else:
                ref = t.contiguous().numpy().tobytes()
            check(raw == ref, what + ": values")
            if t.numel():
                check(lib.dl_view_addr(v) == t.data_ptr(), what + ": not zero-copy")
            back = tud.from_dlpack(Exported(v))
            check(torch.equal(back, t), what + ": round trip values")
            lib.dl_view_free(v)
            check(lib.dl_deleter_calls() == calls, what + ": deleter ran while torch holds it")
            del back
            gc.collect()
            check(lib.dl_deleter_calls() == calls + 1, what + ": deleter ran %d times"
                  % (lib.dl_deleter_calls() - calls))

    # Negative strides: torch has none. torch 1.13 does not refuse them
    # cleanly either (an uncaught C++ exception aborts the process), so they
    # are not handed to it here.
    notes.append("torch %s: negative strides not tried (torch has none; 1.13 aborts)"
                 % torch.__version__)


# ---------------------------------------------------------------- received memory

# The shared view: float32, a shape torch and numpy take as they are.
SHARED_SHAPE = (4, 8)
RECV_MS = 20000
CONSUMER_TIMEOUT_S = 180


def err_ptr():
    return ctypes.byref(ctypes.c_int())


def check_refusal(exc, what):
    """exc is our ExportError for ENEEDCOPY and names both ways out."""
    msg = str(exc)
    ok = check(isinstance(exc, ExportError) and exc.code == ENEEDCOPY,
               what + ": %s: %s" % (type(exc).__name__, msg))
    check("ipcref_view_make_mut" in msg and "writable_shares" in msg,
          what + ": the message names a private copy and writable_shares: " + msg)
    return ok


def consumer_numpy_read_only(v, expected):
    """numpy and a read-only mapping: the legacy export refuses (an
    exception, no array); a read-only array over the same memory refuses
    writes with ValueError; a private copy goes out."""
    try:
        arr = np.from_dlpack(Exported(v))
        exc = None
    except Exception as e:  # noqa: BLE001 - the type is checked
        arr, exc = None, e
    if exc is not None:
        check_refusal(exc, "numpy: legacy export of received read-only memory")
    else:
        check(False, "numpy: from_dlpack of received read-only memory gave an "
              "array (writeable=%s)" % arr.flags.writeable)
        try:
            arr[...] = 1  # numpy 1.24's from_dlpack arrays are read-only
        except ValueError:
            pass
        del arr
    # Zero-copy reading without DLPack: a read-only memoryview.
    n = int(np.prod(SHARED_SHAPE)) * 4
    api.PyMemoryView_FromMemory.restype = ctypes.py_object
    api.PyMemoryView_FromMemory.argtypes = [P, ctypes.c_ssize_t, ctypes.c_int]
    mem = api.PyMemoryView_FromMemory(lib.dl_view_addr(v), n, 0x100)  # PyBUF_READ
    ro = np.frombuffer(mem, dtype=np.float32).reshape(SHARED_SHAPE)
    check(ro.ctypes.data == lib.dl_view_addr(v), "numpy: read-only array copied")
    check(np.array_equal(ro, expected), "numpy: read-only array values")
    check(not ro.flags.writeable, "numpy: read-only array is writeable")
    for name, write in (("a[...] = 1", lambda: ro.__setitem__(Ellipsis, 1)),
                        ("a += 1", lambda: np.add(ro, 1, out=ro)),
                        ("setflags(write=True)", lambda: ro.setflags(write=True))):
        try:
            write()
            ok = False
        except ValueError:
            ok = True
        check(ok, "numpy: %s on received memory did not raise ValueError" % name)
    del ro, mem
    # A private copy goes out (numpy 1.24 makes it read-only anyway).
    c = lib.dl_view_private_copy(v, err_ptr())
    if check(c, "numpy: private copy failed"):
        check(not lib.dl_view_same_buffer(c, v), "numpy: the copy shares the buffer")
        a = np.from_dlpack(Exported(c))
        check(np.array_equal(a, expected), "numpy: private copy values")
        del a
        gc.collect()
        lib.dl_view_free(c)


def consumer_torch_read_only(torch, v, expected):
    """torch (legacy DLPack only in 1.13) and a read-only mapping: no tensor
    but an exception; a tensor that did come would be written as a user
    would (t.add_(1)), which kills a process that got one. A private copy
    goes out, and its writes stay here."""
    import torch.utils.dlpack as tud
    for what, get in (
            ("torch.utils.dlpack.from_dlpack(obj)", lambda: tud.from_dlpack(Exported(v))),
            ("torch.utils.dlpack.from_dlpack(capsule)", lambda: tud.from_dlpack(capsule_of(v)))):
        try:
            t = get()
            exc = None
        except Exception as e:  # noqa: BLE001 - the type is checked
            t, exc = None, e
        if exc is not None:
            check_refusal(exc, "torch: " + what)
        else:
            check(False, "torch: %s of received read-only memory gave a tensor" % what)
            print("    writing it with t.add_(1) (SIGSEGV where the mapping is read-only)")
            sys.stdout.flush()
            t.add_(1)
            del t
    check(lib.dl_strong_count(v) == 1, "torch: a refused export kept a reference")
    c = lib.dl_view_private_copy(v, err_ptr())
    if check(c, "torch: private copy failed"):
        t = tud.from_dlpack(Exported(c))
        t.add_(1)
        check(torch.equal(t, torch.from_numpy(expected + 1)), "torch: add_ on the private copy")
        del t
        gc.collect()
        lib.dl_view_free(c)
    check(np.frombuffer(view_bytes(v), dtype=np.float32).reshape(SHARED_SHAPE).tolist()
          == expected.tolist(), "torch: the received memory changed")


def consumer_writable(torch, v, expected):
    """The producer opened its shares for writing: the legacy export goes
    ahead, zero-copy; torch's add_ writes the producer's memory."""
    a = np.from_dlpack(Exported(v))
    check(np.array_equal(a, expected), "writable shares: numpy values")
    check(a.ctypes.data == lib.dl_view_addr(v), "writable shares: numpy copied")
    del a
    gc.collect()
    if torch is None:
        return
    import torch.utils.dlpack as tud
    t = tud.from_dlpack(Exported(v))
    check(t.data_ptr() == lib.dl_view_addr(v), "writable shares: torch copied")
    t.add_(1)
    check(torch.equal(t, torch.from_numpy(expected + 1)), "writable shares: torch add_")
    del t
    gc.collect()


def consumer_main(mode, fd):
    """The consumer process: receives one view and runs the mode's checks;
    prints "consumer: N passed, N failed" and exits 1 on any failure."""
    err = ctypes.c_int()
    ctx = lib.dl_ctx_new(0, ctypes.byref(err))
    peer = lib.dl_peer_new(ctx, fd, ctypes.byref(err)) if ctx else None
    check(peer, "consumer: peer: %s" % lib.dl_strerror(err.value).decode())
    v = lib.dl_recv(peer, RECV_MS, ctypes.byref(err)) if peer else None
    check(v, "consumer: receive: %s" % lib.dl_strerror(err.value).decode())
    torch = None
    if v:
        expected = np.frombuffer(view_bytes(v), dtype=np.float32).reshape(SHARED_SHAPE).copy()
        check(lib.dl_view_writable(v) == (mode == "rw"),
              "consumer: received memory writable: %d" % lib.dl_view_writable(v))
        t0 = time.monotonic()
        try:
            import torch
        except ImportError:
            torch = None
        print("consumer: torch %s (import %.2f s)"
              % (torch.__version__ if torch else "not installed", time.monotonic() - t0))
        sys.stdout.flush()
        if mode == "ro":
            consumer_numpy_read_only(v, expected)
            if torch is not None:
                consumer_torch_read_only(torch, v, expected)
        else:
            consumer_writable(torch, v, expected)
        lib.dl_view_free(v)
    lib.dl_peer_free(peer)
    lib.dl_ctx_free(ctx)
    print("consumer: %d passed, %d failed" % (passed, failed))
    sys.stdout.flush()
    return 1 if failed else 0


def produce_to_consumer(mode, have_torch):
    """This process shares a view with a consumer process (mode "ro": the
    default, mapped read-only there; "rw": writable_shares) and checks what
    became of its bytes once the consumer is done."""
    global passed, failed
    what = "received %s" % ("read-only" if mode == "ro" else "with writable_shares")
    err = ctypes.c_int()
    ctx = lib.dl_ctx_new(1 if mode == "rw" else 0, ctypes.byref(err))
    if not check(ctx, what + ": ctx: %s" % lib.dl_strerror(err.value).decode()):
        return
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    t0 = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), sys.argv[1], "--consumer", mode,
         str(theirs.fileno())],
        pass_fds=(theirs.fileno(),), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    theirs.close()
    peer = lib.dl_peer_new(ctx, mine.fileno(), ctypes.byref(err))
    if peer:
        mine.detach()  # the peer owns the fd now
    else:
        mine.close()
    check(peer, what + ": peer: %s" % lib.dl_strerror(err.value).decode())
    shape = (ctypes.c_int64 * 2)(*SHARED_SHAPE)
    v = lib.dl_shared_view_new(ctx, F32, 2, shape, ctypes.byref(err))
    check(v, what + ": shared view: %s" % lib.dl_strerror(err.value).decode())
    before = view_bytes(v) if v else None
    if peer and v:
        r = lib.dl_send(peer, v)
        check(r == 0, what + ": send: %s" % lib.dl_strerror(r).decode())
    try:
        out, _ = child.communicate(timeout=CONSUMER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        out, _ = child.communicate()
    rc = child.returncode
    took = time.monotonic() - t0
    out = out.decode(errors="replace")
    for line in out.splitlines():
        if line.startswith("consumer: ") and " passed, " in line:
            p, f = line[len("consumer: "):].replace(" passed,", "").replace(" failed", "").split()
            passed += int(p)
            failed += int(f)
    # A signal (SIGSEGV from a write to a read-only mapping) is never a pass.
    ok = check(rc >= 0, what + ": consumer killed by signal %d" % -rc)
    ok = check(rc == 0, what + ": consumer exited with %d" % rc) and ok
    if v:
        after = np.frombuffer(view_bytes(v), dtype=np.float32)
        exp = np.frombuffer(before, dtype=np.float32)
        if mode == "rw" and have_torch:
            ok = check(np.array_equal(after, exp + 1),
                       what + ": the consumer's add_(1) not seen by the producer") and ok
        else:
            ok = check(after.tobytes() == before,
                       what + ": the producer's bytes changed") and ok
        lib.dl_view_free(v)
    lib.dl_peer_free(peer)
    lib.dl_ctx_free(ctx)
    if not ok or "FAIL" in out:
        for line in out.splitlines():
            print("    | " + line)
    torch_line = [line for line in out.splitlines() if line.startswith("consumer: torch")]
    notes.append("%s: consumer process %.2f s (%s)"
                 % (what, took, torch_line[0][len("consumer: "):] if torch_line else "?"))
    return ok


# ---------------------------------------------------------------- main

def main():
    print("numpy %s, python %s" % (np.__version__, sys.version.split()[0]))
    try:
        np.zeros(1, dtype=np.bool_).__dlpack__()
        numpy_bool = True
    except (BufferError, TypeError, RuntimeError):
        numpy_bool = False
    for dt in sorted(NUMPY_DTYPES):
        before = (passed, failed)
        if dt == BOOL and not numpy_bool:
            numpy_refuses(BOOL, "numpy %s has no bool in DLPack" % np.__version__)
            notes.append("numpy %s has no bool in DLPack: checked that it refuses cleanly"
                         % np.__version__)
        else:
            numpy_consumes(dt)
            numpy_produces(dt)
        print("%s numpy %s (%d checks)" % ("ok  " if failed == before[1] else "FAIL",
                                           DTYPE_NAMES[dt], passed + failed - sum(before)))
    before = (passed, failed)
    numpy_import_errors()
    print("%s numpy: refused imports stay the producer's" % ("ok  " if failed == before[1] else "FAIL"))

    t0 = time.monotonic()
    try:
        import torch
    except ImportError:
        torch = None
    torch_import = time.monotonic() - t0
    if torch is None:
        if os.environ.get("IPCREF_REQUIRE_ALL") == "1":
            check(False, "torch not installed for %s (apt-get install python3-torch); "
                  "IPCREF_REQUIRE_ALL=1 forbids skips" % sys.executable)
            print("FAIL torch not installed")
        else:
            print("skipped: torch not installed")
    else:
        before = (passed, failed)
        torch_tests(torch)
        print("%s torch %s (%d checks)" % ("ok  " if failed == before[1] else "FAIL",
                                           torch.__version__, passed + failed - sum(before)))
        notes.append("torch import %.2f s" % torch_import)

    for mode, name in (("ro", "received read-only: numpy%s get an exception, the producer's "
                        "bytes stay" % (" and torch" if torch else "")),
                       ("rw", "received with writable_shares: numpy%s"
                        % (" and torch add_ seen by the producer" if torch else ""))):
        before = (passed, failed)
        produce_to_consumer(mode, torch is not None)
        print("%s %s (%d checks)" % ("ok  " if failed == before[1] else "FAIL", name,
                                      passed + failed - sum(before)))
    for n in notes:
        print("note: " + n)
    gc.collect()
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    if CONSUMER:
        sys.exit(consumer_main(sys.argv[3], int(sys.argv[4])))
    sys.exit(main())
