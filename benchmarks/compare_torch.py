#!/usr/bin/python3
"""Side-by-side comparison of remat with PyTorch on the same GPT.

The model here is runtime/graph/gpt.c in PyTorch: same parameter names, shapes,
initialization and maths. Each configuration runs in its own process (so
that peak RSS is its own) on the same thread count: PyTorch without and with
torch.utils.checkpoint on every block, and build/benchmarks/bench_train with
everything_saveable and nothing_saveable. Prints a table, writes
benchmarks/results/compare_torch.json and compare_torch.png.

  --check BIN   correctness instead: BIN is build/tools/remat-grads; the
                weights and one batch's gradients it writes are compared
                with PyTorch's (float64) within 1e-4 relative per tensor;
                then remat's bf16 gradients (--precision bf16) with
                PyTorch's under torch.autocast("cpu", dtype=torch.bfloat16)
                and with float64's: cosine similarity at least 0.999 per
                tensor, loss within 1%.

bf16 rows (--precision bf16 or both): remat with --precision bf16 beside
PyTorch under autocast bf16 (its bf16 matmuls run in oneDNN).

Run with Debian's python (/usr/bin/python3) where python3-torch lives.
"""
import argparse
import json
import math
import os
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# ---- the model ----

def param_shapes(L, D, T, V):
    """(name, shape, init) in remat's creation order (runtime/graph/gpt.c)."""
    out = [("wte", (V, D), 0.02), ("wpe", (T, D), 0.01)]
    proj = 0.02 / math.sqrt(2.0 * L)
    for l in range(L):
        b = "h%d." % l
        out += [(b + "ln1.gamma", (D,), "ones"), (b + "ln1.beta", (D,), "zeros"),
                (b + "attn.w_qkv", (3 * D, D), 0.02), (b + "attn.b_qkv", (3 * D,), "zeros"),
                (b + "attn.w_out", (D, D), proj), (b + "attn.b_out", (D,), "zeros"),
                (b + "ln2.gamma", (D,), "ones"), (b + "ln2.beta", (D,), "zeros"),
                (b + "ffn.w_in", (4 * D, D), 0.02), (b + "ffn.b_in", (4 * D,), "zeros"),
                (b + "ffn.w_out", (D, 4 * D), proj), (b + "ffn.b_out", (D,), "zeros")]
    out += [("lnf.gamma", (D,), "ones"), ("lnf.beta", (D,), "zeros"),
            ("lm_head", (V, D), 0.02)]
    return out


def make_params(L, D, T, V, dtype, seed=0):
    import torch
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape, init in param_shapes(L, D, T, V):
        if init == "ones":
            t = torch.ones(shape, dtype=dtype)
        elif init == "zeros":
            t = torch.zeros(shape, dtype=dtype)
        else:
            t = torch.randn(shape, generator=g, dtype=dtype) * init
        params[name] = t.requires_grad_(True)
    return params


def block(p, l, x, H):
    """Pre-LN block: x + attn(ln1(x)), then + ffn(ln2(.)); y = x W^T + b."""
    import torch
    import torch.nn.functional as F
    b = "h%d." % l
    B, T, D = x.shape
    hd = D // H
    h = F.layer_norm(x, (D,), p[b + "ln1.gamma"], p[b + "ln1.beta"], 1e-5)
    qkv = F.linear(h, p[b + "attn.w_qkv"], p[b + "attn.b_qkv"])
    q, k, v = (t.reshape(B, T, H, hd).transpose(1, 2) for t in qkv.split(D, dim=2))
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    probs = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
    att = (probs @ v).transpose(1, 2).reshape(B, T, D)
    x1 = x + F.linear(att, p[b + "attn.w_out"], p[b + "attn.b_out"])
    h = F.layer_norm(x1, (D,), p[b + "ln2.gamma"], p[b + "ln2.beta"], 1e-5)
    f = F.gelu(F.linear(h, p[b + "ffn.w_in"], p[b + "ffn.b_in"]), approximate="tanh")
    return x1 + F.linear(f, p[b + "ffn.w_out"], p[b + "ffn.b_out"])


def gpt_loss(p, tokens, targets, L, H, checkpoint=False):
    """Mean cross-entropy over all B*T tokens."""
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint as ckpt
    T = tokens.shape[1]
    x = p["wte"][tokens] + p["wpe"][:T]
    for l in range(L):
        if checkpoint:
            x = ckpt(lambda y, l=l: block(p, l, y, H), x, use_reentrant=False)
        else:
            x = block(p, l, x, H)
    D = x.shape[-1]
    x = F.layer_norm(x, (D,), p["lnf.gamma"], p["lnf.beta"], 1e-5)
    logits = F.linear(x, p["lm_head"])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# ---- safetensors (the format is simple enough; the package is not in Debian) ----

def read_safetensors(path):
    import numpy as np
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", (name, e["dtype"])
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(data[base + a:base + b], dtype="<f4").reshape(e["shape"])
    return out


# ---- correctness: remat-grads against PyTorch ----

def check(remat_grads, L=2, D=32, H=4, T=16, B=4, V=29, threads=2,
          attention="materialized"):
    import numpy as np
    import torch
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "run")
        out = subprocess.run(
            [remat_grads, "--layers", str(L), "--d-model", str(D), "--heads", str(H),
             "--seq", str(T), "--batch", str(B), "--vocab", str(V),
             "--threads", str(threads), "--attention", attention, prefix],
            check=True, capture_output=True, text=True).stdout
        remat_loss = json.loads(out)["loss"]
        weights = read_safetensors(prefix + ".weights.safetensors")
        grads = read_safetensors(prefix + ".grads.safetensors")
        batch = np.fromfile(prefix + ".batch.i32", dtype="<i4").reshape(2, B, T)
    names = [n for n, _, _ in param_shapes(L, D, T, V)]
    assert list(weights) == names, "parameter names or order differ"
    p = {n: torch.tensor(weights[n], dtype=torch.float64, requires_grad=True) for n in names}
    tokens = torch.tensor(batch[0], dtype=torch.long)
    targets = torch.tensor(batch[1], dtype=torch.long)
    loss = gpt_loss(p, tokens, targets, L, H)
    loss.backward()
    worst, failed = 0.0, []
    loss_rel = abs(loss.item() - remat_loss) / abs(loss.item())
    print("%s attention, loss: remat %.7f  torch %.7f  rel diff %.2e"
          % (attention, remat_loss, loss.item(), loss_rel))
    for n in names:
        ref = p[n].grad.numpy()
        scale = max(float(np.abs(ref).max()), 1e-12)
        rel = float(np.abs(grads[n].astype(np.float64) - ref).max()) / scale
        worst = max(worst, rel)
        if rel > 1e-4:
            failed.append(n)
        print("  %-18s max|diff|/max|grad| = %.2e" % (n, rel))
    print("worst tensor: %.2e (limit 1e-4)" % worst)
    if loss_rel > 1e-5 or failed:
        print("FAILED: loss or gradients differ: %s" % ", ".join(failed or ["loss"]))
        return 1
    return 0


def run_remat_grads(remat_grads, tmp, L, D, H, T, B, V, threads, attention,
                    precision):
    import numpy as np
    prefix = os.path.join(tmp, "run-" + precision)
    out = subprocess.run(
        [remat_grads, "--layers", str(L), "--d-model", str(D), "--heads", str(H),
         "--seq", str(T), "--batch", str(B), "--vocab", str(V),
         "--threads", str(threads), "--attention", attention,
         "--precision", precision, prefix],
        check=True, capture_output=True, text=True).stdout
    batch = np.fromfile(prefix + ".batch.i32", dtype="<i4").reshape(2, B, T)
    return (json.loads(out)["loss"], read_safetensors(prefix + ".weights.safetensors"),
            read_safetensors(prefix + ".grads.safetensors"), batch)


def cosine(a, b):
    import numpy as np
    a = a.astype(np.float64).ravel()
    b = b.astype(np.float64).ravel()
    return float(a @ b / math.sqrt(float(a @ a) * float(b @ b)))


def check_bf16(remat_grads, L=2, D=64, H=4, T=32, B=4, V=29, threads=2,
               attention="materialized"):
    """remat's bf16 gradients against PyTorch autocast bf16 and float64."""
    import torch
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        remat_loss, weights, grads, batch = run_remat_grads(
            remat_grads, tmp, L, D, H, T, B, V, threads, attention, "bf16")
    names = [n for n, _, _ in param_shapes(L, D, T, V)]
    tokens = torch.tensor(batch[0], dtype=torch.long)
    targets = torch.tensor(batch[1], dtype=torch.long)
    refs = {}
    for kind, dtype in (("autocast", torch.float32), ("float64", torch.float64)):
        p = {n: torch.tensor(weights[n], dtype=dtype, requires_grad=True) for n in names}
        if kind == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = gpt_loss(p, tokens, targets, L, H)
        else:
            loss = gpt_loss(p, tokens, targets, L, H)
        loss.float().backward()
        refs[kind] = (loss.item(), {n: p[n].grad.float().numpy() for n in names})
    failed = []
    for kind, (loss, g) in refs.items():
        rel = abs(loss - remat_loss) / abs(loss)
        worst = min(cosine(grads[n], g[n]) for n in names)
        print("bf16 %s attention vs torch %s: loss remat %.6f torch %.6f (rel %.1e), "
              "worst gradient cosine %.6f" % (attention, kind, remat_loss, loss, rel, worst))
        if rel > 0.01 or worst < 0.999:
            failed.append(kind)
            for n in names:
                print("  %-18s cosine %.6f" % (n, cosine(grads[n], g[n])))
    if failed:
        print("FAILED: bf16 gradients differ from %s" % ", ".join(failed))
        return 1
    return 0


# ---- one benchmark configuration (run in its own process) ----

def bench_batch(B, T, V):
    """bench_train's batch: an LCG for tokens, targets (7 tok + 3) mod V."""
    x, tok = 12345, []
    for _ in range(B * T):
        x = (x * 1664525 + 1013904223) & 0xFFFFFFFF
        tok.append((x >> 16) % V)
    return tok, [(t * 7 + 3) % V for t in tok]


def torch_worker(a):
    import torch
    torch.set_num_threads(a.threads)
    import_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    p = make_params(a.layers, a.d_model, a.seq, a.vocab, torch.float32)
    tok, tgt = bench_batch(a.batch, a.seq, a.vocab)
    tokens = torch.tensor(tok).reshape(a.batch, a.seq)
    targets = torch.tensor(tgt).reshape(a.batch, a.seq)
    opt = torch.optim.AdamW(p.values(), lr=1e-4, weight_decay=0.01)
    times = []
    for s in range(a.steps + 1):  # step 0 is the warm-up
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if a.autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = gpt_loss(p, tokens, targets, a.layers, a.heads, a.checkpoint)
        else:
            loss = gpt_loss(p, tokens, targets, a.layers, a.heads, a.checkpoint)
        loss.backward()
        opt.step()
        if s > 0:
            times.append(time.perf_counter() - t0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"step_s_median": statistics.median(times), "peak_rss_bytes": rss,
                      "import_rss_bytes": import_rss, "loss": loss.item()}))


# ---- the comparison ----

def run_config(a, kind, layers):
    common = ["--layers", str(layers), "--d-model", str(a.d_model), "--heads", str(a.heads),
              "--seq", str(a.seq), "--batch", str(a.batch), "--vocab", str(a.vocab),
              "--steps", str(a.steps), "--threads", str(a.threads)]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads),
               OPENBLAS_NUM_THREADS=str(a.threads))
    if kind.startswith("torch"):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker"] + common
        if "+ckpt" in kind:
            cmd.append("--checkpoint")
        if kind.startswith("torch-bf16"):
            cmd.append("--autocast")
    else:
        cmd = [a.bench_train, "--policy", kind.split(":")[1]] + common
        if kind.startswith("remat-bf16"):
            cmd += ["--precision", "bf16"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    r = json.loads(out.strip().splitlines()[-1])
    row = {"kind": kind, "layers": layers, "step_s": r["step_s_median"],
           "peak_rss_bytes": r["peak_rss_bytes"]}
    for key in ("import_rss_bytes", "peak_bytes", "mfu"):
        if key in r:
            row[key] = r[key]
    return row


KINDS = {"f32": ["torch", "torch+ckpt", "remat:everything_saveable",
                 "remat:nothing_saveable"],
         "bf16": ["torch-bf16", "torch-bf16+ckpt", "remat-bf16:everything_saveable",
                  "remat-bf16:nothing_saveable"]}
PEER = {"remat:everything_saveable": "torch", "remat:nothing_saveable": "torch+ckpt",
        "remat-bf16:everything_saveable": "torch-bf16",
        "remat-bf16:nothing_saveable": "torch-bf16+ckpt"}


def print_table(rows, a):
    print("D=%d H=%d T=%d B=%d V=%d, %d threads, median of %d steps after a warm-up"
          % (a.d_model, a.heads, a.seq, a.batch, a.vocab, a.threads, a.steps))
    print("| layers | configuration | step time (s) | peak RSS (MiB) | time / peer | RSS / peer |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    by = {(r["kind"], r["layers"]): r for r in rows}
    for r in rows:
        peer = by.get((PEER.get(r["kind"]), r["layers"]))
        ratio_t = "%.2f" % (r["step_s"] / peer["step_s"]) if peer else ""
        ratio_m = "%.2f" % (r["peak_rss_bytes"] / peer["peak_rss_bytes"]) if peer else ""
        print("| %d | %s | %.3f | %.0f | %s | %s |" % (
            r["layers"], r["kind"], r["step_s"], r["peak_rss_bytes"] / 2**20, ratio_t, ratio_m))
    print("(peer of everything_saveable: torch; of nothing_saveable: torch+ckpt;"
          " torch-bf16 is PyTorch under torch.autocast(\"cpu\", dtype=torch.bfloat16))")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="a tiny configuration")
    ap.add_argument("--bench-train", default=os.path.join(ROOT, "build/benchmarks/bench_train"))
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--check", metavar="REMAT_GRADS", help="gradient check instead")
    ap.add_argument("--precision", choices=["f32", "bf16", "both"], default="f32")
    ap.add_argument("--autocast", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        a.layers = a.layers[0]
        return torch_worker(a)
    if a.check:
        return max(check(a.check, threads=a.threads),
                   check_bf16(a.check, threads=a.threads))
    if a.quick:
        a.layers, a.d_model, a.heads, a.seq, a.batch, a.vocab = [1, 2], 64, 4, 32, 4, 64
    rows = []
    kinds = sum((KINDS[p] for p in ("f32", "bf16") if a.precision in (p, "both")), [])
    for layers in a.layers:
        for kind in kinds:
            rows.append(run_config(a, kind, layers))
            print("  %-26s layers %2d: %.3f s/step, %.0f MiB" % (
                kind, layers, rows[-1]["step_s"], rows[-1]["peak_rss_bytes"] / 2**20),
                file=sys.stderr, flush=True)
    print_table(rows, a)
    os.makedirs(a.out, exist_ok=True)
    name = "compare_torch_quick" if a.quick else "compare_torch"
    if a.precision != "f32":
        name += "_" + a.precision
    meta = {"precision": a.precision,
            "d_model": a.d_model, "heads": a.heads, "seq": a.seq, "batch": a.batch,
            "vocab": a.vocab, "threads": a.threads, "steps": a.steps,
            "date": time.strftime("%Y-%m-%d %H:%M")}
    with open(os.path.join(a.out, name + ".json"), "w") as f:
        json.dump({"config": meta, "rows": rows}, f, indent=1)
    sys.path.insert(0, HERE)
    import plot_compare
    png = plot_compare.plot(os.path.join(a.out, name + ".json"), os.path.join(a.out, name + ".png"))
    print("wrote %s and %s" % (os.path.join(a.out, name + ".json"), png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
