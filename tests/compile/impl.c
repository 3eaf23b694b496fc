/* stb's rule: declarations first, then the implementation in the same file
 * (a header that includes ipcref.h may come before the implementation).
 * Here ipcref.h is not the first include of the implementation file, so
 * the file asks for the GNU declarations the sharing layer needs itself. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ipcref.h"
#define IPCREF_IMPLEMENTATION
#include "ipcref.h"
#include <string.h>

int main(void) {
  ipcref_buf *b = NULL, *c;
  if (ipcref_buf_new(16, &b) != IPCREF_OK) return 1;
  c = ipcref_buf_retain(b);
  if (ipcref_buf_make_mut(&c) != IPCREF_OK) return 2;
  memset(ipcref_buf_get_mut(c), 7, 16);
  ipcref_buf_release(b);
  ipcref_buf_release(c);
  return strcmp(ipcref_strerror(IPCREF_OK), "success") != 0;
}
