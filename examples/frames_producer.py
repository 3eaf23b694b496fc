"""frames_producer.py: the Python twin of frames_producer.c. It serves
frames to every consumer that connects to its socket path, from one
selectors loop, and never waits for any of them.

Each frame is a new float32 image in shared memory, filled (the only copy)
and handed to each consumer with its number as metadata, then dropped: the
consumers keep it alive while they hold it. A consumer that is behind (its
socket full, or holding its cap of frames) is skipped for that frame.

    PYTHONPATH=build/python /usr/bin/python3 examples/frames_producer.py @frames 200
    (then examples/frames_consumer.py @frames)
"""
import selectors
import sys
import time

import ipcref

HELD = 8          # frames a consumer may hold
SIDE = 64


def main(path, frames):
    sel = selectors.DefaultSelector()
    peers = []
    sent = skipped = 0
    with ipcref.Context() as ctx, ctx.listen(path, blocking=False) as lst:
        sel.register(lst.fileno(), selectors.EVENT_READ, "listener")
        print("producer: listening at %s, %d frames" % (path, frames), flush=True)
        n, next_frame = 0, time.monotonic()
        while n < frames:
            timeout = max(0.0, next_frame - time.monotonic()) if peers else None
            for key, _ in sel.select(timeout):
                if key.data == "listener":
                    peer = lst.accept(timeout=0)
                    peer.set_options(max_bytes_held=HELD * SIDE * SIDE * 4)
                    peers.append(peer)
                    sel.register(peer.fileno(), selectors.EVENT_READ, peer)
                else:  # its hello, a hang-up, or room again
                    try:
                        key.data.recv(timeout=0)
                    except (ipcref.Timeout, ipcref.WouldBlock):
                        pass
                    except ipcref.PeerGone:
                        sel.unregister(key.fileobj)
                        peers.remove(key.data)
                        key.data.close()
            if time.monotonic() < next_frame or not peers:
                continue
            frame = ctx.empty((SIDE, SIDE), "float32")
            frame.fill(n)
            for peer in list(peers):
                try:
                    peer.send(frame, meta={"frame": n})
                    sent += 1
                except ipcref.WouldBlock:
                    skipped += 1
                except ipcref.PeerGone:
                    sel.unregister(peer.fileno())
                    peers.remove(peer)
                    peer.close()
            del frame  # the consumers keep what they hold
            n += 1
            next_frame += 0.002
        print("producer: %d frames, %d hand-offs, %d skipped" % (n, sent, skipped))
        for peer in peers:
            peer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 200))
