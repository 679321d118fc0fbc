#!/usr/bin/env python3
"""GPU training end to end (skipped, exit 77, where no GPU is visible):
 - f32 GPU, a 1-rank NCCL run and a 2-rank MPI-backend run on one GPU each match the CPU loss
   curve of the same global batch (50 steps, relative 1e-4);
 - f16 with dynamic loss scaling trains;
 - configs/fashion_cnn.ini reaches >= 0.91 test accuracy on the GPU (samples/s printed)."""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

TRAINER = os.environ["TRAINER"]
FASHION = os.environ["FASHION_H5"]
SRC = os.environ["SOURCE_DIR"]


def gpus():
    out = subprocess.run([TRAINER, "--devices"], capture_output=True, text=True).stdout
    return int(re.search(r"cuda devices: (\d+)", out).group(1))


def run(np, args, timeout=900):
    cmd = ([TRAINER] if np == 1 else ["mpirun", "-np", str(np), TRAINER]) + [f"--data.path={FASHION}"] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p.stdout


def records(d, name):
    with open(os.path.join(d, name, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f]


def losses(d, name):
    return [r["loss"] for r in records(d, name) if r["type"] == "step"]


class GpuTraining(unittest.TestCase):
    def test_gpu_matches_cpu_on_every_backend(self):
        with tempfile.TemporaryDirectory() as d:
            base = ["--model.type=cnn", "--model.conv_channels=16,32", "--model.fc=64", "--train.batch_size=64",
                    "--train.max_steps=50", "--run.log_interval=1", "--model.dropout=0", f"--run.dir={d}",
                    "--optim.lr=0.001"]
            run(1, base + ["--run.name=cpu"])
            run(1, base + ["--run.name=gpu", "--train.device=cuda"])
            run(1, base + ["--run.name=nccl1", "--train.device=cuda", "--dist.backend=nccl"])
            run(2, base + ["--run.name=mpi2", "--train.device=cuda", "--dist.backend=mpi"])
            ref = losses(d, "cpu")
            self.assertEqual(len(ref), 50)
            for name in ("gpu", "nccl1", "mpi2"):
                got = losses(d, name)
                worst = max(abs(a - b) / abs(a) for a, b in zip(ref, got))
                print(f"{name}: worst relative loss difference to the CPU over 50 steps {worst:.2e}")
                self.assertEqual(len(got), 50)
                self.assertLess(worst, 1e-4, name)

    def test_f16_loss_scaling_trains(self):
        with tempfile.TemporaryDirectory() as d:
            out = run(1, ["--train.device=cuda", "--train.precision=f16", "--train.max_steps=300",
                          "--run.log_interval=50", f"--run.dir={d}", "--run.name=f16"])
            steps = [r for r in records(d, "f16") if r["type"] == "step"]
            self.assertLess(steps[-1]["loss"], steps[0]["loss"])
            m = re.search(r"final test_accuracy=(\d\.\d+)", out)
            self.assertGreater(float(m.group(1)), 0.80)

    def test_fashion_cnn_accuracy(self):
        with tempfile.TemporaryDirectory() as d:
            out = run(1, ["--config", os.path.join(SRC, "configs/fashion_cnn.ini"), "--train.device=cuda",
                          f"--run.dir={d}", "--run.log_interval=500"], timeout=1800)
            acc = float(re.search(r"final test_accuracy=(\d\.\d+)", out).group(1))
            sps = [r["samples_per_s"] for r in records(d, "fashion_cnn") if r["type"] == "step"]
            print(f"fashion_cnn on GPU: test_accuracy={acc:.4f}, samples/s (per log interval) {[round(s) for s in sps]}")
            self.assertGreaterEqual(acc, 0.91)


if __name__ == "__main__":
    if gpus() == 0:
        print("no CUDA device visible: GPU training tests skipped")
        sys.exit(77)
    unittest.main(verbosity=2)
