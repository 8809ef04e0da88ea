"""Runs bench_serve on tiny models with two training threads and checks its
JSON: each phase (alone, normal, interactive) with its forward count and
p50 <= p99 <= max, training step times in the two phases that train, the
training alone (its steps' median) and the longest task of its DAG, issue
28's targets computed from the figures beside them, and usage errors
refused with exit status 2."""
import json
import subprocess
import sys

exe = sys.argv[1]
out = subprocess.run([exe, "8", "1", "32", "2"], capture_output=True,
                     text=True, timeout=600)
if out.returncode != 0:
    sys.exit(f"bench_serve failed ({out.returncode}): {out.stderr}")
doc = json.loads(out.stdout)
assert doc["trainers"] == 2, doc
assert doc["train_model"] == "gpt 1x32 seq 64 batch 4", doc
for name in ("alone", "normal", "interactive"):
    p = doc[name]
    assert p["forwards"] == 8, (name, p)
    assert 0 < p["p50_ms"] <= p["p99_ms"] <= p["max_ms"], (name, p)
    if name == "alone":
        assert p["train_step_median_ms"] == 0, p
    else:
        assert p["train_step_median_ms"] > 0, (name, p)
# the training alone, the longest task of its DAG, and the targets, each
# limit computed from the figures printed beside it
alone = doc["alone"]
assert doc["train_alone"]["steps"] >= 2 * 4, doc["train_alone"]  # a round
step_alone = doc["train_alone"]["train_step_median_ms"]
longest = doc["longest_task_ms"]
assert 0 < longest < step_alone, (longest, step_alone)
# a task's name, as the trace names it ("h0.ffn.w_in update")
assert doc["longest_task"] not in ("", "?"), doc["longest_task"]
for name in ("normal", "interactive"):
    t = doc["targets"][name]
    assert t["p99_ms"] == doc[name]["p99_ms"], (name, t)
    assert t["step_median_ms"] == doc[name]["train_step_median_ms"], t
    assert abs(t["p99_limit_ms"] - (2 * alone["p99_ms"] + longest)) < 2e-3, t
    assert t["forwards_per_step"] > 0, t
    assert abs(t["step_limit_ms"] - (1.1 * step_alone +
                                     t["forward_work_ms"])) < 2e-3, t
    assert t["p99_ok"] == (t["p99_ms"] <= t["p99_limit_ms"]), t
    assert t["step_ok"] == (t["step_median_ms"] <= t["step_limit_ms"]), t
for bad in (["2"], ["8", "0"], ["8", "1", "30"], ["8", "1", "32", "9"]):
    r = subprocess.run([exe] + bad, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("usage: bench_serve"), \
        (bad, r.returncode, r.stderr)
print("ok")
