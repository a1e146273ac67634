#!/usr/bin/env bash
# Prepare a build folder to carry to a GPU machine that has no compilers for
# the bindings (the project's H200 machine has nvcc and Python, but no swig):
#   - configures/builds BUILD_DIR (default build-nv) with the NVIDIA backend,
#     the tests (not the CPU-emulated GPU ones: they run here, and would
#     push the carry past its 64 MiB), the tools and the SWIG-generated
#     Python wrapper (core_wrap.c, compiled there for that machine's Python
#     by scripts/device_check.sh);
#   - copies Debian's pure-Python pytest (and what it imports) into
#     BUILD_DIR/pylib, used there only when that Python has no pytest.
#   - builds build-nvp, the portable kernels (-Dportable_kernels=true) whose
#     library and test_gpu the `portable` stage runs.
# Then carry BUILD_DIR, build-nvp/libmla.so.0.1.0, build-nvp/libmla.so.0 and
# build-nvp/tests/test_gpu, and run scripts/device_check.sh BUILD_DIR OUT STAGE...
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-nv}
export PATH="$PATH:/usr/local/cuda/bin"
[ -f "$build/build.ninja" ] || meson setup "$build" -Dgpu=nvidia -Demulated_gpu_tests=false -Dpython=enabled -Dpython_exe=/usr/bin/python3
ninja -C "$build"
rm -rf "$build/pylib" && mkdir -p "$build/pylib"
for m in pytest _pytest pluggy iniconfig packaging attr attrs py.py; do
    src=/usr/lib/python3/dist-packages/$m
    [ -e "$src" ] && cp -r "$src" "$build/pylib/"
done
find "$build/pylib" -name __pycache__ -prune -exec rm -rf {} +
[ -f build-nvp/build.ninja ] || meson setup build-nvp -Dgpu=nvidia -Dportable_kernels=true -Dpython=disabled -Dtools=false
ninja -C build-nvp libmla.so.0.1.0 tests/test_gpu
du -sh "$build" | sed 's/^/device_prep: carry /'
