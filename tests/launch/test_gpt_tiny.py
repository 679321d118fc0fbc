#!/usr/bin/env python3
"""configs/gpt_tiny.ini trains on the CPU: the loss falls (byte-level text, 2 blocks), tokens/s is
reported, and the data errors of token files are clear."""
import json
import os
import subprocess
import tempfile
import unittest

TRAINER = os.environ["TRAINER"]
TOKENS = os.environ["TOKENS_H5"]
SRC = os.environ["SOURCE_DIR"]


class GptTiny(unittest.TestCase):
    def test_loss_falls(self):
        with tempfile.TemporaryDirectory() as d:
            p = subprocess.run(["mpirun", "-np", "2", TRAINER, "--config", os.path.join(SRC, "configs/gpt_tiny.ini"),
                                f"--data.path={TOKENS}", f"--run.dir={d}", "--run.log_interval=1"],
                               capture_output=True, text=True,
                               timeout=900)
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            with open(os.path.join(d, "gpt_tiny", "metrics.jsonl")) as f:
                recs = [json.loads(l) for l in f]
            steps = [r for r in recs if r["type"] == "step"]
            evals = [r for r in recs if r["type"] == "eval"]
            print("losses:", [round(r["loss"], 3) for r in steps[::25]], "eval:", [round(r["test_loss"], 3) for r in evals])
            self.assertGreater(steps[0]["loss"], 5.0)  # ~ln 256 = 5.55 at the start
            # The last 25 steps' mean: one batch of 16 x 64 tokens is too noisy to judge alone.
            self.assertLess(sum(r["loss"] for r in steps[-25:]) / 25, 2.6)
            self.assertLess(evals[-1]["test_loss"], evals[0]["test_loss"])
            self.assertGreater(steps[-1]["tokens_per_s"], 0)
            self.assertIn("final test_loss=", p.stdout)

    def test_bad_token_file(self):
        images = os.environ["FASHION_H5"]
        p = subprocess.run([TRAINER, "--config", os.path.join(SRC, "configs/gpt_tiny.ini"), f"--data.path={images}"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 2)
        self.assertIn("dataset /train/tokens not found", p.stderr)
        p = subprocess.run([TRAINER, "--config", os.path.join(SRC, "configs/gpt_tiny.ini"), f"--data.path={TOKENS}",
                            "--model.seq_len=10000000"], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 2)
        self.assertIn("windows of 10000001", p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
