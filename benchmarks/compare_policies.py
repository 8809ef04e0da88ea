#!/usr/bin/env python3
"""Step time and memory of every remat policy against everything_saveable.

Runs build/benchmarks/bench_train once per policy and round, each run in its
own process, rounds interleaved so that all policies see the same machine,
and reports median ratios against everything_saveable of the same rounds.
Also checks that grad_checksum is identical for every policy and for 1 and
2 threads (per precision). Writes benchmarks/results/policies.json
(policies_bf16.json, policies_both.json with --precision).

usage: compare_policies.py [--rounds R] [--steps S] [--threads N]
                           [--precision f32|bf16|both] [--quick]
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
    """bench_train's JSON lines: one, or f32 then bf16 with --precision both."""
    cmd = [BENCH, "--json", "--policy", policy, "--threads", str(threads),
           "--steps", str(steps)] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def clamp(x, lo, hi):
    return max(lo, min(hi, x))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", choices=["f32", "bf16", "both"], default="f32",
                    help="both: every policy in f32 and bf16 side by side in one "
                    "process (bench_train --precision both), with bf16/f32 ratios")
    ap.add_argument("--quick", action="store_true",
                    help="a tiny model, for a smoke test")
    args = ap.parse_args()
    extra = ["--precision", args.precision]
    if args.quick:
        extra += ["--layers", "2", "--d-model", "64", "--heads", "4",
                  "--seq", "32", "--batch", "2", "--vocab", "32"]
    precs = ["f32", "bf16"] if args.precision == "both" else [args.precision]
    runs = {(p, q): [] for p in POLICIES for q in precs}
    for r in range(args.rounds):
        for p in POLICIES:
            for line in bench(p, args.threads, args.steps, extra):
                runs[(p, line["precision"])].append(line)
            print(f"round {r + 1}/{args.rounds} {p}: " + ", ".join(
                f"{q} {runs[(p, q)][-1]['step_s_median']:.3f} s" for q in precs),
                file=sys.stderr)
    one_thread = bench("nothing_saveable", 1, 1, extra)
    rows = []
    for q in precs:
        base = runs[("everything_saveable", q)]
        for p in POLICIES:
            rs = runs[(p, q)]
            ratios = [a["step_s_median"] / b["step_s_median"] for a, b in zip(rs, base)]
            last = rs[-1]
            row = {
                "policy": p,
                "precision": q,
                "step_s_median": statistics.median(x["step_s_median"] for x in rs),
                "time_ratio": statistics.median(ratios),
                "peak_bytes": last["peak_bytes"],
                "peak_ratio": last["peak_bytes"] / base[-1]["peak_bytes"],
                "activation_peak_bytes": last["activation_peak_bytes"],
                "activation_ratio": last["activation_peak_bytes"] / base[-1]["activation_peak_bytes"],
                "predicted_peak_bytes": last["predicted_peak_bytes"],
                "peak_rss_bytes": last["peak_rss_bytes"],
                "recompute_flops": last["recompute_flops"],
                "mfu": statistics.median(x["mfu"] for x in rs),
                "grad_checksum": last["grad_checksum"],
            }
            if "step_ratio_vs_f32" in last:
                # bf16 against f32 of the same rounds; the target scales with
                # R, oneDNN's bf16 over f32 matmul throughput measured beside
                R = statistics.median(x["bf16_roofline_ratio"] for x in rs)
                row.update({
                    "bf16_roofline_ratio": R,
                    "step_ratio_vs_f32": statistics.median(x["step_ratio_vs_f32"] for x in rs),
                    "step_ratio_target": clamp(1.2 / R, 0.3, 0.6),
                    "activation_peak_ratio_vs_f32": last["activation_peak_ratio_vs_f32"],
                })
            rows.append(row)
    print(f"{'policy':42} {'prec':>4} {'step s':>7} {'time/all':>8} {'peak MiB':>9} "
          f"{'peak/all':>8} {'act/all':>7} {'mfu':>5} {'vs f32 time':>11} "
          f"{'(target)':>8} {'vs f32 act':>10}")
    for row in rows:
        vs = ""
        if "step_ratio_vs_f32" in row:
            vs = (f" {row['step_ratio_vs_f32']:11.3f} {row['step_ratio_target']:8.2f}"
                  f" {row['activation_peak_ratio_vs_f32']:10.3f}")
        print(f"{row['policy']:42} {row['precision']:>4} {row['step_s_median']:7.3f} "
              f"{row['time_ratio']:8.3f} {row['peak_bytes'] / 2**20:9.1f} "
              f"{row['peak_ratio']:8.3f} {row['activation_ratio']:7.3f} "
              f"{row['mfu']:5.2f}{vs}")
    same = True
    for q in precs:
        sums = {x["grad_checksum"] for p in POLICIES for x in runs[(p, q)]}
        sums |= {x["grad_checksum"] for x in one_thread if x["precision"] == q}
        ok = len(sums) == 1
        same = same and ok
        print(f"{q}: grad_checksum identical across policies and 1/{args.threads} threads:",
              "yes" if ok else f"NO {sorted(sums)}")
    os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
    name = "policies_quick" if args.quick else "policies"
    if args.precision != "f32":
        name += "_" + args.precision
    with open(os.path.join(ROOT, "benchmarks", "results", name + ".json"), "w") as f:
        json.dump({"threads": args.threads, "rounds": args.rounds,
                   "precision": args.precision,
                   "rows": rows, "checksums_identical": same}, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
