#!/usr/bin/python3
"""Runs build/benchmarks/sim/sim_scaling for the default GPT (8 layers, d_model
512, 8 heads, seq 256, batch 8: its steps are run here, traced for the task
costs and timed for the validation) and for a large one (24 layers, d_model
1024, 16 heads, seq 1024, batch 16, nothing_saveable: compiled only, its
tiles timed in isolation, with the per-task overhead measured on the default
model), for 8 to 256 cores on 1, 2 and 4 nodes, placed and unplaced. Writes
benchmarks/results/scaling.json and benchmarks/results/scaling.png
(predicted parallel efficiency against cores).

  /usr/bin/python3 benchmarks/plot_scaling.py [--replot] [-- SIM_OPTIONS...]

--replot draws the PNG from an existing scaling.json. Options after `--` go
to both sim_scaling runs (for example `-- --mem-gbs 150`).
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SIM = os.path.join(ROOT, "build", "benchmarks", "sim", "sim_scaling")
RESULTS = os.path.join(HERE, "results")
CORES = "8,16,32,64,128,256"
NODES = "1,2,4"
LARGE = ["--layers", "24", "--d-model", "1024", "--heads", "16",
         "--seq", "1024", "--batch", "16", "--policy", "nothing_saveable"]
TARGETS = [(64, 2, 0.8), (128, 4, 0.6)]  # cores, nodes, efficiency (large)


def run(args):
    cmd = [SIM, "--json", "--cores", CORES, "--nodes", NODES] + args
    print("running:", " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(out.stdout)


def simulate(extra):
    default = run(extra)
    overhead_us = default["costs"]["overhead_s"] * 1e6
    large = run(LARGE + ["--costs", "isolated",
                         "--overhead-us", "%.3f" % overhead_us] + extra)
    return {"default": default, "large": large}


def efficiency(result, nodes, placed):
    rows = [r for r in result["scaling"]
            if r["nodes"] == nodes and r["placed"] == placed]
    rows.sort(key=lambda r: r["cores"])
    return [r["cores"] for r in rows], [r["efficiency"] for r in rows]


def title(name, result):
    m = result["model"]
    return ("%s: %d layers, d_model %d, seq %d, batch %d, %s\n(costs: %s)"
            % (name, m["layers"], m["d_model"], m["seq"], m["batch"],
               m["policy"], "traced steps" if result["costs"]["source"] ==
               "trace" else "tiles timed in isolation"))


def plot(data, png_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharey=True)
    colors = {1: "tab:blue", 2: "tab:orange", 4: "tab:green"}
    for ax, (name, result) in zip(axes, (("default", data["default"]),
                                         ("large", data["large"]))):
        for nodes in sorted({r["nodes"] for r in result["scaling"]}):
            for placed in ((True,) if nodes == 1 else (True, False)):
                xs, ys = efficiency(result, nodes, placed)
                label = ("1 node" if nodes == 1 else "%d nodes, %s" % (
                    nodes, "placed" if placed else "unplaced"))
                ax.plot(xs, ys, "o-" if placed else "s--",
                        color=colors.get(nodes, "tab:gray"), label=label)
        if name == "large":
            for cores, nodes, target in TARGETS:
                ax.plot([cores], [target], "k^", markersize=8)
            ax.plot([], [], "k^", label="targets (placed)")
        ax.set_xscale("log", base=2)
        ax.set_xticks([8, 16, 32, 64, 128, 256])
        ax.set_xticklabels(["8", "16", "32", "64", "128", "256"])
        ax.set_xlabel("cores")
        ax.set_title(title(name, result), fontsize=9)
        ax.grid(alpha=0.3)
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("predicted parallel efficiency")
    fig.suptitle("remat step on a simulated Sapphire Rapids server "
                 "(%g GB/s memory, %g GB/s links per node)"
                 % (data["large"]["machine"]["mem_gbs"],
                    data["large"]["machine"]["link_gbs"]))
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return png_path


def main(argv):
    replot = "--replot" in argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    json_path = os.path.join(RESULTS, "scaling.json")
    if replot:
        with open(json_path) as f:
            data = json.load(f)
    else:
        data = simulate(extra)
        os.makedirs(RESULTS, exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
    print(plot(data, os.path.join(RESULTS, "scaling.png")))


if __name__ == "__main__":
    main(sys.argv[1:])
