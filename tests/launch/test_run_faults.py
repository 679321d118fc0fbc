#!/usr/bin/env python3
"""How a run ends when training or its records go wrong, end to end on the CPU:
 - divergence (--optim.lr=1e10): every rank stops with exit 4 after train.divergence_steps
   non-finite losses, writes no checkpoint of the non-finite weights, keeps the good ones and names
   the newest; a run that ends on non-finite weights never exits 0;
 - a resumed run's metrics.jsonl: a torn last line is dropped, the records of steps trained again
   are dropped, a "resume" record marks the place, every line is JSON;
 - a failed metrics.jsonl write (the run directory's disk full): a checkpoint to a healthy
   checkpoint.dir first, then every rank ends with exit 1 naming the file."""
import json
import os
import subprocess
import tempfile
import unittest

TRAINER = os.environ["TRAINER"]
FASHION = os.environ["FASHION_H5"]
SRC = os.environ["SOURCE_DIR"]
PY = "/usr/bin/python3"
BASE = ["--model.type=mlp", "--model.hidden=32,32,32", "--train.batch_size=64", "--run.log_interval=1",
        f"--data.path={FASHION}", "--train.eval_interval=1000", "--train.eval_batch_size=2000",
        "--data.num_workers=0"]
# Each rank's own exit status, printed by a wrapper (mpirun reports one).
RANK_EXIT = 'MT_RANK_EXIT'


def run(np, args, timeout=300):
    if np == 1:
        cmd = [TRAINER] + BASE + args
    else:
        wrapper = f'"$0" "$@"; rc=$?; echo "{RANK_EXIT} $OMPI_COMM_WORLD_RANK $rc"; exit $rc'
        cmd = ["mpirun", "-np", str(np), "sh", "-c", wrapper, TRAINER] + BASE + args
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def rank_exits(p):
    return sorted(tuple(int(x) for x in l.split()[1:3]) for l in p.stdout.splitlines() if l.startswith(RANK_EXIT))


def records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f]


def checkpoints(d):
    return sorted(n for n in os.listdir(d) if n.startswith("step_"))


class RunFaults(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.d = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_divergence_stops_every_rank_with_exit_4_and_keeps_the_good_checkpoints(self):
        ck = os.path.join(self.d, "ck")
        common = [f"--run.dir={self.d}", "--run.name=r", f"--checkpoint.dir={ck}", "--checkpoint.interval=5",
                  "--checkpoint.keep=2"]
        p = run(2, common + ["--train.max_steps=10"])
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        good = checkpoints(ck)
        self.assertEqual(good, ["step_000000005", "step_000000010"])
        # Resumed at step 10 with a learning rate that blows the weights up at once.
        p = run(2, common + ["--train.max_steps=60", "--optim.lr=1e10"])  # train.divergence_steps = 3
        out = p.stdout + p.stderr
        self.assertEqual(p.returncode, 4, out)
        self.assertEqual(rank_exits(p), [(0, 4), (1, 4)], out)
        self.assertIn("training diverged", out)
        self.assertRegex(out, r"not finite for 3 consecutive steps \(steps 1[1-9] to 1[1-9]")
        self.assertIn(os.path.join(ck, "step_000000010"), out)
        # No checkpoint of the non-finite weights, so pruning (keep = 2) removed no good one.
        self.assertEqual(checkpoints(ck), good)
        recs = records(os.path.join(self.d, "r"))
        diverged = [r for r in recs if r["type"] == "diverged"]
        self.assertEqual(len(diverged), 1, recs[-3:])
        self.assertLess(diverged[0]["step"], 22, "stopped within a few steps of the first non-finite loss")
        after = recs[recs.index([r for r in recs if r["type"] == "resume"][0]):]
        self.assertFalse([r for r in after if r["type"] == "final"], "a diverged run has no final record")
        # The kept checkpoint trains on at a sane learning rate.
        p = run(1, common + ["--train.max_steps=12"])
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("resumed from " + os.path.join(ck, "step_000000010"), p.stdout + p.stderr)

    def test_a_run_that_ends_on_non_finite_weights_never_exits_0(self):
        # Too few steps for the streak (divergence_steps 1000) and no checkpoint: the end checks the weights.
        p = run(1, [f"--run.dir={self.d}", "--run.name=end", "--train.max_steps=6", "--optim.lr=1e10",
                    "--train.divergence_steps=1000", "--checkpoint.at_exit=false"])
        out = p.stdout + p.stderr
        self.assertEqual(p.returncode, 4, out)
        self.assertIn("the weights are not finite", out)
        self.assertFalse(os.path.exists(os.path.join(self.d, "end", "checkpoints")) and
                         checkpoints(os.path.join(self.d, "end", "checkpoints")), out)

    def test_resume_repairs_a_torn_metrics_file_and_drops_redone_steps(self):
        rd = os.path.join(self.d, "t")
        common = [f"--run.dir={self.d}", "--run.name=t", "--checkpoint.interval=10", "--checkpoint.at_exit=false"]
        p = run(1, common + ["--train.max_steps=15"])
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        # As a kill during the write of step 16's record leaves it: no final record, a torn line.
        path = os.path.join(rd, "metrics.jsonl")
        with open(path) as f:
            lines = [l for l in f if '"type":"final"' not in l and '"type":"eval"' not in l]
        with open(path, "w") as f:
            f.writelines(lines)
            f.write('{"type":"step","step":16,"loss":0.4')
        p = run(1, common + ["--train.max_steps=20"])
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        recs = records(rd)  # every line is JSON
        resume = [r for r in recs if r["type"] == "resume"]
        self.assertEqual(len(resume), 1, recs)
        self.assertEqual((resume[0]["step"], resume[0]["dropped_records"], resume[0]["torn_lines"]), (10, 5, 1))
        self.assertEqual([r["step"] for r in recs if r["type"] == "step"], list(range(1, 21)))
        # The resume record sits where the second run's records begin.
        i = recs.index(resume[0])
        self.assertEqual([r["step"] for r in recs[:i] if r["type"] == "step"], list(range(1, 11)))
        p = subprocess.run([PY, os.path.join(SRC, "scripts/plot_run"), rd, "--csv", os.path.join(self.d, "t.csv")],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("warning", p.stderr)

    def test_failed_metrics_write_checkpoints_to_a_healthy_dir_then_every_rank_exits_1(self):
        mnt = os.path.join(self.d, "small")
        os.mkdir(mnt)
        # A run directory on a disk that fills up after some steps' records; checkpoints elsewhere.
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", mnt]).returncode != 0:
            self.skipTest("cannot mount a tmpfs here")
        try:
            ck = os.path.join(self.d, "ck")
            p = run(2, [f"--run.dir={mnt}", "--run.name=full", f"--checkpoint.dir={ck}", "--train.max_steps=3000"])
            out = p.stdout + p.stderr
            self.assertEqual(p.returncode, 1, out[-3000:])
            self.assertEqual(rank_exits(p), [(0, 1), (1, 1)], out[-3000:])
            self.assertIn(os.path.join(mnt, "full", "metrics.jsonl"), out)
            self.assertIn("No space left on device", out)
            saved = checkpoints(ck)
            self.assertEqual(len(saved), 1, out[-3000:])
            self.assertIn(f"saved a checkpoint of step {int(saved[0][5:])} to {ck}: resume from it", out)
            # What was written is whole lines, up to the step the checkpoint holds.
            recs = records(os.path.join(mnt, "full"))
            last = max(r["step"] for r in recs if r["type"] == "step")
            self.assertLessEqual(last, int(saved[0][5:]))
        finally:
            subprocess.run(["umount", "-l", mnt])
        # The checkpoint resumes.
        p = run(1, [f"--run.dir={self.d}", "--run.name=after", f"--checkpoint.dir={ck}",
                    f"--train.max_steps={int(saved[0][5:]) + 2}"])
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("resumed from " + os.path.join(ck, saved[0]), p.stdout + p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
