#!/usr/bin/env python3
"""Step time and memory of every remat policy against everything_saveable.

Runs build/benchmarks/bench_train once per policy and round, each run in its
own process, rounds interleaved so that all policies see the same machine,
and reports median ratios against everything_saveable of the same rounds.
Also checks that grad_checksum is identical for every policy and for 1 and
2 threads. Writes benchmarks/results/policies.json.

usage: compare_policies.py [--rounds R] [--steps S] [--threads N] [--quick]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "build", "benchmarks", "bench_train")
POLICIES = [
    "everything_saveable",
    "dots_saveable",
    "dots_with_no_batch_dims_saveable",
    "save_only_these_names:attn_probs,ffn_act",
    "nothing_saveable",
]


def bench(policy, threads, steps, extra):
    cmd = [BENCH, "--json", "--policy", policy, "--threads", str(threads),
           "--steps", str(steps)] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true",
                    help="a tiny model, for a smoke test")
    args = ap.parse_args()
    extra = []
    if args.quick:
        extra = ["--layers", "2", "--d-model", "64", "--heads", "4",
                 "--seq", "32", "--batch", "2", "--vocab", "32"]
    runs = {p: [] for p in POLICIES}
    for r in range(args.rounds):
        for p in POLICIES:
            runs[p].append(bench(p, args.threads, args.steps, extra))
            print(f"round {r + 1}/{args.rounds} {p}: "
                  f"{runs[p][-1]['step_s_median']:.3f} s", file=sys.stderr)
    one_thread = bench("nothing_saveable", 1, 1, extra)
    base = runs["everything_saveable"]
    rows = []
    for p in POLICIES:
        ratios = [a["step_s_median"] / b["step_s_median"]
                  for a, b in zip(runs[p], base)]
        last = runs[p][-1]
        rows.append({
            "policy": p,
            "step_s_median": statistics.median(x["step_s_median"] for x in runs[p]),
            "time_ratio": statistics.median(ratios),
            "peak_bytes": last["peak_bytes"],
            "peak_ratio": last["peak_bytes"] / base[-1]["peak_bytes"],
            "activation_peak_bytes": last["activation_peak_bytes"],
            "activation_ratio": last["activation_peak_bytes"] / base[-1]["activation_peak_bytes"],
            "predicted_peak_bytes": last["predicted_peak_bytes"],
            "peak_rss_bytes": last["peak_rss_bytes"],
            "recompute_flops": last["recompute_flops"],
            "mfu": statistics.median(x["mfu"] for x in runs[p]),
            "grad_checksum": last["grad_checksum"],
        })
    sums = {x["grad_checksum"] for p in POLICIES for x in runs[p]}
    sums.add(one_thread["grad_checksum"])
    print(f"{'policy':42} {'step s':>7} {'time/all':>8} {'peak MiB':>9} "
          f"{'peak/all':>8} {'act/all':>7} {'mfu':>5}")
    for row in rows:
        print(f"{row['policy']:42} {row['step_s_median']:7.3f} "
              f"{row['time_ratio']:8.3f} {row['peak_bytes'] / 2**20:9.1f} "
              f"{row['peak_ratio']:8.3f} {row['activation_ratio']:7.3f} "
              f"{row['mfu']:5.2f}")
    same = len(sums) == 1
    print("grad_checksum identical across policies and 1/2 threads:",
          "yes" if same else f"NO {sorted(sums)}")
    os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
    name = "policies_quick.json" if args.quick else "policies.json"
    with open(os.path.join(ROOT, "benchmarks", "results", name), "w") as f:
        json.dump({"threads": args.threads, "rounds": args.rounds,
                   "rows": rows, "checksums_identical": same}, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
