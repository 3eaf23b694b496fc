/* Must NOT compile, with one error that names the mistake: DLPack's header
 * included after ipcref.h, so the DLPack calls were never declared. */
#include "ipcref.h"
#include <dlpack/dlpack.h>

int main(void) {
  ipcref_view v;
  DLManagedTensor *t = 0;
  return (int)ipcref_view_from_dlpack(t, &v);
}
