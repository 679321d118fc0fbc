#!/usr/bin/env python3
"""train.precision = fp8 through the trainer on the CPU (the FP8 emulation): a tiny GPT trains,
a run stopped at a checkpoint and resumed continues bit-identically to an uninterrupted one on
2 ranks (the FP8 scales and amax histories of every rank are in the checkpoint), and bad FP8
settings are refused with exit 2 naming the key."""
import json
import os
import subprocess
import tempfile
import unittest

TRAINER = os.environ["TRAINER"]
TOKENS = os.environ["TOKENS_H5"]
SRC = os.environ["SOURCE_DIR"]
# A constant learning rate: the first half of a 2 x 12-step run trains exactly as a 12-step run.
BASE = ["--config", os.path.join(SRC, "configs/gpt_tiny.ini"), f"--data.path={TOKENS}", "--run.log_interval=1",
        "--train.eval_interval=1000", "--schedule.kind=constant", "--schedule.warmup_steps=0",
        "--train.precision=fp8", "--fp8.recipe=delayed", "--fp8.amax_history=4"]


def run(np, args, timeout=600):
    cmd = ([TRAINER] if np == 1 else ["mpirun", "-np", str(np), TRAINER]) + BASE + args
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def losses(run_dir):
    out = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for l in f:
            r = json.loads(l)
            if r["type"] == "step":
                out[r["step"]] = r["loss"]
    return out


class Fp8Training(unittest.TestCase):
    def test_resume_is_bit_identical_on_two_ranks(self):
        with tempfile.TemporaryDirectory() as d:
            p = run(2, [f"--run.dir={d}", "--run.name=whole", "--train.max_steps=24"])
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            whole = losses(os.path.join(d, "whole"))
            p = run(2, [f"--run.dir={d}", "--run.name=split", "--train.max_steps=12"])
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            ckpts = sorted(os.listdir(os.path.join(d, "split", "checkpoints")))
            with open(os.path.join(d, "split", "checkpoints", ckpts[-1], "meta.json")) as f:
                meta = json.load(f)
            fp8 = meta["fp8"]
            # 2 blocks x 4 Linears x (x, w, dy), each [casts, scale, scale_inv, amax, 4 history]
            self.assertEqual(len(fp8["names"]), 24)
            self.assertEqual(fp8["names"][:3], ["h0.qkv.x", "h0.qkv.w", "h0.qkv.dy"])
            self.assertEqual([len(r) for r in fp8["ranks"]], [24 * 8, 24 * 8])
            self.assertEqual(fp8["ranks"][0][0], 12)  # 12 casts of h0.qkv's input
            self.assertNotEqual(fp8["ranks"][0], fp8["ranks"][1])  # each rank's own activations
            p = run(2, [f"--run.dir={d}", "--run.name=split", "--train.max_steps=24"])
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            self.assertIn("resumed from", p.stdout + p.stderr)
            split = losses(os.path.join(d, "split"))
            self.assertEqual(sorted(split), list(range(1, 25)))
            for s in range(1, 25):
                self.assertEqual(split[s], whole[s], f"step {s}: resumed {split[s]} vs uninterrupted {whole[s]}")
            self.assertLess(sum(whole[s] for s in range(20, 25)) / 5, whole[1] - 0.3)  # it trains

    def test_resume_without_the_fp8_state_differs(self):
        """The checkpointed state matters: a resume that drops it (another amax history length) is
        warned about and its losses leave the uninterrupted run's."""
        with tempfile.TemporaryDirectory() as d:
            p = run(1, [f"--run.dir={d}", "--run.name=whole", "--train.max_steps=16"])
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            p = run(1, [f"--run.dir={d}", "--run.name=split", "--train.max_steps=8"])
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            p = run(1, [f"--run.dir={d}", "--run.name=split", "--train.max_steps=16", "--fp8.amax_history=8"])
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            self.assertIn("FP8 scales start afresh", p.stdout + p.stderr)
            whole, split = losses(os.path.join(d, "whole")), losses(os.path.join(d, "split"))
            self.assertEqual([split[s] for s in range(1, 9)], [whole[s] for s in range(1, 9)])
            self.assertNotEqual([split[s] for s in range(9, 17)], [whole[s] for s in range(9, 17)])

    def test_bad_settings_exit_2_naming_the_key(self):
        with tempfile.TemporaryDirectory() as d:
            for args, key in ((["--fp8.layers=qkv,mlp"], "fp8.layers"),
                              (["--fp8.layers=,,"], "fp8.layers=,,: names no layer"),
                              (["--model.type=mlp"], "train.precision"),
                              (["--fp8.amax_history=0"], "fp8.amax_history"),
                              (["--fp8.recipe=sometimes"], "fp8.recipe")):
                p = run(1, [f"--run.dir={d}", "--run.name=bad"] + args, timeout=120)
                self.assertEqual(p.returncode, 2, f"{args}: {p.stderr[-2000:]}")
                self.assertIn(key, p.stderr, args)
            # Read when the FP8 layers are made, at model setup, before the first step.
            p = subprocess.run([TRAINER] + BASE + [f"--run.dir={d}", "--run.name=bad_env", "--train.max_steps=2"],
                               capture_output=True, text=True, timeout=120, env=dict(os.environ, MT_FP8_GELU="4"))
            self.assertEqual(p.returncode, 2, p.stderr[-2000:])
            self.assertIn("MT_FP8_GELU='4' is out of range (0..3)", p.stderr)

    def test_gelu_modes_train_alike_and_profile_range_is_harmless_on_the_cpu(self):
        # MT_FP8_GELU = 3 (the GELU inside the casts) and 0 (its kernels) compute the same values on
        # the CPU: the same losses to the bit. run.profile_from on a CPU run warns and trains.
        with tempfile.TemporaryDirectory() as d:
            got = {}
            for mode in ("0", "3"):
                p = subprocess.run([TRAINER] + BASE + [f"--run.dir={d}", f"--run.name=gelu{mode}", "--train.max_steps=6",
                                                       "--run.profile_from=2", "--run.profile_steps=2"],
                                   capture_output=True, text=True, timeout=300, env=dict(os.environ, MT_FP8_GELU=mode))
                self.assertEqual(p.returncode, 0, p.stderr[-2000:])
                self.assertIn("run.profile_from: no CUDA device in this run, nothing to profile", p.stdout + p.stderr)
                got[mode] = losses(os.path.join(d, f"gelu{mode}"))
            self.assertEqual(sorted(got["3"]), list(range(1, 7)))
            self.assertEqual(got["0"], got["3"])


if __name__ == "__main__":
    unittest.main()
