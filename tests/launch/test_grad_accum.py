#!/usr/bin/env python3
"""train.grad_accum_steps: K micro-batches per optimizer step give the losses of one batch of the
same global size (within 1e-6) for no_shard and full_shard on 2 ranks, with one all-reduce's bytes
per step (earlier micro-steps launch no buckets), a run resumed with another K continues the same
trajectory, and a batch that does not split is refused naming the key."""
import json
import os
import subprocess
import tempfile
import unittest

TRAINER = os.environ["TRAINER"]
FASHION = os.environ["FASHION_H5"]
SRC = os.environ["SOURCE_DIR"]
MPI = ["mpirun", "--allow-run-as-root", "--oversubscribe"]


def train(d, name, np, *extra):
    cmd = MPI + ["-np", str(np), TRAINER, "--config", os.path.join(SRC, "configs/fashion_mlp.ini"),
                 f"--data.path={FASHION}", "--run.log_interval=1", f"--run.dir={d}", f"--run.name={name}",
                 "--data.num_workers=1", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return p


def steps(d, name):
    with open(os.path.join(d, name, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["type"] == "step"]


class GradAccum(unittest.TestCase):
    def assertSameLosses(self, a, b, tol=1e-6):
        self.assertEqual([r["step"] for r in a], [r["step"] for r in b])
        worst = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
        print(f"worst relative loss difference over {len(a)} steps: {worst:.2e}")
        self.assertLess(worst, tol)

    def test_micro_batches_match_one_batch(self):
        with tempfile.TemporaryDirectory() as d:
            for strategy in ("no_shard", "full_shard"):
                runs = {}
                for k in (1, 4):
                    name = f"{strategy}_k{k}"
                    p = train(d, name, 2, "--train.max_steps=20", f"--train.grad_accum_steps={k}",
                              f"--sharding.strategy={strategy}")
                    self.assertEqual(p.returncode, 0, p.stderr[-3000:])
                    runs[k] = steps(d, name)
                self.assertSameLosses(runs[1], runs[4])
                # Training moved (a test that could not fail otherwise) and the loss is a mean over
                # the whole step's rows, not over a micro-batch.
                self.assertLess(runs[4][-1]["loss"], runs[4][0]["loss"])
                if strategy == "no_shard":
                    # One all-reduce per step: K micro-steps move the bytes of one.
                    self.assertEqual([r["comm_bytes_before"] for r in runs[1]],
                                     [r["comm_bytes_before"] for r in runs[4]])

    def test_resume_with_another_accumulation(self):
        with tempfile.TemporaryDirectory() as d:
            p = train(d, "whole", 2, "--train.max_steps=16")
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            p = train(d, "split", 2, "--train.max_steps=8", "--train.grad_accum_steps=2")
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            p = train(d, "split", 2, "--train.max_steps=16", "--train.grad_accum_steps=4")
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            self.assertIn("resumed from", p.stdout + p.stderr)
            self.assertSameLosses(steps(d, "whole"), steps(d, "split"))

    def test_batch_that_does_not_split_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            p = train(d, "bad", 2, "--train.max_steps=2", "--train.grad_accum_steps=3")  # 64 rows per rank
            self.assertEqual(p.returncode, 2, p.stderr[-2000:])
            self.assertIn("train.grad_accum_steps", p.stderr)
            self.assertIn("64 rows per step", p.stderr)
            p = train(d, "bad0", 1, "--train.max_steps=2", "--train.grad_accum_steps=0")
            self.assertEqual(p.returncode, 2)
            self.assertIn("train.grad_accum_steps", p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
