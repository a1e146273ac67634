// Failure reporting shared by the GPU test programs (they use exceptions,
// not CMocka, so a failing check can unwind out of worker threads).
#pragma once

#include <cstdarg>
#include <cstdio>
#include <stdexcept>
#include <string>

#include <mla.h>

namespace gpu_harness {

struct Failure : std::runtime_error {
    explicit Failure(const std::string &w) : std::runtime_error(w) {}
};

inline std::string strf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string strf(const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

#define REQUIRE(cond, ...)                                                                      \
    do {                                                                                        \
        if (!(cond)) throw ::gpu_harness::Failure(::gpu_harness::strf("%s:%d: ", __FILE__, __LINE__) + ::gpu_harness::strf(__VA_ARGS__)); \
    } while (0)

#define MLA_CHECK(call)                                                                                          \
    do {                                                                                                         \
        const mla_status st_ = (call);                                                                           \
        if (st_ != MLA_SUCCESS)                                                                                  \
            throw ::gpu_harness::Failure(::gpu_harness::strf("%s:%d: %s: %s: %s", __FILE__, __LINE__, #call, mla_status_string(st_),        \
                               mla_last_error_message()));                                                       \
    } while (0)

}  // namespace gpu_harness
