#!/usr/bin/env python3
"""Bucket all-reduces overlap backward: in the trainer's own trace (run.trace = true), buckets start
communicating while backward is still computing the earlier layers."""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from common import run_trainer  # noqa: E402


class Overlap(unittest.TestCase):
    def test_buckets_start_before_backward_ends(self):
        with tempfile.TemporaryDirectory() as d:
            run_trainer(2, ["--model.type=cnn", "--train.batch_size=64", "--train.max_steps=12", "--run.trace=true",
                            f"--run.dir={d}", "--run.name=overlap", "--dist.bucket_cap_mb=0.03",
                            "--dist.first_bucket_mb=0.001", "--run.log_interval=6"])
            for rank in (0, 1):
                with open(os.path.join(d, "overlap", f"trace.rank{rank}.jsonl")) as f:
                    steps = [json.loads(l) for l in f]
                self.assertEqual(len(steps), 12)
                overlapped = 0
                for s in steps[2:]:  # after warm-up
                    buckets = s["buckets"]
                    self.assertGreater(len(buckets), 2, "expected several buckets")
                    for b in buckets:
                        self.assertGreaterEqual(b["started_us"], b["ready_us"])
                        self.assertGreaterEqual(b["done_us"], b["started_us"])
                    early = [b for b in buckets if b["started_us"] < s["backward_end_us"]]
                    if early and buckets[0]["started_us"] < s["backward_end_us"]:
                        overlapped += 1
                    lead_ms = (s["backward_end_us"] - buckets[0]["started_us"]) / 1000
                    print(f"rank {rank} step {s['step']}: bucket 0 started {lead_ms:.1f} ms before backward ended, "
                          f"{len(early)}/{len(buckets)} buckets started during backward")
                self.assertGreaterEqual(overlapped, len(steps[2:]) - 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
