#!/usr/bin/env python3
"""trainer topo --nccl-log on the logs a large job writes: a 16,384-rank ring line, a 100,000-character
line and a million-rank line parse (the std::regex parser died with SIGSEGV on the first two), bytes
that are not UTF-8 are replaced, and what is not a bounded regular file is refused with exit 2 naming
it."""
import json
import os
import subprocess
import tempfile
import unittest

TRAINER = os.environ["TRAINER"]
HEAD = "nodeA:4242:4250 [0] NCCL INFO "


def topo(path, timeout=60):
    return subprocess.run([TRAINER, "topo", "--nccl-log", path], capture_output=True, text=True, timeout=timeout)


class NcclLogCli(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.d = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, lines):
        path = os.path.join(self.d, name)
        with open(path, "w") as f:
            f.write("".join(line + "\n" for line in lines))
        return path

    def test_large_job_log_parses(self):
        ranks = " ".join(str(r) for r in range(16384))
        million = " ".join(str(r) for r in range(1 << 20))
        path = self.write("nccl.log", [
            HEAD + "NCCL version 2.28.3+cuda13.0",
            HEAD + "ncclCommInitRankConfig comm 0x55d0c1a0 rank 0 nranks 16384 cudaDev 0 nvmlDev 0 busId 18000 "
                   "commId 0x9f3c - Init START",
            HEAD + "Channel 00/02 : " + ranks,
            HEAD + "x" * 100000,
            HEAD + "Channel 01/02 : " + million,
            HEAD + "comm 0x55d0c1a0 rank 0 nranks 16384 cudaDev 0 busId 18000 commId 0x9f3c - Init COMPLETE",
        ])
        p = topo(path)
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        j = json.loads(p.stdout)
        self.assertEqual(j["version"], "2.28.3+cuda13.0")
        self.assertEqual(len(j["comms"]), 1)
        comm = j["comms"][0]
        self.assertEqual((comm["nranks"], comm["init_complete"]), (16384, True))
        self.assertEqual(comm["rings"], ["00/02 : " + ranks])
        # The 7 MB line is over the bound a line may have: counted and named, not kept.
        self.assertEqual(j["long_lines_skipped"], 1)
        self.assertTrue(j["warnings"][0].startswith("line 5: "), j["warnings"])
        self.assertEqual((j["lines"], j["info_lines"]), (6, 5))

    def test_bytes_that_are_not_utf8_are_replaced(self):
        # A log is bytes: one stray byte made the JSON dump throw (trainer aborted, exit 134).
        path = os.path.join(self.d, "latin1.log")
        with open(path, "wb") as f:
            f.write(HEAD.encode() + b"NCCL version 2.28\xff\n" + HEAD.encode() + b"Channel 00/01 : 0 1\n")
        p = topo(path)
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        j = json.loads(p.stdout)
        self.assertEqual(j["version"], "2.28\ufffd")
        self.assertEqual(j["comms"][0]["rings"], ["00/01 : 0 1"])

    def test_unusable_paths_exit_2_naming_them(self):
        big = os.path.join(self.d, "huge.log")
        with open(big, "w") as f:
            f.truncate(65 << 20)  # sparse: over the 64 MiB a whole-file read takes, no disk used
        for path, why in ((self.d, "not a regular file (a directory)"),
                          ("/dev/zero", "not a regular file (a character device)"),
                          (big, "more than the 64 MiB"),
                          (os.path.join(self.d, "absent.log"), "No such file or directory")):
            p = topo(path, timeout=20)
            self.assertEqual(p.returncode, 2, p.stdout[-500:] + p.stderr[-500:])
            self.assertIn(f"--nccl-log {path}: cannot read it: ", p.stderr)
            self.assertIn(why, p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
