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
PY = "/usr/bin/python3"


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

    def test_llmc_shards_train_with_the_gpt2_vocabulary(self):
        """An llm.c GPT-2 shard pair (train/val, as dev/data/tinyshakespeare.py writes them) ->
        text_to_tokens -> gpt_tiny: the vocabulary (50257, padded to 50304) follows the data."""
        import numpy as np  # Debian's python3-numpy, as for the converter itself
        rng = np.random.default_rng(1)
        # A repeating sentence of GPT-2 ids (up to the last id, 50256 = <|endoftext|>): learnable.
        sentence = np.concatenate([rng.integers(0, 50256, 30), [50256]]).astype(np.uint16)
        with tempfile.TemporaryDirectory() as d:
            for name, reps in (("train", 400), ("val", 40)):
                toks = np.tile(sentence, reps)
                header = np.zeros(256, np.int32)
                header[0], header[1], header[2] = 20240520, 1, toks.size
                with open(os.path.join(d, f"shard_{name}_000000.bin"), "wb") as f:
                    f.write(header.tobytes() + toks.tobytes())
            h5 = os.path.join(d, "tokens.h5")
            p = subprocess.run([PY, os.path.join(SRC, "scripts/data/text_to_tokens"), "--bin",
                                os.path.join(d, "shard_train_000000.bin"), "--test-bin",
                                os.path.join(d, "shard_val_000000.bin"), "--out", h5],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("vocab 50257", p.stdout)
            self.assertIn(f"{31 * 400} train, {31 * 40} test", p.stdout)
            p = subprocess.run([TRAINER, "--config", os.path.join(SRC, "configs/gpt_tiny.ini"), f"--data.path={h5}",
                                f"--run.dir={d}", "--run.name=g", "--train.max_steps=40", "--run.log_interval=10",
                                "--train.eval_interval=40"], capture_output=True, text=True, timeout=600)
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            with open(os.path.join(d, "g", "metrics.jsonl")) as f:
                recs = [json.loads(l) for l in f]
            mem = [r for r in recs if r["type"] == "memory"][0]
            C, L, T, V = 64, 2, 64, 50304
            self.assertEqual(mem["parameters"], V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C)
            steps = [r for r in recs if r["type"] == "step"]
            self.assertGreater(steps[0]["loss"], 9.0)  # ~ln 50257 = 10.8 at the start
            self.assertLess(steps[-1]["loss"], steps[0]["loss"] - 1.0)
            # A config that pins a smaller vocabulary is told what the data holds.
            p = subprocess.run([TRAINER, "--config", os.path.join(SRC, "configs/gpt_tiny.ini"), f"--data.path={h5}",
                                f"--run.dir={d}", "--run.name=small", "--model.vocab_size=256"],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 2)
            self.assertIn("model.vocab_size", p.stderr)
            self.assertIn("50256", p.stderr)

    def test_converter_names_a_bad_shard(self):
        with tempfile.TemporaryDirectory() as d:
            bad = os.path.join(d, "x.bin")
            with open(bad, "wb") as f:
                f.write(b"\0" * 2048)
            p = subprocess.run([PY, os.path.join(SRC, "scripts/data/text_to_tokens"), "--bin", bad, "--out",
                                os.path.join(d, "t.h5")], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn(bad, p.stderr)
        self.assertIn("magic 0", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(d, "t.h5")))

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
