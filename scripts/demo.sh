#!/usr/bin/env bash
# Build libmla and run the benchmark: the headline suite of DESIGN §6 on the
# GPU when one is present, else the quick suite on the CPU backend. Extra
# arguments go to mla-bench (see build-demo/tools/mla-bench --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
export PATH="$PATH:/usr/local/cuda/bin"
[ -f build-demo/build.ninja ] || meson setup build-demo -Dtests=false -Dpython=disabled >/dev/null
ninja -C build-demo >/dev/null
bench=build-demo/tools/mla-bench
if nvidia-smi -L >/dev/null 2>&1 || [ -e /dev/kfd ]; then  # a GPU the backend can use
    exec $bench "$@"
else
    exec $bench --quick "$@"
fi
