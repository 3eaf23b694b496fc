/* The header alone, without the implementation: declarations only. Also
 * included twice, which must be harmless. */
#include "ipcref.h"
#include "ipcref.h"

/* Take the address of every public function, so each declaration is used. */
typedef void (*any_fn)(void);
#define FN(f) (any_fn)(void (*)(void))(f)
any_fn ipcref_compile_all_functions[] = {
    FN(ipcref_strerror),         FN(ipcref_set_error_hook),
    FN(ipcref_buf_new),          FN(ipcref_buf_new_aligned),
    FN(ipcref_buf_new_in),       FN(ipcref_buf_wrap),
    FN(ipcref_buf_retain),       FN(ipcref_buf_release),
    FN(ipcref_buf_data),         FN(ipcref_buf_size),
    FN(ipcref_buf_strong_count), FN(ipcref_buf_weak_count),
    FN(ipcref_buf_is_unique),    FN(ipcref_buf_get_mut),
    FN(ipcref_buf_make_mut),     FN(ipcref_buf_downgrade),
    FN(ipcref_weak_upgrade),     FN(ipcref_weak_release),
};
