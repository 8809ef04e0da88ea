#!/usr/bin/python3
"""Memory and step time against sequence length, fused against materialized
attention, for each policy.

The model is the one of issue 15's table (4 layers, d_model 256, 8 heads),
at batch 1. For each (T, policy) one bench_train process runs both models
with --attention both (steps interleaved, so both see the same machine);
materialized is skipped past --max-materialized (its T x T matrices take
B*H*T*T*4 bytes each: 2 GiB at T = 8192). Writes
benchmarks/results/attention.json and attention.png and prints a markdown
table.

usage: /usr/bin/python3 benchmarks/attention_sweep.py [--seqs 512,1024,...]
         [--steps S] [--threads N] [--policies P,P] [--max-materialized T]
         [--quick]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "build", "benchmarks", "bench_train")
RESULTS = os.path.join(ROOT, "benchmarks", "results")


def bench(seq, policy, attention, args):
    cmd = [BENCH, "--json", "--layers", str(args.layers), "--d-model",
           str(args.d_model), "--heads", str(args.heads), "--seq", str(seq),
           "--batch", "1", "--steps", str(args.steps), "--threads",
           str(args.threads), "--policy", policy, "--attention", attention]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line]


def plot(rows, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (mem, tim) = plt.subplots(1, 2, figsize=(11, 4.2))
    keys = sorted({(r["attention"], r["policy"]) for r in rows})
    for att, pol in keys:
        pts = sorted((r["seq"], r) for r in rows
                     if r["attention"] == att and r["policy"] == pol)
        xs = [p[0] for p in pts]
        style = ("o-" if att == "fused" else "s--")
        label = f"{att}, {pol}"
        mem.plot(xs, [p[1]["peak_bytes"] / 2**20 for p in pts], style,
                 label=label)
        tim.plot(xs, [p[1]["step_s_median"] for p in pts], style, label=label)
    for ax, what in ((mem, "peak_bytes (MiB)"), (tim, "step time (s)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
    mem.legend(fontsize=7)
    fig.suptitle("fused vs materialized attention, 4 layers, d_model 256, "
                 "8 heads, batch 1")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", default="512,1024,2048,4096,8192")
    ap.add_argument("--policies", default="nothing_saveable,everything_saveable")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-materialized", type=int, default=4096)
    ap.add_argument("--quick", action="store_true",
                    help="a tiny model and short sequences (smoke test)")
    ap.add_argument("--out", default=os.path.join(RESULTS, "attention"))
    args = ap.parse_args()
    args.layers, args.d_model, args.heads = 4, 256, 8
    if args.quick:
        args.layers, args.d_model, args.heads = 1, 32, 2
        args.seqs, args.max_materialized = "64,128", 64
    rows = []
    for seq in [int(s) for s in args.seqs.split(",")]:
        for pol in args.policies.split(","):
            att = "both" if seq <= args.max_materialized else "fused"
            for r in bench(seq, pol, att, args):
                rows.append(r)
                print(f"T={seq} {pol} {r['attention']}: "
                      f"{r['step_s_median']:.3f} s, peak "
                      f"{r['peak_bytes'] / 2**20:.0f} MiB", file=sys.stderr)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump({"model": {"layers": args.layers, "d_model": args.d_model,
                             "heads": args.heads, "batch": 1,
                             "threads": args.threads, "steps": args.steps},
                   "rows": rows}, f, indent=1)
    print("| T | policy | attention | peak_bytes | activation peak | step s |"
          " fused/materialized time |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        peer = [p for p in rows if p["seq"] == r["seq"] and
                p["policy"] == r["policy"] and p["attention"] == "materialized"]
        ratio = ""
        if r["attention"] == "fused" and peer:
            ratio = f"{r['step_s_median'] / peer[0]['step_s_median']:.2f}"
        print(f"| {r['seq']} | {r['policy']} | {r['attention']} | "
              f"{r['peak_bytes'] / 2**20:.0f} MiB | "
              f"{r['activation_peak_bytes'] / 2**20:.0f} MiB | "
              f"{r['step_s_median']:.3f} | {ratio} |")
    plot(rows, args.out + ".png")


if __name__ == "__main__":
    main()
