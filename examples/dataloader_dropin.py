"""dataloader_dropin.py: a DataLoader whose workers hand their batches to
the main process as ipcref blocks, with one call: ipcref.torch.install().

Each worker collates its batch straight into an ipcref block; the main
process claims it (a lease for this process, given back when the batch is
dropped, or when this process dies). Compared with torch's own sharing
(one fd or one /dev/shm file per batch), nothing else changes: the batches
are ordinary, writable tensors.

    PYTHONPATH=build/python /usr/bin/python3 examples/dataloader_dropin.py
"""
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import ipcref.torch


class Images(Dataset):
    """Fresh 3x512x512 float32 images: a 24 MiB batch of 8."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((3, 512, 512), float(i))


def epoch(label):
    loader = DataLoader(Images(), batch_size=8, num_workers=2)
    t0, n, bad = time.perf_counter(), 0, 0
    for batch in loader:
        first = int(batch[0, 0, 0, 0])
        bad += int(not all(int(x[0, 0, 0]) == first + k for k, x in enumerate(batch)))
        n += 1
    ms = (time.perf_counter() - t0) * 1e3 / n
    print("%-18s %d batches of %.0f MiB, %.1f ms each, %d wrong"
          % (label, n, batch.numel() * 4 / 2**20, ms, bad))
    return bad


def main():
    bad = epoch("torch's sharing:")
    ipcref.torch.install()
    bad += epoch("ipcref blocks:")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
