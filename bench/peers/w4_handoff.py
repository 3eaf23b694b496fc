"""W4 peers in Python: how a buffer of SIZE bytes is handed to another process
with Python's own tools. Same hand-off as w4_handoff.c: the producer (this
process) writes the hand-off number into the first and the last byte (not
timed), makes the buffer available; a forked consumer receives it, checks the
two bytes, lets it go and acks; the time runs until the producer has the ack.

  py_pipe_msg64  64 bytes through a multiprocessing Pipe (send_bytes /
                 recv_bytes); the consumer attached the SharedMemory once, at
                 start, and acks with one byte: the least any Python hand-off
                 costs
  py_shm_pipe    multiprocessing.shared_memory.SharedMemory made once; its name
                 goes through a Pipe each time; the consumer attaches
                 SharedMemory(name), checks, close()s and acks through the Pipe
  torch_mp_fd    torch.multiprocessing Queue.put() of a uint8 tensor moved to
                 shared memory once (share_memory_()), sharing strategy
                 file_descriptor: the fd reaches the consumer through
                 multiprocessing's resource_sharer; the consumer q.get()s,
                 reads t[0] and t[-1], drops the tensor and acks through a
                 second Queue
  torch_mp_fs    the same with sharing strategy file_system (a shm_open name,
                 torch_shm_manager, a count kept in the segment)

Each size gets its own buffer and consumer. Hand-offs are timed one by one
(perf_counter_ns) for SECONDS after 3 warm-ups: us_per_handoff = the median
(n, mean, p99 as extra fields), GBps = SIZE / median.
Environment: W4_ID = the workload id printed (default w4); W4_PIN=split = the
producer on the first and the consumer on the second allowed CPU.

One process can run several peers in turn (PEER,PEER,...), so that torch is
imported once.

Usage: python3 w4_handoff.py PEER[,PEER...] SIZE[,SIZE...] [SECONDS=1.0]"""
import os
import statistics
import sys
import time

WL = os.environ.get("W4_ID") or "w4"
SPLIT = os.environ.get("W4_PIN") == "split"
CPUS = sorted(os.sched_getaffinity(0))[:2]  # before anything is pinned
ACK_WAIT_S = 20  # a consumer silent for this long fails the row
PEERS = ("py_pipe_msg64", "py_shm_pipe", "torch_mp_fd", "torch_mp_fs")


def pin(side):
    """W4_PIN=split: side 0 (producer) on the first CPU, side 1 on the second.
    Threads a process starts later (a Queue's feeder, the resource_sharer)
    inherit the mask."""
    if SPLIT:
        os.sched_setaffinity(0, {CPUS[side]})


def line(peer, size, rest):
    print(f"peer={peer} workload={WL} size={size} {rest}", flush=True)


def measure(size, buf, hand_off, seconds):
    """Times hand_off() one call at a time, after 3 warm-ups; before each call
    the producer writes the hand-off number into the buffer's first and last
    byte. Returns the times in ns."""
    last = size - 1
    for i in range(3):
        buf[0] = buf[last] = i & 0xFF
        hand_off()
    ns = []
    i = 3
    deadline = time.perf_counter_ns() + seconds * 1e9
    while len(ns) < 5 or time.perf_counter_ns() < deadline:
        buf[0] = buf[last] = i & 0xFF
        t0 = time.perf_counter_ns()
        hand_off()
        ns.append(time.perf_counter_ns() - t0)
        i += 1
    return ns


def report(peer, size, ns, bad, exitcode):
    """The result lines, or a failed line when an ack said no or the
    consumer did not exit cleanly."""
    if bad or exitcode != 0:
        line(peer, size, f"status=failed reason=bad-acks-{bad}-consumer-exit-{exitcode}")
        return
    med = statistics.median(ns)
    ns = sorted(ns)
    line(peer, size, f"metric=us_per_handoff value={med / 1e3:.3f} n={len(ns)} "
         f"mean={sum(ns) / len(ns) / 1e3:.3f} p99={ns[int(0.99 * (len(ns) - 1))] / 1e3:.3f}")
    line(peer, size, f"metric=GBps value={size / med:.3f}")


# ---- multiprocessing.shared_memory -------------------------------------------

def attach_each_time(conn, size):
    from multiprocessing import shared_memory
    pin(1)
    k = 0
    while True:
        name = conn.recv()
        if name is None:
            return
        shm = shared_memory.SharedMemory(name=name)
        view = shm.buf
        ok = view[0] == (k & 0xFF) and view[size - 1] == (k & 0xFF)
        del view
        shm.close()
        conn.send(ok)
        k += 1


def attached_once(conn, size, name):
    from multiprocessing import shared_memory
    pin(1)
    shm = shared_memory.SharedMemory(name=name)
    view = shm.buf
    k = 0
    while True:
        msg = conn.recv_bytes()
        if not msg:
            break
        ok = len(msg) == 64 and view[0] == (k & 0xFF) and view[size - 1] == (k & 0xFF)
        conn.send_bytes(b"\x01" if ok else b"\x00")
        k += 1
    del view
    shm.close()


def run_shared_memory(peer, sizes, seconds):
    import multiprocessing as mp
    from multiprocessing import shared_memory
    ctx = mp.get_context("fork")
    for size in sizes:
        shm = shared_memory.SharedMemory(create=True, size=size)
        buf = shm.buf
        buf[:] = b"\xee" * size  # touched once
        mine, theirs = ctx.Pipe()
        each_time = peer == "py_shm_pipe"
        child = ctx.Process(target=attach_each_time if each_time else attached_once,
                            args=(theirs, size) if each_time else (theirs, size, shm.name),
                            daemon=True)
        child.start()
        bad = 0
        msg = bytes(64)

        def hand_off():
            nonlocal bad
            if each_time:
                mine.send(shm.name)
            else:
                mine.send_bytes(msg)
            if not mine.poll(ACK_WAIT_S):
                raise TimeoutError("the consumer stopped acking")
            if not (mine.recv() if each_time else mine.recv_bytes() == b"\x01"):
                bad += 1

        try:
            ns = measure(size, buf, hand_off, seconds)
        finally:
            if each_time:
                mine.send(None)
            else:
                mine.send_bytes(b"")
            child.join(30)
            del buf
            shm.close()
            shm.unlink()
        report(peer, size, ns, bad, child.exitcode)


# ---- torch.multiprocessing ---------------------------------------------------

def take_tensors(q, acks):
    pin(1)
    k = 0
    while True:
        t = q.get()
        if t is None:
            return
        ok = int(t[0]) == (k & 0xFF) and int(t[-1]) == (k & 0xFF)
        del t  # unmaps (file_descriptor) or drops the segment's count (file_system)
        acks.put(ok)
        k += 1


def run_torch(peer, sizes, seconds):
    import torch
    import torch.multiprocessing as tmp
    strategy = "file_descriptor" if peer == "torch_mp_fd" else "file_system"
    if strategy not in tmp.get_all_sharing_strategies():
        for size in sizes:
            line(peer, size, f"status=skipped reason=no-{strategy}-sharing-strategy")
        return
    tmp.set_sharing_strategy(strategy)
    ctx = tmp.get_context("fork")
    for size in sizes:
        t = torch.full((size,), 0xEE, dtype=torch.uint8)
        t.share_memory_()
        try:
            buf = t.numpy()  # the same storage, written faster than through torch
        except Exception:  # a torch built without numpy
            buf = t
        q, acks = ctx.Queue(), ctx.Queue()
        child = ctx.Process(target=take_tensors, args=(q, acks), daemon=True)
        child.start()
        bad = 0

        def hand_off():
            nonlocal bad
            q.put(t)
            if not acks.get(timeout=ACK_WAIT_S):
                bad += 1

        try:
            ns = measure(size, buf, hand_off, seconds)
        finally:
            q.put(None)
            child.join(30)
        report(peer, size, ns, bad, child.exitcode)


def main():
    peers = sys.argv[1].split(",") if len(sys.argv) > 2 else []
    if not peers or any(p not in PEERS for p in peers):
        sys.exit(__doc__)
    sizes = [int(s) for s in sys.argv[2].replace(",", " ").split()]
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
    if SPLIT and len(CPUS) < 2:
        for peer in peers:
            for size in sizes:
                line(peer, size, "status=skipped reason=needs-2-allowed-cpus")
        return
    pin(0)  # before any consumer or helper thread starts
    for peer in peers:
        if peer.startswith("torch"):
            try:
                __import__("torch")
            except ImportError:
                print(f"peer={peer} workload={WL} status=skipped "
                      "reason=apt-get-install-python3-torch", flush=True)
                continue
            run_torch(peer, sizes, seconds)
        else:
            run_shared_memory(peer, sizes, seconds)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skips the interpreter's teardown: about 1.5 s once torch is loaded
