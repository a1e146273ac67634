#!/usr/bin/env bash
# A/B timing of two libmla builds on a GPU machine:
#   scripts/device_ab.sh OUT_DIR BENCH LIB_A LIB_B [mla-bench options...]
# LIB_A and LIB_B are folders holding a libmla.so.0 (scripts/ab_prep.sh
# builds one from a git revision); BENCH is an mla-bench binary of either
# tree (the C ABI is stable, so it loads both). The runs go A, B, B, A, so
# that a drift of the card over the call falls on both. Each run is kept
# in OUT_DIR/ab_{a,b}{1,2}.txt; the table gives, per shape, each variant's
# two exec and graph times (µs), the ratio B / A of their means, and the
# geometric means. Default options: --iters 30 (the headline suite).
set -uo pipefail
[ $# -ge 4 ] || { sed -n '2,11p' "$0"; exit 2; }
out=$1 bench=$2 lib_a=$3 lib_b=$4
shift 4
[ $# -gt 0 ] || set -- --iters 30
mkdir -p "$out"
runs() {  # runs VARIANT LIB K OPTIONS...
    local v=$1 lib=$2 k=$3
    shift 3
    LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$bench" "$@" > "$out/ab_$v$k.txt" 2>&1 ||
        echo "device_ab: run $v$k failed (rc $?), see $out/ab_$v$k.txt"
}
runs a "$lib_a" 1 "$@"
runs b "$lib_b" 1 "$@"
runs b "$lib_b" 2 "$@"
runs a "$lib_a" 2 "$@"
python3 - "$out" <<'PY'
import math, sys
out = sys.argv[1]
num = lambda s: float(s) if s not in ("-", "") else float("nan")
def rows(name):
    """(kv, batch, kv_len, heads, q_len, page) -> (exec, graph) of one run."""
    r = {}
    try:
        lines = open(f"{out}/ab_{name}.txt").read().splitlines()
    except OSError:
        return r
    for line in lines:
        f = line.split()
        if len(f) > 9 and f[0] in ("bf16", "fp8", "fp8fnuz", "mxfp4") and f[1][-1:].isdigit() and f[6] == "|":
            r[tuple(f[:6])] = (num(f[7]), num(f[8]))
    return r
runs = {n: rows(n) for n in ("a1", "a2", "b1", "b2")}
keys = [k for k in runs["a1"] if all(k in runs[n] for n in runs)]
mean = lambda xs: sum(xs) / len(xs)
fmt = lambda x: "-" if math.isnan(x) else f"{x:.1f}"
print(f"{'kv':6} {'batch':>6} {'kv_len':>7} {'hds':>4} {'q':>2} {'pg':>3} | "
      f"{'A exec':>13} {'B exec':>13} {'B/A':>6} | {'A graph':>13} {'B graph':>13} {'B/A':>6}")
logs = {}
for k in keys:
    cols = []
    for i in (0, 1):
        a = [runs["a1"][k][i], runs["a2"][k][i]]
        b = [runs["b1"][k][i], runs["b2"][k][i]]
        ratio = mean(b) / mean(a) if mean(a) > 0 else float("nan")
        cols.append(f"{fmt(a[0]):>6}/{fmt(a[1]):<6} {fmt(b[0]):>6}/{fmt(b[1]):<6} {ratio:6.3f}")
        for n, v in (("a", mean(a)), ("b", mean(b))):
            if v > 0:
                logs.setdefault((k[0], i, n), []).append(math.log(v))
    print(f"{k[0]:6} {k[1]:>6} {k[2]:>7} {k[3]:>4} {k[4]:>2} {k[5]:>3} | {cols[0]} | {cols[1]}")
for kv in dict.fromkeys(k[0] for k in keys):
    parts = []
    for i, what in ((0, "exec"), (1, "graph")):
        a, b = logs.get((kv, i, "a")), logs.get((kv, i, "b"))
        if a and b and len(a) == len(b):
            ga, gb = math.exp(mean(a)), math.exp(mean(b))
            parts.append(f"{what} A {ga:.1f} B {gb:.1f} (B/A {gb / ga:.3f})")
    print(f"geomean {kv}: " + "; ".join(parts))
print(f"{len(keys)} shapes in all four runs")
PY
