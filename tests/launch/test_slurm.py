#!/usr/bin/env python3
"""The sbatch templates on a real Slurm (munge + slurmctld + slurmd on localhost, started by
scripts/slurm/local_cluster):
 - train_mpirun.sbatch with 4 CPU tasks completes; the job's state, exit code and metrics are checked;
 - train_srun.sbatch (srun --mpi=pmix) with 2 tasks gets the preemption signal, checkpoints, requeues
   itself and resumes: its final result is bit-identical to an uninterrupted run;
 - train_mpirun.sbatch whose batch script gets SIGTERM, with a 40M-parameter model, saves a complete
   checkpoint and requeues;
 - srun without an MPI plugin is refused with exit code 2 and a message naming the fix.
Skipped (77) when not root or without slurm-wlm (scripts/install_deps.sh --with-slurm installs it)."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

TRAINER = os.environ["TRAINER"]
FASHION = os.environ["FASHION_H5"]
SRC = os.environ["SOURCE_DIR"]
CLUSTER = os.path.join(SRC, "scripts/slurm/local_cluster")
CPU_ONLY = ["--nodes=1", "--gpus-per-node=0", "--cpus-per-task=1", "--time=20"]
ARGS = ["configs/fashion_mlp.ini", f"--data.path={FASHION}", "--run.log_interval=50", "--data.num_workers=1",
        "--dist.timeout_s=60"]


def sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def job_fields(jid):
    p = sh(["scontrol", "show", "job", "-o", str(jid)])
    return dict(f.split("=", 1) for f in p.stdout.split() if "=" in f)


def wait_state(jid, states, timeout, kick_pending=False):
    t0 = time.time()
    while time.time() - t0 < timeout:
        f = job_fields(jid)
        if f.get("JobState") in states:
            return f
        # A requeued job waits for its BeginTime (Slurm holds it a few minutes); start it now.
        if kick_pending and f.get("JobState") == "PENDING" and f.get("Reason") == "BeginTime":
            sh(["scontrol", "update", f"JobId={jid}", "StartTime=now"])
        time.sleep(1)
    raise AssertionError(f"job {jid} not in {states} after {timeout}s: {job_fields(jid)}")


class Slurm(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="mt-slurm-")
        os.environ["MT_SLURM_DIR"] = os.path.join(cls.tmp, "cluster")
        # Ports of our own, so a cluster someone left running does not interfere.
        os.environ["MT_SLURMCTLD_PORT"] = "16917"
        os.environ["MT_SLURMD_PORT"] = "16918"
        p = sh([CLUSTER, "start", "4"], timeout=120)
        if p.returncode != 0:
            raise RuntimeError("local Slurm did not start:\n" + p.stderr)
        os.environ["SLURM_CONF"] = os.path.join(cls.tmp, "cluster", "slurm.conf")

    @classmethod
    def tearDownClass(cls):
        sh([CLUSTER, "stop"], timeout=60)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def submit(self, script, tasks, extra_args, name, wrapper=False):
        runs = os.path.join(self.tmp, "runs")
        if wrapper:  # scripts/slurm/submit shapes the job (a CPU job here: no GPU gres asked for)
            launcher = "mpirun" if "mpirun" in script else "srun"
            p = sh([os.path.join(SRC, "scripts/slurm/submit"), "--launcher", launcher, "--tasks-per-node",
                    str(tasks), "--time", "20", "--sbatch=--parsable", f"--sbatch=--job-name={name}",
                    f"--sbatch=--output={self.tmp}/{name}-%j.out", f"--sbatch=--chdir={SRC}", *ARGS, *extra_args],
                   env=dict(os.environ, MT_TRAINER=TRAINER, MT_RUN_ROOT=runs), cwd=SRC)
        else:
            env = ",".join(["ALL", f"MT_REPO={SRC}", f"MT_TRAINER={TRAINER}", f"MT_RUN_ROOT={runs}"])
            p = sh(["sbatch", "--parsable", f"--job-name={name}", f"--ntasks-per-node={tasks}", *CPU_ONLY,
                    f"--output={self.tmp}/{name}-%j.out", f"--chdir={SRC}", f"--export={env}",
                    os.path.join(SRC, "scripts/slurm", script), *ARGS, *extra_args])
        self.assertEqual(p.returncode, 0, p.stderr)
        jid = int(p.stdout.strip().split(";")[0])
        return jid, os.path.join(runs, f"{name}-{jid}"), os.path.join(self.tmp, f"{name}-{jid}.out")

    def test_mpirun_job_completes(self):
        jid, run_dir, out = self.submit("train_mpirun.sbatch", 4, ["--train.max_steps=200"], "mpirun4", wrapper=True)
        f = wait_state(jid, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, 600)
        log = open(out).read()
        self.assertEqual(f["JobState"], "COMPLETED", log[-3000:])
        self.assertEqual(f["ExitCode"], "0:0")
        self.assertIn("launcher mpirun, rank 0 of 4", log)
        recs = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
        steps = [r for r in recs if r["type"] == "step"]
        final = [r for r in recs if r["type"] == "final"]
        self.assertEqual(steps[-1]["step"], 200)
        self.assertEqual(len(steps[-1]["compute_s_per_rank"]), 4)  # straggler report from every rank
        self.assertEqual(len(final), 1)
        self.assertGreater(final[0]["test_accuracy"], 0.7)

    def test_srun_preemption_requeues_and_resumes(self):
        # Long enough that the signal lands before the end on an idle machine too: 1200 steps ran out
        # in ~4 s there, before the 0.5 s polling and scancel's delivery got to it (CI of 8b3d8b9).
        steps_total = 4000
        total = [f"--train.max_steps={steps_total}"]
        jid, run_dir, out = self.submit("train_srun.sbatch", 2, total, "preempt")
        wait_state(jid, {"RUNNING"}, 300)
        # Preempt once the run is well underway (a checkpoint exists only at the signal).
        metrics = os.path.join(run_dir, "metrics.jsonl")
        t0 = time.time()
        while time.time() - t0 < 300:
            if os.path.exists(metrics):
                with open(metrics) as f:
                    if any(json.loads(l).get("step", 0) >= 100 and json.loads(l)["type"] == "step" for l in f):
                        break
            time.sleep(0.1)
        p = sh(["scancel", "--signal=USR1", "--batch", str(jid)])
        self.assertEqual(p.returncode, 0, p.stderr)
        f = wait_state(jid, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, 900, kick_pending=True)
        log = open(out).read()
        self.assertEqual(f["JobState"], "COMPLETED", log[-3000:])
        self.assertEqual(f["Restarts"], "1", log[-3000:])
        self.assertIn("launcher srun", log)
        self.assertIn("requeueing job", log)
        m = re.search(rf"preempted at step (\d+) of {steps_total}", log)
        self.assertTrue(m, log[-3000:])
        stopped = int(m.group(1))
        self.assertLess(stopped, steps_total)
        self.assertIn(f"at step {stopped} (written by", log)  # the resume message
        final_slurm = re.findall(r"final test_accuracy=\S+ test_loss=\S+", log)
        self.assertEqual(len(final_slurm), 1)
        # The same training without the interruption gives the identical result (CPU f32).
        ref = os.path.join(self.tmp, "ref")
        p = sh(["mpirun", "-np", "2", TRAINER, "--config", os.path.join(SRC, ARGS[0]), *ARGS[1:], *total,
                f"--run.dir={ref}"], timeout=900)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertEqual(re.findall(r"final test_accuracy=\S+ test_loss=\S+", p.stdout), final_slurm)

    def test_mpirun_sigterm_saves_a_slow_checkpoint_and_requeues(self):
        # A 40M-parameter MLP (a checkpoint of ~640 MB per save takes seconds here). SIGTERM to the
        # batch script: passed to mpirun as TERM, Open MPI killed the ranks ~1 s later, leaving only
        # step_*.tmp-* and no requeue; common.sh passes it on as USR1, which mpirun forwards.
        big = ["--model.hidden=8192,4096", "--train.max_steps=100000", "--run.log_interval=1",
               "--checkpoint.interval=0"]
        jid, run_dir, out = self.submit("train_mpirun.sbatch", 2, big, "term")
        wait_state(jid, {"RUNNING"}, 300)
        metrics = os.path.join(run_dir, "metrics.jsonl")
        t0 = time.time()
        while time.time() - t0 < 300:
            if os.path.exists(metrics) and any(json.loads(l)["type"] == "step" for l in open(metrics)):
                break
            time.sleep(0.5)
        p = sh(["scancel", "--signal=TERM", "--batch", str(jid)])
        self.assertEqual(p.returncode, 0, p.stderr)
        t0 = time.time()
        while time.time() - t0 < 300 and "requeueing job" not in open(out).read():
            time.sleep(1)
        log = open(out).read()
        sh(["scancel", str(jid)])
        wait_state(jid, {"CANCELLED", "COMPLETED", "FAILED"}, 120)
        self.assertIn("requeueing job", log, log[-3000:])
        self.assertRegex(log, r"preempted at step \d+")
        ckpts = os.listdir(os.path.join(run_dir, "checkpoints"))
        self.assertTrue([c for c in ckpts if c.startswith("step_") and ".tmp" not in c], ckpts)
        self.assertTrue(os.path.exists(os.path.join(run_dir, "PREEMPTED")) or "trainer stopped at step" in log)

    def test_srun_without_mpi_plugin_is_refused(self):
        p = sh(["srun", "--mpi=none", "-n", "2", *CPU_ONLY, TRAINER, "--config", os.path.join(SRC, ARGS[0]),
                *ARGS[1:]], timeout=300)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("exit code 2", p.stderr)
        self.assertIn("without an MPI plugin", p.stderr)
        self.assertIn("srun --mpi=pmix", p.stderr)


if __name__ == "__main__":
    if os.geteuid() != 0 or not shutil.which("slurmctld"):
        print("skipped: needs root and slurm-wlm (scripts/install_deps.sh --with-slurm)")
        sys.exit(77)
    unittest.main(verbosity=2)
