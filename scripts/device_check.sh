#!/usr/bin/env bash
# libmla's checks on a GPU machine, in stages that fit one call each:
#   scripts/device_check.sh BUILD_DIR OUT_DIR STAGE...
# STAGE is one of
#   tests       the whole GPU suite (tests/test_gpu: >= 300 random configs, graph
#               capture, determinism, validation, 1M tokens, > 4 GiB pool)
#   sanitizers  compute-sanitizer memcheck, racecheck and initcheck over subsets
#               of the suite (sanitizers make the kernels 10-100x slower)
#   bench       tools/mla-bench: headline suite, JSON, PyTorch comparison, plot
#   python      the pytest suite (CPU and torch CUDA tensors) with this
#               machine's Python: compiles BUILD_DIR's SWIG wrapper for it first
#   portable    the GPU suite (24 random configs) on the portable kernels
#               that AMD runs (a -Dportable_kernels=true build: $MLA_PORTABLE_BUILD,
#               default build-nvp; only its libmla.so* and tests/test_gpu are needed)
#   profile     Nsight Compute on one attention launch of mla-bench (clocks
#               left as they are), the shape from $MLA_PROFILE_ARGS (default
#               MXFP4 B256x8k, 16 heads): OUT/profile.tgz holds the details
#               page and per-SASS-line stall samples and executed
#               instructions as CSV (ncu --page source --print-source sass).
#               $MLA_PROFILE_KERNEL picks another kernel (a regex, e.g.
#               metadata); $MLA_PROFILE_SAMPLING sets ncu's
#               --warp-sampling-interval (default auto; 0 for kernels of a
#               few microseconds, which get only a handful of samples);
#               scripts/profile_summary.py sass.csv summarises it
# BUILD_DIR comes from scripts/device_prep.sh. Each stage writes
# OUT_DIR/<stage>*.log; the last line is "N passed, N failed" (stages).
# On the H200 (2026-12-03) the stages took: tests 206-243 s (300 configs;
# MLA_GPU_TEST_CONFIGS=150: 131 s), sanitizers 95-123 s, bench 64-85 s,
# python 9-13 s, portable 84-88 s (24 configs), so all five fit one 600 s
# call: scripts/device_check.sh build-nv $OUT tests sanitizers bench python portable
# (plus ~2-3 minutes of machine start). A call returns at most 8 files of
# OUT: these stages write 9 (the portable log is left out; its tail is in
# the call's output).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
build=$(cd "$1" && pwd); out=$2; shift 2
mkdir -p "$out"
export PATH="$PATH:/usr/local/cuda/bin"
passed=0; failed=0

# run_logged LOG COMMAND...: output to LOG, tail to stdout; the command is
# stopped after $LIMIT_S seconds (default 500) so one hang cannot eat a call.
run_logged() {
    local log=$1; shift
    echo "---- $* > $(basename "$log") (limit ${LIMIT_S:-500} s)"
    local t0=$SECONDS
    timeout -k 10 "${LIMIT_S:-500}" "$@" > "$log" 2>&1
    local rc=$?
    tail -n 6 "$log"
    echo "---- rc=$rc in $((SECONDS - t0)) s"
    return $rc
}

stage_tests() { run_logged "$out/test_gpu.log" "$build/tests/test_gpu"; }

stage_sanitizers() {
    local cs ok=0
    cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    LIMIT_S=240 MLA_GPU_TEST_CONFIGS=6 run_logged "$out/memcheck.log" \
        "$cs" --tool memcheck --error-exitcode 3 --leak-check full "$build/tests/test_gpu" || ok=1
    LIMIT_S=150 MLA_GPU_TEST_CONFIGS=2 MLA_GPU_TEST_ONLY=decoding_exact,random_configs,graph_capture,validate_device_inputs \
        run_logged "$out/racecheck.log" "$cs" --tool racecheck --error-exitcode 3 "$build/tests/test_gpu" || ok=1
    LIMIT_S=150 MLA_GPU_TEST_CONFIGS=4 MLA_GPU_TEST_ONLY=decoding_exact,random_configs,device_metadata,graph_capture,large_pool \
        run_logged "$out/initcheck.log" "$cs" --tool initcheck --error-exitcode 3 "$build/tests/test_gpu" || ok=1
    return $ok
}

stage_portable() {
    local pb=${MLA_PORTABLE_BUILD:-build-nvp}
    MLA_GPU_TEST_CONFIGS=${MLA_PORTABLE_CONFIGS:-24} run_logged "$out/test_gpu_portable.log" "$pb/tests/test_gpu"
}

stage_bench() {
    run_logged "$out/bench.log" "$build/tools/mla-bench" --json "$out/bench.json" --compare-torch \
        --plot "$out/roofline.png" --scripts-dir "$root/tools"
}

stage_profile() {
    local ncu args dir
    ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    args=${MLA_PROFILE_ARGS:---kv-dtype mxfp4 --batch 256 --kv-len 8192 --heads 16}
    dir=$(mktemp -d)
    # -s 2: past the warm-up's first launches; --clock-control none: the
    # card's clocks are never changed.
    # shellcheck disable=SC2086
    LIMIT_S=240 run_logged "$out/profile.log" "$ncu" --clock-control none -s 2 -c 1 \
        -k "regex:${MLA_PROFILE_KERNEL:-attention}" --warp-sampling-interval "${MLA_PROFILE_SAMPLING:-auto}" \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
        --section InstructionStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section SourceCounters -o "$dir/profile" \
        "$build/tools/mla-bench" $args --iters 3 --warmup 1 --no-graph || return 1
    "$ncu" -i "$dir/profile.ncu-rep" --page details --csv > "$dir/details.csv" &&
        "$ncu" -i "$dir/profile.ncu-rep" --page source --csv --print-source sass > "$dir/sass.csv" &&
        tar -C "$dir" -czf "$out/profile.tgz" details.csv sass.csv
}

stage_python() {
    local py pkg inc suffix
    py=$(command -v python3)
    pkg=$(mktemp -d)/site
    mkdir -p "$pkg/mla"
    cp "$build"/bindings/python/mla/*.py "$build"/bindings/python/mla/py.typed "$pkg/mla/"
    inc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    suffix=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
    echo "python: $("$py" --version) at $py; building mla/_core$suffix"
    cc -shared -fPIC -O2 -fno-strict-aliasing -w -I"$inc" -I"$root/include" \
        "$build/bindings/python/mla/core_wrap.c" -L"$build" -lmla -Wl,-rpath,"$build" \
        -o "$pkg/mla/_core$suffix" || return 1
    local path="$pkg"
    "$py" -c 'import pytest' 2>/dev/null || { path="$pkg:$build/pylib"; echo "python: pytest from $build/pylib"; }
    PYTHONPATH="$path" PYTHONDONTWRITEBYTECODE=1 run_logged "$out/python.log" \
        "$py" -m pytest -v -rfEs -p no:cacheprovider --rootdir "$root/bindings/python/tests" \
        "$root/bindings/python/tests"
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null || true
for stage in "$@"; do
    echo; echo "==== $stage"
    if "stage_$stage"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "==== $stage: FAILED"; fi
done
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
