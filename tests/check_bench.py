"""Runs bench_train on a tiny model and checks its JSON: every field present
and sane, with --compare-threads the 1-thread run side by side, with the
same gradients bitwise and a speedup computed from the two medians, and
with --accum the micro-batches' FLOPs, tokens and activation peak."""
import json
import subprocess
import sys

exe = sys.argv[1]
tiny = ["--layers", "2", "--d-model", "64", "--heads", "4", "--seq", "32",
        "--batch", "2", "--vocab", "64", "--steps", "3", "--threads", "2"]


def run(extra):
    out = subprocess.run([exe] + tiny + extra, check=True, capture_output=True,
                         text=True, timeout=100).stdout
    lines = out.strip().splitlines()
    assert len(lines) == 1, f"expected one JSON line on stdout, got {out!r}"
    return json.loads(lines[0])


def check_common(r):
    assert r["threads"] == 2 and r["steps"] == 3, r
    assert r["step_s_median"] > 0 and r["tokens_per_s"] > 0, r
    assert 0 < r["loss"] < r["first_loss"] + 1.0, r
    assert r["peak_bytes"] >= r["activation_peak_bytes"] > 0, r
    assert r["matmul_roofline_gflops"] > 0 and r["mfu"] > 0, r


plain = run([])
check_common(plain)
assert "speedup" not in plain, plain

both = run(["--compare-threads"])
check_common(both)
assert both["checksum_matches_1_thread"] is True, both
assert both["grad_checksum"] == plain["grad_checksum"], (both, plain)
ratio = both["step_s_median_1_thread"] / both["step_s_median"]
assert abs(both["speedup"] - ratio) <= 1e-3 * ratio + 1e-4, both
assert both["roofline_speedup"] > 0, both

# --accum 2 of 1 row: the FLOPs and tokens of the 2-row step, the
# activation peak of one row.
acc = run(["--batch", "1", "--accum", "2"])
check_common(acc)
assert plain["accum"] == 1 and acc["accum"] == 2, (plain, acc)
assert acc["activation_peak_bytes"] < plain["activation_peak_bytes"], (acc, plain)
assert abs(acc["flops_per_step"] - plain["flops_per_step"]) <= 1e-6 * plain["flops_per_step"], acc
tokens = 2 * 32 / acc["step_s_median"]
assert abs(acc["tokens_per_s"] - tokens) <= 1e-3 * tokens, acc

bad = subprocess.run([exe, "--threads", "0"], capture_output=True, text=True)
assert bad.returncode == 2, bad
assert "--threads '0': expected a whole number >= 1" in bad.stderr, bad.stderr
print("check_bench: ok")
