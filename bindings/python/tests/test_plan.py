"""mla.Plan on the CPU backend against mla.reference (float64)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import mla
from conftest import assert_close, make_batch, random_inputs

Q_KV = [(q, kv) for q in ("bf16", "fp8", "fp8_fnuz") for kv in ("bf16", "fp8", "fp8_fnuz", "mxfp4")
        if not (q.startswith("fp8") and kv.startswith("fp8") and q != kv)]


def run_and_check(rng, batch, *, num_heads=16, q_dtype="bf16", kv_dtype="fp8", max_q_len=None, use_indices=True,
                  last_page_len=True, q_mult=1.0, **plan_kw):
    q, q_scale, kv, kv_scale = random_inputs(rng, batch, num_heads, q_dtype, kv_dtype, q_mult)
    max_q_len = max_q_len or max(max(batch.q_lens, default=1), 1)
    last = batch.kv_last_page_len if last_page_len else None
    indices = batch.kv_indices if use_indices else None
    with mla.Plan(num_heads, q_dtype=q_dtype, kv_dtype=kv_dtype, page_size=batch.page_size, max_q_len=max_q_len,
                  max_batch_size=max(len(batch.q_lens), 1), backend="cpu", **plan_kw) as plan:
        plan.build_metadata(batch.qo_indptr, batch.kv_indptr, last)
        out, lse = plan.run(q, kv, kv_scale=kv_scale, kv_indices=indices, q_scale=q_scale, return_lse=True)
    assert out.dtype == np.uint16 and out.shape == (batch.total_q, num_heads, 512)
    assert lse.dtype == np.float32 and lse.shape == (batch.total_q, num_heads)
    ref_out, ref_lse = mla.reference(q, kv, batch.qo_indptr, batch.kv_indptr, last, indices,
                                     q_dtype=q_dtype, kv_dtype=kv_dtype, q_scale=q_scale or 1.0, kv_scale=kv_scale,
                                     sm_scale=plan_kw.get("sm_scale"), logit_cap=plan_kw.get("logit_cap", 0.0))
    assert_close(out, lse, ref_out, ref_lse)
    return out, lse


@pytest.mark.parametrize("q_dtype,kv_dtype", Q_KV)
def test_dtypes_ragged(rng, q_dtype, kv_dtype):
    # Ragged lengths, an empty sequence, partial last pages, q_len 1 and 2.
    batch = make_batch(rng, kv_lens=[37, 0, 100, 16, 1], q_lens=[1, 1, 2, 1, 2], page_size=16)
    run_and_check(rng, batch, q_dtype=q_dtype, kv_dtype=kv_dtype, max_q_len=2)


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("kv_dtype", ["bf16", "mxfp4"])
def test_page_sizes(rng, page_size, kv_dtype):
    batch = make_batch(rng, kv_lens=[1, 64, 130, 0, 257], q_lens=[1, 1, 1, 1, 1], page_size=page_size)
    run_and_check(rng, batch, kv_dtype=kv_dtype, num_heads=8)


@pytest.mark.parametrize("page_size", [1, 64])
def test_identity_pages_and_full_last_page(rng, page_size):
    # kv_indices None (pages in order) and kv_last_page_len None (full pages).
    lens = [2 * page_size, page_size, 3 * page_size]
    batch = make_batch(rng, kv_lens=lens, q_lens=[1, 1, 1], page_size=page_size, shuffle=False)
    run_and_check(rng, batch, use_indices=False, last_page_len=False)


def test_q_len_above_one_with_short_sequences(rng):
    # q_len 4 on sequences shorter than 4: the first rows see no key at all.
    batch = make_batch(rng, kv_lens=[2, 4, 50, 0, 9], q_lens=[4, 4, 3, 2, 1], page_size=16)
    out, lse = run_and_check(rng, batch, max_q_len=4, num_heads=4)
    assert np.isneginf(lse[0:2]).all() and (out[0:2] == 0).all()
    assert np.isfinite(lse[2:4]).all()
    assert np.isneginf(lse[11:13]).all()  # the empty sequence


@pytest.mark.parametrize("logit_cap", [0.0, 2.0, 30.0])
def test_logit_cap(rng, logit_cap):
    batch = make_batch(rng, kv_lens=[80, 33], q_lens=[1, 2], page_size=16)
    run_and_check(rng, batch, kv_dtype="bf16", max_q_len=2, q_mult=6.0, logit_cap=logit_cap)


def test_logit_cap_changes_the_result(rng):
    batch = make_batch(rng, kv_lens=[80], q_lens=[1], page_size=16)
    q, _, kv, _ = random_inputs(rng, batch, 16, "bf16", "bf16", q_mult=6.0)
    outs = []
    for cap in (0.0, 2.0):
        with mla.Plan(16, kv_dtype="bf16", page_size=16, backend="cpu", logit_cap=cap) as plan:
            plan.build_metadata(batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len)
            outs.append(plan.run(q, kv, kv_indices=batch.kv_indices))
    assert not np.array_equal(outs[0], outs[1])


def test_sm_scale(rng):
    batch = make_batch(rng, kv_lens=[70, 5], q_lens=[1, 1], page_size=1)
    run_and_check(rng, batch, kv_dtype="fp8", sm_scale=0.11)


@pytest.mark.parametrize("num_splits", [1, 3, 8])
def test_forced_splits(rng, num_splits):
    batch = make_batch(rng, kv_lens=[900, 300, 70], q_lens=[1, 1, 1], page_size=64)
    run_and_check(rng, batch, kv_dtype="fp8", num_splits=num_splits)


def test_heads_one_and_128(rng):
    batch = make_batch(rng, kv_lens=[40, 3], q_lens=[1, 1], page_size=16)
    run_and_check(rng, batch, num_heads=1)
    run_and_check(rng, batch, num_heads=128)


def test_deterministic_is_batch_invariant(rng):
    # A sequence's output is bitwise identical whatever else is in the batch.
    ps = 16
    big = make_batch(rng, kv_lens=[1500, 40, 700, 3000], q_lens=[1, 1, 1, 1], page_size=ps, shuffle=False)
    q, _, kv, scale = random_inputs(rng, big, 16, "bf16", "fp8")
    with mla.Plan(16, kv_dtype="fp8", page_size=ps, backend="cpu", deterministic=True) as plan:
        assert plan.deterministic
        plan.build_metadata(big.qo_indptr, big.kv_indptr, big.kv_last_page_len)
        full = plan.run(q, kv, kv_scale=scale)
        # Sequence 2 alone, its pages and query row given as their own batch.
        p0, p1 = int(big.kv_indptr[2]), int(big.kv_indptr[3])
        plan.build_metadata([0, 1], [0, p1 - p0], big.kv_last_page_len[2:3])
        alone = plan.run(q[2:3].copy(), kv, kv_scale=scale, kv_indices=np.arange(p0, p1, dtype=np.int32))
    assert np.array_equal(full[2:3], alone)


def test_metadata_reused_across_layers(rng):
    batch = make_batch(rng, kv_lens=[50, 17], q_lens=[1, 1], page_size=16)
    with mla.Plan(16, kv_dtype="fp8", page_size=16, backend="cpu") as plan:
        plan.build_metadata(batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len)
        for _layer in range(3):
            q, _, kv, scale = random_inputs(rng, batch, 16, "bf16", "fp8")
            out, lse = plan.run(q, kv, scale, batch.kv_indices, return_lse=True)
            ref = mla.reference(q, kv, batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len, batch.kv_indices,
                                kv_scale=scale)
            assert_close(out, lse, *ref)


def test_caller_arrays_and_untouched_rows(rng):
    # q / out / lse with more rows than the batch owns: the extra rows are
    # left as they were.
    batch = make_batch(rng, kv_lens=[30, 12], q_lens=[1, 2], page_size=16)
    q, _, kv, scale = random_inputs(rng, batch, 16, "bf16", "fp8")
    q = np.concatenate([q, mla.bf16(np.ones((2, 16, 576), np.float32))])
    out = np.full((5, 16, 512), 0x7777, dtype=np.uint16)
    lse = np.full((5, 16), 123.0, dtype=np.float32)
    with mla.Plan(16, kv_dtype="fp8", page_size=16, max_q_len=2, backend="cpu") as plan:
        plan.build_metadata(batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len)
        got_out, got_lse = plan.run(q, kv, kv_scale=scale, kv_indices=batch.kv_indices, out=out, lse=lse)
    assert got_out is out and got_lse is lse
    assert (out[3:] == 0x7777).all() and (lse[3:] == 123.0).all()
    ref_out, ref_lse = mla.reference(q, kv, batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len,
                                     batch.kv_indices, kv_scale=scale)
    assert_close(out[:3], lse[:3], ref_out[:3], ref_lse[:3])


def test_empty_batches(rng):
    with mla.Plan(16, kv_dtype="bf16", page_size=16, backend="cpu") as plan:
        kv = np.zeros((1, 16, 576), np.uint16)
        # batch_size 0
        plan.build_metadata(np.zeros(1, np.int32), np.zeros(1, np.int32))
        out = plan.run(np.zeros((0, 16, 576), np.uint16), kv)
        assert out.shape == (0, 16, 512)
        # sequences without query tokens
        plan.build_metadata([0, 0, 0], [0, 1, 1], [5, 1])
        out, lse = plan.run(np.zeros((0, 16, 576), np.uint16), kv, return_lse=True)
        assert out.shape == (0, 16, 512) and lse.shape == (0, 16)
        # only sequences without keys
        plan.build_metadata([0, 1, 2], [0, 0, 0])
        out, lse = plan.run(mla.bf16(np.ones((2, 16, 576), np.float32)), kv, return_lse=True)
        assert (out == 0).all() and np.isneginf(lse).all()


def test_mxfp4_padded_scale_stride(rng):
    batch = make_batch(rng, kv_lens=[45, 20], q_lens=[1, 1], page_size=16)
    q, _, kv, scales = random_inputs(rng, batch, 16, "bf16", "mxfp4")
    padded = np.zeros(scales.shape[:2] + (32,), np.uint8)
    padded[..., :18] = scales
    padded[..., 18:] = 255  # would be NaN if read
    results = []
    with mla.Plan(16, kv_dtype="mxfp4", page_size=16, backend="cpu") as plan:
        plan.build_metadata(batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len)
        for s, stride in ((scales, None), (padded, 32), (padded[..., :18], None), (padded[..., :20], 32)):
            results.append(plan.run(q, kv, kv_scale=s, kv_indices=batch.kv_indices, kv_scale_stride=stride))
    for r in results[1:]:
        assert np.array_equal(results[0], r)


def test_caller_workspace(rng):
    batch = make_batch(rng, kv_lens=[300], q_lens=[1], page_size=16)
    q, _, kv, scale = random_inputs(rng, batch, 16, "bf16", "fp8")
    with mla.Plan(16, kv_dtype="fp8", page_size=16, backend="cpu", caller_workspace=True, max_batch_size=4,
                  num_splits=4) as plan:
        plan.build_metadata(batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len)
        ws = np.empty(max(plan.workspace_size, 16) + 16, np.uint8)
        ws = ws[(-ws.ctypes.data) % 16:][: max(plan.workspace_size, 16)]
        out = plan.run(q, kv, kv_scale=scale, kv_indices=batch.kv_indices, workspace=ws)
        if plan.workspace_size > 0:
            with pytest.raises(mla.WorkspaceTooSmallError):
                plan.run(q, kv, kv_scale=scale, kv_indices=batch.kv_indices)
            with pytest.raises(mla.WorkspaceTooSmallError):
                plan.run(q, kv, kv_scale=scale, kv_indices=batch.kv_indices, workspace=ws[:16])
    ref = mla.reference(q, kv, batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len, batch.kv_indices,
                        kv_scale=scale)
    assert_close(out, None, *ref)


def test_index_arrays_of_any_integer_type(rng):
    batch = make_batch(rng, kv_lens=[20, 40], q_lens=[1, 1], page_size=16)
    q, _, kv, _ = random_inputs(rng, batch, 16, "bf16", "bf16")
    with mla.Plan(16, kv_dtype="bf16", page_size=16, backend="cpu") as plan:
        plan.build_metadata(batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len)
        a = plan.run(q, kv, kv_indices=batch.kv_indices)
        plan.build_metadata(batch.qo_indptr.tolist(), batch.kv_indptr.astype(np.int64),
                            tuple(batch.kv_last_page_len.tolist()))
        b = plan.run(q, kv, kv_indices=batch.kv_indices.astype(np.int64).tolist())
    assert np.array_equal(a, b)


class ArrayInterfaceOnly:
    """Host memory seen only through __array_interface__."""

    def __init__(self, a):
        self._a = a
        self.__array_interface__ = a.__array_interface__


class DLPackOnly:
    """Host memory seen only through __dlpack__."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__()

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_other_host_array_types(rng):
    batch = make_batch(rng, kv_lens=[33], q_lens=[1], page_size=1)
    q, _, kv, scale = random_inputs(rng, batch, 16, "bf16", "fp8")
    with mla.Plan(16, kv_dtype="fp8", backend="cpu") as plan:
        plan.build_metadata(batch.qo_indptr, batch.kv_indptr)
        a = plan.run(q, kv, kv_scale=scale, kv_indices=batch.kv_indices)
        out = np.zeros_like(a)
        b = plan.run(ArrayInterfaceOnly(q), DLPackOnly(kv), kv_scale=np.float32(scale), kv_indices=batch.kv_indices,
                     out=ArrayInterfaceOnly(out))
        assert isinstance(b, ArrayInterfaceOnly)
    assert np.array_equal(a, out)


def test_dlpack_capsule_reader():
    from mla._arrays import _capsule_tensor
    a = np.arange(24, dtype=np.uint16).reshape(2, 3, 4)[:, ::2]
    capsule = a.__dlpack__()  # owns the DLManagedTensor while t is read
    t = _capsule_tensor(capsule, "a")
    assert t.ndim == 3 and [t.shape[i] for i in range(3)] == [2, 2, 4]
    assert [t.strides[i] for i in range(3)] == [12, 8, 1]
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (1, 16, 1)
    assert t.data + t.byte_offset == a.ctypes.data


def test_schedule_info_and_properties(rng):
    batch = make_batch(rng, kv_lens=[1000, 10], q_lens=[1, 1], page_size=64)
    with mla.Plan(32, kv_dtype="fp8_e4m3", q_dtype="bf16", page_size=64, backend="cpu", num_splits=4,
                  max_batch_size=8, num_threads=2) as plan:
        assert plan.backend == "cpu"
        assert plan.kv_dtype == "fp8_e4m3" and plan.q_dtype == "bf16"
        assert plan.num_heads == 32 and plan.page_size == 64 and plan.max_batch_size == 8
        assert plan.sm_scale == pytest.approx(1 / 24)
        assert isinstance(plan.workspace_size, int) and plan.workspace_size >= 0
        with pytest.raises(mla.NoMetadataError):
            plan.schedule_info()
        plan.build_metadata(batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len)
        info = plan.schedule_info()
        assert isinstance(info, mla.ScheduleInfo)
        assert info.max_splits == 4 and info.num_work_items >= 2 and info.block_tokens > 0
        assert "mla.Plan(num_heads=32" in repr(plan)


def test_auto_backend_without_gpu():
    if mla.gpu_device_count() > 0:
        pytest.skip("a GPU is present")
    with mla.Plan(16) as plan:
        assert plan.backend == "cpu"


def test_plans_on_threads_concurrently(rng):
    batch = make_batch(rng, kv_lens=[400, 90], q_lens=[1, 1], page_size=16)
    q, _, kv, scale = random_inputs(rng, batch, 16, "bf16", "fp8")
    ref = mla.reference(q, kv, batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len, batch.kv_indices,
                        kv_scale=scale)
    results, errors = [], []

    def work():
        try:
            with mla.Plan(16, kv_dtype="fp8", page_size=16, backend="cpu", num_threads=1) as plan:
                for _ in range(5):
                    plan.build_metadata(batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len)
                    results.append(plan.run(q, kv, kv_scale=scale, kv_indices=batch.kv_indices))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 15
    for r in results:
        assert_close(r, None, *ref)


def test_torch_cpu_tensors(rng):
    torch = pytest.importorskip("torch")
    batch = make_batch(rng, kv_lens=[50, 3], q_lens=[1, 1], page_size=16)
    q, _, kv, scale = random_inputs(rng, batch, 16, "bf16", "fp8")
    with mla.Plan(16, kv_dtype="fp8", page_size=16, backend="cpu") as plan:
        plan.build_metadata(torch.from_numpy(batch.qo_indptr), torch.from_numpy(batch.kv_indptr),
                            torch.from_numpy(batch.kv_last_page_len))
        a = plan.run(q, kv, kv_scale=scale, kv_indices=batch.kv_indices)
        tq = torch.from_numpy(q.view(np.int16)).view(torch.bfloat16)
        b = plan.run(tq, torch.from_numpy(kv), kv_scale=scale, kv_indices=torch.from_numpy(batch.kv_indices))
    assert b.dtype == torch.bfloat16
    assert np.array_equal(a, b.view(torch.int16).numpy().view(np.uint16))
