"""Runs bench_serve on tiny models with two training threads and checks its
JSON: each phase (alone, normal, interactive) with its forward count and
p50 <= p99 <= max, training step times in the two phases that train, and
usage errors refused with exit status 2."""
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
for bad in (["2"], ["8", "0"], ["8", "1", "30"], ["8", "1", "32", "9"]):
    r = subprocess.run([exe] + bad, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("usage: bench_serve"), \
        (bad, r.returncode, r.stderr)
print("ok")
