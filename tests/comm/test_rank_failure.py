#!/usr/bin/env python3
"""A rank that dies brings the others down: kill -9 of one rank makes every other rank exit
non-zero well within the collective timeout, with a message naming the lost rank; a rank that
hangs (SIGSTOP) makes the others fail with a collective timeout that names the op."""
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from common import trainer_cmd  # noqa: E402


def start(d, name, timeout_s, env=None):
    cmd = trainer_cmd(4, ["--model.type=mlp", "--train.max_steps=100000", "--run.log_interval=20",
                          f"--run.dir={d}", f"--run.name={name}", f"--dist.timeout_s={timeout_s}"])
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, **(env or {})))


def wait_for_training(d, name, proc, seconds=120):
    metrics = os.path.join(d, name, "metrics.jsonl")
    deadline = time.time() + seconds
    while time.time() < deadline:
        if os.path.exists(metrics) and os.path.getsize(metrics) > 0:
            return
        if proc.poll() is not None:
            raise AssertionError("trainer ended early:\n" + proc.stdout.read())
        time.sleep(0.2)
    raise AssertionError("trainer did not start training")


def pid_of(d, name, rank):
    with open(os.path.join(d, name, f"rank{rank}.pid")) as f:
        return int(f.read())


def gone(pid, seconds=10):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] in ("Z", "X"):
                    return True  # exited, not yet reaped
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def stop_rank_and_wait(d, name, proc, rank):
    """SIGSTOP the rank, wait for the job to end (90 s at most), then kill the stopped rank.
    Returns the job's output and the seconds from the stop to the end."""
    victim = pid_of(d, name, rank)
    t0 = time.time()
    os.kill(victim, signal.SIGSTOP)
    try:
        out, _ = proc.communicate(timeout=90)
    finally:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return out, time.time() - t0


class RankFailure(unittest.TestCase):
    def test_kill_9(self):
        with tempfile.TemporaryDirectory() as d:
            proc = start(d, "kill", timeout_s=120)
            wait_for_training(d, "kill", proc)
            victim = pid_of(d, "kill", 2)
            others = [pid_of(d, "kill", r) for r in (0, 1, 3)]
            t0 = time.time()
            os.kill(victim, signal.SIGKILL)
            out, _ = proc.communicate(timeout=60)
            elapsed = time.time() - t0
            print(out[-2500:])
            print(f"job ended {elapsed:.1f} s after kill -9 of rank 2 (timeout 120 s)")
            self.assertNotEqual(proc.returncode, 0)
            self.assertLess(elapsed, 30)
            # Every surviving rank said which rank was lost, then exited with the comm-failure code.
            for r in (0, 1, 3):
                self.assertRegex(out, rf"\[r{r} E [^\]]*\] rank 2 lost")
            for pid in others:
                self.assertTrue(gone(pid), f"pid {pid} still running")

    def test_hung_rank_times_out(self):
        with tempfile.TemporaryDirectory() as d:
            proc = start(d, "hang", timeout_s=5)
            wait_for_training(d, "hang", proc)
            out, elapsed = stop_rank_and_wait(d, "hang", proc, 1)
            print(out[-2500:])
            print(f"job ended {elapsed:.1f} s after SIGSTOP of rank 1 (timeout 5 s)")
            self.assertNotEqual(proc.returncode, 0)
            self.assertLess(elapsed, 60)
            self.assertIn("collective timeout on communicator 'world'", out)
            self.assertRegex(out, r"allreduce #\d+ of \d+ bytes")
            self.assertIn("last ", out)  # the dump of recent collectives


class StoppedRank(unittest.TestCase):
    def test_stopped_rank_is_named_by_the_heartbeat(self):
        # SIGSTOP keeps the rank's sockets open, so only its silence shows: the monitor's
        # heartbeat names it, long before the 120 s collective timeout.
        with tempfile.TemporaryDirectory() as d:
            proc = start(d, "stop", timeout_s=120, env={"MT_HEARTBEAT_TIMEOUT_S": "4"})
            wait_for_training(d, "stop", proc)
            out, elapsed = stop_rank_and_wait(d, "stop", proc, 1)
            print(out[-2500:])
            print(f"job ended {elapsed:.1f} s after SIGSTOP of rank 1 (heartbeat timeout 4 s, collective 120 s)")
            self.assertNotEqual(proc.returncode, 0)
            self.assertLess(elapsed, 40)
            self.assertRegex(out, r"rank 1 lost.*has not answered for \d+ s")
            self.assertNotIn("collective timeout", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
