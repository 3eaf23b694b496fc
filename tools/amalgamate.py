#!/usr/bin/env python3
"""Joins the layers under src/ into the single header ipcref.h, and writes
the device backend headers (ipcref_cuda.h from src/cuda.h).

Each layer file holds its public part, a line `/* @implementation */`, then
its implementation; a file without that line (one room of a layer's
implementation, such as src/share_ledger.h) is implementation only. The output is: the manual (src/manual.txt), the public
parts of every layer in order inside the include guard, the implementation
parts inside `#ifdef IPCREF_IMPLEMENTATION`, and the licence.

    python3 tools/amalgamate.py            write ipcref.h
    python3 tools/amalgamate.py --check    exit 1 if ipcref.h is stale
    python3 tools/amalgamate.py --stdout   print instead of writing

Output is deterministic (no dates, LF line ends), so the check is exact.
"""
import functools
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")
OUT = os.path.join(ROOT, "ipcref.h")
# Backend headers: each is its driver's part (src/cuda.h, src/hip.h: the
# API, then after the marker the driver's types, loader and calls) around
# the logic they share (src/gpu.h, renamed to the backend's prefixes).
BACKENDS = {
    "ipcref_cuda.h": ("cuda.h", {"ipcref_gpu": "ipcref_cuda", "ipcref__gpu": "ipcref__cu",
                                 "IPCREF_GPU": "IPCREF_CUDA", "IPCREF__GPU": "IPCREF__CU"}),
    "ipcref_hip.h": ("hip.h", {"ipcref_gpu": "ipcref_hip", "ipcref__gpu": "ipcref__hip",
                               "IPCREF_GPU": "IPCREF_HIP", "IPCREF__GPU": "IPCREF__HIP"}),
}
# More of a driver's part, after its file's (implementation only).
DRIVER_MORE = {"cuda.h": ["cuda_vmm.h", "cuda_load.h"], "hip.h": ["hip_vmm.h"]}
DRIVER_MARKER = "/* @driver */"
VMM_MARKER = "/* @vmm */"  # where src/gpu_vmm.h goes into src/gpu.h
EVENTS_MARKER = "/* @events */"  # and src/gpu_events.h

# Bottom to top: a layer uses only the ones before it.
LAYERS = ["base", "checked", "buf", "view", "view_ops", "view_copy",
          "share", "share_backend", "share_state", "share_index", "share_watch", "share_segment", "share_ledger", "share_claims",
          "share_ctx", "share_buf", "share_device", "share_wire", "share_socket", "share_peer",
          "share_loop",
          "share_export", "share_map", "share_import", "share_channel", "share_chan_recv", "share_msg", "share_send", "share_recv", "share_path",
          "dlpack", "table", "table_ops"]
MARKER = "/* @implementation */"


def read(name):
    with open(os.path.join(SRC, name), encoding="utf-8") as f:
        return f.read().replace("\r\n", "\n")


def split_layer(name):
    """A layer's API and implementation, split at its marker line; a file
    without one is implementation only."""
    text = read(name + ".h")
    if text.count(MARKER) > 1:
        sys.exit(f"amalgamate: src/{name}.h has more than one '{MARKER}' line")
    if MARKER not in text:
        return "", text.strip("\n")
    api, impl = text.split(MARKER)
    return api.strip("\n"), impl.strip("\n")


def banner(kind, name):
    head = f"/* ---- {name}: {kind} (src/{name}.h) "
    return head + "-" * max(0, 76 - len(head)) + " */"


def build():
    version = None
    parts = [split_layer(n) for n in LAYERS]
    for line in parts[0][0].splitlines():
        if line.startswith("#define IPCREF_VERSION_STRING"):
            version = line.split('"')[1]
    manual = read("manual.txt").strip("\n").replace("@VERSION@", version or "?")
    licence = read("licence.txt").strip("\n")
    out = [manual, "", "#ifndef IPCREF_H_INCLUDED", "#define IPCREF_H_INCLUDED", ""]
    for name, (api, _) in zip(LAYERS, parts):
        if api.strip():  # a layer may have no API of its own
            out += [banner("API", name), "", api, ""]
    out += ["#endif /* IPCREF_H_INCLUDED */", "",
            "#if defined(IPCREF_IMPLEMENTATION) && !defined(IPCREF_IMPLEMENTATION_INCLUDED)",
            "#define IPCREF_IMPLEMENTATION_INCLUDED", ""]
    for name, (_, impl) in zip(LAYERS, parts):
        if impl.strip():  # a layer may be API only (share_backend)
            out += [banner("implementation", name), "", impl, ""]
    out += ["#endif /* IPCREF_IMPLEMENTATION */", "", licence, ""]
    return "\n".join(out)


def build_backend(source, names):
    """A backend header: the driver's API; then, under its implementation
    macro, the shared prelude, the driver's part and the shared logic; then
    the licence."""
    licence = read("licence.txt").strip("\n")
    api, impl = split_layer(source[:-2])
    for more in DRIVER_MORE[source]:
        text = read(more)
        impl += "\n\n" + banner("driver", more[:-2]) + "\n\n" + \
            text[text.index("*/") + 2:].strip("\n")
    shared = read("gpu.h")
    shared = shared[shared.index("*/") + 2:]  # its comment is about src/
    if shared.count(DRIVER_MARKER) != 1:
        sys.exit(f"amalgamate: src/gpu.h must contain exactly one '{DRIVER_MARKER}' line")
    for marker, files in ((VMM_MARKER, (("gpu_pool", "pool memory shared by fd"),
                                        ("gpu_vmm", "memory shared by fd"))),
                          (EVENTS_MARKER, (("gpu_events", "ordering"),))):
        if shared.count(marker) != 1:
            sys.exit(f"amalgamate: src/gpu.h must contain exactly one '{marker}' line")
        parts = []
        for name, what in files:
            text = read(name + ".h")
            parts.append(banner(what, name) + "\n\n" +
                         text[text.index("*/") + 2:].strip("\n"))  # its comment is about src/
        shared = shared.replace(marker, "\n\n".join(parts))
    for old, new in names.items():
        shared = shared.replace(old, new)
    prelude, body = (part.strip("\n") for part in shared.split(DRIVER_MARKER))
    macro = names["IPCREF_GPU"] + "_IMPLEMENTATION"
    out = [api, "",
           f"#if defined({macro}) && !defined({macro}_INCLUDED)",
           f"#define {macro}_INCLUDED", "",
           banner("shared backend logic, first part", "gpu"), "", prelude, "",
           banner("driver", source[:-2]), "", impl, "",
           banner("shared backend logic", "gpu"), "", body, "",
           f"#endif /* {macro} */", "", licence, ""]
    return formatted("\n".join(out))


@functools.lru_cache(maxsize=None)
def clang_format_14():
    """clang-format, if it is version 14 (the project's style); else None."""
    tool = shutil.which("clang-format")
    if not tool:
        return None
    found = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout
    major = re.search(r"version (\d+)", found)
    return tool if major and major.group(1) == "14" else None


def formatted(text):
    """Renaming src/gpu.h changes line lengths, so a backend header goes
    through clang-format 14 to read like the rest (it is in the format
    check). Without it the text is returned as it is: see same_code."""
    tool = clang_format_14()
    if not tool:
        return text
    done = subprocess.run([tool, "--assume-filename=" + os.path.join(ROOT, "backend.h")],
                          input=text, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        sys.exit("amalgamate: clang-format failed: " + done.stderr.strip())
    return done.stdout


def same_code(a, b):
    """Equal but for what the formatter changes here (white space and line
    continuations): how a committed backend header is checked where
    clang-format 14 is missing, so that generating needs no formatter."""
    def norm(t):
        return "".join(t.replace("\\\n", "").split())
    return norm(a) == norm(b)


def check_sources():
    """Every src/*.h is a layer or a backend's part: a file left out of
    every list would silently be missing from the headers."""
    known = {n + ".h" for n in LAYERS} | {"gpu.h", "gpu_vmm.h", "gpu_pool.h", "gpu_events.h"}
    known |= {f for files in DRIVER_MORE.values() for f in files}
    known |= {source for source, _ in BACKENDS.values()}
    unknown = sorted(f for f in os.listdir(SRC) if f.endswith(".h") and f not in known)
    if unknown:
        sys.exit("amalgamate: src/" + ", src/".join(unknown) +
                 " in no list: add to LAYERS or BACKENDS in tools/amalgamate.py")


def outputs():
    yield OUT, build()
    for name, (source, names) in BACKENDS.items():
        yield os.path.join(ROOT, name), build_backend(source, names)


def main(argv):
    check_sources()
    if "--stdout" in argv:
        sys.stdout.write(build())
        return 0
    stale = []
    for path, text in outputs():
        try:
            with open(path, encoding="utf-8") as f:
                current = f.read()
        except FileNotFoundError:
            current = None
        if current == text:
            continue
        if (current is not None and path != OUT and not clang_format_14()
                and same_code(current, text)):
            continue  # the committed, formatted version of the same code
        if "--check" in argv:
            stale.append(os.path.basename(path))
            continue
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        if path != OUT and not clang_format_14():
            print(f"amalgamate: {os.path.basename(path)} written unformatted: "
                  "`make format` with clang-format 14 formats it", file=sys.stderr)
    if stale:
        print("amalgamate: " + ", ".join(stale) + " stale: run `make` (tools/amalgamate.py) and commit", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
