#!/usr/bin/env python3
"""`trainer plan`: the memory a configuration needs per rank, computed before anything is
allocated, agrees with the allocator peak of real runs on the CPU within 15 % (MLP, CNN, tiny GPT,
full_shard on 2 ranks, gradient accumulation), says whether it fits a given GPU, and names bad
arguments."""
import json
import os
import subprocess
import tempfile
import unittest

TRAINER = os.environ["TRAINER"]
FASHION = os.environ["FASHION_H5"]
TOKENS = os.environ["TOKENS_H5"]
SRC = os.environ["SOURCE_DIR"]
MPI = ["mpirun", "--allow-run-as-root", "--oversubscribe"]


def plan(config, data, *extra):
    p = subprocess.run([TRAINER, "plan", "--config", os.path.join(SRC, "configs", config), f"--data.path={data}",
                        "--json", *extra], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def measured(d, name, config, data, np, *extra):
    cmd = ([] if np == 1 else MPI + ["-np", str(np)]) + [
        TRAINER, "--config", os.path.join(SRC, "configs", config), f"--data.path={data}", "--train.max_steps=3",
        f"--run.dir={d}", f"--run.name={name}", "--data.num_workers=1", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    with open(os.path.join(d, name, "metrics.jsonl")) as f:
        mem = [r for r in map(json.loads, f) if r["type"] == "memory"][0]
    return max(mem["allocator_peak_bytes"])


class Plan(unittest.TestCase):
    def test_plan_matches_measured_cpu_runs(self):
        cases = [("mlp", "fashion_mlp.ini", FASHION, 1, []),
                 ("cnn", "fashion_cnn.ini", FASHION, 1, []),
                 ("gpt", "gpt_tiny.ini", TOKENS, 1, []),
                 ("gpt_fp8", "gpt_tiny.ini", TOKENS, 1, ["--train.precision=fp8"]),
                 ("mlp_full_shard", "fashion_mlp.ini", FASHION, 2, ["--sharding.strategy=full_shard"]),
                 ("mlp_accum", "fashion_mlp.ini", FASHION, 1, ["--train.grad_accum_steps=4"])]
        with tempfile.TemporaryDirectory() as d:
            for name, config, data, np, extra in cases:
                real = measured(d, name, config, data, np, *extra)
                p = plan(config, data, "--ranks", str(np), *extra)
                ratio = p["device_bytes"] / real
                print(f"{name}: planned {p['device_bytes']} bytes, measured peak {real}: {ratio:.3f}")
                self.assertLess(abs(ratio - 1), 0.15, name)
                self.assertGreater(p["activation_bytes"], 0)
        # Accumulation plans the micro-batch's activations: a quarter of the batch's.
        whole, quarter = plan("fashion_mlp.ini", FASHION), plan("fashion_mlp.ini", FASHION, "--train.grad_accum_steps=4")
        self.assertEqual(quarter["micro_batch"] * 4, whole["micro_batch"])
        self.assertLess(quarter["activation_bytes"], 0.3 * whole["activation_bytes"])

    def test_fits_and_sharding_and_offload(self):
        gpt = ["--model.gpt_preset=d24", "--train.device=cuda", "--train.precision=bf16"]
        p = subprocess.run([TRAINER, "plan", "--config", os.path.join(SRC, "configs/gpt_d12.ini"),
                            f"--data.path={TOKENS}", "--model.vocab_size=50257", "--gpu-memory", "40", *gpt],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("does NOT fit a 40.0 GiB GPU", p.stdout)
        self.assertIn("activations: mlp", p.stdout)
        base = plan("gpt_d12.ini", TOKENS, "--model.vocab_size=50257", *gpt)
        shard = plan("gpt_d12.ini", TOKENS, "--model.vocab_size=50257", "--ranks", "8", "--sharding.strategy=full_shard",
                     *gpt)
        off = plan("gpt_d12.ini", TOKENS, "--model.vocab_size=50257", "--ranks", "8", "--sharding.strategy=full_shard",
                   "--sharding.offload=cpu", *gpt)
        item = lambda pl, what: sum(i["bytes"] for i in pl["items"] if i["what"].startswith(what))
        self.assertLess(item(shard, "optimizer"), item(base, "optimizer") / 7)
        self.assertLess(off["device_bytes"], shard["device_bytes"])
        self.assertGreater(off["host_bytes"], 0)
        self.assertEqual(base["parameters"], 354871296)  # GPT-2 350M with the padded vocabulary

    def test_offload_keeps_the_bf16_gather_copy_only(self):
        # ZeRO-Offload under bf16 compute: the GPU keeps each unit's gather copy in bf16 (2 bytes a
        # parameter, sharding.param_dtype = auto) and no persistent gradient shard (a few units' on
        # their way down); master, gradients and optimizer state are host memory.
        gpt = ["--model.vocab_size=50257", "--model.gpt_preset=d24", "--train.device=cuda", "--train.precision=bf16",
               "--sharding.strategy=full_shard", "--sharding.offload=cpu"]
        off = plan("gpt_d12.ini", TOKENS, *gpt)
        P = off["parameters"]
        rows = lambda pl, what, dev: sum(i["bytes"] for i in pl["items"] if i["what"].startswith(what) and i["device"] == dev)
        gather = rows(off, "parameter shard in bf16", True)
        self.assertGreaterEqual(gather, 2 * P)
        self.assertLessEqual(gather, 2 * P * 1.25)  # the allocator's size classes (d24's: 28 MiB for 24 MiB)
        self.assertLess(rows(off, "gradient", True), P, "a persistent gradient shard on the GPU (4 bytes a parameter)")
        self.assertGreaterEqual(rows(off, "gradient shard on the host", False), 4 * P)
        self.assertGreaterEqual(rows(off, "parameter upload stage in bf16", False), 2 * P)  # pinned, packed by the CPU step
        self.assertEqual(rows(off, "parameters (f32 master", True) + rows(off, "optimizer", True), 0)
        # An explicit f32 gather copy costs 4 bytes a parameter; without offload no copy beside the master.
        f32 = plan("gpt_d12.ini", TOKENS, *gpt, "--sharding.param_dtype=f32")
        self.assertGreaterEqual(rows(f32, "parameter shard in f32", True), 4 * P)
        self.assertGreater(f32["device_bytes"] - off["device_bytes"], 1.9 * P)
        gpu = plan("gpt_d12.ini", TOKENS, *gpt[:-1])
        self.assertEqual(rows(gpu, "parameter shard in", True), 0)
        self.assertGreaterEqual(rows(gpu, "gradients (shard)", True), 4 * P)
        # sharding.offload_fraction = 0.5: the first units keep master (4), gradient shard (4) and
        # AdamW state (8 bytes a parameter) on the GPU, about half the parameters; the rest as above.
        half = plan("gpt_d12.ini", TOKENS, *gpt, "--sharding.offload_fraction=0.5")
        kept = rows(half, "optimizer", True) / 8
        self.assertGreater(kept, 0.4 * P)
        self.assertLess(kept, 0.6 * P)
        self.assertAlmostEqual(rows(half, "optimizer", False) / 8 + kept, P, delta=0.01 * P)
        master = rows(half, "parameters (f32 master", True) / 4  # in the allocator's size classes
        self.assertGreaterEqual(master, kept)
        self.assertLess(master, 1.25 * kept)
        self.assertGreater(rows(half, "gradients (shard)", True), 0.4 * 4 * P)  # reduce_dtype f32
        self.assertLess(off["device_bytes"] + 15 * 0.4 * P, half["device_bytes"])
        self.assertLess(half["host_bytes"], off["host_bytes"])

    def test_bad_arguments_name_themselves(self):
        for args, msg in ((["--ranks", "0"], "--ranks 0"), (["--ranks", "3"], "train.batch_size"),
                          (["--data.path=/nonexistent.h5"], "/nonexistent.h5")):
            p = subprocess.run([TRAINER, "plan", "--config", os.path.join(SRC, "configs/fashion_mlp.ini"),
                                f"--data.path={FASHION}", *args], capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 2, args)
            self.assertIn(msg, p.stderr + p.stdout, args)

    def test_hostile_numbers_exit_2_naming_the_option(self):
        # Each was accepted: --gpu-memory inf "fits", 1e30 ranks became -2^63, 2.5 ranks 2, "2abc" 2;
        # a batch of 2^62 planned "0 B" of activations and 2^46 a negative byte count (int64 overflow).
        mlp = ["--config", os.path.join(SRC, "configs/fashion_mlp.ini"), f"--data.path={FASHION}"]
        gpt = ["--config", os.path.join(SRC, "configs/gpt_tiny.ini"), f"--data.path={TOKENS}"]
        for args, needles in (
                (mlp + ["--gpu-memory", "inf"], ["plan: --gpu-memory inf: expected a finite number in (0, 1048576]"]),
                (mlp + ["--gpu-memory=nan"], ["plan: --gpu-memory nan: expected a finite number"]),
                (mlp + ["--gpu-memory", "-1"], ["plan: --gpu-memory -1: expected a finite number"]),
                (mlp + ["--ranks", "1e30"], ["plan: --ranks 1e30: expected an integer in [1, 1048576]"]),
                (mlp + ["--ranks", "2.5"], ["plan: --ranks 2.5: expected an integer"]),
                (mlp + ["--ranks=2abc"], ["plan: --ranks 2abc: expected an integer"]),
                (mlp + ["--gpus-per-node", "99999"], ["plan: --gpus-per-node 99999: expected an integer in [1, 1024]"]),
                (mlp + ["--train.batch_size=4611686018427387904"],
                 ["--train.batch_size=4611686018427387904", "more than 2^60 bytes"]),
                (gpt + ["--train.batch_size=70368744177664"], ["--train.batch_size=70368744177664",
                                                              "more than 2^60 bytes"]),
                (gpt + ["--model.channels=4294967296", "--model.heads=1"], ["--model.channels=4294967296", "must be in"]),
                (gpt + ["--model.channels=16777216", "--model.heads=1", "--model.layers=4096"],
                 ["model.channels", "more than 2^60 bytes"]),
                (gpt + ["--ranks", "4", "--gpus-per-node", "3", "--sharding.strategy=hybrid_shard"],
                 ["plan: --ranks 4 over nodes of --gpus-per-node 3", "the same number of ranks"])):
            p = subprocess.run([TRAINER, "plan", *args], capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 2, f"{args}: {p.stdout}{p.stderr}")
            for n in needles:
                self.assertIn(n, p.stderr, args)
            self.assertNotIn(" -", p.stdout, "a negative byte count")
        # Large but representable: planned, every count positive, nothing wrapped.
        p = subprocess.run([TRAINER, "plan", *gpt, "--train.batch_size=1099511627776", "--json"], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        j = json.loads(p.stdout.strip().splitlines()[-1])
        self.assertTrue(all(i["bytes"] >= 0 for i in j["items"]), j["items"])
        self.assertGreater(j["activation_bytes"], 2**58)
        self.assertGreaterEqual(j["device_bytes"], j["activation_bytes"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
