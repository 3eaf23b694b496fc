"""W3 peers numpy, numpy_prealloc, torch and torch_prealloc: a contiguous copy
of a strided view of a 4096x4096 float32 array filled with 0, 1, 2, ...

  w3_transpose  the view a.T        -> 67108864 bytes of output
  w3_stride2    the view a[:, ::2]  -> 33554432 bytes of output

  numpy           np.ascontiguousarray(view): a fresh output every call
  numpy_prealloc  np.copyto(out, view): an output made and touched beforehand
  torch           view.contiguous(): a fresh output every call
  torch_prealloc  out.copy_(view): an output made and touched beforehand

GBps = output bytes / seconds / 1e9 (each byte is read once and written once,
and counted once). value = the median over REPS timed calls, after one
warm-up call. After each call, outside the timing, a few output elements are
checked against the view; a wrong one exits with status 1.

Usage: python3 w3_copy.py numpy|torch [REPS=7]"""
import os
import statistics
import sys
import time

SIDE = 4096
PACKAGE = {"numpy": "python3-numpy", "torch": "python3-torch"}
PROBES = ((0, 0), (1, 2), (SIDE // 2 - 1, 7), (SIDE - 1, SIDE // 2 - 1))


def timed(call, check, reps):
    check(call())  # warm-up
    ns = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        out = call()
        ns.append(time.perf_counter_ns() - t0)
        check(out)
        del out
    return statistics.median(ns)


def report(peer, wl, nbytes, ns, reps):
    print(f"peer={peer} workload={wl} size={nbytes} metric=GBps "
          f"value={nbytes / ns:.3f} reps={reps}", flush=True)


def checker(view, as_float):
    want = [as_float(view[r, c]) for r, c in PROBES]

    def check(out):
        got = [as_float(out[r, c]) for r, c in PROBES]
        if got != want:
            sys.exit(f"w3_copy: wrong output {got}, want {want}")
    return check


def run_numpy(reps):
    import numpy as np
    a = np.arange(SIDE * SIDE, dtype=np.float32).reshape(SIDE, SIDE)
    for wl, view in (("w3_transpose", a.T), ("w3_stride2", a[:, ::2])):
        nbytes = view.nbytes
        check = checker(view, float)
        report("numpy", wl, nbytes, timed(lambda: np.ascontiguousarray(view), check, reps), reps)
        out = np.full(view.shape, -1.0, dtype=view.dtype)  # touched

        def into():
            np.copyto(out, view)
            return out
        report("numpy_prealloc", wl, nbytes, timed(into, check, reps), reps)


def run_torch(reps):
    import torch
    a = torch.arange(SIDE * SIDE, dtype=torch.float32).reshape(SIDE, SIDE)
    for wl, view in (("w3_transpose", a.t()), ("w3_stride2", a[:, ::2])):
        assert not view.is_contiguous()
        nbytes = view.numel() * view.element_size()
        check = checker(view, float)
        report("torch", wl, nbytes, timed(view.contiguous, check, reps), reps)
        out = torch.full(tuple(view.shape), -1.0, dtype=view.dtype)  # touched
        report("torch_prealloc", wl, nbytes, timed(lambda: out.copy_(view), check, reps), reps)
    print(f"# torch {torch.__version__}: {torch.get_num_threads()} intra-op threads", flush=True)


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in PACKAGE:
        sys.exit(__doc__)
    lib = sys.argv[1]
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    try:
        __import__(lib)
    except ImportError:
        for peer in (lib, lib + "_prealloc"):
            for wl in ("w3_transpose", "w3_stride2"):
                print(f"peer={peer} workload={wl} status=skipped "
                      f"reason=apt-get-install-{PACKAGE[lib]}", flush=True)
        return
    (run_numpy if lib == "numpy" else run_torch)(reps)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skips the interpreter's teardown: about 1.5 s once torch is loaded
