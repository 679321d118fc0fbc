#!/usr/bin/env python3
"""scripts/scaling: the sweep trains over a small grid and writes a CSV with measured throughput
and efficiency plus a PNG; predict tabulates and plots the cost model for an IB and a RoCE machine."""
import csv
import os
import subprocess
import tempfile
import unittest

TRAINER = os.environ["TRAINER"]
FASHION = os.environ["FASHION_H5"]
SRC = os.environ["SOURCE_DIR"]
PY = "/usr/bin/python3"


class ScalingScripts(unittest.TestCase):
    def test_sweep_writes_csv_and_plot(self):
        with tempfile.TemporaryDirectory() as d:
            p = subprocess.run([PY, os.path.join(SRC, "scripts/scaling/sweep"), "--config",
                                os.path.join(SRC, "configs/fashion_mlp.ini"), "--trainer", TRAINER, "--ranks", "1,2",
                                "--bucket-mb", "1,25", "--steps", "60", "--log-interval", "10", "--out", d, "--",
                                f"--data.path={FASHION}", "--data.num_workers=1"],
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr[-3000:])
            rows = list(csv.DictReader(open(os.path.join(d, "sweep.csv"))))
            self.assertEqual(len(rows), 4)
            for r in rows:
                self.assertEqual(r["exit_code"], "0")
                self.assertGreater(float(r["throughput"]), 0)
                self.assertEqual(r["unit"], "samples_per_s")
                if r["ranks"] == "1":
                    self.assertAlmostEqual(float(r["efficiency"]), 1.0)
                else:
                    self.assertGreater(float(r["efficiency"]), 0)
            self.assertGreater(os.path.getsize(os.path.join(d, "sweep.png")), 10000)

    def test_predict_ib_vs_roce(self):
        with tempfile.TemporaryDirectory() as d:
            p = subprocess.run([PY, os.path.join(SRC, "scripts/scaling/predict"), "--trainer", TRAINER, "--nodes",
                                "1,2,8", "--out", d], capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            rows = list(csv.DictReader(open(os.path.join(d, "predict.csv"))))
            self.assertEqual({r["fabric"] for r in rows}, {"ib", "roce"})
            self.assertEqual(len(rows), 6)
            ib = {r["nodes"]: float(r["busbw_1g_gbs"]) for r in rows if r["fabric"] == "ib"}
            roce = {r["nodes"]: float(r["busbw_1g_gbs"]) for r in rows if r["fabric"] == "roce"}
            self.assertEqual(ib["1"], roce["1"])  # inside a node both are NVLink
            self.assertGreater(ib["2"], roce["2"])  # 8 x 400G NDR at 94 % vs 8 x 360G RoCE at 90 %
            self.assertIn("| Azure ND H100 v5, IB NDR | ib | 8 |", p.stdout)
            self.assertGreater(os.path.getsize(os.path.join(d, "predict.png")), 10000)


if __name__ == "__main__":
    unittest.main(verbosity=2)
