#!/usr/bin/python3
"""Meson test: pre-trained checkpoints as Hugging Face lays them out, read
the way remat-train --init reads them, against float64 PyTorch models
written here.

This script writes a tiny random Llama (2 layers, hidden 64, 4 heads, 2
key/value heads, intermediate 176, vocab 97; head tied and untied) and a
tiny GPT-2 (2 layers, n_embd 32, 4 heads, vocab 97, n_positions 24) as
Hugging Face would: config.json and model.safetensors (F32 and BF16,
written by hand: an 8-byte header length, the JSON header, the bytes), and
a 2-shard variant with model.safetensors.index.json; the GPT-2 with its
Conv1D weights [in,out], its attn.bias / attn.masked_bias buffers, with
and without the "transformer." prefix. tests/hf_dump (tests/hf_dump.c,
which reads the directory with tools/hf_init.c, as remat-train --init
does) runs one step; its logits must be within 1e-5 and every gradient
within 1e-4 (max |remat - ref| / max |ref| per tensor) of the float64
reference models below (RMSNorm, rotate_half RoPE, repeat_interleave
grouped-query attention, SwiGLU; LayerNorm, Conv1D, gelu_new, the head
tied to wte). Hostile directories (sizes negative or absurd, a field of
the wrong type or missing, heads that do not divide the width, an index
naming a missing shard or a tensor twice, a BF16 tensor of the wrong byte
count, an untransposed Conv1D weight) must each fail with its exact
message and leave every parameter as it was. Then remat-train --init
fine-tunes the Llama on u16 and u32 token files (the loss falls), saves
BF16 weights under Hugging Face's names and samples from --prompt ids.
Exits 77 (skipped) only when this python cannot import torch or numpy.

  /usr/bin/python3 tests/hf_check.py build/tests/hf_dump build/tools/remat-train
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError:
    print("torch or numpy not importable by %s: skipped" % sys.executable)
    sys.exit(77)

LOGITS_LIMIT = 1e-5
GRAD_LIMIT = 1e-4
# eps and theta away from the builders' defaults (1e-6, 10000, 1e-5), so
# that a config value that did not reach the model would show
LLAMA = {"layers": 2, "d": 64, "heads": 4, "kv": 2, "inter": 176,
         "vocab": 97, "eps": 1e-3, "theta": 500000.0}
GPT2 = {"layers": 2, "d": 32, "heads": 4, "vocab": 97, "positions": 24,
        "eps": 1e-3}
B, T = 2, 12


# ---- safetensors by hand ----

def bf16_bits(a):
    """float32 array -> uint16 bf16 bits, rounded to nearest even."""
    u = np.ascontiguousarray(a, dtype="<f4").view("<u4").astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")


def bf16_round(a):
    return (bf16_bits(a).astype("<u4") << 16).view("<f4")


def tensor_bytes(a, dtype):
    if dtype == "BF16":
        return bf16_bits(a).tobytes()
    return np.ascontiguousarray(a, dtype="<f4").tobytes()


def write_safetensors(path, tensors, dtype="F32", header_only=None):
    """tensors: name -> array (written in dtype) or (dtype, shape, bytes)."""
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        if isinstance(a, tuple):
            dt, shape, blob = a
        else:
            dt, shape, blob = dtype, list(a.shape), tensor_bytes(a, dtype)
        header[name] = {"dtype": dt, "shape": shape,
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    header["__metadata__"] = {"format": "pt"}
    if header_only is not None:
        header_only(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        raw = data[8 + n + a:8 + n + b]
        if e["dtype"] == "BF16":
            v = (np.frombuffer(raw, "<u2").astype("<u4") << 16).view("<f4")
        else:
            assert e["dtype"] == "F32", (name, e["dtype"])
            v = np.frombuffer(raw, "<f4")
        out[name] = (e["dtype"], v.reshape(e["shape"]))
    return out


def write_dir(path, config, tensors, dtype="F32", shards=1):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    if shards == 1:
        write_safetensors(os.path.join(path, "model.safetensors"), tensors,
                          dtype)
        return
    names = list(tensors)
    weight_map = {}
    for k in range(shards):
        file = "model-%05d-of-%05d.safetensors" % (k + 1, shards)
        part = {n: tensors[n] for n in names[k::shards]}
        write_safetensors(os.path.join(path, file), part, dtype)
        weight_map.update({n: file for n in part})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map},
                  f)


# ---- the tiny models, in Hugging Face's names and layouts ----

def llama_config(tied):
    c = LLAMA
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": c["d"], "intermediate_size": c["inter"],
            "num_hidden_layers": c["layers"],
            "num_attention_heads": c["heads"],
            "num_key_value_heads": c["kv"], "vocab_size": c["vocab"],
            "rms_norm_eps": c["eps"], "rope_theta": c["theta"],
            "max_position_embeddings": 64, "hidden_act": "silu",
            "tie_word_embeddings": tied, "rope_scaling": None,
            "attention_bias": False, "torch_dtype": "float32",
            "bos_token_id": 1, "eos_token_id": 2}


def llama_weights(tied, rng):
    c = LLAMA
    d, kvd = c["d"], c["kv"] * c["d"] // c["heads"]
    w = {"model.embed_tokens.weight": rng.normal(0, 0.5, (c["vocab"], d))}
    for l in range(c["layers"]):
        p = "model.layers.%d." % l
        w[p + "input_layernorm.weight"] = 1 + rng.normal(0, 0.1, d)
        for name, rows in (("q", d), ("k", kvd), ("v", kvd), ("o", d)):
            w[p + "self_attn.%s_proj.weight" % name] = rng.normal(
                0, 0.15, (rows, d))
        w[p + "post_attention_layernorm.weight"] = 1 + rng.normal(0, 0.1, d)
        w[p + "mlp.gate_proj.weight"] = rng.normal(0, 0.15, (c["inter"], d))
        w[p + "mlp.up_proj.weight"] = rng.normal(0, 0.15, (c["inter"], d))
        w[p + "mlp.down_proj.weight"] = rng.normal(0, 0.1, (d, c["inter"]))
    w["model.norm.weight"] = 1 + rng.normal(0, 0.1, d)
    if not tied:
        w["lm_head.weight"] = rng.normal(0, 0.3, (c["vocab"], d))
    return {k: v.astype(np.float32) for k, v in w.items()}


def gpt2_config():
    c = GPT2
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
            "n_embd": c["d"], "n_layer": c["layers"], "n_head": c["heads"],
            "vocab_size": c["vocab"], "n_positions": c["positions"],
            "n_ctx": c["positions"], "layer_norm_epsilon": c["eps"],
            "activation_function": "gelu_new", "n_inner": None,
            "resid_pdrop": 0.1, "tie_word_embeddings": True}


def gpt2_weights(rng, prefix):
    c = GPT2
    d, P = c["d"], c["positions"]
    w = {"wte.weight": rng.normal(0, 0.5, (c["vocab"], d)),
         "wpe.weight": rng.normal(0, 0.2, (P, d))}
    for l in range(c["layers"]):
        p = "h.%d." % l
        for ln in ("ln_1", "ln_2"):
            w[p + ln + ".weight"] = 1 + rng.normal(0, 0.1, d)
            w[p + ln + ".bias"] = rng.normal(0, 0.1, d)
        for name, i, o in (("attn.c_attn", d, 3 * d), ("attn.c_proj", d, d),
                           ("mlp.c_fc", d, 4 * d), ("mlp.c_proj", 4 * d, d)):
            w[p + name + ".weight"] = rng.normal(0, 0.15, (i, o))  # Conv1D
            w[p + name + ".bias"] = rng.normal(0, 0.1, o)
    w["ln_f.weight"] = 1 + rng.normal(0, 0.1, d)
    w["ln_f.bias"] = rng.normal(0, 0.1, d)
    w = {k: v.astype(np.float32) for k, v in w.items()}
    out = {}
    for k, v in w.items():
        out[prefix + k] = v
    for l in range(c["layers"]):  # buffers, which are not parameters
        out[prefix + "h.%d.attn.bias" % l] = np.tril(
            np.ones((P, P), np.float32)).reshape(1, 1, P, P)
        out[prefix + "h.%d.attn.masked_bias" % l] = np.array(-1e4,
                                                             np.float32)
    if prefix:
        out["lm_head.weight"] = w["wte.weight"]
    return w, out


# ---- float64 references ----

def t64(a):
    return torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True)


def causal_attention(q, k, v, H, KVH):
    """q [B,T,H*hd], k and v [B,T,KVH*hd]; kv head j serves the H/KVH query
    heads after it (repeat_interleave)."""
    Bn, Tn, D = q.shape
    hd = D // H
    q = q.reshape(Bn, Tn, H, hd).transpose(1, 2)
    k = k.reshape(Bn, Tn, KVH, hd).transpose(1, 2)
    v = v.reshape(Bn, Tn, KVH, hd).transpose(1, 2)
    k = k.repeat_interleave(H // KVH, dim=1)
    v = v.repeat_interleave(H // KVH, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(hd)
    mask = torch.ones(Tn, Tn, dtype=torch.bool).tril()
    s = s.masked_fill(~mask, float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2).reshape(Bn, Tn, D)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def llama3_inv_freq(inv, s):
    """Llama 3's rope_scaling of the inverse frequencies, as Hugging Face's
    _compute_llama3_parameters computes it."""
    orig = s["original_max_position_embeddings"]
    low, high, factor = s["low_freq_factor"], s["high_freq_factor"], \
        s["factor"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > orig / low, inv / factor, inv)
    smooth = (orig / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= orig / high) & (wavelen <= orig / low)
    return torch.where(medium, blended, scaled)


def rope(x, H, theta, scaling=None):
    Bn, Tn, D = x.shape
    hd = D // H
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    if scaling is not None:
        inv = llama3_inv_freq(inv, scaling)
    ang = torch.outer(torch.arange(Tn, dtype=torch.float64), inv)
    ang = torch.cat((ang, ang), dim=-1)[None, :, None, :]
    x = x.reshape(Bn, Tn, H, hd)
    return (x * ang.cos() + rotate_half(x) * ang.sin()).reshape(Bn, Tn, D)


def rmsnorm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def llama_logits(p, tokens, tied, scaling=None):
    c = LLAMA
    x = p["model.embed_tokens.weight"][tokens]
    for l in range(c["layers"]):
        q = "model.layers.%d." % l
        h = rmsnorm(x, p[q + "input_layernorm.weight"], c["eps"])
        qs = rope(h @ p[q + "self_attn.q_proj.weight"].T, c["heads"],
                  c["theta"], scaling)
        ks = rope(h @ p[q + "self_attn.k_proj.weight"].T, c["kv"],
                  c["theta"], scaling)
        vs = h @ p[q + "self_attn.v_proj.weight"].T
        a = causal_attention(qs, ks, vs, c["heads"], c["kv"])
        x = x + a @ p[q + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, p[q + "post_attention_layernorm.weight"], c["eps"])
        gate = h @ p[q + "mlp.gate_proj.weight"].T
        up = h @ p[q + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ \
            p[q + "mlp.down_proj.weight"].T
    x = rmsnorm(x, p["model.norm.weight"], c["eps"])
    head = p["model.embed_tokens.weight"] if tied else p["lm_head.weight"]
    return x @ head.T


def gelu_new(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) *
                                     (x + 0.044715 * x ** 3)))


def layernorm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def conv1d(x, p, name):
    """GPT-2's Conv1D: x @ weight [in,out] + bias."""
    return x @ p[name + ".weight"] + p[name + ".bias"]


def gpt2_logits(p, tokens):
    c = GPT2
    d, eps = c["d"], c["eps"]
    x = p["wte.weight"][tokens] + p["wpe.weight"][:tokens.shape[1]]
    for l in range(c["layers"]):
        q = "h.%d." % l
        h = layernorm(x, p[q + "ln_1.weight"], p[q + "ln_1.bias"], eps)
        qkv = conv1d(h, p, q + "attn.c_attn")
        a = causal_attention(qkv[..., :d], qkv[..., d:2 * d],
                             qkv[..., 2 * d:], c["heads"], c["heads"])
        x = x + conv1d(a, p, q + "attn.c_proj")
        h = layernorm(x, p[q + "ln_2.weight"], p[q + "ln_2.bias"], eps)
        x = x + conv1d(gelu_new(conv1d(h, p, q + "mlp.c_fc")), p,
                       q + "mlp.c_proj")
    x = layernorm(x, p["ln_f.weight"], p["ln_f.bias"], eps)
    return x @ p["wte.weight"].T


def reference(weights, logits_of, tokens, targets):
    p = {k: t64(v) for k, v in weights.items()}
    logits = logits_of(p, torch.tensor(tokens, dtype=torch.long))
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        torch.tensor(targets, dtype=torch.long).reshape(-1))
    loss.backward()
    return (logits.detach().numpy(), loss.item(),
            {k: v.grad.numpy() for k, v in p.items()})


# ---- running hf_dump ----

FAILURES = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        FAILURES.append(what)


def rel(a, b):
    scale = float(np.max(np.abs(b)))
    return float(np.max(np.abs(np.asarray(a, np.float64) - b))) / \
        (scale if scale > 0 else 1.0)


def run_dump(dump, path, prefix, batch, *extra):
    tokens = os.path.join(os.path.dirname(prefix), "batch.i32")
    np.concatenate([batch[0].ravel(), batch[1].ravel()]).astype(
        "<i4").tofile(tokens)
    return subprocess.run([dump, path, prefix, str(B), str(T), tokens] +
                          list(extra), capture_output=True, text=True)


def gpt2_grad_name(name):
    """remat's GPT name -> (Hugging Face's name, transposed)."""
    top = {"wte": "wte.weight", "wpe": "wpe.weight",
           "lnf.gamma": "ln_f.weight", "lnf.beta": "ln_f.bias"}
    if name in top:
        return top[name], False
    layer, rest = name[1:].split(".", 1)
    block = {"ln1.gamma": ("ln_1.weight", False),
             "ln1.beta": ("ln_1.bias", False),
             "attn.w_qkv": ("attn.c_attn.weight", True),
             "attn.b_qkv": ("attn.c_attn.bias", False),
             "attn.w_out": ("attn.c_proj.weight", True),
             "attn.b_out": ("attn.c_proj.bias", False),
             "ln2.gamma": ("ln_2.weight", False),
             "ln2.beta": ("ln_2.bias", False),
             "ffn.w_in": ("mlp.c_fc.weight", True),
             "ffn.b_in": ("mlp.c_fc.bias", False),
             "ffn.w_out": ("mlp.c_proj.weight", True),
             "ffn.b_out": ("mlp.c_proj.bias", False)}[rest]
    return "h.%s.%s" % (layer, block[0]), block[1]


def compare(dump, path, prefix, batch, weights, logits_of, what, gpt2=False,
            extra=()):
    r = run_dump(dump, path, prefix, batch, *extra)
    if r.returncode != 0:
        check(False, "%s: hf_dump failed: %s" % (what, r.stderr.strip()))
        return
    ref_logits, ref_loss, ref_grads = reference(weights, logits_of, *batch)
    logits = np.fromfile(prefix + ".logits.f32", "<f4").reshape(
        ref_logits.shape)
    e = rel(logits, ref_logits)
    check(e <= LOGITS_LIMIT, "%s: logits within %.0e (%.2e)" %
          (what, LOGITS_LIMIT, e))
    loss = float(r.stdout.split()[1])
    check(abs(loss - ref_loss) <= 1e-5 * abs(ref_loss),
          "%s: loss %.7f vs %.7f" % (what, loss, ref_loss))
    grads = read_safetensors(prefix + ".grads.safetensors")
    names = set()
    worst, worst_name = 0.0, ""
    for name, (_, g) in grads.items():
        hf, transposed = gpt2_grad_name(name) if gpt2 else (name, False)
        names.add(hf)
        e = rel(g.T if transposed else g, ref_grads[hf])
        if e > worst:
            worst, worst_name = e, hf
    check(names == set(ref_grads), "%s: a gradient for each of the %d "
          "parameters" % (what, len(ref_grads)))
    check(worst <= GRAD_LIMIT, "%s: every gradient within %.0e (worst %.2e, "
          "%s)" % (what, GRAD_LIMIT, worst, worst_name))


def batch_of(rng, vocab):
    return (rng.integers(0, vocab, (B, T)), rng.integers(0, vocab, (B, T)))


def correctness(dump, tmp, rng):
    for tied in (False, True):
        weights = llama_weights(tied, rng)
        batch = batch_of(rng, LLAMA["vocab"])
        logits_of = lambda p, tok: llama_logits(p, tok, tied)
        for dtype, shards in (("F32", 1), ("BF16", 1), ("F32", 2)):
            path = os.path.join(tmp, "llama-%d-%s-%d" % (tied, dtype, shards))
            write_dir(path, llama_config(tied), weights, dtype, shards)
            ref_w = weights if dtype == "F32" else \
                {k: bf16_round(v) for k, v in weights.items()}
            compare(dump, path, os.path.join(tmp, "out"), batch, ref_w,
                    logits_of, "llama %s %s, %d shard(s)" %
                    ("tied" if tied else "untied", dtype, shards))
    # Llama 3's rope_scaling, with wavelengths kept, blended and slowed
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    inv = 1.0 / LLAMA["theta"] ** (torch.arange(
        0, LLAMA["d"] // LLAMA["heads"], 2, dtype=torch.float64) /
        (LLAMA["d"] // LLAMA["heads"]))
    wl = 2 * math.pi / inv
    check(bool((wl < 16).any() and ((wl > 16) & (wl < 64)).any() and
               (wl > 64).any()), "llama3 scaling: all three regimes occur")
    weights = llama_weights(False, rng)
    path = os.path.join(tmp, "llama-rope-scaling")
    config = llama_config(False)
    config["rope_scaling"] = scaling
    write_dir(path, config, weights)
    compare(dump, path, os.path.join(tmp, "out"), batch_of(rng, 97), weights,
            lambda p, tok: llama_logits(p, tok, False, scaling),
            "llama with Llama 3's rope_scaling")
    weights = llama_weights(False, rng)
    path = os.path.join(tmp, "llama-fused")
    write_dir(path, llama_config(False), weights)
    compare(dump, path, os.path.join(tmp, "out"), batch_of(rng, 97), weights,
            lambda p, tok: llama_logits(p, tok, False),
            "llama fused attention, dots_saveable",
            extra=("fused=1", "policy=dots_saveable"))
    for prefix, dtype, shards in (("", "F32", 1), ("transformer.", "F32", 1),
                                  ("transformer.", "BF16", 2)):
        weights, tensors = gpt2_weights(rng, prefix)
        path = os.path.join(tmp, "gpt2-%s%s-%d" % (prefix, dtype, shards))
        write_dir(path, gpt2_config(), tensors, dtype, shards)
        ref_w = weights if dtype == "F32" else \
            {k: bf16_round(v) for k, v in weights.items()}
        compare(dump, path, os.path.join(tmp, "out"),
                batch_of(rng, GPT2["vocab"]), ref_w, gpt2_logits,
                "gpt2 %s%s, %d shard(s)" % (prefix or "no prefix, ", dtype,
                                            shards), gpt2=True)


# ---- hostile directories ----

def hostile(dump, tmp, rng):
    good = llama_weights(False, rng)
    batch = batch_of(rng, LLAMA["vocab"])
    out = os.path.join(tmp, "h")

    def expect(path, message, loads=False):
        for f in (out + ".before.safetensors", out + ".after.safetensors"):
            if os.path.exists(f):
                os.remove(f)
        r = run_dump(dump, path, out, batch)
        got = r.stderr.strip()
        check(r.returncode == 1 and got == "hf_dump: " + message,
              "%s: refused with %r%s" % (os.path.basename(path), message,
                                        "" if got == "hf_dump: " + message
                                        else " (got %r)" % got))
        if loads:
            same = os.path.exists(out + ".after.safetensors") and \
                open(out + ".before.safetensors", "rb").read() == \
                open(out + ".after.safetensors", "rb").read()
            check(same, "%s: no parameter changed" % os.path.basename(path))

    def config_case(name, change, message):
        cfg = llama_config(False)
        change(cfg)
        path = os.path.join(tmp, name)
        write_dir(path, cfg, good)
        expect(path, message)

    config_case("negative", lambda c: c.update(hidden_size=-64),
                "config.json: hidden_size -64: expected a whole number from "
                "1 to 65536")
    config_case("absurd", lambda c: c.update(num_hidden_layers=10 ** 12),
                "config.json: num_hidden_layers 1000000000000: expected a "
                "whole number from 1 to 10000")
    config_case("absurd-vocab", lambda c: c.update(vocab_size=2 ** 40),
                "config.json: vocab_size 1099511627776: expected a whole "
                "number from 2 to 16777216")
    config_case("fraction", lambda c: c.update(intermediate_size=176.5),
                "config.json: intermediate_size 176.5: expected a whole "
                "number from 1 to 1048576")
    config_case("wrong-type", lambda c: c.update(num_attention_heads="4"),
                "config.json: num_attention_heads is a string: expected a "
                "whole number from 1 to 4096")
    config_case("wrong-type-bool",
                lambda c: c.update(tie_word_embeddings="yes"),
                "config.json: tie_word_embeddings is a string: expected "
                "true or false")
    config_case("heads", lambda c: c.update(num_attention_heads=5,
                                            num_key_value_heads=5),
                "config.json: hidden_size 64 is not divisible by "
                "num_attention_heads 5")
    config_case("kv-heads", lambda c: c.update(num_key_value_heads=3),
                "config.json: num_attention_heads 4 is not divisible by "
                "num_key_value_heads 3")
    config_case("missing", lambda c: c.pop("intermediate_size"),
                "config.json: intermediate_size is missing")
    config_case("model-type", lambda c: c.update(model_type="bert"),
                "config.json: model_type \"bert\": expected \"llama\" or "
                "\"gpt2\"")
    config_case("no-model-type", lambda c: c.pop("model_type"),
                "config.json: model_type is missing: expected \"llama\" or "
                "\"gpt2\"")
    config_case("rope-scaling-type",
                lambda c: c.update(rope_scaling={"rope_type": "linear",
                                                 "factor": 2.0}),
                "config.json: rope_scaling.rope_type \"linear\": remat "
                "builds \"llama3\" only")
    config_case("rope-scaling-field",
                lambda c: c.update(rope_scaling={"rope_type": "llama3",
                                                 "factor": 8.0,
                                                 "low_freq_factor": 1.0}),
                "config.json: rope_scaling.high_freq_factor is missing")
    config_case("rope-scaling-kind", lambda c: c.update(rope_scaling=[1]),
                "config.json: rope_scaling is an array: expected null or an "
                "object with rope_type \"llama3\"")
    config_case("eps", lambda c: c.update(rms_norm_eps=-1e-6),
                "config.json: rms_norm_eps -1e-06: expected "
                "a number above 0 and at most 1")
    # above 0 as a double, 0 as the f32 the model uses
    config_case("eps-f32", lambda c: c.update(rms_norm_eps=1e-60),
                "config.json: rms_norm_eps 1e-60, 0 as an f32: expected "
                "a number above 0 and at most 1")

    # a shard index naming a file that is not there
    path = os.path.join(tmp, "missing-shard")
    write_dir(path, llama_config(False), good, "F32", 2)
    index = os.path.join(path, "model.safetensors.index.json")
    with open(index) as f:
        wm = json.load(f)
    wm["weight_map"]["model.norm.weight"] = "model-00003-of-00002.safetensors"
    with open(index, "w") as f:
        json.dump(wm, f)
    expect(path, "remat_load_safetensors: cannot open '%s/"
           "model-00003-of-00002.safetensors': No such file or directory"
           % path, loads=True)

    # a shard index naming a tensor twice (JSON text with a repeated key)
    path = os.path.join(tmp, "twice")
    write_dir(path, llama_config(False), good, "F32", 2)
    with open(index.replace("missing-shard", "twice")) as f:
        text = f.read()
    text = text.replace('"weight_map": {', '"weight_map": {"model.norm.'
                        'weight": "model-00001-of-00002.safetensors", ', 1)
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        f.write(text)
    expect(path, "remat_load_safetensors: '%s/model.safetensors.index.json':"
           " the index's weight_map names tensor 'model.norm.weight' twice"
           % path, loads=True)

    # a BF16 tensor whose bytes are those of F32
    path = os.path.join(tmp, "bf16-bytes")
    tensors = dict(good)
    norm = good["model.norm.weight"]
    tensors["model.norm.weight"] = ("BF16", [64], tensor_bytes(norm, "F32"))
    write_dir(path, llama_config(False), {})
    write_safetensors(os.path.join(path, "model.safetensors"), tensors,
                      "BF16")
    header = read_header(os.path.join(path, "model.safetensors"))
    a, b = header["model.norm.weight"]["data_offsets"]
    expect(path, "remat_load_safetensors: '%s/model.safetensors': tensor "
           "'model.norm.weight' has data_offsets [%d,%d] (256 bytes) but its "
           "BF16 shape needs 128 bytes" % (path, a, b), loads=True)

    # a GPT-2 Conv1D weight written [out,in], as nn.Linear would
    path = os.path.join(tmp, "gpt2-linear")
    _, tensors = gpt2_weights(rng, "transformer.")
    name = "transformer.h.1.mlp.c_fc.weight"
    tensors[name] = np.ascontiguousarray(tensors[name].T)
    write_dir(path, gpt2_config(), tensors)
    expect(path, "remat_gpt_load_hf: '%s/model.safetensors': tensor '%s' has "
           "shape [128,32] in the file but [32,128] in the model "
           "(transposed: [in,out])" % (path, name), loads=True)

    # a GPT-2 file that lacks a block's tensor
    path = os.path.join(tmp, "gpt2-missing")
    _, tensors = gpt2_weights(rng, "")
    del tensors["h.0.attn.c_proj.bias"]
    write_dir(path, gpt2_config(), tensors)
    expect(path, "remat_gpt_load_hf: '%s/model.safetensors': the model's "
           "tensor 'h.0.attn.c_proj.bias' is missing from the file" % path,
           loads=True)


def read_header(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n])


# ---- remat-train --init ----

def trainer(train, tmp, rng):
    weights = llama_weights(True, rng)
    path = os.path.join(tmp, "llama-train")
    write_dir(path, llama_config(True), weights, "BF16")
    pattern = np.array([5, 17, 42, 8, 91, 3, 60, 33, 77, 12, 29], np.int64)
    ids = np.tile(pattern, 400)
    for fmt, dt, save in (("u16", "<u2", "bf16"), ("u32", "<u4", "bf16"),
                          ("u16", "<u2", "f32")):
        data = os.path.join(tmp, "tokens.%s" % fmt)
        ids.astype(dt).tofile(data)
        saved = os.path.join(tmp, "tuned-%s-%s.safetensors" % (fmt, save))
        r = subprocess.run([train, "--init", path, "--data", data,
                            "--data-format", fmt, "--seq", "16", "--batch",
                            "4", "--steps", "30", "--lr", "0.003",
                            "--threads", "2", "--json", "--save", saved,
                            "--save-dtype", save],
                           capture_output=True, text=True)
        lines = [json.loads(l) for l in r.stdout.splitlines()
                 if l.startswith("{\"step\"")]
        ok = r.returncode == 0 and len(lines) == 30
        check(ok, "remat-train --init --data-format %s: 30 steps (%s)" %
              (fmt, r.stderr.strip()[-300:]))
        if not ok:
            continue
        first, last = lines[0]["loss"], lines[-1]["loss"]
        check(last < 0.5 * first, "remat-train --init %s: the loss falls "
              "from %.3f to %.3f" % (fmt, first, last))
        tuned = read_safetensors(saved)
        check(set(tuned) == set(weights) and
              all(d == save.upper() for d, _ in tuned.values()),
              "--save-dtype %s: %s tensors under Hugging Face's names" %
              (save, save.upper()))
    # the same run (the same seed and threads) saved in F32 and in BF16:
    # the BF16 file holds the F32 weights rounded to nearest even
    f32 = read_safetensors(os.path.join(tmp, "tuned-u16-f32.safetensors"))
    bf16 = read_safetensors(os.path.join(tmp, "tuned-u16-bf16.safetensors"))
    check(all(np.array_equal(bf16_round(f32[k][1]), bf16[k][1])
              for k in f32) and any(not np.array_equal(f32[k][1], bf16[k][1])
                                    for k in f32),
          "--save-dtype bf16: each weight the F32 one rounded to bf16")
    r = subprocess.run([train, "--init", path, "--load",
                        os.path.join(tmp, "tuned-u16-bf16.safetensors"),
                        "--prompt", "5 17 42 8", "--tokens", "7",
                        "--temperature", "0", "--threads", "2"],
                       capture_output=True, text=True)
    check(r.stdout.split() == [str(t) for t in np.tile(pattern, 2)[:11]],
          "--init --load of the fine-tuned BF16 weights continues the "
          "pattern (%r %s)" % (r.stdout.strip(), r.stderr.strip()))
    r = subprocess.run([train, "--init", path, "--prompt", "5,17,42",
                        "--tokens", "6", "--temperature", "0", "--threads",
                        "2"], capture_output=True, text=True)
    words = r.stdout.split()
    check(r.returncode == 0 and len(words) == 9 and words[:3] ==
          ["5", "17", "42"] and all(0 <= int(w) < 97 for w in words),
          "remat-train --init --prompt: the prompt and 6 ids (%r %s)" %
          (r.stdout.strip(), r.stderr.strip()))
    # the greedy continuation is the reference model's argmax
    p = {k: torch.tensor(bf16_round(v), dtype=torch.float64)
         for k, v in weights.items()}
    ctx = [5, 17, 42]
    for _ in range(6):
        logits = llama_logits(p, torch.tensor([ctx]), True)
        ctx.append(int(logits[0, -1].argmax()))
    check(words == [str(t) for t in ctx], "remat-train --init --prompt: "
          "greedy ids as the float64 model's (%s)" % " ".join(map(str, ctx)))
    weights, tensors = gpt2_weights(rng, "transformer.")
    path = os.path.join(tmp, "gpt2-sample")
    write_dir(path, gpt2_config(), tensors, "BF16")
    r = subprocess.run([train, "--init", path, "--prompt", "3,14,15",
                        "--tokens", "5", "--temperature", "0", "--threads",
                        "2"], capture_output=True, text=True)
    p = {k: torch.tensor(bf16_round(v), dtype=torch.float64)
         for k, v in weights.items()}
    ctx = [3, 14, 15]
    for _ in range(5):
        ctx.append(int(gpt2_logits(p, torch.tensor([ctx]))[0, -1].argmax()))
    check(r.stdout.split() == [str(t) for t in ctx], "remat-train --init "
          "GPT-2 --prompt: greedy ids as the float64 model's (%r vs %s; %s)"
          % (r.stdout.strip(), " ".join(map(str, ctx)), r.stderr.strip()))
    data = os.path.join(tmp, "outside.u32")
    np.array([1, 2, 97, 3] * 100, "<u4").tofile(data)
    r = subprocess.run([train, "--init", path, "--data", data,
                        "--data-format", "u32", "--seq", "8", "--steps", "1"],
                       capture_output=True, text=True)
    check(r.returncode == 1 and r.stderr.strip() == "remat-train: --data '%s'"
          ": token id 97 at position 2 is outside the vocabulary of 97 (ids 0 "
          "to 96)" % data, "--data-format u32: an id outside vocab_size (%r)"
          % r.stderr.strip())
    bad = os.path.join(tmp, "absurd")
    r = subprocess.run([train, "--init", bad, "--prompt", "1"],
                       capture_output=True, text=True)
    check(r.returncode == 1 and r.stderr.strip() == "remat-train: "
          "config.json: num_hidden_layers 1000000000000: expected a whole "
          "number from 1 to 10000", "remat-train --init: a bad config.json "
          "(%r)" % r.stderr.strip())


def main():
    if len(sys.argv) != 3:
        print("usage: hf_check.py HF_DUMP REMAT_TRAIN", file=sys.stderr)
        return 2
    rng = np.random.default_rng(26)
    with tempfile.TemporaryDirectory() as tmp:
        correctness(sys.argv[1], tmp, rng)
        hostile(sys.argv[1], tmp, rng)
        trainer(sys.argv[2], tmp, rng)
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
