// Thread-local error messages and the helpers that set them. Every refusal in
// the library goes through mla::fail() so the status and the sentence agree.
#pragma once

#include "mla.h"

namespace mla {

// Record `status` with a printf-style message for mla_last_error_message().
mla_status fail(mla_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

// Clear the calling thread's message (called at the start of every entry point).
void clear_error();

}  // namespace mla

// Return early from the enclosing function when `expr` is not MLA_SUCCESS.
#define MLA_TRY(expr)                                   \
    do {                                                \
        mla_status mla_try_status_ = (expr);            \
        if (mla_try_status_ != MLA_SUCCESS) return mla_try_status_; \
    } while (0)
