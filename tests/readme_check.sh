#!/usr/bin/env bash
# Every C block in README.md that follows a line "<!-- test: NAME -->" is
# compiled exactly as written (gcc and g++, strict warnings) and run.
# Usage: readme_check.sh OUTDIR
set -eu
cd "$(dirname "$0")/.."
OUT=$1
rm -rf "$OUT" && mkdir -p "$OUT"
python3 - "$OUT" <<'PY'
import re, sys
out = sys.argv[1]
text = open("README.md").read()
blocks = re.findall(r"<!-- test: ([a-z0-9_]+) -->\s*```c\n(.*?)```", text, re.S)
if not blocks:
    sys.exit("no tested C blocks in README.md")
for name, code in blocks:
    open(f"{out}/{name}.c", "w").write(code)
    print(name)
PY
found=0
for f in "$OUT"/*.c; do
  found=1
  n=$(basename "$f" .c)
  gcc -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror -I. "$f" -o "$OUT/$n" -pthread
  "$OUT/$n" >"$OUT/$n.out"
  # As C++ too, where g++ is (the compile matrix says when it is not).
  if command -v g++ >/dev/null 2>&1; then
    g++ -std=c++11 -O2 -Wall -Wextra -Wpedantic -Werror -I. -x c++ "$f" -o "$OUT/$n.cpp" -pthread
    "$OUT/$n.cpp" >/dev/null
  fi
  echo "$n: $(wc -l <"$OUT/$n.out") lines of output"
done
[ $found = 1 ]
