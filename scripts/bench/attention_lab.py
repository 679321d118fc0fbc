"""Attention kernel lab: meshtrain's flash kernels (models/kernels/FlashAttention.cu) and cuDNN's
fused attention through meshtrain's graphs (models/kernels/CudnnAttention.cpp), both through the C
ABI in libmt_attention_capi.so, against a float64 reference and PyTorch's
scaled_dot_product_attention(is_causal=True), on the same GPU buffers in one process.

check(): fresh random inputs every call (the seed is printed), outputs poisoned with NaN first so
an unwritten element fails; relative error ||ours - ref|| / ||ref|| of O, dQ, dK, dV.
bench(): forward, backward and forward+backward, median of CUDA-event timings after warm-up, over
several rotating input sets (larger than L2): ours (every tile variant), cuDNN through us (atomic
and deterministic dQ), PyTorch SDPA's default and each backend it can be forced to.
check_cudnn(): the cuDNN backend over the same cases as check().
Used by scripts/bench/attention_bench (CLI) and tests/models/test_flash_attention.py."""

import ctypes
import math
import os
import statistics

import torch

CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
DEFAULT = -1  # a variant argument: the default for the call's shape (kFlashDefaultVariant)


def find_lib(path=None):
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    candidates = [path] if path else [os.path.join(root, d, "lib", "libmt_attention_capi.so")
                                      for d in ("dist", "build-sm90", "build")]
    for c in candidates:
        if c and os.path.exists(c):
            return c
    raise FileNotFoundError("libmt_attention_capi.so not found (build with CUDA; looked in %s)" % candidates)


class Flash:
    def __init__(self, path=None):
        self.lib = ctypes.CDLL(find_lib(path))
        L = self.lib
        i64, vp = ctypes.c_int64, ctypes.c_void_p
        L.mt_flash_last_error.restype = ctypes.c_char_p
        L.mt_flash_variant_name.restype = ctypes.c_char_p
        L.mt_flash_variant_name.argtypes = [i64, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        L.mt_flash_variant_count.argtypes = [i64, ctypes.c_int, ctypes.c_int]
        L.mt_flash_default_variant.argtypes = [i64, ctypes.c_int, ctypes.c_int, i64]
        L.mt_flash_supported.argtypes = [i64, ctypes.c_int]
        L.mt_flash_lse_elements.restype = i64
        L.mt_flash_lse_elements.argtypes = [i64, i64, i64, i64]
        L.mt_flash_workspace_bytes.restype = i64
        L.mt_flash_workspace_bytes.argtypes = [i64, i64, i64, i64, ctypes.c_int, vp, ctypes.c_int,
                                               ctypes.POINTER(i64), vp, ctypes.c_int, ctypes.POINTER(i64)]
        L.mt_flash_forward.argtypes = [i64, i64, i64, i64, ctypes.c_float, ctypes.POINTER(vp),
                                       ctypes.POINTER(ctypes.c_int), ctypes.POINTER(i64), vp, ctypes.c_int, vp]
        L.mt_flash_backward.argtypes = [i64, i64, i64, i64, ctypes.c_float, ctypes.POINTER(vp),
                                        ctypes.POINTER(ctypes.c_int), ctypes.POINTER(i64), vp, vp, i64,
                                        ctypes.c_int, vp]

    def variants(self, D, dtype, backward):
        n = self.lib.mt_flash_variant_count(D, CODES[dtype], int(backward))
        return [self.lib.mt_flash_variant_name(D, CODES[dtype], int(backward), i).decode() for i in range(n)]

    def _check(self, rc):
        if rc != 0:
            raise RuntimeError(self.lib.mt_flash_last_error().decode())

    @staticmethod
    def _views(ts):
        # Each operand is a [B, T, H, D] tensor (any strides, last dim contiguous).
        for t in ts:
            assert t.dim() == 4 and t.stride(3) == 1 and t.is_cuda, t.shape
        ptrs = (ctypes.c_void_p * len(ts))(*[t.data_ptr() for t in ts])
        dts = (ctypes.c_int * len(ts))(*[CODES[t.dtype] for t in ts])
        st = (ctypes.c_int64 * (3 * len(ts)))(*[s for t in ts for s in t.stride()[:3]])
        return ptrs, dts, st

    def lse(self, q):
        B, T, H, D = q.shape
        return torch.empty(self.lib.mt_flash_lse_elements(B, T, H, D), device=q.device, dtype=torch.float32)

    def default_variant(self, D, dtype, T, backward):
        """The index of the variant the trainer runs at this T (variant=DEFAULT resolves to it)."""
        return self.lib.mt_flash_default_variant(D, CODES[dtype], int(backward), T)

    def forward(self, q, k, v, o, lse, variant=DEFAULT):
        B, T, H, D = q.shape
        ptrs, dts, st = self._views([q, k, v, o])
        stream = torch.cuda.current_stream().cuda_stream
        self._check(self.lib.mt_flash_forward(B, T, H, D, 1.0 / math.sqrt(D), ptrs, dts, st, lse.data_ptr(),
                                              variant, stream))

    def workspace(self, q, dO, dq):
        B, T, H, D = q.shape
        s = lambda t: (ctypes.c_int64 * 3)(*t.stride()[:3])
        n = self.lib.mt_flash_workspace_bytes(B, T, H, D, CODES[q.dtype], dO.data_ptr(), CODES[dO.dtype], s(dO),
                                              dq.data_ptr(), CODES[dq.dtype], s(dq))
        if n < 0:
            self._check(-1)
        return torch.empty(max(n, 1), device=q.device, dtype=torch.uint8)

    def backward(self, q, k, v, o, dO, lse, dq, dk, dv, ws, variant=DEFAULT):
        B, T, H, D = q.shape
        ptrs, dts, st = self._views([q, k, v, o, dO, dq, dk, dv])
        stream = torch.cuda.current_stream().cuda_stream
        self._check(self.lib.mt_flash_backward(B, T, H, D, 1.0 / math.sqrt(D), ptrs, dts, st, lse.data_ptr(),
                                               ws.data_ptr(), ws.numel(), variant, stream))


class Cudnn:
    """cuDNN's fused attention through meshtrain's graphs (one handle and plan cache, freed with the object)."""

    def __init__(self, flash):
        self.lib = flash.lib
        L = self.lib
        i64, vp, ci = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
        pv, pi, p64 = ctypes.POINTER(vp), ctypes.POINTER(ci), ctypes.POINTER(i64)
        L.mt_cudnn_version.restype = i64
        L.mt_cudnn_create.restype = vp
        L.mt_cudnn_destroy.argtypes = [vp]
        L.mt_cudnn_unsupported.restype = ctypes.c_char_p
        L.mt_cudnn_unsupported.argtypes = [vp, i64, i64, i64, i64, pv, pi, p64, ci]
        L.mt_cudnn_engines.restype = ctypes.c_char_p
        L.mt_cudnn_engines.argtypes = [vp, i64, i64, i64, i64, pv, pi, p64, ci]
        L.mt_cudnn_workspace_bytes.restype = i64
        L.mt_cudnn_workspace_bytes.argtypes = [vp, i64, i64, i64, i64, pv, pi, p64, ci, ci]
        L.mt_cudnn_forward.argtypes = [vp, i64, i64, i64, i64, ctypes.c_float, pv, pi, p64, vp, vp, i64, vp]
        L.mt_cudnn_backward.argtypes = [vp, i64, i64, i64, i64, ctypes.c_float, pv, pi, p64, vp, ci, vp, i64, vp]
        self.ctx = L.mt_cudnn_create()
        if not self.ctx:
            raise RuntimeError("mt_cudnn_create: " + L.mt_flash_last_error().decode())
        self.version = L.mt_cudnn_version()

    def __del__(self):
        if getattr(self, "ctx", None):
            self.lib.mt_cudnn_destroy(self.ctx)
            self.ctx = None

    def _check(self, rc):
        if rc != 0:
            raise RuntimeError(self.lib.mt_flash_last_error().decode())

    @staticmethod
    def stats(q):
        B, T, H, D = q.shape
        return torch.empty(B * H * T, device=q.device, dtype=torch.float32)

    def unsupported(self, views, det=False):
        """'' when cuDNN runs q, k, v, o, dO, dq, dk, dv (builds the plans), else the reason."""
        B, T, H, D = views[0].shape
        ptrs, dts, st = Flash._views(views)
        return self.lib.mt_cudnn_unsupported(self.ctx, B, T, H, D, ptrs, dts, st, int(det)).decode()

    def engines(self, views, det=False):
        B, T, H, D = views[0].shape
        ptrs, dts, st = Flash._views(views)
        return self.lib.mt_cudnn_engines(self.ctx, B, T, H, D, ptrs, dts, st, int(det)).decode()

    def workspace(self, views, backward, det=False):
        B, T, H, D = views[0].shape
        ptrs, dts, st = Flash._views(views)
        n = self.lib.mt_cudnn_workspace_bytes(self.ctx, B, T, H, D, ptrs, dts, st, int(backward), int(det))
        if n < 0:
            self._check(-1)
        return torch.empty(max(n, 1), device=views[0].device, dtype=torch.uint8)

    def forward(self, q, k, v, o, stats, ws):
        B, T, H, D = q.shape
        ptrs, dts, st = Flash._views([q, k, v, o])
        self._check(self.lib.mt_cudnn_forward(self.ctx, B, T, H, D, 1.0 / math.sqrt(D), ptrs, dts, st,
                                              stats.data_ptr(), ws.data_ptr(), ws.numel(),
                                              torch.cuda.current_stream().cuda_stream))

    def backward(self, q, k, v, o, dO, stats, dq, dk, dv, ws, det=False):
        B, T, H, D = q.shape
        ptrs, dts, st = Flash._views([q, k, v, o, dO, dq, dk, dv])
        self._check(self.lib.mt_cudnn_backward(self.ctx, B, T, H, D, 1.0 / math.sqrt(D), ptrs, dts, st,
                                               stats.data_ptr(), int(det), ws.data_ptr(), ws.numel(),
                                               torch.cuda.current_stream().cuda_stream))


def sdpa(q, k, v):
    """PyTorch SDPA on [B, T, H, D] operands (it takes [B, H, T, D])."""
    o = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                         is_causal=True)
    return o.transpose(1, 2)


def reference(q, k, v, dO):
    """float64 causal attention and its gradients (math, on the GPU)."""
    q64, k64, v64 = (t.detach().double().transpose(1, 2).requires_grad_() for t in (q, k, v))
    D = q.shape[-1]
    s = q64 @ k64.transpose(-1, -2) / math.sqrt(D)
    T = q.shape[1]
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    p = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)
    o = p @ v64
    o.backward(dO.double().transpose(1, 2))
    return o.transpose(1, 2), q64.grad.transpose(1, 2), k64.grad.transpose(1, 2), v64.grad.transpose(1, 2)


def rel(a, b, floor=0.0):
    """||a - b|| / max(||b||, floor); the floor judges gradients that are exactly zero (dq and dk
    at T = 1) against the scale of dO instead of dividing by nothing."""
    a, b = a.double(), b.double()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - b).norm() / max(b.norm().item(), floor, 1e-30)).item()


def make_inputs(B, T, H, D, dtype, fused, gen):
    if fused:  # views into one [B, T, 3, H, D] tensor, as the GPT's qkv
        qkv = torch.randn(B, T, 3, H, D, device="cuda", generator=gen).to(dtype)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    else:
        q, k, v = (torch.randn(B, T, H, D, device="cuda", generator=gen).to(dtype) for _ in range(3))
    dO = torch.randn(B, T, H, D, device="cuda", generator=gen)
    return q, k, v, dO


def check_case(fl, B, T, H, D, dtype, out_dtype, fused, seed, fwd_variant=DEFAULT, bwd_variant=DEFAULT):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, dO32 = make_inputs(B, T, H, D, dtype, fused, gen)
    dO = dO32.to(out_dtype)
    if fused:
        dqkv = torch.full((B, T, 3, H, D), float("nan"), device="cuda", dtype=out_dtype)
        dq, dk, dv = dqkv[:, :, 0], dqkv[:, :, 1], dqkv[:, :, 2]
    else:
        dq, dk, dv = (torch.full((B, T, H, D), float("nan"), device="cuda", dtype=out_dtype) for _ in range(3))
    o = torch.full((B, T, H, D), float("nan"), device="cuda", dtype=out_dtype)
    lse = fl.lse(q)
    fl.forward(q, k, v, o, lse, fwd_variant)
    ws = fl.workspace(q, dO, dq)
    ws.fill_(0xFF)  # NaN patterns in the workspace: padding must never be read as numbers
    fl.backward(q, k, v, o, dO, lse, dq, dk, dv, ws, bwd_variant)
    torch.cuda.synchronize()
    ro, rdq, rdk, rdv = reference(q, k, v, dO.float())
    fl_ = 1e-4 * dO32.norm().item()
    errs = {"o": rel(o, ro), "dq": rel(dq, rdq, fl_), "dk": rel(dk, rdk, fl_), "dv": rel(dv, rdv, fl_)}
    # PyTorch SDPA on the same inputs, for scale: its own error against the same reference.
    qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
    os_ = sdpa(qs, ks, vs)
    os_.backward(dO.to(dtype))
    errs["sdpa_o"] = rel(os_, ro)
    errs["sdpa_dq"] = rel(qs.grad, rdq, fl_)
    errs["ours_vs_sdpa_o"] = rel(o, os_)
    return errs


CHECK_CASES = [
    # (B, T, H, D, dtype, out dtype, fused qkv layout)
    (2, 1, 3, 64, torch.bfloat16, torch.bfloat16, False),
    (2, 17, 3, 64, torch.bfloat16, torch.bfloat16, False),
    (2, 1000, 3, 64, torch.bfloat16, torch.bfloat16, False),
    (2, 1024, 3, 64, torch.bfloat16, torch.bfloat16, False),
    (1, 2048, 2, 64, torch.bfloat16, torch.bfloat16, False),
    (2, 1000, 3, 64, torch.bfloat16, torch.float32, True),  # the GPT path
    (2, 17, 3, 64, torch.float16, torch.float16, False),
    (2, 1000, 3, 64, torch.float16, torch.float32, True),
    (2, 1, 2, 128, torch.bfloat16, torch.bfloat16, False),
    (2, 17, 2, 128, torch.bfloat16, torch.bfloat16, False),
    (2, 1000, 2, 128, torch.bfloat16, torch.bfloat16, False),
    (1, 2048, 2, 128, torch.bfloat16, torch.float32, True),
    (2, 1024, 2, 128, torch.float16, torch.float16, False),
    (2, 17, 4, 32, torch.bfloat16, torch.bfloat16, False),
    (2, 1000, 4, 32, torch.bfloat16, torch.float32, True),
]


def check(fl, seed=None, all_variants=True, tol=1e-2, log=print):
    """Runs CHECK_CASES (every tile variant of each case when all_variants); returns failures."""
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    log("attention check: seed %d, tolerance %.0e (relative L2 against float64)" % (seed, tol))
    failures = []
    for n, (B, T, H, D, dt, odt, fused) in enumerate(CHECK_CASES):
        nf = len(fl.variants(D, dt, False)) if all_variants else 1
        nb = len(fl.variants(D, dt, True)) if all_variants else 1
        for var in range(max(nf, nb)):
            fv, bv = min(var, nf - 1), min(var, nb - 1)
            if not all_variants:
                fv, bv = fl.default_variant(D, dt, T, False), fl.default_variant(D, dt, T, True)
            e = check_case(fl, B, T, H, D, dt, odt, fused, seed + n, fv, bv)
            worst = max(e["o"], e["dq"], e["dk"], e["dv"])
            ok = worst < tol
            log("%s B=%d T=%-5d H=%d D=%-3d %-8s out %-8s %-6s %-14s %-14s o %.1e dq %.1e dk %.1e dv %.1e | sdpa o %.1e dq %.1e"
                % ("ok  " if ok else "FAIL", B, T, H, D, str(dt)[6:], str(odt)[6:], "fused" if fused else "split",
                   fl.variants(D, dt, False)[fv], fl.variants(D, dt, True)[bv], e["o"], e["dq"], e["dk"], e["dv"],
                   e["sdpa_o"], e["sdpa_dq"]))
            if not ok:
                failures.append((B, T, H, D, str(dt), str(odt), fused, fv, bv, e))
    return failures


def check_cudnn(cd, seed=None, tol=1e-2, log=print):
    """The cuDNN backend over CHECK_CASES' shapes (all operands in the input dtype: cuDNN writes O and
    the gradients in it), atomic and deterministic dQ, outputs poisoned; returns failures."""
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    log("cudnn attention check (cuDNN %d): seed %d, tolerance %.0e" % (cd.version, seed, tol))
    failures = []
    for n, (B, T, H, D, dt, _, fused) in enumerate(CHECK_CASES):
        for det in (False, True):
            gen = torch.Generator(device="cuda").manual_seed(seed + n)
            q, k, v, dO32 = make_inputs(B, T, H, D, dt, fused, gen)
            dO = dO32.to(dt)
            o = torch.full((B, T, H, D), float("nan"), device="cuda", dtype=dt)
            if fused:
                dqkv = torch.full((B, T, 3, H, D), float("nan"), device="cuda", dtype=dt)
                dq, dk, dv = dqkv[:, :, 0], dqkv[:, :, 1], dqkv[:, :, 2]
            else:
                dq, dk, dv = (torch.full((B, T, H, D), float("nan"), device="cuda", dtype=dt) for _ in range(3))
            views = [q, k, v, o, dO, dq, dk, dv]
            why = cd.unsupported(views, det)
            if why:
                log("FAIL B=%d T=%-5d H=%d D=%-3d %-8s det=%d: cuDNN cannot run it: %s" % (B, T, H, D, str(dt)[6:], det, why))
                failures.append((B, T, H, D, str(dt), det, why))
                continue
            stats = cd.stats(q).fill_(float("nan"))
            cd.forward(q, k, v, o, stats, cd.workspace(views, False))
            ws = cd.workspace(views, True, det)
            cd.backward(q, k, v, o, dO, stats, dq, dk, dv, ws, det)
            torch.cuda.synchronize()
            ro, rdq, rdk, rdv = reference(q, k, v, dO.float())
            fl_ = 1e-4 * dO32.norm().item()
            e = {"o": rel(o, ro), "dq": rel(dq, rdq, fl_), "dk": rel(dk, rdk, fl_), "dv": rel(dv, rdv, fl_)}
            worst = max(e.values())
            ok = worst < tol
            log("%s B=%d T=%-5d H=%d D=%-3d %-8s %-6s det=%d o %.1e dq %.1e dk %.1e dv %.1e (%s)"
                % ("ok  " if ok else "FAIL", B, T, H, D, str(dt)[6:], "fused" if fused else "split", det, e["o"],
                   e["dq"], e["dk"], e["dv"], cd.engines(views, det)))
            if not ok:
                failures.append((B, T, H, D, str(dt), det, e))
    return failures


def _median_ms(fn, reps, warmup=3):
    for _ in range(warmup):
        fn(0)
    times = []
    for i in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(i)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times), min(times), max(times)


def bench_cudnn(cd, inputs, outs, fwd_flop, bwd_flop, reps, sets):
    """cuDNN through meshtrain on bench()'s buffers: forward, backward, forward+backward (atomic dQ)
    and forward+backward with the deterministic backward."""
    q0, _, _, dO0 = inputs[0]
    o0, dq0, dk0, dv0, _ = outs[0]
    views0 = [q0, inputs[0][1], inputs[0][2], o0, dO0, dq0, dk0, dv0]
    why = cd.unsupported(views0, False) or cd.unsupported(views0, True)
    if why:
        return {"error": why}
    stats = [cd.stats(inp[0]) for inp in inputs]
    fws = cd.workspace(views0, False)
    bws = {det: cd.workspace(views0, True, det) for det in (False, True)}

    def fwd(i):
        q, k, v, _ = inputs[i % sets]
        o = outs[i % sets][0]
        cd.forward(q, k, v, o, stats[i % sets], fws)

    def bwd(i, det=False):
        q, k, v, dO = inputs[i % sets]
        o, dq, dk, dv, _ = outs[i % sets]
        cd.backward(q, k, v, o, dO, stats[i % sets], dq, dk, dv, bws[det], det)

    for i in range(sets):
        fwd(i)
    f = _median_ms(fwd, reps)[0]
    b = _median_ms(bwd, reps)[0]
    fb = _median_ms(lambda i: (fwd(i), bwd(i)), reps)[0]
    fbd = _median_ms(lambda i: (fwd(i), bwd(i, True)), reps)[0]
    return {"fwd_ms": f, "bwd_ms": b, "fwdbwd_ms": fb, "fwdbwd_det_ms": fbd, "fwd_tflops": fwd_flop / f / 1e9,
            "bwd_tflops": bwd_flop / b / 1e9, "fwdbwd_tflops": (fwd_flop + bwd_flop) / fb / 1e9,
            "fwdbwd_det_tflops": (fwd_flop + bwd_flop) / fbd / 1e9, "engines": cd.engines(views0, False),
            "engines_det": cd.engines(views0, True), "cudnn_version": cd.version}


def bench(fl, B, T, H, D, dtype=torch.bfloat16, reps=30, sets=3, log=print, cudnn=None):
    """Times ours (each variant pair), cuDNN through us (when given a Cudnn) and SDPA; returns a dict."""
    gen = torch.Generator(device="cuda").manual_seed(1234)
    inputs = [make_inputs(B, T, H, D, dtype, False, gen) for _ in range(sets)]
    inputs = [(q, k, v, dO.to(dtype)) for q, k, v, dO in inputs]
    fwd_flop = 4.0 * B * H * T * T * D / 2  # causal: half of QK^T and PV
    bwd_flop = 2.5 * fwd_flop               # five GEMMs instead of two
    res = {"B": B, "T": T, "H": H, "D": D, "dtype": str(dtype), "ours": [], "torch": torch.__version__}
    outs = [tuple(torch.empty_like(q) for _ in range(4)) + (fl.lse(q),) for q, _, _, _ in inputs]
    wss = [fl.workspace(inp[0], inp[3], o[1]) for inp, o in zip(inputs, outs)]

    def ours_fwd(i, fv):
        q, k, v, _ = inputs[i % sets]
        o, _, _, _, lse = outs[i % sets]
        fl.forward(q, k, v, o, lse, fv)

    def ours_bwd(i, bv):
        q, k, v, dO = inputs[i % sets]
        o, dq, dk, dv, lse = outs[i % sets]
        fl.backward(q, k, v, o, dO, lse, dq, dk, dv, wss[i % sets], bv)

    for fv, fname in enumerate(fl.variants(D, dtype, False)):
        for i in range(sets):
            ours_fwd(i, fv)
        f = _median_ms(lambda i: ours_fwd(i, fv), reps)[0]
        res["ours"].append({"variant": fname, "fwd_ms": f, "fwd_tflops": fwd_flop / f / 1e9})
    for bv, bname in enumerate(fl.variants(D, dtype, True)):
        b = _median_ms(lambda i: ours_bwd(i, bv), reps)[0]
        res["ours"].append({"variant": bname, "bwd_ms": b, "bwd_tflops": bwd_flop / b / 1e9})
    best_f = min((r for r in res["ours"] if "fwd_ms" in r), key=lambda r: r["fwd_ms"])
    best_b = min((r for r in res["ours"] if "bwd_ms" in r), key=lambda r: r["bwd_ms"])
    fvb = fl.variants(D, dtype, False).index(best_f["variant"])
    bvb = fl.variants(D, dtype, True).index(best_b["variant"])

    def ours_both(i):
        ours_fwd(i, fvb)
        ours_bwd(i, bvb)

    tb = _median_ms(ours_both, reps)[0]
    res["ours_best"] = {"fwd": best_f["variant"], "bwd": best_b["variant"], "fwd_ms": best_f["fwd_ms"],
                        "bwd_ms": best_b["bwd_ms"], "fwdbwd_ms": tb, "fwdbwd_tflops": (fwd_flop + bwd_flop) / tb / 1e9}
    # The default variants (what the trainer runs at this T).
    d0 = _median_ms(lambda i: (ours_fwd(i, DEFAULT), ours_bwd(i, DEFAULT)), reps)[0]
    res["ours_default_fwdbwd_ms"] = d0
    res["ours_default"] = {"fwd": fl.variants(D, dtype, False)[fl.default_variant(D, dtype, T, False)],
                           "bwd": fl.variants(D, dtype, True)[fl.default_variant(D, dtype, T, True)]}

    leaves = [tuple(t.detach().clone().requires_grad_() for t in inp[:3]) + (inp[3],) for inp in inputs]

    def t_fwd(i):
        q, k, v, _ = leaves[i % sets]
        with torch.no_grad():
            sdpa(q, k, v)

    def t_both(i):
        q, k, v, dO = leaves[i % sets]
        q.grad = k.grad = v.grad = None
        sdpa(q, k, v).backward(dO)

    tf = _median_ms(t_fwd, reps)[0]
    tfb = _median_ms(t_both, reps)[0]
    res["sdpa"] = {"fwd_ms": tf, "fwdbwd_ms": tfb, "fwd_tflops": fwd_flop / tf / 1e9,
                   "fwdbwd_tflops": (fwd_flop + bwd_flop) / tfb / 1e9}
    # PyTorch SDPA forced to each backend it has (where this torch and GPU run it).
    res["sdpa_forced"] = {}
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
            if not hasattr(SDPBackend, name):
                continue
            try:
                with sdpa_kernel(getattr(SDPBackend, name)):
                    t = _median_ms(t_both, reps)[0]
                res["sdpa_forced"][name.lower()] = {"fwdbwd_ms": t, "fwdbwd_tflops": (fwd_flop + bwd_flop) / t / 1e9}
            except RuntimeError as e:
                res["sdpa_forced"][name.lower()] = {"error": str(e).splitlines()[0][:120]}
    except ImportError as e:
        res["sdpa_forced"]["unavailable"] = {"error": str(e)}
    # cuDNN through meshtrain (the views of the same inputs), atomic and deterministic dQ.
    if cudnn is not None:
        res["cudnn"] = bench_cudnn(cudnn, inputs, outs, fwd_flop, bwd_flop, reps, sets)
        # What model.attention = auto chooses from: ours, cuDNN with either backward.
        best = min(res["ours_default_fwdbwd_ms"], res["cudnn"].get("fwdbwd_ms", float("inf")),
                   res["cudnn"].get("fwdbwd_det_ms", float("inf")))
        res["meshtrain_best_fwdbwd_ms"] = best
        res["speed_ratio_best_fwdbwd"] = tfb / best
    res["speed_ratio_fwdbwd"] = tfb / tb
    res["speed_ratio_fwd"] = tf / best_f["fwd_ms"]
    res["speed_ratio_default_fwdbwd"] = tfb / d0
    for r in res["ours"]:
        if "fwd_ms" in r:
            log("  ours %-14s fwd %8.3f ms %6.1f TFLOP/s" % (r["variant"], r["fwd_ms"], r["fwd_tflops"]))
        else:
            log("  ours %-14s bwd %8.3f ms %6.1f TFLOP/s" % (r["variant"], r["bwd_ms"], r["bwd_tflops"]))
    return res
