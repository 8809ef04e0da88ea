#!/usr/bin/python3
"""Plots benchmarks/results/compare_torch.json: peak RSS against layers for
each remat policy and for PyTorch (with and without checkpointing), and the
step time of each, side by side in one PNG.

  /usr/bin/python3 benchmarks/plot_compare.py [RESULTS.json [OUT.png]]
"""
import json
import os
import sys


def plot(results_path, png_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(results_path) as f:
        data = json.load(f)
    c, rows = data["config"], data["rows"]
    kinds = []
    for r in rows:
        if r["kind"] not in kinds:
            kinds.append(r["kind"])
    style = {"torch": "o--", "torch+ckpt": "s--",
             "remat:everything_saveable": "o-", "remat:nothing_saveable": "s-",
             "torch-bf16": "^--", "torch-bf16+ckpt": "v--",
             "remat-bf16:everything_saveable": "^-", "remat-bf16:nothing_saveable": "v-"}
    fig, (mem, tim) = plt.subplots(1, 2, figsize=(11, 4.2))
    for k in kinds:
        pts = sorted((r["layers"], r) for r in rows if r["kind"] == k)
        xs = [p[0] for p in pts]
        mem.plot(xs, [p[1]["peak_rss_bytes"] / 2**30 for p in pts], style.get(k, "x-"), label=k)
        tim.plot(xs, [p[1]["step_s"] for p in pts], style.get(k, "x-"), label=k)
    for ax, title, unit in ((mem, "peak RSS", "GiB"), (tim, "step time (median)", "s")):
        ax.set_xlabel("layers")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.set_xticks(sorted({r["layers"] for r in rows}))
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    mem.legend(fontsize=8)
    fig.suptitle("GPT D=%d T=%d B=%d V=%d, %d threads: remat vs PyTorch"
                 % (c["d_model"], c["seq"], c["batch"], c["vocab"], c["threads"]))
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return png_path


if __name__ == "__main__":
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "compare_torch.json")
    dst = sys.argv[2] if len(sys.argv) > 2 else os.path.splitext(src)[0] + ".png"
    print(plot(src, dst))
