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

    def test_default_variant_follows_the_sequence_length(self):
        """A call without a variant runs the default of its T (the trainer's path): bitwise the output
        of that variant named explicitly, forward and backward; on sm_90 the forward's default
        changes between T = 1000 and 2048 (FlashAttention.cu's kWsForwardFromT)."""
        import attention_lab as lab
        try:
            fl = lab.Flash(os.environ.get("MT_ATTENTION_CAPI"))
        except FileNotFoundError as e:
            self.skipTest(str(e))
        names = {}
        for T in (1000, 2048):
            gen = torch.Generator(device="cuda").manual_seed(T)
            q, k, v, dO32 = lab.make_inputs(2, T, 4, 64, torch.bfloat16, False, gen)
            dO = dO32.bfloat16()
            fv = fl.default_variant(64, torch.bfloat16, T, False)
            bv = fl.default_variant(64, torch.bfloat16, T, True)
            names[T] = fl.variants(64, torch.bfloat16, False)[fv]
            outs = []
            for fvar, bvar in ((lab.DEFAULT, lab.DEFAULT), (fv, bv)):
                o, dq, dk, dv = (torch.full_like(q, float("nan")) for _ in range(4))
                lse = fl.lse(q)
                fl.forward(q, k, v, o, lse, fvar)
                fl.backward(q, k, v, o, dO, lse, dq, dk, dv, fl.workspace(q, dO, dq), bvar)
                torch.cuda.synchronize()
                outs.append((o, dk, dv))
            for a, b in zip(*outs):
                self.assertTrue(torch.equal(a, b), "T=%d: the default differs from variant %d/%d" % (T, fv, bv))
        print("default forward: T=1000 %s, T=2048 %s" % (names[1000], names[2048]))
        if torch.cuda.get_device_capability() == (9, 0):
            self.assertNotEqual(names[1000], names[2048])

    def test_overlapped_forward_is_bitwise_the_serial_one(self):
        """FlashAttention-3's intra-warpgroup overlap (`fwd wgmma ws tma overlap`: the softmax of key
        tile j under O += P v of tile j - 1) does the same operations on O in the same order as the
        serial warp-specialized forward, so O and the log-sum-exp are bitwise equal; bf16 and f16,
        T = 1, 17, 1000, 1024, 2048 (partial tiles, rows before the first key tile, and whole ones).
        sm_90 only (both are wgmma kernels)."""
        import attention_lab as lab
        try:
            fl = lab.Flash(os.environ.get("MT_ATTENTION_CAPI"))
        except FileNotFoundError as e:
            self.skipTest(str(e))
        if torch.cuda.get_device_capability() != (9, 0):
            self.skipTest("the warp-specialized kernels are built for sm_90a")
        for dtype in (torch.bfloat16, torch.float16):
            names = fl.variants(64, dtype, False)
            serial, overlap = names.index("fwd wgmma ws tma"), names.index("fwd wgmma ws tma overlap")
            for T in (1, 17, 1000, 1024, 2048):
                gen = torch.Generator(device="cuda").manual_seed(T + 7)
                q, k, v, _ = lab.make_inputs(3, T, 4, 64, dtype, T % 2 == 0, gen)
                outs = []
                for var in (serial, overlap):
                    o = torch.full(tuple(q.shape), float("nan"), device="cuda", dtype=dtype)
                    lse = fl.lse(q).fill_(float("nan"))
                    fl.forward(q, k, v, o, lse, var)
                    torch.cuda.synchronize()
                    outs.append((o, lse))
                for name, a, b in zip(("o", "lse"), *outs):
                    self.assertTrue(torch.equal(a.view(torch.uint8), b.view(torch.uint8)),
                                    "%s T=%d: %s of the overlapped forward differs from the serial one" % (
                                        str(dtype).split(".")[-1], T, name))

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

    def test_run_to_run_determinism(self):
        """Our kernels, default variants, twice on the same inputs into fresh NaN buffers: the forward
        (O and the log-sum-exp), dK and dV are bitwise repeatable (each tile owned by one CTA, a fixed
        order of the key loop); dQ is not promised (float atomics across key tiles: the sum's order
        varies), so it is held to the float64 tolerance of the other tests, and how often it differs
        is printed. bf16 and f16, head dims 64 and 128, T = 1000 and 2048."""
        import attention_lab as lab
        try:
            fl = lab.Flash(os.environ.get("MT_ATTENTION_CAPI"))
        except FileNotFoundError as e:
            self.skipTest(str(e))
        for dtype in (torch.bfloat16, torch.float16):
            for D, H in ((64, 12), (128, 6)):
                for T in (1000, 2048):
                    gen = torch.Generator(device="cuda").manual_seed(T + D)
                    q, k, v, dO32 = lab.make_inputs(4, T, H, D, dtype, True, gen)
                    dO = dO32.to(dtype)
                    runs = []
                    for _ in range(2):
                        o = torch.full_like(dO, float("nan"))
                        dq, dk, dv = (torch.full_like(dO, float("nan")) for _ in range(3))
                        lse = fl.lse(q).fill_(float("nan"))
                        fl.forward(q, k, v, o, lse)
                        fl.backward(q, k, v, o, dO, lse, dq, dk, dv, fl.workspace(q, dO, dq))
                        torch.cuda.synchronize()
                        runs.append((o, lse, dq, dk, dv))
                    where = "%s D=%d T=%d" % (str(dtype).split(".")[-1], D, T)
                    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), runs[0], runs[1]):
                        same = torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                        if name == "dq":
                            diff = (a.float() - b.float()).abs().max().item()
                            print("flash determinism %s: dq %s (max |difference| %.3g, scale %.3g)" % (
                                where, "bitwise equal" if same else "differs", diff, a.float().abs().max().item()))
                            self.assertLess(diff, 1e-2 * a.float().abs().max().item(), where)
                        else:
                            self.assertTrue(same, "%s: %s not bitwise repeatable" % (where, name))

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
