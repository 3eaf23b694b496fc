#!/usr/bin/python3
"""DLPack with real clients: NumPy (required) and PyTorch (when installed).

    test_dlpack.py path/to/libdlpack_test.so

The library (tests/dlpack_py/dlpack_lib.c, built from ipcref.h) makes
ipcref views; this script hands them to numpy.from_dlpack and
torch.utils.dlpack.from_dlpack and checks values, shape, strides and that
no byte was copied, then that dropping the consumer's array drops our
strong count. The other way, NumPy arrays and torch tensors go into ipcref
views; the values are read back through ipcref, and the producer's deleter
must run exactly once, when the view is released.

Prints one line per check group, then "N passed, N failed"; exits 1 on any
failure.
"""
import ctypes
import gc
import sys

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

if len(sys.argv) != 2:
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


class Exported:
    """What numpy.from_dlpack and torch's from_dlpack take: an object with
    __dlpack__ and __dlpack_device__. Each __dlpack__ call is one export."""

    def __init__(self, view):
        self.view = view

    def __dlpack__(self, stream=None):
        mt = lib.dl_to_dlpack(self.view)
        if not mt:
            raise BufferError("ipcref_view_to_dlpack failed")
        return api.PyCapsule_New(mt, DLTENSOR, CAPSULE_DESTRUCTOR)

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

    try:
        import torch
    except ImportError:
        torch = None
    if torch is None:
        print("skipped: torch not installed")
    else:
        before = (passed, failed)
        torch_tests(torch)
        print("%s torch %s (%d checks)" % ("ok  " if failed == before[1] else "FAIL",
                                           torch.__version__, passed + failed - sum(before)))
    for n in notes:
        print("note: " + n)
    gc.collect()
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
