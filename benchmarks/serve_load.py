#!/usr/bin/env python3
"""The load test of issue 28, and the release test test_serve_load_full
(about 2.5 minutes; the sanitizer runs have tests/serve_test.py's short
`load` mode, whose client code this script imports).

  benchmarks/serve_load.py build/tools/remat-serve build/tools/remat-train
      [--clients 32] [--seconds 60] [--job-steps 1000000]

It trains the test's model (a 1-layer d32 byte model, as serve_test.py's
make_model), then:
  1. starts a server and sends generate requests from --clients
     concurrent clients for --seconds with no job;
  2. the same while a job trains (--job-steps outlasts the phase: one job,
     cancelled with DELETE when the phase ends);
  3. runs the same job alone on a fresh, idle server and cancels it once
     it has done as many steps: its losses are the reference.
For phases 1 and 2 it reports error responses (anything but 200; must be
0), requests/s, p50 and p99 latency, and the server's RSS sampled every
second (flat after warm-up: over the last half, the largest median of
3 consecutive samples within 5% of the smallest); and
whether the job's losses under load are bitwise those of the job alone.
Exits 1 when a check fails."""
import argparse
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "tests"))
import serve_test as st  # noqa: E402  (the client code, not copied)


def percentile(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1,
                             int(len(sorted_values) * q))]


class RssSampler:
    """The server's RSS every second, on its own thread."""

    def __init__(self, pid):
        self.pid, self.samples, self.stop = pid, [], threading.Event()
        self.t = threading.Thread(target=self.run)
        self.t.start()

    def run(self):
        while not self.stop.wait(1.0):
            self.samples.append(st.rss_kib(self.pid))

    def end(self):
        self.stop.set()
        self.t.join()
        return self.samples


def phase(srv, clients, seconds, label, during=None):
    """`clients` clients for `seconds`; `during` runs on this thread
    meanwhile. Returns the phase's figures."""
    results = []
    rss = RssSampler(srv.p.pid)
    start = time.time()
    ts = st.clients(srv, clients, seconds, results)
    if during is not None:
        during(start + seconds)
    for t in ts:
        t.join()
    wall = time.time() - start
    samples = rss.end()
    ok = sorted(lat for s, lat in results if s == 200)
    errors = [s for s, _ in results if s != 200]
    tail = samples[len(samples) // 2:]
    level = rss_level(tail)
    out = {"label": label, "requests": len(ok), "errors": len(errors),
           "error_kinds": sorted(set(map(str, errors)))[:5],
           "requests_per_s": len(ok) / wall,
           "p50_ms": 1000 * percentile(ok, 0.50) if ok else None,
           "p99_ms": 1000 * percentile(ok, 0.99) if ok else None,
           "rss_kib_first": samples[0] if samples else 0,
           "rss_kib_tail_min": min(tail) if tail else 0,
           "rss_kib_tail_max": max(tail) if tail else 0,
           "rss_kib_level_min": min(level) if level else 0,
           "rss_kib_level_max": max(level) if level else 0}
    print("%s: %d clients, %.0f s: %d answers, %d errors, %.1f requests/s, "
          "p50 %.1f ms, p99 %.1f ms; RSS %d KiB after 1 s, %d to %d KiB over "
          "the last %d s" % (label, clients, wall, out["requests"],
                             out["errors"], out["requests_per_s"],
                             out["p50_ms"] or 0, out["p99_ms"] or 0,
                             out["rss_kib_first"], out["rss_kib_tail_min"],
                             out["rss_kib_tail_max"], len(tail)), flush=True)
    print("  RSS every 5 s (KiB): %s" % " ".join(map(str, samples[::5])),
          flush=True)
    st.check(out["errors"] == 0, "%s: %d error responses %r" %
             (label, out["errors"], out["error_kinds"]))
    st.check(out["rss_kib_level_max"] <= 1.05 * out["rss_kib_level_min"],
             "%s: RSS not flat over the last %d s: its level (median of "
             "3 samples) %d to %d KiB" %
             (label, len(tail), out["rss_kib_level_min"],
              out["rss_kib_level_max"]))
    return out


def rss_level(tail):
    """The RSS level: the median of each 3 consecutive samples. A leak
    raises it as it raises every sample; one sample's transient (a
    response or a step's buffers between two frees, 2.3 MB once in a CI
    run) does not move it."""
    return [sorted(tail[i:i + 3])[1] for i in range(len(tail) - 2)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("serve")
    ap.add_argument("train")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--job-steps", type=int, default=1000000)
    a = ap.parse_args()
    st.SERVE, st.TRAIN = os.path.abspath(a.serve), os.path.abspath(a.train)
    job = {"steps": a.job_steps, "lr": 0.001, "save_every": 500}
    with tempfile.TemporaryDirectory() as tmp:
        data, model = st.make_model(tmp)
        # 1. and 2. one server, without then with the job (one job for the
        # whole phase: --job-steps outlasts it; cancelled at its end)
        srv = st.Server(tmp, model, "--max-queue", "64")
        free = phase(srv, a.clients, a.seconds, "no job")
        jobs = []

        def train_meanwhile(end):
            _, doc, _ = srv.request("POST", "/v1/jobs", dict(job, data=data))
            jid = doc["id"]
            # watched on /metrics: GET /v1/jobs/ID answers with every loss
            # so far, and five of those a second (0.4 MB each at 35000
            # steps) grew the server's RSS from 30 to 65 MB in 60 s (glibc
            # keeps each connection thread's arena)
            while time.time() < end:
                m = srv.request("GET", "/metrics")[1]
                if (st.metric(m, 'remat_jobs{state="running"}') +
                        st.metric(m, 'remat_jobs{state="queued"}')) == 0:
                    break
                time.sleep(0.2)
            # the phase ends: cancel it at a task boundary
            jobs.append(srv.request("DELETE", "/v1/jobs/" + jid)[1])

        busy = phase(srv, a.clients, a.seconds, "a job training",
                     train_meanwhile)
        st.expect(srv.stop()[0], 0, "exit status after SIGTERM")
        n = len(jobs[0]["losses"])
        st.expect(jobs[0]["state"], "cancelled", "the job's state")
        st.check(n > 0 and n < a.job_steps, "the job ran through the phase "
                 "(%d of %d steps)" % (n, a.job_steps))
        # 3. the same job alone on an idle server, cancelled once it has
        # done as many steps: its losses are the reference
        srv = st.Server(tmp, model, job_dir="alone")
        t0 = time.time()
        _, doc, _ = srv.request("POST", "/v1/jobs", dict(job, data=data))
        jid = doc["id"]
        while True:
            d = srv.request("GET", "/v1/jobs/" + jid)[1]
            if d["step"] >= n or d["state"] not in ("queued", "running"):
                break
            time.sleep(0.5)
        alone = srv.request("DELETE", "/v1/jobs/" + jid)[1]["losses"]
        alone_s = time.time() - t0
        st.expect(srv.stop()[0], 0, "the job-alone server's exit")
        st.check(len(alone) >= n, "the job alone reached step %d (%d)" %
                 (n, len(alone)))
        print("job alone: %d steps in %.1f s (%.0f steps/s)" %
              (len(alone), alone_s, len(alone) / alone_s), flush=True)
        same = jobs[0]["losses"] == alone[:n]
        st.check(same, "the job's %d losses under load are bitwise the "
                 "job's alone" % n)
        print("job under load: %d steps (%.0f steps/s); losses bitwise "
              "those of the job alone: %s" %
              (n, n / a.seconds, "yes" if same else "NO"), flush=True)
        print("requests/s with a job / without: %.2f; p99 %.1f ms / %.1f ms"
              % (busy["requests_per_s"] / free["requests_per_s"],
                 busy["p99_ms"] or 0, free["p99_ms"] or 0))
    if st.failures:
        print("%d checks failed" % len(st.failures))
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
