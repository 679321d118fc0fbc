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


def run(args, np=1, env=None):
    cmd = ([TRAINER] if np == 1 else ["mpirun", "-np", str(np), TRAINER]) + args
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


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
        # --hierarchical: a second table, flat against node/rail/node per bucket and at 1 GiB.
        p = run(["predict", "--topo", os.path.join(SAMPLES, "oci-hpc-H100-topology.xml"), "--profile", "roce-v2",
                 "--nodes", "8,64", "--csv", "--hierarchical"])
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = p.stdout.strip().splitlines()
        at = lines.index("nodes,gpus,bucket_flat_us,bucket_hier_us,gib_flat_ms,gib_hier_ms")
        rows = [dict(zip(lines[at].split(","), map(float, l.split(",")))) for l in lines[at + 1:]]
        self.assertEqual([r["nodes"] for r in rows], [8, 64])
        self.assertLess(rows[1]["bucket_hier_us"], rows[1]["bucket_flat_us"])
        self.assertGreater(rows[0]["gib_hier_ms"], rows[0]["gib_flat_ms"])

    def test_predict_refuses_hostile_numbers(self):
        # Each was accepted: nan parameters printed a table of zeros, 1e9 nodes a negative GPU count,
        # "2abc" nodes 2, a backward fraction of 5 more overlap than compute; a profile's nic_gbps
        # of nan or 1e309 went into the model.
        topo = ["predict", "--topo", os.path.join(SAMPLES, "oci-hpc-H100-topology.xml"), "--csv"]
        with tempfile.TemporaryDirectory() as d:
            profiles = []
            for name, text in (("nan", "fabric = ib\nnic_gbps = nan\n"), ("huge", "nic_gbps = 1e309\n"),
                               ("eff", "nic_efficiency = inf\n")):
                path = os.path.join(d, name + ".env")
                with open(path, "w") as f:
                    f.write(text)
                profiles.append(path)
            for args, needle in (
                    (["--params", "nan"], "predict: --params nan: expected a finite number in (0, 1e+15]"),
                    (["--params", "inf"], "predict: --params inf: expected a finite number"),
                    (["--nodes", "1000000000"], "predict: --nodes 1000000000: expected an integer in [1, 1048576]"),
                    (["--nodes", "2abc"], "predict: --nodes 2abc: expected an integer"),
                    (["--nodes", "1,,2"], "predict: --nodes 1,,2: expected comma-separated integers, none empty"),
                    (["--backward-fraction", "5"], "predict: --backward-fraction 5: expected a finite number in (0, 1]"),
                    (["--grad-bytes", "-1"], "predict: --grad-bytes -1: expected a finite number in (0, 16]"),
                    (["--compute-ms", "1e400"], "predict: --compute-ms 1e400: expected a finite number"),
                    (["--profile", profiles[0]], f"profile {profiles[0]}:2: nic_gbps='nan': expected a finite number"),
                    (["--profile", profiles[1]], f"profile {profiles[1]}:1: nic_gbps='1e309'"),
                    (["--profile", profiles[2]], f"profile {profiles[2]}:1: nic_efficiency='inf'"),
                    (["--profile", d + "/"], f"profile {d}/: cannot be read: not a regular file (a directory)")):
                p = run(topo + args)
                self.assertEqual(p.returncode, 2, f"{args}: {p.stdout}{p.stderr}")
                self.assertIn(needle, p.stderr, args)
                self.assertNotIn("Traceback", p.stderr)
        # The largest node count is still a positive GPU count.
        p = run(topo + ["--nodes", "1048576"])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.strip().splitlines()[1].split(",")[:2], ["1048576", "8388608"])

    def inter_overlap(self, d, name):
        """Steps (after warm-up) in which some bucket's or unit's inter-node phase started before
        backward's compute ended, over both nodes' rank 0 traces; and the number of steps looked at."""
        hits, total = 0, 0
        for rank in (0, 2):
            with open(os.path.join(d, name, f"trace.rank{rank}.jsonl")) as f:
                steps = [json.loads(l) for l in f][2:]
            for s in steps:
                inter = [b for b in s["buckets"] if b["inter_started_us"] > 0]
                self.assertTrue(inter, f"{name}: no inter-node phase traced in step {s['step']}")
                for b in inter:
                    self.assertGreaterEqual(b["inter_started_us"], b["started_us"])  # chained after the node's phase
                    self.assertGreaterEqual(b["inter_done_us"], b["inter_started_us"])
                early = [b for b in inter if b["inter_started_us"] < s["backward_end_us"]]
                hits += bool(early)
                total += 1
        print(f"{name}: inter-node phase started during backward in {hits} of {total} steps")
        return hits, total

    def same_curve_and_overlap(self, d, base, reference, overlapped):
        """Runs both (name, extra args) on 4 ranks: 50 steps each, the overlapped run's losses within
        1e-6 of the reference's, and its inter-node phase started during backward in at least half
        the steps (a step whose threads were all descheduled may miss)."""
        for name, extra in (reference, overlapped):
            p = run(base + [f"--run.name={name}"] + extra, np=4)
            self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        def losses(name):
            with open(os.path.join(d, name, "metrics.jsonl")) as f:
                return [r["loss"] for r in map(json.loads, f) if r["type"] == "step"]
        la, lb = losses(reference[0]), losses(overlapped[0])
        self.assertEqual(len(la), 50)
        self.assertEqual(len(lb), 50)
        worst = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
        print(f"{overlapped[0]} vs {reference[0]}: worst relative loss difference over 50 steps {worst:.2e}")
        self.assertLess(worst, 1e-6)
        hits, total = self.inter_overlap(d, overlapped[0])
        self.assertGreaterEqual(hits, total // 2)

    def test_hierarchical_training_matches_flat(self):
        # 4 CPU ranks as 2 nodes x 2: the per-bucket hierarchical all-reduce (node reduce-scatter,
        # inter-node all-reduce, node all-gather, chained and issued as each bucket fills) gives the
        # flat all-reduce's losses over 50 steps, and its inter-node phase starts during backward.
        with tempfile.TemporaryDirectory() as d:
            # The CNN: its backward is long enough on CPU ranks for something to overlap (the MLP's
            # is ~0.3 ms); small buckets, so that several fill during it.
            base = ["--model.type=cnn", "--train.batch_size=64", "--train.max_steps=50",
                    "--run.log_interval=1", f"--data.path={FASHION}", f"--run.dir={d}", "--dist.bucket_cap_mb=0.03",
                    "--dist.first_bucket_mb=0.001", "--run.trace=true", "--topo.profile=socket",
                    f"--topo.file={os.path.join(SAMPLES, 'h200-vm-1gpu-dump.xml')}"]
            self.same_curve_and_overlap(d, base, ("flat", []),
                                        ("hier", ["--topo.hierarchical=true", "--topo.node_ranks=2"]))
            env_file = os.path.join(d, "hier", "nccl.env")
            with open(env_file) as f:
                env = f.read()
            self.assertIn("export NCCL_IB_DISABLE='1'  # profile socket", env)
            self.assertIn("export NCCL_TOPO_FILE=", env)
            # The file is one bash sources as it is (to rerun with the same NCCL settings).
            sourced = subprocess.run(["bash", "-c", 'set -eu; source "$1"; echo "$NCCL_IB_DISABLE|$NCCL_TOPO_FILE"',
                                      "bash", env_file], capture_output=True, text=True)
            self.assertEqual(sourced.returncode, 0, sourced.stderr)
            ib, topo_file = sourced.stdout.strip().split("|")
            self.assertEqual(ib, "1")
            self.assertTrue(os.path.isfile(topo_file), topo_file)

    def test_hybrid_shard_replica_reduction_overlaps_backward(self):
        # hybrid_shard on 2 nodes x 2: each unit's replica all-reduce (across nodes) is chained on its
        # node reduce-scatter during backward; the losses are full_shard's over 50 steps.
        with tempfile.TemporaryDirectory() as d:
            base = ["--model.type=mlp", "--model.hidden=256,128", "--train.batch_size=64", "--train.max_steps=50",
                    "--run.log_interval=1", f"--data.path={FASHION}", f"--run.dir={d}", "--run.trace=true"]
            self.same_curve_and_overlap(d, base, ("full", ["--sharding.strategy=full_shard"]),
                                        ("hybrid", ["--sharding.strategy=hybrid_shard", "--topo.node_ranks=2"]))

    def test_nccl_report_and_environment_variables(self):
        # topo.report on 4 CPU ranks as 2 nodes x 2 (hybrid_shard builds intra/inter groups): every
        # communicator with all its groups of world ranks, every NCCL_* variable with its origin
        # (profile, environment), and the note that the MPI backend left NCCL nothing to choose.
        with tempfile.TemporaryDirectory() as d:
            base = ["--model.type=mlp", "--train.batch_size=64", "--train.max_steps=3", f"--data.path={FASHION}",
                    f"--run.dir={d}", "--topo.profile=socket"]
            env = dict(os.environ, NCCL_IB_TIMEOUT="20", NCCL_HOME="/opt/nccl", NCCL_IB_HCAS="mlx5_0")
            p = run(base + ["--run.name=rep", "--topo.report=true", "--sharding.strategy=hybrid_shard",
                            "--topo.node_ranks=2", "--dist.backend=mpi"], np=4, env=env)
            self.assertEqual(p.returncode, 0, p.stderr[-2000:])
            # An unknown NCCL_ name (a typo NCCL ignores silently) is warned about.
            self.assertIn("NCCL_IB_HCAS is not an NCCL parameter", p.stderr + p.stdout)
            with open(os.path.join(d, "rep", "nccl_report.json")) as f:
                rep = json.load(f)
            self.assertEqual(rep["backend"], "mpi")
            self.assertEqual(rep["world_size"], 4)
            comms = {c["name"]: c for c in rep["communicators"]}
            self.assertEqual(comms["world"]["groups"], [[0, 1, 2, 3]])
            self.assertEqual(comms["world.intra"]["groups"], [[0, 1], [2, 3]])
            self.assertEqual(comms["world.inter"]["groups"], [[0, 2], [1, 3]])
            self.assertEqual(comms["world.inter"]["count"], 2)
            env_by_name = {e["name"]: e for e in rep["env"]}
            self.assertEqual(env_by_name["NCCL_IB_TIMEOUT"], {"name": "NCCL_IB_TIMEOUT", "value": "20",
                                                              "origin": "environment"})
            self.assertEqual(env_by_name["NCCL_IB_DISABLE"]["origin"], "profile socket")
            self.assertEqual(env_by_name["NCCL_DEBUG"]["value"], "INFO")
            self.assertIn("NCCL_HOME", env_by_name)  # listed, not checked
            self.assertTrue(any("NCCL was not used" in n for n in rep["notes"]), rep["notes"])
            # The environment's variables reach nccl.env too, as lines bash sources.
            with open(os.path.join(d, "rep", "nccl.env")) as f:
                self.assertIn("export NCCL_IB_TIMEOUT='20'  # environment", f.read())
            # A known NCCL variable with a bad value is a configuration error naming it, on every rank.
            bad = run(base + ["--run.name=bad"], np=2, env=dict(os.environ, NCCL_IB_TIMEOUT="soon"))
            self.assertEqual(bad.returncode, 2, bad.stderr[-2000:])
            self.assertIn("environment variable NCCL_IB_TIMEOUT=soon", bad.stderr + bad.stdout)


    def test_rank_exchange_nic_binding_and_communicator_config(self):
        # 4 CPU ranks as 2 nodes x 2 of the OCI file (each standing in for the file's GPU of its place
        # in the node): the ranks exchange (host, GPU, rail) at start; nccl_report.json has that
        # layout, with the rail groups the inter-node communicator uses; topo.bind_nic exports each
        # rank's rail NICs; a profile's comm.<scope>.<field> lines reach each communicator's config.
        with tempfile.TemporaryDirectory() as d:
            profile = os.path.join(d, "rails.env")
            with open(profile, "w") as f:
                f.write("fabric = roce\ncomm.all.cga_cluster_size = 2\ncomm.inter.max_ctas = 4\n")
            base = ["--model.type=mlp", "--train.batch_size=64", "--train.max_steps=3", f"--data.path={FASHION}",
                    f"--run.dir={d}", f"--topo.file={os.path.join(SAMPLES, 'oci-hpc-H100-topology.xml')}",
                    "--topo.node_ranks=2", "--dist.backend=mpi"]
            env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
            p = run(base + ["--run.name=rails", "--topo.report=true", "--topo.bind_nic=true",
                            "--topo.hierarchical=true", f"--topo.profile={profile}"], np=4, env=env)
            self.assertEqual(p.returncode, 0, p.stderr[-2000:])
            with open(os.path.join(d, "rails", "nccl_report.json")) as f:
                rep = json.load(f)
            layout = rep["layout"]
            self.assertEqual((layout["nodes"], layout["ranks_per_node"], layout["uniform"], layout["rail_aligned"]),
                             (2, 2, True, True))
            self.assertEqual(layout["intra_node_groups"], [[0, 1], [2, 3]])
            self.assertEqual(layout["rail_groups"], [[0, 2], [1, 3]])
            r3 = layout["ranks"][3]
            self.assertEqual((r3["node"], r3["slot"], r3["gpu_busid"], r3["gpu_emulated"]),
                             (1, 1, "0000:2d:00.0", True))
            self.assertEqual(r3["rail"], [{"nic": 1, "devices": "mlx5_3,mlx5_4"}])
            self.assertEqual(r3["nic_binding"], "NCCL_IB_HCA==mlx5_3:1,mlx5_4:2")
            comms = {c["name"]: c for c in rep["communicators"]}
            # The inter-node communicator is the rail's: the same slot (GPU, NIC) on both nodes.
            self.assertEqual(comms["world.inter"]["groups"], layout["rail_groups"])
            self.assertEqual(comms["world.inter"]["nccl_config"], "cga_cluster_size=2 max_ctas=4")
            self.assertEqual(comms["world.intra"]["nccl_config"], "cga_cluster_size=2")
            self.assertEqual(comms["world.intra-gather"]["groups"], layout["intra_node_groups"])
            self.assertEqual(comms["world"]["nccl_config"], "cga_cluster_size=2")
            env_by_name = {e["name"]: e for e in rep["env"]}
            self.assertEqual(env_by_name["NCCL_IB_HCA"]["value"], "=mlx5_0:1,mlx5_1:2")
            self.assertEqual(env_by_name["NCCL_IB_HCA"]["origin"], "topo.bind_nic: rank 0's rail nic0")
            # A variable set outside, which the binding would silently replace, is refused on every rank.
            bad = run(base + ["--run.name=clash", "--topo.bind_nic=true"], np=2,
                      env=dict(env, NCCL_IB_HCA="mlx5"))
            self.assertEqual(bad.returncode, 2, bad.stderr[-2000:])
            self.assertIn("topo.bind_nic = true sets NCCL_IB_HCA", bad.stderr + bad.stdout)
            # Without a topology file there are no rails to bind to.
            nofile = run(["--model.type=mlp", "--train.max_steps=1", f"--data.path={FASHION}", f"--run.dir={d}",
                          "--run.name=nofile", "--topo.bind_nic=true"], np=2, env=env)
            self.assertEqual(nofile.returncode, 2, nofile.stderr[-2000:])
            self.assertIn("topo.bind_nic = true needs topo.file", nofile.stderr + nofile.stdout)
            # NCCL lets NCCL_MAX_CTAS override every communicator's maxCTAs: both set is refused.
            with open(profile, "a") as f:
                f.write("NCCL_MAX_CTAS=8\n")
            both = run(base + ["--run.name=both", f"--topo.profile={profile}"], np=2, env=env)
            self.assertEqual(both.returncode, 2, both.stderr[-2000:])
            self.assertIn("comm.inter.max_ctas sets ncclConfig_t maxCTAs, but NCCL_MAX_CTAS=8", both.stderr + both.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
