#!/usr/bin/env python3
"""`trainer export --format onnx`: the MLP, the CNN (NHWC and NCHW) and a small GPT, trained for a
few steps on 2 ranks under sharded strategies (and one on 1 rank), exported from their checkpoints,
pass onnx.checker (Debian's python3-onnx, full check with shape inference) and, run by ONNX Runtime
1.30 (onnxruntime-node from npm, CPU provider: scripts/onnx/ort_run.js), give the logits the
trainer's own forward gives (`trainer logits`, CPU f32) on the test split within 1e-4, at two
batch sizes and, for the GPT, two sequence lengths (a longer one than its block size fails in the
runtime). `trainer logits` is itself checked against the trainer: its cross-entropy over the whole
(small) test split is the final test_loss the run printed. Bad input is exit 2 naming it: an
unknown --format, an --out that cannot be written, a checkpoint without an architecture record.

Prints one line per model with the largest |ORT - trainer| (docs/performance.md's table)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import zlib

import h5py
import numpy as np
import onnx

TRAINER = os.environ["TRAINER"]
FASHION = os.environ["FASHION_H5"]
TOKENS = os.environ["TOKENS_H5"]
SRC = os.environ["SOURCE_DIR"]
ORT_DIR = os.environ["ORT_DIR"]
RUN_JS = os.path.join(SRC, "scripts", "onnx", "ort_run.js")
TOL = 1e-4


def run(argv, timeout=300):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def ok(p, what):
    assert p.returncode == 0, f"{what} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


class Trained:
    """One training run per model (cached over the tests of this file) and its newest checkpoint."""
    cache = {}
    tmp = tempfile.mkdtemp(prefix="mt_onnx_")

    @classmethod
    def small_fashion(cls):
        """2048 train and 512 test images of Fashion-MNIST: a few steps and a full evaluation in seconds."""
        path = os.path.join(cls.tmp, "fashion_small.h5")
        if not os.path.exists(path):
            with h5py.File(FASHION, "r") as src, h5py.File(path, "w") as dst:
                for split, n in (("train", 2048), ("test", 512)):
                    dst[f"{split}/images"] = src[f"{split}/images"][:n]
                    dst[f"{split}/labels"] = src[f"{split}/labels"][:n]
                dst.attrs["num_classes"] = 10
        return path

    @classmethod
    def get(cls, name, np_, config, data, *extra):
        if name not in cls.cache:
            argv = [TRAINER, "--config", os.path.join(SRC, "configs", config), f"--data.path={data}",
                    f"--run.dir={cls.tmp}", f"--run.name={name}", "--run.log_interval=10", *extra]
            if np_ > 1:
                argv = ["mpirun", "-np", str(np_)] + argv
            p = ok(run(argv, timeout=400), f"training {name}")
            final = [l for l in p.stdout.splitlines() if l.startswith("final ")][-1]
            fields = dict(f.split("=") for f in final.split()[1:])
            ckdir = os.path.join(cls.tmp, name, "checkpoints")
            cls.cache[name] = (os.path.join(ckdir, sorted(os.listdir(ckdir))[-1]), fields)
        return cls.cache[name]


def export(ckpt, out, *extra):
    return run([TRAINER, "export", "--format", "onnx", "--checkpoint", ckpt, "--out", out, *extra])


def trainer_logits(ckpt, out, *extra):
    ok(run([TRAINER, "logits", "--checkpoint", ckpt, "--out", out, *extra]), "trainer logits")
    with h5py.File(out, "r") as f:
        return np.array(f["inputs"]), np.array(f["logits"]), np.array(f["labels" if "labels" in f else "targets"])


def ort(model, name, inputs, workdir):
    """ONNX Runtime's outputs for one input array: (logits, the script's report)."""
    os.makedirs(workdir, exist_ok=True)
    np.save(os.path.join(workdir, "in.npy"), inputs)
    p = run(["node", RUN_JS, "--ort", ORT_DIR, model, workdir, f"{name}={os.path.join(workdir, 'in.npy')}"])
    if p.returncode != 0:
        return None, p
    report = json.loads(p.stdout.strip().splitlines()[-1])
    return np.load(report["outputs"]["logits"]["file"]), report


def dims(value_info):
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


class OnnxExport(unittest.TestCase):
    worst = {}

    def check_model(self, path, input_name, input_type, input_dims, output_dims):
        onnx.checker.check_model(path, full_check=True)  # by path: external data is read beside it
        m = onnx.load(path, load_external_data=False)
        self.assertEqual([(o.domain, o.version) for o in m.opset_import], [("", 17)])
        self.assertEqual([i.name for i in m.graph.input], [input_name])
        self.assertEqual(m.graph.input[0].type.tensor_type.elem_type, input_type)
        self.assertEqual(dims(m.graph.input[0]), input_dims)
        self.assertEqual([o.name for o in m.graph.output], ["logits"])
        self.assertEqual(m.graph.output[0].type.tensor_type.elem_type, onnx.TensorProto.FLOAT)
        self.assertEqual(dims(m.graph.output[0]), output_dims)

    def parity(self, label, ckpt, model, input_name, cases, cast=None):
        """Each case (trainer logits arguments) run by the trainer and by ONNX Runtime: max |diff| <= TOL."""
        worst = 0.0
        for k, args in enumerate(cases):
            x, ref, _ = trainer_logits(ckpt, os.path.join(Trained.tmp, f"{label}_ref{k}.h5"), *args)
            got, report = ort(model, input_name, x.astype(cast) if cast else x,
                              os.path.join(Trained.tmp, f"{label}_ort{k}"))
            self.assertIsNotNone(got, None if got is not None else report.stderr)
            self.assertEqual(report["onnxruntime"], "1.30.0")
            self.assertEqual(got.shape, ref.shape)
            self.assertGreater(np.abs(ref).max(), 0.1)  # a model that computes something
            diff = float(np.abs(got - ref).max())
            self.assertLessEqual(diff, TOL, f"{label} case {args}: max |ORT - trainer| = {diff}")
            worst = max(worst, diff)
        OnnxExport.worst[label] = worst
        print(f"{label}: max |ORT - trainer| = {worst:.3g} over {len(cases)} input shapes", flush=True)

    def test_mlp_full_shard_two_ranks(self):
        ckpt, final = Trained.get("mlp", 2, "fashion_mlp.ini", Trained.small_fashion(), "--train.max_steps=40",
                                  "--model.hidden=64,32", "--model.activation=gelu", "--model.dropout=0.1",
                                  "--sharding.strategy=full_shard")
        out = os.path.join(Trained.tmp, "mlp.onnx")
        p = ok(export(ckpt, out), "export")
        self.assertIn("ONNX opset 17", p.stdout)
        self.check_model(out, "images", onnx.TensorProto.UINT8, ["batch", 28, 28, 1], ["batch", 10])
        self.parity("mlp (gelu, dropout; full_shard, 2 ranks)", ckpt, out, "images",
                    [["--count", "512"], ["--first", "100", "--count", "3"]])
        # `trainer logits` is the trainer's forward: its loss over the whole test split is the run's.
        _, logits, labels = trainer_logits(ckpt, os.path.join(Trained.tmp, "mlp_all.h5"), "--count", "512")
        z = logits - logits.max(1, keepdims=True)
        loss = float(np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(len(labels)), labels]))
        self.assertAlmostEqual(loss, float(final["test_loss"]), delta=1e-4)
        acc = float(np.mean(logits.argmax(1) == labels))
        self.assertAlmostEqual(acc, float(final["test_accuracy"]), delta=1e-4)

    def test_cnn_nhwc_shard_grad_op_two_ranks(self):
        ckpt, _ = Trained.get("cnn_nhwc", 2, "fashion_cnn.ini", Trained.small_fashion(), "--train.max_steps=20",
                              "--model.conv_channels=8,16", "--model.fc=32", "--sharding.strategy=shard_grad_op")
        out = os.path.join(Trained.tmp, "cnn_nhwc.onnx")
        ok(export(ckpt, out), "export")
        self.check_model(out, "images", onnx.TensorProto.UINT8, ["batch", 28, 28, 1], ["batch", 10])
        self.parity("cnn nhwc (shard_grad_op, 2 ranks)", ckpt, out, "images",
                    [["--count", "64"], ["--first", "7", "--count", "1"]])

    def test_cnn_nchw_one_rank(self):
        ckpt, _ = Trained.get("cnn_nchw", 1, "fashion_cnn.ini", Trained.small_fashion(), "--train.max_steps=15",
                              "--model.conv_channels=8,16", "--model.fc=32", "--model.layout=nchw")
        out = os.path.join(Trained.tmp, "cnn_nchw.onnx")
        ok(export(ckpt, out), "export")
        self.parity("cnn nchw (no_shard, 1 rank)", ckpt, out, "images", [["--count", "32"], ["--count", "5"]])

    def test_gpt_full_shard_two_ranks_dynamic_sequence(self):
        ckpt, _ = Trained.get("gpt", 2, "gpt_tiny.ini", TOKENS, "--train.max_steps=8", "--train.batch_size=8",
                              "--sharding.strategy=full_shard")
        out = os.path.join(Trained.tmp, "gpt.onnx")
        p = ok(export(ckpt, out, "--external-data", "always"), "export")
        self.assertIn("gpt.onnx.data", p.stdout)
        self.assertTrue(os.path.getsize(out + ".data") > os.path.getsize(out))
        self.check_model(out, "tokens", onnx.TensorProto.INT64, ["batch", "sequence"], ["batch", "sequence", 256])
        self.parity("gpt (2 blocks, full_shard, 2 ranks)", ckpt, out, "tokens",
                    [["--count", "2", "--seq-len", "64"], ["--count", "3", "--seq-len", "17"],
                     ["--first", "5", "--count", "1", "--seq-len", "1"]], cast=np.int64)
        # The sequence may not pass the block size (64): the position lookup fails in the runtime.
        got, p = ort(out, "tokens", np.zeros((1, 65), np.int64), os.path.join(Trained.tmp, "gpt_long"))
        self.assertIsNone(got)
        self.assertEqual(p.returncode, 1, p.stderr)

    def test_bad_input_is_exit_2_naming_it(self):
        ckpt, _ = Trained.get("cnn_nchw", 1, "fashion_cnn.ini", Trained.small_fashion(), "--train.max_steps=15",
                              "--model.conv_channels=8,16", "--model.fc=32", "--model.layout=nchw")
        d = Trained.tmp
        kept = os.path.join(d, "kept.onnx")
        with open(kept, "w") as f:
            f.write("previous")
        p = run([TRAINER, "export", "--format", "tflite", "--checkpoint", ckpt, "--out", kept])
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--format tflite", p.stderr)
        for bad, needle in ((os.path.join(d, "no_such_dir", "m.onnx"), "does not exist"),
                            ("/proc/m.onnx", "cannot create a file in /proc")):
            p = export(ckpt, bad)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn(bad, p.stderr)
            self.assertIn(needle, p.stderr)
        p = run([TRAINER, "logits", "--checkpoint", ckpt, "--out", kept, "--first", "510", "--count", "5"])
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("samples 510..514 are outside split 'test'", p.stderr)
        # The device and precision of the forward: only real combinations; this machine has no GPU.
        for args, needle in ((["--precision", "bf16"], "--precision bf16 needs --device cuda"),
                             (["--device", "tpu"], "--device tpu: expected cpu or cuda"),
                             (["--device", "cuda", "--precision", "f8"], "--precision f8: expected"),
                             (["--device", "cuda"], "--device cuda: ")):
            p = run([TRAINER, "logits", "--checkpoint", ckpt, "--out", kept, *args])
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn(needle, p.stderr)
        # A checkpoint of an older build: meta.json without the architecture record (resealed).
        old = os.path.join(d, "old_ckpt")
        shutil.copytree(ckpt, old)
        with open(os.path.join(old, "meta.json")) as f:
            meta = json.load(f)
        meta.pop("architecture")
        meta.pop("meta_crc32")
        meta["time"] = int(meta["time"])
        meta["meta_crc32"] = zlib.crc32(json.dumps(meta, sort_keys=True, separators=(",", ":"),
                                                   ensure_ascii=False).encode())
        with open(os.path.join(old, "meta.json"), "w") as f:
            json.dump(meta, f)
        for cmd in (["export", "--format", "onnx"], ["logits"]):
            p = run([TRAINER, *cmd, "--checkpoint", old, "--out", kept])
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn(f"checkpoint {old}", p.stderr)
            self.assertIn("no architecture", p.stderr)
        with open(kept) as f:
            self.assertEqual(f.read(), "previous")
        self.assertEqual(ok(run([TRAINER, "export", "--checkpoint", old, "--out", os.path.join(d, "old.h5")]),
                            "h5 export of an old checkpoint").returncode, 0)


if __name__ == "__main__":
    try:
        unittest.main(verbosity=2)
    finally:
        shutil.rmtree(Trained.tmp, ignore_errors=True)
