#!/usr/bin/env bash
# make install into a staging directory, then build a program with the
# flags pkg-config gives for ipcref. Usage: install_check.sh OUTDIR
set -eu
cd "$(dirname "$0")/.."
OUT=$1
rm -rf "$OUT" && mkdir -p "$OUT"
make -s install DESTDIR="$OUT/root" PREFIX=/usr
test -f "$OUT/root/usr/include/ipcref.h"
export PKG_CONFIG_PATH="$OUT/root/usr/lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$OUT/root"
pkg-config --exists ipcref
test "$(pkg-config --modversion ipcref)" = "$(sed -n 's/^#define IPCREF_VERSION_STRING "\(.*\)"/\1/p' ipcref.h)"
cat > "$OUT/use.c" <<'C'
#define IPCREF_IMPLEMENTATION
#include <ipcref.h>
int main(void) {
  ipcref_buf *b = NULL;
  if (ipcref_buf_new(1, &b) != IPCREF_OK) return 1;
  ipcref_buf_release(b);
  return 0;
}
C
# shellcheck disable=SC2046
cc -std=c99 -Wall -Wextra -Wpedantic -Werror $(pkg-config --cflags ipcref) "$OUT/use.c" \
  -o "$OUT/use" $(pkg-config --libs ipcref)
"$OUT/use"
