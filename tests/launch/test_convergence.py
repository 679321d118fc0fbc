#!/usr/bin/env python3
"""The shipped configs reach their accuracy targets on Fashion-MNIST (CPU, mpirun -np 2):
fashion_mlp.ini >= 0.88 and fashion_cnn.ini >= 0.91 test accuracy."""
import os
import re
import subprocess
import sys
import tempfile
import unittest

TRAINER = os.environ["TRAINER"]
FASHION = os.environ["FASHION_H5"]
SRC = os.environ["SOURCE_DIR"]


def final_accuracy(config, extra=()):
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.run(["mpirun", "-np", "2", TRAINER, "--config", os.path.join(SRC, "configs", config),
                            f"--data.path={FASHION}", f"--run.dir={d}", "--run.log_interval=1000", *extra],
                           capture_output=True, text=True, timeout=1500)
        if p.returncode != 0:
            raise AssertionError(p.stdout[-2000:] + p.stderr[-2000:])
        m = re.search(r"^final test_accuracy=(\d\.\d+) test_loss=(\d+\.\d+)$", p.stdout, re.M)
        print(p.stdout.strip().splitlines()[-2], "|", m.group(0))
        return float(m.group(1))


class Convergence(unittest.TestCase):
    def test_mlp(self):
        self.assertGreaterEqual(final_accuracy("fashion_mlp.ini"), 0.88)

    def test_cnn(self):
        self.assertGreaterEqual(final_accuracy("fashion_cnn.ini"), 0.91)


if __name__ == "__main__":
    unittest.main(verbosity=2)
