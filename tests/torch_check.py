#!/usr/bin/python3
"""Meson test: remat's loss and gradients on one batch against PyTorch's,
within 1e-4 relative per tensor (benchmarks/compare_torch.py --check), with
materialized attention and with fused attention (at T = 150: two blocks of
its 128 rows); then remat's bf16 gradients against PyTorch's autocast bf16
and float64 (cosine at least 0.999 per tensor, loss within 1%).
Exits 77 (skipped) when this python cannot import torch.

  /usr/bin/python3 tests/torch_check.py build/tools/remat-grads
"""
import os
import sys

try:
    import numpy  # noqa: F401
    import torch  # noqa: F401
except ImportError:
    print("torch or numpy not importable by %s: skipped" % sys.executable)
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import compare_torch  # noqa: E402

sys.exit(max(compare_torch.check(sys.argv[1]),
             compare_torch.check(sys.argv[1], T=150, attention="fused"),
             compare_torch.check_bf16(sys.argv[1]),
             compare_torch.check_bf16(sys.argv[1], T=150, attention="fused")))
