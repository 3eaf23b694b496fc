/* IPCREF_NO_SHARING: the portable core. matrix.sh checks that the object
 * needs nothing from the C library beyond a short list (no POSIX calls). */
#define IPCREF_NO_SHARING
#define IPCREF_IMPLEMENTATION
#include "ipcref.h"
