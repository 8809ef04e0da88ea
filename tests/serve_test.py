#!/usr/bin/env python3
"""remat-serve on the loopback with real HTTP clients (http.client).
Usage: serve_test.py HAVE REMAT_SERVE REMAT_TRAIN MODE, MODE one of
  init    --init DIR (tiny Llama and GPT-2 directories written here):
          generate against remat-train --init --prompt, a job's losses
          against remat-train --init --data, its weights served, kill -9
          and resume; startup errors (bad DIR, --load with --init)
  api     every endpoint and every refusal with its exact status and message;
          generate against remat-train --prompt (the same tokens); a job's
          losses against remat-train's; /metrics' counts
  load    8 clients for 10 s without and then with a job training: no error,
          requests/s and p50/p99 printed; the job's losses bitwise those of
          the same job run alone
  faults  a client gone mid-body and mid-request, a body slower than
          --timeout, SIGTERM under load (exit 0 within 10 s, the job
          resumed by the next start, bitwise), kill -9 during a job and a
          restart that resumes it from its last whole checkpoint, bitwise
Exits 77 (skipped) only when remat-serve was not built (no libmicrohttpd)."""
import http.client
import json
import math
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

# the programs, from the command line (or set by a script that imports
# this one for its client code, as benchmarks/serve_load.py does)
SERVE = TRAIN = MODE = None
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


def expect(got, want, what):
    check(got == want, "%s: got %r, expected %r" % (what, got, want))


WORDS = "the quick brown fox jumps over a lazy dog and runs away".split()


def make_data(path, n, seed):
    x = seed
    out = []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2 ** 31
        out.append(WORDS[x % len(WORDS)])
    with open(path, "w") as f:
        f.write(" ".join(out))


MODEL = ["--layers", "1", "--d-model", "32", "--heads", "2", "--seq", "32"]


def make_model(tmp):
    data = os.path.join(tmp, "data.txt")
    model = os.path.join(tmp, "model.safetensors")
    make_data(data, 6000, 1)
    subprocess.run([TRAIN, "--data", data] + MODEL +
                   ["--batch", "4", "--steps", "20", "--threads", "2",
                    "--save", model], check=True, capture_output=True)
    return data, model


class Server:
    def __init__(self, tmp, model, *extra, job_dir="jobs", source="--load"):
        self.err = open(os.path.join(tmp, "serve.err"), "a+")
        self.err.seek(0, os.SEEK_END)
        self.at = self.err.tell()  # this server's lines start here
        self.p = subprocess.Popen(
            [SERVE, source, model, "--port", "0", "--threads", "2",
             "--batch", "4", "--job-dir", os.path.join(tmp, job_dir)] +
            list(extra), stdout=subprocess.DEVNULL, stderr=self.err,
            cwd=tmp)
        self.port = None
        deadline = time.time() + 20
        while self.port is None and time.time() < deadline:
            self.err.seek(self.at)
            for line in self.err.read().splitlines():
                if "listening on" in line:
                    self.port = int(line.rsplit(":", 1)[1])
            if self.p.poll() is not None:
                break
            time.sleep(0.05)
        if self.port is None:
            self.err.seek(self.at)
            raise SystemExit("remat-serve did not start:\n" + self.err.read())

    def request(self, method, path, body=None, raw=None, timeout=60):
        c = http.client.HTTPConnection("127.0.0.1", self.port,
                                       timeout=timeout)
        data = raw if raw is not None else (
            json.dumps(body) if body is not None else None)
        c.request(method, path, body=data,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        text = r.read().decode()
        headers = dict(r.getheaders())
        c.close()
        try:
            doc = json.loads(text)
        except ValueError:
            doc = text
        return r.status, doc, headers

    def stop(self, sig=signal.SIGTERM, timeout=10):
        start = time.time()
        self.p.send_signal(sig)
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = "still running after %d s" % timeout
        return rc, time.time() - start

    def log(self):
        self.err.seek(self.at)
        return self.err.read()


def refused(srv, method, path, body, status, message, raw=None):
    got, doc, headers = srv.request(method, path, body, raw=raw)
    expect((got, doc), (status, {"error": message}),
           "%s %s %.200s" % (method, path, raw if raw is not None else body))
    return headers


def kill_mid_job(srv, job):
    """Starts `job` on `srv` and kills the server (-9) once the job has a
    whole checkpoint (every 50 steps) and is more than 10 steps past one;
    returns the job's id and the step it was killed at."""
    doc = srv.request("POST", "/v1/jobs", job)[1]
    jid = doc["id"]
    deadline = time.time() + 60
    while time.time() < deadline:
        doc = srv.request("GET", "/v1/jobs/" + jid)[1]
        if doc["checkpoint_step"] >= 50 and doc["step"] % 50 > 10:
            break
        time.sleep(0.002)
    srv.p.kill()
    srv.p.wait()
    return jid, doc["step"]


def wait_job(srv, jid, states=("done",), timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        _, doc, _ = srv.request("GET", "/v1/jobs/" + jid)
        if doc.get("state") in states:
            return doc
        time.sleep(0.05)
    raise SystemExit("job %s did not reach %s: %r" % (jid, states, doc))


def prompt_cli(model, prompt, n, temperature, seed):
    out = subprocess.run(
        [TRAIN, "--load", model, "--prompt", prompt, "--tokens", str(n),
         "--temperature", str(temperature), "--seed", str(seed),
         "--threads", "2"], check=True, capture_output=True).stdout
    return list(out[len(prompt):-1])


def utf8_text(tokens):
    """The text the server gives: well-formed UTF-8 sequences as they are,
    U+FFFD for each other byte (NUL included)."""
    out, i = [], 0
    while i < len(tokens):
        for k in (1, 2, 3, 4):
            try:
                ch = bytes(tokens[i:i + k]).decode("utf-8")
            except UnicodeDecodeError:
                continue
            if len(ch) == 1 and ch != "\0":
                out.append(ch)
                i += k
                break
        else:
            out.append("\ufffd")
            i += 1
    return "".join(out)


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


GEN_FIELDS = "prompt, max_tokens, temperature, top_k, seed"


def test_api(tmp):
    data, model = make_model(tmp)
    srv = Server(tmp, model, "--max-body", "4096", "--max-queue", "1",
                 "--max-tokens", "4000")
    expect(srv.request("GET", "/healthz")[:2], (200, {"status": "ok"}),
           "GET /healthz")
    # generate: the tokens remat-train --prompt gives (greedy, sampled)
    for temp, seed in ((0, 1), (1, 5), (0.7, 9)):
        st, doc, _ = srv.request("POST", "/v1/generate",
                                 {"prompt": "the quick", "max_tokens": 20,
                                  "temperature": temp, "seed": seed})
        expect(st, 200, "generate status")
        expect(doc["tokens"], prompt_cli(model, "the quick", 20, temp, seed),
               "generate T=%g seed %d against remat-train --prompt" %
               (temp, seed))
        check(doc["seconds"] > 0, "seconds > 0")
    st, doc, _ = srv.request("POST", "/v1/generate",
                             {"prompt": [116, 104, 101], "max_tokens": 5,
                              "top_k": 3, "temperature": 1.0, "seed": 2})
    expect((st, len(doc["tokens"])), (200, 5), "generate from ids")
    check(all(0 <= t < 256 for t in doc["tokens"]), "ids in the vocabulary")
    expect(doc["text"], utf8_text(doc["tokens"]), "text of the tokens")
    # at a high temperature the bytes are mostly not UTF-8
    st, doc, _ = srv.request("POST", "/v1/generate",
                             {"prompt": "a", "max_tokens": 400,
                              "temperature": 20, "seed": 4})
    expect(doc["text"], utf8_text(doc["tokens"]), "text of random bytes")
    check("\ufffd" in doc["text"], "random bytes hold invalid UTF-8")
    # every refusal of /v1/generate
    G = "/v1/generate"
    refused(srv, "POST", G, None, 400, "the body is not valid JSON (at byte "
            "10 of 11): POST /v1/generate takes one JSON object with the "
            "fields " + GEN_FIELDS, raw='{"prompt": ')
    refused(srv, "POST", G, None, 400, "the body is not valid JSON (at byte "
            "0 of 0): POST /v1/generate takes one JSON object with the "
            "fields " + GEN_FIELDS, raw="")
    refused(srv, "POST", G, [1, 2], 400, "the body is an array: POST "
            "/v1/generate takes one JSON object with the fields " +
            GEN_FIELDS)
    refused(srv, "POST", G, None, 400, "the body has more after its JSON "
            "value (at byte 15): POST /v1/generate takes one JSON object",
            raw='{"prompt":"a"} {}')
    refused(srv, "POST", G, {"prompt": "a", "foo": 1}, 400,
            "unknown field 'foo': POST /v1/generate accepts " + GEN_FIELDS)
    refused(srv, "POST", G, None, 400, "field 'prompt' is given twice: give "
            "each field once", raw='{"prompt":"a","prompt":"b"}')
    refused(srv, "POST", G, {"max_tokens": 3}, 400, "'prompt' is missing: "
            "give an array of token ids or a string")
    refused(srv, "POST", G, {"prompt": 7}, 400, "'prompt' is a number: "
            "expected an array of token ids or a string")
    refused(srv, "POST", G, {"prompt": []}, 400, "'prompt' is empty: give "
            "at least one token")
    refused(srv, "POST", G, {"prompt": [1, 256]}, 400, "'prompt'[1] is 256: "
            "token ids are integers from 0 to 255 (the model's vocabulary)")
    refused(srv, "POST", G, {"prompt": [-1]}, 400, "'prompt'[0] is -1: "
            "token ids are integers from 0 to 255 (the model's vocabulary)")
    refused(srv, "POST", G, {"prompt": [1.5]}, 400, "'prompt'[0] is 1.5: "
            "token ids are integers from 0 to 255 (the model's vocabulary)")
    refused(srv, "POST", G, {"prompt": ["a"]}, 400, "'prompt'[0] is a "
            "string: token ids are integers from 0 to 255 (the model's "
            "vocabulary)")
    refused(srv, "POST", G, {"prompt": "a", "max_tokens": "x"}, 400,
            "'max_tokens' is a string: expected an integer from 1 to 4000")
    refused(srv, "POST", G, {"prompt": "a", "max_tokens": 0}, 400,
            "'max_tokens' is 0: expected an integer from 1 to 4000")
    refused(srv, "POST", G, {"prompt": "a", "max_tokens": 4001}, 400,
            "'max_tokens' is 4001: this server generates at most 4000 "
            "tokens a request (--max-tokens)")
    refused(srv, "POST", G, {"prompt": "a", "temperature": -1}, 400,
            "'temperature' is -1: expected a number from 0 and at most 100")
    refused(srv, "POST", G, {"prompt": "a", "temperature": None}, 400,
            "'temperature' is null: expected a number from 0 and at most 100")
    refused(srv, "POST", G, {"prompt": "a", "top_k": 257}, 400,
            "'top_k' is 257: expected an integer from 0 to 256")
    refused(srv, "POST", G, {"prompt": "a", "seed": True}, 400,
            "'seed' is a boolean: expected an integer from 0 to "
            "9007199254740992")
    refused(srv, "POST", G, None, 413, "the body is over 4096 bytes "
            "(--max-body)", raw='{"prompt": "%s"}' % ("x" * 5000))
    # a full queue: one long request holds the only place
    held = {}
    t = threading.Thread(target=lambda: held.update(r=srv.request(
        "POST", G, {"prompt": "a", "max_tokens": 4000})))
    t.start()
    deadline = time.time() + 10
    while time.time() < deadline:
        m = srv.request("GET", "/metrics")[1]
        if metric(m, "remat_generate_queue_depth") == 1:
            break
        time.sleep(0.005)
    headers = refused(srv, "POST", G, {"prompt": "a"}, 503, "the queue is "
                      "full: 1 requests are waiting or running (--max-queue "
                      "1); retry later")
    expect(headers.get("Retry-After"), "1", "503's Retry-After")
    t.join()
    expect((held["r"][0], len(held["r"][1]["tokens"])), (200, 4000),
           "the request that held the queue")
    # paths and methods
    refused(srv, "GET", "/v2/nothing", None, 404, "no endpoint "
            "'/v2/nothing': the endpoints are POST /v1/generate, POST "
            "/v1/jobs, GET and DELETE /v1/jobs/ID, POST /v1/models/load, GET "
            "/metrics and GET /healthz")
    h = refused(srv, "GET", G, None, 405, "method GET is not allowed on "
                "/v1/generate: it takes POST")
    expect(h.get("Allow"), "POST", "405's Allow")
    h = refused(srv, "PUT", "/v1/jobs/job-1", None, 405, "method PUT is not "
                "allowed on /v1/jobs/ID: it takes GET, DELETE")
    expect(h.get("Allow"), "GET, DELETE", "405's Allow for a job")
    refused(srv, "DELETE", "/metrics", None, 405, "method DELETE is not "
            "allowed on /metrics: it takes GET")
    refused(srv, "GET", "/v1/jobs/job-99", None, 404, "no job 'job-99': ids "
            "are those POST /v1/jobs returned")
    refused(srv, "DELETE", "/v1/jobs/nope", None, 404, "no job 'nope': ids "
            "are those POST /v1/jobs returned")
    # jobs: refusals
    J = "/v1/jobs"
    refused(srv, "POST", J, {"steps": 3}, 400, "'data' is missing: give the "
            "path of a training file on the server, in the format of the "
            "model's data")
    refused(srv, "POST", J, {"data": data}, 400, "'steps' is missing: give "
            "the number of training steps, 1 to 1000000")
    refused(srv, "POST", J, {"data": data, "steps": 2, "lr": 0}, 400,
            "'lr' is 0: expected a number above 0 and at most 1")
    # above 0 as a double, 0 as the f32 the job trains with
    refused(srv, "POST", J, {"data": data, "steps": 2, "lr": 1e-60}, 400,
            "'lr' is %.17g, 0 as an f32: expected a number above 0 and at "
            "most 1" % 1e-60)
    refused(srv, "POST", J, {"data": data, "steps": 2, "epochs": 1}, 400,
            "unknown field 'epochs': POST /v1/jobs accepts data, steps, lr, "
            "policy, budget, save, save_every")
    refused(srv, "POST", J, {"data": "-", "steps": 2}, 400, "'data' is '-': "
            "give the path of a file on the server (the server's standard "
            "input is not a job's data)")
    refused(srv, "POST", J, {"data": data, "steps": 2, "budget": -1},
            400, "'budget' is -1: expected an integer from 0 to "
            "9007199254740992")
    refused(srv, "POST", J, {"data": data, "steps": 2, "budget": "lots"},
            400, "'budget' is 'lots': expected bytes as an integer or a "
            "string such as \"800MB\" or \"1.5GiB\"")
    st, doc, _ = srv.request("POST", J, {"data": "/nonexistent/x.txt",
                                         "steps": 2})
    expect(st, 400, "a missing data file")
    check(doc["error"].startswith("'data': --data '/nonexistent/x.txt'"),
          "a missing file's message: %r" % doc)
    refused(srv, "POST", J, {"data": data, "steps": 2,
                             "policy": "no_such_policy"}, 400,
            "'policy': unknown remat policy 'no_such_policy': expected one "
            "of everything_saveable, nothing_saveable, dots_saveable, "
            "checkpoint_dots, dots_with_no_batch_dims_saveable, "
            "checkpoint_dots_with_no_batch_dims, "
            "save_only_these_names:NAME[,NAME...], "
            "save_any_names_but_these:NAME[,NAME...], "
            "save_anything_except_these_names:NAME[,NAME...], "
            "save_from_both_policies:P+Q, auto")
    # a job: its losses are remat-train's on the same data and options
    save = os.path.join(tmp, "tuned.safetensors")
    st, doc, _ = srv.request("POST", J, {"data": data, "steps": 30,
                                         "lr": 0.001, "save": save,
                                         "save_every": 10,
                                         "policy": "nothing_saveable"})
    expect((st, doc), (200, {"id": "job-1"}), "POST /v1/jobs")
    doc = wait_job(srv, "job-1")
    expect((doc["step"], doc["steps"], len(doc["losses"]),
            doc["checkpoint_step"]), (30, 30, 30, 30), "the finished job")
    check(doc["peak_bytes"] > 0 and doc["peak"]["params"] > 0 and
          doc["tokens_per_s"] > 0, "job stats %r" % doc)
    expect(doc["eta_s"], None, "a finished job's ETA")
    check(os.path.exists(save), "the job's save file")
    ref = subprocess.run([TRAIN, "--load", model, "--data", data, "--batch",
                          "4", "--steps", "30", "--lr", "0.001", "--threads",
                          "2", "--json"], check=True,
                         capture_output=True, text=True).stdout
    ref = [json.loads(l)["loss"] for l in ref.splitlines() if '"step"' in l]
    expect(["%.6f" % x for x in doc["losses"]], ["%.6f" % x for x in ref],
           "the job's losses against remat-train --load --data")
    refused(srv, "DELETE", "/v1/jobs/job-1", None, 409, "job 'job-1' is "
            "done: only a queued or running job can be cancelled")
    # a cancel: stops at a step boundary with a checkpoint of that step
    st, doc, _ = srv.request("POST", J, {"data": data, "steps": 100000,
                                         "save_every": 0})
    expect((st, doc), (200, {"id": "job-2"}), "a long job")
    wait_job(srv, "job-2", ("running",))
    time.sleep(0.3)
    st, doc, _ = srv.request("DELETE", "/v1/jobs/job-2")
    expect((st, doc["state"]), (200, "cancelled"), "DELETE a running job")
    print("cancelled at step %d, checkpoint of step %d" %
          (doc["step"], doc["checkpoint_step"]))
    check(0 < doc["step"] < 100000 and doc["checkpoint_step"] == doc["step"],
          "cancelled at a step with its checkpoint: %r" %
          {k: doc[k] for k in ("step", "checkpoint_step")})
    # models/load: a job's weights change the answers, --load's restore them
    before = srv.request("POST", G, {"prompt": "the", "max_tokens": 12})[1]
    refused(srv, "POST", "/v1/models/load", {"path": "x", "job": "job-1"},
            400, "give one of 'path' (a safetensors file or checkpoint on "
            "the server) and 'job' (a job's id)")
    refused(srv, "POST", "/v1/models/load", {"job": "job-7"}, 404,
            "no job 'job-7': ids are those POST /v1/jobs returned")
    st, doc, _ = srv.request("POST", "/v1/models/load",
                             {"path": os.path.join(tmp, "missing.st")})
    expect(st, 400, "loading a missing file")
    expect(srv.request("POST", G, {"prompt": "the", "max_tokens": 12})[1]
           ["tokens"], before["tokens"], "a failed load changes nothing")
    st, doc, _ = srv.request("POST", "/v1/models/load", {"job": "job-1"})
    expect((st, doc), (200, {"loaded": save}), "load job-1's weights")
    tuned = srv.request("POST", G, {"prompt": "the", "max_tokens": 12})[1]
    expect(tuned["tokens"], prompt_cli(save, "the", 12, 0, 1),
           "the tuned weights' tokens")
    check(tuned["tokens"] != before["tokens"], "the tuned model differs")
    st, doc, _ = srv.request("POST", "/v1/models/load", {"path": model})
    expect(srv.request("POST", G, {"prompt": "the", "max_tokens": 12})[1]
           ["tokens"], before["tokens"], "--load's weights again")
    # metrics count what was answered
    m = srv.request("GET", "/metrics")[1]
    expect(metric(m, 'remat_requests_total{endpoint="generate",'
                  'status="400"}'), 20.0, "generate 400s counted")
    expect(metric(m, 'remat_requests_total{endpoint="generate",'
                  'status="413"}'), 1.0, "413 counted")
    expect(metric(m, 'remat_requests_total{endpoint="generate",'
                  'status="503"}'), 1.0, "503 counted")
    expect(metric(m, 'remat_request_seconds_count{endpoint="generate"}'),
           metric(m, 'remat_request_seconds_bucket{endpoint="generate",'
                  'le="+Inf"}'), "histogram count")
    expect(metric(m, 'remat_jobs{state="done"}'), 1.0, "done jobs")
    expect(metric(m, 'remat_jobs{state="cancelled"}'), 1.0,
           "cancelled jobs")
    check(metric(m, "remat_job_steps_total") >= 31, "steps counted")
    check(metric(m, 'remat_job_peak_bytes{job="job-1",category="params"}')
          > 0, "peak bytes by category")
    expect(metric(m, "remat_generate_queue_depth"), 0.0, "queue depth")
    # a job's own policy and budget (its graph's, not the server's
    # nothing_saveable and no budget): remat-train's losses with that
    # policy, and its plan recomputes nothing where job-1's did
    st, doc, _ = srv.request("POST", J, {"data": data, "steps": 30,
                                         "lr": 0.001, "save_every": 0,
                                         "policy": "everything_saveable"})
    expect((st, doc), (200, {"id": "job-3"}), "a job with its own policy")
    doc = wait_job(srv, "job-3")
    ref = subprocess.run([TRAIN, "--load", model, "--data", data, "--batch",
                          "4", "--steps", "30", "--lr", "0.001", "--threads",
                          "2", "--policy", "everything_saveable", "--json"],
                         check=True, capture_output=True, text=True).stdout
    ref = [json.loads(l)["loss"] for l in ref.splitlines() if '"step"' in l]
    expect(["%.6f" % x for x in doc["losses"]], ["%.6f" % x for x in ref],
           "job-3's losses against remat-train --policy everything_saveable")
    job1 = srv.request("GET", "/v1/jobs/job-1")[1]
    check(job1["peak"]["recomputed"] > 0 and doc["peak"]["recomputed"] == 0,
          "recomputed peaks: job-1 (nothing_saveable) %d, job-3 "
          "(everything_saveable) %d" % (job1["peak"]["recomputed"],
                                        doc["peak"]["recomputed"]))
    # a budget no plan fits fails that job alone, with the planner's words
    st, doc, _ = srv.request("POST", J, {"data": data, "steps": 2,
                                         "budget": 4096})
    expect((st, doc), (200, {"id": "job-4"}), "a job with a tiny budget")
    doc = wait_job(srv, "job-4", ("failed",))
    check(doc.get("error", "").startswith(
        "building the job's graph: memory budget of 4096 bytes (0.00 MiB) "
        "is infeasible: the smallest feasible budget for this graph is "),
        "job-4's error: %r" % doc.get("error"))
    expect(srv.request("GET", "/healthz")[0], 200, "healthz after job-4")
    rc, secs = srv.stop()
    expect(rc, 0, "exit status after SIGTERM (%s)" % srv.log()[-400:])


def load_request(k, i):
    return {"prompt": "the %d" % k, "max_tokens": 8, "temperature": 0.8,
            "seed": i}


def clients(srv, n, seconds, results, tokens=None):
    """n threads send generate requests for `seconds`; results gets
    (status, latency) for each, tokens[(k, i)] the tokens of client k's
    first three."""
    end = time.time() + seconds

    def run(k):
        i = 0
        while time.time() < end:
            t0 = time.time()
            try:
                st, doc, _ = srv.request("POST", "/v1/generate",
                                         load_request(k, i), timeout=20)
                if st != 200 and st != 503:
                    print("answer %d: %r" % (st, doc), flush=True)
                if tokens is not None and i < 3 and st == 200:
                    tokens[(k, i)] = doc["tokens"]
            except (ConnectionError, OSError) as e:
                st = "connection: %s" % e
            except Exception as e:  # a bad answer: counted as an error
                st = "error: %r" % e
            results.append((st, time.time() - t0))
            if isinstance(st, str) and "refused" in st:
                break  # the server is gone
            i += 1
    ts = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in ts:
        t.start()
    return ts


def summary(results, seconds, label):
    lat = sorted(l for s, l in results if s == 200)
    if not lat:
        return
    p50 = lat[len(lat) // 2] * 1000
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
    print("%s: %d requests in %d s, %.1f requests/s, p50 %.1f ms, p99 "
          "%.1f ms" % (label, len(lat), seconds, len(lat) / seconds, p50,
                       p99), flush=True)


JOB = {"steps": 3000, "lr": 0.001, "save_every": 50}


def job_alone(tmp, model, data):
    srv = Server(tmp, model, job_dir="alone")
    st, doc, _ = srv.request("POST", "/v1/jobs", dict(JOB, data=data))
    doc = wait_job(srv, doc["id"])
    expect(srv.stop()[0], 0, "the job-alone server's exit")
    return doc["losses"]


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_load(tmp):
    data, model = make_model(tmp)
    alone = job_alone(tmp, model, data)
    srv = Server(tmp, model, "--max-queue", "64")
    res, batched = [], {}
    ts = clients(srv, 8, 10, res, batched)
    time.sleep(5)
    rss = [rss_kib(srv.p.pid)]
    for t in ts:
        t.join()
    rss.append(rss_kib(srv.p.pid))
    print("RSS after 5 s and 10 s of load: %d and %d KiB" % tuple(rss))
    check(rss[1] <= rss[0] * 1.05, "RSS flat after warm-up (within 5%%): "
          "%d then %d KiB" % tuple(rss))
    expect(sorted(set(s for s, _ in res), key=str), [200],
           "statuses without a job")
    summary(res, 10, "8 clients, no job")
    st, doc, _ = srv.request("POST", "/v1/jobs", dict(JOB, data=data))
    res, beside = [], {}
    ts = clients(srv, 8, 10, res, beside)
    job = wait_job(srv, doc["id"], timeout=300)
    for t in ts:
        t.join()
    expect(sorted(set(s for s, _ in res), key=str), [200],
           "statuses with a job")
    summary(res, 10, "8 clients, a job training")
    # each request alone gives the tokens it got batched with others
    expect(len(batched), 24, "requests compared")
    for key in sorted(batched):
        alone_tokens = srv.request("POST", "/v1/generate",
                                   load_request(*key))[1]["tokens"]
        expect(batched[key], alone_tokens, "request %r batched" % (key,))
        expect(beside.get(key), alone_tokens, "request %r beside a job" %
               (key,))
    check(job["losses"] == alone, "the job's losses under load are bitwise "
          "those of the job alone")
    print("job: %d steps, %.0f tokens/s" % (job["step"],
                                            job["tokens_per_s"]))
    expect(srv.stop()[0], 0, "exit status after SIGTERM")


def test_faults(tmp):
    data, model = make_model(tmp)
    alone = job_alone(tmp, model, data)
    srv = Server(tmp, model, "--timeout", "1", "--max-tokens", "100000")
    # a client that goes away mid-body, and one that goes away before its
    # answer
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Length: "
              b"100\r\n\r\n{\"prompt\":")
    s.close()
    s = socket.create_connection(("127.0.0.1", srv.port))
    body = b'{"prompt": "the", "max_tokens": 200}'
    s.sendall(b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Length: "
              b"%d\r\n\r\n%s" % (len(body), body))
    s.close()
    # a body slower than --timeout 1: the server closes the connection
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Length: "
              b"30\r\n\r\n{\"prompt\"")
    time.sleep(2.5)
    try:
        s.sendall(b': "a"}        ')
        s.settimeout(5)
        got = s.recv(100)
    except OSError:
        got = b""
    s.close()
    expect(got, b"", "a body slower than --timeout: closed, no answer")
    expect(srv.request("GET", "/healthz")[:2], (200, {"status": "ok"}),
           "healthy after the faults")
    st, doc, _ = srv.request("POST", "/v1/generate", {"prompt": "the",
                                                      "max_tokens": 4})
    expect(st, 200, "generate after the faults")
    # SIGTERM under load with a job running: exit 0 within 10 s, the job
    # checkpointed; the next start resumes it, bitwise
    st, doc, _ = srv.request("POST", "/v1/jobs", dict(JOB, data=data))
    jid = doc["id"]
    wait_job(srv, jid, ("running",))
    res, long_one = [], {}
    ts = clients(srv, 8, 30, res)
    # a request that would run for minutes: stopped 5 s after SIGTERM
    ts.append(threading.Thread(target=lambda: long_one.update(r=srv.request(
        "POST", "/v1/generate", {"prompt": "the", "max_tokens": 100000}))))
    ts[-1].start()
    time.sleep(1.0)
    rc, secs = srv.stop()
    for t in ts:
        t.join()
    st, doc, _ = long_one["r"]
    expect(st, 503, "a long request's status after SIGTERM")
    check(doc["error"].startswith("the server is shutting down: the request "
                                  "was stopped after ") and
          doc["error"].endswith(" of its 100000 tokens"),
          "a long request's message after SIGTERM: %r" % doc)
    expect(rc, 0, "exit status after SIGTERM under load (%s)" %
           srv.log()[-300:])
    check(secs < 10, "stopped in %.1f s" % secs)
    bad = [s for s, _ in res if not (s in (200, 503) or
                                     str(s).startswith("connection"))]
    expect(bad, [], "answers during the stop: 200, 503 or no connection")
    with open(os.path.join(tmp, "jobs", jid + ".state")) as f:
        state = f.read().strip()
    expect(state, "interrupted", "the job's state after SIGTERM")
    if state == "interrupted":
        srv = Server(tmp, model)
        doc = wait_job(srv, jid)
        check(doc["first_step"] > 0, "resumed after SIGTERM from step %d" %
              doc["first_step"])
        check(doc["losses"] == alone[doc["first_step"]:], "losses resumed "
              "after SIGTERM are bitwise the job's alone")
        expect(srv.stop()[0], 0, "exit after the resumed job")
    # kill -9 during a job: the restart resumes from the last whole
    # checkpoint (every 50 steps), bitwise
    srv = Server(tmp, model)
    jid, killed_at = kill_mid_job(srv, dict(JOB, data=data))
    check(0 < killed_at < 3000, "killed during the job (step %d)" % killed_at)
    srv = Server(tmp, model)
    doc = wait_job(srv, jid)
    check(doc["first_step"] > 0 and doc["first_step"] % 50 == 0 and
          doc["first_step"] <= killed_at, "resumed from a whole checkpoint: "
          "step %d (killed at %d)" % (doc["first_step"], killed_at))
    check(doc["losses"] == alone[doc["first_step"]:], "losses resumed after "
          "kill -9 are bitwise the job's alone")
    check("resuming job '%s'" % jid in srv.log(), "the restart says so")
    expect(srv.stop()[0], 0, "exit after the resumed job")


# ---- --init: a Hugging Face directory, written here without numpy (the
# layout tests/hf_check.py writes: config.json, model.safetensors) ----

def write_hf_dir(path, config, tensors):
    """tensors: name -> (shape, list of floats), written as F32."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    header, blobs, offset = {}, [], 0
    for name, (shape, values) in tensors.items():
        blob = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": shape,
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


HF_VOCAB = 50


def random_tensor(rng, shape, scale, offset=0.0):
    n = 1
    for d in shape:
        n *= d
    return (list(shape), [offset + rng.gauss(0, scale) for _ in range(n)])


def tiny_llama(path):
    """1 layer, hidden 32, 4 heads, 2 key/value heads, intermediate 48."""
    rng = random.Random(7)
    d, kvd, inter = 32, 16, 48
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": d, "intermediate_size": inter,
              "num_hidden_layers": 1, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": HF_VOCAB,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "max_position_embeddings": 64, "hidden_act": "silu",
              "tie_word_embeddings": False, "torch_dtype": "float32"}
    w = {"model.embed_tokens.weight": random_tensor(rng, (HF_VOCAB, d), 0.5)}
    p = "model.layers.0."
    w[p + "input_layernorm.weight"] = random_tensor(rng, (d,), 0.1, 1.0)
    for name, rows in (("q", d), ("k", kvd), ("v", kvd), ("o", d)):
        w[p + "self_attn.%s_proj.weight" % name] = random_tensor(
            rng, (rows, d), 0.2)
    w[p + "post_attention_layernorm.weight"] = random_tensor(rng, (d,), 0.1,
                                                             1.0)
    w[p + "mlp.gate_proj.weight"] = random_tensor(rng, (inter, d), 0.2)
    w[p + "mlp.up_proj.weight"] = random_tensor(rng, (inter, d), 0.2)
    w[p + "mlp.down_proj.weight"] = random_tensor(rng, (d, inter), 0.15)
    w["model.norm.weight"] = random_tensor(rng, (d,), 0.1, 1.0)
    w["lm_head.weight"] = random_tensor(rng, (HF_VOCAB, d), 0.4)
    write_hf_dir(path, config, w)


def tiny_gpt2(path):
    """1 layer, n_embd 32, 2 heads, 32 positions; Conv1D weights [in, out]."""
    rng = random.Random(8)
    d, P = 32, 32
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
              "n_embd": d, "n_layer": 1, "n_head": 2,
              "vocab_size": HF_VOCAB, "n_positions": P,
              "layer_norm_epsilon": 1e-5,
              "activation_function": "gelu_new", "n_inner": None}
    w = {"wte.weight": random_tensor(rng, (HF_VOCAB, d), 0.5),
         "wpe.weight": random_tensor(rng, (P, d), 0.2)}
    for ln in ("ln_1", "ln_2"):
        w["h.0.%s.weight" % ln] = random_tensor(rng, (d,), 0.1, 1.0)
        w["h.0.%s.bias" % ln] = random_tensor(rng, (d,), 0.1)
    for name, i, o in (("attn.c_attn", d, 3 * d), ("attn.c_proj", d, d),
                       ("mlp.c_fc", d, 4 * d), ("mlp.c_proj", 4 * d, d)):
        w["h.0.%s.weight" % name] = random_tensor(rng, (i, o), 0.2)
        w["h.0.%s.bias" % name] = random_tensor(rng, (o,), 0.1)
    w["ln_f.weight"] = random_tensor(rng, (d,), 0.1, 1.0)
    w["ln_f.bias"] = random_tensor(rng, (d,), 0.1)
    write_hf_dir(path, config, w)


def token_file(path, n, seed):
    """u16 ids below HF_VOCAB: a repeating pattern with noise."""
    x, ids = seed, []
    for i in range(n):
        x = (x * 1103515245 + 12345) % 2 ** 31
        ids.append((i * 7 + (x >> 16) % 3) % HF_VOCAB)
    with open(path, "wb") as f:
        f.write(struct.pack("<%dH" % n, *ids))


INIT_MODEL = ["--seq", "16", "--batch", "4"]


def init_prompt_cli(hf, prompt, n, temperature, seed, load=None):
    """remat-train --init DIR [--load FILE] --prompt IDS: the ids it
    generates after the prompt's."""
    out = subprocess.run(
        [TRAIN, "--init", hf, "--prompt", " ".join(map(str, prompt)),
         "--tokens", str(n), "--temperature", str(temperature), "--seed",
         str(seed), "--threads", "2", "--seq", "16"] +
        (["--load", load] if load else []),
        check=True, capture_output=True, text=True).stdout
    return [int(t) for t in out.split()][len(prompt):]


def startup_error(tmp, args, status, message):
    """remat-serve with `args` exits with `status` and says `message` (a
    line on stderr), before it listens."""
    try:
        r = subprocess.run([SERVE] + args + ["--port", "0", "--job-dir",
                                             os.path.join(tmp, "never")],
                           capture_output=True, text=True, timeout=20,
                           cwd=tmp)
        got = (r.returncode, r.stderr, r.stdout)
    except subprocess.TimeoutExpired as e:  # it started: killed
        got = ("still running after 20 s", e.stderr, e.stdout)
    expect(got, (status, message + "\n", ""),
           "remat-serve %s" % " ".join(args))


INIT_JOB = {"steps": 400, "lr": 0.001, "save_every": 50}


def test_init(tmp):
    llama, gpt2 = os.path.join(tmp, "llama"), os.path.join(tmp, "gpt2")
    tiny_llama(llama)
    tiny_gpt2(gpt2)
    data = os.path.join(tmp, "ids.u16")
    token_file(data, 6000, 3)
    # startup errors: exit status and message
    empty = os.path.join(tmp, "empty")
    os.makedirs(empty)
    startup_error(tmp, ["--init", empty], 1,
                  "remat-serve: --init '%s': cannot open config.json: No "
                  "such file or directory" % empty)
    bert = os.path.join(tmp, "bert")
    os.makedirs(bert)
    with open(os.path.join(bert, "config.json"), "w") as f:
        json.dump({"model_type": "bert", "hidden_size": 32}, f)
    startup_error(tmp, ["--init", bert], 1, 'remat-serve: config.json: '
                  'model_type "bert": expected "llama" or "gpt2"')
    startup_error(tmp, ["--init", llama, "--load", "x.safetensors"], 2,
                  "remat-serve: --load and --init exclude each other: give "
                  "--load FILE (a remat-train checkpoint) or --init DIR (a "
                  "Hugging Face model directory)")
    startup_error(tmp, ["--init", llama, "--layers", "3"], 2,
                  "remat-serve: --layers does not apply to --init: the "
                  "model's config.json gives the model")
    startup_error(tmp, ["--init", gpt2, "--seq", "40"], 2,
                  "remat-serve: --seq 40 is more than the 32 positions of "
                  "--init's model (n_positions)")
    startup_error(tmp, [], 2, "remat-serve: --load FILE is required: the "
                  "model to serve (a remat-train checkpoint), or --init DIR "
                  "(a Hugging Face model directory)")
    # generate: the tokens of remat-train --init DIR --prompt, greedy and
    # sampled, for both model types; batched requests as alone
    prompt = [3, 10, 17, 24]
    for hf in (llama, gpt2):
        srv = Server(tmp, hf, *INIT_MODEL, source="--init",
                     job_dir="gen-" + os.path.basename(hf))
        for temp, seed in ((0, 1), (0.8, 5)):
            st, doc, _ = srv.request("POST", "/v1/generate",
                                     {"prompt": prompt, "max_tokens": 12,
                                      "temperature": temp, "seed": seed})
            expect((st, doc.get("tokens")),
                   (200, init_prompt_cli(hf, prompt, 12, temp, seed)),
                   "%s generate T=%g against remat-train --init --prompt" %
                   (os.path.basename(hf), temp))
        refused(srv, "POST", "/v1/generate", {"prompt": [1, HF_VOCAB]}, 400,
                "'prompt'[1] is %d: token ids are integers from 0 to %d "
                "(the model's vocabulary)" % (HF_VOCAB, HF_VOCAB - 1))
        refused(srv, "POST", "/v1/generate", {"prompt": "abc"}, 400,
                "'prompt' is a string, but this model's tokens are u16 ids: "
                "give an array of ids from 0 to %d" % (HF_VOCAB - 1))
        expect(srv.stop()[0], 0, "exit after SIGTERM")
    # a job on the Llama: its losses are remat-train --init --data's (the
    # served weights, fresh AdamW moments), alone and after a kill -9 and
    # a restart, which resumes it from its last whole checkpoint
    srv = Server(tmp, llama, *INIT_MODEL, source="--init", job_dir="alone")
    st, doc, _ = srv.request("POST", "/v1/jobs", dict(INIT_JOB, data=data))
    expect((st, doc), (200, {"id": "job-1"}), "a job on --init's model")
    alone = wait_job(srv, "job-1")
    ref = subprocess.run([TRAIN, "--init", llama, "--data", data,
                          "--data-format", "u16", "--seq", "16", "--batch",
                          "4", "--steps", "400", "--lr", "0.001",
                          "--threads", "2", "--json"], check=True,
                         capture_output=True, text=True).stdout
    ref = [json.loads(l)["loss"] for l in ref.splitlines() if '"step"' in l]
    expect(["%.6f" % x for x in alone["losses"]], ["%.6f" % x for x in ref],
           "the --init job's losses against remat-train --init --data")
    # its weights, served: remat-train --init DIR --load CHECKPOINT's tokens
    st, doc, _ = srv.request("POST", "/v1/models/load", {"job": "job-1"})
    ckpt = os.path.join(tmp, "alone", "job-1.safetensors")
    expect((st, doc), (200, {"loaded": ckpt}), "load the job's weights")
    st, doc, _ = srv.request("POST", "/v1/generate",
                             {"prompt": prompt, "max_tokens": 12})
    expect(doc.get("tokens"), init_prompt_cli(llama, prompt, 12, 0, 1,
                                              load=ckpt),
           "the tuned --init model's tokens against remat-train --init "
           "--load")
    check(doc.get("tokens") != init_prompt_cli(llama, prompt, 12, 0, 1),
          "the tuned model differs from DIR's")
    expect(srv.stop()[0], 0, "exit after SIGTERM")
    srv = Server(tmp, llama, *INIT_MODEL, source="--init")
    jid, killed_at = kill_mid_job(srv, dict(INIT_JOB, data=data))
    check(0 < killed_at < 400, "killed during the job (step %d)" % killed_at)
    srv = Server(tmp, llama, *INIT_MODEL, source="--init")
    doc = wait_job(srv, jid)
    check(doc["first_step"] > 0 and doc["first_step"] % 50 == 0 and
          doc["first_step"] <= killed_at, "resumed from a whole checkpoint: "
          "step %d (killed at %d)" % (doc["first_step"], killed_at))
    print("--init job: %d losses compared with remat-train's, killed at "
          "step %d, resumed from %d" % (len(ref), killed_at,
                                        doc["first_step"]))
    check(doc["losses"] == alone["losses"][doc["first_step"]:],
          "--init job's losses resumed after kill -9 are bitwise the job's "
          "alone")
    expect(srv.stop()[0], 0, "exit after the resumed job")


if __name__ == "__main__":
    if sys.argv[1] != "1":
        print("remat-serve was not built (libmicrohttpd not found): skipped")
        sys.exit(77)
    SERVE, TRAIN, MODE = sys.argv[2], sys.argv[3], sys.argv[4]
    with tempfile.TemporaryDirectory() as tmp:
        {"api": test_api, "load": test_load, "faults": test_faults,
         "init": test_init}[MODE](tmp)
    if failures:
        print("%d checks failed" % len(failures))
        sys.exit(1)
    print("ok")
