"""W5 peers in Python: a stream of fresh tensors with Python's own tools, the
same work as bench/w5_stream.c does with ipcref. For each item the producer
(this process) makes a NEW tensor, fills every byte of it with the item's
byte, hands it to a forked consumer and drops its own reference; the consumer
receives it, reads one byte per 4096-byte page (their sum is checked), lets it
go and acks with 1 byte through a multiprocessing Pipe.

  py_shm       multiprocessing.shared_memory.SharedMemory(create=True) per
               tensor, filled with ctypes.memset; its name goes through a
               Pipe and the producer close()s its mapping; the consumer
               attaches SharedMemory(name), reads, close()s and acks; the
               producer unlink()s the block once its ack is in
  torch_mp_fd  torch.empty(size, dtype=uint8).share_memory_(), then fill_(),
               put on a torch.multiprocessing Queue (sharing strategy
               file_descriptor: the fd reaches the consumer through
               multiprocessing's resource_sharer), dropped; the consumer
               q.get()s, sums t[::4096], drops the tensor and acks
  torch_mp_fs  the same with sharing strategy file_system (a shm_open name,
               torch_shm_manager, a count kept in the segment)
torch runs with torch.set_num_threads(1): one thread fills, as in the C rows.

Streams (what one timed item is, the producer's view):
  seq        one in flight: make .. ack received
  inflight4  the producer runs 4 ahead: wait for ack i-4, then make, fill and
             send tensor i (its period: a throughput)
  mixed      as seq, the sizes cycling 4, 24, 64 MiB (printed as size=0)
Items are timed one by one (perf_counter_ns) for SECONDS after 2 warm-ups
(inflight4: after the 4 that fill the window), at least W5_MIN_ITEMS (default
8) and, once that many are timed, no more than W5_MAX_BYTES (default 2 GiB).
Printed: us_median (n, mean, p99 as extras), us_p99, us_per_tensor (the mean),
consumer_peak_kb (the largest VmRSS the consumer saw, from /proc/self/statm
after reading each item before letting it go; base_kb = its VmRSS before the
first item: a forked Python consumer starts with the producer's interpreter,
and torch) and held_kb (window x largest size).
Environment: W5_ID = the setup (w5_1cpu, w5_2cpu; default w5), printed as
workload <W5_ID>_<stream>; W5_PIN=split = the producer on the first and the
consumer on the second allowed CPU.

One process runs every peer, stream and size asked for in turn, so that torch
is imported once; each row has its own consumer.

Usage: python3 w5_stream.py PEER[,PEER...] STREAM[,STREAM...] SIZE[,SIZE...]
       [SECONDS=1.0]"""
import collections
import ctypes
import os
import statistics
import sys
import time

SETUP = os.environ.get("W5_ID") or "w5"
SPLIT = os.environ.get("W5_PIN") == "split"
CPUS = sorted(os.sched_getaffinity(0))[:2]  # before anything is pinned
MIN_ITEMS = max(1, int(os.environ.get("W5_MIN_ITEMS") or 8))
MAX_BYTES = float(os.environ.get("W5_MAX_BYTES") or 2 * 2**30)
WARMUPS = 2
PAGE = 4096
MIB = 1 << 20
MIXED = (4 * MIB, 24 * MIB, 64 * MIB)
ACK_WAIT_S = 60  # a consumer silent for this long fails the row
PEERS = ("py_shm", "torch_mp_fd", "torch_mp_fs")
STREAMS = ("seq", "inflight4", "mixed")


class Row:
    """One measurement: a peer, a stream and its sizes."""

    def __init__(self, peer, stream, size):
        self.peer, self.wl = peer, f"{SETUP}_{stream}"
        self.sizes = MIXED if stream == "mixed" else (size,)
        self.window = 4 if stream == "inflight4" else 1
        self.size = 0 if stream == "mixed" else size

    def size_of(self, i):
        return self.sizes[i % len(self.sizes)]

    def line(self, rest):
        print(f"peer={self.peer} workload={self.wl} size={self.size} {rest}", flush=True)


def pin(side):
    """W5_PIN=split: side 0 (producer) on the first CPU, side 1 on the second.
    Threads a process starts later (a Queue's feeder, the resource_sharer)
    inherit the mask."""
    if SPLIT:
        os.sched_setaffinity(0, {CPUS[side]})


def fill_byte(i):
    return i % 251 + 1  # never 0: a fresh page reads 0


class Rss:
    """VmRSS in kB from /proc/self/statm, opened once, read again with pread."""

    def __init__(self):
        self.fd = os.open("/proc/self/statm", os.O_RDONLY)
        self.page_kb = os.sysconf("SC_PAGE_SIZE") // 1024

    def kb(self):
        return int(os.pread(self.fd, 128, 0).split()[1]) * self.page_kb


def pages_hold(pages, k):
    """pages: one byte per page of item k (any sequence of ints)."""
    return sum(pages) == len(pages) * fill_byte(k)


def measure(row, produce, wait_ack, seconds):
    """Runs the stream; returns the timed items' ns."""
    def one(i):
        t0 = time.perf_counter_ns()
        if row.window > 1 and i >= row.window:
            wait_ack()
        produce(i)
        if row.window == 1:
            wait_ack()
        return time.perf_counter_ns() - t0

    untimed = max(WARMUPS, row.window)
    for i in range(untimed):
        one(i)
    ns, i, sent = [], untimed, 0
    start = time.perf_counter_ns()
    while True:
        sent += row.size_of(i)
        ns.append(one(i))
        i += 1
        if len(ns) >= MIN_ITEMS and (time.perf_counter_ns() - start >= seconds * 1e9
                                     or sent >= MAX_BYTES):
            break
    for _ in range(row.window if row.window > 1 else 0):
        wait_ack()  # the window drains
    return ns


def report(row, ns, bad, exitcode, consumer):
    """The result lines, or a failed line when an ack said no, the consumer
    did not report or did not exit cleanly."""
    if bad or exitcode != 0 or consumer is None:
        row.line(f"status=failed reason=bad-acks-{bad}-consumer-exit-{exitcode}")
        return
    peak, base = consumer
    held = row.window * max(row.sizes) // 1024
    med, p99 = statistics.median(ns), sorted(ns)[int(0.99 * (len(ns) - 1))]
    mean = sum(ns) / len(ns)
    row.line(f"metric=us_median value={med / 1e3:.3f} n={len(ns)} mean={mean / 1e3:.3f} "
             f"p99={p99 / 1e3:.3f}")
    row.line(f"metric=us_p99 value={p99 / 1e3:.3f}")
    row.line(f"metric=us_per_tensor value={mean / 1e3:.3f}")
    row.line(f"metric=consumer_peak_kb value={peak} base_kb={base} held_kb={held}")
    row.line(f"metric=held_kb value={held}")


class Acks:
    """The producer's end of the ack Pipe; the consumer's report comes last."""

    def __init__(self, conn):
        self.conn, self.bad = conn, 0

    def wait(self):
        if not self.conn.poll(ACK_WAIT_S):
            raise TimeoutError("the consumer stopped acking")
        if self.conn.recv_bytes() != b"\x01":
            self.bad += 1

    def consumer_report(self):
        if not self.conn.poll(ACK_WAIT_S):
            return None
        peak, base = self.conn.recv_bytes().split()
        return int(peak), int(base)


def run_row(row, ctx, target, args, stream_fn, stop, seconds):
    """Starts the consumer, runs the stream (stream_fn(acks) -> (produce,
    wait_ack)), stops it, reports."""
    acks_r, acks_w = ctx.Pipe(duplex=False)
    child = ctx.Process(target=target, args=args + (acks_w, row), daemon=True)
    child.start()
    acks_w.close()
    acks = Acks(acks_r)
    ns, consumer = [], None
    try:
        produce, wait_ack = stream_fn(acks)
        ns = measure(row, produce, wait_ack, seconds)
    except (TimeoutError, OSError, EOFError) as e:
        print(f"# {row.peer} {row.wl} size={row.size}: {e!r}", flush=True)
        acks.bad += 1
    finally:
        stop()
        if acks.bad == 0:
            consumer = acks.consumer_report()
        child.join(30)
        if child.exitcode is None:
            child.kill()
            child.join()
    report(row, ns, acks.bad, child.exitcode, consumer)


# ---- multiprocessing.shared_memory -------------------------------------------

def fill(buf, byte, size):
    c = (ctypes.c_char * size).from_buffer(buf)
    ctypes.memset(c, byte, size)
    del c  # the buffer's export ends: the mapping can be closed


def shm_consumer(names, acks, row):
    from multiprocessing import shared_memory
    pin(1)
    rss = Rss()
    peak = base = rss.kb()
    k = 0
    while True:
        name = names.recv_bytes()
        if not name:
            break
        shm = shared_memory.SharedMemory(name=name.decode())
        view = shm.buf
        ok = len(view) >= row.size_of(k) and pages_hold(view[:row.size_of(k):PAGE], k)
        peak = max(peak, rss.kb())
        del view
        shm.close()
        acks.send_bytes(b"\x01" if ok else b"\x00")
        k += 1
    acks.send_bytes(f"{peak} {base}".encode())


def run_shm(rows, seconds):
    import multiprocessing as mp
    from multiprocessing import resource_tracker, shared_memory
    resource_tracker.ensure_running()  # one tracker, shared with the consumers
    ctx = mp.get_context("fork")
    for row in rows:
        names_r, names_w = ctx.Pipe(duplex=False)
        leased = collections.deque()

        def stream(acks, row=row, names_w=names_w, leased=leased):
            def produce(i):
                size = row.size_of(i)
                shm = shared_memory.SharedMemory(create=True, size=size)
                fill(shm.buf, fill_byte(i), size)
                names_w.send_bytes(shm.name.encode())
                shm.close()  # ours goes; the name lives until the ack
                leased.append(shm)

            def wait_ack():
                acks.wait()
                leased.popleft().unlink()
            return produce, wait_ack

        def stop(names_w=names_w, leased=leased):
            names_w.send_bytes(b"")
            names_w.close()
            while leased:
                leased.popleft().unlink()

        run_row(row, ctx, shm_consumer, (names_r,), stream, stop, seconds)
        names_r.close()


# ---- torch.multiprocessing ---------------------------------------------------

def torch_consumer(q, acks, row):
    import torch
    torch.set_num_threads(1)
    pin(1)
    rss = Rss()
    peak = base = rss.kb()
    k = 0
    while True:
        t = q.get()
        if t is None:
            break
        pages = t[::PAGE]
        ok = t.numel() == row.size_of(k) and int(pages.sum()) == pages.numel() * fill_byte(k)
        peak = max(peak, rss.kb())
        del t  # unmaps (file_descriptor) or drops the segment's count (file_system)
        acks.send_bytes(b"\x01" if ok else b"\x00")
        k += 1
    acks.send_bytes(f"{peak} {base}".encode())


def run_torch(peer, rows, seconds):
    import torch
    import torch.multiprocessing as tmp
    strategy = "file_descriptor" if peer == "torch_mp_fd" else "file_system"
    if strategy not in tmp.get_all_sharing_strategies():
        for row in rows:
            row.line(f"status=skipped reason=no-{strategy}-sharing-strategy")
        return
    tmp.set_sharing_strategy(strategy)
    torch.set_num_threads(1)
    ctx = tmp.get_context("fork")
    for row in rows:
        q = ctx.Queue()

        def stream(acks, row=row, q=q):
            def produce(i):
                t = torch.empty(row.size_of(i), dtype=torch.uint8)
                t.share_memory_()
                t.fill_(fill_byte(i))
                q.put(t)  # then dropped: the Queue holds it until it is sent
            return produce, acks.wait

        run_row(row, ctx, torch_consumer, (q,), stream, lambda q=q: q.put(None), seconds)
        q.close()
        q.join_thread()


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    peers, streams = ([x for x in arg.replace(" ", ",").split(",") if x]
                      for arg in sys.argv[1:3])
    if any(p not in PEERS for p in peers) or any(s not in STREAMS for s in streams):
        sys.exit(__doc__)
    sizes = [int(s) for s in sys.argv[3].replace(",", " ").split()]
    seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
    for peer in peers:
        rows = [Row(peer, s, size) for s in streams
                for size in (sizes if s != "mixed" else [0])]
        if SPLIT and len(CPUS) < 2:
            for row in rows:
                row.line("status=skipped reason=needs-2-allowed-cpus")
            continue
        pin(0)  # before any consumer or helper thread starts
        if peer == "py_shm":
            run_shm(rows, seconds)
            continue
        try:
            __import__("torch")
        except ImportError:
            for s in streams:
                print(f"peer={peer} workload={SETUP}_{s} status=skipped "
                      "reason=apt-get-install-python3-torch", flush=True)
            continue
        run_torch(peer, rows, seconds)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skips the interpreter's teardown: about 1.5 s once torch is loaded
