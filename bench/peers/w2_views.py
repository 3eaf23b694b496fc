"""W2 peers numpy and torch: the cost of making a view of a 4096x4096 float32
array (size=67108864 bytes) and dropping it. No element is read or written.

  w2_slice      numpy a[1:100]   torch t[1:100]
  w2_transpose  numpy a.T        torch t.t()

Each statement runs in timeit's compiled loop (garbage collector off). The
loop count of a repetition is chosen so that it lasts about TARGET seconds;
value = the median over REPS repetitions of the time per statement, in ns.
That time includes the interpreter's cost of running one statement, which
`empty` measures on its own (statement `pass`, printed as
peer=python_timeit_empty workload=w2_empty): subtract it to get the library's
share.

Usage: python3 w2_views.py numpy|torch|empty [REPS=7] [TARGET=0.1]"""
import os
import statistics
import sys
import timeit

SIDE = 4096
BYTES = SIDE * SIDE * 4
STATEMENTS = {
    "numpy": (("w2_slice", "a[1:100]"), ("w2_transpose", "a.T")),
    "torch": (("w2_slice", "a[1:100]"), ("w2_transpose", "a.t()")),
    "empty": (("w2_empty", "pass"),),
}
PACKAGE = {"numpy": "python3-numpy", "torch": "python3-torch", "empty": None}


def loops_for(timer, target):
    """A loop count that makes one repetition last about `target` seconds."""
    loops = 100
    while True:
        took = timer.timeit(loops)
        if took >= target / 5 or loops >= 10**8:
            return max(100, int(loops * target / max(took, 1e-9)))
        loops *= 5


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in STATEMENTS:
        sys.exit(__doc__)
    lib = sys.argv[1]
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    target = float(sys.argv[3]) if len(sys.argv) > 3 else 0.1
    try:
        if lib == "torch":
            import torch
            base = torch.zeros((SIDE, SIDE), dtype=torch.float32)
        else:  # numpy, and the empty statement (which needs no library)
            try:
                import numpy as np
                base = np.zeros((SIDE, SIDE), dtype=np.float32)
            except ImportError:
                if lib != "empty":
                    raise
                base = None
    except ImportError:
        for wl, _ in STATEMENTS[lib]:
            print(f"peer={lib} workload={wl} status=skipped "
                  f"reason=apt-get-install-{PACKAGE[lib]}", flush=True)
        return
    peer = "python_timeit_empty" if lib == "empty" else lib
    for wl, stmt in STATEMENTS[lib]:
        timer = timeit.Timer(stmt, globals={"a": base})
        loops = loops_for(timer, target)
        per = [t / loops * 1e9 for t in timer.repeat(reps, loops)]
        print(f"peer={peer} workload={wl} size={BYTES} metric=ns_per_op "
              f"value={statistics.median(per):.1f} n={loops} reps={reps}", flush=True)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skips the interpreter's teardown: about 1.5 s once torch is loaded
