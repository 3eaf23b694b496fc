"""W6's harness, shared by ipcref's rows (bench/w6_python.py) and the
peers' (bench/peers/w6_python.py), so that every row is made, timed,
acknowledged and reported alike: the knobs (W6_* environment), a row (a
peer, a workload, a size), the stream's timing loop, the consumer's
acknowledgement over an os.pipe, the result lines, the DataLoader's
dataset."""
import os
import select
import statistics
import time

MIB = 1 << 20
SIZES = [int(s) for s in (os.environ.get("W6_SIZES") or f"{4 * MIB},{24 * MIB},{64 * MIB}")
         .replace(",", " ").split()]
SECONDS = float(os.environ.get("W6_SECONDS") or 1.0)
MIN_ITEMS = max(1, int(os.environ.get("W6_MIN_ITEMS") or 8))
WINDOW = min(8, max(1, int(os.environ.get("W6_WINDOW") or 1)))
DL_WORKERS = max(1, int(os.environ.get("W6_DL_WORKERS") or 4))
DL_BATCH = int(os.environ.get("W6_DL_BATCH") or 24 * MIB)
DL_BATCHES = max(2, int(os.environ.get("W6_DL_BATCHES") or 32))
DL_EPOCHS = max(1, int(os.environ.get("W6_DL_EPOCHS") or 3))
DL_SAMPLE = 3 * 512 * 512 * 4  # bytes of one sample (3x512x512 float32)
RESEND_SIZE = 4096
WARMUPS = 2
PAGE_ELEMS = 4096 // 4  # float32 elements per 4096-byte page
ACK_WAIT_S = 60  # a consumer silent for this long fails the row
CONNECT_S = 30  # the consumer's connect and the producer's accept
WORKLOADS = ("fresh", "resend", "dataloader")


def value_of(i):
    """The fill value of item i: never 0 (a fresh page reads 0)."""
    return float(i % 251 + 1)


def line(peer, wl, size, rest):
    print(f"peer={peer} workload=w6_{wl} size={size} {rest}", flush=True)


class Row:
    """One measurement: a peer, a workload (fresh or resend) and a size."""

    def __init__(self, peer, wl, size):
        self.peer, self.wl, self.size = peer, wl, size
        self.n = size // 4  # float32 elements
        self.fresh = wl == "fresh"

    def line(self, rest):
        line(self.peer, self.wl, self.size, rest)

    def expect(self, i):
        """The value every element of item i holds."""
        return value_of(i) if self.fresh else 1.0


def pages_ok(x, row, k):
    """Reads what the consumer reads of item k (x: a flat float32 numpy array
    or torch tensor): one element per page (fresh), or its first and last
    element (resend, as W4's consumer reads the first and last byte)."""
    if len(x) != row.n:
        return False
    if not row.fresh:
        return float(x[0]) + float(x[-1]) == 2 * row.expect(k)
    sample = x[::PAGE_ELEMS]
    return float(sample.sum()) == len(sample) * row.expect(k)


def measure(produce, wait_ack, seconds, window=WINDOW):
    """Runs the stream: item i = (wait for ack i-window if i >= window), make
    and send item i, (wait for its ack when window == 1). Returns the timed
    items' ns."""
    def one(i):
        t0 = time.perf_counter_ns()
        if window > 1 and i >= window:
            wait_ack()
        produce(i)
        if window == 1:
            wait_ack()
        return time.perf_counter_ns() - t0

    untimed = max(WARMUPS, window)
    for i in range(untimed):
        one(i)
    ns, i = [], untimed
    start = time.perf_counter_ns()
    while len(ns) < MIN_ITEMS or time.perf_counter_ns() - start < seconds * 1e9:
        ns.append(one(i))
        i += 1
    for _ in range(window if window > 1 else 0):
        wait_ack()  # the window drains
    return ns


def report(row, ns, bad, exitcode):
    """The result lines, or a failed line when an ack said no or the consumer
    did not exit cleanly."""
    if bad or exitcode != 0 or not ns:
        row.line(f"status=failed reason=bad-acks-{bad}-consumer-exit-{exitcode}")
        return
    med, p99 = statistics.median(ns), sorted(ns)[int(0.99 * (len(ns) - 1))]
    mean = sum(ns) / len(ns)
    row.line(f"metric=us_median value={med / 1e3:.3f} n={len(ns)} mean={mean / 1e3:.3f} "
             f"p99={p99 / 1e3:.3f} window={WINDOW}")
    row.line(f"metric=us_p99 value={p99 / 1e3:.3f}")


class Acks:
    """The producer's end of the ack pipe (an os.pipe: a multiprocessing
    Connection's poll and recv_bytes cost several us more per ack, which
    every row would pay)."""

    def __init__(self, fd):
        self.fd, self.bad = fd, 0
        self.poller = select.poll()
        self.poller.register(fd, select.POLLIN)

    def wait(self):
        if not self.poller.poll(ACK_WAIT_S * 1000):
            raise TimeoutError("the consumer stopped acking")
        got = os.read(self.fd, 1)
        if not got:
            raise EOFError("the consumer is gone")
        if got != b"\x01":
            self.bad += 1


def ack(fd, ok):
    """The consumer's ack: 1 byte, 1 when what it read was right."""
    os.write(fd, b"\x01" if ok else b"\x00")


def dataloader_dataset():
    """A map-style dataset of fresh samples (3x512x512 float32, filled whole,
    every sample of batch b holding value_of(b)) and the batch size."""
    import torch

    per_batch = max(1, DL_BATCH // DL_SAMPLE)

    class FreshSamples(torch.utils.data.Dataset):
        def __len__(self):
            return DL_BATCHES * per_batch

        def __getitem__(self, i):
            t = torch.empty((3, 512, 512), dtype=torch.float32)
            t.fill_(value_of(i // per_batch))
            return t

    return FreshSamples(), per_batch


def run_epochs(peer, make_loader, per_batch, wl="dataloader"):
    """Runs DL_EPOCHS epochs of make_loader() (a fresh iterable each epoch),
    reading one float per page of each batch; prints the w6_<wl>
    lines: us_per_batch (the median over epochs of epoch time / batches,
    worker start included), us_median and us_p99 of the gaps between batches
    (each epoch's first batch left out)."""
    size = per_batch * DL_SAMPLE
    epochs, gaps, bad = [], [], 0
    for _ in range(DL_EPOCHS):
        t0 = last = time.perf_counter_ns()
        b = 0
        for batch in make_loader():
            x = batch.reshape(-1)
            pages = x[::PAGE_ELEMS]
            if len(x) != size // 4 or float(pages.sum()) != len(pages) * value_of(b):
                bad += 1
            del x, pages, batch
            now = time.perf_counter_ns()
            if b:
                gaps.append(now - last)
            last = now
            b += 1
        epochs.append((time.perf_counter_ns() - t0) / max(1, b))
        if b != DL_BATCHES:
            bad += 1
    if bad or not gaps:
        line(peer, wl, size, f"status=failed reason=bad-batches-{bad}")
        return
    med, p99 = statistics.median(gaps), sorted(gaps)[int(0.99 * (len(gaps) - 1))]
    extra = f"epochs={DL_EPOCHS} batches={DL_BATCHES} workers={DL_WORKERS}"
    per_batch_us = statistics.median(epochs) / 1e3
    line(peer, wl, size, f"metric=us_per_batch value={per_batch_us:.3f} {extra} "
         f"epochs_us={','.join(f'{e / 1e3:.0f}' for e in epochs)}")
    line(peer, wl, size, f"metric=us_median value={med / 1e3:.3f} n={len(gaps)} {extra}")
    line(peer, wl, size, f"metric=us_p99 value={p99 / 1e3:.3f}")
