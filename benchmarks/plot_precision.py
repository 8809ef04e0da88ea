#!/usr/bin/python3
"""Plots benchmarks/results/policies_both.json (compare_policies.py
--precision both): for every policy, the step time and the activation peak
in f32 and in bf16, side by side in one PNG.

  /usr/bin/python3 benchmarks/plot_precision.py [RESULTS.json [OUT.png]]
"""
import json
import os
import sys


def plot(results_path, png_path, cpu=""):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(results_path) as f:
        data = json.load(f)
    rows = data["rows"]
    policies = []
    for r in rows:
        if r["policy"] not in policies:
            policies.append(r["policy"])
    by = {(r["policy"], r["precision"]): r for r in rows}
    fig, (tim, mem) = plt.subplots(1, 2, figsize=(12, 4.6))
    xs = range(len(policies))
    width = 0.38
    for k, (prec, color) in enumerate((("f32", "#4477aa"), ("bf16", "#ee6677"))):
        off = [x + (k - 0.5) * width for x in xs]
        tim.bar(off, [by[(p, prec)]["step_s_median"] for p in policies], width,
                label=prec, color=color)
        mem.bar(off, [by[(p, prec)]["activation_peak_bytes"] / 2**20 for p in policies],
                width, label=prec, color=color)
    labels = [p.replace("save_only_these_names:", "names:").replace(
        "dots_with_no_batch_dims_saveable", "dots_no_batch") for p in policies]
    for ax, title, unit in ((tim, "step time (median)", "s"),
                            (mem, "activation peak", "MiB")):
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
    tim.legend(fontsize=8)
    fig.suptitle("GPT 8 layers d512 T256 B8, %d threads, f32 vs bf16%s"
                 % (data["threads"], (" on " + cpu) if cpu else ""))
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    return png_path


if __name__ == "__main__":
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "policies_both.json")
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "policies_both.png")
    print(plot(src, out, sys.argv[3] if len(sys.argv) > 3 else ""))
