"""ipcref.torch: tensors sent through torch.multiprocessing travel as ipcref
blocks.

    import ipcref.torch
    ipcref.torch.install()     # before the queues, pipes or DataLoader

After ``install()``, a CPU tensor pickled for another process (a
``torch.multiprocessing`` queue or pipe, a ``DataLoader`` worker's batch)
is not shared through a file descriptor or a ``/dev/shm`` file per storage,
but as a view of an ipcref block, with torch's semantics: every holder may
write it, and the writes are shared. A tensor that is not in ipcref memory
already is copied once into a block (as torch copies it into its own
shared memory); in a ``DataLoader`` worker, collation allocates straight
into a block.

How a tensor crosses. A queue is a pipe, which cannot carry fds, and when
a tensor is pickled its reader is not known yet. So the pickle holds only a
ticket: the sending process's *sharer* address and a number. The sharer
(a listening socket and a daemon thread, started on first use, as
``multiprocessing.resource_sharer`` for torch's fd strategy) keeps the
tensor alive under that ticket. The process that unpickles it connects to
the sharer once (an ipcref peer for the views, and a plain socket for its
claims), claims the ticket, and receives the view over the peer: the lease
is taken for that process then, so its death gives the memory back, and
its last reference returns the lease (no ``ipc_collect``). A ticket is
claimed once; one never claimed (the queue dropped, the reader died
first) is dropped after ``claim_timeout`` seconds, and the memory goes
back. A claim that comes later raises an ``ipcref.Error``; one that is not
answered within ``claim_timeout`` raises ``ipcref.Timeout``, and the view
that comes late is dropped by the next claim. The sharer takes claims only
from processes of its own uid (the kernel's credentials of the claims
socket, as ipcref's peers), and sends the view to the claimer's own peer.

A tensor in torch's own shared memory already (``share_memory_()``, a
model trained Hogwild) goes as torch sends it: its holders write it in
place, and a copy would keep their writes from each other.

A tensor keeps its strides when they are dense (contiguous, channels_last,
a transpose; a copy into a block keeps them too), and a ``Parameter``
arrives a ``Parameter``, with its ``requires_grad``.
"""

import os
import random
import selectors
import socket
import struct
import threading
import time

import torch as _torch
from multiprocessing.reduction import ForkingPickler

from . import Context, Error, PeerGone, Timeout

__all__ = ["install", "uninstall", "installed"]

_TICKET = struct.Struct("<QQ")  # pid (the credential's counts), ticket
_ANSWER = struct.Struct("<QB")  # ticket, _SENT / _NOT_HELD / _NOT_SENT
_SENT, _NOT_HELD, _NOT_SENT = 1, 0, 2
_CRED = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid

_lock = threading.Lock()
_state = None  # this process's (see _here)
_installed = False
_saved = {}


class _Sharer:
    """The tickets of this process's tensors, served to whoever of its uid
    claims them: a daemon thread over a listening ipcref socket (peers) and
    a plain one (claims: pid and ticket, 16 bytes, answered with the ticket
    and whether its view was sent)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.path = "@ipcref-sharer-%d-%016x" % (os.getpid(),
                                                 random.getrandbits(64))
        self.listener = ctx.listen(self.path, blocking=False)
        self.claims = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.claims.bind("\0" + self.path[1:] + ".claims")
        self.claims.listen(64)
        self.claims.setblocking(False)
        self.tickets = {}  # number -> (tensor, deadline)
        self.next = 1
        self.peers = {}  # claimer pid -> Peer (the sharer thread's)
        self.pruned = time.monotonic()  # when dead claimers were last let go
        self.lock = threading.Lock()
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener.fileno(), selectors.EVENT_READ, "peer")
        self.sel.register(self.claims, selectors.EVENT_READ, "claims")
        threading.Thread(target=self._serve, name="ipcref-sharer",
                         daemon=True).start()

    def hold(self, tensor, claim_timeout):
        """A ticket for `tensor`, good for claim_timeout seconds."""
        with self.lock:
            n = self.next
            self.next += 1
            self.tickets[n] = (tensor, time.monotonic() + claim_timeout)
        return n

    def _serve(self):
        while True:
            for key, _ in self.sel.select(1.0):
                try:
                    if key.data == "peer":
                        self._accept_peer()
                    elif key.data == "claims":
                        self._accept_claimer()
                    else:
                        self._claim(key.fileobj, key.data)
                except (OSError, Error):
                    pass  # a claimer that went away: nothing of ours to do
            self._expire()
            self._prune()

    def _accept_peer(self):
        try:
            peer = self.listener.accept(timeout=0)
        except Timeout:
            return
        self.peers[peer.pid] = peer

    def _accept_claimer(self):
        """A claims connection, kept with its pid when the kernel says it
        is of our uid (ipcref's rule for peers), else closed."""
        conn, _ = self.claims.accept()
        pid, uid, _ = _CRED.unpack(conn.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
        if uid != os.getuid():
            conn.close()
            return
        self.sel.register(conn, selectors.EVENT_READ, pid)

    def _claim(self, conn, pid):
        """One claim on `conn`, of process `pid` (the kernel's word, not
        the message's): its ticket's view goes to that process's peer, and
        only then is the ticket used up."""
        data = conn.recv(_TICKET.size + 1)
        if len(data) != _TICKET.size:  # the claimer hung up, or garbled
            self.sel.unregister(conn)
            conn.close()
            return
        _, n = _TICKET.unpack(data)
        with self.lock:
            held = self.tickets.get(n)
        status = _NOT_HELD if held is None else _NOT_SENT
        for wait in (5, 0) if held is not None else ():
            # Again (wait 0) only for a new process of a dead one's pid,
            # whose connection is waiting already: a claimer that died
            # must not hold the sharer, and every other claim, for 5 s.
            peer = self._peer_of(pid, wait)
            if peer is None:
                break
            try:
                peer.send(held[0], meta=n)
                status = _SENT
                break
            except PeerGone:  # a dead process's, whose pid is the claimer's
                self.peers.pop(pid, None)
            except Error:
                break
        if status == _SENT:
            with self.lock:
                self.tickets.pop(n, None)
        conn.send(_ANSWER.pack(n, status))

    def _peer_of(self, pid, wait):
        """The peer of process `pid`: it connected before it claimed, but
        may not be accepted yet (None if it does not come within `wait`
        seconds; 0: only connections already waiting)."""
        deadline = time.monotonic() + wait
        while pid not in self.peers:
            left = max(0.0, deadline - time.monotonic())
            if left <= 0 and wait:
                return None
            try:
                peer = self.listener.accept(timeout=left)
            except Timeout:
                return None
            except Error:  # refused (another uid), or gone: the next
                continue
            self.peers[peer.pid] = peer
        return self.peers[pid]

    def _prune(self):
        """Lets go of the peers of claimers that died, once a second at
        most: a trainer whose DataLoader starts new workers every epoch
        must not keep a peer, and its fds, for every worker it served.
        What a dead claimer held comes back by its context's watch."""
        now = time.monotonic()
        if now - self.pruned < 1.0:
            return
        self.pruned = now
        for pid, peer in list(self.peers.items()):
            try:
                alive = peer.stats()["alive"]
            except Error:
                alive = False
            if not alive:
                del self.peers[pid]
                peer.close()

    def _expire(self):
        now = time.monotonic()
        with self.lock:
            for n in [n for n, (_, d) in self.tickets.items() if d < now]:
                del self.tickets[n]


class _Claimer:
    """This process's connection to one sharer: an ipcref peer for the
    views and a plain socket for the claims; one claim at a time, so an
    answer or a view of another ticket is one a claim that timed out left:
    it is dropped."""

    def __init__(self, ctx, path):
        self.peer = ctx.connect(path)
        self.claims = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.claims.connect("\0" + path[1:] + ".claims")
        self.lock = threading.Lock()

    def claim(self, n, timeout):
        with self.lock:
            deadline = time.monotonic() + timeout
            self.claims.send(_TICKET.pack(os.getpid(), n))
            while True:
                data = self._recv_answer(n, deadline)
                if len(data) != _ANSWER.size:
                    raise PeerGone(-8, "EPEER", "ipcref.torch: the sharer of "
                                   "ticket %d hung up" % n)
                got, status = _ANSWER.unpack(data)
                if got == n:
                    break
            if status == _NOT_HELD:
                raise Error(-8, "EPEER", "ipcref.torch: ticket %d was claimed "
                            "already, or not within claim_timeout" % n)
            if status != _SENT:
                raise Error(-8, "EPEER", "ipcref.torch: ticket %d: its sharer "
                            "could not send to this process" % n)
            while True:
                try:
                    t, meta = self.peer.recv(
                        timeout=max(0, deadline - time.monotonic()),
                        like="torch")
                except Timeout:
                    raise _late(n, "its view did not come") from None
                if meta == n:
                    return t
                del t  # a late view of a claim that timed out: given back

    def _recv_answer(self, n, deadline):
        left = deadline - time.monotonic()
        if left <= 0:
            raise _late(n, "its sharer did not answer")
        self.claims.settimeout(left)
        try:
            return self.claims.recv(_ANSWER.size + 1)
        except socket.timeout:
            raise _late(n, "its sharer did not answer") from None


def _late(n, what):
    return Timeout(-9, "ETIMEDOUT", "ipcref.torch: ticket %d: %s within "
                   "claim_timeout" % (n, what))


class _Here:
    """This process's part: its context, its sharer (made on first send),
    its claimers (one per sharer it took from)."""

    def __init__(self, claim_timeout):
        self.pid = os.getpid()
        self.ctx = Context(writable_shares=True)
        self.claim_timeout = claim_timeout
        self.sharer = None
        self.claimers = {}


def _here():
    global _state
    with _lock:
        if _state is None or _state.pid != os.getpid():  # new, or forked
            timeout = _state.claim_timeout if _state else 60.0
            _state = _Here(timeout)
        return _state


def _dense_strides(t):
    """t's strides when they lay its elements out with neither gaps nor
    overlap (contiguous, channels_last, a transpose), else None."""
    if not t.numel():
        return None
    expect = 1
    for stride, size in sorted((st, sz) for sz, st in
                               zip(t.shape, t.stride()) if sz != 1):
        if stride != expect:
            return None
        expect *= size
    return tuple(t.stride())


def _in_ipcref_already(t):
    """True when t's memory is an ipcref block's."""
    from . import _ipcref
    return bool(t.numel()) and \
        _ipcref._owns(t.data_ptr(), t.numel() * t.element_size())


def _in_ipcref(t):
    """The tensor itself when its memory is an ipcref block's, else a copy
    of it in a new block: with its strides when they are dense (as torch's
    own sharing keeps them), else contiguous."""
    if _in_ipcref_already(t):
        return t
    strides = _dense_strides(t)
    if strides is None:
        out = _here().ctx.empty(tuple(t.shape), t.dtype, like="torch")
    else:
        out = _here().ctx.empty((t.numel(),), t.dtype, like="torch") \
            .as_strided(tuple(t.shape), strides)
    out.copy_(t)
    return out


def _reduce_tensor(t):
    if t.device.type != "cpu" or t.is_sparse or t.dtype not in _SHAREABLE:
        return _saved["reduce_tensor"](t)
    if t.is_shared() and not _in_ipcref_already(t):
        # In torch's shared memory already (share_memory_(), a Hogwild
        # model): its holders write it in place, so it goes as torch sends
        # it, not as a copy whose writes would reach nobody.
        return _saved["reduce_tensor"](t)
    if t.requires_grad and not t.is_leaf:
        raise RuntimeError("Cowardly refusing to serialize non-leaf tensor "
                           "which requires_grad (call detach() first)")
    here = _here()
    with _lock:
        if here.sharer is None:
            here.sharer = _Sharer(here.ctx)
    n = here.sharer.hold(_in_ipcref(t.detach()), here.claim_timeout)
    return _rebuild_tensor, (here.sharer.path, n, t.requires_grad,
                             isinstance(t, _torch.nn.Parameter))


def _rebuild_tensor(path, n, requires_grad, parameter=False):
    here = _here()
    with _lock:
        claimer = here.claimers.get(path)
        if claimer is None:
            claimer = here.claimers[path] = _Claimer(here.ctx, path)
    t = claimer.claim(n, here.claim_timeout)
    if parameter:  # as torch's rebuild_parameter
        return _torch.nn.Parameter(t, requires_grad=requires_grad)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _collate_tensor_fn(batch, *, collate_fn_map=None):
    """torch's collate_tensor_fn, allocating into an ipcref block in a
    worker (where torch allocates into its own shared memory)."""
    elem = batch[0]
    out = None
    if _torch.utils.data.get_worker_info() is not None and \
            elem.device.type == "cpu" and elem.dtype in _SHAREABLE:
        out = _here().ctx.empty((len(batch),) + tuple(elem.shape), elem.dtype,
                                like="torch")
    return _torch.stack(batch, 0, out=out)


_SHAREABLE = {getattr(_torch, n) for n in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "float16", "bfloat16",
    "float32", "float64", "complex64", "complex128")}


def install(claim_timeout=60.0):
    """Makes CPU tensors pickled for other processes (torch.multiprocessing
    queues and pipes, DataLoader workers) travel as ipcref blocks. Call it
    in the main process before making queues or a DataLoader (its forked
    workers inherit it). ``claim_timeout``: seconds a sent tensor waits to
    be unpickled before its memory is given back."""
    global _installed
    import torch.multiprocessing.reductions as red
    import torch.utils.data._utils.collate as collate
    _here().claim_timeout = float(claim_timeout)
    if _installed:
        return
    _saved["reduce_tensor"] = red.reduce_tensor
    _saved["collate"] = collate.collate_tensor_fn
    ForkingPickler.register(_torch.Tensor, _reduce_tensor)
    ForkingPickler.register(_torch.nn.parameter.Parameter, _reduce_tensor)
    collate.collate_tensor_fn = _collate_tensor_fn
    collate.default_collate_fn_map[_torch.Tensor] = _collate_tensor_fn
    _installed = True


def uninstall():
    """Gives tensors back to torch's own sharing."""
    global _installed
    import torch.utils.data._utils.collate as collate
    if not _installed:
        return
    ForkingPickler.register(_torch.Tensor, _saved["reduce_tensor"])
    ForkingPickler.register(_torch.nn.parameter.Parameter,
                            _saved["reduce_tensor"])
    collate.collate_tensor_fn = _saved["collate"]
    collate.default_collate_fn_map[_torch.Tensor] = _saved["collate"]
    _installed = False


def installed():
    """1 when install() is in effect in this process."""
    return _installed
