#!/usr/bin/env python3
"""The user-facing scripts: one interpreter rule for every Python script (scripts/lib/pydeps.py), a
missing module named with its Debian package and exit status 2, and scripts/plot_run rendering
real runs (PNG and CSV)."""
import csv
import os
import struct
import subprocess
import tempfile
import unittest
import zlib

TRAINER = os.environ["TRAINER"]
FASHION = os.environ["FASHION_H5"]
SRC = os.environ["SOURCE_DIR"]
PY = "/usr/bin/python3"


def python_scripts():
    out = []
    for top in ("scripts", "tests"):
        for d, _, files in os.walk(os.path.join(SRC, top)):
            for f in files:
                p = os.path.join(d, f)
                with open(p, "rb") as fh:
                    head = fh.readline()
                if head.startswith(b"#!") and b"python" in head:
                    out.append((os.path.relpath(p, SRC), head.decode().strip()))
    return out


def png_size(path):
    with open(path, "rb") as fh:
        data = fh.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    w, h = struct.unpack(">II", data[16:24])
    return w, h, data


def png_distinct_rows(data, sample=64):
    """Crude check that the image is not blank: decompress IDAT and count distinct scanlines."""
    idat = b""
    i = 8
    while i < len(data):
        n, kind = struct.unpack(">I4s", data[i:i + 8])
        if kind == b"IDAT":
            idat += data[i + 8:i + 8 + n]
        i += 12 + n
    raw = zlib.decompress(idat)
    w, h = struct.unpack(">II", data[16:24])
    stride = len(raw) // h
    rows = {raw[r * stride:(r + 1) * stride] for r in range(0, h, max(1, h // sample))}
    return len(rows)


class Scripts(unittest.TestCase):
    def test_every_python_script_uses_env_python3(self):
        scripts = python_scripts()
        self.assertGreater(len(scripts), 10)
        bad = [f"{p}: {h}" for p, h in scripts if h != "#!/usr/bin/env python3"]
        self.assertEqual(bad, [], "the rule (scripts/lib/pydeps.py): #!/usr/bin/env python3")

    def test_missing_module_is_named_with_its_package(self):
        # -S: no site-packages, so h5py and numpy cannot be imported (a bare venv, as a user has).
        for script, module, package in (("scripts/data/text_to_tokens", "h5py", "python3-h5py"),
                                         ("scripts/data/fashion_mnist_to_hdf5", "h5py", "python3-h5py"),
                                         ("scripts/plot_run", "matplotlib", "python3-matplotlib")):
            with tempfile.TemporaryDirectory() as d:
                args = [PY, "-S", os.path.join(SRC, script)]
                if script.endswith("plot_run"):
                    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
                        f.write('{"type": "step", "step": 1, "loss": 1.0, "lr": 0.1, "samples_per_s": 1.0}\n')
                    args.append(d)
                else:
                    args.append("--help")
                p = subprocess.run(args, capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 2, script + ": " + p.stderr)
            self.assertIn(f"'{module}'", p.stderr, script)
            self.assertIn(package, p.stderr, script)
            self.assertIn("pip install", p.stderr, script)
            self.assertNotIn("Traceback", p.stderr, script)

    def test_plot_run_renders_two_real_runs_and_csv(self):
        with tempfile.TemporaryDirectory() as d:
            for name, lr in (("slow", "0.0005"), ("fast", "0.005")):
                p = subprocess.run([TRAINER, "--config", os.path.join(SRC, "configs/fashion_mlp.ini"),
                                    f"--data.path={FASHION}", "--train.max_steps=40", "--run.log_interval=10",
                                    "--train.eval_interval=20", f"--optim.lr={lr}", f"--run.dir={d}",
                                    f"--run.name={name}"], capture_output=True, text=True, timeout=300)
                self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            png, table = os.path.join(d, "runs.png"), os.path.join(d, "runs.csv")
            p = subprocess.run([PY, os.path.join(SRC, "scripts/plot_run"), os.path.join(d, "slow"),
                                os.path.join(d, "fast"), "--out", png, "--csv", table],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            w, h, data = png_size(png)
            self.assertGreater(w, 800)
            self.assertGreater(h, 500)
            self.assertGreater(png_distinct_rows(data), 10, "the PNG looks blank")
            with open(table) as f:
                rows = list(csv.DictReader(f))
            self.assertEqual([r["run"] for r in rows], ["slow"] * 4 + ["fast"] * 4)
            self.assertEqual([int(r["step"]) for r in rows], [10, 20, 30, 40] * 2)
            for col in ("loss", "lr", "samples_per_s", "data_wait_s", "allocated_bytes", "allocator_peak_bytes"):
                self.assertTrue(all(r[col] != "" for r in rows), col)
            # The CSV holds what the runs logged, not something made up.
            self.assertLess(float(rows[3]["lr"]), float(rows[7]["lr"]))
            # Time axis and the default output next to the first run.
            p = subprocess.run([PY, os.path.join(SRC, "scripts/plot_run"), os.path.join(d, "slow"), "--x", "time"],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertTrue(os.path.isfile(os.path.join(d, "slow", "plots.png")))

    def test_slurm_submit_shapes_the_job_for_the_partition(self):
        submit = os.path.join(SRC, "scripts/slurm/submit")

        def dry(*args):
            p = subprocess.run([submit, "--dry-run", *args], capture_output=True, text=True, timeout=30, cwd=SRC)
            self.assertEqual(p.returncode, 0, p.stderr)
            return p.stdout.split()

        cpu = dry("--nodes", "2", "--partition", "cpu", "configs/fashion_mlp.ini")
        self.assertIn("--nodes=2", cpu)
        self.assertIn("--partition=cpu", cpu)
        self.assertIn("--ntasks-per-node=4", cpu)
        self.assertFalse([a for a in cpu if a.startswith("--gpus") or a == "--exclusive"], cpu)
        gpu = dry("configs/gpt_d12.ini", "--train.max_steps=5")  # [train] device = cuda
        for a in ("--gpus-per-node=8", "--ntasks-per-node=8", "--exclusive"):
            self.assertIn(a, gpu)
        self.assertTrue(gpu[-2].endswith("configs/gpt_d12.ini") and gpu[-1] == "--train.max_steps=5", gpu)
        self.assertTrue(any(a.endswith("train_srun.sbatch") for a in gpu))
        four = dry("--gpus-per-node", "4", "--launcher", "mpirun", "configs/fashion_mlp.ini", "--train.device=cuda")
        self.assertIn("--gpus-per-node=4", four)
        self.assertTrue(any(a.endswith("train_mpirun.sbatch") for a in four))
        # The templates themselves fix no job shape (that failed on CPU partitions).
        for t in ("train_srun.sbatch", "train_mpirun.sbatch"):
            with open(os.path.join(SRC, "scripts/slurm", t)) as f:
                lines = [l for l in f if l.startswith("#SBATCH")]
            self.assertFalse([l for l in lines if "gpus" in l or "--nodes" in l or "exclusive" in l], lines)
        for bad, msg in ((["--nodes", "x", "configs/fashion_mlp.ini"], "--nodes x"), (["nope.ini"], "nope.ini"),
                         (["--launcher", "torchrun", "configs/fashion_mlp.ini"], "srun or mpirun")):
            p = subprocess.run([submit, "--dry-run", *bad], capture_output=True, text=True, timeout=30, cwd=SRC)
            self.assertEqual(p.returncode, 2, bad)
            self.assertIn(msg, p.stderr)

    def test_plot_run_names_a_directory_without_metrics(self):
        with tempfile.TemporaryDirectory() as d:
            p = subprocess.run([PY, os.path.join(SRC, "scripts/plot_run"), d], capture_output=True, text=True,
                               timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("no metrics.jsonl", p.stderr)
        self.assertIn(d, p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
