#!/bin/sh
# The sanitizer runs of docs/reliability.md, each in its own build directory:
#
#   asan   the whole CMocka suite (less the install suite, see below) built
#          with -Db_sanitize=address,undefined; any report is fatal
#   tsan   test_concurrency and test_determinism built with
#          -Db_sanitize=thread; any report is fatal
#   fuzz   tests/fuzz/fuzz_api (clang, libFuzzer + ASan + UBSan): the
#          regression inputs replayed, then MLA_FUZZ_SECONDS (default 60) of
#          fuzzing from tests/fuzz/corpus
#
#   tests/run_sanitizers.sh [asan] [tsan] [fuzz]     (default: all three)
#
# Environment: CC / CXX for the meson builds (default: the system's cc),
# MLA_SAN_BUILD_ROOT (default: the source root; build dirs build-asan,
# build-tsan, build-fuzz), MLA_FUZZ_SECONDS, CI=true (lets the script
# apt-get the clang fuzzer runtime when it runs as root and it is missing).
# Exit status: 0 when every selected runner passed (a runner that cannot run
# here, e.g. no libFuzzer runtime, is reported as SKIPPED and does not fail),
# 1 otherwise. Takes ~10-15 minutes on 2 cores.
#
# Why not the install suite under ASan: install_test.sh builds
# examples/c/decode.c against the installed library with a plain
# `cc $(pkg-config ...)`; an ASan-instrumented libmla.so needs the ASan
# runtime linked first into every program that loads it, which that plain
# link (correctly) does not do. The install suite runs in the normal build.
set -u

src=$(cd "$(dirname "$0")/.." && pwd)
root=${MLA_SAN_BUILD_ROOT:-$src}
fuzz_seconds=${MLA_FUZZ_SECONDS:-60}
runners=${*:-asan tsan fuzz}
summary=""
failed=0

say() { printf '\n==== %s\n' "$*"; }
record() { # runner status detail
    summary="$summary$(printf '  %-5s %-8s %s' "$1" "$2" "$3")
"
    [ "$2" = FAILED ] && failed=1
    return 0
}

# Reports are fatal and come with a stack.
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1${TSAN_OPTIONS:+:$TSAN_OPTIONS}"

setup() { # dir sanitize
    dir=$1
    if [ -f "$dir/build.ninja" ]; then return 0; fi
    log=$(mktemp "${TMPDIR:-/tmp}/mla-setup.XXXXXX")
    # (the emulated-GPU suite switches stacks by hand, which the sanitizers'
    # stack tracking is not told about: it runs in the normal build only)
    meson setup "$dir" "$src" -Dgpu=none -Dpython=disabled -Dtools=false -Dtests=true -Demulated_gpu_tests=false \
        --buildtype=debugoptimized -Db_sanitize="$2" -Db_lundef=false >"$log" 2>&1 || {
        cat "$log"
        rm -f "$log"
        return 1
    }
    mv "$log" "$dir/san-setup.log"
}

mtest() { # dir args...: meson test, output shown and kept in dir/san-test.log
    d=$1
    shift
    { meson test -C "$d" "$@"; echo $? >"$d/san-test.rc"; } 2>&1 | tee "$d/san-test.log"
    return "$(cat "$d/san-test.rc")"
}

oks() { sed -n 's/^Ok: *\([0-9]*\).*/\1/p' "$1/san-test.log"; } # passed tests of the last mtest

run_asan() {
    say "ASan + UBSan: the CMocka suite ($root/build-asan)"
    dir=$root/build-asan
    if ! setup "$dir" address,undefined || ! ninja -C "$dir"; then
        record asan FAILED "configure / build failed"
        return
    fi
    # --no-suite install: see the header of this script.
    if mtest "$dir" --no-suite install --timeout-multiplier 4 --print-errorlogs &&
        [ "$(oks "$dir")" -gt 0 ] 2>/dev/null; then
        record asan OK "$(oks "$dir") tests passed, no report"
    else
        record asan FAILED "see $dir/meson-logs/testlog.txt"
    fi
}

run_tsan() {
    say "ThreadSanitizer: concurrency + determinism ($root/build-tsan)"
    dir=$root/build-tsan
    if ! setup "$dir" thread || ! ninja -C "$dir" tests/test_concurrency tests/test_determinism; then
        record tsan FAILED "configure / build failed"
        return
    fi
    if mtest "$dir" --no-rebuild --timeout-multiplier 10 --print-errorlogs concurrency determinism &&
        [ "$(oks "$dir")" = 2 ]; then # meson says 0 when no name matches
        record tsan OK "$(oks "$dir") tests (concurrency, determinism) passed, no report"
    else
        record tsan FAILED "see $dir/meson-logs/testlog.txt"
    fi
}

run_fuzz() {
    say "libFuzzer: tests/fuzz/fuzz_api for ${fuzz_seconds} s ($root/build-fuzz)"
    dir=$root/build-fuzz
    "$src/tests/fuzz/build.sh" "$dir"
    rc=$?
    if [ $rc -eq 77 ] && [ "${CI:-}" = true ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing clang-19 and its runtimes (CI=true, root)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang-19 libclang-rt-19-dev
        "$src/tests/fuzz/build.sh" "$dir"
        rc=$?
    fi
    if [ $rc -eq 77 ]; then
        record fuzz SKIPPED "no clang with a libFuzzer runtime (apt-get install clang-19 libclang-rt-19-dev)"
        return
    elif [ $rc -ne 0 ]; then
        record fuzz FAILED "tests/fuzz/build.sh failed"
        return
    fi
    work=$(mktemp -d "${TMPDIR:-/tmp}/mla-fuzz.XXXXXX")
    mkdir -p "$work/corpus" "$work/artifacts"
    # 1. every past finding, replayed
    if ! "$dir/fuzz_api" -artifact_prefix="$work/artifacts/" "$src"/tests/fuzz/regressions/* >"$work/replay.log" 2>&1; then
        tail -n 40 "$work/replay.log"
        record fuzz FAILED "a regression input fails again (log: $work/replay.log)"
        return
    fi
    # 2. fuzzing, from the committed corpus (read-only) into a scratch one
    MLA_FUZZ_STATS=1 "$dir/fuzz_api" -max_total_time="$fuzz_seconds" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
        "$work/corpus" "$src/tests/fuzz/corpus" >"$work/fuzz.log" 2>&1
    rc=$?
    grep -E '^(stat::|fuzz_api stats|Done )' "$work/fuzz.log"
    if [ $rc -ne 0 ] || [ -n "$(ls "$work/artifacts")" ]; then
        tail -n 60 "$work/fuzz.log"
        record fuzz FAILED "finding in $work/artifacts (log: $work/fuzz.log); add it to tests/fuzz/regressions/"
        return
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/fuzz.log")
    record fuzz OK "${runs:-?} executions in ${fuzz_seconds} s, no finding"
    rm -rf "$work"
}

for r in $runners; do
    case $r in
        asan) run_asan ;;
        tsan) run_tsan ;;
        fuzz) run_fuzz ;;
        *) echo "unknown runner '$r' (asan, tsan, fuzz)"; exit 2 ;;
    esac
done

say "summary"
printf '%s' "$summary"
exit $failed
