"""Builds ipcref's Python package: the extension ipcref._ipcref, compiled
from ipcref.h (this directory's parent in the repository, or a copy beside
this file), and the pure-Python modules. No download: setuptools and a C
compiler with Python's headers (Debian: python3-dev) are all it needs.

    python3 -m venv --system-site-packages venv
    venv/bin/pip install --no-build-isolation ./python
"""
import os

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER_DIR = next((d for d in (HERE, os.path.dirname(HERE))
                   if os.path.exists(os.path.join(d, "ipcref.h"))), None)
if HEADER_DIR is None:
    raise SystemExit("ipcref.h not found beside setup.py or in its parent")


def version():
    """The version ipcref.h says (IPCREF_VERSION_STRING)."""
    with open(os.path.join(HEADER_DIR, "ipcref.h"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("#define IPCREF_VERSION_STRING"):
                return line.split('"')[1]
    raise SystemExit("ipcref.h has no IPCREF_VERSION_STRING")


setup(
    name="ipcref",
    version=version(),
    description="numpy arrays and torch tensors between processes, zero copy",
    packages=["ipcref"],
    ext_modules=[Extension(
        "ipcref._ipcref", [os.path.join("ipcref", "_ipcref.c")],
        include_dirs=[HEADER_DIR],
        extra_compile_args=["-std=c11", "-O2"],
    )],
    install_requires=["numpy"],
    extras_require={"torch": ["torch"]},
    python_requires=">=3.8",
)
