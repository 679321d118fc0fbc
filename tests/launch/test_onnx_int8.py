#!/usr/bin/env python3
"""Int8: post-training quantization (`trainer export --format onnx --quantize int8 --calibration
minmax|percentile`) and quantization-aware training (`train.qat`, exported with --calibration qat),
as QDQ ONNX models run by ONNX Runtime 1.30 (onnxruntime-node, CPU; scripts/onnx/ort_bench.js).

  - every int8 model passes onnx.checker (full check) and ORT's optimizer turns it into integer
    kernels: its optimized graph (optimizedModelFilePath) holds QGemm, and for the CNN both
    convolutions as QLinearConv and both poolings as uint8 NhwcMaxPool (no f32 Conv / MaxPool);
  - PTQ: int8 test accuracy within ACC_TOL of the f32 export of the same checkpoint, and the int8
    model's predictions agree with the f32 model's on >= AGREE of the test images;
  - weights are stored as uint8 q + 128 with zero point 128 (the default: ORT's uint8 x uint8
    kernels, exact on every x86 CPU) or, with --weight-type int8, as int8 q with zero point 0;
  - QAT: ORT's int8 logits agree with the trainer's own fake-quantized forward (`trainer logits
    --quantize int8`) within QAT_TOL of the logits' range (integer kernels round the convolution's
    requantized output where the fake quantization rounds its f32 output: one step at most), and
    ORT's int8 accuracy is the trainer's final test accuracy within 1%; with int8 weights the
    logits are held to the same only on a CPU with VNNI (elsewhere ORT's uint8 x int8 kernels
    saturate 16-bit sums);
  - QAT resume: a run stopped and resumed across the observers' freeze step ends bit-identical to
    the uninterrupted one (parameters and observer state);
  - bad input is exit 2 naming the option.
Small models and a 4096/1000-image cut of Fashion-MNIST keep it to about two minutes on 2 cores."""
import json
import os
import subprocess
import tempfile
import unittest

import h5py
import numpy as np
import onnx
from onnx import numpy_helper

TRAINER = os.environ["TRAINER"]
FASHION = os.environ["FASHION_H5"]
TOKENS = os.environ["TOKENS_H5"]
SRC = os.environ["SOURCE_DIR"]
ORT_DIR = os.environ["ORT_DIR"]
BENCH_JS = os.path.join(SRC, "scripts", "onnx", "ort_bench.js")
ACC_TOL = 0.02
AGREE = 0.95
QAT_TOL = 0.02
TMP = tempfile.mkdtemp(prefix="mt_int8_")


def run(argv, timeout=400):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def ok(p, what):
    assert p.returncode == 0, f"{what} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def small_fashion():
    path = os.path.join(TMP, "fashion_small.h5")
    if not os.path.exists(path):
        with h5py.File(FASHION, "r") as src, h5py.File(path, "w") as dst:
            for split, n in (("train", 4096), ("test", 1000)):
                dst[f"{split}/images"] = src[f"{split}/images"][:n]
                dst[f"{split}/labels"] = src[f"{split}/labels"][:n]
            dst.attrs["num_classes"] = 10
            np.save(os.path.join(TMP, "test_images.npy"), src["test/images"][:1000])
            np.save(os.path.join(TMP, "test_labels.npy"), src["test/labels"][:1000].astype(np.int64))
    return path


CACHE = {}


def train(name, config, *extra):
    """(newest checkpoint, final test accuracy) of one run, cached over the tests."""
    if name not in CACHE:
        p = ok(run([TRAINER, "--config", os.path.join(SRC, "configs", config), f"--data.path={small_fashion()}",
                    f"--run.dir={TMP}", f"--run.name={name}", "--run.log_interval=10", "--train.batch_size=64",
                    "--data.num_workers=1", *extra]), f"training {name}")
        final = [l for l in p.stdout.splitlines() if l.startswith("final ")][-1]
        fields = dict(f.split("=") for f in final.split()[1:])
        ckdir = os.path.join(TMP, name, "checkpoints")
        CACHE[name] = (os.path.join(ckdir, sorted(os.listdir(ckdir))[-1]), float(fields["test_accuracy"]))
    return CACHE[name]


def export(ckpt, out, *extra):
    return run([TRAINER, "export", "--format", "onnx", "--checkpoint", ckpt, "--out", out, *extra])


def bench(model, optimized=None):
    argv = ["node", BENCH_JS, "--ort", ORT_DIR, model, "--images", os.path.join(TMP, "test_images.npy"),
            "--labels", os.path.join(TMP, "test_labels.npy"), "--latency", ""]
    if optimized:
        argv += ["--optimized", optimized]
    p = ok(run(argv), f"ort_bench {model}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def ort_logits(model, images):
    workdir = tempfile.mkdtemp(dir=TMP)
    np.save(os.path.join(workdir, "in.npy"), images)
    p = ok(run(["node", os.path.join(SRC, "scripts", "onnx", "ort_run.js"), "--ort", ORT_DIR, model, workdir,
                f"images={os.path.join(workdir, 'in.npy')}"]), "ort_run")
    return np.load(json.loads(p.stdout.strip().splitlines()[-1])["outputs"]["logits"]["file"])


def ops(path):
    m = onnx.load(path)
    return [n.op_type for n in m.graph.node]


class Int8(unittest.TestCase):
    def check_int8(self, path, label, integer_op, weight_type="uint8"):
        """onnx.checker, int8 weight initializers with per-channel scales, and ORT's integer kernels."""
        onnx.checker.check_model(path, full_check=True)
        m = onnx.load(path)
        # Weights: by default the int8 codes q as uint8 q + 128 with zero point 128 (export/OnnxQuantize.h:
        # ORT's u8 x s8 kernels saturate on CPUs without VNNI), every code in [1, 255]; with
        # --weight-type int8 the codes in [-127, 127] with zero point 0.
        inits = {i.name: i for i in m.graph.initializer}
        int8 = [i for name, i in inits.items() if name.endswith("weight_quantized")]
        self.assertTrue(int8, f"{label}: no int8 weight initializers")
        dtype, lo, zero = ((onnx.TensorProto.UINT8, 1, 128) if weight_type == "uint8" else
                           (onnx.TensorProto.INT8, -127, 0))
        for i in int8:
            self.assertEqual(i.data_type, dtype, i.name)
            self.assertGreaterEqual(int(numpy_helper.to_array(i).min()), lo, i.name)
            zp = numpy_helper.to_array(inits[i.name.replace("_quantized", "_zero_point")])
            self.assertEqual(set(zp.tolist()), {zero}, i.name)
        self.assertFalse([i.name for i in m.graph.initializer if i.name.endswith(".weight")],
                         f"{label}: f32 weights left in the int8 model")
        for node in m.graph.node:  # every weight's DequantizeLinear has one scale per output channel on its axis
            if node.op_type == "DequantizeLinear" and node.input[0] in inits and node.input[0].endswith("weight_quantized"):
                axis = [a.i for a in node.attribute if a.name == "axis"][0]
                self.assertEqual(list(inits[node.input[1]].dims), [inits[node.input[0]].dims[axis]], node.name)
        optimized = path + ".ort.onnx"
        r = bench(path, optimized)
        self.assertEqual(r["onnxruntime"], "1.30.0")
        self.assertIn(integer_op, ops(optimized), f"{label}: ORT did not fuse into {integer_op}: {ops(optimized)}")
        return r

    def test_ptq_mlp(self):
        ckpt, _ = train("mlp_f32", "fashion_mlp.ini", "--train.max_steps=60", "--model.hidden=128,64")
        f32 = os.path.join(TMP, "mlp_f32.onnx")
        ok(export(ckpt, f32), "f32 export")
        ref = bench(f32)
        for calibration in ("minmax", "percentile"):
            out = os.path.join(TMP, f"mlp_{calibration}.onnx")
            p = ok(export(ckpt, out, "--quantize", "int8", "--calibration", calibration, "--calibration-batches", "4"),
                   f"{calibration} export")
            self.assertIn("int8 weights", p.stdout)
            r = self.check_int8(out, calibration, "QGemm")
            print(f"mlp PTQ {calibration}: int8 accuracy {r['accuracy']:.4f}, f32 {ref['accuracy']:.4f}", flush=True)
            self.assertGreater(ref["accuracy"], 0.6)
            self.assertLessEqual(abs(r["accuracy"] - ref["accuracy"]), ACC_TOL)
            images = np.load(os.path.join(TMP, "test_images.npy"))[:500]
            agree = float(np.mean(ort_logits(out, images).argmax(1) == ort_logits(f32, images).argmax(1)))
            self.assertGreaterEqual(agree, AGREE, f"{calibration}: int8 and f32 predictions agree on {agree:.3f}")
            meta = {p.key: p.value for p in onnx.load(out).metadata_props}
            self.assertEqual(json.loads(meta["meshtrain.quantization"])["calibration"], calibration)

    def test_qat_cnn_matches_trainer_fake_quant(self):
        ckpt, acc = train("cnn_qat", "fashion_cnn.ini", "--train.max_steps=40", "--model.conv_channels=8,16",
                          "--model.fc=32", "--train.qat=true", "--train.qat_observe_steps=20")
        out = os.path.join(TMP, "cnn_qat.onnx")
        ok(export(ckpt, out, "--quantize", "int8"), "QAT export")  # --calibration qat is the default here
        r = self.check_int8(out, "cnn qat", "QLinearConv")
        self.assertIn("QuantizeLinear", ops(out))
        ran = ops(out + ".ort.onnx")  # every convolution and pooling on integers, none left in f32
        self.assertEqual(ran.count("QLinearConv"), 2, ran)
        self.assertEqual(ran.count("NhwcMaxPool"), 2, ran)
        self.assertNotIn("Conv", ran)
        self.assertNotIn("MaxPool", ran)
        print(f"cnn QAT: ORT int8 accuracy {r['accuracy']:.4f}, trainer's fake-quantized {acc:.4f}", flush=True)
        self.assertLessEqual(abs(r["accuracy"] - acc), 0.01)
        ref_h5 = os.path.join(TMP, "cnn_qat_logits.h5")
        ok(run([TRAINER, "logits", "--checkpoint", ckpt, "--out", ref_h5, "--count", "200", "--quantize", "int8"]),
           "trainer logits --quantize int8")
        with h5py.File(ref_h5, "r") as f:
            x, ref = np.array(f["inputs"]), np.array(f["logits"])
        got = ort_logits(out, x)
        span = float(ref.max() - ref.min())
        diff = float(np.abs(got - ref).max())
        print(f"cnn QAT: max |ORT int8 - trainer fake-quant| = {diff:.4g} ({diff / span:.2%} of the logits' range)")
        self.assertLessEqual(diff, QAT_TOL * span)
        self.assertGreaterEqual(float(np.mean(got.argmax(1) == ref.argmax(1))), 0.98)
        # The f32 forward of the same checkpoint differs more: the comparison above sees quantization.
        f32_h5 = os.path.join(TMP, "cnn_qat_f32.h5")
        ok(run([TRAINER, "logits", "--checkpoint", ckpt, "--out", f32_h5, "--count", "200"]), "trainer logits")
        with h5py.File(f32_h5, "r") as f:
            self.assertGreater(float(np.abs(np.array(f["logits"]) - ref).max()), diff)
        # --weight-type int8: the same values as int8 codes, which ORT runs on its uint8 x int8
        # kernels (QLinearConv still); exact where the CPU has VNNI, 16-bit saturating elsewhere.
        out8 = os.path.join(TMP, "cnn_qat_s8.onnx")
        ok(export(ckpt, out8, "--quantize", "int8", "--weight-type", "int8"), "QAT export, int8 weights")
        self.check_int8(out8, "cnn qat int8 weights", "QLinearConv", weight_type="int8")
        meta = {p.key: p.value for p in onnx.load(out8).metadata_props}
        self.assertNotIn("uint8", json.loads(meta["meshtrain.quantization"])["weights"])
        diff8 = float(np.abs(ort_logits(out8, x) - ref).max())
        with open("/proc/cpuinfo") as f:
            vnni = bool({"avx512_vnni", "avx_vnni"} & set(f.read().split()))
        print(f"cnn QAT, int8 weights: max |ORT - trainer| = {diff8 / span:.2%} of the range (VNNI: {vnni})")
        if vnni:
            self.assertLessEqual(diff8, QAT_TOL * span)

    def test_qat_resume_is_bit_identical(self):
        common = ["--model.hidden=32", "--train.qat=true", "--train.qat_observe_steps=15",
                  "--train.qat_observer=ema", "--model.dropout=0",
                  # a schedule that does not depend on train.max_steps: the two runs take the same steps
                  "--schedule.kind=constant", "--schedule.warmup_steps=0"]
        whole, _ = train("qat_whole", "fashion_mlp.ini", "--train.max_steps=30", *common)
        train("qat_split", "fashion_mlp.ini", "--train.max_steps=10", *common)
        del CACHE["qat_split"]
        resumed, _ = train("qat_split", "fashion_mlp.ini", "--train.max_steps=30", "--checkpoint.resume=auto", *common)
        self.assertTrue(resumed.endswith("step_000000030"), resumed)
        metas = [json.load(open(os.path.join(c, "meta.json"))) for c in (whole, resumed)]
        self.assertIn("qat", metas[0])
        self.assertEqual(metas[0]["qat"], metas[1]["qat"])
        self.assertTrue(all(s["seen"] for s in metas[0]["qat"]["sites"]))
        params = []
        for c, label in ((whole, "whole"), (resumed, "resumed")):
            h5 = os.path.join(TMP, f"qat_{label}.h5")
            ok(run([TRAINER, "export", "--checkpoint", c, "--out", h5]), "h5 export")
            with h5py.File(h5, "r") as f:
                params.append({k: np.array(v) for k, v in f["params"].items()})
        self.assertEqual(params[0].keys(), params[1].keys())
        for k in params[0]:
            self.assertTrue(np.array_equal(params[0][k], params[1][k]), f"{k} differs after the resume")

    def test_qat_two_ranks(self):
        """Data parallel: the ranks reduce their observers each warm-up step; the export of the
        checkpoint (rank 0's state) scores what the trainer's evaluation over both ranks scored."""
        name = "qat_2ranks"
        p = ok(run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", TRAINER, "--config",
                    os.path.join(SRC, "configs", "fashion_mlp.ini"), f"--data.path={small_fashion()}",
                    f"--run.dir={TMP}", f"--run.name={name}", "--train.batch_size=64", "--train.max_steps=24",
                    "--model.hidden=64", "--train.qat=true", "--train.qat_observe_steps=8", "--data.num_workers=1"]),
               "2-rank QAT")
        acc = float([l for l in p.stdout.splitlines() if l.startswith("final ")][-1].split("test_accuracy=")[1].split()[0])
        ckdir = os.path.join(TMP, name, "checkpoints")
        out = os.path.join(TMP, "qat_2ranks.onnx")
        ok(export(os.path.join(ckdir, sorted(os.listdir(ckdir))[-1]), out, "--quantize", "int8"), "export")
        r = bench(out)
        self.assertLessEqual(abs(r["accuracy"] - acc), 0.01, f"ORT {r['accuracy']} vs the trainer's {acc}")

    def test_bad_input_is_exit_2(self):
        ckpt, _ = train("mlp_f32", "fashion_mlp.ini", "--train.max_steps=60", "--model.hidden=128,64")
        out = os.path.join(TMP, "bad.onnx")
        for extra, words in ((["--quantize", "int8", "--calibration", "kl"], "--calibration kl"),
                             (["--quantize", "int8", "--calibration-batches", "0"], "--calibration-batches"),
                             (["--quantize", "int4"], "--quantize int4"),
                             (["--calibration", "minmax"], "--quantize int8"),
                             (["--quantize", "int8", "--percentile", "99"], "--percentile"),
                             (["--quantize", "int8", "--calibration", "percentile", "--percentile", "30"], "--percentile"),
                             (["--quantize", "int8", "--calibration", "qat"], "train.qat"),
                             (["--quantize", "int8", "--calibration-batches", "1000"], "--calibration-batches"),
                             (["--quantize", "int8", "--weight-type", "int4"], "--weight-type int4"),
                             (["--weight-type", "int8"], "--quantize int8")):
            p = export(ckpt, out, *extra)
            self.assertEqual(p.returncode, 2, f"{extra}: {p.stdout}{p.stderr}")
            self.assertIn(words, p.stderr, extra)
            self.assertFalse(os.path.exists(out))
        p = run([TRAINER, "--config", os.path.join(SRC, "configs", "gpt_tiny.ini"), f"--data.path={TOKENS}",
                 f"--run.dir={TMP}", "--run.name=gpt_qat", "--train.qat=true"])
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertIn("train.qat", p.stderr)
        p = ok(run([TRAINER, "--config", os.path.join(SRC, "configs", "gpt_tiny.ini"), f"--data.path={TOKENS}",
                    f"--run.dir={TMP}", "--run.name=gpt_f32", "--train.max_steps=2"]), "gpt training")
        ckdir = os.path.join(TMP, "gpt_f32", "checkpoints")
        p = export(os.path.join(ckdir, sorted(os.listdir(ckdir))[-1]), out, "--quantize", "int8")
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertIn("--quantize int8 supports the mlp and cnn models", p.stderr)
        self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    unittest.main(verbosity=2)
