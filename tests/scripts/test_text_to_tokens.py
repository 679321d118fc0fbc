#!/usr/bin/env python3
"""scripts/data/text_to_tokens on hostile input: an empty split (--test-fraction 0, an empty
--test-bin shard), ids a cast would wrap (u64/i64 .npy ids >= 2^31 or negative), ids outside the
vocabulary and an --out it cannot write are each exit 2 naming the option or file, never a
traceback, and never leave OUT.tmp (or a half-written OUT) behind. Good input still converts."""
import os
import subprocess
import tempfile
import unittest

import h5py
import numpy as np

SOURCE = os.environ.get("SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(SOURCE, "scripts", "data", "text_to_tokens")
PY = "/usr/bin/python3"  # Debian's, with python3-h5py and python3-numpy


def shard(path, ids):
    """An llm.c GPT-2 shard (magic 20240520, u16 ids) holding `ids`."""
    header = np.zeros(256, np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(ids)
    with open(path, "wb") as f:
        f.write(header.tobytes() + np.asarray(ids, np.uint16).tobytes())


class TextToTokens(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.d = self.tmp.name
        self.out = os.path.join(self.d, "out.h5")

    def tearDown(self):
        self.tmp.cleanup()

    def convert(self, *args):
        p = subprocess.run([PY, SCRIPT, *args, "--out", self.out], capture_output=True, text=True, timeout=120)
        self.assertNotIn("Traceback", p.stderr)
        return p

    def refused(self, args, needles):
        p = self.convert(*args)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertIn("text_to_tokens: error:", p.stderr)
        for n in needles:
            self.assertIn(n, p.stderr)
        self.assertFalse(os.path.exists(self.out + ".tmp"), "the temporary file was left behind")
        return p.stderr

    def npy(self, name, a):
        path = os.path.join(self.d, name)
        np.save(path, a)
        return path

    def test_empty_test_split_is_refused_naming_the_option(self):
        text = os.path.join(self.d, "a.txt")
        with open(text, "w") as f:
            f.write("hello tokens " * 10)
        self.refused(["--text", text, "--test-fraction", "0"], ["--test-fraction 0", "(0, 1)"])
        # A fraction so small that no token is left for the test split.
        self.refused(["--text", text, "--test-fraction", "1e-17"], ["--test-fraction 1e-17", "test split",
                                                                     "no tokens"])
        self.assertFalse(os.path.exists(self.out))

    def test_empty_test_bin_shard_is_refused_naming_it(self):
        train, val = os.path.join(self.d, "train.bin"), os.path.join(self.d, "val.bin")
        shard(train, range(100))
        shard(val, [])
        self.refused(["--bin", train, "--test-bin", val], ["--test-bin " + val, "test split", "no tokens"])
        shard(train, [])
        shard(val, range(100))
        self.refused(["--bin", train, "--test-bin", val], ["--bin " + train, "train split", "no tokens"])
        self.assertFalse(os.path.exists(self.out))

    def test_ids_a_cast_would_wrap_are_refused_with_file_and_index(self):
        for dtype, bad, index in ((np.uint64, 2**32 + 5, 3), (np.int64, 2**32 + 5, 7), (np.int64, -1, 2),
                                  (np.int64, 2**31, 5), (np.uint32, 2**31 + 1, 9)):
            a = np.arange(40, dtype=dtype)
            a[index] = bad
            path = self.npy(f"ids_{np.dtype(dtype).name}_{index}.npy", a)
            self.refused(["--npy", path], [path, f"token id {bad} at index {index}", "outside [0, 2147483647)"])
            self.assertFalse(os.path.exists(self.out))

    def test_ids_outside_the_vocabulary_name_the_file_and_index(self):
        path = self.npy("ids.npy", np.arange(40, dtype=np.int64))
        self.refused(["--npy", path, "--vocab", "30"], [path, "token id 30 at index 30", "--vocab 30"])
        train = os.path.join(self.d, "train.bin")
        shard(train, list(range(60)) + [50300] + list(range(10)))
        self.refused(["--bin", train], [train, "token id 50300 at index 60", "outside [0, 50257)"])
        for vocab in ("-5", str(2**31)):
            self.refused(["--npy", path, "--vocab", vocab], [f"--vocab {vocab}", "[1, 2147483647]"])

    def test_unwritable_out_is_named_and_leaves_no_temporary(self):
        path = self.npy("ids.npy", np.arange(40, dtype=np.int64))
        os.mkdir(self.out)  # a directory where the output goes: the final rename fails
        self.refused(["--npy", path], ["--out " + self.out, "cannot write it"])
        self.assertTrue(os.path.isdir(self.out))

    def test_good_input_converts_exactly(self):
        ids = (np.arange(1000, dtype=np.int64) * 7919) % 70000  # needs u32 storage
        path = self.npy("ids.npy", ids)
        p = self.convert("--npy", path, "--test-fraction", "0.25")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertFalse(os.path.exists(self.out + ".tmp"))
        with h5py.File(self.out, "r") as f:
            self.assertEqual(f.attrs["vocab_size"], int(ids.max()) + 1)
            self.assertEqual(f["train/tokens"].dtype, np.uint32)
            got = np.concatenate([f["train/tokens"][:], f["test/tokens"][:]])
            self.assertEqual(len(f["test/tokens"]), 250)
        np.testing.assert_array_equal(got, ids)

    def test_text_list_reads_every_named_file_in_order(self):
        # More files than xargs puts on one command line: each must land in the one output, in order
        # (python_source_corpus once lost two thirds of its corpus to xargs' separate runs).
        paths = []
        for i in range(3000):
            paths.append(os.path.join(self.d, f"doc_{i:04d}_{'x' * 60}.txt"))
            with open(paths[-1], "w") as f:
                f.write(chr(ord("a") + i % 26) * (1 + i % 5))
        listing = os.path.join(self.d, "list")
        with open(listing, "w") as f:
            f.write("\n".join(paths) + "\n")
        p = self.convert("--text-list", listing, "--test-fraction", "0.1")
        self.assertEqual(p.returncode, 0, p.stderr)
        want = b"".join(open(q, "rb").read() for q in paths)
        with h5py.File(self.out, "r") as f:
            got = np.concatenate([f["train/tokens"][:], f["test/tokens"][:]])
            docs = len(f["train/doc_offsets"]) + len(f["test/doc_offsets"])
        np.testing.assert_array_equal(got, np.frombuffer(want, np.uint8))
        self.assertGreaterEqual(docs, 3000)
        empty = os.path.join(self.d, "empty")
        open(empty, "w").close()
        self.refused(["--text-list", empty], ["--text-list " + empty, "names no file"])
        self.refused(["--text-list", os.path.join(self.d, "absent")], ["absent", "cannot read it"])
        garbage = os.path.join(self.d, "garbage")
        with open(garbage, "wb") as f:
            f.write(bytes(range(128, 256)))
        self.refused(["--text-list", garbage], ["--text-list " + garbage, "cannot read it"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
