#!/usr/bin/env python3
"""Compressed data parallelism converges on 4 CPU ranks (scripts/bench/compression_bench --check):
fashion_cnn with powersgd rank 4 and top-k 1 % (sparsity warm-up 200 steps) within 1 accuracy point
of uncompressed (2 epochs here; docs/performance.md has the full 8-epoch runs), powersgd >= 10x
fewer bytes per step on both models; gpt_tiny with powersgd rank 4 within 2 % of the uncompressed
final test loss."""
import os
import subprocess
import sys

SRC = os.environ["SOURCE_DIR"]
p = subprocess.run([sys.executable, os.path.join(SRC, "scripts/bench/compression_bench"), "--check",
                    "--trainer", os.environ["TRAINER"], "--fashion", os.environ["FASHION_H5"],
                    "--tokens", os.environ["TOKENS_H5"], "--cnn-epochs", "2", "--gpt-steps", "300",
                    "--gpt-methods", "none,powersgd"], text=True)
sys.exit(p.returncode)
