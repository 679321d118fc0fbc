#!/usr/bin/env python3
"""Flash attention kernels (models/kernels/FlashAttention.cu) and cuDNN's fused attention through our
graphs (models/kernels/CudnnAttention.cpp) against float64 attention and PyTorch SDPA on the GPU:
every tile variant, bf16 and f16, head dims 32/64/128, T = 1, 17, 1000, 1024, 2048, split and
fused-qkv layouts, outputs poisoned with NaN; relative L2 error < 1e-2 for O, dQ, dK, dV.
Fresh random inputs each run (seed printed). Needs PyTorch with CUDA and libmt_attention_capi.so
(a CUDA build); skipped otherwise."""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "bench"))

try:
    import torch
    HAVE_CUDA = torch.cuda.is_available()
except ImportError:
    HAVE_CUDA = False


@unittest.skipUnless(HAVE_CUDA, "needs PyTorch with a CUDA device")
class FlashAttention(unittest.TestCase):
    def test_every_variant_matches_float64(self):
        import attention_lab as lab
        try:
            fl = lab.Flash(os.environ.get("MT_ATTENTION_CAPI"))
        except FileNotFoundError as e:
            self.skipTest(str(e))
        failures = lab.check(fl, all_variants=True)
        self.assertEqual(failures, [], "flash attention cases above the tolerance")

    def test_cudnn_backend_matches_float64(self):
        """cuDNN's fused attention through our graphs (model.attention = cudnn), the same cases,
        atomic and deterministic dQ."""
        import attention_lab as lab
        try:
            fl = lab.Flash(os.environ.get("MT_ATTENTION_CAPI"))
        except FileNotFoundError as e:
            self.skipTest(str(e))
        if torch.cuda.get_device_capability()[0] < 8:
            self.skipTest("cuDNN's fused attention needs compute capability 8.0+")
        failures = lab.check_cudnn(lab.Cudnn(fl))
        self.assertEqual(failures, [], "cuDNN attention cases above the tolerance or not run")

    def test_bad_views_are_refused(self):
        import attention_lab as lab
        try:
            fl = lab.Flash(os.environ.get("MT_ATTENTION_CAPI"))
        except FileNotFoundError as e:
            self.skipTest(str(e))
        q = torch.randn(1, 16, 2, 48, device="cuda").bfloat16()  # head dim 48 is not built
        o = torch.empty_like(q)
        with self.assertRaisesRegex(RuntimeError, "head dim 48"):
            fl.forward(q, q, q, o, fl.lse(q))
        q = torch.randn(1, 16, 2, 64, device="cuda").bfloat16()
        k = q.float()  # mixed dtypes
        with self.assertRaisesRegex(RuntimeError, "k is f32"):
            fl.forward(q, k, q, torch.empty_like(q), fl.lse(q))


if __name__ == "__main__":
    unittest.main()
