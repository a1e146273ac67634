#!/usr/bin/env bash
# Stall reasons of one attention launch, per library, on a GPU machine:
#   scripts/ncu_stalls.sh BENCH LIB_DIR[,LIB_DIR...] [mla-bench options...]
# Runs Nsight Compute on the third attention launch of `BENCH options
# --iters 1 --warmup 2 --no-graph` with each LIB_DIR's libmla.so.0 and
# prints its duration, warp instructions executed and the stall reasons
# (cycles per issued instruction) of at least 0.05. The clocks are left as
# they are (--clock-control none: ncu's default locks them to base).
# MLA_NCU_CACHE=none keeps ncu from flushing the caches before the launch
# (default: all), e.g. to tell instruction fetch from the rest (v27).
# Example (bf16 batch 4 x 1k on two builds):
#   scripts/ncu_stalls.sh .carry/ab/mla-bench .carry/ab/main,.carry/ab/head --batch 4 --kv-len 1024 --kv-dtype bf16
set -uo pipefail
[ $# -ge 2 ] || { sed -n '2,13p' "$0"; exit 2; }
bench=$1 libs=$2
shift 2
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
metrics='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,gpu__time_duration.sum'
IFS=, read -ra dirs <<< "$libs"
for lib in "${dirs[@]}"; do
    echo "== $lib: $*"
    LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 120 "$ncu" --clock-control none \
        --cache-control "${MLA_NCU_CACHE:-all}" --metrics "$metrics" -k regex:attention -s 2 -c 1 \
        "$bench" "$@" --iters 1 --warmup 2 --no-graph 2>&1 |
        awk '/inst_executed|duration/ || (/stalled/ && $NF + 0 >= 0.05)' |
        sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active\.ratio//'
done
