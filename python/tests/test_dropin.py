"""ipcref.torch: torch.multiprocessing and DataLoader over ipcref blocks.

Real processes (the fork start method, as DataLoader workers on Linux):
tensors through a torch.multiprocessing queue arrive whole and writable,
their writes shared both ways; a DataLoader epoch with workers gives every
batch right; the producer's memory returns when the consumer lets go, or
dies holding tensors; a ticket never claimed is given back after
claim_timeout; thousands of fresh tensors keep the consumer's fds and
mappings bounded; a malformed ticket unpickled by hand raises a clear
error; a claim of another uid is refused; a claim that timed out leaves
the next ones right; Parameters, requires_grad and dense strides arrive
as sent; the sharer lets go of the peers of claimers that died; a tensor
in torch's shared memory stays shared.
"""

import os
import signal
import socket
import time

import pytest

torch = pytest.importorskip("torch")
import torch.multiprocessing as mp  # noqa: E402

import ipcref  # noqa: E402
import ipcref.torch as dropin  # noqa: E402

WAIT = 30.0
ctx_mp = mp.get_context("fork")


@pytest.fixture
def installed():
    dropin.install()
    yield
    dropin.uninstall()


def producer_stats():
    return dropin._here().ctx.stats()


def settle(pred, what):
    """Collects until pred(stats) holds, or fails after WAIT seconds."""
    end = time.monotonic() + WAIT
    while True:
        dropin._here().ctx.collect()
        s = producer_stats()
        if pred(s):
            return s
        if time.monotonic() > end:
            pytest.fail("%s: %r" % (what, s))
        time.sleep(0.02)


def _echo(q, r, n):
    for i in range(n):
        t = q.get(timeout=WAIT)
        ok = bool((t == i).all()) and t.dtype == torch.float32
        t.add_(100)  # writable here, and shared with the producer
        r.put((i, ok))
        del t
    r.put("done")


def test_queue_round_trip_and_shared_writes(installed):
    q, r = ctx_mp.Queue(), ctx_mp.Queue()
    p = ctx_mp.Process(target=_echo, args=(q, r, 3))
    p.start()
    try:
        kept = []
        for i in range(3):
            t = dropin._here().ctx.empty((256, 64), torch.float32,
                                         like="torch")
            t.fill_(i)
            q.put(t)
            assert r.get(timeout=WAIT) == (i, True)
            assert bool((t == i + 100).all())  # the consumer's write is seen
            kept.append(t)
        assert r.get(timeout=WAIT) == "done"
        p.join(WAIT)
        assert p.exitcode == 0
    finally:
        if p.is_alive():
            p.kill()


def test_tensor_not_in_ipcref_is_copied_once(installed):
    q, r = ctx_mp.Queue(), ctx_mp.Queue()
    p = ctx_mp.Process(target=_echo, args=(q, r, 2))
    p.start()
    for i in range(2):
        t = torch.full((1000,), float(i))  # torch's own memory
        q.put(t)
        assert r.get(timeout=WAIT) == (i, True)
        assert bool((t == i).all())  # a copy went: ours is untouched
    assert r.get(timeout=WAIT) == "done"
    p.join(WAIT)
    assert p.exitcode == 0
    settle(lambda s: s["live_slots"] == 0, "leases left")


def _hold_then_wait(q, r):
    held = [q.get(timeout=WAIT) for _ in range(4)]
    r.put(sum(int(t[0]) for t in held))
    time.sleep(WAIT)  # killed here


def test_consumer_killed_holding_tensors(installed):
    q, r = ctx_mp.Queue(), ctx_mp.Queue()
    p = ctx_mp.Process(target=_hold_then_wait, args=(q, r))
    p.start()
    for i in range(4):
        t = dropin._here().ctx.empty((4096,), torch.float32, like="torch")
        t.fill_(i)
        q.put(t)
        del t
    assert r.get(timeout=WAIT) == 0 + 1 + 2 + 3
    settle(lambda s: s["live_slots"] == 4, "the consumer holds 4 leases")
    os.kill(p.pid, signal.SIGKILL)
    p.join(WAIT)
    settle(lambda s: s["live_slots"] == 0 and s["limbo_blocks"] == 0,
           "a dead consumer's tensors given back")


def test_unclaimed_ticket_given_back():
    dropin.install(claim_timeout=0.3)
    try:
        t = dropin._here().ctx.empty((1 << 16,), torch.float32, like="torch")
        payload = ctx_mp.reducer.ForkingPickler.dumps(t)  # never unpickled
        del t
        sharer = dropin._here().sharer
        assert len(sharer.tickets) == 1
        end = time.monotonic() + WAIT
        while sharer.tickets and time.monotonic() < end:
            time.sleep(0.05)
        assert not sharer.tickets, "a ticket nobody claimed was kept"
        settle(lambda s: s["live_bufs"] == 0, "the block given back")
        with pytest.raises(ipcref.Error) as e:  # a claim that comes late
            ctx_mp.reducer.ForkingPickler.loads(payload)
        assert "claim_timeout" in str(e.value)
    finally:
        dropin.uninstall()
        dropin.install(claim_timeout=60.0)
        dropin.uninstall()


def test_malformed_ticket_by_hand(installed):
    with pytest.raises(ipcref.PeerGone):
        dropin._rebuild_tensor("@ipcref-nobody-%d" % os.getpid(), 1, False)
    t = dropin._here().ctx.empty((8,), torch.float32, like="torch")
    ctx_mp.reducer.ForkingPickler.dumps(t)  # starts this process's sharer
    with pytest.raises(ipcref.Error):
        dropin._rebuild_tensor(dropin._here().sharer.path, 10 ** 9, False)


def _drain(q, r, n):
    fds0 = maps0 = None
    for i in range(n):
        t = q.get(timeout=WAIT)
        assert int(t[0]) == i % 1000
        del t
        if i == 200:
            fds0 = len(os.listdir("/proc/self/fd"))
            with open("/proc/self/maps") as f:
                maps0 = sum(1 for _ in f)
    with open("/proc/self/maps") as f:
        maps = sum(1 for _ in f)
    r.put((len(os.listdir("/proc/self/fd")) - fds0, maps - maps0))


def test_many_fresh_tensors_stay_bounded(installed):
    n = 10000
    q, r = ctx_mp.Queue(maxsize=8), ctx_mp.Queue()
    p = ctx_mp.Process(target=_drain, args=(q, r, n))
    p.start()
    for i in range(n):
        t = dropin._here().ctx.empty((16384,), torch.float32, like="torch")
        t[0] = i % 1000
        q.put(t)
        del t
    fds, maps = r.get(timeout=WAIT * 4)
    p.join(WAIT)
    assert p.exitcode == 0
    assert fds <= 4 and maps <= 16, (fds, maps)
    settle(lambda s: s["live_slots"] == 0, "leases left")


class _Frames(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        return torch.full((3, 64, 64), float(i))


def test_dataloader_with_workers(installed):
    dl = torch.utils.data.DataLoader(_Frames(), batch_size=4, num_workers=2)
    seen = []
    for b in dl:
        assert b.shape == (4, 3, 64, 64)
        seen.extend(int(x[0, 0, 0]) for x in b)
        b.add_(1)  # writable, as with torch's own sharing
    assert seen == list(range(32))


class _SlowFrames(_Frames):
    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.full((3, 64, 64), float(i))


def test_dataloader_worker_killed_mid_epoch(installed):
    """A worker SIGKILLed mid-epoch: torch says so (RuntimeError), the
    batches received stay whole, and once they are dropped nothing of the
    dead worker's is held here."""
    dl = torch.utils.data.DataLoader(_SlowFrames(), batch_size=2,
                                     num_workers=2, timeout=WAIT)
    it = iter(dl)
    kept = [next(it) for _ in range(3)]
    # torch's SIGCHLD handler may raise as soon as the worker is gone,
    # before the next batch is asked for: both are torch saying so.
    with pytest.raises(RuntimeError):
        os.kill(it._workers[0].pid, signal.SIGKILL)
        for b in it:
            kept.append(b)
    for b in kept:
        first = int(b[0, 0, 0, 0])
        assert bool((b[1] == first + 1).all())  # whole, and readable
    del it, dl, b
    kept.clear()
    settle(lambda s: s["imported_bufs"] == 0, "a dead worker's batches")


def test_uninstall_gives_torch_back():
    dropin.install()
    dropin.uninstall()
    assert not dropin.installed()
    q = ctx_mp.Queue()
    q.put(torch.ones(4))
    assert bool((q.get(timeout=WAIT) == 1).all())


def _close(q):
    """Closes a queue the test put into, and waits for its feeder thread,
    which closes its pipe: now, not during a later test counting fds."""
    q.close()
    q.join_thread()


def _report_kinds(q, r):
    got = q.get(timeout=WAIT)
    r.put([(type(t).__name__, t.requires_grad, t.tolist()) for t in got])


def test_parameters_and_requires_grad_arrive_as_sent(installed):
    """A Parameter arrives a Parameter (it came a plain Tensor), with its
    requires_grad, as torch's own sharing gives it."""
    q, r = ctx_mp.Queue(), ctx_mp.Queue()
    p = ctx_mp.Process(target=_report_kinds, args=(q, r))
    p.start()
    sent = [torch.nn.Parameter(torch.ones(2)),
            torch.nn.Parameter(torch.zeros(2), requires_grad=False),
            torch.full((2,), 3.0, requires_grad=True), torch.arange(2.0)]
    q.put(sent)
    assert r.get(timeout=WAIT) == [("Parameter", True, [1.0, 1.0]),
                                   ("Parameter", False, [0.0, 0.0]),
                                   ("Tensor", True, [3.0, 3.0]),
                                   ("Tensor", False, [0.0, 1.0])]
    p.join(WAIT)
    assert p.exitcode == 0
    _close(q)


def _report_layouts(q, r):
    got = q.get(timeout=WAIT)
    r.put([(tuple(t.stride()), t.tolist()) for t in got])


def test_dense_strides_are_kept(installed):
    """A tensor copied into a block keeps its strides when they are dense
    (channels_last, a transpose; it came contiguous); one with gaps comes
    contiguous; one in ipcref memory keeps its own."""
    q, r = ctx_mp.Queue(), ctx_mp.Queue()
    p = ctx_mp.Process(target=_report_layouts, args=(q, r))
    p.start()
    base = torch.arange(120.0).reshape(2, 3, 4, 5)
    own = dropin._here().ctx.empty((4, 6), torch.float32, like="torch")
    own.copy_(torch.arange(24.0).reshape(4, 6))
    sent = [base.contiguous(memory_format=torch.channels_last),
            base[0].transpose(0, 2), base[:, :, ::2], own.t()]
    q.put(sent)
    got = r.get(timeout=WAIT)
    p.join(WAIT)
    assert p.exitcode == 0
    _close(q)
    assert [s for s, _ in got] == [(60, 1, 15, 3), (1, 5, 20),
                                   (30, 10, 5, 1), (1, 6)]
    assert [v for _, v in got] == [t.tolist() for t in sent]


def _claims_after_a_timeout(q, r):
    dropin.install(claim_timeout=0.3)
    try:
        q.get(timeout=WAIT)
        r.put("no timeout")
    except TimeoutError:  # ipcref.Timeout is one
        r.put("timed out")
    dropin.install(claim_timeout=WAIT)
    got = []
    for _ in range(2):
        try:
            got.append(float(q.get(timeout=WAIT)[0]))
        except ipcref.Error as e:
            got.append(str(e))
    r.put(got)


def test_a_claim_that_timed_out_leaves_the_next_right(installed,
                                                      monkeypatch):
    """The sharer answers one claim only after its claimer gave up: the
    late answer and view are dropped, and the next claims get their own
    tensors (each got the one before's, EPROTO, for ever)."""
    go = ctx_mp.Event()
    claim = dropin._Sharer._claim
    calls = []

    def held_back(self, conn, *args):
        calls.append(1)
        if len(calls) == 1:
            go.wait(WAIT)  # until the claimer has timed out
        return claim(self, conn, *args)
    monkeypatch.setattr(dropin._Sharer, "_claim", held_back)
    q, r = ctx_mp.Queue(), ctx_mp.Queue()
    p = ctx_mp.Process(target=_claims_after_a_timeout, args=(q, r))
    p.start()
    try:
        for i in range(3):
            t = dropin._here().ctx.empty((4,), torch.float32, like="torch")
            t.fill_(i)
            q.put(t)
        assert r.get(timeout=WAIT) == "timed out"
        go.set()
        assert r.get(timeout=WAIT) == [1.0, 2.0]
        p.join(WAIT)
        assert p.exitcode == 0
        _close(q)
    finally:
        go.set()
        if p.is_alive():
            p.kill()


def _claims_then_waits(q, r):
    r.put("ready")
    q.get(timeout=WAIT)  # killed while the sharer holds its claim back


def _claims_in_time(q, r):
    dropin.install(claim_timeout=3.0)
    try:
        r.put(float(q.get(timeout=WAIT)[0]))
    except Exception as e:  # a Timeout: the sharer was held by the dead
        r.put("%s: %s" % (type(e).__name__, e))


def test_a_dead_claimer_holds_nobody_up(installed, monkeypatch):
    """A claimer killed while the sharer holds its claim back: serving it
    finds its peer gone and gives up at once, so the next claimer, with a
    claim_timeout of 3 s, gets its tensor (the sharer waited 5 s for a new
    peer of the dead one's pid, and it timed out)."""
    go, seen = ctx_mp.Event(), ctx_mp.Event()
    claim = dropin._Sharer._claim
    calls = []

    def held_back(self, conn, *args):
        calls.append(1)
        if len(calls) == 1:
            seen.set()
            go.wait(WAIT)  # until the claimer is dead
        return claim(self, conn, *args)
    monkeypatch.setattr(dropin._Sharer, "_claim", held_back)
    q1, q2, r = ctx_mp.Queue(), ctx_mp.Queue(), ctx_mp.Queue()
    victim = ctx_mp.Process(target=_claims_then_waits, args=(q1, r))
    victim.start()
    other = None
    try:
        assert r.get(timeout=WAIT) == "ready"
        q1.put(torch.ones(4))
        assert seen.wait(WAIT)
        victim.kill()
        victim.join(WAIT)
        other = ctx_mp.Process(target=_claims_in_time, args=(q2, r))
        other.start()
        q2.put(torch.full((4,), 7.0))
        go.set()
        assert r.get(timeout=WAIT) == 7.0
        other.join(WAIT)
        assert other.exitcode == 0
        _close(q1)
        _close(q2)
    finally:
        go.set()
        for p in (victim, other):
            if p is not None and p.is_alive():
                p.kill()


def _adds_one(q, r):
    t = q.get(timeout=WAIT)
    t.add_(1)
    r.put("added")


def test_torch_shared_memory_stays_shared(installed):
    """A tensor in torch's shared memory (share_memory_(), as a Hogwild
    model's parameters) goes as torch sends it: the consumer's in-place
    writes reach the producer, as without install()."""
    t = torch.zeros(8)
    t.share_memory_()
    q, r = ctx_mp.Queue(), ctx_mp.Queue()
    p = ctx_mp.Process(target=_adds_one, args=(q, r))
    p.start()
    q.put(t)
    assert r.get(timeout=WAIT) == "added"
    p.join(WAIT)
    assert p.exitcode == 0
    _close(q)
    assert t.tolist() == [1.0] * 8


def _takes_one(q, r):
    r.put(float(q.get(timeout=WAIT).sum()))


def _claim_once(i):
    """One claimer process takes one tensor and exits; everything of this
    side that the round made (queues, the process's sentinel) is closed
    here, so that only what the sharer keeps is left. Its pid."""
    q, r = ctx_mp.Queue(), ctx_mp.Queue()
    p = ctx_mp.Process(target=_takes_one, args=(q, r))
    p.start()
    q.put(torch.full((4,), float(i)))
    assert r.get(timeout=WAIT) == 4.0 * i
    p.join(WAIT)
    assert p.exitcode == 0
    _close(q)
    _close(r)
    pid = p.pid
    p.close()
    return pid


def test_dead_claimers_are_let_go(installed):
    """The sharer lets go of the peer of each claimer that died (a
    DataLoader starts new workers every epoch): none stays, and neither
    do their fds."""
    sharer = None

    def kept(pids):  # read from this thread: a copy of the sharer's keys
        return [pid for pid in list(sharer.peers) if pid in pids]

    def let_go(pids):
        end = time.monotonic() + WAIT
        while kept(pids) and time.monotonic() < end:
            time.sleep(0.05)
        assert kept(pids) == []
        settle(lambda s: s["live_slots"] == 0,
               "the dead claimers' leases back")
    # A first round makes the sharer (its sockets, its selector) and the
    # block's segment, whichever test ran before: counted from after it.
    first = _claim_once(-1)
    sharer = dropin._here().sharer
    let_go([first])
    fds = len(os.listdir("/proc/self/fd"))
    pids = [_claim_once(i) for i in range(3)]
    let_go(pids)
    assert len(os.listdir("/proc/self/fd")) <= fds


def _claim_as_nobody(path, n):
    """Another uid's forged claim of ticket n: 0 when refused."""
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect("\0" + path[1:] + ".claims")
    s.settimeout(WAIT / 2)  # refused at once; the wait for it is WAIT
    try:
        s.send(dropin._TICKET.pack(os.getpid(), n))
        return 0 if s.recv(64) == b"" else 2  # closed: refused
    except (BrokenPipeError, ConnectionResetError):
        return 0
    except socket.timeout:
        return 3


def _load(payload, r):
    r.put(ctx_mp.reducer.ForkingPickler.loads(payload).tolist())


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to be another uid")
def test_claims_of_another_uid_are_refused(installed, procs):
    """The claims socket is abstract, so any local user can connect: a
    claim from another uid is refused (the kernel's SO_PEERCRED, as
    ipcref's peers), and the ticket stays for its real claimer (another
    user's claim took it)."""
    t = dropin._here().ctx.empty((4,), torch.float32, like="torch")
    t.fill_(5)
    payload = ctx_mp.reducer.ForkingPickler.dumps(t)
    sharer = dropin._here().sharer
    n = max(sharer.tickets)
    code = procs.wait(procs.fork(_claim_as_nobody, sharer.path, n))
    assert code == 0, "another uid's claim was not refused (%d)" % code
    assert n in sharer.tickets
    r = ctx_mp.Queue()
    p = ctx_mp.Process(target=_load, args=(payload, r))
    p.start()
    assert r.get(timeout=WAIT) == [5.0] * 4
    p.join(WAIT)
    assert p.exitcode == 0
    assert n not in sharer.tickets
