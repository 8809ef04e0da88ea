"""Runs bench_budget on a tiny GPT and checks its plan report: one line per
budget, budgets rising from the peak of saving nothing to the peak of
saving everything, every predicted and measured peak within its budget,
regions on per-tensor sets between the two ends, no recompute at the top,
and the summary line agreeing with the rows. Then --compare-per-region over
budgets inside the span from saving nothing to dots_saveable: both runs'
peaks within each budget, the per-region plan on built-in policies only,
and the summary's counts agreeing with the rows."""
import json
import subprocess
import sys

exe = sys.argv[1]
args = ["--layers", "2", "--d-model", "64", "--heads", "4", "--seq", "32",
        "--batch", "2", "--vocab", "64", "--budgets", "8", "--steps", "2"]
out = subprocess.run([exe] + args, check=True, capture_output=True, text=True,
                     timeout=100).stdout
lines = [json.loads(line) for line in out.strip().splitlines()]
assert len(lines) == 9, out
rows, summary = lines[:-1], lines[-1]
assert summary["budgets"] == 8 and summary["all_within_budget"] is True, summary
assert rows[0]["budget"] == summary["lo_peak_bytes"], (rows[0], summary)
assert rows[-1]["budget"] == summary["hi_peak_bytes"], rows[-1]
for a, b in zip(rows, rows[1:]):
    assert a["budget"] < b["budget"], (a, b)
for r in rows:
    assert r["predicted_peak_bytes"] <= r["budget"], r
    assert r["peak_bytes"] <= r["budget"], r
    assert r["step_s_median"] > 0 and r["threads"] == 2, r
    assert len(r["plan"]) == 2, r
assert rows[-1]["recompute_flops"] == 0, rows[-1]
assert rows[0]["recompute_flops"] > 0, rows[0]
assert rows[0]["plan"][0] == "nothing_saveable", rows[0]
sets = [p for r in rows for p in r["plan"] if p.startswith("auto_tensors:")]
assert len(sets) >= 3, rows
slower = sum(b["step_s_median"] > a["step_s_median"] * (1 + summary["noise"])
             for a, b in zip(rows, rows[1:]))
assert slower == summary["slower_than_smaller_budget"], (slower, summary)
print("bench_budget: %d budgets, %d regions on per-tensor sets" %
      (len(rows), len(sets)))

builtins = {"everything_saveable", "dots_saveable",
            "dots_with_no_batch_dims_saveable", "nothing_saveable"}
out = subprocess.run([exe] + args[:-4] + [
    "--budgets", "3", "--steps", "1", "--compare-per-region", "--interior",
    "--lo-policy", "nothing_saveable", "--hi-policy", "dots_saveable"],
    check=True, capture_output=True, text=True, timeout=100).stdout
lines = [json.loads(line) for line in out.strip().splitlines()]
assert len(lines) == 4, out
rows, summary = lines[:-1], lines[-1]
assert summary["lo_policy"] == "nothing_saveable", summary
assert summary["hi_policy"] == "dots_saveable", summary
assert summary["all_within_budget"] is True, summary
for r in rows:
    assert summary["lo_peak_bytes"] < r["budget"] < summary["hi_peak_bytes"], r
    assert r["per_region_peak_bytes"] <= r["budget"], r
    assert r["per_region_predicted_peak_bytes"] <= r["budget"], r
    assert set(r["per_region_plan"]) <= builtins, r
    assert abs(r["step_ratio_to_per_region"] - r["step_s_median"] /
               r["per_region_step_s_median"]) < 1e-3, r
assert summary["faster_than_per_region"] == sum(
    r["step_s_median"] < r["per_region_step_s_median"] for r in rows), summary
assert summary["not_slower_than_per_region"] == sum(
    r["step_s_median"] <= r["per_region_step_s_median"] for r in rows), summary
print("bench_budget --compare-per-region: %d budgets" % len(rows))
