"""W6 peers: tensors from one Python process to another with Python's own
tools, the same work as bench/w6_python.py does with the ipcref package.

Workloads (what one timed item is, the producer's view; WINDOW items may be
in flight, default 1):
  fresh       float32 tensors of each size in W6_SIZES: the producer makes a
              NEW tensor per item, fills every byte (fill with the item's
              value, i % 251 + 1), sends it and drops it; the consumer
              receives it, reads one float32 per 4096-byte page (x[::1024],
              their sum is checked), drops it and acks with 1 byte through
              an os.pipe. Timed: item i's make .. its ack (with
              a window of W > 1: wait for ack i-W, then make, fill, send).
  resend      one float32 tensor of 4096 bytes (1024 elements), made and
              filled once, sent again every item; the consumer receives it,
              reads its first and last element (checked; W4's consumer
              reads the first and last byte), drops it and acks.
  dataloader  (torch_dataloader only) a torch DataLoader epoch: W6_DL_WORKERS
              workers (default 4), batches of W6_DL_BATCH bytes (default
              24 MiB: 8 samples of 3x512x512 float32, each a new tensor
              filled whole in the worker, collated by torch's default_collate
              into shared memory), W6_DL_BATCHES batches per epoch (default
              32); the main process reads one float per page of each batch
              (checked) and drops it.

Peers:
  torch_mp_fd       fresh: torch.empty(n).share_memory_(), fill_(), put on a
                    torch.multiprocessing Queue, dropped; sharing strategy
                    file_descriptor (the fd reaches the consumer through
                    multiprocessing's resource_sharer); the consumer q.get()s,
                    reads, drops, acks. resend: the same tensor put each item.
  torch_mp_fs       the same with sharing strategy file_system (a shm_open
                    name, torch_shm_manager, a count kept in the segment)
  mp_shared_memory  fresh: a new multiprocessing.shared_memory.SharedMemory
                    block per item, filled through a numpy array over its
                    buffer; its name goes through a Pipe and the producer
                    close()s its mapping; the consumer attaches, reads,
                    close()s and acks; the producer unlink()s the block once
                    its ack is in. resend: one block, its name sent each item
                    (the consumer attaches and closes each time).
  numpy_pipe        the numpy array itself, pickled through a
                    multiprocessing Pipe (Connection.send / recv: an os.pipe)
  torch_dataloader  dataloader: torch.utils.data.DataLoader as it comes
                    (torch's default sharing strategy, file_descriptor)

The consumer is forked; acks come back through an os.pipe in every row (and
in bench/w6_python.py's; a multiprocessing Pipe's poll and recv_bytes would
add several us to every item). torch runs with
torch.set_num_threads(1) (the DataLoader's workers do so themselves).
Items are timed one by one (perf_counter_ns) for W6_SECONDS after 2
warm-ups (with a window: after the items that fill it), at least
W6_MIN_ITEMS. Printed per row: us_median (n, mean, p99, window as extras)
and us_p99. dataloader: W6_DL_EPOCHS epochs (default 3), each starting its
workers (persistent_workers=False, as a plain DataLoader does):
us_per_batch = the median over epochs of epoch time / batches (worker start
included), us_median and us_p99 of the gaps between batches (each epoch's
first batch left out).

Environment: W6_SIZES (comma separated, default 4, 24 and 64 MiB),
W6_SECONDS (default 1.0), W6_MIN_ITEMS (default 8), W6_WINDOW (default 1,
at most 8), W6_DL_WORKERS, W6_DL_BATCH, W6_DL_BATCHES, W6_DL_EPOCHS.

Usage: python3 w6_python.py PEER[,PEER...] WORKLOAD[,WORKLOAD...]
  PEER: torch_mp_fd torch_mp_fs mp_shared_memory numpy_pipe torch_dataloader
  WORKLOAD: fresh resend dataloader (w6_fresh ... also accepted); a peer runs
  the workloads it has."""
import collections
import os
import sys

from w6_harness import (Acks, DL_WORKERS, RESEND_SIZE, Row, SECONDS, SIZES,
                        WORKLOADS, ack, dataloader_dataset, line, measure,
                        pages_ok, report, run_epochs, value_of)  # noqa: E402

PEERS = ("torch_mp_fd", "torch_mp_fs", "mp_shared_memory", "numpy_pipe", "torch_dataloader")
HAS = {"torch_mp_fd": ("fresh", "resend"), "torch_mp_fs": ("fresh", "resend"),
       "mp_shared_memory": ("fresh", "resend"), "numpy_pipe": ("fresh", "resend"),
       "torch_dataloader": ("dataloader",)}
NEEDS = {"torch_mp_fd": "torch", "torch_mp_fs": "torch", "torch_dataloader": "torch",
         "mp_shared_memory": "numpy", "numpy_pipe": "numpy"}


def run_row(row, ctx, target, args, stream_fn, stop):
    """Forks the consumer target(*args, ack_fd, row), runs the stream
    (stream_fn(acks) -> (produce, wait_ack)), stops it (stop()), reports."""
    acks_r, acks_w = os.pipe()
    child = ctx.Process(target=target, args=args + (acks_w, row), daemon=True)
    child.start()
    os.close(acks_w)  # the consumer's alone: its death reads as the end of the pipe
    acks = Acks(acks_r)
    ns = []
    try:
        produce, wait_ack = stream_fn(acks)
        ns = measure(produce, wait_ack, SECONDS)
    except (TimeoutError, OSError, EOFError) as e:
        print(f"# {row.peer} w6_{row.wl} size={row.size}: {e!r}", flush=True)
        acks.bad += 1
    finally:
        stop()
        child.join(30)
        if child.exitcode is None:
            child.kill()
            child.join()
        os.close(acks_r)
    report(row, ns, acks.bad, child.exitcode)


# ---- multiprocessing.shared_memory -------------------------------------------

def shm_consumer(names, acks, row):
    import numpy as np
    from multiprocessing import shared_memory
    k = 0
    while True:
        name = names.recv_bytes()
        if not name:
            break
        shm = shared_memory.SharedMemory(name=name.decode())
        x = np.ndarray((row.n,), np.float32, buffer=shm.buf)
        ok = pages_ok(x, row, k)
        del x  # the buffer's export ends: the mapping can be closed
        shm.close()
        ack(acks, ok)
        k += 1


def run_shm(rows):
    import multiprocessing as mp
    from multiprocessing import resource_tracker, shared_memory
    import numpy as np
    resource_tracker.ensure_running()  # one tracker, shared with the consumers
    ctx = mp.get_context("fork")

    def new_block(row, value):
        shm = shared_memory.SharedMemory(create=True, size=row.size)
        x = np.ndarray((row.n,), np.float32, buffer=shm.buf)
        x.fill(value)
        del x
        return shm

    for row in rows:
        names_r, names_w = ctx.Pipe(duplex=False)
        leased = collections.deque()
        once = None if row.fresh else new_block(row, 1.0)

        def stream(acks, row=row, names_w=names_w, leased=leased, once=once):
            if once is not None:  # resend: one block, its name each item
                name = once.name.encode()
                return (lambda i: names_w.send_bytes(name)), acks.wait

            def produce(i):
                shm = new_block(row, value_of(i))
                names_w.send_bytes(shm.name.encode())
                shm.close()  # ours goes; the name lives until the ack
                leased.append(shm)

            def wait_ack():
                acks.wait()
                leased.popleft().unlink()
            return produce, wait_ack

        def stop(names_w=names_w, leased=leased, once=once):
            names_w.send_bytes(b"")
            names_w.close()
            while leased:
                leased.popleft().unlink()
            if once is not None:
                once.close()
                once.unlink()

        run_row(row, ctx, shm_consumer, (names_r,), stream, stop)
        names_r.close()


# ---- numpy through a Pipe ----------------------------------------------------

def pipe_consumer(conn, acks, row):
    k = 0
    while True:
        x = conn.recv()
        if x is None:
            break
        ok = pages_ok(x, row, k)
        del x
        ack(acks, ok)
        k += 1


def run_pipe(rows):
    import multiprocessing as mp
    import numpy as np
    ctx = mp.get_context("fork")
    for row in rows:
        data_r, data_w = ctx.Pipe(duplex=False)
        once = None
        if not row.fresh:
            once = np.empty(row.n, np.float32)
            once.fill(1.0)

        def stream(acks, row=row, data_w=data_w, once=once):
            if once is not None:
                return (lambda i: data_w.send(once)), acks.wait

            def produce(i):
                x = np.empty(row.n, np.float32)
                x.fill(value_of(i))
                data_w.send(x)
            return produce, acks.wait

        def stop(data_w=data_w):
            data_w.send(None)
            data_w.close()

        run_row(row, ctx, pipe_consumer, (data_r,), stream, stop)
        data_r.close()


# ---- torch.multiprocessing ---------------------------------------------------

def torch_consumer(q, acks, row):
    import torch
    torch.set_num_threads(1)
    k = 0
    while True:
        t = q.get()
        if t is None:
            break
        ok = pages_ok(t, row, k)
        del t  # unmaps (file_descriptor) or drops the segment's count (file_system)
        ack(acks, ok)
        k += 1


def run_torch(peer, rows):
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
        once = None
        if not row.fresh:
            once = torch.empty(row.n, dtype=torch.float32).share_memory_()
            once.fill_(1.0)

        def stream(acks, row=row, q=q, once=once):
            if once is not None:
                return (lambda i: q.put(once)), acks.wait

            def produce(i):
                t = torch.empty(row.n, dtype=torch.float32)
                t.share_memory_()
                t.fill_(value_of(i))
                q.put(t)  # then dropped: the Queue holds it until it is sent
            return produce, acks.wait

        run_row(row, ctx, torch_consumer, (q,), stream, lambda q=q: q.put(None))
        q.close()
        q.join_thread()


# ---- torch DataLoader --------------------------------------------------------


def run_dataloader(peer):
    import warnings
    import torch
    torch.set_num_threads(1)
    # more workers than CPUs is what the row asks for: no warning about it
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    dataset, per_batch = dataloader_dataset()
    run_epochs(peer, lambda: torch.utils.data.DataLoader(
        dataset, batch_size=per_batch, num_workers=DL_WORKERS), per_batch)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    peers, wls = ([x for x in arg.replace(" ", ",").split(",") if x] for arg in sys.argv[1:3])
    wls = [w[3:] if w.startswith("w6_") else w for w in wls]
    if any(p not in PEERS for p in peers) or any(w not in WORKLOADS for w in wls):
        sys.exit(__doc__)
    for peer in peers:
        mine = [w for w in wls if w in HAS[peer]]
        if not mine:
            continue
        try:
            __import__(NEEDS[peer])
        except ImportError:
            for w in mine:
                line(peer, w, 0, f"status=skipped reason=apt-get-install-python3-{NEEDS[peer]}")
            continue
        if peer == "torch_dataloader":
            run_dataloader(peer)
            continue
        rows = [Row(peer, w, size) for w in mine
                for size in (SIZES if w == "fresh" else [RESEND_SIZE])]
        if peer == "mp_shared_memory":
            run_shm(rows)
        elif peer == "numpy_pipe":
            run_pipe(rows)
        else:
            run_torch(peer, rows)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skips the interpreter's teardown: about 1.5 s once torch is loaded
