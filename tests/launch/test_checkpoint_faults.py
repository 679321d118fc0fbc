#!/usr/bin/env python3
"""Checkpoints as hostile input and under slow or failing storage, end to end on the CPU (issue 36):
 - a checkpoint of another model (same parameter count: other hidden sizes, another activation,
   other GPT heads) is refused with exit 2 naming what differs; other data or batch size warn;
 - meta.json values out of range or of the wrong type, and a meta.json without its checksum, are
   refused naming the file and the key (exit 2 for an explicit resume, fallback for auto);
 - `trainer export` of a damaged checkpoint exits 2 with a message naming the key or file, and
   leaves an existing --out untouched;
 - resume verifies each rank file once, on one rank, in parallel, and waits for that under
   checkpoint.timeout_s, not dist.timeout_s; a rank failing to read is agreed on by all ranks;
 - a stop that lands on a checkpoint.interval step writes it once;
 - a resumed compressed run (fp16, bf16, top-k, PowerSGD) continues exactly as the uninterrupted one."""
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest
import zlib

import h5py
import numpy as np

from test_checkpoint import steps as losses  # {step: loss} of a run directory

TRAINER = os.environ["TRAINER"]
FASHION = os.environ["FASHION_H5"]
TOKENS = os.environ.get("TOKENS_H5", "")
SMALL = ["--model.type=mlp", "--model.hidden=256,128", "--train.batch_size=64", "--run.log_interval=1",
         f"--data.path={FASHION}", "--train.eval_interval=1000", "--train.eval_batches=1"]


def run(np_, args, timeout=300, wrap=None):
    """The trainer on np_ ranks; `wrap` (a shell prefix) runs each rank under it."""
    argv = [TRAINER] + SMALL + args
    if wrap:
        argv = ["sh", "-c", wrap + ' "$0" "$@"'] + argv
    if np_ > 1:
        argv = ["mpirun", "-np", str(np_)] + argv
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def reseal(meta):
    """meta.json's checksum of itself recomputed, as an editor who knows the format would."""
    meta.pop("meta_crc32", None)
    body = json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    meta["meta_crc32"] = zlib.crc32(body.encode())
    return meta


def edit_meta(ckpt, change, seal=True):
    path = os.path.join(ckpt, "meta.json")
    with open(path) as f:
        meta = json.load(f)
    meta["time"] = int(meta["time"])  # a float's text is not the same in Python and C++
    change(meta)
    with open(path, "w") as f:
        json.dump(reseal(meta) if seal else meta, f)


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.d = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def train(self, name, np_=2, steps=20, extra=(), interval=10, keep=5):
        p = run(np_, [f"--run.dir={self.d}", f"--run.name={name}", f"--train.max_steps={steps}",
                      f"--checkpoint.interval={interval}", f"--checkpoint.keep={keep}", *extra])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        ck = os.path.join(self.d, name, "checkpoints")
        return ck, sorted(os.listdir(ck))

    def refused(self, p, *needles):
        out = p.stdout + p.stderr
        self.assertEqual(p.returncode, 2, out[-3000:])
        for n in needles:
            self.assertIn(n, out, out[-3000:])
        self.assertNotIn("internal", out)
        return out


class AnotherModel(Base):
    """Item 4: the architecture and every parameter's shape are compared on resume."""

    def test_same_parameter_count_other_sizes_is_refused(self):
        ck, names = self.train("mlp", steps=10)
        # 784*256+256 + 256*128+128 + 128*10+10 == 784*238+238 + 238*194+194 + 194*10+10 == 235146
        p = run(2, [f"--run.dir={self.d}", "--run.name=mlp", "--model.hidden=238,194", "--train.max_steps=20"])
        self.refused(p, "holds another model", "layers[fc1].out_features: 256 in the checkpoint, 238 in this model",
                           "parameter fc1.weight: [256,784] in the checkpoint, [238,784] in this model",
                           "--checkpoint.resume=never")

    def test_other_activation_is_refused(self):
        self.train("act", steps=10)
        p = run(2, [f"--run.dir={self.d}", "--run.name=act", "--model.activation=gelu", "--train.max_steps=20"])
        self.refused(p, "layers[act1].kind: \"relu\" in the checkpoint, \"gelu\" in this model")

    @unittest.skipUnless(TOKENS, "TOKENS_H5 not set")
    def test_other_gpt_heads_are_refused(self):
        gpt = ["--model.type=gpt", "--model.layers=2", "--model.heads=4", "--model.channels=64", "--model.seq_len=32",
               f"--data.path={TOKENS}", "--train.batch_size=8", "--train.max_steps=3", f"--run.dir={self.d}",
               "--run.name=gpt"]
        p = subprocess.run([TRAINER, *gpt], capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        p = subprocess.run([TRAINER, *gpt, "--model.heads=16", "--train.max_steps=6"], capture_output=True, text=True,
                           timeout=300)
        self.refused(p, "n_head: 4 in the checkpoint, 16 in this model")

    def test_other_data_and_batch_size_warn(self):
        self.train("data", steps=10)
        other = os.path.join(self.d, "fashion_copy.h5")
        shutil.copyfile(FASHION, other)
        p = run(2, [f"--run.dir={self.d}", "--run.name=data", f"--data.path={other}", "--train.batch_size=32",
                    "--train.max_steps=12"])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertIn("resumed from", p.stdout)
        self.assertRegex(p.stderr, r"was trained on \S*" + re.escape(os.path.basename(FASHION)) + r" .*this run reads \S*fashion_copy\.h5")
        self.assertIn("was trained with train.batch_size 64, this run uses 32", p.stderr)
        # Dropout is not the model: changing it resumes (with a note).
        p = run(2, [f"--run.dir={self.d}", "--run.name=data", "--model.dropout=0.2", "--train.max_steps=14"])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertIn("dropout", p.stderr)
        # Another run pointed at this run's checkpoint.dir continues it, and says so: its saves
        # rotate that directory.
        shared = os.path.join(self.d, "data", "checkpoints")
        p = run(2, [f"--run.dir={self.d}", "--run.name=other", f"--checkpoint.dir={shared}", "--train.max_steps=16"])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertRegex(p.stderr, r"was written by the run in \S*/data; this run \(\S*/other\) continues it")


class MetaValues(Base):
    """Item 11: every meta.json value is type- and range-checked; the checksum is required."""

    def test_out_of_range_values_fall_back_or_are_refused(self):
        ck, names = self.train("meta", steps=40, interval=10)
        self.assertEqual(names, ["step_000000010", "step_000000020", "step_000000030", "step_000000040"])
        cases = {
            "step_000000040": (lambda m: m.update(step=1e300), "'step' must be an integer in [0, "),
            "step_000000030": (lambda m: m.update(version=999), "'version' is 999; this trainer reads checkpoint versions 1 to 2"),
            "step_000000020": (lambda m: m.update(world_size=0), "'world_size' must be an integer in [1, "),
        }
        for n, (change, _) in cases.items():
            edit_meta(os.path.join(ck, n), change)
        # An explicit resume of each is refused with exit 2 naming the file and the key.
        for n, (_, message) in cases.items():
            p = run(2, [f"--run.dir={self.d}", "--run.name=meta", f"--checkpoint.resume={os.path.join(ck, n)}"])
            self.refused(p, f"checkpoint {os.path.join(ck, n)}: meta.json: {message}")
        # auto falls back past all three to step 10, each named.
        p = run(2, [f"--run.dir={self.d}", "--run.name=meta", "--train.max_steps=42"])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertIn("step_000000010 at step 10", p.stdout)
        for _, message in cases.values():
            self.assertIn(message, p.stderr)

    def test_type_errors_and_missing_checksum_name_the_file(self):
        ck, names = self.train("types", steps=20, interval=10)
        newest = os.path.join(ck, names[-1])
        edit_meta(newest, lambda m: m.update(step="20"))
        p = run(1, [f"--run.dir={self.d}", "--run.name=types", f"--checkpoint.resume={newest}"])
        self.refused(p, f"checkpoint {newest}: meta.json: 'step' must be an integer in [0, ", 'not "20"')
        edit_meta(newest, lambda m: m.update(step=-5))
        p = run(1, [f"--run.dir={self.d}", "--run.name=types", f"--checkpoint.resume={newest}"])
        self.refused(p, "'step' must be an integer in [0, ", "not -5")
        edit_meta(newest, lambda m: (m.update(step=20), m.pop("meta_crc32")), seal=False)
        p = run(1, [f"--run.dir={self.d}", "--run.name=types", f"--checkpoint.resume={newest}"])
        self.refused(p, f"checkpoint {newest}: meta.json: 'meta_crc32' is missing")


class Export(Base):
    """Item 10: `trainer export` of a damaged checkpoint."""

    def export(self, ckpt, out):
        return subprocess.run([TRAINER, "export", "--checkpoint", ckpt, "--out", out], capture_output=True, text=True,
                              timeout=120)

    def test_damaged_checkpoints_exit_2_and_keep_the_old_export(self):
        ck, names = self.train("exp", np_=2, steps=10, interval=10)
        good = os.path.join(ck, names[-1])
        out = os.path.join(self.d, "model.h5")
        self.assertEqual(self.export(good, out).returncode, 0)
        with open(out, "rb") as f:
            before = f.read()

        def damaged(change, name, seal=True):
            c = os.path.join(self.d, name)
            shutil.copytree(good, c)
            edit_meta(c, change, seal)
            return c

        cases = [
            (damaged(lambda m: m.update(numel=str(m["numel"])), "numel"), "'numel' must be an integer"),
            (damaged(lambda m: m.update(step="10"), "step"), "'step' must be an integer"),
            (damaged(lambda m: m["params"][0].update(shape=["256", 784]), "shape"), "'params[0].shape' must be an integer"),
            (damaged(lambda m: m.pop("params"), "noparams"), "'params' is missing"),
            (damaged(lambda m: m["params"][1].update(offset=m["numel"] - 3), "offset"), "lies beyond the checkpoint's"),
            (damaged(lambda m: m["files"][1].update(name="../../etc/passwd"), "path"), "must be rank1.h5"),
        ]
        # A piece index pointing outside the model (the index is checked before the checksum).
        c = os.path.join(self.d, "pieces")
        shutil.copytree(good, c)
        with h5py.File(os.path.join(c, "rank1.h5"), "r+") as f:
            offs = np.array(f["pieces/offsets"])
            offs[0] = 10 ** 12
            f["pieces/offsets"][...] = offs
        cases.append((c, "rank1.h5: piece 0 [1000000000000, +"))
        for ckpt, message in cases:
            p = self.export(ckpt, out)
            self.assertEqual(p.returncode, 2, f"{ckpt}: {p.stderr[-2000:]}")
            self.assertIn(message, p.stderr, ckpt)
            self.assertIn(ckpt, p.stderr)
            self.assertNotIn("internal", p.stderr)
            with open(out, "rb") as f:
                self.assertEqual(f.read(), before, f"{ckpt} changed the existing export")
            self.assertEqual([n for n in os.listdir(self.d) if ".tmp-" in n], [])
        p = self.export(good, self.d)  # --out a directory
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("is not a regular file", p.stderr)
        # --out inside the checkpoint it reads (a rank file, or a new file there): refused, and the
        # checkpoint still exports afterwards.
        rank0 = os.path.join(good, "rank0.h5")
        with open(rank0, "rb") as f:
            rank0_bytes = f.read()
        for inside in (rank0, os.path.join(good, "..", os.path.basename(good), "export.h5")):
            p = self.export(good, inside)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn("is inside the checkpoint it reads", p.stderr)
            with open(rank0, "rb") as f:
                self.assertEqual(f.read(), rank0_bytes)
        self.assertFalse(os.path.exists(os.path.join(good, "export.h5")))
        self.assertEqual(self.export(good, out).returncode, 0)


class Verification(Base):
    """Items 6 and 16: each rank file verified once, in parallel; slow storage is not a step timeout;
    a read failing on one rank is agreed on."""

    def strace(self, ck, paths, inject):
        """A shell prefix running each rank under strace, injecting `inject` into its openat of `paths`
        and logging them to <run>/trace.<rank>."""
        ps = " ".join(f"-P {p}" for p in paths)
        return (f'exec strace -qq -f -o {self.d}/trace.$OMPI_COMM_WORLD_RANK -e trace=openat {ps} '
                f'-e inject=openat:{inject}')

    def opens(self, rank, name):
        with open(os.path.join(self.d, f"trace.{rank}")) as f:
            return sum(1 for line in f if name in line and "openat(" in line)

    @unittest.skipUnless(shutil.which("strace"), "strace not installed")
    def test_each_file_verified_once_on_one_rank_under_the_checkpoint_timeout(self):
        ck, names = self.train("slow", steps=10, interval=10)
        step = os.path.join(ck, names[-1])
        files = [os.path.join(step, f"rank{r}.h5") for r in range(2)]
        # Every open of a checkpoint file takes 1 s: rank 0 alone verifying both files (twice)
        # outlasted dist.timeout_s = 2 while rank 1 waited (exit 3).
        t0 = time.time()
        p = run(2, [f"--run.dir={self.d}", "--run.name=slow", "--train.max_steps=12", "--dist.timeout_s=2"],
                wrap=self.strace(ck, files, "delay_enter=1000000"))
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-3000:])
        self.assertIn("resumed from", p.stdout)
        mine = [self.opens(r, f"rank{r}.h5") for r in range(2)]
        theirs = [self.opens(r, f"rank{1 - r}.h5") for r in range(2)]
        print(f"resume with 1 s opens: {time.time() - t0:.1f} s; opens of its own file {mine}, of the other {theirs}")
        # Each rank verifies its own file and loads from both: its own file is opened for both, the
        # other's for loading only, and no rank does more than another.
        self.assertEqual(mine[0], mine[1])
        self.assertEqual(theirs[0], theirs[1])
        self.assertEqual(mine[0], 2 * theirs[0])

    @unittest.skipUnless(shutil.which("strace"), "strace not installed")
    def test_a_file_one_rank_cannot_open_is_agreed_on(self):
        ck, names = self.train("eacces", steps=10, interval=10)
        step = os.path.join(ck, names[-1])
        target = os.path.join(step, "rank0.h5")
        # Rank 1 alone cannot open rank0.h5, which rank 0 verifies: the verification passes and
        # rank 1 fails while loading. It threw alone while rank 0 waited in a barrier (exit 3 after
        # dist.timeout_s); now every rank exits 2 at once with rank 1's message.
        wrap = ('if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then ' + self.strace(ck, [target], "error=EACCES") +
                ' "$0" "$@"; fi; exec')
        t0 = time.time()
        p = run(2, [f"--run.dir={self.d}", "--run.name=eacces", "--train.max_steps=12", f"--checkpoint.resume={step}",
                    "--dist.timeout_s=30"], wrap=wrap, timeout=120)
        elapsed = time.time() - t0
        out = self.refused(p, f"checkpoint {step} is unreadable", "rank0.h5", "Permission denied")
        self.assertLess(elapsed, 25, out[-2000:])


class Saves(Base):
    """Item 8: a stop on an interval step saves once; compressor state is checkpointed."""

    def test_stop_on_an_interval_step_saves_it_once(self):
        rd = os.path.join(self.d, "stop")
        # Every step is an interval step, so the stop lands on one whenever it comes.
        proc = subprocess.Popen(["mpirun", "-np", "2", TRAINER, *SMALL, f"--run.dir={self.d}", "--run.name=stop",
                                 "--train.max_steps=100000", "--checkpoint.interval=1"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 120
        while not (os.path.exists(os.path.join(rd, "metrics.jsonl")) and len(losses(rd)) >= 3):
            self.assertIsNone(proc.poll(), proc.stdout.read() if proc.poll() is not None else "")
            self.assertLess(time.time(), deadline)
            time.sleep(0.05)
        with open(os.path.join(rd, "rank1.pid")) as f:
            os.kill(int(f.read()), signal.SIGUSR1)
        out, _ = proc.communicate(timeout=120)
        self.assertEqual(proc.returncode, 0, out[-3000:])
        written = re.findall(r"checkpoint \S+/(step_\d+) written", out)
        self.assertGreater(len(written), 3, out[-3000:])
        self.assertEqual(len(written), len(set(written)), f"saved twice: {written}")

    def test_stop_during_the_final_evaluation_ends_it(self):
        # A CNN evaluated one example per rank and forward: 2,500 forwards per rank, ~10 s on the
        # CPU box with 96 and 192 channels (the default 32 and 64 took 2.5 s, a window a loaded CI
        # machine once missed: the run had ended before the signal). A stop signal to one rank
        # during it ends the pass on both (agreed) within a forward or two, not after the whole
        # test set: no test figures, the run counted finished (its checkpoint written before the
        # evaluation).
        rd = os.path.join(self.d, "evalstop")
        proc = subprocess.Popen(["mpirun", "-np", "2", TRAINER, "--model.type=cnn", f"--data.path={FASHION}",
                                 f"--run.dir={self.d}", "--run.name=evalstop", "--train.max_steps=1",
                                 "--train.eval_batch_size=2", "--model.conv_channels=96,192"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "written in" in line:  # the final checkpoint: the evaluation comes next
                break
        time.sleep(0.5)
        with open(os.path.join(rd, "rank1.pid")) as f:
            pid = int(f.read())
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            out, _ = proc.communicate(timeout=120)
            self.fail("rank 1 had exited before the stop signal: " + ("".join(lines) + out)[-3000:])
        t0 = time.time()
        out, _ = proc.communicate(timeout=120)
        out = "".join(lines) + out
        self.assertEqual(proc.returncode, 0, out[-3000:])
        self.assertLess(time.time() - t0, 5, out[-3000:])
        self.assertIn("final evaluation stopped by a signal", out)
        self.assertNotIn("final test_accuracy", out)
        with open(os.path.join(rd, "metrics.jsonl")) as f:
            final = [json.loads(l) for l in f if '"final"' in l]
        self.assertEqual(final[-1].get("evaluation"), "stopped", final)

    def resumed_equals_uninterrupted(self, method, *extra):
        comp = [f"--compression.method={method}", "--compression.start_iter=3", *extra]
        ck, names = self.train(f"straight_{method}", steps=24, interval=8, extra=comp)
        ref = losses(os.path.join(self.d, f"straight_{method}"))
        p = run(2, [f"--run.dir={self.d}", f"--run.name=resumed_{method}", "--train.max_steps=24",
                    f"--checkpoint.resume={os.path.join(ck, 'step_000000008')}", "--checkpoint.at_exit=false", *comp])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertIn("resumed from", p.stdout)
        got = losses(os.path.join(self.d, f"resumed_{method}"))
        self.assertEqual(sorted(got), list(range(9, 25)))
        for s in range(9, 25):
            self.assertEqual(got[s], ref[s], f"{method}: step {s}")  # bit-identical
        return p

    def test_resumed_fp16_and_bf16_runs_continue_exactly(self):
        self.resumed_equals_uninterrupted("fp16")
        self.resumed_equals_uninterrupted("bf16")

    def test_resumed_topk_run_continues_exactly(self):
        self.resumed_equals_uninterrupted("topk", "--compression.topk_fraction=0.05")

    def test_resumed_powersgd_run_continues_exactly(self):
        self.resumed_equals_uninterrupted("powersgd", "--compression.rank=2")

    def test_compressor_state_on_another_world_size_restarts_with_a_warning(self):
        comp = ["--compression.method=powersgd", "--compression.start_iter=3"]
        ck, names = self.train("resize", steps=8, interval=8, extra=comp)
        p = run(1, [f"--run.dir={self.d}", "--run.name=resize", "--train.max_steps=10", "--dist.backend=mpi", *comp])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertIn("was written by 2 ranks, this run has 1: powersgd error feedback restarts from zero", p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
