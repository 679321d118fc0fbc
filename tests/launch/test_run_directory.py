#!/usr/bin/env python3
"""The run directory and the trainer's files under a hostile operator (issue 36):
 1. a setup step that fails on rank 0 alone (config.ini or metrics.jsonl a directory, a read-only or
    full disk) ends every rank with exit 2 and one message within seconds, never a hang;
 2. one job at a time per run directory: a second job exits 2 naming the first (host, pid, start);
    the lock of a dead job is taken over (at once on this machine, after run.lock_stale_s elsewhere);
 3. checkpoint.resume = never moves the previous run aside instead of mixing with it, and the
    preemption message of such a run says how to resume it;
12. --config, topo.file, topo.profile and --nccl-log take regular files of bounded size only;
15. what mpirun returns after a preemption checkpoint, as the README says;
 and trainer --version."""
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import unittest

TRAINER = os.environ["TRAINER"]
FASHION = os.environ["FASHION_H5"]
SOURCE_DIR = os.environ.get("SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BASE = [f"--data.path={FASHION}", "--data.mode=stream", "--data.num_workers=1", "--model.hidden=32",
        "--train.batch_size=64", "--run.log_interval=5"]


def command(np, args):
    return ([TRAINER] if np == 1 else ["mpirun", "-np", str(np), TRAINER]) + BASE + args


def run(np, args, timeout=60):
    """(returncode, stdout + stderr, seconds). A job still running after `timeout` is a hang: it is
    ended (SIGTERM to mpirun, which kills its ranks) and the test fails."""
    t0 = time.time()
    p = subprocess.Popen(command(np, args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        try:
            out, _ = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
        raise AssertionError(f"hung: still running after {timeout} s:\n{out[-3000:]}")
    return p.returncode, out, time.time() - t0


def start(np, args, log):
    """A job left running, its output in the file `log` (a pipe nobody reads while the job runs
    would fill, and block the ranks in their next log line)."""
    # One thread per rank that sleeps when idle: on a 2-core CI machine the left-running job's
    # spinning OpenMP teams otherwise starve the second job's start for tens of seconds (seen: 58 s).
    env = dict(os.environ, MT_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    with open(log, "w") as f:
        return subprocess.Popen(command(np, args), stdout=f, stderr=subprocess.STDOUT, text=True, env=env)


def finish(proc, log, timeout=60):
    proc.wait(timeout=timeout)
    with open(log) as f:
        return f.read()


def error_lines(out):
    return [l for l in out.splitlines() if "error:" in l]


def records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def wait_for_step(run_dir, proc, step=1, seconds=120):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if any(r["type"] == "step" and r["step"] >= step for r in records(run_dir)):
                return
        except (OSError, ValueError):
            pass
        if proc.poll() is not None:
            raise AssertionError(f"the job ended early (rc {proc.returncode})")
        time.sleep(0.05)
    raise AssertionError(f"step {step} never came")


class TempDir(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)  # after the unmounts, registered later (cleanups run last first)
        self.d = tmp.name

    def assertContains(self, text, needle):
        self.assertTrue(needle in text, f"{needle!r} not in:\n{text[-3000:]}")

    def mount_tmpfs(self, path, options):
        os.makedirs(path, exist_ok=True)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", path],
                          capture_output=True).returncode != 0:
            self.skipTest("cannot mount a tmpfs here")
        self.addCleanup(subprocess.run, ["umount", "-l", path])

    def expect_setup_error(self, args, needles, np=2, seconds=30):
        code, out, took = run(np, args)
        self.assertEqual(code, 2, out[-3000:])
        self.assertLess(took, seconds, out[-3000:])
        lines = error_lines(out)
        self.assertEqual(len(lines), 1, f"expected the message once:\n{out[-3000:]}")
        for n in needles:
            self.assertIn(n, lines[0])
        return lines[0]


class RankZeroAloneFailsAtTheEndOfSetup(TempDir):
    """Item 1: rank 0 writes config.ini and metrics.jsonl alone; its failure used to leave it in the
    setup agreement and the others in the StopAgreement's MPI_Comm_dup, forever."""

    def test_config_ini_is_a_directory(self):
        os.makedirs(os.path.join(self.d, "x", "config.ini"))
        self.expect_setup_error([f"--run.dir={self.d}", "--run.name=x", "--train.max_steps=5"],
                                [os.path.join(self.d, "x", "config.ini"), "Is a directory"])

    def test_metrics_jsonl_is_a_directory(self):
        os.makedirs(os.path.join(self.d, "x", "metrics.jsonl"))
        self.expect_setup_error([f"--run.dir={self.d}", "--run.name=x", "--train.max_steps=5"],
                                [os.path.join(self.d, "x", "metrics.jsonl")])

    def test_read_only_run_directory(self):
        ro = os.path.join(self.d, "ro", "x")
        self.mount_tmpfs(ro, "ro,size=1m")
        # Checkpoints elsewhere: the directory's first writer is rank 0 alone (checkpoint.dir's own
        # creation is agreed on already).
        self.expect_setup_error([f"--run.dir={os.path.dirname(ro)}", "--run.name=x", "--train.max_steps=5",
                                 f"--checkpoint.dir={self.d}/ck"], ["Read-only file system", ro])

    def test_full_disk(self):
        # With no room at all, and with room for the lock and pid files but not config.ini: exit 2
        # naming the disk's error either way, and never an empty config.ini.
        for spare in (0, 3):
            full = os.path.join(self.d, f"full{spare}")
            self.mount_tmpfs(full, "size=256k")
            st = os.statvfs(full)
            with open(os.path.join(full, "filler"), "wb") as f:
                f.write(b"\0" * ((st.f_bavail - spare) * st.f_frsize))
            run_dir = os.path.join(full, "x")
            code, out, took = run(2, [f"--run.dir={full}", "--run.name=x", "--train.max_steps=5"])
            self.assertEqual(code, 2, f"spare {spare}:\n{out[-3000:]}")
            self.assertLess(took, 30)
            self.assertContains(out, "No space left on device")
            # With a little room, whichever setup file comes first meets the full disk (config.ini
            # from rank 0, or another rank's pid file): each is named.
            names = ("run.lock",) if spare == 0 else ("config.ini", "rank0.pid", "rank1.pid")
            self.assertTrue(any(n in out for n in names), f"none of {names} in:\n{out[-3000:]}")
            self.assertEqual(len(error_lines(out)), 1, out[-3000:])
            ini = os.path.join(run_dir, "config.ini")
            if os.path.exists(ini):
                self.assertGreater(os.path.getsize(ini), 0, "an empty config.ini")


class RunDirectoryLock(TempDir):
    """Item 2: <run_dir>/run.lock."""

    def lock_file(self, name="x"):
        return os.path.join(self.d, name, "run.lock")

    def write_lock(self, host, pid, boot_id, pid_ns, age_s, name="x"):
        os.makedirs(os.path.join(self.d, name), exist_ok=True)
        with open(self.lock_file(name), "w") as f:
            json.dump({"host": host, "pid": pid, "started": "2026-12-04 17:45:01 UTC", "slurm_job": "",
                       "boot_id": boot_id, "pid_ns": pid_ns, "pid_start": 0, "token": "0123456789abcdef"}, f)
        t = time.time() - age_s
        os.utime(self.lock_file(name), (t, t))

    def test_second_job_is_refused_naming_the_first(self):
        log = os.path.join(self.d, "first.log")
        # One rank: on a 2-core CI machine a 2-rank first job leaves no core for the second's start.
        first = start(1, [f"--run.dir={self.d}", "--run.name=x", "--train.max_steps=1000000"], log)
        self.addCleanup(lambda: first.poll() is None and (first.kill(), first.wait()))
        run_dir = os.path.join(self.d, "x")
        wait_for_step(run_dir, first)
        with open(os.path.join(run_dir, "rank0.pid")) as f:
            holder = int(f.read())
        self.expect_setup_error([f"--run.dir={self.d}", "--run.name=x", "--train.max_steps=7"],
                                ["in use by another job", f"pid {holder} on host {socket.gethostname()}",
                                 "started 20", self.lock_file()])
        self.assertIsNone(first.poll(), "the first job was disturbed")
        os.kill(holder, signal.SIGUSR1)  # the first job stops cleanly (checkpoint) and lets go
        out = finish(first, log)
        self.assertEqual(first.returncode, 0, out[-3000:])
        self.assertFalse(os.path.exists(self.lock_file()), "the lock outlived its job")
        # metrics.jsonl holds the first job alone: its step records in order, no second config.
        steps = [r["step"] for r in records(run_dir) if r["type"] == "step"]
        self.assertEqual(steps, sorted(steps))
        self.assertEqual(len([r for r in records(run_dir) if r["type"] == "preempted"]), 1)

    def test_lock_of_a_dead_process_on_this_machine_is_taken_over(self):
        with open("/proc/sys/kernel/pid_max") as f:
            gone = int(f.read())  # pids are below pid_max: no process has this one
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
        self.write_lock(socket.gethostname(), gone, boot_id, os.readlink("/proc/self/ns/pid"), age_s=0)
        code, out, _ = run(1, [f"--run.dir={self.d}", "--run.name=x", "--train.max_steps=5"])
        self.assertEqual(code, 0, out[-3000:])
        self.assertContains(out, f"took over the stale run directory lock {self.lock_file()} of pid {gone}")
        self.assertContains(out, "its process is gone")
        self.assertFalse(os.path.exists(self.lock_file()))

    def test_lock_from_another_host_is_held_until_its_heartbeat_is_stale(self):
        self.write_lock("node-b17", 4242, "another-boot", "pid:[4026531836]", age_s=5)
        line = self.expect_setup_error([f"--run.dir={self.d}", "--run.name=x", "--train.max_steps=5"],
                                       ["pid 4242 on host node-b17", "started 2026-12-04 17:45:01 UTC",
                                        "run.lock_stale_s = 300"])
        self.assertTrue(os.path.exists(self.lock_file()), line)
        # Older than run.lock_stale_s: taken over with a warning naming it.
        self.write_lock("node-b17", 4242, "another-boot", "pid:[4026531836]", age_s=100)
        code, out, _ = run(2, [f"--run.dir={self.d}", "--run.name=x", "--train.max_steps=5", "--run.lock_stale_s=60"])
        self.assertEqual(code, 0, out[-3000:])
        self.assertRegex(out, r"took over the stale run directory lock .* of pid 4242 on host node-b17.*"
                              r"heartbeat stopped 1\d\d s ago")

    def test_lock_is_released_when_setup_fails(self):
        code, out, _ = run(2, [f"--run.dir={self.d}", "--run.name=x", "--model.hidden=999999999"])
        self.assertEqual(code, 2, out[-3000:])
        self.assertFalse(os.path.exists(self.lock_file()))


class FreshStartInAUsedDirectory(TempDir):
    """Item 3: checkpoint.resume = never."""

    def test_never_moves_the_previous_run_aside(self):
        run_dir, ckpt = os.path.join(self.d, "x"), os.path.join(self.d, "x", "checkpoints")
        common = [f"--run.dir={self.d}", "--run.name=x", "--checkpoint.interval=10", "--train.eval_interval=1000"]
        code, out, _ = run(2, common + ["--train.max_steps=30"])
        self.assertEqual(code, 0, out[-3000:])
        old_metrics = records(run_dir)
        code, out, _ = run(2, common + ["--train.max_steps=20", "--checkpoint.resume=never"])
        self.assertEqual(code, 0, out[-3000:])
        self.assertContains(out, "moved aside")
        self.assertEqual(sorted(n for n in os.listdir(ckpt) if n.startswith("step_")),
                         ["step_000000010", "step_000000020"])
        # This run's records only; the previous run's files and checkpoints in archive/<time>/.
        self.assertEqual(max(r["step"] for r in records(run_dir) if r["type"] == "step"), 20)
        self.assertEqual(len([r for r in records(run_dir) if r["type"] == "final"]), 1)
        [stamp] = os.listdir(os.path.join(run_dir, "archive"))
        self.assertEqual(records(os.path.join(run_dir, "archive", stamp)), old_metrics)
        self.assertEqual(sorted(os.listdir(os.path.join(ckpt, "archive", stamp))),
                         ["step_000000010", "step_000000020", "step_000000030"])
        # The next normal start finds this run (20 steps, finished), not the previous one's step 30.
        code, out, _ = run(2, common + ["--train.max_steps=20"])
        self.assertEqual(code, 0, out[-3000:])
        self.assertContains(out, "holds a finished run (20 steps")

    def test_preemption_of_a_fresh_start_says_how_to_resume(self):
        args = [f"--run.dir={self.d}", "--run.name=x", "--train.max_steps=1000000", "--checkpoint.resume=never"]
        log = os.path.join(self.d, "job.log")
        proc = start(1, args, log)
        wait_for_step(os.path.join(self.d, "x"), proc)
        proc.send_signal(signal.SIGTERM)
        out = finish(proc, log)
        self.assertEqual(proc.returncode, 0, out[-3000:])
        self.assertContains(out, "preempted at step")
        self.assertContains(out, "run the same command with --checkpoint.resume=auto")
        # ... which resumes (a few steps past wherever the signal found the job).
        stopped = int(re.search(r"preempted at step (\d+)", out).group(1))
        code, out, _ = run(1, args[:2] + [f"--train.max_steps={stopped + 5}", "--checkpoint.resume=auto"])
        self.assertEqual(code, 0, out[-3000:])
        self.assertContains(out, "resumed from")


class FilesMustBeRegularAndBounded(TempDir):
    """Item 12: a directory, FIFO or device where a file is expected is refused at once (exit 2)."""

    def fifo(self):
        path = os.path.join(self.d, "fifo")
        os.mkfifo(path)
        return path

    def test_config(self):
        big = os.path.join(self.d, "big.ini")
        with open(big, "w") as f:
            f.write("# padding\n" * 300000)
        for path, why in ((self.d, "not a regular file (a directory)"), (self.fifo(), "not a regular file (a FIFO)"),
                          ("/dev/zero", "not a regular file (a character device)"), (big, "more than the 1 MiB")):
            self.expect_setup_error(["--config", path, f"--run.dir={self.d}"], [path, why], np=1, seconds=10)
        self.expect_setup_error(["--config=", f"--run.dir={self.d}"], ["--config needs a file"], np=1)

    def test_topology_file_and_profile(self):
        for key in ("topo.file", "topo.profile"):
            for path in (self.d, self.fifo() if key == "topo.file" else "/dev/zero"):
                self.expect_setup_error([f"--{key}={path}", f"--run.dir={self.d}"], [path, "cannot be read"], np=1,
                                        seconds=10)

    def test_nccl_log(self):
        for path in (self.d, self.fifo()):
            p = subprocess.run([TRAINER, "topo", "--nccl-log", path], capture_output=True, text=True, timeout=20)
            self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
            self.assertIn(path, p.stderr)


class PreemptionExitCodes(TempDir):
    """Item 15: what mpirun (Open MPI) returns after the checkpoint, as the README says."""

    def stop(self, sig):
        name = f"sig{int(sig)}"
        log = os.path.join(self.d, name + ".log")
        proc = start(2, [f"--run.dir={self.d}", f"--run.name={name}", "--train.max_steps=1000000"], log)
        wait_for_step(os.path.join(self.d, name), proc)
        proc.send_signal(sig)
        out = finish(proc, log)
        return proc.returncode, out, os.path.join(self.d, name)

    def test_usr1_to_mpirun_exits_0_and_term_exits_1(self):
        code, out, run_dir = self.stop(signal.SIGUSR1)
        self.assertEqual(code, 0, out[-3000:])
        self.assertContains(out, "preempted at step")
        self.assertTrue(os.path.exists(os.path.join(run_dir, "PREEMPTED")))
        # Open MPI's status for a job it was told to end, whatever the ranks did in their second of
        # grace (the checkpoint and marker when it sufficed: not asserted on a busy machine).
        code, out, _ = self.stop(signal.SIGTERM)
        self.assertEqual(code, 1, out[-3000:])
        with open(os.path.join(SOURCE_DIR, "README.md")) as f:
            readme = " ".join(f.read().split())
        self.assertContains(readme, "`mpirun` itself exits 1")
        self.assertContains(readme, "`kill -USR1 <mpirun pid>`")
        self.assertNotIn("0 success (also after a preemption checkpoint)", readme)


class Version(unittest.TestCase):
    def test_version_names_the_commit_and_every_library(self):
        p = subprocess.run([TRAINER, "--version"], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = p.stdout.splitlines()
        m = re.match(r"meshtrain \d+\.\d+\.\d+ \(git ([0-9a-f]{7,}(-dirty)?|unknown[^,]*), ", lines[0])
        self.assertTrue(m, lines[0])
        head = subprocess.run(["git", "-C", SOURCE_DIR, "rev-parse", "HEAD"], capture_output=True, text=True)
        if head.returncode == 0 and not m.group(1).startswith("unknown"):
            self.assertTrue(head.stdout.startswith(m.group(1).split("-")[0]), (head.stdout, lines[0]))
        text = p.stdout
        self.assertRegex(text, r"\n  MPI +Open MPI \d+\.\d+\.\d+ \(MPI \d\.\d\) +Open MPI v\d")
        self.assertRegex(text, r"\n  HDF5 +\d+\.\d+\.\d+ +\d+\.\d+\.\d+")
        devices = subprocess.run([TRAINER, "--devices"], capture_output=True, text=True).stdout
        if "built without CUDA" in devices:
            self.assertIn("not built with CUDA", text)
        else:
            for row in ("CUDA runtime", "CUDA driver", "NCCL", "cuDNN"):
                self.assertRegex(text, r"\n  " + row + r" +[-\d]")


if __name__ == "__main__":
    unittest.main()
