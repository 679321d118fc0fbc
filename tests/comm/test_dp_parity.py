#!/usr/bin/env python3
"""Data parallelism is exact: -np 4 with global batch G gives, at every one of 50 steps, the loss of
-np 1 with batch G (f32, relative error < 1e-5), for the mlp and the cnn, with buckets small
enough that every layer is its own bucket, and with buckets rebuilt after step 1."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from common import run_trainer, step_losses  # noqa: E402

STEPS = 50
MODELS = {
    "mlp": ["--model.type=mlp", "--model.hidden=256,128,100", "--train.batch_size=64"],
    "cnn": ["--model.type=cnn", "--model.conv_channels=8,16", "--model.fc=32", "--train.batch_size=32"],
}


class DataParallelParity(unittest.TestCase):
    def check(self, name, extra):
        with tempfile.TemporaryDirectory() as d:
            common = MODELS[name] + [f"--run.dir={d}", f"--train.max_steps={STEPS}", "--run.log_interval=1",
                                     "--model.dropout=0", "--optim.type=adamw", "--optim.lr=0.002",
                                     "--schedule.kind=cosine", "--schedule.warmup_steps=5", "--train.grad_clip=1.0",
                                     "--data.num_workers=1"]
            run_trainer(1, common + ["--run.name=np1"])
            run_trainer(4, common + ["--run.name=np4"] + extra)
            one, four = step_losses(os.path.join(d, "np1")), step_losses(os.path.join(d, "np4"))
            self.assertEqual(len(one), STEPS)
            self.assertEqual(len(four), STEPS)
            worst = max(abs(a - b) / abs(a) for a, b in zip(one, four))
            print(f"{name} {extra}: worst relative loss difference over {STEPS} steps {worst:.2e}")
            self.assertLess(worst, 1e-5)
            self.assertLess(one[-1], one[0])

    def test_mlp(self):
        self.check("mlp", ["--dist.bucket_cap_mb=0.05", "--dist.first_bucket_mb=0.01"])

    def test_mlp_rebuilt_buckets(self):
        self.check("mlp", ["--dist.bucket_cap_mb=0.2", "--dist.rebuild_buckets=true"])

    def test_cnn(self):
        self.check("cnn", ["--dist.bucket_cap_mb=0.01", "--dist.first_bucket_mb=0.001"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
