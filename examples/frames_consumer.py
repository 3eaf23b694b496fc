"""frames_consumer.py: the Python twin of frames_consumer.c. It connects to
the producer's socket path, receives frames from a selectors loop (the
peer's fileno() is readable whenever a receive has something to say),
checks each (every element holds the number its metadata names, and the
numbers only grow), keeps a few as a real consumer would, and lets them go:
their memory goes back to the producer with no system call. It ends when
the producer hangs up.

    PYTHONPATH=build/python /usr/bin/python3 examples/frames_consumer.py @frames [KEEP]
"""
import selectors
import sys
import time

import ipcref


def connect(ctx, path):
    for _ in range(500):  # the producer may not listen yet
        try:
            return ctx.connect(path)
        except ipcref.PeerGone:
            time.sleep(0.01)
    raise SystemExit("consumer: nobody listens at %s" % path)


def main(path, keep):
    held, got, bad, last = [], 0, 0, -1
    with ipcref.Context() as ctx, connect(ctx, path) as peer:
        sel = selectors.DefaultSelector()
        sel.register(peer.fileno(), selectors.EVENT_READ)
        while sel.select(10.0):
            try:
                frame, meta = peer.recv(timeout=0)
            except ipcref.Timeout:
                continue  # a wake-up with nothing for us
            except ipcref.PeerGone:
                break  # the producer is done
            n = meta["frame"]
            bad += int(not (frame == n).all() or n <= last or frame.flags.writeable)
            last = n
            got += 1
            held.append(frame)
            if len(held) > keep:
                held.pop(0)  # the oldest goes back
    print("consumer (keeps %d): %d frames (the last %d), %d wrong" % (keep, got, last, bad))
    return 0 if got > 0 and bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4))
