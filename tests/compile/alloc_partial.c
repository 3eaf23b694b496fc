/* Must NOT compile: the allocator macros are all-or-none. */
#define IPCREF_MALLOC(n) malloc(n)
#include <stdlib.h>
#define IPCREF_IMPLEMENTATION
#include "ipcref.h"
