#!/usr/bin/env python3
"""Writes the same small image dataset in the layouts h5py can produce, plus broken files, for
tests/data/test_data.cpp: every good variant must read back identically; every bad one must fail
with a DataError naming the file and dataset."""
import os
import sys

import h5py
import numpy as np

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(0)
N = 103
images = rng.integers(0, 256, size=(N, 28, 28, 1), dtype=np.uint8)
labels = rng.integers(0, 10, size=(N,)).astype(np.int64)
images.tofile(os.path.join(out, "images.bin"))  # ground truth, raw bytes
labels.tofile(os.path.join(out, "labels.bin"))


def write(name, img_kw=None, lbl_kw=None, img=images, lbl=labels, lbl_dtype=None, extra=None):
    with h5py.File(os.path.join(out, name + ".h5"), "w") as f:
        g = f.create_group("train")
        g.create_dataset("images", data=img, **(img_kw or {}))
        g.create_dataset("labels", data=lbl if lbl_dtype is None else lbl.astype(lbl_dtype), **(lbl_kw or {}))
        if extra:
            extra(f)


write("contiguous")
write("chunked_rows", dict(chunks=(16, 28, 28, 1)), dict(chunks=(10,)))
write("chunked_tiles", dict(chunks=(7, 10, 13, 1)), dict(chunks=(33,)))  # partial edge chunks in every dim
write("gzip", dict(chunks=(32, 28, 28, 1), compression="gzip", compression_opts=4),
      dict(chunks=(50,), compression="gzip"))
write("gzip_shuffle_fletcher", dict(chunks=(20, 28, 28, 1), compression="gzip", shuffle=True, fletcher32=True),
      dict(chunks=(50,), compression="gzip", shuffle=True, fletcher32=True))
write("lzf", dict(chunks=(20, 28, 28, 1), compression="lzf"), dict(chunks=(50,), compression="lzf"))
write("rank3_int32_labels", img=images[..., 0], lbl_dtype=np.int32)
write("auto_chunks", dict(chunks=True, compression="gzip"), dict(chunks=True))

# Broken files.
write("bad_dtype", img=images.astype(np.float32))
write("bad_rank", img=images.reshape(N, 784))
write("bad_count", lbl=labels[:50])
with h5py.File(os.path.join(out, "missing_labels.h5"), "w") as f:
    f.create_group("train").create_dataset("images", data=images)
with h5py.File(os.path.join(out, "tiny.h5"), "w") as f:
    g = f.create_group("train")
    g.create_dataset("images", data=images[:2])
    g.create_dataset("labels", data=labels[:2])
with open(os.path.join(out, "not_hdf5.h5"), "wb") as f:
    f.write(b"this is not an HDF5 file\n" * 10)
raw = open(os.path.join(out, "contiguous.h5"), "rb").read()
with open(os.path.join(out, "truncated.h5"), "wb") as f:
    f.write(raw[: len(raw) // 2])
raw = open(os.path.join(out, "chunked_rows.h5"), "rb").read()
with open(os.path.join(out, "truncated_chunked.h5"), "wb") as f:
    f.write(raw[: int(len(raw) * 0.6)])
# One flipped byte in a chunk of a Fletcher-32-protected dataset (h5py refuses to read it).
def test_split(f):
    g = f.create_group("test")
    g.create_dataset("images", data=images[:40])
    g.create_dataset("labels", data=labels[:40])


write("fletcher_flipped", dict(chunks=(20, 28, 28, 1), fletcher32=True), dict(chunks=(50,), fletcher32=True),
      extra=test_split)
with h5py.File(os.path.join(out, "fletcher_flipped.h5"), "r") as f:
    info = f["train/images"].id.get_chunk_info(2)  # rows 40-59
with open(os.path.join(out, "fletcher_flipped.h5"), "r+b") as f:
    f.seek(info.byte_offset + 100)
    b = f.read(1)
    f.seek(info.byte_offset + 100)
    f.write(bytes([b[0] ^ 0x10]))

# Hostile headers and values (trainer-level tests, tests/launch/test_trainer_cli.py).
with h5py.File(os.path.join(out, "declared_huge.h5"), "w") as f:  # 1e9 images declared, one chunk stored
    g = f.create_group("train")
    d = g.create_dataset("images", shape=(10**9, 28, 28, 1), dtype=np.uint8, chunks=(64, 28, 28, 1))
    d[:64] = images[:64]
    lbl = g.create_dataset("labels", shape=(10**9,), dtype=np.uint8, chunks=(1 << 16,))
    lbl[:64] = labels[:64].astype(np.uint8)
bad_labels = labels.copy()
bad_labels[57] = 12


def num_classes_attr(f):
    f["train/labels"].attrs["num_classes"] = 10


write("label_out_of_range", lbl=bad_labels, extra=num_classes_attr)
neg = labels.copy()
neg[5] = -3
write("label_negative", lbl=neg)


def test_32x32(f):
    g = f.create_group("test")
    g.create_dataset("images", data=rng.integers(0, 256, size=(40, 32, 32, 1), dtype=np.uint8))
    g.create_dataset("labels", data=labels[:40])


write("test_split_mismatch", extra=test_32x32)


# num_classes attributes that are not a count: each a DataError naming file, attribute and value.
# With a test split, so that only the attribute is wrong (the trainer used to train on these).
def attr(obj, value):
    def put(f):
        test_split(f)
        f[obj].attrs["num_classes"] = value
    return put


for name, obj, value in (("zero", "train/labels", 0), ("negative", "/", -3), ("huge", "train/labels", 2**40),
                         ("float", "train/labels", 10.5), ("string", "/", "10"),
                         ("array", "train/labels", np.array([10, 10])), ("u64", "/", np.uint64(2**63 + 1))):
    write("num_classes_" + name, extra=attr(obj, value))


# Token streams (meshtrain-tokens), 4096 ids per split, for TokenDataset and the trainer's GPT.
def tokens(name, train, test=None, vocab=None, root_vocab=None, dtype=np.uint16):
    with h5py.File(os.path.join(out, name + ".h5"), "w") as f:
        if root_vocab is not None:
            f.attrs["vocab_size"] = root_vocab
        for split, ids in (("train", train), ("test", train if test is None else test)):
            d = f.create_group(split).create_dataset("tokens", data=np.asarray(ids).astype(dtype), chunks=(1024,))
            if vocab is not None:
                d.attrs["vocab_size"] = vocab


ids = rng.integers(0, 100, size=4096)
tokens("tokens_good", ids, vocab=100)
for name, value in (("zero", 0), ("negative", -1), ("huge", 2**31), ("float", 100.0), ("string", "100")):
    tokens("tokens_vocab_" + name, ids, root_vocab=value)
beyond = ids.copy()
beyond[3000] = 150  # the vocab_size attribute says 100
tokens("tokens_beyond_vocab", beyond, vocab=100)
wraps = ids.astype(np.uint32)
wraps[40] = 2**31 + 5  # no vocab_size: cast to int32 this id turned negative
tokens("tokens_u32_wraps", wraps, dtype=np.uint32)
# No vocab_size anywhere: the train split's ids give the model's vocabulary (100), the test split
# holds an id above it.
test_ids = ids.copy()
test_ids[2000] = 180
tokens("tokens_test_beyond_train", ids, test=test_ids)

# Chunk indexes of the latest file format (fixed array, extensible array, v2 B-tree, single
# chunk) next to the default v1 B-tree, for both of RowReader's chunk paths (listed, looked up).
with h5py.File(os.path.join(out, "latest_formats.h5"), "w", libver="latest") as f:
    f.create_dataset("fixed_array", data=images, chunks=(1, 28, 28, 1))
    f.create_dataset("extensible_array", data=images, chunks=(1, 28, 28, 1), maxshape=(None, 28, 28, 1))
    f.create_dataset("btree2", data=images, chunks=(3, 14, 28, 1), maxshape=(None, None, 28, 1), compression="gzip")
    f.create_dataset("single_chunk", data=images, chunks=images.shape, shuffle=True, compression="gzip")

# One sample per chunk, as a dataset appended sample by sample is stored (maxshape None along the
# samples): 100,000 chunks of images and as many of labels. HDF5 1.10 lists chunk i by walking its
# index from the start, so listing them all took minutes. Image i is (i * 7 + j) % 251 at byte j.
n = 100_000
many = ((np.arange(n, dtype=np.int64)[:, None] * 7 + np.arange(64)) % 251).astype(np.uint8).reshape(n, 8, 8, 1)
with h5py.File(os.path.join(out, "one_per_chunk.h5"), "w") as f:
    g = f.create_group("train")
    g.create_dataset("images", data=many, chunks=(1, 8, 8, 1), maxshape=(None, 8, 8, 1))
    g.create_dataset("labels", data=np.arange(n, dtype=np.int64) % 10, chunks=(1,), maxshape=(None,))
print(f"wrote variants to {out}")
