#!/usr/bin/python3
"""Meson test: each op of remat.h that Llama-family models use, and a small
Llama, against float64 PyTorch references written here.

tests/op_dump (built from tests/op_dump.c, public API only) runs one op on
parameters drawn from a seed with the loss sum(op(inputs) * w), and writes
the inputs, the op's output and every gradient. This script recomputes
them in float64: attention (F.scaled_dot_product_attention where this
PyTorch has it, else softmax(scale q k^T + mask) v written out), causal
and with boolean masks from key lengths, cross attention (S != T),
grouped-query heads as repeat_interleave of the k/v heads, a custom scale,
packed qkv, materialized and fused, with sizes that cross the fused
kernel's blocks of 128 rows; slice, mul, silu, swiglu, scale, RMSNorm and
rotate_half RoPE; dropout against its own mask (the output's zeros). f32:
max |remat - ref| / max |ref| at most 1e-4 per tensor; bf16: cosine
similarity at least 0.999 per tensor. Then a 2-layer Llama (tied and
untied head, both attention forms, three remat policies) from weights
written here: its loss and every parameter gradient within 1e-4 relative
in f32 (cosine 0.999, loss within 1%, in bf16). Exits 77 (skipped) only when this python cannot import torch or
numpy; 1 when any tensor is off.

  /usr/bin/python3 tests/torch_ops_check.py build/tests/op_dump
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError:
    print("torch or numpy not importable by %s: skipped" % sys.executable)
    sys.exit(77)

F32_LIMIT = 1e-4
BF16_COSINE = 0.999


# ---- safetensors: 8-byte header length, JSON header, little-endian data ----

def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", (name, e["dtype"])
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + a:8 + n + b],
                                  dtype="<f4").reshape(e["shape"])
    return out


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        blob = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


# ---- float64 references ----

def attention(q, k, v, H, KVH, causal=False, lens=None, scale=None):
    """q [B,T,H hd], k and v [B,S,KVH hd] -> [B,T,H hd]."""
    B, T, S = q.shape[0], q.shape[1], k.shape[1]
    hd = q.shape[2] // H
    q = q.reshape(B, T, H, hd).transpose(1, 2)
    k = k.reshape(B, S, KVH, hd).transpose(1, 2)
    v = v.reshape(B, S, KVH, hd).transpose(1, 2)
    k = k.repeat_interleave(H // KVH, dim=1)
    v = v.repeat_interleave(H // KVH, dim=1)
    if scale is not None:  # as the default 1/sqrt(hd) scale sees it
        q = q * (scale * math.sqrt(hd))
    mask = None
    if lens is not None:
        mask = (torch.arange(S)[None, :] < torch.tensor(lens)[:, None])
        mask = mask[:, None, None, :].expand(B, 1, T, S)
        if causal:
            mask = mask & torch.ones(T, S, dtype=torch.bool).tril()
    if hasattr(F, "scaled_dot_product_attention"):
        o = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal and mask is None)
    else:  # PyTorch before 2.0 (Debian's 1.13): the same math written out
        if causal and mask is None:
            mask = torch.ones(T, S, dtype=torch.bool).tril()
        s = q @ k.transpose(-1, -2) / math.sqrt(hd)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        o = torch.softmax(s, dim=-1) @ v
    return o.transpose(1, 2).reshape(B, T, H * hd)


def rmsnorm(x, gamma, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * gamma


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x, H, theta):
    """x [B,T,H hd]: Hugging Face's half-split rotary embedding."""
    B, T, D = x.shape
    hd = D // H
    inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat((ang, ang), dim=-1)[None, :, None, :]  # [1,T,1,hd]
    x = x.reshape(B, T, H, hd)
    return (x * ang.cos() + rotate_half(x) * ang.sin()).reshape(B, T, D)


def attention_case(o):
    H, KVH = o["H"], o.get("KVH", o["H"])
    causal, lens = bool(o.get("causal", 0)), o.get("lens")
    scale = o.get("scale")
    if o.get("packed"):
        hd = o.get("hd", 16)

        def packed(p):
            qkv = p["qkv"]
            q = qkv[..., :H * hd]
            k = qkv[..., H * hd:(H + KVH) * hd]
            v = qkv[..., (H + KVH) * hd:]
            return attention(q, k, v, H, KVH, causal, lens, scale)
        return packed
    return lambda p: attention(p["q"], p["k"], p["v"], H, KVH, causal, lens,
                               scale)


REFERENCES = {
    "attention": attention_case,
    "slice": lambda o: lambda p: p["x"][..., o["start"]:o["start"] + o["len"]],
    "mul": lambda o: lambda p: p["a"] * p["b"],
    "silu": lambda o: lambda p: F.silu(p["x"]),
    "swiglu": lambda o: lambda p: F.silu(p["gate"]) * p["up"],
    "scale": lambda o: lambda p: p["x"] * o["s"],
    "rmsnorm": lambda o: lambda p: rmsnorm(p["x"], p["gamma"],
                                           o.get("eps") or 1e-6),
    "rope": lambda o: lambda p: rope(p["x"], o["H"], o.get("theta") or 1e4),
}


# ---- the cases ----

def attention_cases():
    cases = []
    for name, o in (
            ("self causal H=4", dict(B=2, T=40, H=4, hd=16, causal=1)),
            ("cross T=150 S=200 H=8 KVH=2 lens",
             dict(B=2, T=150, S=200, H=8, KVH=2, hd=16, lens=[200, 97])),
            ("cross causal T=150 S=200 H=8 KVH=1 lens",
             dict(B=2, T=150, S=200, H=8, KVH=1, hd=16, causal=1,
                  lens=[180, 61])),
            ("causal H=8 KVH=2 scale=0.3",
             dict(B=2, T=70, H=8, KVH=2, hd=16, causal=1, scale=0.3)),
            ("packed T=150 H=8 KVH=2 causal lens",
             dict(B=2, T=150, H=8, KVH=2, hd=16, causal=1, packed=1,
                  lens=[150, 77])),
            ("packed H=4 bidirectional",
             dict(B=2, T=40, H=4, hd=16, packed=1))):
        for fused in (0, 1):
            form = "fused" if fused else "materialized"
            cases.append(("attention %s %s" % (form, name), "attention",
                          dict(o, fused=fused)))
    return cases


def op_cases():
    big = dict(B=3, T=100, C=250)  # 75000 elements: two flat tiles
    return [
        ("slice", "slice", dict(B=4, T=100, C=200, start=150, len=50)),
        ("slice middle", "slice", dict(B=2, T=16, C=96, start=17, len=40)),
        ("mul", "mul", big),
        ("silu", "silu", big),
        ("swiglu", "swiglu", big),
        ("scale -0.37", "scale", dict(big, s=-0.37)),
        ("rmsnorm C=300", "rmsnorm", dict(B=4, T=37, C=300)),
        ("rmsnorm eps=1e-2", "rmsnorm", dict(B=2, T=16, C=64, eps=1e-2)),
        ("rope theta=10000", "rope", dict(B=2, T=70, H=4, hd=32)),
        ("rope theta=500000 T=150", "rope",
         dict(B=2, T=150, H=2, hd=64, theta=500000.0)),
    ]


def args_of(o):
    out = []
    for key, value in o.items():
        if isinstance(value, list):
            value = ",".join(str(x) for x in value)
        out.append("%s=%s" % (key, value))
    return out


def op_dump(exe, args):
    """Runs op_dump; its stdout. It writes nothing to stderr unless
    something went wrong (a sanitizer's report included): that fails."""
    r = subprocess.run([exe] + args, capture_output=True, text=True)
    if r.returncode != 0 or r.stderr:
        sys.exit("op_dump %s: exit status %d\n%s"
                 % (" ".join(args[1:]), r.returncode, r.stderr))
    return r.stdout


def run_op_dump(exe, tmp, op, o, precision):
    prefix = os.path.join(tmp, "case")
    op_dump(exe, [prefix, op] + args_of(o) + ["precision=" + precision])
    params = read_safetensors(prefix + ".params.safetensors")
    grads = read_safetensors(prefix + ".grads.safetensors")
    out = np.fromfile(prefix + ".out.f32", dtype="<f4")
    return params, grads, out


def measure(got, ref, precision):
    """(value, ok): relative max error in f32, cosine in bf16."""
    got = np.asarray(got, dtype=np.float64).ravel()
    ref = np.asarray(ref, dtype=np.float64).ravel()
    if precision == "f32":
        rel = float(np.abs(got - ref).max()) / max(float(np.abs(ref).max()),
                                                   1e-30)
        return rel, rel <= F32_LIMIT
    cos = float(got @ ref) / max(math.sqrt(float(got @ got) * float(ref @ ref)),
                                 1e-300)
    return cos, cos >= BF16_COSINE


def report(label, precision, results, extra=()):
    """Prints one line per case (the worst tensor, then the `extra` checks:
    (name, text, ok)), and every tensor when one is off; 1 if any is."""
    if precision == "f32":
        worst = max(results, key=lambda r: r[1])
        what = "worst rel %.1e (%s)" % (worst[1], worst[0])
    else:
        worst = min(results, key=lambda r: r[1])
        what = "worst cosine %.6f (%s)" % (worst[1], worst[0])
    for name, text, _ in extra:
        what += ", %s %s" % (name, text)
    bad = [r for r in results if not r[2]] + [e for e in extra if not e[2]]
    print("%-4s %-60s %s%s" % (precision, label, what,
                               "  FAILED" if bad else ""))
    for name, value, ok in results if bad else []:
        print("       %-58s %.3e%s" % (name, value, "" if ok else "  <--"))
    for name, text, ok in extra if bad else []:
        print("       %-58s %s%s" % (name, text, "" if ok else "  <--"))
    return 1 if bad else 0


def check_op(exe, tmp, label, op, o, precision):
    params, grads, out = run_op_dump(exe, tmp, op, o, precision)
    p = {n: torch.tensor(a, dtype=torch.float64, requires_grad=True)
         for n, a in params.items()}
    y = REFERENCES[op](o)(p)
    (y * p["w"]).sum().backward()
    results = [("output",) + measure(out, y.detach().numpy(), precision)]
    if set(grads) != set(params):
        print("%s: gradients of %s, parameters %s" % (label, sorted(grads),
                                                      sorted(params)))
        return 1
    for n in params:
        results.append(("d" + n,) + measure(grads[n], p[n].grad.numpy(),
                                            precision))
    return report(label, precision, results)


def check_dropout(exe, tmp, precision):
    """Dropout against its own mask: the zeros of its output."""
    pr = 0.3
    o = dict(B=4, T=100, C=200, p=pr)
    params, grads, out = run_op_dump(exe, tmp, "dropout", o, precision)
    x, w = params["x"].ravel(), params["w"].ravel()
    keep = (out != 0).astype(np.float64)
    dropped = 1.0 - keep.mean()
    sigma = math.sqrt(pr * (1 - pr) / keep.size)
    results = [("output",) + measure(out, x * keep / (1 - pr), precision),
               ("dx",) + measure(grads["x"].ravel(), w * keep / (1 - pr),
                                 precision),
               ("dw",) + measure(grads["w"].ravel(), x * keep / (1 - pr),
                                 precision)]
    extra = [("dropped", "%.4f (%.1f sigma from p)"
              % (dropped, abs(dropped - pr) / sigma),
              abs(dropped - pr) < 5 * sigma)]
    return report("dropout p=0.3 (its mask: the output's zeros)", precision,
                  results, extra)


# ---- a small Llama ----

LLAMA = dict(layers=2, hidden=64, H=4, KVH=2, inter=176, vocab=97, T=16, B=2)
# (tied, fused, the blocks' remat policy)
LLAMA_RUNS = ((0, 0, "nothing_saveable"), (1, 0, "nothing_saveable"),
              (0, 1, "nothing_saveable"), (1, 1, "nothing_saveable"),
              (0, 0, "dots_saveable"),
              (1, 1, "save_only_these_names:q,k,v,ffn_act"))


def llama_weights(cfg, tied, rng):
    d, inter, V = cfg["hidden"], cfg["inter"], cfg["vocab"]
    kv = cfg["KVH"] * d // cfg["H"]

    def linear(m, k):
        return rng.standard_normal((m, k)) / math.sqrt(k)

    def norm():
        return 1.0 + 0.2 * rng.standard_normal(d)
    w = {"model.embed_tokens.weight": 0.3 * rng.standard_normal((V, d))}
    for l in range(cfg["layers"]):
        pre = "model.layers.%d." % l
        w[pre + "input_layernorm.weight"] = norm()
        w[pre + "self_attn.q_proj.weight"] = linear(d, d)
        w[pre + "self_attn.k_proj.weight"] = linear(kv, d)
        w[pre + "self_attn.v_proj.weight"] = linear(kv, d)
        w[pre + "self_attn.o_proj.weight"] = linear(d, d)
        w[pre + "post_attention_layernorm.weight"] = norm()
        w[pre + "mlp.gate_proj.weight"] = linear(inter, d)
        w[pre + "mlp.up_proj.weight"] = linear(inter, d)
        w[pre + "mlp.down_proj.weight"] = linear(d, inter)
    w["model.norm.weight"] = norm()
    if not tied:
        w["lm_head.weight"] = linear(V, d)
    return {n: a.astype(np.float32) for n, a in w.items()}


def llama_loss(p, tokens, targets, cfg, tied):
    H, KVH, eps, theta = cfg["H"], cfg["KVH"], 1e-6, 10000.0
    x = p["model.embed_tokens.weight"][tokens]
    for l in range(cfg["layers"]):
        pre = "model.layers.%d." % l
        h = rmsnorm(x, p[pre + "input_layernorm.weight"], eps)
        q = rope(h @ p[pre + "self_attn.q_proj.weight"].T, H, theta)
        k = rope(h @ p[pre + "self_attn.k_proj.weight"].T, KVH, theta)
        v = h @ p[pre + "self_attn.v_proj.weight"].T
        a = attention(q, k, v, H, KVH, causal=True)
        x = x + a @ p[pre + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, p[pre + "post_attention_layernorm.weight"], eps)
        gate = h @ p[pre + "mlp.gate_proj.weight"].T
        up = h @ p[pre + "mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ p[pre + "mlp.down_proj.weight"].T
    x = rmsnorm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight" if tied else "lm_head.weight"]
    logits = x @ head.T
    return F.cross_entropy(logits.reshape(-1, cfg["vocab"]),
                           targets.reshape(-1))


def check_llama(exe, tmp, tied, fused, policy, precision):
    cfg = LLAMA
    rng = np.random.default_rng(7 + tied)
    weights = llama_weights(cfg, tied, rng)
    batch = rng.integers(0, cfg["vocab"], (2, cfg["B"], cfg["T"]),
                         dtype=np.int32)
    wpath = os.path.join(tmp, "llama.safetensors")
    tpath = os.path.join(tmp, "llama.i32")
    write_safetensors(wpath, weights)
    batch.tofile(tpath)
    prefix = os.path.join(tmp, "llama")
    o = dict(cfg, tied=tied, fused=fused, policy=policy, weights=wpath,
             tokens=tpath)
    out = op_dump(exe, [prefix, "llama"] + args_of(o) +
                  ["precision=" + precision])
    loss = float(out.split()[1])
    grads = read_safetensors(prefix + ".grads.safetensors")
    p = {n: torch.tensor(a, dtype=torch.float64, requires_grad=True)
         for n, a in weights.items()}
    tokens = torch.tensor(batch[0], dtype=torch.long)
    targets = torch.tensor(batch[1], dtype=torch.long)
    ref = llama_loss(p, tokens, targets, cfg, tied)
    ref.backward()
    loss_rel = abs(loss - ref.item()) / abs(ref.item())
    loss_ok = loss_rel <= (F32_LIMIT if precision == "f32" else 0.01)
    results = []
    if set(grads) != set(weights):
        print("llama: gradients of %s" % sorted(set(grads) ^ set(weights)))
        return 1
    for n in weights:
        results.append((n,) + measure(grads[n], p[n].grad.numpy(),
                                      precision))
    label = "llama 2 layers %s %s %s" % (
        "tied" if tied else "untied", "fused" if fused else "materialized",
        policy.split(":")[0])
    extra = [("loss", "%.6f vs %.6f (rel %.1e)" % (loss, ref.item(),
                                                   loss_rel), loss_ok)]
    return report(label, precision, results, extra)


def main():
    exe = sys.argv[1]
    torch.set_num_threads(2)
    start = time.time()
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for precision in ("f32", "bf16"):
            for label, op, o in attention_cases() + op_cases():
                failed += check_op(exe, tmp, label, op, o, precision)
            failed += check_dropout(exe, tmp, precision)
            for tied, fused, policy in LLAMA_RUNS:
                failed += check_llama(exe, tmp, tied, fused, policy,
                                      precision)
    print("%s; %.1f s" % ("%d case(s) FAILED" % failed if failed
                          else "all cases within limits",
                          time.time() - start))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
