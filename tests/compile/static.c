/* IPCREF_STATIC: every function static to this file, the unused ones too,
 * without a warning. */
#define IPCREF_STATIC
#define IPCREF_IMPLEMENTATION
#include "ipcref.h"

int main(void) {
  ipcref_buf *b = NULL;
  if (ipcref_buf_new(8, &b) != IPCREF_OK) return 1;
  ipcref_buf_release(b);
  return 0;
}
