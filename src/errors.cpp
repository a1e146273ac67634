#include "errors.h"

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace {
thread_local char g_message[512] = "";
}

namespace mla {

mla_status fail(mla_status status, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(g_message, sizeof g_message, fmt, args);
    va_end(args);
    return status;
}

void clear_error() { g_message[0] = '\0'; }

}  // namespace mla

extern "C" MLA_API const char *mla_last_error_message(void) { return g_message; }

extern "C" MLA_API const char *mla_status_string(mla_status status_in) {
    // A C caller may pass any int: read it as one, not as the C++ enum.
    static_assert(sizeof(mla_status) == sizeof(int32_t), "mla_status is an int");
    int32_t status;
    std::memcpy(&status, &status_in, sizeof status);
    switch (status) {
        case MLA_SUCCESS: return "MLA_SUCCESS";
        case MLA_ERROR_NULL_POINTER: return "MLA_ERROR_NULL_POINTER";
        case MLA_ERROR_STRUCT_SIZE: return "MLA_ERROR_STRUCT_SIZE";
        case MLA_ERROR_INVALID_VALUE: return "MLA_ERROR_INVALID_VALUE";
        case MLA_ERROR_UNSUPPORTED_DTYPE: return "MLA_ERROR_UNSUPPORTED_DTYPE";
        case MLA_ERROR_INVALID_INDPTR: return "MLA_ERROR_INVALID_INDPTR";
        case MLA_ERROR_INVALID_LAST_PAGE_LEN: return "MLA_ERROR_INVALID_LAST_PAGE_LEN";
        case MLA_ERROR_PAGE_OUT_OF_RANGE: return "MLA_ERROR_PAGE_OUT_OF_RANGE";
        case MLA_ERROR_LIMIT_EXCEEDED: return "MLA_ERROR_LIMIT_EXCEEDED";
        case MLA_ERROR_NO_METADATA: return "MLA_ERROR_NO_METADATA";
        case MLA_ERROR_BACKEND_UNAVAILABLE: return "MLA_ERROR_BACKEND_UNAVAILABLE";
        case MLA_ERROR_INVALID_DEVICE: return "MLA_ERROR_INVALID_DEVICE";
        case MLA_ERROR_DEVICE_RUNTIME: return "MLA_ERROR_DEVICE_RUNTIME";
        case MLA_ERROR_OUT_OF_MEMORY: return "MLA_ERROR_OUT_OF_MEMORY";
        case MLA_ERROR_MISALIGNED: return "MLA_ERROR_MISALIGNED";
        case MLA_ERROR_WORKSPACE_TOO_SMALL: return "MLA_ERROR_WORKSPACE_TOO_SMALL";
        case MLA_ERROR_DEVICE_VALIDATION_FAILED: return "MLA_ERROR_DEVICE_VALIDATION_FAILED";
        case MLA_ERROR_INTERNAL: return "MLA_ERROR_INTERNAL";
    }
    return "MLA_STATUS_UNKNOWN";
}
