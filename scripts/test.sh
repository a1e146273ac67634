#!/usr/bin/env bash
# Build libmla and run every test: the CMocka suites (CPU, errors, install,
# GPU when a GPU is present), the Python binding's pytest suite, the Rust
# crates' cargo tests, the AMD compile checks (gfx90a with hipcc, gfx942
# device-only with clang-19), and the sanitizer / fuzzing runs.
# Ends with one line: "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
bash scripts/deps.sh || { echo "dependency installation failed"; exit 1; }
export PATH="$PATH:/usr/local/cuda/bin"
# Debian's interpreter: it is the one python3-numpy / python3-pytest serve.
py=/usr/bin/python3

passed=0; failed=0; failures=()
stage() {  # stage NAME COMMAND...
    local name=$1; shift
    echo; echo "==== $name"
    if "$@"; then passed=$((passed + 1)); echo "==== $name: passed"
    else failed=$((failed + 1)); failures+=("$name"); echo "==== $name: FAILED"; fi
}

main_build() {
    # With nvcc present the NVIDIA build is required (a broken toolkit fails
    # here instead of silently dropping the GPU compile check).
    local gpu=auto
    command -v nvcc >/dev/null 2>&1 && gpu=nvidia
    [ -f build-test/build.ninja ] || meson setup build-test -Dgpu=$gpu -Dpython=enabled -Dpython_exe=$py >/dev/null || return 1
    ninja -C build-test
}
main_tests() { meson test -C build-test --print-errorlogs --num-processes 2; }
rust_tests() {
    (cd bindings/rust && PKG_CONFIG_PATH="$root/build-test/meson-uninstalled" cargo test --offline 2>&1)
}
amd_gfx90a() {
    [ -f build-amd/build.ninja ] || meson setup build-amd -Dgpu=amd -Damd_arch=gfx90a -Dtests=false -Dtools=false \
        -Dpython=disabled >/dev/null || return 1
    ninja -C build-amd
}
amd_gfx942() {  # device code only: clang 19 knows gfx942, Debian's hipcc 5.2 does not
    local f ok=0
    for f in src/gpu/*.cu build-amd/src/gpu/attention_*.cu; do
        clang-19 -x hip --offload-arch=gfx942 -nogpulib --cuda-device-only -S -std=c++17 -O3 \
            -D__HIP_PLATFORM_AMD__ -DMLA_GPU_AMD=1 -Iinclude -Isrc -o /dev/null "$f" && echo "gfx942 ok: $f" || ok=1
    done
    return $ok
}

stage "build" main_build
stage "meson test" main_tests
stage "cargo test" rust_tests
stage "amd gfx90a build (hipcc)" amd_gfx90a
stage "amd gfx942 device compile (clang-19)" amd_gfx942
if [ -x tests/run_sanitizers.sh ] || [ -f tests/run_sanitizers.sh ]; then
    stage "sanitizers + fuzzing" bash tests/run_sanitizers.sh
fi

echo
[ $failed -gt 0 ] && echo "failed stages: ${failures[*]}"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
