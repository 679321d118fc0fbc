#!/usr/bin/env python3
"""Evaluation under sharding when the test split does not divide over the ranks: every rank runs
the same number of forwards (a sharded forward all-gathers every unit, so a rank with one batch
more than the others waited for them until the collective timeout), and the figures equal one
rank's. 10,000 test images over 3 ranks with train.eval_batch_size 3333: rank 0 holds 3334 images
(4 batches of at most 1111), ranks 1 and 2 hold 3333 (3 batches)."""
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "comm"))
from common import trainer_cmd  # noqa: E402

BASE = ["--model.type=mlp", "--model.hidden=32", "--train.batch_size=48", "--train.max_steps=6",
        "--run.log_interval=1", "--model.dropout=0", "--train.eval_batch_size=3333", "--train.eval_interval=3",
        "--checkpoint.at_exit=false"]


def evals(d, name):
    with open(os.path.join(d, name, "metrics.jsonl")) as f:
        return [r for r in (json.loads(l) for l in f) if r["type"] == "eval"]


class ShardedEval(unittest.TestCase):
    def test_uneven_test_split_under_full_shard(self):
        with tempfile.TemporaryDirectory() as d:
            subprocess.run(trainer_cmd(1, BASE + [f"--run.dir={d}", "--run.name=one"]), check=True,
                           capture_output=True, timeout=300)
            for strategy in ("full_shard", "shard_grad_op"):
                t0 = time.time()
                p = subprocess.run(trainer_cmd(3, BASE + [f"--run.dir={d}", f"--run.name={strategy}",
                                                          f"--sharding.strategy={strategy}", "--dist.timeout_s=30"]),
                                   capture_output=True, text=True, timeout=300)
                self.assertEqual(p.returncode, 0, f"{strategy} ({time.time() - t0:.0f} s):\n{p.stdout[-2000:]}\n"
                                                  f"{p.stderr[-2000:]}")
                ones, mine = evals(d, "one"), evals(d, strategy)
                self.assertEqual([r["step"] for r in mine], [3, 6])
                for a, b in zip(ones, mine):
                    print(f"{strategy} step {b['step']}: test_loss {b['test_loss']:.6f} vs one rank "
                          f"{a['test_loss']:.6f}, accuracy {b['test_accuracy']:.4f} vs {a['test_accuracy']:.4f}, "
                          f"{b['count']} examples ({time.time() - t0:.1f} s)")
                    self.assertEqual(b["count"], 10000)  # each image once; the padding is not counted
                    self.assertLess(abs(b["test_loss"] - a["test_loss"]) / a["test_loss"], 1e-5)
                    self.assertLessEqual(abs(b["test_accuracy"] - a["test_accuracy"]), 1e-4)


if __name__ == "__main__":
    unittest.main()
