#!/usr/bin/env python3
"""Checkpoints and faults, end to end on the CPU:
 - a run stopped by a signal (SIGUSR1 to one rank, or SIGTERM to mpirun) checkpoints, and the
   resumed run continues bit-identically (same losses, same sample indices) to an uninterrupted one;
 - a corrupt newest checkpoint is refused with a clear message and the previous one is used;
 - a full disk during a save ends the job with a clear message, no hang, and the older
   checkpoint intact."""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

TRAINER = os.environ["TRAINER"]
FASHION = os.environ["FASHION_H5"]
BASE = ["--model.type=mlp", "--model.hidden=512,512", "--model.dropout=0.1", "--train.batch_size=256",
        "--train.max_steps=80", "--run.log_interval=1", "--run.trace=true", "--schedule.kind=cosine",
        "--schedule.warmup_steps=10", f"--data.path={FASHION}", "--train.eval_interval=1000"]


def cmd(np, args):
    return ([TRAINER] if np == 1 else ["mpirun", "-np", str(np), TRAINER]) + BASE + args


def run(np, args, timeout=600):
    return subprocess.run(cmd(np, args), capture_output=True, text=True, timeout=timeout)


def steps(run_dir):
    out = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for l in f:
            r = json.loads(l)
            if r["type"] == "step":
                out[r["step"]] = r["loss"]
    return out


def hashes(run_dir):
    out = {}
    with open(os.path.join(run_dir, "trace.rank0.jsonl")) as f:
        for l in f:
            r = json.loads(l)
            out[r["step"]] = r["batch_hash"]
    return out


def wait_for_step(run_dir, step, proc, seconds=120):
    deadline = time.time() + seconds
    path = os.path.join(run_dir, "metrics.jsonl")
    while time.time() < deadline:
        if os.path.exists(path) and max(steps(run_dir).keys(), default=0) >= step:
            return
        if proc.poll() is not None:
            raise AssertionError("trainer ended before step %d:\n%s" % (step, proc.stdout.read()))
        time.sleep(0.05)
    raise AssertionError("step %d never came" % step)


class Checkpoints(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.d = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def reference(self, np, extra=()):
        p = run(np, [f"--run.dir={self.d}", "--run.name=straight", "--checkpoint.at_exit=false", *extra])
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        return steps(os.path.join(self.d, "straight")), hashes(os.path.join(self.d, "straight"))

    def interrupted(self, np, how, total, extra=()):
        name = f"stopped_{how}"
        rd = os.path.join(self.d, name)
        proc = subprocess.Popen(cmd(np, [f"--run.dir={self.d}", f"--run.name={name}", "--checkpoint.interval=10",
                                         *extra]),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_for_step(rd, 25, proc)
        if how == "usr1":
            with open(os.path.join(rd, f"rank{np - 1}.pid")) as f:
                os.kill(int(f.read()), signal.SIGUSR1)  # one rank only: the others must follow
        else:
            # mpirun sends SIGTERM to every rank and SIGKILL one second later: the ranks may or
            # may not finish a new checkpoint, but none may be lost or left half-written.
            proc.send_signal(signal.SIGTERM)
        t0 = time.time()
        out, _ = proc.communicate(timeout=120)
        self.assertLess(time.time() - t0, 30)
        if how == "usr1":
            self.assertEqual(proc.returncode, 0, out[-3000:])
            self.assertIn("preempted at step", out, out[-3000:])
        else:
            self.assertIn("stop signal received", out, out[-3000:])
        stopped = max(steps(rd).keys())
        self.assertLess(stopped, total)
        # The same command resumes.
        p = run(np, [f"--run.dir={self.d}", f"--run.name={name}", *extra])
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        self.assertIn(f"resumed from", p.stdout)
        for n in os.listdir(os.path.join(rd, "checkpoints")):
            self.assertTrue(os.path.exists(os.path.join(rd, "checkpoints", n, "meta.json")), n)
        return steps(rd), hashes(rd), stopped

    def check_identical(self, np, how, total=80):
        extra = [f"--train.max_steps={total}"] if total != 80 else []
        ref, ref_h = self.reference(np, extra)
        got, got_h, stopped = self.interrupted(np, how, total, extra)
        self.assertEqual(sorted(got.keys()), list(range(1, total + 1)))
        for s in range(1, total + 1):
            self.assertEqual(got[s], ref[s], f"step {s} (stopped after {stopped})")  # bit-identical
            self.assertEqual(got_h[s - 1], ref_h[s - 1], f"samples of step {s}")
        print(f"np {np} {how}: stopped after step {stopped}, resumed, {total} steps bit-identical")

    def test_resume_bit_identical_after_sigusr1_one_rank(self):
        self.check_identical(2, "usr1")

    def test_resume_bit_identical_after_sigterm_to_the_job(self):
        # The ranks see mpirun's SIGTERM ~1 s after it (2-core box, 4 ranks): 80 steps raced it
        # (~1 s from step 25 to the end once the CPU AdamW was vectorized), 200 do not.
        self.check_identical(4, "term", total=200)

    def test_single_rank_resume(self):
        self.check_identical(1, "usr1")

    def test_corrupt_latest_checkpoint_falls_back(self):
        ref, _ = self.reference(2)
        rd = os.path.join(self.d, "ckpt")
        p = run(2, [f"--run.dir={self.d}", "--run.name=ckpt", "--checkpoint.interval=20", "--checkpoint.at_exit=false",
                    "--checkpoint.keep=5"])
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        ck = os.path.join(rd, "checkpoints")
        names = sorted(os.listdir(ck))
        self.assertEqual(names, ["step_000000020", "step_000000040", "step_000000060"])
        newest = os.path.join(ck, names[-1], "rank1.h5")
        with open(newest, "r+b") as f:  # flip bytes in the payload
            f.seek(os.path.getsize(newest) - 100)
            f.write(b"\xff" * 16)
        # An explicit resume from it is refused on every rank with exit code 2.
        bad = run(2, [f"--run.dir={self.d}", "--run.name=ckpt", f"--checkpoint.resume={os.path.dirname(newest)}"])
        self.assertEqual(bad.returncode, 2, bad.stderr[-2000:])
        self.assertIn("rank1.h5 does not match its checksum", bad.stderr)
        # auto falls back to step 40 and continues exactly like the uninterrupted run.
        p = run(2, [f"--run.dir={self.d}", "--run.name=ckpt", "--checkpoint.at_exit=false"])
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        self.assertIn("does not match its checksum", p.stderr)
        self.assertIn("resumed from", p.stdout)
        self.assertIn("step_000000040", p.stdout)
        got = steps(rd)
        for s in range(41, 81):
            self.assertEqual(got[s], ref[s], f"step {s}")

    def three_checkpoints(self, name):
        p = run(2, [f"--run.dir={self.d}", f"--run.name={name}", "--checkpoint.interval=20",
                    "--checkpoint.at_exit=false", "--checkpoint.keep=5", "--train.max_steps=70"])
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        ck = os.path.join(self.d, name, "checkpoints")
        self.assertEqual(sorted(os.listdir(ck)), ["step_000000020", "step_000000040", "step_000000060"])
        return ck

    def edit_meta(self, path, change):
        meta_path = os.path.join(path, "meta.json")
        with open(meta_path) as f:
            text = f.read()
        with open(meta_path, "w") as f:
            f.write(change(text))

    def test_malformed_or_edited_meta_falls_back_without_hanging(self):
        # "crc32": "x" escaped the fallback (rank 0 threw, the others waited in a broadcast); an
        # edited step was accepted. Both are now rejected and the older checkpoint is used (a
        # meta.json without its checksum is refused for that alone: tests/launch/test_checkpoint_faults.py
        # has the type and range checks behind it).
        ck = self.three_checkpoints("meta")
        def malformed(text):  # a wrong type where a number belongs, in a meta.json without a checksum
            j = json.loads(text)
            j.pop("meta_crc32", None)
            j["files"][0]["crc32"] = "x"
            return json.dumps(j)

        self.edit_meta(os.path.join(ck, "step_000000060"), malformed)
        self.edit_meta(os.path.join(ck, "step_000000040"), lambda t: t.replace('"step": 40', '"step": 49'))
        t0 = time.time()
        p = run(2, [f"--run.dir={self.d}", "--run.name=meta", "--checkpoint.at_exit=false", "--train.max_steps=80"],
                timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertLess(time.time() - t0, 120)
        self.assertIn("meta.json: 'meta_crc32' is missing", p.stderr)
        self.assertIn("meta.json does not match its checksum", p.stderr)
        self.assertIn("resumed from", p.stdout)
        self.assertIn("step_000000020", p.stdout)

    def test_every_checkpoint_corrupt_is_refused(self):
        # Starting from step 0 over them would overwrite metrics.jsonl and, later, the checkpoints.
        ck = self.three_checkpoints("allbad")
        for n in os.listdir(ck):
            with open(os.path.join(ck, n, "rank0.h5"), "r+b") as f:
                f.seek(os.path.getsize(f.name) - 100)
                f.write(b"\xff" * 16)
        metrics = os.path.join(self.d, "allbad", "metrics.jsonl")
        before = open(metrics).read()
        p = run(2, [f"--run.dir={self.d}", "--run.name=allbad"], timeout=300)
        self.assertEqual(p.returncode, 2, p.stderr[-3000:])
        err = p.stderr
        self.assertIn("every checkpoint in", err)
        for n in ("step_000000020", "step_000000040", "step_000000060"):
            self.assertIn(n, err)
        self.assertIn("checkpoint.resume = never", err)
        self.assertEqual(open(metrics).read(), before)
        # resume = never starts fresh, as asked.
        p = run(2, [f"--run.dir={self.d}", "--run.name=allbad", "--checkpoint.resume=never", "--train.max_steps=5",
                    "--checkpoint.at_exit=false"])
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])

    def test_resume_on_another_world_size_with_dropout(self):
        # Dropout masks were drawn per rank and row position: 4 -> 2 ranks changed the trajectory.
        # Keyed by (seed, step, layer, sample index, feature) they are the same for any world size.
        ref, _ = self.reference(2)
        name = "resized"
        rd = os.path.join(self.d, name)
        proc = subprocess.Popen(cmd(4, [f"--run.dir={self.d}", f"--run.name={name}", "--checkpoint.interval=10"]),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_for_step(rd, 25, proc)
        with open(os.path.join(rd, "rank3.pid")) as f:
            os.kill(int(f.read()), signal.SIGUSR1)
        out, _ = proc.communicate(timeout=120)
        self.assertEqual(proc.returncode, 0, out[-3000:])
        stopped = max(steps(rd).keys())
        p = run(2, [f"--run.dir={self.d}", f"--run.name={name}"])
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        self.assertIn("resumed from", p.stdout)
        got = steps(rd)
        self.assertEqual(sorted(got.keys()), list(range(1, 81)))
        rel = {s: abs(got[s] - ref[s]) / abs(ref[s]) for s in range(1, 81)}
        print(f"4 ranks to step {stopped}, then 2 ranks: relative loss difference to 2 ranks throughout: "
              f"step 1-5 {max(rel[s] for s in range(1, 6)):.1e}, worst {max(rel.values()):.1e}")
        # The same masks: the first steps differ only by the all-reduce's summation order (1e-10 to
        # 1e-8; other masks give ~1e-3), which training then amplifies (~1e-3 by step 80).
        self.assertLess(max(rel[s] for s in range(1, 6)), 1e-6)
        self.assertLess(max(rel.values()), 1e-2)

    @staticmethod
    def catches(pid, sig):
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (int(sig) - 1) & 1)
        return False

    def test_signal_during_setup_is_a_clean_stop(self):
        # The handlers were installed at the end of setup: a SIGTERM in the first ~0.6 s killed
        # the process. Now it is a stop after the first step, with a checkpoint.
        proc = subprocess.Popen(cmd(1, [f"--run.dir={self.d}", "--run.name=early"]), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        # As soon as main() has installed its handler (the kernel's caught-signal mask says so): a
        # fixed sleep raced with loading the process on a busy machine (the default action then
        # killed it before main; seen in CI, 2026-12-03). Setup takes seconds after that point.
        deadline = time.time() + 60
        while not self.catches(proc.pid, signal.SIGTERM):
            self.assertIsNone(proc.poll(), "the trainer exited before installing its signal handlers")
            self.assertLess(time.time(), deadline, "no SIGTERM handler after 60 s")
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        self.assertEqual(proc.returncode, 0, out[-3000:])
        self.assertIn("preempted at step", out)

    def test_disk_full_during_save(self):
        mnt = os.path.join(self.d, "small")
        os.makedirs(mnt)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1400k", "tmpfs", mnt]).returncode != 0:
            self.skipTest("cannot mount a tmpfs here")
        try:
            # One checkpoint (~1.3 MB: params + Adam state of 109k parameters) fits, the second does not.
            t0 = time.time()
            p = run(2, [f"--run.dir={self.d}", "--run.name=full", f"--checkpoint.dir={mnt}", "--checkpoint.interval=20",
                        "--checkpoint.keep=5", "--model.hidden=128,64"], timeout=300)
            self.assertNotEqual(p.returncode, 0)
            self.assertLess(time.time() - t0, 120)
            out = p.stdout + p.stderr
            self.assertIn("checkpoint save to", out)
            self.assertRegex(out, r"No space left on device|disk full|cannot create|writing")
            self.assertEqual(sorted(n for n in os.listdir(mnt)), ["step_000000020"], out[-3000:])  # no half-written one
            # The surviving checkpoint is valid: a run resumes from it.
            shutil.copytree(mnt, os.path.join(self.d, "copy"))
            r = run(1, [f"--run.dir={self.d}", "--run.name=from_full", f"--checkpoint.dir={self.d}/copy",
                        "--train.max_steps=25", "--checkpoint.at_exit=false", "--model.hidden=128,64"])
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
            self.assertIn("resumed from", r.stdout)
        finally:
            subprocess.run(["umount", mnt])


if __name__ == "__main__":
    unittest.main(verbosity=2)
