#!/usr/bin/env python3
"""The compile-time options the manual in ipcref.h lists (src/manual.txt,
"COMPILE-TIME OPTIONS") and the README's table (section "Configuration")
name the same macros. Prints what one has and the other lacks; exit 1 then.

    python3 tests/options_check.py
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MACRO = re.compile(r"\b(_GNU_SOURCE|IPCREF_[A-Z0-9_]+)\b")


def manual_options():
    text = open(os.path.join(ROOT, "src", "manual.txt"), encoding="utf-8").read()
    part = text.split("COMPILE-TIME OPTIONS", 1)[1].splitlines()[1:]
    names = set()
    for line in part:
        if re.match(r"^ \* [A-Z][A-Z -]+$", line):
            break  # the next section
        # " *   where   MACRO ...": the macro is the second column.
        cols = line.lstrip(" *").split()
        if len(cols) >= 2 and cols[0] in ("impl", "all"):
            names.update(MACRO.findall(cols[1]))
    return names


def readme_options():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    part = text.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    names = set()
    for line in part.splitlines():
        if line.startswith("| ") and not line.startswith("| macro"):
            names.update(MACRO.findall(line.split("|")[1]))
    return names


def main():
    manual, readme = manual_options(), readme_options()
    if not manual or not readme:
        print("options_check: found no options (manual %d, README %d)" % (len(manual), len(readme)))
        return 1
    bad = 0
    for name in sorted(manual - readme):
        print("README.md's Configuration table lacks %s (in the manual)" % name)
        bad = 1
    for name in sorted(readme - manual):
        print("the manual (src/manual.txt) lacks %s (in README.md's table)" % name)
        bad = 1
    if not bad:
        print("%d options, the same in the manual and the README" % len(manual))
    return bad


if __name__ == "__main__":
    sys.exit(main())
