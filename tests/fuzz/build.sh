#!/bin/sh
# Build the libFuzzer harness tests/fuzz/fuzz_api.c with clang, straight from
# the library's CPU sources (no GPU backend), everything under
# AddressSanitizer + UndefinedBehaviorSanitizer, the library and the harness
# with libFuzzer's coverage instrumentation.
#
#   tests/fuzz/build.sh [OUT_DIR]          default OUT_DIR: build-fuzz
#   CLANG=clang-19 CLANGXX=clang++-19      compilers (default: clang-19, else clang)
#
# Produces OUT_DIR/fuzz_api. Exit status 77 when no clang with a libFuzzer
# runtime is found (callers treat that as "skipped").
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-"$root/build-fuzz"}

pick() {
    for c in "$@"; do
        if command -v "$c" >/dev/null 2>&1; then echo "$c"; return 0; fi
    done
    return 1
}
CLANG=${CLANG:-$(pick clang-19 clang || true)}
CLANGXX=${CLANGXX:-$(pick clang++-19 clang++ || true)}
if [ -z "$CLANG" ] || [ -z "$CLANGXX" ]; then
    echo "fuzz/build.sh: no clang found (install clang-19)"
    exit 77
fi

mkdir -p "$out/obj"
probe="$out/obj/probe.c"
printf '#include <stdint.h>\n#include <stddef.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' >"$probe"
if ! "$CLANG" -fsanitize=fuzzer,address,undefined "$probe" -o "$out/obj/probe" >/dev/null 2>&1; then
    echo "fuzz/build.sh: $CLANG cannot link -fsanitize=fuzzer,address,undefined (install libclang-rt-19-dev)"
    exit 77
fi

san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1"
lib_flags="$san -fsanitize=fuzzer-no-link -std=c++17 -pthread -I$root/include -I$root/src"
c_flags="$san -std=c11 -I$root/include -I$root/tests"

objs=""
for s in src/api.cpp src/errors.cpp src/schedule.cpp src/cpu/backend.cpp src/cpu/thread_pool.cpp \
         src/gpu_unavailable.cpp; do
    o="$out/obj/$(echo "$s" | tr '/' '_').o"
    extra=""
    # The attention loops: edge coverage only. Comparison tracing of their
    # loop bounds costs ~3x the run time and guides nothing.
    case $s in src/cpu/backend.cpp) extra="-fno-sanitize-coverage=trace-cmp" ;; esac
    "$CLANGXX" $lib_flags $extra -c "$root/$s" -o "$o"
    objs="$objs $o"
done
# The reference and helpers: sanitized, not coverage-instrumented (the
# fuzzer should steer by the library's branches, not the oracle's).
for s in tests/reference.c tests/testutil.c; do
    o="$out/obj/$(echo "$s" | tr '/' '_').o"
    "$CLANG" $c_flags -D_POSIX_C_SOURCE=200809L -c "$root/$s" -o "$o"
    objs="$objs $o"
done
"$CLANG" $c_flags -fsanitize=fuzzer -c "$here/fuzz_api.c" -o "$out/obj/fuzz_api.o"
"$CLANGXX" $san -fsanitize=fuzzer -pthread "$out/obj/fuzz_api.o" $objs -lm -o "$out/fuzz_api"
echo "fuzz/build.sh: built $out/fuzz_api with $CLANG"
