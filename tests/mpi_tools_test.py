#!/usr/bin/env python3
"""remat-train and bench_train under mpirun -np 2: rank 0 alone prints,
world_size is 2, param_checksums holds both ranks' checksums, equal to each
other and to param_checksum, and bench_train reports the communication
figures (comm_bytes: every gradient byte once a step, plus the 104-byte
agreement). Usage: mpi_tools_test.py HAVE_MPI REMAT_TRAIN BENCH_TRAIN; exits
77 (skipped) only when remat was built without MPI."""
import json
import os
import subprocess
import sys

if sys.argv[1] != "1":
    print("remat was built without MPI: skipped")
    sys.exit(77)
train, bench = sys.argv[2], sys.argv[3]
here = os.path.dirname(os.path.abspath(__file__))
# Sanitizer builds: Open MPI's own leaks are suppressed (see mpi_test.sh).
lsan = ("suppressions=%s/lsan_mpi.supp:print_suppressions=0:"
        "fast_unwind_on_malloc=0" % here)
if os.environ.get("LSAN_OPTIONS"):
    lsan += ":" + os.environ["LSAN_OPTIONS"]
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1",
           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_mca_base_component_disable_dlclose="1", LSAN_OPTIONS=lsan)
mpirun = ["mpirun", "--oversubscribe", "-x", "LSAN_OPTIONS", "-np", "2"]


def run(cmd):
    p = subprocess.run(mpirun + cmd, env=env, capture_output=True, text=True,
                       timeout=240)
    if p.returncode != 0:
        sys.exit("%s failed (%d): %s" % (cmd[0], p.returncode, p.stderr))
    return [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]


def check_checksums(last, what):
    sums = last["param_checksums"]
    if last["world_size"] != 2 or len(sums) != 2:
        sys.exit("%s: world_size %s, param_checksums %s" %
                 (what, last["world_size"], sums))
    if sums[0] != sums[1] or sums[0] != last["param_checksum"]:
        sys.exit("%s: ranks' parameters differ: %s" % (what, sums))


lines = run([train, "--steps", "6", "--batch", "8", "--threads", "1",
             "--json"])
steps = [l for l in lines if "step" in l and "done" not in l]
done = [l for l in lines if l.get("done")]
if len(steps) != 6 or len(done) != 1:  # rank 0's lines only
    sys.exit("remat-train printed %d step lines and %d results, expected 6 "
             "and 1" % (len(steps), len(done)))
check_checksums(done[0], "remat-train")

lines = run([bench, "--layers", "2", "--d-model", "64", "--heads", "2",
             "--seq", "32", "--batch", "2", "--vocab", "64", "--steps", "2",
             "--threads", "1", "--json"])
if len(lines) != 1:
    sys.exit("bench_train printed %d JSON lines, expected 1" % len(lines))
b = lines[0]
check_checksums(b, "bench_train")
d, v, L = 64, 64, 2
# wte, wpe, per block (ln1, qkv, proj, ln2, fc, proj), ln_f, head (no bias)
params = v * d + 32 * d + L * (12 * d * d + 13 * d) + 2 * d + d * v
# The agreement: the loss (a double) and 12 int64s (NaN/Inf, the failure,
# and five values the update uses with their negations).
agreement = 8 + 12 * 8
if b["comm_bytes"] != 4 * params + agreement or b["buckets"] < 1:
    sys.exit("bench_train: comm_bytes %d, expected %d (params %d)" %
             (b["comm_bytes"], 4 * params + agreement, params))
if not (b["comm_s"] > 0 and 0 <= b["exposed_comm_s"]):
    sys.exit("bench_train: comm_s %s, exposed_comm_s %s" %
             (b["comm_s"], b["exposed_comm_s"]))
print("ok: remat-train and bench_train under mpirun -np 2")
