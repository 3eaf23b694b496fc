/* Two translation units: this one holds the implementation. */
#define IPCREF_IMPLEMENTATION
#include "ipcref.h"

ipcref_buf *make_buffer(void);
int use_buffer(ipcref_buf *b);

ipcref_buf *make_buffer(void) {
  ipcref_buf *b = NULL;
  return ipcref_buf_new(32, &b) == IPCREF_OK ? b : NULL;
}

int main(void) {
  ipcref_buf *b = make_buffer();
  int r = b ? use_buffer(b) : 1;
  ipcref_buf_release(b);
  return r;
}
