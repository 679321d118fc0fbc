#!/usr/bin/env python3
"""`trainer export` writes the architecture beside the weights: PyTorch rebuilds the MLP and the
CNN from the exported file alone (no config, no meshtrain code) and reproduces the trainer's final
test accuracy on the Fashion-MNIST test split; a GPT export names its hyper-parameters and every
parameter has the shape they imply."""
import json
import os
import subprocess
import tempfile
import unittest

import h5py
import numpy as np
import torch
import torch.nn as nn

TRAINER = os.environ["TRAINER"]
FASHION = os.environ["FASHION_H5"]
TOKENS = os.environ.get("TOKENS_H5", "")
SRC = os.environ["SOURCE_DIR"]


class NhwcFlatten(nn.Module):
    """meshtrain flattens NHWC activations in H, W, C order; torch's are NCHW."""

    def forward(self, x):
        return x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)


def rebuild(path):
    """(preprocess, model) from an exported file alone, following its architecture record."""
    with h5py.File(path, "r") as f:
        arch = json.loads(f.attrs["architecture"])
        params = {k: torch.from_numpy(np.array(v)) for k, v in f["params"].items()}
    assert arch["format"] == "meshtrain-architecture" and arch["version"] == 1
    layers, prep, nhwc = [], None, False
    for spec in arch["layers"]:
        kind = spec["kind"]
        p = {q["name"].split(".")[-1]: params[q["name"]] for q in spec.get("params", [])}
        for q in spec.get("params", []):
            assert list(params[q["name"]].shape) == q["shape"], q
        if kind == "image_input":
            prep = spec
            continue
        if kind == "linear":
            m = nn.Linear(spec["in_features"], spec["out_features"], bias=bool(spec["bias"]))
            m.weight.data.copy_(p["weight"])
            if spec["bias"]:
                m.bias.data.copy_(p["bias"])
        elif kind == "conv2d":
            m = nn.Conv2d(spec["in_channels"], spec["out_channels"], spec["kernel"], spec["stride"], spec["padding"],
                          bias=bool(spec["bias"]))
            w = p["weight"]
            nhwc = spec["layout"] == "nhwc"
            m.weight.data.copy_(w.permute(0, 3, 1, 2) if nhwc else w)  # [out, k, k, in] -> [out, in, k, k]
            if spec["bias"]:
                m.bias.data.copy_(p["bias"])
        elif kind == "relu":
            m = nn.ReLU()
        elif kind == "gelu":
            m = nn.GELU(approximate=spec["approximate"])
        elif kind == "dropout":
            m = nn.Dropout(spec["p"])
        elif kind == "maxpool2d":
            m = nn.MaxPool2d(spec["kernel"], spec["stride"])
        elif kind == "flatten":
            m = NhwcFlatten() if nhwc else nn.Flatten()
        else:
            raise AssertionError(f"unknown layer kind {kind}")
        layers.append(m)

    def preprocess(images_u8):
        x = (torch.from_numpy(images_u8).float() * prep["scale"] - prep["mean"]) / prep["std"]
        if prep["output"] == "flat_hwc":
            return x.reshape(x.shape[0], -1)
        return x.permute(0, 3, 1, 2)  # torch convolutions take NCHW

    return arch, preprocess, nn.Sequential(*layers).eval()


def accuracy(path):
    arch, preprocess, model = rebuild(path)
    with h5py.File(FASHION, "r") as f:
        images, labels = np.array(f["test/images"]), np.array(f["test/labels"])
    assert arch["input"]["height"] == images.shape[1] and arch["input"]["classes"] == 10
    with torch.no_grad():
        pred = torch.cat([model(preprocess(images[i:i + 2000])).argmax(1) for i in range(0, len(images), 2000)])
    return (pred.numpy() == labels).mean()


def train_and_export(d, config, *extra):
    p = subprocess.run([TRAINER, "--config", os.path.join(SRC, "configs", config), f"--data.path={FASHION}",
                        f"--run.dir={d}", "--run.name=r", "--run.log_interval=20", *extra],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    final = [l for l in p.stdout.splitlines() if l.startswith("final ")][-1]
    acc = float(final.split()[1].split("=")[1])
    ckpts = sorted(os.listdir(os.path.join(d, "r", "checkpoints")))
    out = os.path.join(d, "model.h5")
    p = subprocess.run([TRAINER, "export", "--checkpoint", os.path.join(d, "r", "checkpoints", ckpts[-1]), "--out", out],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return acc, out


class Export(unittest.TestCase):
    def test_mlp_rebuilt_in_pytorch_reproduces_accuracy(self):
        with tempfile.TemporaryDirectory() as d:
            acc, out = train_and_export(d, "fashion_mlp.ini", "--train.max_steps=150", "--model.activation=gelu")
            mine = accuracy(out)
            print(f"mlp: trainer {acc:.4f}, PyTorch from the export {mine:.4f}")
            self.assertGreater(acc, 0.6)  # trained, so agreement is not two copies of chance
            self.assertAlmostEqual(mine, acc, delta=0.0006)

    def test_cnn_rebuilt_in_pytorch_reproduces_accuracy(self):
        with tempfile.TemporaryDirectory() as d:
            acc, out = train_and_export(d, "fashion_cnn.ini", "--train.max_steps=60")
            mine = accuracy(out)
            print(f"cnn: trainer {acc:.4f}, PyTorch from the export {mine:.4f}")
            self.assertGreater(acc, 0.5)
            self.assertAlmostEqual(mine, acc, delta=0.0006)

    @unittest.skipUnless(TOKENS, "TOKENS_H5 not set")
    def test_gpt_export_names_its_shape(self):
        with tempfile.TemporaryDirectory() as d:
            p = subprocess.run([TRAINER, "--config", os.path.join(SRC, "configs/gpt_tiny.ini"), f"--data.path={TOKENS}",
                                f"--run.dir={d}", "--run.name=g", "--train.max_steps=3"],
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(p.returncode, 0, p.stderr[-2000:])
            ck = os.path.join(d, "g", "checkpoints", sorted(os.listdir(os.path.join(d, "g", "checkpoints")))[-1])
            out = os.path.join(d, "gpt.h5")
            self.assertEqual(subprocess.run([TRAINER, "export", "--checkpoint", ck, "--out", out]).returncode, 0)
            with h5py.File(out, "r") as f:
                a = json.loads(f.attrs["architecture"])
                shapes = {k: v.shape for k, v in f["params"].items()}
            C, L, V = a["n_embd"], a["n_layer"], a["padded_vocab_size"]
            self.assertEqual((a["type"], L, a["n_head"], C, a["vocab_size"]), ("gpt", 2, 4, 64, 256))
            self.assertEqual(shapes["wte"], (V, C))
            self.assertEqual(shapes["wpe"], (a["block_size"], C))
            self.assertEqual(shapes["h1.attn.c_attn.weight"], (3 * C, C))  # [out, in], q k v
            self.assertEqual(shapes["h1.mlp.c_proj.weight"], (C, 4 * C))
            self.assertEqual(len([k for k in shapes if k.startswith("h")]), 12 * L)


if __name__ == "__main__":
    unittest.main(verbosity=2)
