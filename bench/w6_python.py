"""W6 for ipcref's Python package: tensors from one Python process to another,
defined as the peers define it (bench/peers/w6_python.py).

Workloads (what one timed item is, the producer's view; WINDOW items may be
in flight, default 1):
  fresh       float32 arrays of each size in W6_SIZES: the producer makes a
              NEW array per item, fills every byte (fill with the item's
              value, i % 251 + 1), sends it and drops it; the consumer
              receives it, reads one float32 per 4096-byte page (x[::1024],
              their sum is checked), drops it and acks with 1 byte through
              an os.pipe, as the peers do. Timed: item i's make .. its ack
              (with a window of W > 1: wait for ack i-W, then make, fill,
              send).
  resend      one float32 array of 4096 bytes (1024 elements), made and
              filled once, sent again every item; the consumer receives it,
              reads its first and last element (checked; W4's consumer
              reads the first and last byte), drops it and acks.
  dataloader  a DataLoader epoch, timed as the peer torch_dataloader is
              (run_epochs below; us_per_batch = the median over W6_DL_EPOCHS
              epochs of epoch time / batches, worker start included), in
              two flavours, both of fresh tensors every batch:
              w6_dataloader        the peer's: a map dataset of fresh samples
                                   (3x512x512 float32, each a torch.empty
                                   filled whole in the worker), batch_size
                                   samples collated by default_collate (which
                                   allocates the batch: torch in its shared
                                   memory, the drop-in in an ipcref block);
              w6_dataloader_batch  the dataset makes each batch itself: a
                                   torch.empty((batch, 3, 512, 512)) filled
                                   whole in the worker, batch_size=None (no
                                   collate): a plain tensor is pickled, so
                                   torch copies it into its shared memory
                                   and the drop-in copies it into a block
                                   (one copy each way).
              The main process reads one float per page of each batch
              (checked) and drops it.

Rows (ROWS below; a row is a peer name, the workloads it has and the function
that runs them):
  ipcref_py      the package's own API: fresh: a = ctx.empty((n,),
                 "float32"); a.fill(v); peer.send(a); del a. resend: the
                 array made once by ctx.empty, peer.send(a) each item. The
                 consumer: x, meta = peer.recv(); reads; del x; acks.
                 Each row has its own consumer, forked before the producer
                 makes its Context, which makes its own Context and
                 connects to the producer's listener (an abstract-namespace
                 name); the producer makes a Context (default options),
                 listens and accepts. The row ends when the producer closes
                 its Peer (the consumer's recv raises PeerGone).
  ipcref_dropin  ipcref's drop-in for torch's sharing (python/ipcref/torch.py):
                 import ipcref.torch; ipcref.torch.install() in this (the
                 main) process, then the peers' torch code as it is.
                 fresh, resend: the torch_mp_fd rows (a torch.multiprocessing
                 Queue and a consumer forked after install(), fork context;
                 the consumer q.get()s, reads, drops, acks). fresh:
                 t = torch.empty(n); t.fill_(v); q.put(t); dropped (the
                 drop-in copies t once into an ipcref block, where torch_mp_fd
                 pays share_memory_()'s copy). resend: one torch.empty(1024)
                 filled once, put each item (a 4 KiB copy into a new block
                 each put: the drop-in copies whatever is not in ipcref
                 memory, where torch_mp_fd's share_memory_() moved it once).
                 dataloader: torch.utils.data.DataLoader(dataset,
                 batch_size=..., num_workers=W6_DL_WORKERS), made as the peer
                 torch_dataloader makes it (its workers, forked, inherit the
                 drop-in); both flavours. run_epochs and dataloader_dataset
                 are the peer's, so that the rows differ only in how batches
                 cross.
  ipcref_dropin_empty  (printed by ipcref_dropin: fresh, resend) the same
                 queue rows with the zero-copy allocation: t =
                 ipcref.torch._here().ctx.empty((n,), torch.float32,
                 like="torch") (resend: that tensor made once), filled, put:
                 it is in ipcref memory already, nothing is copied.
  torch_dataloader  (printed by ipcref_dropin, w6_dataloader_batch only) the
                 batch flavour's torch baseline, timed before install(): the
                 peer file (bench/peers/w6_python.py) has the collate flavour
                 only, so its like-for-like runs here, the same code without
                 the drop-in.
  The drop-in's rows run in this process after the ipcref_py rows: the
  DataLoader ones first (torch's baseline, install(), the drop-in's,
  uninstall()), then the queue rows (install() again, uninstall() at the
  end). When torch or ipcref.torch does not import, they print
  status=skipped.

Items are timed one by one (perf_counter_ns) for W6_SECONDS after 2
warm-ups (with a window: after the items that fill it), at least
W6_MIN_ITEMS. Printed per row: us_median (n, mean, p99, window as extras)
and us_p99.

Environment: W6_SIZES (comma separated, default 4, 24 and 64 MiB),
W6_SECONDS (default 1.0), W6_MIN_ITEMS (default 8), W6_WINDOW (default 1,
at most 8), W6_DL_WORKERS, W6_DL_BATCH, W6_DL_BATCHES, W6_DL_EPOCHS (the
DataLoader rows'; a batch is W6_DL_BATCH rounded down to whole samples).
The package is imported from sys.path: bench/run.sh puts
build/python (made by `make python`) first on PYTHONPATH. When it does not
import, every ipcref_py row prints status=skipped.

Usage: python3 w6_python.py [ROW[,ROW...]] [WORKLOAD[,WORKLOAD...]]
  ROW: ipcref_py ipcref_dropin (default: both; ipcref_dropin prints the
  ipcref_dropin_empty rows and the batch flavour's torch_dataloader too)
  WORKLOAD: fresh resend dataloader (w6_fresh ... also accepted; default:
  all; dataloader: both flavours); a row runs the workloads it has."""
import collections
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
from w6_harness import (ACK_WAIT_S, Acks, CONNECT_S, DL_BATCH, DL_BATCHES,
                        DL_SAMPLE, DL_WORKERS, RESEND_SIZE, Row, SECONDS,
                        SIZES, WORKLOADS, ack, dataloader_dataset, line,
                        measure, pages_ok, report, run_epochs, value_of)  # noqa: E402


def rows_of(peer, wls):
    return [Row(peer, w, size) for w in wls if w in ("fresh", "resend")
            for size in (SIZES if w == "fresh" else [RESEND_SIZE])]


# ---- ipcref_py: the package's own API ----------------------------------------

def py_consumer(name, acks, row):
    """Makes its own Context, connects to the producer (retrying while it
    starts listening), receives until the producer closes its Peer."""
    import ipcref
    code = 0
    with ipcref.Context() as ctx:
        deadline = time.monotonic() + CONNECT_S
        while True:
            try:
                peer = ctx.connect(name)
                break
            except ipcref.PeerGone:
                if time.monotonic() > deadline:
                    os._exit(4)
                time.sleep(0.001)
        k = 0
        with peer:
            while True:
                try:
                    x, _ = peer.recv(timeout=ACK_WAIT_S)
                except ipcref.PeerGone:
                    break  # the producer closed: the row's end
                except ipcref.Error as e:
                    print(f"# ipcref_py consumer: {e!r}", flush=True)
                    code = 3
                    break
                ok = pages_ok(x.reshape(-1), row, k)
                del x  # the lease goes back
                ack(acks, ok)
                k += 1
    os.close(acks)
    sys.stdout.flush()
    os._exit(code)


def run_py(peer_name, wls):
    rows = rows_of(peer_name, wls)
    try:
        import ipcref
    except Exception as e:  # not built, or built against another interpreter
        print(f"# {peer_name}: import ipcref: {e!r}", flush=True)
        for row in rows:
            row.line("status=skipped reason=import-ipcref-failed-run-make-python")
        return
    import multiprocessing as mp
    mpx = mp.get_context("fork")
    for n, row in enumerate(rows):
        name = f"@ipcref-w6-{os.getpid()}-{n}"
        acks_r, acks_w = os.pipe()
        # forked before this process makes its Context: the consumer inherits none of it
        child = mpx.Process(target=py_consumer, args=(name, acks_w, row), daemon=True)
        child.start()
        os.close(acks_w)  # the consumer's alone: its death reads as the end of the pipe
        acks = Acks(acks_r)
        ns = []
        try:
            with ipcref.Context() as ctx, ctx.listen(name) as lst:
                peer = lst.accept(timeout=CONNECT_S)
                try:
                    if row.fresh:
                        def produce(i, ctx=ctx, peer=peer, row=row):
                            a = ctx.empty((row.n,), "float32")
                            a.fill(value_of(i))
                            peer.send(a)
                            del a
                    else:
                        once = ctx.empty((row.n,), "float32")
                        once.fill(1.0)

                        def produce(i, peer=peer, once=once):
                            peer.send(once)
                    ns = measure(produce, acks.wait, SECONDS)
                finally:
                    peer.close()
        except (TimeoutError, OSError, EOFError, ipcref.Error) as e:
            print(f"# {row.peer} w6_{row.wl} size={row.size}: {e!r}", flush=True)
            acks.bad += 1
        finally:
            child.join(30)
            if child.exitcode is None:
                child.kill()
                child.join()
            os.close(acks_r)
        report(row, ns, acks.bad, child.exitcode)


# ---- DataLoader rows: the same dataset and timing as the peer torch_dataloader


def batch_dataset():
    """The batch flavour's dataset (batch_size=None: no collate): DL_BATCHES
    batches, each a fresh torch.empty((per_batch, 3, 512, 512)) float32 made
    and filled whole in the worker (batch b holding value_of(b)), the same
    bytes as a collated batch of dataloader_dataset; and per_batch."""
    import torch

    per_batch = max(1, DL_BATCH // DL_SAMPLE)

    class FreshBatches(torch.utils.data.Dataset):
        def __len__(self):
            return DL_BATCHES

        def __getitem__(self, b):
            t = torch.empty((per_batch, 3, 512, 512), dtype=torch.float32)
            t.fill_(value_of(b))
            return t

    return FreshBatches(), per_batch


# ---- ipcref_dropin: ipcref.torch, the drop-in for torch's sharing ------------

DROPIN_EMPTY = "ipcref_dropin_empty"
DL_SIZE = max(1, DL_BATCH // DL_SAMPLE) * DL_SAMPLE  # bytes of one DataLoader batch


def guarded(peer, wl, size, fn):
    """fn(), or a failed line when it raises (the next rows still run)."""
    try:
        fn()
    except Exception as e:  # a worker's error, the drop-in's, ...
        print(f"# {peer} w6_{wl} size={size}: {e!r}", flush=True)
        line(peer, wl, size, f"status=failed reason={type(e).__name__}")


def run_dropin_dataloader(peer_name, torch, dropin):
    """The two DataLoader flavours: torch's own sharing for the batch flavour
    (its baseline: the peer file has the collate flavour only), then, with
    the drop-in installed, both flavours; the loader made as the peer
    torch_dataloader makes it."""
    import warnings
    # more workers than CPUs is what the row asks for: no warning about it
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    samples, per_batch = dataloader_dataset()
    batches, _ = batch_dataset()
    DataLoader = torch.utils.data.DataLoader

    def collated():
        return DataLoader(samples, batch_size=per_batch, num_workers=DL_WORKERS)

    def whole():
        return DataLoader(batches, batch_size=None, num_workers=DL_WORKERS)

    guarded("torch_dataloader", "dataloader_batch", DL_SIZE,
            lambda: run_epochs("torch_dataloader", whole, per_batch, "dataloader_batch"))
    dropin.install()  # in the main process, before the DataLoaders (their workers are forked)
    try:
        guarded(peer_name, "dataloader", DL_SIZE,
                lambda: run_epochs(peer_name, collated, per_batch))
        guarded(peer_name, "dataloader_batch", DL_SIZE,
                lambda: run_epochs(peer_name, whole, per_batch, "dataloader_batch"))
    finally:
        dropin.uninstall()


def dropin_consumer(q, acks, row):
    """The peer's torch_consumer: q.get() (the drop-in claims the ticket from
    the producer's sharer and receives the view), reads, drops (its lease
    goes back), acks."""
    import torch
    torch.set_num_threads(1)
    k = 0
    while True:
        t = q.get()
        if t is None:
            break
        ok = pages_ok(t, row, k)
        del t
        ack(acks, ok)
        k += 1


def run_dropin_queue(rows, torch, dropin):
    """The torch_mp_fd rows with the drop-in installed first: per row a
    torch.multiprocessing Queue and a consumer forked (fork context).
    ipcref_dropin makes its tensors with torch.empty (the drop-in copies each
    put once into a block), ipcref_dropin_empty in ipcref memory (no copy)."""
    import ipcref
    import torch.multiprocessing as tmp
    dropin.install()  # before the queues and the consumers
    mpx = tmp.get_context("fork")
    try:
        for row in rows:
            if row.peer == DROPIN_EMPTY:
                def new(n):
                    return dropin._here().ctx.empty((n,), torch.float32, like="torch")
            else:
                def new(n):
                    return torch.empty(n, dtype=torch.float32)
            q = mpx.Queue()
            acks_r, acks_w = os.pipe()
            child = mpx.Process(target=dropin_consumer, args=(q, acks_w, row), daemon=True)
            child.start()
            os.close(acks_w)  # the consumer's alone: its death reads as the end of the pipe
            acks = Acks(acks_r)
            ns = []
            try:
                if row.fresh:
                    def produce(i, q=q, row=row, new=new):
                        t = new(row.n)
                        t.fill_(value_of(i))
                        q.put(t)  # then dropped: the Queue holds it until it is pickled
                else:
                    once = new(row.n)
                    once.fill_(1.0)

                    def produce(i, q=q, once=once):
                        q.put(once)
                ns = measure(produce, acks.wait, SECONDS)
            except (TimeoutError, OSError, EOFError, ipcref.Error) as e:
                print(f"# {row.peer} w6_{row.wl} size={row.size}: {e!r}", flush=True)
                acks.bad += 1
            finally:
                q.put(None)
                child.join(30)
                if child.exitcode is None:
                    child.kill()
                    child.join()
                os.close(acks_r)
                q.close()
                q.join_thread()
            report(row, ns, acks.bad, child.exitcode)
    finally:
        dropin.uninstall()


def run_dropin(peer_name, wls):
    """ipcref_dropin: the DataLoader rows (both flavours, and the batch
    flavour's torch baseline), then the queue rows, ipcref_dropin and
    ipcref_dropin_empty side by side for each workload and size."""
    rows = [r for mine in rows_of(peer_name, wls)
            for r in (mine, Row(DROPIN_EMPTY, mine.wl, mine.size))]
    dls = [(p, w) for p, w in ((peer_name, "dataloader"), ("torch_dataloader", "dataloader_batch"),
                               (peer_name, "dataloader_batch")) if "dataloader" in wls]
    why = err = None
    try:
        import torch
    except ImportError as e:
        why, err = "apt-get-install-python3-torch", e
    else:
        try:
            import ipcref.torch as dropin
        except Exception as e:  # not built, or built against another interpreter
            why, err = "import-ipcref-torch-failed-run-make-python", e
    if why:
        print(f"# {peer_name}: {err!r}", flush=True)
        for row in rows:
            row.line(f"status=skipped reason={why}")
        for p, w in dls:
            line(p, w, DL_SIZE, f"status=skipped reason={why}")
        return
    torch.set_num_threads(1)
    if dls:
        run_dropin_dataloader(peer_name, torch, dropin)
    if rows:
        run_dropin_queue(rows, torch, dropin)


# Row name -> (its workloads, the function that runs them: fn(row name, workloads))
ROWS = collections.OrderedDict([
    ("ipcref_py", (("fresh", "resend"), run_py)),
    ("ipcref_dropin", (("fresh", "resend", "dataloader"), run_dropin)),
])


def main():
    args = [[x for x in arg.replace(" ", ",").split(",") if x] for arg in sys.argv[1:3]]
    peers = args[0] if args else list(ROWS)
    wls = args[1] if len(args) > 1 else list(WORKLOADS)
    wls = [w[3:] if w.startswith("w6_") else w for w in wls]
    if any(p not in ROWS for p in peers) or any(w not in WORKLOADS for w in wls):
        sys.exit(__doc__)
    for peer in peers:
        has, fn = ROWS[peer]
        mine = [w for w in wls if w in has]
        if mine:
            fn(peer, mine)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skips the interpreter's teardown (long once torch is loaded)
