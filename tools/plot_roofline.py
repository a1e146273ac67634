#!/usr/bin/env python3
"""Roofline picture of an mla-bench JSON report.

  plot_roofline.py BENCH.json OUT.png

Two panels, both with achieved GB/s (bytes moved / execute time) on the y axis
and the streaming read bandwidth measured in the same run as the roof:
  left:  x = bytes moved per call (small calls are launch bound, large ones
         should reach the roof);
  right: x = arithmetic intensity (FLOPs per byte moved).
Filled markers are libmla (execute; graph replays as small dots when present),
hollow ones the plain-PyTorch baseline when the report has it. One colour per
KV dtype. Exit status 3 when matplotlib is missing.
"""

import json
import sys

COLOURS = {"bf16": "tab:blue", "fp8": "tab:orange", "fp8fnuz": "tab:red", "mxfp4": "tab:green"}


def main():
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) == 2 else 2
    src, dst = sys.argv[1], sys.argv[2]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"plot_roofline.py: matplotlib is not installed for {sys.executable} ({e}); no plot written "
              "(Debian: apt-get install python3-matplotlib; pip: pip install matplotlib)")
        return 3

    with open(src) as f:
        report = json.load(f)
    rows = [r for r in report.get("rows", []) if r.get("exec_us")]
    if not rows:
        print(f"plot_roofline.py: {src} has no timed rows; no plot written")
        return 1
    bw = report.get("read_bandwidth_gbs")

    fig, axes = plt.subplots(1, 2, figsize=(15, 6.5))
    panels = [("bytes", "bytes moved per call"), ("intensity", "arithmetic intensity (FLOP / byte)")]
    for ax, (kind, xlabel) in zip(axes, panels):
        for dtype in sorted({r["kv_dtype"] for r in rows}):
            sel = [r for r in rows if r["kv_dtype"] == dtype]
            colour = COLOURS.get(dtype, "tab:gray")

            def x_of(r):
                return r["bytes"] if kind == "bytes" else r["flops"] / r["bytes"]

            xs = [x_of(r) for r in sel]
            ax.scatter(xs, [r["bytes"] / (r["exec_us"] * 1e3) for r in sel], color=colour, s=36,
                       label=f"libmla {dtype}", zorder=3)
            graph = [r for r in sel if r.get("graph_us")]
            if graph:
                ax.scatter([x_of(r) for r in graph], [r["bytes"] / (r["graph_us"] * 1e3) for r in graph],
                           color=colour, s=10, marker="D", alpha=0.6, zorder=3,
                           label=f"libmla {dtype} (graph)")
            torch_rows = [r for r in sel if r.get("torch_us")]
            if torch_rows:
                ax.scatter([x_of(r) for r in torch_rows],
                           [r["bytes"] / (r["torch_us"] * 1e3) for r in torch_rows],
                           facecolors="none", edgecolors=colour, s=44, zorder=2, label=f"PyTorch {dtype}")
            if kind == "bytes":
                for r, x in zip(sel, xs):
                    tag = f"{r['batch']}x{'~' if r.get('ragged') else ''}{r['kv_len']}"
                    if r["heads"] != 16 or r["q_len"] != 1:
                        tag += f" h{r['heads']} q{r['q_len']}"
                    if r["page_size"] != 1:
                        tag += f" p{r['page_size']}"
                    ax.annotate(tag, (x, r["bytes"] / (r["exec_us"] * 1e3)), fontsize=6,
                                xytext=(3, 3), textcoords="offset points", color=colour)
        if bw:
            ax.axhline(bw, color="black", linestyle="--", linewidth=1,
                       label=f"streaming read, this run: {bw:.0f} GB/s")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("achieved GB/s")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7, loc="lower right")
    title = f"mla-bench {report.get('suite', '')} on {report.get('device', '?')} ({report.get('backend', '?')})"
    sub = ", ".join(x for x in (report.get("date"), report.get("git")) if x)
    fig.suptitle(title + (f"\n{sub}" if sub else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(dst, dpi=130)
    print(f"plot_roofline.py: wrote {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
