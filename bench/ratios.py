"""Ratio table ipcref / peer from result lines: python3 bench/ratios.py results.txt [more.txt ...]

Reads `peer=<name> workload=<id> size=<bytes> metric=<m> value=<v> ...` lines (as printed by
bench/run.sh and bench/peers/run_peers.sh) and prints, as markdown, one row per (workload, size,
metric, peer) where both the peer and its like-for-like ipcref row have a value. ns_per_op,
us_per_handoff, us_median, us_p90 and the CPU per hand-off (prod_cpu_us, cons_cpu_us): lower is
better; GBps and records_per_s: higher is better. A key seen more than once (several files, or
W4_ROUNDS rounds in one) takes the median. (reclaim: size is the number of blocks held.)

Like with like (W3): a fresh output each call (peer=ipcref: ipcref_view_contiguous) is compared
with numpy, torch and c_memcpy_fresh; a pre-faulted, reused destination (peer=ipcref_prealloc:
ipcref_view_copy) with numpy_prealloc, torch_prealloc and c_memcpy (the limit). W4: c_memfd_scm
(an fd crosses and is mapped on every hand-off) is compared with peer=ipcref and with
peer=ipcref_first (the first hand-off of a new segment: its fd crosses). Every other peer is
compared with peer=ipcref (the iceoryx peers too: their chunks live in segments both sides mapped
at start), and those that wait as a channel row does with it too: c_msg64 and c_msg64_2sock with
ipcref_chan_sockack and ipcref_chan_nospin, c_shm_spin and iceoryx with ipcref_chan_spin,
iceoryx_waitset with ipcref_chan_nospin. Rows are only ever compared within one workload id (w4,
w4_1cpu and w4_2cpu are separate setups). c_msg64_2sock is c_msg64 with the ack on a second
socketpair, as ipcref's rows ack: c_msg64's one socket wakes each process when the other reads
(bench/peers/w4_handoff.c), which no ipcref row can get; the goals name c_msg64, as issued.

W5 (a stream of fresh tensors): the workload id is <setup>_<stream> (w5_1cpu_seq,
w5_2cpu_inflight4, ...), so that only like is compared with like: one setup, one stream, one
size; the mixed stream (4, 24, 64 MiB in turn) has size 0. w5_frames is the two-program frame
stream. Every W5 peer is compared with peer=ipcref (a fresh tensor per item); ipcref_reused (one
tensor made once, re-sent) is the bound its goals measure ipcref against.

W6 (Python to Python: bench/w6_python.py and bench/peers/w6_python.py): w6_fresh (a fresh
float32 tensor per item, one size per row) and w6_resend (one 4096-byte tensor re-sent) compare
every peer with peer=ipcref_py (the package's API), and torch_mp_fd and torch_mp_fs also with
peer=ipcref_dropin (ipcref.torch's drop-in on the same torch Queue code: a torch.empty tensor,
copied once into a block) and peer=ipcref_dropin_empty (the tensor allocated in ipcref memory:
no copy); w6_dataloader (a DataLoader epoch, us per batch: samples collated in the worker) and
w6_dataloader_batch (the dataset makes each batch whole: a plain tensor, copied once into shared
memory either way) compare torch_dataloader with peer=ipcref_dropin.

W4's channel rows (bench/w4_handoff.c: ipcref_chan_spin, ipcref_chan_sockack, ipcref_chan_nospin,
ipcref_chan_auto; peer=ipcref and ipcref_first are the socket path) have goals of their own
(issue 18), each in one run: with spinning on (ipcref_chan_spin: a fixed 50 us spin, the ack
through shared memory), a hand-off within 2x of c_shm_spin (w4 and w4_2cpu; and within 2x of its
own pair, the same bare spin interleaved with it in one run: pair_ratio) and at most half of
iceoryx's busy-polling round trip (same setups); with spinning off (ipcref_chan_nospin, the ack on
a socket), no slower than c_msg64 (also than its own pair, c_msg64's hand-off interleaved with it
in one run: pair_ratio) and than iceoryx_waitset (every setup); on one CPU (w4_1cpu),
ipcref_chan_auto (the defaults: ipcref_peer_new, spin IPCREF_SPIN_AUTO) and ipcref_chan_nospin no
slower than ipcref (ipcref_chan_spin and ipcref_chan_sockack force a spin, which one CPU pays for:
their w4_1cpu figures are in the table, with no goal); the producer's CPU per hand-off
(prod_cpu_us, W4_SMALL) on the channel no higher than on the socket path (ipcref_chan_sockack,
ipcref_chan_nospin and ipcref_chan_auto, which ack on a socket as ipcref does, against ipcref; and
ipcref_tput_chan against ipcref_tput_sock); and the throughput (w4_tput, records_per_s) of the
channel no lower than the socket path's. Every iceoryx goal says "no iceoryx row" when the run has
none. Sizes: each one the channel row measured in that setup.

Then a W4 table (us per hand-off, one column per peer), the CPU per hand-off of ipcref's W4 rows
(producer / consumer), the channel protocol's floor (bench/lines.c's ipcref_lines, each row's
pair_ratio to the bare spin interleaved with it beside ipcref_chan_spin's, and ipcref_lines_compact,
a more compact protocol's; no goal), the w4_tput throughput rows, W5 tables (us per tensor, and the
consumer's peak memory, one column per peer), W6 tables (us per item, median and p99; us per
batch; the drop-in's ratios to torch, which have no goal), and the goals below, PASS or MISS, with the margin. The W5 goals, in each setup and stream: ipcref / ipcref_reused <= 1.15 at every size
(us_median); ipcref's us_p99 <= 3x its us_median (in the mixed stream the items' sizes differ,
so it is read per size: p99_per_size, the largest p99 / median of the three sizes); seq at 24 MiB: ipcref at least 10x faster
than torch_mp_fd and torch_mp_fs; w5_frames: ipcref's frames_per_s within 1.2x of
ipcref_reused's. The W6 goals (us_median): w6_fresh at 24 MiB and w6_resend at 4096 bytes,
ipcref_py at least 10x faster than torch_mp_fd and torch_mp_fs; w6_resend at 4096 bytes,
ipcref_py within 3x of the C library's hand-off in the same run (peer=ipcref workload=w4
size=4096 us_per_handoff: W4 unpinned); w6_dataloader, ipcref_dropin's us_per_batch no more than
torch_dataloader's. maps (bench/maps.c): a hand-off with 1000 segments mapped within 1.2x of one
with 1. A goal whose peer (or ipcref row) is missing prints n/a. Always exits 0:
benchmarks report, they do not fail. Stdlib only."""
import statistics
import sys

LOWER_IS_BETTER = {"ns_per_op": "time", "us_per_handoff": "time", "us_median": "time",
                   "us_p90": "time", "us_per_batch": "time", "prod_cpu_us": "cpu",
                   "cons_cpu_us": "cpu"}
HIGHER_IS_BETTER = {"GBps": "throughput", "records_per_s": "throughput"}
# Extra fields of a result line kept as figures of their own, under (workload, size, field,
# peer): W4's CPU per hand-off (and per record in w4_tput) and the messages by each path.
EXTRA_FIELDS = ("prod_cpu_us", "cons_cpu_us", "sent_channel", "sent_socket", "bare_us")

# The ipcref rows a peer is compared with; peers not listed are compared with "ipcref".
OURS_FOR = {
    "numpy_prealloc": ("ipcref_prealloc",),
    "torch_prealloc": ("ipcref_prealloc",),
    "c_memcpy": ("ipcref_prealloc",),
    "c_memfd_scm": ("ipcref", "ipcref_first"),
    # W4's channel rows beside the peers that wait as they do (see W4_CHAN_GOALS)
    "c_msg64": ("ipcref", "ipcref_chan_sockack", "ipcref_chan_nospin"),
    "c_msg64_2sock": ("ipcref", "ipcref_chan_sockack", "ipcref_chan_nospin"),
    "c_shm_spin": ("ipcref", "ipcref_chan_spin"),
    "iceoryx": ("ipcref", "ipcref_chan_spin"),
    "iceoryx_waitset": ("ipcref", "ipcref_chan_nospin"),
}
# W6: the ipcref rows its peers are compared with, by workload (else W6_OURS).
W6_OURS = ("ipcref_py",)
W6_OURS_FOR = {"w6_dataloader": ("ipcref_dropin",), "w6_dataloader_batch": ("ipcref_dropin",)}
# W6 queue rows of ipcref.torch's drop-in: compared with the torch peers only (same torch code).
W6_DROPIN = ("ipcref_dropin", "ipcref_dropin_empty")
# Peers that are not a library to compare with (the interpreter's own cost).
NOT_COMPARED = {"python_timeit_empty"}

W2 = 67108864
W3_T, W3_S = 67108864, 33554432
# Goals (workload, size, metric, ours, peer, bound). With a peer: ours / peer must be <= bound
# for a time metric, >= bound for a throughput metric. With peer None the bound is absolute: the
# value itself must be <= bound (time) or >= bound (throughput). Goals whose workload is not in
# the input are not printed.
GOALS = [
    ("w1a", 0, "ns_per_op", "ipcref", "c_atomic", 1.1),
    ("w1a", 0, "ns_per_op", "ipcref", "rust_arc", 1.1),
    ("w1b", 0, "ns_per_op", "ipcref", "rust_arc", 1.0),
    ("w2_slice", W2, "ns_per_op", "ipcref", None, 15.0),
    ("w2_transpose", W2, "ns_per_op", "ipcref", None, 15.0),
    ("w3_transpose", W3_T, "GBps", "ipcref", "numpy", 3.0),
    ("w3_transpose", W3_T, "GBps", "ipcref_prealloc", "torch_prealloc", 1.5),
    ("w3_transpose", W3_T, "GBps", "ipcref_prealloc", "c_memcpy", 0.5),
    ("w3_stride2", W3_S, "GBps", "ipcref_prealloc", "numpy_prealloc", 1.0),
]

# W4: the same goals in each scheduler setup, never across setups.
W4_IDS = ("w4", "w4_1cpu", "w4_2cpu")
W4_SMALL, W4_LARGE = 4096, 67108864
W4_FLAT = 1.2  # flatness: max / min of ipcref's time at W4_SMALL and W4_LARGE
# (ours, peer, bound, size or None for every size ipcref measured, how to read the bound)
W4_GOALS = [
    ("ipcref", "c_msg64", 1.3, None, ""),
    ("ipcref_first", "c_memfd_scm", 1.3, None, ""),
    ("ipcref", "torch_mp_fd", 1 / 20, W4_LARGE, " (>= 20x faster)"),
    ("ipcref", "torch_mp_fs", 1 / 10, W4_LARGE, " (>= 10x faster)"),
    ("ipcref", "c_pipe_copy", 1.0, W4_SMALL, " (no slower)"),
]
# Columns of the W4 table, in this order; other peers follow.
W4_COLUMNS = ["ipcref", "ipcref_first", "ipcref_chan_spin", "ipcref_chan_sockack",
              "ipcref_chan_nospin", "ipcref_chan_auto", "c_msg64", "c_msg64_2sock",
              "c_memfd_scm", "c_shm_spin", "ipcref_lines", "ipcref_lines_compact",
              "c_pipe_copy", "c_socket_copy", "iceoryx", "iceoryx_waitset", "py_pipe_msg64",
              "py_shm_pipe", "torch_mp_fd", "torch_mp_fs"]
# W5: the same goals in each setup and stream, never across them.
W5_SETUPS = ("w5_1cpu", "w5_2cpu")
W5_STREAMS = ("seq", "inflight4", "mixed")
W5_FRAMES = "w5_frames"
W5_IDS = tuple(f"{s}_{t}" for s in W5_SETUPS for t in W5_STREAMS) + (W5_FRAMES,)
W5_FRESH = 1.15  # ipcref (a fresh tensor per item) / ipcref_reused, us_median, every row
W5_TORCH_SIZE = 25165824  # seq, each setup: ipcref at least 10x faster than torch there
W5_TORCH_PEERS = ("torch_mp_fd", "torch_mp_fs")
W5_P99 = 3.0  # ipcref's us_p99 / its own us_median, every row
W5_FRAMES_BOUND = 1.2  # w5_frames: ipcref_reused's frames_per_s / ipcref's
# Columns of the W5 table, in this order; other peers follow.
W5_COLUMNS = ["ipcref", "ipcref_reused", "c_memfd_fresh", "py_shm", "torch_mp_fd", "torch_mp_fs"]
# W6 (Python to Python): ipcref_py (the package's API) at least 10x faster than torch at
# W6_TORCH_SIZE (w6_fresh) and W6_SMALL (w6_resend); w6_resend within W6_C_BOUND of the C
# library's W4 hand-off (W6_C_REF, the unpinned setup) at the same size; the DataLoader drop-in
# no slower than torch's own (w6_dataloader). The drop-in's other ratios to torch (W6_DROPIN at
# W6_TORCH_SIZE and W6_SMALL, ipcref_dropin in w6_dataloader_batch) are printed, with no goal.
W6_FRESH, W6_RESEND, W6_DATALOADER = "w6_fresh", "w6_resend", "w6_dataloader"
W6_DATALOADER_BATCH = "w6_dataloader_batch"
W6_DATALOADERS = (W6_DATALOADER, W6_DATALOADER_BATCH)
W6_IDS = (W6_FRESH, W6_RESEND, W6_DATALOADER, W6_DATALOADER_BATCH)
W6_TORCH_SIZE, W6_SMALL = 25165824, 4096
W6_TORCH_PEERS = ("torch_mp_fd", "torch_mp_fs")
W6_C_REF = ("w4", W6_SMALL, "us_per_handoff", "ipcref")
W6_C_BOUND = 3.0
W6_DL_BOUND = 1.0  # ipcref_dropin / torch_dataloader, us_per_batch
# Columns of the W6 tables, in this order; other peers follow.
W6_COLUMNS = ["ipcref_py", "ipcref_dropin", "ipcref_dropin_empty", "torch_mp_fd", "torch_mp_fs", "mp_shared_memory",
              "numpy_pipe", "torch_dataloader"]
# W4's channel (issue 18): (setups, ours, peer, bound, note), ours / peer <= bound in us per
# hand-off, at every size ours measured in the setup.
W4_SPIN_IDS = ("w4", "w4_2cpu")
W4_CHAN_GOALS = [
    (W4_SPIN_IDS, "ipcref_chan_spin", "c_shm_spin", 2.0, " (spinning on)"),
    (W4_IDS, "ipcref_chan_nospin", "c_msg64", 1.0, " (spinning off: no slower)"),
    (W4_SPIN_IDS, "ipcref_chan_spin", "iceoryx", 0.5, " (busy-poll round trip: at most half)"),
    (W4_IDS, "ipcref_chan_nospin", "iceoryx_waitset", 1.0, " (WaitSet round trip: no slower)"),
    (("w4_1cpu",), "ipcref_chan_auto", "ipcref", 1.0, " (one CPU: the defaults no slower)"),
    (("w4_1cpu",), "ipcref_chan_nospin", "ipcref", 1.0, " (one CPU: no slower)"),
]
W4_ICEORYX = ("iceoryx", "iceoryx_waitset")
# The paired rows (bench/w4_handoff.c): blocks of their hand-offs interleaved with blocks of a
# peer's in one process, metric pair_ratio = the row's median / the peer's (bare_us):
# ipcref_chan_spin with c_shm_spin's, ipcref_chan_nospin with c_msg64's. Their goals again,
# immune to a machine whose cross-CPU speed and wake-up latency change between runs; the median
# of the rounds' ratios. (row, bound, setups, the pair, what the goal is)
W4_PAIRS = (
    ("ipcref_chan_spin", 2.0, W4_SPIN_IDS, "its bare spin",
     "spinning on: c_shm_spin's hand-off interleaved in the same run"),
    ("ipcref_chan_nospin", 1.0, W4_IDS, "its bare c_msg64",
     "spinning off, no slower: c_msg64's hand-off interleaved in the same run"),
)
# bench/lines.c: the chan_spin hand-off's shared-memory traffic without the library's code, the
# floor of the channel's protocol; printed beside c_shm_spin and ipcref_chan_spin, with no goal.
W4_LINES = "ipcref_lines"
W4_LINES_COMPACT = "ipcref_lines_compact"  # the same for a more compact protocol (bench/lines.c)
# The producer's CPU per hand-off, channel vs socket path (same ack), at W4_SMALL in each setup;
# and per record in the throughput rows.
W4_CPU_CHAN = ("ipcref_chan_sockack", "ipcref_chan_nospin", "ipcref_chan_auto")
W4_CPU_COLUMNS = ["ipcref", "ipcref_first", "ipcref_chan_spin", "ipcref_chan_sockack",
                  "ipcref_chan_nospin", "ipcref_chan_auto"]
W4_TPUT, W4_TPUT_SIZE = "w4_tput", 4096
W4_TPUT_CHAN, W4_TPUT_SOCK = "ipcref_tput_chan", "ipcref_tput_sock"
W4_TPUT_BOUND = 1.0  # channel / socket records_per_s, at least
UNITS = {"ns_per_op": "ns", "us_per_handoff": "us", "GBps": "GB/s"}
# reclaim.c: everything a SIGKILLed consumer held, up to RECLAIM_BLOCKS blocks, is back within
# RECLAIM_US of its death (median over the rounds), the producer waiting in poll().
RECLAIM_BLOCKS, RECLAIM_US = 10000, 1000.0


def parse(paths):
    vals, notes = {}, []
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("peer="):
                    continue
                kv = dict(x.split("=", 1) for x in line.split() if "=" in x)
                if "value" not in kv or "metric" not in kv:
                    notes.append(line)
                    continue
                try:
                    key = (kv["workload"], int(kv.get("size", 0)), kv["metric"], kv["peer"])
                    vals.setdefault(key, []).append(float(kv["value"]))
                    for field in EXTRA_FIELDS:
                        if field in kv:
                            vals.setdefault(key[:2] + (field, key[3]), []).append(
                                float(kv[field]))
                except (KeyError, ValueError):
                    notes.append(line)
    return {k: statistics.median(v) for k, v in vals.items()}, notes


def ours_for(peer, wl=""):
    if wl.startswith("w6_"):
        if wl in (W6_FRESH, W6_RESEND) and peer in W6_TORCH_PEERS:
            return W6_OURS + W6_DROPIN
        return W6_OURS_FOR.get(wl, W6_OURS)
    return OURS_FOR.get(peer, ("ipcref",))


def compare(metric, ours, theirs):
    """(ratio, text, ipcref_better) or None when the metric is unknown or a value is 0."""
    if theirs == 0 or ours == 0:
        return None
    ratio = ours / theirs
    if metric in LOWER_IS_BETTER:
        return ratio, f"{ratio:.2f}x the peer's time", ratio < 1
    if metric in HIGHER_IS_BETTER:
        return ratio, f"{ratio:.2f}x the peer's throughput", ratio > 1
    return None


def margin(measured, bound, lower_is_better):
    """How far a measured figure is from its bound, in % of the bound: + is on the good side."""
    pct = (bound - measured) / bound * 100 if lower_is_better else (measured - bound) / bound * 100
    return f"{pct:+.1f}%"


def ratio_table(vals):
    print("### ipcref / peer (like with like)\n")
    print("| workload | size (B) | metric | ipcref row | peer | ipcref | peer value | ratio "
          "| ipcref better? |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = 0
    for (wl, size, metric, peer), theirs in sorted(vals.items()):
        if peer.startswith("ipcref") or peer in NOT_COMPARED:
            continue
        for mine in ours_for(peer, wl):
            ours = vals.get((wl, size, metric, mine))
            c = None if ours is None else compare(metric, ours, theirs)
            if c is None:
                continue
            print(f"| {wl} | {size} | {metric} | {mine} | {peer} | {ours:g} | {theirs:g} | "
                  f"{c[1]} | {'yes' if c[2] else 'no'} |")
            rows += 1
    if not rows:
        print("| (no workload has both ipcref and a peer) | | | | | | | | |")


def w2_note(vals):
    """The W2 peers' figures include the interpreter's per-statement cost: show their share
    without it, so that the native ipcref figure can be read against both."""
    empty = vals.get(("w2_empty", W2, "ns_per_op", "python_timeit_empty"))
    lines = []
    for (wl, size, metric, peer), theirs in sorted(vals.items()):
        if not wl.startswith("w2_") or wl == "w2_empty" or peer.startswith("ipcref"):
            continue
        ours = vals.get((wl, size, metric, "ipcref"))
        if ours is None or empty is None:
            continue
        lib = theirs - empty
        rel = f"{ours / lib:.2f}x" if lib > 0 else "n/a"
        lines.append(f"| {wl} | {peer} | {theirs:g} | {empty:g} | {lib:.1f} | {ours:g} | {rel} |")
    if lines:
        print("\n### W2 without the interpreter (peer value - python_timeit_empty w2_empty)\n")
        print("ipcref's W2 loop is native C; the peers' timeit figures include Python's "
              "per-statement cost.\n")
        print("| workload | peer | peer value (ns) | timeit empty (ns) | peer library share (ns) "
              "| ipcref (ns) | ipcref / share |")
        print("|---|---|---|---|---|---|---|")
        for line in lines:
            print(line)


def w4_table(vals):
    """us per hand-off of every W4 peer, one row per (setup, size)."""
    rows = sorted({(wl, size) for (wl, size, metric, _) in vals
                   if wl.startswith("w4") and metric == "us_per_handoff"},
                  key=lambda r: (W4_IDS.index(r[0]) if r[0] in W4_IDS else 99, r[0], r[1]))
    if not rows:
        return
    seen = {peer for (wl, _, metric, peer) in vals
            if wl.startswith("w4") and metric == "us_per_handoff"}
    cols = [c for c in W4_COLUMNS if c in seen] + sorted(seen - set(W4_COLUMNS))
    print("\n### W4 hand-off: us per hand-off (median), per setup\n")
    print("| setup | size (B) | " + " | ".join(cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for wl, size in rows:
        cells = []
        for c in cols:
            v = vals.get((wl, size, "us_per_handoff", c))
            cells.append("" if v is None else f"{v:g}")
        print(f"| {wl} | {size} | " + " | ".join(cells) + " |")


def w4_cpu_table(vals):
    """The producer's and the consumer's CPU per hand-off of ipcref's W4 rows, per setup and
    size; then the throughput rows."""
    keys = {(wl, size) for (wl, size, m, peer) in vals
            if wl in W4_IDS and m == "prod_cpu_us" and peer.startswith("ipcref")}
    if keys:
        seen = {peer for (wl, _, m, peer) in vals
                if wl in W4_IDS and m == "prod_cpu_us" and peer.startswith("ipcref")}
        cols = [c for c in W4_CPU_COLUMNS if c in seen] + sorted(seen - set(W4_CPU_COLUMNS))
        print("\n### W4 CPU per hand-off: us of user + system time, producer / consumer\n")
        print("getrusage(RUSAGE_SELF) around each process's timed loop, over the hand-offs; "
              "a spinning side's CPU is its wall time.\n")
        print("| setup | size (B) | " + " | ".join(cols) + " |")
        print("|---|---|" + "---|" * len(cols))
        for wl, size in sorted(keys, key=lambda r: (W4_IDS.index(r[0]), r[1])):
            cells = []
            for c in cols:
                a = vals.get((wl, size, "prod_cpu_us", c))
                b = vals.get((wl, size, "cons_cpu_us", c))
                cells.append("" if a is None else f"{a:g} / {'' if b is None else f'{b:g}'}")
            print(f"| {wl} | {size} | " + " | ".join(cells) + " |")
    rows = sorted((size, peer) for (wl, size, m, peer) in vals
                  if wl == W4_TPUT and m == "records_per_s")
    if rows:
        print(f"\n### {W4_TPUT}: one view handed off again and again, no ack (records per s)\n")
        print("| size (B) | row | records/s | us/record | producer CPU us/record "
              "| consumer CPU us/record | sent on the channel | on the socket |")
        print("|---|---|---|---|---|---|---|---|")
        for size, peer in rows:
            def f(m, fmt="{:g}"):
                v = vals.get((W4_TPUT, size, m, peer))
                return "" if v is None else fmt.format(v)
            rate = vals[(W4_TPUT, size, "records_per_s", peer)]
            print(f"| {size} | {peer} | {rate:.0f} | {1e6 / rate:.3g} | {f('prod_cpu_us')} | "
                  f"{f('cons_cpu_us')} | {f('sent_channel', '{:.0f}')} | "
                  f"{f('sent_socket', '{:.0f}')} |")


def w5_order(row):
    """Sort key of a W5 (workload, size) row: setups, then streams, in W5_IDS order."""
    wl, size = row
    return (W5_IDS.index(wl) if wl in W5_IDS else len(W5_IDS), wl, size)


def w5_cells(vals, metric, fmt="{:g}", scale=1.0):
    """The rows of a W5 table of `metric`: (workload, size, columns, cells)."""
    keys = {(wl, size) for (wl, size, m, _) in vals if wl.startswith("w5") and m == metric}
    seen = {peer for (wl, _, m, peer) in vals if wl.startswith("w5") and m == metric}
    cols = [c for c in W5_COLUMNS if c in seen] + sorted(seen - set(W5_COLUMNS))
    rows = []
    for wl, size in sorted(keys, key=w5_order):
        cells = [vals.get((wl, size, metric, c)) for c in cols]
        rows.append((wl, size, cols, ["" if v is None else fmt.format(v * scale) for v in cells]))
    return rows


def w5_table(vals):
    """us per tensor (the median) of every W5 peer, one row per (workload, size); then the
    consumer's peak memory."""
    rows = w5_cells(vals, "us_median")
    if not rows:
        return
    cols = rows[0][2]
    print("\n### W5 stream of fresh tensors: us per tensor (median), per setup and stream\n")
    print("size 0: the mixed stream (4, 24, 64 MiB in turn); w5_frames: one 3x1080x1920 "
          "float32 frame and its 4096-byte header per item, between two programs.\n")
    print("| workload | size (B) | " + " | ".join(cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for wl, size, _, cells in rows:
        print(f"| {wl} | {size} | " + " | ".join(cells) + " |")
    rows = w5_cells(vals, "consumer_peak_kb", "{:.1f}", 1 / 1024)
    if not rows:
        return
    cols = rows[0][2]
    print("\n### W5 consumer: peak resident MiB (VmRSS; a forked Python consumer starts with its "
          "producer's interpreter)\n")
    print("| workload | size (B) | held (MiB) | " + " | ".join(cols) + " |")
    print("|---|---|---|" + "---|" * len(cols))
    for wl, size, _, cells in rows:
        held = [v for (w, z, m, _), v in vals.items() if (w, z, m) == (wl, size, "held_kb")]
        held_mib = f"{max(held) / 1024:.1f}" if held else ""
        print(f"| {wl} | {size} | {held_mib} | " + " | ".join(cells) + " |")


def ratio_goal(vals, wl, size, metric, ours_name, peer, bound, note="", show=False):
    """One goal ours / peer <= bound (a time metric) as a goal row (`show`: both
    figures beside the ratio)."""
    label = size if size else "0 (mixed)"
    name = f"{wl} {metric} @ {label}: {ours_name} <= {bound:.3g}x {peer}{note}"
    ours = vals.get((wl, size, metric, ours_name))
    theirs = vals.get((wl, size, metric, peer))
    c = None if ours is None or theirs is None else compare(metric, ours, theirs)
    if c is None:
        missing = [n for n, v in ((ours_name, ours), (peer, theirs)) if v is None]
        return (name, f"not measured: {', '.join(missing) or 'a zero'}")
    figures = f" ({ours:g} vs {theirs:g} us)" if show else ""
    return (name, f"{c[0]:.3g}x{figures}", c[0] <= bound, margin(c[0], bound, True))


def w5_p99_goal(vals, wl, size):
    label = size if size else "0 (mixed)"
    name = f"{wl} @ {label}: ipcref us_p99 <= {W5_P99:g}x its us_median"
    per_size = vals.get((wl, size, "p99_per_size", "ipcref"))
    if not size and per_size is not None:  # mixed: each size's spread
        name = f"{wl} @ {label}: ipcref us_p99 <= {W5_P99:g}x us_median, per item size"
        text = f"{per_size:.3g}x (the largest of the three sizes)"
        reused = vals.get((wl, size, "p99_per_size", "ipcref_reused"))
        if reused is not None:
            text += f"; ipcref_reused {reused:.3g}x"
        return (name, text, per_size <= W5_P99, margin(per_size, W5_P99, True))
    med = vals.get((wl, size, "us_median", "ipcref"))
    p99 = vals.get((wl, size, "us_p99", "ipcref"))
    if not med or p99 is None:
        return (name, "not measured: ipcref us_median and us_p99")
    r = p99 / med
    text = f"{r:.3g}x ({p99:g} / {med:g} us)"
    bound_med = vals.get((wl, size, "us_median", "ipcref_reused"))
    bound_p99 = vals.get((wl, size, "us_p99", "ipcref_reused"))
    if not size and bound_med and bound_p99 is not None:  # mixed: the items' sizes differ
        text += f"; ipcref_reused {bound_p99 / bound_med:.3g}x"
    return (name, text, r <= W5_P99, margin(r, W5_P99, True))


def w5_frames_goal(vals):
    name = (f"{W5_FRAMES} frames_per_s: ipcref within {W5_FRAMES_BOUND:g}x of ipcref_reused "
            f"(ipcref_reused / ipcref <= {W5_FRAMES_BOUND:g})")
    sizes = sorted({k[1] for k in vals if k[0] == W5_FRAMES and k[2] == "frames_per_s"})
    ours = [vals.get((W5_FRAMES, z, "frames_per_s", "ipcref")) for z in sizes]
    best = [vals.get((W5_FRAMES, z, "frames_per_s", "ipcref_reused")) for z in sizes]
    if not sizes or not ours[0] or not best[0]:
        return (name, "not measured: ipcref and ipcref_reused frames_per_s")
    r = best[0] / ours[0]
    return (name, f"{r:.3g}x ({ours[0]:g} vs {best[0]:g} frames/s)", r <= W5_FRAMES_BOUND,
            margin(r, W5_FRAMES_BOUND, True))


def w5_goal_rows(vals):
    """The W5 goals of every setup and stream present, as W4's rows."""
    out = []
    workloads = {k[0] for k in vals}
    metric = "us_median"
    for wl in W5_IDS:
        if wl not in workloads:
            continue
        sizes = sorted({k[1] for k in vals if k[0] == wl and k[2] == metric})
        if wl != W5_FRAMES:
            for sz in sizes:
                out.append(ratio_goal(vals, wl, sz, metric, "ipcref", "ipcref_reused",
                                         W5_FRESH))
        if wl.endswith("_seq"):
            for peer in W5_TORCH_PEERS:
                out.append(ratio_goal(vals, wl, W5_TORCH_SIZE, metric, "ipcref", peer,
                                         1 / 10, " (>= 10x faster)"))
        if wl == W5_FRAMES:
            out.append(w5_frames_goal(vals))
        for sz in sizes:
            out.append(w5_p99_goal(vals, wl, sz))
    return out


def w6_table(vals):
    """us per item of every W6 row (median / p99), one row per (workload, size); then the
    DataLoader rows (us per batch)."""
    def cols_of(wls, metric):
        seen = {peer for (wl, _, m, peer) in vals if wl in wls and m == metric}
        return [c for c in W6_COLUMNS if c in seen] + sorted(seen - set(W6_COLUMNS))

    def us(v):
        return "" if v is None else f"{v:g}"

    streams = (W6_FRESH, W6_RESEND)
    keys = sorted({(wl, size) for (wl, size, m, _) in vals if wl in streams and m == "us_median"},
                  key=lambda r: (W6_IDS.index(r[0]), r[1]))
    if keys:
        cols = cols_of(streams, "us_median")
        print("\n### W6 Python to Python: us per item, median / p99\n")
        print("w6_fresh: a new float32 tensor per item, filled whole, read one byte per page; "
              "w6_resend: one 4096-byte tensor made once, re-sent.\n")
        print("| workload | size (B) | " + " | ".join(cols) + " |")
        print("|---|---|" + "---|" * len(cols))
        for wl, size in keys:
            cells = []
            for c in cols:
                med = vals.get((wl, size, "us_median", c))
                p99 = vals.get((wl, size, "us_p99", c))
                cells.append("" if med is None else f"{med:g} / {us(p99)}")
            print(f"| {wl} | {size} | " + " | ".join(cells) + " |")
    keys = sorted({(wl, size) for (wl, size, m, _) in vals
                   if wl in W6_DATALOADERS and m == "us_per_batch"},
                  key=lambda r: (W6_IDS.index(r[0]), r[1]))
    if keys:
        cols = cols_of(W6_DATALOADERS, "us_per_batch")
        print("\n### W6 DataLoader epoch: us per batch (epoch time / batches; between batches: "
              "median / p99)\n")
        print("w6_dataloader: samples collated in the worker; w6_dataloader_batch: the dataset "
              "makes each batch whole (batch_size=None).\n")
        print("| workload | batch (B) | figure | " + " | ".join(cols) + " |")
        print("|---|---|---|" + "---|" * len(cols))
        for wl, size in keys:
            print(f"| {wl} | {size} | per batch | " + " | ".join(
                us(vals.get((wl, size, "us_per_batch", c))) for c in cols) + " |")
            cells = []
            for c in cols:
                med = vals.get((wl, size, "us_median", c))
                p99 = vals.get((wl, size, "us_p99", c))
                cells.append("" if med is None else f"{med:g} / {us(p99)}")
            print(f"| {wl} | {size} | between batches | " + " | ".join(cells) + " |")
    w6_dropin_table(vals)


def w6_dropin_table(vals):
    """The drop-in's ratios to torch that have no goal: W6_DROPIN vs the torch peers at
    W6_TORCH_SIZE (w6_fresh) and W6_SMALL (w6_resend), us_median; ipcref_dropin vs
    torch_dataloader in w6_dataloader_batch, us_per_batch."""
    pairs = [(wl, size, "us_median", ours, peer)
             for wl, size in ((W6_FRESH, W6_TORCH_SIZE), (W6_RESEND, W6_SMALL))
             for ours in W6_DROPIN for peer in W6_TORCH_PEERS]
    pairs += [(W6_DATALOADER_BATCH, size, "us_per_batch", "ipcref_dropin", "torch_dataloader")
              for size in sorted({k[1] for k in vals if k[0] == W6_DATALOADER_BATCH
                                  and k[2] == "us_per_batch"})]
    rows = []
    for wl, size, metric, ours, peer in pairs:
        a, b = vals.get((wl, size, metric, ours)), vals.get((wl, size, metric, peer))
        if a is not None or b is not None:
            ratio = f"{a / b:.3g}x" if a and b else "n/a"
            rows.append(f"| {wl} | {size} | {metric} | {ours} | {peer} | "
                        f"{'' if a is None else f'{a:g}'} | {'' if b is None else f'{b:g}'} | "
                        f"{ratio} |")
    if rows:
        print("\n### W6 ipcref.torch drop-in vs torch (ratios only: no goal)\n")
        print("drop-in / torch, < 1: the drop-in is faster. ipcref_dropin: torch.empty, "
              "filled, put (copied once into a block); ipcref_dropin_empty: made in ipcref "
              "memory, filled, put (no copy). The w6_dataloader goal is under Goals.\n")
        print("| workload | size (B) | metric | drop-in row | torch row | drop-in (us) "
              "| torch (us) | ratio |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(r)


def w6_goal_rows(vals):
    """The W6 goals, as W4's rows; none when no W6 workload is in the input."""
    workloads = {k[0] for k in vals}
    if not workloads & set(W6_IDS):
        return []
    out = []
    metric = "us_median"
    for wl, size in ((W6_FRESH, W6_TORCH_SIZE), (W6_RESEND, W6_SMALL)):
        for peer in W6_TORCH_PEERS:
            out.append(ratio_goal(vals, wl, size, metric, "ipcref_py", peer, 1 / 10,
                                     " (>= 10x faster)"))
    # the Python hand-off against the C library's own, W4 unpinned, same run
    ref_wl, ref_size, ref_metric, ref_peer = W6_C_REF
    name = (f"{W6_RESEND} {metric} @ {W6_SMALL}: ipcref_py <= {W6_C_BOUND:g}x the C library's "
            f"hand-off (peer={ref_peer} workload={ref_wl} size={ref_size} {ref_metric})")
    ours = vals.get((W6_RESEND, W6_SMALL, metric, "ipcref_py"))
    ref = vals.get(W6_C_REF)
    if ref_wl not in workloads:
        out.append((name, f"W4 unpinned (workload {ref_wl}) did not run in this run"))
    elif ours is None or not ref:
        missing = [n for n, v in (("ipcref_py", ours), (f"{ref_peer} {ref_wl}", ref)) if not v]
        out.append((name, f"not measured: {', '.join(missing)}"))
    else:
        r = ours / ref
        out.append((name, f"{r:.3g}x ({ours:g} vs {ref:g} us)", r <= W6_C_BOUND,
                    margin(r, W6_C_BOUND, True)))
    sizes = sorted({k[1] for k in vals if k[0] == W6_DATALOADER and k[2] == "us_per_batch"})
    for size in sizes or [W6_TORCH_SIZE]:
        out.append(ratio_goal(vals, W6_DATALOADER, size, "us_per_batch", "ipcref_dropin",
                                 "torch_dataloader", W6_DL_BOUND, " (no slower)"))
    return out


def w4_goal_rows(vals):
    """The W4 goals of every setup present, as (name, measured, ok, margin) or (name, why)."""
    out = []
    workloads = {k[0] for k in vals}
    metric = "us_per_handoff"
    for wl in W4_IDS:
        if wl not in workloads:
            continue
        ours_sizes = sorted(k[1] for k in vals if k[0] == wl and k[2] == metric
                            and k[3] == "ipcref")
        for ours_name, peer, bound, size, note in W4_GOALS:
            sizes = [size] if size is not None else (ours_sizes or [W4_SMALL])
            for sz in sizes:
                out.append(ratio_goal(vals, wl, sz, metric, ours_name, peer, bound, note))
        # flatness: ipcref's time at the small and the large size within W4_FLAT of each other
        name = (f"{wl} {metric}: ipcref flat, {W4_LARGE} vs {W4_SMALL} within "
                f"{(W4_FLAT - 1) * 100:.0f}% (max/min <= {W4_FLAT:g})")
        a = vals.get((wl, W4_SMALL, metric, "ipcref"))
        b = vals.get((wl, W4_LARGE, metric, "ipcref"))
        if not a or not b:
            out.append((name, "not measured: ipcref at both sizes"))
            continue
        spread = max(a, b) / min(a, b)
        out.append((name, f"{spread:.3g} ({b:g} / {a:g} us)", spread <= W4_FLAT,
                    margin(spread, W4_FLAT, True)))
    return out


def skipped_reason(notes, peer):
    """Why a peer has no row: the reason of its first skipped or failed line, or ''."""
    for n in notes:
        kv = dict(x.split("=", 1) for x in n.split() if "=" in x)
        if kv.get("peer") == peer and "reason" in kv:
            return f"{kv.get('status', 'skipped')}: {kv['reason']}"
    return ""


def w4_chan_goal_rows(vals, notes=()):
    """The W4 channel goals (issue 18), as w4_goal_rows' rows."""
    out = []
    workloads = {k[0] for k in vals}
    metric = "us_per_handoff"
    peers_seen = {k[3] for k in vals if k[2] == metric}
    for setups, ours_name, peer, bound, note in W4_CHAN_GOALS:
        present = [wl for wl in setups if wl in workloads]
        if not present:
            continue
        if peer in W4_ICEORYX and peer not in peers_seen:
            why = skipped_reason(notes, peer)
            out.append((f"{', '.join(present)} {metric}: {ours_name} <= {bound:.3g}x {peer}{note}",
                        f"no iceoryx row{f' ({why})' if why else ''}"))
            continue
        for wl in present:
            sizes = sorted(k[1] for k in vals if k[0] == wl and k[2] == metric
                           and k[3] == ours_name) or [W4_SMALL]
            for sz in sizes:
                out.append(ratio_goal(vals, wl, sz, metric, ours_name, peer, bound, note,
                                      show=True))
    for ours_name, bound, ids, pair, what in W4_PAIRS:
        for wl in ids:
            sizes = sorted(k[1] for k in vals if k[0] == wl and k[2] == "pair_ratio"
                           and k[3] == ours_name)
            for sz in sizes:
                r = vals[(wl, sz, "pair_ratio", ours_name)]
                bare = vals.get((wl, sz, "bare_us", ours_name))
                name = f"{wl} pair_ratio @ {sz}: {ours_name} <= {bound:g}x {pair} ({what})"
                figures = f" (the {pair[4:]} {bare:g} us)" if bare else ""
                out.append((name, f"{r:.3g}x{figures}", r <= bound, margin(r, bound, True)))
    # the producer's CPU per hand-off: the channel no higher than the socket path
    for wl in W4_IDS:
        if wl not in workloads:
            continue
        for ours_name in W4_CPU_CHAN:
            name = (f"{wl} prod_cpu_us @ {W4_SMALL}: {ours_name} <= 1x ipcref (the producer's "
                    f"CPU per hand-off, channel vs socket)")
            ours = vals.get((wl, W4_SMALL, "prod_cpu_us", ours_name))
            theirs = vals.get((wl, W4_SMALL, "prod_cpu_us", "ipcref"))
            if not ours or not theirs:
                missing = [n for n, v in ((ours_name, ours), ("ipcref", theirs)) if not v]
                out.append((name, f"not measured: {', '.join(missing)}"))
                continue
            r = ours / theirs
            out.append((name, f"{r:.3g}x ({ours:g} vs {theirs:g} us)", r <= 1.0,
                        margin(r, 1.0, True)))
    if W4_TPUT in workloads:
        sz = W4_TPUT_SIZE
        chan = vals.get((W4_TPUT, sz, "prod_cpu_us", W4_TPUT_CHAN))
        sock = vals.get((W4_TPUT, sz, "prod_cpu_us", W4_TPUT_SOCK))
        name = (f"{W4_TPUT} prod_cpu_us @ {sz}: {W4_TPUT_CHAN} <= 1x {W4_TPUT_SOCK} (the "
                f"producer's CPU per record)")
        if not chan or not sock:
            out.append((name, "not measured: both throughput rows"))
        else:
            r = chan / sock
            out.append((name, f"{r:.3g}x ({chan:g} vs {sock:g} us)", r <= 1.0,
                        margin(r, 1.0, True)))
        chan = vals.get((W4_TPUT, sz, "records_per_s", W4_TPUT_CHAN))
        sock = vals.get((W4_TPUT, sz, "records_per_s", W4_TPUT_SOCK))
        name = (f"{W4_TPUT} records_per_s @ {sz}: {W4_TPUT_CHAN} >= {W4_TPUT_BOUND:g}x "
                f"{W4_TPUT_SOCK} (throughput, channel / socket)")
        if not chan or not sock:
            out.append((name, "not measured: both throughput rows"))
        else:
            r = chan / sock
            out.append((name, f"{r:.3g}x ({chan:.0f} vs {sock:.0f} records/s)",
                        r >= W4_TPUT_BOUND, margin(r, W4_TPUT_BOUND, False)))
    return out


def reclaim_goal_row(vals, notes):
    """The reclaim goal as a table row, or None when reclaim.c did not run."""
    name = "reclaim: median <= 1 ms for 10,000 blocks"
    med = vals.get(("reclaim", RECLAIM_BLOCKS, "us_median", "ipcref"))
    if med is None:
        if any("workload=reclaim " in n for n in notes):
            return f"| {name} | n/a | n/a (not measured: reclaim failed) | |"
        return None
    hi = vals.get(("reclaim", RECLAIM_BLOCKS, "us_p90", "ipcref"))
    p90 = "" if hi is None else f", p90 {hi:g} us"
    return (f"| {name} | {med:g} us{p90} | {'PASS' if med <= RECLAIM_US else 'MISS'} | "
            f"{margin(med, RECLAIM_US, True)} |")


def w4_floor_table(vals):
    """The channel protocol's floor (bench/lines.c), each row's time as a ratio to the bare spin
    interleaved with it in the same run (pair_ratio), beside ipcref_chan_spin's own pair_ratio,
    and a more compact protocol's."""
    rows = []

    def pair(name, wl):
        return vals.get((wl, W4_SMALL, "pair_ratio", name))

    def show(x, fmt="{:.2f}x"):
        return fmt.format(x) if x else "n/a"

    for wl in W4_SPIN_IDS:
        lines = vals.get((wl, W4_SMALL, "us_per_handoff", W4_LINES))
        if not lines:
            continue
        lines_r, spin_r = pair(W4_LINES, wl), pair("ipcref_chan_spin", wl)
        compact = vals.get((wl, W4_SMALL, "us_per_handoff", W4_LINES_COMPACT))
        code = spin_r / lines_r if spin_r and lines_r else None
        rows.append(f"| {wl} | {lines:g} | {show(lines_r)} | {show(spin_r)} | {show(code)} | "
                    f"{show(compact, '{:g}')} | {show(pair(W4_LINES_COMPACT, wl))} |")
    if not rows:
        return
    print(f"\n### W4: the channel protocol's floor (us per hand-off @ {W4_SMALL}, no goal)\n")
    print(f"{W4_LINES}: chan_spin's shared-memory traffic without the library's code "
          "(bench/lines.c). Each ratio is to the bare spin (c_shm_spin's hand-off) interleaved "
          f"with the row in the same run (pair_ratio): {W4_LINES}'s is what the protocol's cache "
          "lines cost, ipcref_chan_spin's over it what the code adds. "
          f"{W4_LINES_COMPACT}: the same for a protocol with the sequence word in the record "
          "(no tail to wait on) and returns into the consumer's own ring.\n")
    print(f"| setup | {W4_LINES} us | {W4_LINES} / bare | ipcref_chan_spin / bare | "
          f"ipcref_chan_spin / {W4_LINES} | {W4_LINES_COMPACT} us | "
          f"{W4_LINES_COMPACT} / bare |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(r)


def goal_table(vals, notes=()):
    workloads = {k[0] for k in vals}
    reclaim = reclaim_goal_row(vals, notes)
    goals = [g for g in GOALS if g[0] in workloads]
    w4 = w4_goal_rows(vals) + w4_chan_goal_rows(vals, notes)
    w5 = w5_goal_rows(vals)
    w6 = w6_goal_rows(vals)
    if (not goals and not w4 and not w5 and not w6 and "limbo_release" not in workloads
            and "maps" not in workloads and reclaim is None):
        return
    print("\n### Goals\n")
    print("margin: how far the figure is from its bound, in % of the bound (+ better, - short).\n")
    print("| goal | measured | result | margin |")
    print("|---|---|---|---|")
    for wl, size, metric, ours_name, peer, bound in goals:
        lower = metric in LOWER_IS_BETTER
        op = "<=" if lower else ">="
        ours = vals.get((wl, size, metric, ours_name))
        if peer is None:  # absolute
            unit = UNITS.get(metric, metric)
            name = f"{wl} {metric}: {ours_name} {op} {bound:g} {unit} (absolute)"
            if ours is None:
                print(f"| {name} | n/a | n/a (not measured: {ours_name}) | |")
                continue
            ok = ours <= bound if lower else ours >= bound
            print(f"| {name} | {ours:g} {unit} | {'PASS' if ok else 'MISS'} | "
                  f"{margin(ours, bound, lower)} |")
            continue
        name = f"{wl} {metric}: {ours_name} {op} {bound:.1f}x {peer}"
        theirs = vals.get((wl, size, metric, peer))
        c = None if ours is None or theirs is None else compare(metric, ours, theirs)
        if c is None:
            missing = [n for n, v in ((ours_name, ours), (peer, theirs)) if v is None]
            print(f"| {name} | n/a | n/a (not measured: {', '.join(missing) or 'a zero'}) | |")
            continue
        ok = c[0] <= bound if lower else c[0] >= bound
        print(f"| {name} | {c[0]:.2f}x | {'PASS' if ok else 'MISS'} | "
              f"{margin(c[0], bound, lower)} |")

    # The limbo must not slow the hot path (limbo_release.c).
    few = vals.get(("limbo_release", 10, "ns_per_op", "ipcref"))
    many = vals.get(("limbo_release", 100000, "ns_per_op", "ipcref"))
    if few and many:
        r = many / few
        print(f"| limbo_release: a release with 100000 blocks in the limbo <= 2.0x one with 10 | "
              f"{r:.2f}x | {'PASS' if r <= 2.0 else 'MISS'} | {margin(r, 2.0, True)} |")
    # A hand-off must not slow as the consumer maps more segments (maps.c).
    one = vals.get(("maps", 1, "ns_per_op", "ipcref"))
    thousand = vals.get(("maps", 1000, "ns_per_op", "ipcref"))
    if one and thousand:
        r = thousand / one
        print(f"| maps: a hand-off with 1000 segments mapped <= 1.2x one with 1 | {r:.2f}x | "
              f"{'PASS' if r <= 1.2 else 'MISS'} | {margin(r, 1.2, True)} |")
    if reclaim is not None:
        print(reclaim)
    for row in w4 + w5 + w6:
        if len(row) == 2:
            print(f"| {row[0]} | n/a | n/a ({row[1]}) | |")
        else:
            print(f"| {row[0]} | {row[1]} | {'PASS' if row[2] else 'MISS'} | {row[3]} |")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    vals, notes = parse(sys.argv[1:])
    ratio_table(vals)
    w2_note(vals)
    w4_table(vals)
    w4_cpu_table(vals)
    w4_floor_table(vals)
    w5_table(vals)
    w6_table(vals)
    goal_table(vals, notes)
    if notes:
        print("\nNot measured:\n")
        for n in notes:
            print(f"- `{n}`")


if __name__ == "__main__":
    main()
