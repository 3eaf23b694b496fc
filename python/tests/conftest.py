"""Shared helpers of the ipcref Python suite.

Multi-process cases fork real processes: a child runs a function and leaves
with os._exit (0: it passed; 99: it raised, traceback on its stderr; any
other code: what the function returned), and the parent waits for it with a
deadline, so a hang fails the test instead of blocking the suite. A child
left running by a failed test is killed at teardown.
"""

import itertools
import os
import select
import signal
import socket
import sys
import time
import traceback

import pytest

import ipcref  # build it first: make python; then PYTHONPATH=build/python

# Generous: the suite also runs on a slow 2-core machine.
WAIT = 30.0

# The ipcref.h names of ipcref_result codes (the C enum, never renumbered).
RESULT_NAMES = {
    0: "OK", -1: "EINVAL", -2: "ENOMEM", -3: "ERANGE", -4: "EBUSY",
    -5: "EPROTO", -6: "ESYS", -7: "ENODEV", -8: "EPEER", -9: "ETIMEDOUT",
    -10: "ESATURATED", -11: "EDEAD", -12: "ENEEDCOPY", -13: "EDEVICE",
    -14: "EAGAIN", -15: "ENOTSUP",
}
EDEAD = -11

# The stats that say what a context holds or handed out: a refused call
# leaves them as they were.
HOLDING = ("live_bufs", "live_bytes", "live_slots", "limbo_blocks",
           "limbo_bytes", "peers", "imported_bufs", "fds_sent")

_paths = itertools.count()


def abstract_path():
    """A fresh abstract socket path, unique to this process."""
    return "@ipcref-test-%d-%d" % (os.getpid(), next(_paths))


def holding(ctx):
    s = ctx.stats()
    return {k: s[k] for k in HOLDING}


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def mappings():
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def seqpacket_pair():
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def wait_readable(fd, timeout=WAIT):
    r, _, _ = select.select([fd], [], [], timeout)
    if not r:
        pytest.fail("nothing readable on fd %d within %.0f s" % (fd, timeout))


def read_byte(fd, timeout=WAIT):
    """One byte from a pipe, failing the test past the timeout."""
    wait_readable(fd, timeout)
    b = os.read(fd, 1)
    if not b:
        pytest.fail("the other process closed its pipe before signalling")
    return b


def poll_until(cond, timeout=WAIT, step=0.01, tick=None):
    """Calls tick() (if any) then cond() until cond() is true or the
    deadline passes; returns the last value of cond()."""
    deadline = time.monotonic() + timeout
    while True:
        if tick is not None:
            tick()
        v = cond()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(step)


class Procs:
    """Forked children of one test, each waited for with a deadline."""

    def __init__(self):
        self.pids = []

    def fork(self, fn, *args, close=()):
        """Runs fn(*args) in a forked child; returns its pid. The child
        first closes what `close` names (sockets or fds: the parent's ends,
        so that a hang-up is seen), exits 0 when fn returns None (or its
        int return otherwise), 99 when it raises."""
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 98
            try:
                for c in close:
                    if isinstance(c, int):
                        os.close(c)
                    else:
                        c.close()
                r = fn(*args)
                code = 0 if r is None else int(r)
            except BaseException:
                try:
                    traceback.print_exc()
                    sys.stderr.flush()
                except BaseException:
                    pass
                code = 99
            finally:
                os._exit(code)
        self.pids.append(pid)
        return pid

    def wait(self, pid, timeout=WAIT):
        """The child's exit code (negative: the signal that ended it);
        kills it and fails the test if it outlives the timeout."""
        deadline = time.monotonic() + timeout
        while True:
            got, status = os.waitpid(pid, os.WNOHANG)
            if got == pid:
                self.pids.remove(pid)
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() > deadline:
                self.kill(pid)
                pytest.fail("child %d still running after %.0f s"
                            % (pid, timeout))
            time.sleep(0.005)

    def expect_ok(self, pid, timeout=WAIT):
        code = self.wait(pid, timeout)
        assert code == 0, "child exited with %d (99: it raised; see " \
                          "its stderr above; negative: a signal)" % code

    def kill(self, pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        if pid in self.pids:
            self.pids.remove(pid)

    def cleanup(self):
        for pid in list(self.pids):
            self.kill(pid)


@pytest.fixture
def procs():
    p = Procs()
    yield p
    p.cleanup()


class Pair:
    """Two Contexts in this process on the two ends of a socketpair: a
    producer (``prod`` with peer ``tx``) and a consumer (``cons``, peer
    ``rx``)."""

    def __init__(self, **producer_options):
        a, b = seqpacket_pair()
        self.prod = ipcref.Context(**producer_options)
        self.cons = ipcref.Context()
        self.tx = self.prod.adopt(a)
        self.rx = self.cons.adopt(b)

    def roundtrip(self, obj, **recv_kw):
        self.tx.send(obj, meta=recv_kw.pop("meta", None))
        recv_kw.setdefault("timeout", WAIT)
        return self.rx.recv(**recv_kw)

    def nothing_waits(self):
        """True when the consumer has nothing to receive: a sentinel sent
        now is the very next message."""
        import numpy as np
        self.tx.send(np.array([12345], dtype=np.int64), meta=b"sentinel")
        a, meta = self.rx.recv(timeout=WAIT)
        return meta == b"sentinel" and not isinstance(a, list) \
            and a.tolist() == [12345]

    def close(self):
        for o in (self.tx, self.rx, self.prod, self.cons):
            o.close()


@pytest.fixture
def make_pair():
    made = []

    def make(**producer_options):
        p = Pair(**producer_options)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


@pytest.fixture
def pair(make_pair):
    return make_pair()
