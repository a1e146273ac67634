#!/usr/bin/env python3
"""Plain-PyTorch MLA decode attention (DESIGN section 1), timed like mla-bench.

This is the baseline mla-bench --compare-torch measures libmla against: the
paged KV rows are gathered, dequantised (fp8 / mxfp4) to bf16, and attention is
two batched matmuls around a masked float32 softmax. The gather index and the
causal mask depend only on the sequence lengths, so like libmla's metadata they
are built once per shape outside the timed region.

  torch_mla.py --shapes SHAPES.json --out RESULTS.json [--device cuda|cpu]
  torch_mla.py --self-test [--device cpu|cuda]

SHAPES.json (written by mla-bench):
  {"iters": N, "warmup": W, "seed": S, "shuffle_pages": bool, "dirty_flush": bool,
   "shapes": [{"id": i, "kv_dtype": "bf16|fp8|fp8fnuz|mxfp4", "batch": B,
               "heads": H, "q_len": n, "page_size": P, "kv_lens": [...]}, ...]}
RESULTS.json:
  {"available": true, "device": "...", "torch_version": "...",
   "results": [{"id": i, "us": median, "min_us": ..., "kv_copies": k,
                "cache_flushed": bool, "error": null}, ...]}
  or {"available": false, "reason": "..."} when PyTorch or the device is missing
  (exit status 3).

Timing: CUDA events around each call after a warm-up, median; the KV pool is
rotated through enough copies that together they are >= 3x the L2, or, when one
copy already is, the L2 is overwritten between calls (outside the events).
"""

import argparse
import json
import math
import sys
import time

HEAD_DIM_QK = 576
HEAD_DIM_V = 512
SCALES_PER_ROW = 18
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
SCALE_LO, SCALE_HI = 120, 130  # E8M0 exponents of the random mxfp4 scales, as in mla-bench

ROW_BYTES = {"bf16": 1152, "fp8": 576, "fp8fnuz": 576, "mxfp4": 288}


def unavailable(out_path, reason):
    print(f"torch_mla.py: {reason}; the PyTorch comparison is skipped", flush=True)
    if out_path:
        with open(out_path, "w") as f:
            json.dump({"available": False, "reason": reason}, f)
    sys.exit(3)


def fp8_value(byte, fnuz):
    """Decoded value of an FP8 E4M3 byte (OCP e4m3fn or FNUZ); NaN encodings give NaN."""
    sign = -1.0 if byte & 0x80 else 1.0
    e, m = (byte >> 3) & 0xF, byte & 7
    if fnuz:
        if byte == 0x80:
            return math.nan
        return sign * (math.ldexp(m / 8, -7) if e == 0 else math.ldexp(1 + m / 8, e - 8))
    if e == 15 and m == 7:
        return math.nan
    return sign * (math.ldexp(m / 8, -6) if e == 0 else math.ldexp(1 + m / 8, e - 7))


def raw_kv_rms(kv_dtype):
    """RMS of the generated KV values before kv_scale (same data model as mla-bench)."""
    if kv_dtype == "bf16":
        return 1.0
    if kv_dtype == "mxfp4":
        e2 = sum(m * m for m in E2M1) / 8
        s2 = sum(4.0 ** (e - 127) for e in range(SCALE_LO, SCALE_HI + 1)) / (SCALE_HI - SCALE_LO + 1)
        return math.sqrt(e2 * s2)
    vals = [fp8_value(b, kv_dtype == "fp8fnuz") for b in range(256)]
    vals = [v for v in vals if not math.isnan(v)]
    return math.sqrt(sum(v * v for v in vals) / len(vals))


class Layout:
    """Paged layout of one batch and the gather index / mask built from it (untimed)."""

    def __init__(self, torch, kv_lens, q_len, page_size, shuffle, gen, device):
        self.kv_lens = list(kv_lens)
        self.q_len = q_len
        self.page_size = page_size
        self.batch = len(kv_lens)
        pages = [(n + page_size - 1) // page_size for n in kv_lens]
        self.kv_indptr = [0]
        for p in pages:
            self.kv_indptr.append(self.kv_indptr[-1] + p)
        self.num_pages = max(self.kv_indptr[-1], 1)
        if shuffle:
            table = torch.randperm(self.num_pages, generator=gen)
        else:
            table = torch.arange(self.num_pages)
        self.page_table = table.to(torch.int64)
        lmax = max(max(kv_lens), 1)
        # Pool row of (sequence b, token j): page_table[kv_indptr[b] + j // P] * P + j % P.
        j = torch.arange(lmax)
        starts = torch.tensor(self.kv_indptr[:-1], dtype=torch.int64)
        lens = torch.tensor(kv_lens, dtype=torch.int64)
        slot = (starts[:, None] + j[None, :] // page_size).clamp(max=self.num_pages - 1)
        rows = self.page_table[slot] * page_size + j[None, :] % page_size
        valid = j[None, :] < lens[:, None]
        self.gather = torch.where(valid, rows, torch.zeros_like(rows)).to(device)
        # Causal: query token i of n sees keys j <= L - n + i.
        i = torch.arange(q_len)
        limit = lens[:, None] - q_len + i[None, :]  # [B, n]
        mask = j[None, None, :] <= limit[:, :, None]  # [B, n, Lmax]
        self.mask = (mask & valid[:, None, :])[:, :, None, :].to(device)  # [B, n, 1, Lmax]


def dequant(torch, rows, scales, kv_dtype, kv_scale, out_dtype):
    """Gathered stored rows -> [..., 576] values of out_dtype."""
    if kv_dtype == "bf16":
        return rows.to(out_dtype)
    if kv_dtype in ("fp8", "fp8fnuz"):
        native = getattr(torch, "float8_e4m3fn" if kv_dtype == "fp8" else "float8_e4m3fnuz", None)
        if native is not None and rows.is_cuda:
            vals = rows.view(native).to(out_dtype)
        else:
            table = torch.tensor([fp8_value(b, kv_dtype == "fp8fnuz") for b in range(256)],
                                 dtype=torch.float32, device=rows.device)
            vals = table[rows.long()].to(out_dtype)
        return vals * kv_scale
    # MXFP4: two E2M1 per byte (low nibble = even element), one E8M0 per 32 elements.
    nib = torch.stack((rows & 0xF, rows >> 4), dim=-1).flatten(-2)  # [..., 576] uint8
    mag = (nib & 7).to(torch.int32)
    exp = (mag >> 1).to(torch.float32)
    half = (mag & 1).to(torch.float32)
    val = torch.where(mag >= 2, torch.exp2(exp - 1) * (1 + 0.5 * half), 0.5 * half)
    val = torch.where((nib & 8) != 0, -val, val)
    scale = torch.exp2(scales.to(torch.float32) - 127)  # [..., 18]
    val = val.unflatten(-1, (SCALES_PER_ROW, 32)) * scale[..., None]
    return val.flatten(-2).to(out_dtype)


def mla_forward(torch, q, pool, scales, layout, kv_dtype, kv_scale, sm_scale, compute_dtype):
    """q [total_q, H, 576] -> out [total_q, H, 512] (bf16), lse [total_q, H] (float32)."""
    b, n = layout.batch, layout.q_len
    heads = q.shape[1]
    rows = pool[layout.gather]  # [B, Lmax, row]
    sc = scales[layout.gather] if scales is not None else None
    k = dequant(torch, rows, sc, kv_dtype, kv_scale, compute_dtype)  # [B, Lmax, 576]
    qb = q.view(b, n * heads, HEAD_DIM_QK).to(compute_dtype)
    s = torch.bmm(qb, k.transpose(1, 2)).float() * sm_scale  # [B, n*H, Lmax]
    s = s.view(b, n, heads, -1).masked_fill(~layout.mask, -math.inf)
    lse = torch.logsumexp(s, dim=-1)  # [B, n, H]
    p = torch.exp(s - lse[..., None])
    p = torch.nan_to_num(p, nan=0.0)  # rows with no visible key
    out = torch.bmm(p.view(b, n * heads, -1).to(compute_dtype), k[..., :HEAD_DIM_V])
    return out.view(b * n, heads, HEAD_DIM_V).to(torch.bfloat16), lse.view(b * n, heads)


def make_data(torch, kv_dtype, layout, heads, gen, device):
    """Random pool (and scales) and Q with the same statistics as mla-bench's."""
    rows = layout.num_pages * layout.page_size
    kv_scale = 1.0
    scales = None
    if kv_dtype == "bf16":
        pool = torch.randn(rows, HEAD_DIM_QK, generator=gen).to(torch.bfloat16)
        k_rms = 1.0
    elif kv_dtype in ("fp8", "fp8fnuz"):
        raw = torch.randint(0, 256, (rows, HEAD_DIM_QK), generator=gen, dtype=torch.int32)
        nan = (raw == 0x80) if kv_dtype == "fp8fnuz" else ((raw & 0x7F) == 0x7F)
        pool = torch.where(nan, raw ^ 1, raw).to(torch.uint8)
        kv_scale = 1.0 / raw_kv_rms(kv_dtype)
        k_rms = 1.0
    else:
        pool = torch.randint(0, 256, (rows, HEAD_DIM_QK // 2), generator=gen, dtype=torch.int32).to(torch.uint8)
        scales = torch.randint(SCALE_LO, SCALE_HI + 1, (rows, SCALES_PER_ROW), generator=gen,
                               dtype=torch.int32).to(torch.uint8)
        k_rms = raw_kv_rms("mxfp4")
    total_q = layout.batch * layout.q_len
    q = (torch.randn(total_q, heads, HEAD_DIM_QK, generator=gen) * (2.0 / k_rms)).to(torch.bfloat16)
    pool = pool.to(device)
    scales = scales.to(device) if scales is not None else None
    return q.to(device), pool, scales, kv_scale


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def time_shape(torch, shape, iters, warmup, shuffle, seed, device, dirty_flush=False):
    kv_dtype = shape["kv_dtype"]
    heads, q_len, page = shape["heads"], shape["q_len"], shape["page_size"]
    gen = torch.Generator().manual_seed(int(seed) % (2 ** 63) + int(shape["id"]))
    layout = Layout(torch, shape["kv_lens"], q_len, page, shuffle, gen, device)
    q, pool, scales, kv_scale = make_data(torch, kv_dtype, layout, heads, gen, device)
    sm_scale = 1.0 / math.sqrt(HEAD_DIM_QK)
    cuda = device.type == "cuda"
    compute_dtype = torch.bfloat16 if cuda else torch.float32

    copies, flush, scratch = 1, False, None
    if cuda:
        props = torch.cuda.get_device_properties(device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 64 << 20)
        copy_bytes = pool.numel() * pool.element_size() + (scales.numel() if scales is not None else 0)
        need = 3 * l2
        if copy_bytes >= need:
            flush = True
        else:
            copies = min(256, -(-need // copy_bytes))
            free, _ = torch.cuda.mem_get_info(device)
            fit = max(1, (free // 3) // copy_bytes)
            if copies > fit:
                copies, flush = fit, True
        if flush:
            scratch = torch.empty(2 * l2, dtype=torch.uint8, device=device)
    pools = [pool] + [pool.clone() for _ in range(copies - 1)]
    scale_copies = [scales] + [scales.clone() if scales is not None else None for _ in range(copies - 1)]

    def call(i):
        k = i % copies
        return mla_forward(torch, q, pools[k], scale_copies[k], layout, kv_dtype, kv_scale, sm_scale, compute_dtype)

    for i in range(warmup):
        call(i)
    times = []
    if cuda:
        torch.cuda.synchronize(device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for i, (start, end) in enumerate(events):
            if flush and dirty_flush:
                scratch.fill_(i & 0xFF)
            elif flush:
                scratch.sum()  # evict by reading: clean lines, as mla-bench does by default
            start.record()
            call(warmup + i)
            end.record()
        torch.cuda.synchronize(device)
        times = [start.elapsed_time(end) * 1e3 for start, end in events]
    else:
        for i in range(iters):
            t0 = time.perf_counter()
            call(warmup + i)
            times.append((time.perf_counter() - t0) * 1e6)
    return {"id": shape["id"], "us": median(times), "min_us": min(times), "kv_copies": copies,
            "cache_flushed": flush, "error": None}


def reference(q, pool, scales, layout, kv_dtype, kv_scale, sm_scale):
    """Float64 loops over sequences, tokens and heads, straight from DESIGN section 1."""
    import torch
    b_out, b_lse = [], []
    rows_all = dequant(torch, pool, scales, kv_dtype, kv_scale, torch.float64)  # [rows, 576]
    qd = q.double()
    n = layout.q_len
    for b, length in enumerate(layout.kv_lens):
        idx = []
        for j in range(length):
            page = int(layout.page_table[layout.kv_indptr[b] + j // layout.page_size])
            idx.append(page * layout.page_size + j % layout.page_size)
        k = rows_all[idx] if idx else rows_all[:0]
        for i in range(n):
            visible = max(0, min(length, length - n + i + 1))
            for h in range(q.shape[1]):
                if visible == 0:
                    b_out.append(torch.zeros(HEAD_DIM_V, dtype=torch.float64))
                    b_lse.append(-math.inf)
                    continue
                s = (k[:visible] @ qd[b * n + i, h]) * sm_scale
                m = s.max()
                e = torch.exp(s - m)
                b_out.append((e[:, None] * k[:visible, :HEAD_DIM_V]).sum(0) / e.sum())
                b_lse.append(float(m + torch.log(e.sum())))
    heads = q.shape[1]
    return torch.stack(b_out).view(-1, heads, HEAD_DIM_V), torch.tensor(b_lse, dtype=torch.float64).view(-1, heads)


def self_test(torch, device):
    """mla_forward against the float64 loops on small shapes of every format."""
    # The decoders on their own: every byte against the format tables.
    ok = True
    allb = torch.arange(256, dtype=torch.int32).to(torch.uint8).to(device)
    unit = torch.full((1, SCALES_PER_ROW), 127, dtype=torch.uint8, device=device)
    rows = allb.view(-1, 1).expand(256, HEAD_DIM_QK // 2).contiguous()
    got = dequant(torch, rows, unit.expand(256, SCALES_PER_ROW), "mxfp4", 1.0, torch.float32).cpu()
    for b in range(256):
        lo, hi = b & 0xF, b >> 4
        want_lo = (-1 if lo & 8 else 1) * E2M1[lo & 7]
        want_hi = (-1 if hi & 8 else 1) * E2M1[hi & 7]
        if got[b, 0].item() != want_lo or got[b, 1].item() != want_hi:
            print(f"  mxfp4 byte {b:#04x}: decoded {got[b, 0].item()}, {got[b, 1].item()}; want {want_lo}, {want_hi}")
            ok = False
    for fmt in ("fp8", "fp8fnuz"):
        got = dequant(torch, allb.view(-1, 1), None, fmt, 1.0, torch.float32).cpu().view(-1)
        for b in range(256):
            want = fp8_value(b, fmt == "fp8fnuz")
            if not (math.isnan(want) or got[b].item() == want):
                print(f"  {fmt} byte {b:#04x}: decoded {got[b].item()}, want {want}")
                ok = False
    print("  decoders", "ok" if ok else "FAIL")

    cases = [("bf16", [5, 17, 1], 1, 1, False), ("fp8", [9, 33], 2, 4, True),
             ("fp8fnuz", [12], 1, 8, False), ("mxfp4", [40, 3, 64], 3, 16, True)]
    gen = torch.Generator().manual_seed(1234)
    compute_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    for kv_dtype, lens, q_len, page, shuffle in cases:
        heads = 4
        layout = Layout(torch, lens, q_len, page, shuffle, gen, device)
        q, pool, scales, kv_scale = make_data(torch, kv_dtype, layout, heads, gen, device)
        out, lse = mla_forward(torch, q, pool, scales, layout, kv_dtype, kv_scale, 1 / math.sqrt(576), compute_dtype)
        ref_out, ref_lse = reference(q.cpu(), pool.cpu(), scales.cpu() if scales is not None else None,
                                     layout, kv_dtype, kv_scale, 1 / math.sqrt(576))
        err = (out.cpu().double() - ref_out).abs().max().item() / max(ref_out.abs().max().item(), 1e-6)
        finite = torch.isfinite(ref_lse)
        lse_err = (lse.cpu().double()[finite] - ref_lse[finite]).abs().max().item()
        same_inf = bool((torch.isinf(lse.cpu()) == ~finite).all())
        good = err < 2e-2 and lse_err < 2e-2 and same_inf
        ok &= good
        print(f"  {kv_dtype:7s} lens {lens} q_len {q_len} page {page}: out err {err:.2e}, "
              f"lse err {lse_err:.2e} {'ok' if good else 'FAIL'}")
    print("self-test", "passed" if ok else "FAILED")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", help="shapes JSON written by mla-bench")
    ap.add_argument("--out", help="results JSON to write")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--self-test", action="store_true", help="check the implementation on small shapes")
    args = ap.parse_args()
    if not args.self_test and not (args.shapes and args.out):
        ap.error("--shapes and --out are required (or --self-test)")

    try:
        import torch
    except ImportError as e:
        unavailable(args.out, f"PyTorch is not installed for {sys.executable} ({e})")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        unavailable(args.out, f"PyTorch {torch.__version__} sees no CUDA/HIP device")
    device = torch.device(args.device)

    if args.self_test:
        return self_test(torch, device)

    with open(args.shapes) as f:
        spec = json.load(f)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"torch {torch.__version__} on {name}: {len(spec['shapes'])} shapes", flush=True)
    results = []
    for shape in spec["shapes"]:
        try:
            r = time_shape(torch, shape, int(spec.get("iters", 100)), int(spec.get("warmup", 10)),
                           bool(spec.get("shuffle_pages", False)), spec.get("seed", 0), device,
                           bool(spec.get("dirty_flush", False)))
        except (RuntimeError, MemoryError) as e:  # out of memory and the like: report, go on
            r = {"id": shape["id"], "us": None, "error": str(e).splitlines()[0]}
            if device.type == "cuda":
                torch.cuda.empty_cache()
        results.append(r)
        mean = sum(shape["kv_lens"]) / max(len(shape["kv_lens"]), 1)
        us = "-" if r["us"] is None else f"{r['us']:.1f} us"
        print(f"  torch {shape['kv_dtype']:6s} batch {shape['batch']:4d} kv_len {mean:7.0f} heads {shape['heads']:3d} "
              f"q_len {shape['q_len']} page {shape['page_size']:3d}: {us}"
              + (f"  ({r['error']})" if r.get("error") else ""), flush=True)
    with open(args.out, "w") as f:
        json.dump({"available": True, "device": name, "torch_version": torch.__version__, "results": results}, f,
                  indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
