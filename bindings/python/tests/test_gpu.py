"""GPU plans with PyTorch CUDA tensors (and CuPy arrays when present),
checked against a float32 PyTorch implementation of DESIGN §1.

Skipped when torch, CUDA or libmla's GPU backend is missing.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import mla
from conftest import make_batch

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or mla.gpu_device_count() == 0,
                                reason="needs a CUDA device visible to torch and libmla's GPU backend")

H = 16
DEV = "cuda"


def torch_attention(qf, kvf, qo_indptr, kv_indptr, kv_last_page_len, kv_indices, page_size, sm_scale=None,
                    logit_cap=0.0):
    """DESIGN §1 in float32 PyTorch: qf [T, H, 576], kvf [P, ps, 576] floats."""
    sm = sm_scale or 1.0 / math.sqrt(576)
    T, Hh, _ = qf.shape
    out = torch.zeros(T, Hh, 512, dtype=torch.float32, device=qf.device)
    lse = torch.full((T, Hh), -math.inf, dtype=torch.float32, device=qf.device)
    qo = [int(x) for x in qo_indptr]
    kp = [int(x) for x in kv_indptr]
    for b in range(len(qo) - 1):
        n, pages = qo[b + 1] - qo[b], kp[b + 1] - kp[b]
        L = 0 if pages == 0 else (pages - 1) * page_size + (page_size if kv_last_page_len is None
                                                            else int(kv_last_page_len[b]))
        if n == 0 or L == 0:
            continue
        ids = torch.arange(kp[b], kp[b + 1], device=qf.device) if kv_indices is None else \
            torch.as_tensor(np.asarray(kv_indices[kp[b]:kp[b + 1]]), device=qf.device).long()
        K = kvf[ids].reshape(-1, 576)[:L]
        s = torch.einsum("nhd,ld->nhl", qf[qo[b]:qo[b + 1]], K) * sm
        if logit_cap > 0:
            s = logit_cap * torch.tanh(s / logit_cap)
        i = torch.arange(n, device=qf.device)[:, None]
        j = torch.arange(L, device=qf.device)[None, :]
        s = s.masked_fill(~(j <= L - n + i)[:, None, :], -math.inf)
        l_ = torch.logsumexp(s, dim=-1)
        p = torch.nan_to_num(torch.exp(s - l_[..., None]), nan=0.0)
        out[qo[b]:qo[b + 1]] = torch.einsum("nhl,ld->nhd", p, K[:, :512])
        lse[qo[b]:qo[b + 1]] = l_
    return out, lse


def assert_close_torch(out, lse, ref_out, ref_lse):
    o = out.float() if out.dtype == torch.bfloat16 else out.view(torch.bfloat16).float()
    scale = max(ref_out.abs().max().item(), 1e-6)
    err = (o - ref_out).abs()
    tol = 8e-3 * ref_out.abs() + 2e-3 * scale
    assert bool((err <= tol).all()), f"out max error {err.max().item():.3g}"
    if lse is not None:
        inf = torch.isneginf(ref_lse)
        assert torch.equal(torch.isneginf(lse), inf)
        d = (lse[~inf] - ref_lse[~inf]).abs()
        assert bool((d <= 1e-3 + 1e-4 * ref_lse[~inf].abs()).all()), f"lse max error {d.max().item():.3g}"


def fp8_tensor(xf):
    """(fp8 tensor, scale, dequantized float32): torch.float8_e4m3fn where this
    torch has it, else uint8 codes from mla.quantize_fp8."""
    if hasattr(torch, "float8_e4m3fn"):
        scale = xf.abs().max().item() / 448.0
        x8 = (xf / scale).to(torch.float8_e4m3fn)
        return x8, scale, x8.float() * scale
    codes, scale = mla.quantize_fp8(xf.cpu().numpy())
    deq = torch.from_numpy(mla.dequantize_fp8(codes, scale)).to(xf.device)
    return torch.from_numpy(codes).to(xf.device), scale, deq


def make_inputs(rng, batch, kv_dtype):
    g = torch.Generator(device="cpu").manual_seed(int(rng.integers(2 ** 31)))
    qf = torch.randn(batch.total_q, H, 576, generator=g).to(DEV)
    kvf = torch.randn(batch.num_pages, batch.page_size, 576, generator=g).to(DEV)
    q = qf.to(torch.bfloat16)
    if kv_dtype == "bf16":
        kv = kvf.to(torch.bfloat16)
        return q, kv, None, kv.float()
    if kv_dtype == "fp8":
        return (q,) + fp8_tensor(kvf)
    packed, scales = mla.quantize_mxfp4(kvf.cpu().numpy())
    deq = torch.from_numpy(mla.dequantize_mxfp4(packed, scales)).to(DEV)
    return q, torch.from_numpy(packed).to(DEV), torch.from_numpy(scales).to(DEV), deq


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8", "mxfp4"])
def test_torch_tensors(rng, kv_dtype, page_size):
    batch = make_batch(rng, kv_lens=[300, 0, 1, 64, 1000], q_lens=[1, 1, 2, 1, 2], page_size=page_size)
    q, kv, kv_scale, kv_ref = make_inputs(rng, batch, kv_dtype)
    with mla.Plan(H, kv_dtype=kv_dtype, page_size=page_size, max_q_len=2, backend="gpu") as plan:
        assert plan.backend == "gpu"
        plan.build_metadata(batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len)
        indices = torch.from_numpy(batch.kv_indices).to(DEV)
        out, lse = plan.run(q, kv, kv_scale=kv_scale, kv_indices=indices, return_lse=True)
        torch.cuda.synchronize()
    assert out.dtype == torch.bfloat16 and out.is_cuda and lse.dtype == torch.float32
    ref = torch_attention(q.float(), kv_ref, batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len,
                          batch.kv_indices, page_size)
    assert_close_torch(out, lse, *ref)


def test_raw_integer_views(rng):
    # bf16 as int16 / uint16 views and fp8 as uint8 views give the same bits.
    batch = make_batch(rng, kv_lens=[200, 50], q_lens=[1, 1], page_size=16)
    q, kv8, scale, _ = make_inputs(rng, batch, "fp8")
    indices = torch.from_numpy(batch.kv_indices).to(DEV)
    with mla.Plan(H, kv_dtype="fp8", page_size=16, backend="gpu") as plan:
        plan.build_metadata(batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len)
        a = plan.run(q, kv8, kv_scale=scale, kv_indices=indices)
        b = plan.run(q.view(torch.int16), kv8.view(torch.uint8) if kv8.dtype != torch.uint8 else kv8,
                     kv_scale=scale, kv_indices=indices)
        torch.cuda.synchronize()
    assert b.dtype == torch.int16
    assert torch.equal(a.view(torch.int16), b)


def test_fp8_query(rng):
    batch = make_batch(rng, kv_lens=[129, 7], q_lens=[1, 1], page_size=64)
    _, kv8, scale, kv_ref = make_inputs(rng, batch, "fp8")
    qf = torch.randn(batch.total_q, H, 576, device=DEV)
    q8, q_scale, q_ref = fp8_tensor(qf)
    with mla.Plan(H, q_dtype="fp8", kv_dtype="fp8", page_size=64, backend="gpu") as plan:
        plan.build_metadata(batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len)
        out, lse = plan.run(q8, kv8, kv_scale=scale, q_scale=q_scale,
                            kv_indices=torch.from_numpy(batch.kv_indices).to(DEV), return_lse=True)
        torch.cuda.synchronize()
    ref = torch_attention(q_ref, kv_ref, batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len,
                          batch.kv_indices, 64)
    assert_close_torch(out, lse, *ref)


def test_logit_cap_and_q_len_4(rng):
    batch = make_batch(rng, kv_lens=[2, 300, 40], q_lens=[4, 4, 3], page_size=16)
    q, kv, _, kv_ref = make_inputs(rng, batch, "bf16")
    q = (q.float() * 6).to(torch.bfloat16)
    with mla.Plan(H, kv_dtype="bf16", page_size=16, max_q_len=4, logit_cap=5.0, backend="gpu") as plan:
        plan.build_metadata(batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len)
        out, lse = plan.run(q, kv, kv_indices=torch.from_numpy(batch.kv_indices).to(DEV), return_lse=True)
        torch.cuda.synchronize()
    ref = torch_attention(q.float(), kv_ref, batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len,
                          batch.kv_indices, 16, logit_cap=5.0)
    assert_close_torch(out, lse, *ref)


def test_device_metadata_matches_host_metadata(rng):
    batch = make_batch(rng, kv_lens=[500, 3, 0, 2000], q_lens=[1, 1, 1, 1], page_size=64)
    q, kv, scale, _ = make_inputs(rng, batch, "fp8")
    indices = torch.from_numpy(batch.kv_indices).to(DEV)
    with mla.Plan(H, kv_dtype="fp8", page_size=64, backend="gpu", deterministic=True) as plan:
        plan.build_metadata(batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len)
        host = plan.run(q, kv, kv_scale=scale, kv_indices=indices)
        plan.build_metadata(*(torch.from_numpy(a).to(DEV) for a in
                              (batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len)))
        with pytest.raises(mla.NoMetadataError):
            plan.schedule_info()  # built on the device
        dev = plan.run(q, kv, kv_scale=scale, kv_indices=indices)
        torch.cuda.synchronize()
    assert torch.equal(host, dev)


def test_side_stream_and_explicit_stream(rng):
    batch = make_batch(rng, kv_lens=[700, 90], q_lens=[1, 1], page_size=16)
    q, kv, _, kv_ref = make_inputs(rng, batch, "bf16")
    indices = torch.from_numpy(batch.kv_indices).to(DEV)
    ref = torch_attention(q.float(), kv_ref, batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len,
                          batch.kv_indices, 16)
    s = torch.cuda.Stream()
    with mla.Plan(H, kv_dtype="bf16", page_size=16, backend="gpu") as plan:
        plan.build_metadata(batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len)
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            out1 = plan.run(q, kv, kv_indices=indices)          # torch's current stream = s
        out2 = torch.zeros_like(out1)
        s.wait_stream(torch.cuda.current_stream())
        plan.run(q, kv, kv_indices=indices, out=out2, stream=s)  # explicit
        s.synchronize()
    assert_close_torch(out1, None, ref[0], None)
    assert torch.equal(out1, out2)


def test_cuda_graph_capture(rng):
    # Device metadata + execute captured in a CUDA graph, replayed for new lengths.
    ps = 16
    batch = make_batch(rng, kv_lens=[100, 40], q_lens=[1, 1], page_size=ps, shuffle=False)
    q, kv, _, kv_ref = make_inputs(rng, batch, "bf16")
    qo = torch.from_numpy(batch.qo_indptr).to(DEV)
    kvp = torch.from_numpy(batch.kv_indptr).to(DEV)
    last = torch.from_numpy(batch.kv_last_page_len).to(DEV)
    out = torch.zeros(batch.total_q, H, 512, dtype=torch.bfloat16, device=DEV)
    with mla.Plan(H, kv_dtype="bf16", page_size=ps, backend="gpu") as plan:
        plan.build_metadata(qo, kvp, last)  # warm-up outside the capture
        plan.run(q, kv, out=out)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            plan.build_metadata(qo, kvp, last)
            plan.run(q, kv, out=out)
        out.zero_()
        last.copy_(torch.tensor([3, 16], dtype=torch.int32))  # new lengths, same buffers
        g.replay()
        torch.cuda.synchronize()
    ref = torch_attention(q.float(), kv_ref, batch.qo_indptr, batch.kv_indptr, [3, 16], None, ps)
    assert_close_torch(out, None, ref[0], None)


def test_gpu_errors(rng):
    batch = make_batch(rng, kv_lens=[40], q_lens=[1], page_size=16)
    q, kv8, scale, _ = make_inputs(rng, batch, "fp8")
    with mla.Plan(H, kv_dtype="fp8", page_size=16, backend="gpu") as plan:
        plan.build_metadata(batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len)
        idx = torch.from_numpy(batch.kv_indices).to(DEV)
        with pytest.raises(mla.DeviceMismatchError, match="host memory"):
            plan.run(q.cpu(), kv8, kv_scale=scale, kv_indices=idx)
        with pytest.raises(mla.DeviceMismatchError):
            plan.run(q, kv8, kv_scale=scale, kv_indices=batch.kv_indices)  # NumPy page table
        with pytest.raises(mla.LayoutError):
            wide = torch.zeros(q.shape[0], H, 1152, dtype=torch.bfloat16, device=DEV)
            plan.run(wide[..., ::2], kv8, kv_scale=scale, kv_indices=idx)
        with pytest.raises(mla.DtypeError):
            plan.run(q.half(), kv8, kv_scale=scale, kv_indices=idx)
        if hasattr(torch, "float8_e4m3fnuz"):
            with pytest.raises(mla.DtypeError):
                plan.run(q, kv8.view(torch.uint8).view(torch.float8_e4m3fnuz), kv_scale=scale, kv_indices=idx)
        with pytest.raises(mla.ArgumentError, match="synchronise"):
            plan.run(q, kv8, kv_scale=torch.tensor(scale, device=DEV), kv_indices=idx)
        with pytest.raises(mla.ShapeError):
            plan.run(q[:, :8], kv8, kv_scale=scale, kv_indices=idx)
        with pytest.raises(mla.InvalidIndptrError):
            plan.build_metadata([0, 1], [1, 2])
        with pytest.raises(mla.DtypeError):
            plan.build_metadata(torch.tensor([0, 1], device=DEV), torch.tensor([0, 1], device=DEV))  # int64


def test_device_validation(rng):
    batch = make_batch(rng, kv_lens=[40], q_lens=[1], page_size=16)
    q, kv, _, _ = make_inputs(rng, batch, "bf16")
    with mla.Plan(H, kv_dtype="bf16", page_size=16, backend="gpu", validate_device_inputs=True) as plan:
        plan.build_metadata(batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len)
        bad = torch.tensor([0, 10 ** 6, 1], dtype=torch.int32, device=DEV)
        with pytest.raises((mla.DeviceValidationFailedError, mla.PageOutOfRangeError)):
            plan.run(q, kv, kv_indices=bad)
        torch.cuda.synchronize()


def test_cupy_arrays(rng):
    cupy = pytest.importorskip("cupy")
    batch = make_batch(rng, kv_lens=[60, 5], q_lens=[1, 1], page_size=1)
    qf = rng.standard_normal((batch.total_q, H, 576)).astype(np.float32)
    kvf = rng.standard_normal((batch.num_pages, 1, 576)).astype(np.float32)
    q, kv = mla.bf16(qf), mla.bf16(kvf)
    with mla.Plan(H, kv_dtype="bf16", backend="gpu") as plan:
        plan.build_metadata(batch.qo_indptr, batch.kv_indptr)
        out, lse = plan.run(cupy.asarray(q), cupy.asarray(kv), kv_indices=cupy.asarray(batch.kv_indices),
                            return_lse=True)
        cupy.cuda.get_current_stream().synchronize()
    ref = mla.reference(q, kv, batch.qo_indptr, batch.kv_indptr, None, batch.kv_indices)
    from conftest import assert_close
    assert_close(out.get(), lse.get(), *ref)
