#!/usr/bin/env python3
"""trainer topo (summary, rank layout) / predict from the command line, and a hierarchical data-parallel run on 4 ranks
emulating 2 nodes that matches the flat run step for step."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

TRAINER = os.environ["TRAINER"]
SAMPLES = os.environ["TOPO_SAMPLES"]
FASHION = os.environ["FASHION_H5"]


def run(args, np=1):
    cmd = ([TRAINER] if np == 1 else ["mpirun", "-np", str(np), TRAINER]) + args
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


class TopoCli(unittest.TestCase):
    def test_json_summary(self):
        p = run(["topo", "--file", os.path.join(SAMPLES, "oci-hpc-H100-topology.xml"), "--json"])
        self.assertEqual(p.returncode, 0, p.stderr)
        j = json.loads(p.stdout)
        self.assertEqual(len(j["gpus"]), 8)
        self.assertEqual(len(j["nics"]), 8)
        self.assertEqual([g["rail"] for g in j["gpus"]], [[i] for i in range(8)])
        self.assertEqual(j["primary_fabric"], "roce")
        p = run(["topo", "--file", os.path.join(SAMPLES, "azhpc-ndv5-topo.xml")])
        self.assertIn("8 GPU(s), 8 NIC(s), primary fabric ib", p.stdout)

    def test_rank_layout(self):
        # 8 ranks as 2 nodes x 4 on the OCI file: each rank's GPU, rail NIC and NCCL_IB_HCA, the
        # intra-node groups and one inter-node group per rail.
        p = run(["topo", "--file", os.path.join(SAMPLES, "oci-hpc-H100-topology.xml"), "--ranks", "8",
                 "--ranks-per-node", "4"])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("ranks 8 = 2 node(s) x 4 rank(s)", p.stdout)
        self.assertIn("rank 5: node 1 local 1 gpu1 0000:2d:00.0 numa 0 rail nic1 (PXB) NCCL_IB_HCA==mlx5_3:1,mlx5_4:2",
                      p.stdout)
        self.assertIn("intra-node groups: node0 {0,1,2,3} node1 {4,5,6,7}", p.stdout)
        self.assertIn("inter-node groups (one per rail): rail0 {0,4} rail1 {1,5} rail2 {2,6} rail3 {3,7}", p.stdout)
        # Every sample, 2 nodes of its own GPU count: one rail group per GPU, each with one rank per node.
        for name in sorted(os.listdir(SAMPLES)):
            f = os.path.join(SAMPLES, name)
            gpus = len(json.loads(run(["topo", "--file", f, "--json"]).stdout)["gpus"])
            p = run(["topo", "--file", f, "--ranks", str(2 * gpus)])
            self.assertEqual(p.returncode, 0, name + p.stderr)
            self.assertIn(f"ranks {2 * gpus} = 2 node(s) x {gpus} rank(s)", p.stdout, name)
            self.assertEqual(p.stdout.count(" rail" + str(gpus - 1) + " {"), 1, name)
        # Ranks that do not fill whole nodes, or more per node than the file has GPUs: exit 2.
        p = run(["topo", "--file", os.path.join(SAMPLES, "oci-hpc-H100-topology.xml"), "--ranks", "6",
                 "--ranks-per-node", "4"])
        self.assertEqual(p.returncode, 2)
        self.assertIn("--ranks 6 is not a multiple of 4 ranks per node", p.stderr)
        p = run(["topo", "--file", os.path.join(SAMPLES, "h200-vm-1gpu-dump.xml"), "--ranks", "4",
                 "--ranks-per-node", "2"])
        self.assertEqual(p.returncode, 2)
        self.assertIn("2 ranks per node, but", p.stderr)
        self.assertEqual(run(["topo", "--file", os.path.join(SAMPLES, "h200-vm-1gpu-dump.xml"), "--ranks",
                              "x"]).returncode, 2)

    def test_bad_input_exits_2(self):
        with tempfile.NamedTemporaryFile("w", suffix=".xml", delete=False) as f:
            f.write('<system version="1">\n  <cpu>\n</system>\n')
        p = run(["topo", "--file", f.name])
        os.unlink(f.name)
        self.assertEqual(p.returncode, 2)
        self.assertRegex(p.stderr, rf"{f.name}:3:\d+: XML error")
        self.assertEqual(run(["topo"]).returncode, 2)

    def test_predict(self):
        p = run(["predict", "--topo", os.path.join(SAMPLES, "oci-hpc-H100-topology.xml"), "--profile", "roce-v2",
                 "--nodes", "1,2,4", "--csv"])
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = p.stdout.strip().splitlines()
        header = lines[0].split(",")
        rows = [dict(zip(header, l.split(","))) for l in lines[1:]]
        self.assertEqual([r["nodes"] for r in rows], ["1", "2", "4"])
        eff = [float(r["efficiency"]) for r in rows]
        self.assertTrue(all(0 < e <= 1 for e in eff))
        self.assertGreaterEqual(eff[0], eff[-1])

    def test_hierarchical_training_matches_flat(self):
        with tempfile.TemporaryDirectory() as d:
            base = ["--model.type=mlp", "--train.batch_size=64", "--train.max_steps=30", "--run.log_interval=1",
                    f"--data.path={FASHION}", f"--run.dir={d}", "--dist.bucket_cap_mb=0.2",
                    "--topo.profile=socket", f"--topo.file={os.path.join(SAMPLES, 'h200-vm-1gpu-dump.xml')}"]
            a = run(base + ["--run.name=flat"], np=4)
            b = run(base + ["--run.name=hier", "--topo.hierarchical=true", "--topo.node_ranks=2"], np=4)
            self.assertEqual(a.returncode, 0, a.stderr[-2000:])
            self.assertEqual(b.returncode, 0, b.stderr[-2000:])
            def losses(name):
                with open(os.path.join(d, name, "metrics.jsonl")) as f:
                    return [r["loss"] for r in map(json.loads, f) if r["type"] == "step"]
            la, lb = losses("flat"), losses("hier")
            self.assertEqual(len(la), 30)
            worst = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
            print(f"hierarchical vs flat: worst relative loss difference {worst:.2e}")
            self.assertLess(worst, 1e-5)
            env_file = os.path.join(d, "hier", "nccl.env")
            env = open(env_file).read()
            self.assertIn("export NCCL_IB_DISABLE='1'  # profile socket", env)
            self.assertIn("export NCCL_TOPO_FILE=", env)
            # The file is one bash sources as it is (to rerun with the same NCCL settings).
            sourced = subprocess.run(["bash", "-c", 'set -eu; source "$1"; echo "$NCCL_IB_DISABLE|$NCCL_TOPO_FILE"',
                                      "bash", env_file], capture_output=True, text=True)
            self.assertEqual(sourced.returncode, 0, sourced.stderr)
            ib, topo_file = sourced.stdout.strip().split("|")
            self.assertEqual(ib, "1")
            self.assertTrue(os.path.isfile(topo_file), topo_file)


if __name__ == "__main__":
    unittest.main(verbosity=2)
