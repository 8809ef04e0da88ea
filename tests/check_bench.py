"""Runs bench_train on a tiny model and checks its JSON: every field present
and sane, with --lora-rank the LoRA run beside full fine-tuning (its
gradient and optimizer bytes, the ratios), with --compare-threads the 1-thread run side by side, with the
same gradients bitwise and a speedup computed from the two medians, with
--accum the micro-batches' FLOPs, tokens and activation peak, and with
--precision both the bf16 run beside the f32 one (its roofline, MFU
against it, and its ratios to the f32 run), and with --compare-fusion the
run without fused epilogues beside the fused one."""
import json
import subprocess
import sys

exe = sys.argv[1]
tiny = ["--layers", "2", "--d-model", "64", "--heads", "4", "--seq", "32",
        "--batch", "2", "--vocab", "64", "--steps", "3", "--threads", "2"]


def not_json(word):
    """NaN and Infinity are no JSON: the benchmark writes null instead."""
    raise AssertionError(f"{word} in the JSON output")


def run(extra, nlines=1):
    out = subprocess.run([exe] + tiny + extra, check=True, capture_output=True,
                         text=True, timeout=100).stdout
    lines = out.strip().splitlines()
    assert len(lines) == nlines, f"expected {nlines} JSON line(s) on stdout, got {out!r}"
    rows = [json.loads(line, parse_constant=not_json) for line in lines]
    return rows[0] if nlines == 1 else rows


def check_common(r):
    assert r["threads"] == 2 and r["steps"] == 3, r
    assert r["step_s_median"] > 0 and r["tokens_per_s"] > 0, r
    assert 0 < r["loss"] < r["first_loss"] + 1.0, r
    assert r["peak_bytes"] >= r["activation_peak_bytes"] > 0, r
    assert r["matmul_roofline_gflops"] > 0 and r["mfu"] > 0, r


plain = run([])
check_common(plain)
assert "speedup" not in plain, plain
assert plain["precision"] == "f32" and "bf16_roofline_gflops" not in plain, plain

# f32 and bf16 side by side: the f32 line is the plain run's (same bits);
# the bf16 line's MFU is against oneDNN's bf16 matmul, its ratios are to
# the f32 line's figures.
f32, bf16 = run(["--precision", "both"], 2)
check_common(f32)
check_common(bf16)
assert f32["precision"] == "f32" and bf16["precision"] == "bf16", (f32, bf16)
assert f32["grad_checksum"] == plain["grad_checksum"], (f32, plain)
assert bf16["grad_checksum"] != f32["grad_checksum"], bf16
assert bf16["bf16_roofline_gflops"] > 0, bf16
R = bf16["bf16_roofline_gflops"] / bf16["matmul_roofline_gflops"]
assert abs(bf16["bf16_roofline_ratio"] - R) <= 1e-3 * R, bf16
mfu = bf16["flops_per_step"] / bf16["step_s_median"] * 1e-9 / bf16["bf16_roofline_gflops"]
assert abs(bf16["mfu"] - mfu) <= 1e-3 * mfu + 1e-4, bf16  # printed to 4 places
ratio = bf16["step_s_median"] / f32["step_s_median"]
assert abs(bf16["step_ratio_vs_f32"] - ratio) <= 1e-3 * ratio + 1e-4, bf16
act = bf16["activation_peak_bytes"] / f32["activation_peak_bytes"]
assert abs(bf16["activation_peak_ratio_vs_f32"] - act) <= 1e-3, bf16
assert act <= 0.55, bf16
assert abs(bf16["loss"] - f32["loss"]) <= 0.02 * f32["loss"], (bf16, f32)
alone = run(["--precision", "bf16"])
assert alone["grad_checksum"] == bf16["grad_checksum"], (alone, bf16)
assert "step_ratio_vs_f32" not in alone, alone

# --compare-fusion: the unfused run (REMAT_FUSE=0) beside the fused one;
# in f32 the two compute the same bits, the fused line is the plain run's
# (fused by default), the ratio and MFU come from the two medians.
fz = run(["--compare-fusion", "--policy", "nothing_saveable"])
check_common(fz)
assert fz["checksum_matches_no_fusion"] is True, fz
ratio = fz["step_s_median"] / fz["no_fusion_step_s_median"]
assert abs(fz["fusion_step_ratio"] - ratio) <= 1e-3 * ratio + 1e-4, fz
assert abs(fz["no_fusion_mfu"] - fz["mfu"] * ratio) <= 1e-3 * fz["mfu"] + 1e-4, fz
assert fz["no_fusion_activation_peak_bytes"] > 0, fz
assert "admission_step_ratio" not in fz and "fusion_step_ratio" not in plain, fz
fz16 = run(["--compare-fusion", "--precision", "bf16"])
check_common(fz16)
assert fz16["checksum_matches_no_fusion"] is True, fz16  # bf16 does not fuse
assert fz16["grad_checksum"] == alone["grad_checksum"], (fz16, alone)
bad = subprocess.run([exe, "--compare-fusion", "--compare-threads"],
                     capture_output=True, text=True)
assert bad.returncode == 2, bad
assert "--compare-update, --compare-dw and --lora-rank exclude each other" in bad.stderr, bad.stderr

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

# --model: the GPT's line is the plain run's; the Llama model beside it
# (4 heads: 1 key/value head, SwiGLU of 8 * 64 / 3 rounded up to 64 = 192)
# counts its own FLOPs; the encoder alone.
gpt, llama = run(["--model", "gpt+llama"], 2)
check_common(gpt)
check_common(llama)
assert gpt["model"] == "gpt" and plain["model"] == "gpt", (gpt, plain)
assert gpt["grad_checksum"] == plain["grad_checksum"], (gpt, plain)
assert llama["model"] == "llama", llama
assert llama["kv_heads"] == 1 and llama["ffn"] == 192, llama
n, d, T, V, L = 2 * 32, 64, 32, plain["vocab"], 2
per_layer = 2 * n * (2 * d * d + 2 * d * (d // 4) + 3 * d * 192) + 4 * 2 * T * T * d
want = 3 * (L * per_layer + 2 * n * d * V)
assert abs(llama["flops_per_step"] - want) <= 1e-6 * want, (llama, want)
alone = run(["--model", "llama"])
assert alone["grad_checksum"] == llama["grad_checksum"], (alone, llama)
enc = run(["--model", "encoder", "--attention", "fused"])
check_common(enc)
assert enc["model"] == "encoder" and enc["attention"] == "fused", enc
assert enc["grad_checksum"] != plain["grad_checksum"], enc

# --lora-rank: LoRA (rank 4, q_proj and v_proj) beside the same Llama model
# fully fine-tuned: gradients and AdamW moments of the adapters alone,
# 2 layers x (q: A [4,64], B [64,4]; v: A [4,64], B [16,4]) = 1664 floats,
# 4 bytes each for the gradient and for each moment; the ratios are those
# of the two runs' figures.
lora = run(["--model", "llama", "--lora-rank", "4"])
check_common(lora)
assert lora["lora_rank"] == 4 and lora["lora_targets"] == "q_proj,v_proj", lora
assert lora["grads_optimizer_peak_bytes"] == 12 * 1664, lora
assert lora["full_grads_optimizer_peak_bytes"] > 20 * lora["grads_optimizer_peak_bytes"], lora
R = lora["grads_optimizer_peak_bytes"] / lora["full_grads_optimizer_peak_bytes"]
assert abs(lora["lora_grads_optimizer_ratio"] - R) <= 1e-5, lora
R = lora["step_s_median"] / lora["full_step_s_median"]
assert abs(lora["lora_step_ratio"] - R) <= 1e-3 * R + 1e-4, lora
assert lora["full_peak_bytes"] > lora["peak_bytes"], lora
only = run(["--model", "llama", "--lora-rank", "4", "--lora-only"])
check_common(only)
assert "full_step_s_median" not in only, only
assert only["grads_optimizer_peak_bytes"] == 12 * 1664, only
assert only["loss"] == lora["loss"], (only, lora)
bad = subprocess.run([exe, "--lora-only"], capture_output=True, text=True)
assert bad.returncode == 2, bad
assert "--lora-targets and --lora-only need --lora-rank R" in bad.stderr, bad.stderr

bad = subprocess.run([exe, "--threads", "0"], capture_output=True, text=True)
assert bad.returncode == 2, bad
assert "--threads '0': expected a whole number >= 1" in bad.stderr, bad.stderr
bad = subprocess.run([exe, "--precision", "fp16"], capture_output=True, text=True)
assert bad.returncode == 2, bad
assert "--precision 'fp16': expected f32, bf16 or both" in bad.stderr, bad.stderr
bad = subprocess.run([exe, "--model", "bert"], capture_output=True, text=True)
assert bad.returncode == 2, bad
assert "--model 'bert': expected gpt, llama, encoder or gpt+llama" in bad.stderr, bad.stderr
# --compare-update: the split passes' run beside the one-pass update, the
# same gradients bitwise, with an accumulation (the fold) too
for extra in ([], ["--accum", "2", "--precision", "bf16"]):
    up = run(["--compare-update"] + extra)
    check_common(up)
    assert up["checksum_matches_split_update"] is True, up
    ratio = up["step_s_median"] / up["split_update_step_s_median"]
    assert abs(up["one_pass_update_step_ratio"] - ratio) <= 1e-3 * ratio, up
# --compare-dw: the weight gradients' form before the shape rule beside it
dw = run(["--compare-dw"])
check_common(dw)
ratio = dw["step_s_median"] / dw["strided_dw_step_s_median"]
assert abs(dw["dw_rule_step_ratio"] - ratio) <= 1e-3 * ratio, dw
assert 0 < dw["strided_dw_mfu"] < 2, dw
bad = subprocess.run([exe, "--compare-dw", "--compare-update"],
                     capture_output=True, text=True)
assert bad.returncode == 2, bad
assert "--compare-update, --compare-dw and --lora-rank exclude each other" in bad.stderr, bad.stderr

# bench_dw, one round: every shape in both dtypes, the three forms' times
# and their gradients within 1e-5 of each other
if len(sys.argv) > 2:
    out = subprocess.run([sys.argv[2], "1"], check=True, capture_output=True,
                         text=True, timeout=100).stdout
    rows = [json.loads(line) for line in out.strip().splitlines()]
    assert len(rows) == 18, out
    assert {r["dtype"] for r in rows} == {"f32", "bf16"}, rows
    for r in rows:
        for k in ("strided_ms", "rule_ms", "transposed_ms"):
            assert r[k] > 0, r
        assert r["rule_max_rel_diff"] < 1e-5, r
        assert r["transposed_max_rel_diff"] < 1e-5, r
        # the rule's blocks span all of K up to 2048
        assert (r["tiles"][1] < r["tiles"][0]) == (512 < r["K"] <= 2048), r
        assert r["caches"] == "warm", r
    # the cold mode is the second argument, and nothing else is
    bad = subprocess.run([sys.argv[2], "1", "hot"], capture_output=True,
                         text=True, timeout=100)
    assert bad.returncode == 2 and bad.stdout == "", bad
    assert bad.stderr == "usage: bench_dw [rounds] [cold | order]\n", bad.stderr
    # the order mode: dx and dw in program order and chunk by chunk
    out = subprocess.run([sys.argv[2], "1", "order"], check=True,
                         capture_output=True, text=True, timeout=100).stdout
    rows = [json.loads(line) for line in out.strip().splitlines()]
    assert len(rows) == 18, out
    for r in rows:
        for k in ("program_dx_ms", "program_dw_ms", "chunked_dx_ms",
                  "chunked_dw_ms"):
            assert r[k] > 0, r
        chunks = -(-r["rows"] // r["dw_chunk_rows"])
        assert r["dw_tiles"] % chunks == 0 and r["dx_tiles"] > 0, r

# bench_kernels, one round of the d384 model in bf16: every kernel of the
# step alone, and the MFUs of the step, of its kernels and of its dot
# products (each bound above the one before it, in the same round)
if len(sys.argv) > 3:
    out = subprocess.run([sys.argv[3], "1", "bf16", "d384"], check=True,
                         capture_output=True, text=True, timeout=200).stdout
    rows = [json.loads(line) for line in out.strip().splitlines()]
    kernels = {r["kernel"]: r for r in rows[:-1]}
    s = rows[-1]
    assert s["model"] == "6 layers d384 seq 192 batch 6", s
    for k in ("linear.fwd", "linear.dx", "linear.dw", "attn_scores.fwd",
              "attn_values.dv", "softmax.fwd", "layernorm.bwd"):
        assert kernels[k]["warm_s"] > 0 and kernels[k]["nodes"] > 0, k
    assert "warm_gflops" in kernels["linear.dw"], kernels["linear.dw"]
    assert "warm_gflops" not in kernels["linear.dw_sum"], kernels
    # causal attention skips the keys a query cannot see: query blocks of
    # 64 rows against keys up to their last row, 6 x 6 heads of head dim
    # 64 in each of 6 layers, so 6 x 2 x 36 x 64 x 64 x (64 + 128 + 192)
    # FLOPs (0.679 G), not x 3 x 192 (1.019 G)
    for k in ("attn_scores.fwd", "attn_scores.dq", "attn_scores.dk",
              "attn_values.fwd", "attn_values.dp", "attn_values.dv"):
        assert kernels[k]["gflop"] == 0.679, kernels[k]
    assert s["dot_kernel_gflop"] < s["model_gflop"], s
    assert 0 < s["mfu_step"] <= s["mfu_kernels_seq"] * 1.5, s
    assert s["mfu_kernels_warm"] < s["mfu_ceiling_dots_warm"], s
    bad = subprocess.run([sys.argv[3], "1", "f16"], capture_output=True,
                         text=True, timeout=100)
    assert bad.returncode == 2 and bad.stdout == "", bad
    assert bad.stderr == ("usage: bench_kernels [rounds 1-64] [f32 | bf16] "
                          "[d512 | d384]\n"), bad.stderr
print("check_bench: ok")
