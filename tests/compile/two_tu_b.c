/* Two translation units: this one only uses the declarations. */
#include "ipcref.h"

int use_buffer(ipcref_buf *b);

int use_buffer(ipcref_buf *b) {
  ipcref_buf *c = ipcref_buf_retain(b);
  int ok = ipcref_buf_strong_count(b) == 2 && ipcref_buf_get_mut(b) == 0;
  ipcref_buf_release(c);
  return ok && ipcref_buf_get_mut(b) != 0 ? 0 : 3;
}
