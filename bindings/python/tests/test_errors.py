"""Every kind of bad input raises an mla.Error: the library's refusals with
their status and message, the Python layer's checks with their own."""

from __future__ import annotations

import numpy as np
import pytest

import mla
from conftest import make_batch, random_inputs

H, PS = 16, 16


@pytest.fixture
def setup(rng):
    batch = make_batch(rng, kv_lens=[40, 9], q_lens=[1, 2], page_size=PS)
    q, _, kv, scale = random_inputs(rng, batch, H, "bf16", "fp8")
    plan = mla.Plan(H, kv_dtype="fp8", page_size=PS, max_q_len=2, max_batch_size=4, backend="cpu")
    plan.build_metadata(batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len)
    yield plan, batch, q, kv, scale
    plan.close()


def run(plan, batch, q, kv, scale, **kw):
    args = dict(kv_scale=scale, kv_indices=batch.kv_indices)
    args.update(kw)
    return plan.run(q, kv, **args)


# ---- the error objects -------------------------------------------------------

def test_error_carries_status_and_library_message(setup):
    plan, batch, *_ = setup
    with pytest.raises(mla.InvalidIndptrError) as ei:
        plan.build_metadata([1, 2], [0, 1])
    e = ei.value
    assert isinstance(e, mla.Error) and isinstance(e, ValueError)
    assert e.status == mla.Status.INVALID_INDPTR
    assert e.status_name == "MLA_ERROR_INVALID_INDPTR"
    assert e.function == "mla_plan_build_metadata"
    assert "qo_indptr" in e.message and e.message in str(e)
    assert mla.core.mla_last_error_message() == e.message


def test_every_status_has_a_class():
    from mla._errors import _BY_STATUS, error_for_status
    for st in mla.Status:
        if st == mla.Status.SUCCESS:
            continue
        assert st in _BY_STATUS
        err = error_for_status(int(st), "f")
        assert type(err) is _BY_STATUS[st] and err.status == st
        assert mla.core.mla_status_string(int(st)) == "MLA_ERROR_" + st.name


def test_python_checks_have_no_status():
    with pytest.raises(mla.DtypeError) as ei:
        mla.Plan(H, kv_dtype="int4")
    assert ei.value.status is None and isinstance(ei.value, TypeError) and isinstance(ei.value, mla.Error)
    assert "kv_dtype='int4'" in str(ei.value)


# ---- plan creation -------------------------------------------------------------

@pytest.mark.parametrize("kw,cls,word", [
    (dict(num_heads=0), mla.InvalidValueError, "num_heads"),
    (dict(num_heads=129), mla.InvalidValueError, "num_heads"),
    (dict(page_size=3), mla.InvalidValueError, "page_size"),
    (dict(page_size=512), mla.InvalidValueError, "page_size"),
    (dict(max_q_len=9), mla.InvalidValueError, "max_q_len"),
    (dict(max_batch_size=-1), mla.InvalidValueError, "max_batch_size"),
    (dict(num_splits=65), mla.InvalidValueError, "num_splits"),
    (dict(logit_cap=-1.0), mla.InvalidValueError, "logit_cap"),
    (dict(sm_scale=-0.5), mla.InvalidValueError, "sm_scale"),
    (dict(sm_scale=float("nan")), mla.InvalidValueError, "sm_scale"),
    (dict(num_threads=-2), mla.InvalidValueError, "num_threads"),
    (dict(device=-1), mla.InvalidDeviceError, "device"),
    (dict(q_dtype="fp8_fnuz", kv_dtype="fp8"), mla.UnsupportedDtypeError, "FP8"),
    (dict(q_dtype="mxfp4"), mla.UnsupportedDtypeError, "q_dtype"),
])
def test_plan_refused_by_library(kw, cls, word):
    args = dict(num_heads=H, backend="cpu")
    args.update(kw)
    with pytest.raises(cls) as ei:
        mla.Plan(**args)
    assert word in ei.value.message and ei.value.function == "mla_plan_create"


@pytest.mark.parametrize("kw,cls", [
    (dict(num_heads="16"), mla.ArgumentError),
    (dict(num_heads=16.0), mla.ArgumentError),
    (dict(num_heads=2 ** 40), mla.ArgumentError),
    (dict(page_size=True), mla.ArgumentError),
    (dict(kv_dtype="fp16"), mla.DtypeError),
    (dict(q_dtype=42), mla.DtypeError),
    (dict(backend="tpu"), mla.ArgumentError),
    (dict(sm_scale="x"), mla.ArgumentError),
])
def test_plan_refused_in_python(kw, cls):
    args = dict(num_heads=H, backend="cpu")
    args.update(kw)
    with pytest.raises(cls):
        mla.Plan(**args)


def test_gpu_backend_without_gpu():
    if mla.gpu_device_count() > 0:
        pytest.skip("a GPU is present")
    with pytest.raises(mla.Error) as ei:
        mla.Plan(H, backend="gpu")
    assert ei.value.status in (mla.Status.BACKEND_UNAVAILABLE, mla.Status.INVALID_DEVICE)
    assert ei.value.message


# ---- build_metadata ----------------------------------------------------------------

@pytest.mark.parametrize("args,cls", [
    (([1, 1], [0, 1]), mla.InvalidIndptrError),                 # qo_indptr[0] != 0
    (([0, 1], [1, 2]), mla.InvalidIndptrError),                 # kv_indptr[0] != 0
    (([0, 1, 0], [0, 1, 2]), mla.InvalidIndptrError),           # qo_indptr decreases
    (([0, 1, 2], [0, 3, 2]), mla.InvalidIndptrError),           # kv_indptr decreases
    (([0, 1], [0, 1], [0]), mla.InvalidLastPageLenError),       # last page empty
    (([0, 1], [0, 1], [PS + 1]), mla.InvalidLastPageLenError),  # last page overfull
    (([0, 3], [0, 1]), mla.LimitExceededError),                 # q_len 3 > max_q_len 2
    (([0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]), mla.LimitExceededError),  # batch 5 > 4
])
def test_metadata_refused_by_library(setup, args, cls):
    plan = setup[0]
    with pytest.raises(cls) as ei:
        plan.build_metadata(*args)
    assert ei.value.message


@pytest.mark.parametrize("args,cls", [
    (([], []), mla.ShapeError),                                 # no batch_size + 1 entry
    (([0, 1], [0, 1, 2]), mla.ShapeError),                      # lengths differ
    (([0, 1], [0, 1], [1, 1]), mla.ShapeError),                 # last_page_len length
    ((np.zeros((2, 2), np.int32), [0, 1]), mla.ShapeError),     # 2-D
    (([0.0, 1.0], [0, 1]), mla.DtypeError),                     # floats
    (([0, 2 ** 40], [0, 1]), mla.ArgumentError),                # beyond int32
])
def test_metadata_refused_in_python(setup, args, cls):
    with pytest.raises(cls):
        setup[0].build_metadata(*args)


def test_failed_metadata_leaves_none(setup):
    plan, batch, q, kv, scale = setup
    with pytest.raises(mla.InvalidIndptrError):
        plan.build_metadata([0, 1, 0], [0, 1, 2])
    with pytest.raises(mla.NoMetadataError) as ei:
        run(plan, batch, q, kv, scale)
    assert ei.value.status == mla.Status.NO_METADATA


def test_run_before_metadata(rng):
    batch = make_batch(rng, kv_lens=[4], q_lens=[1], page_size=1)
    q, _, kv, _ = random_inputs(rng, batch, H, "bf16", "bf16")
    with mla.Plan(H, kv_dtype="bf16", backend="cpu") as plan:
        with pytest.raises(mla.NoMetadataError) as ei:
            plan.run(q, kv)
        assert ei.value.function == "mla_plan_execute"
        with pytest.raises(mla.NoMetadataError):
            plan.run(q[:0], kv)


# ---- run: arrays ----------------------------------------------------------------------

def test_wrong_dtypes(setup):
    plan, batch, q, kv, scale = setup
    with pytest.raises(mla.DtypeError, match="q has dtype float32"):
        run(plan, batch, mla.from_bf16(q), kv, scale)
    with pytest.raises(mla.DtypeError, match="q has dtype uint8"):
        run(plan, batch, q.view(np.uint8).reshape(q.shape[0], H, -1)[..., :576], kv, scale)
    with pytest.raises(mla.DtypeError, match="kv has dtype uint16"):
        run(plan, batch, q, kv.astype(np.uint16), scale)
    with pytest.raises(mla.DtypeError, match="out has dtype float32"):
        run(plan, batch, q, kv, scale, out=np.zeros((3, H, 512), np.float32))
    with pytest.raises(mla.DtypeError, match="lse has dtype float64"):
        run(plan, batch, q, kv, scale, lse=np.zeros((3, H)))
    with pytest.raises(mla.DtypeError, match="kv_indices must hold integers"):
        run(plan, batch, q, kv, scale, kv_indices=batch.kv_indices.astype(np.float32))
    with pytest.raises(mla.DtypeError):
        run(plan, batch, q.tolist(), kv, scale)


def test_wrong_shapes(setup):
    plan, batch, q, kv, scale = setup
    with pytest.raises(mla.ShapeError, match=r"q has shape \[3, 8, 576\]"):
        run(plan, batch, q[:, :8].copy(), kv, scale)
    with pytest.raises(mla.ShapeError, match="q has shape"):
        run(plan, batch, q.reshape(3, -1), kv, scale)
    with pytest.raises(mla.ShapeError, match="token rows"):
        run(plan, batch, q[:2].copy(), kv, scale)
    with pytest.raises(mla.ShapeError, match="kv has shape"):
        run(plan, batch, q, kv.reshape(-1, 8, 576), scale)          # page_size 8 != 16
    with pytest.raises(mla.ShapeError, match="kv has shape"):
        run(plan, batch, q, kv[..., :288].copy(), scale)             # mxfp4 row width
    with pytest.raises(mla.ShapeError, match="out has shape"):
        run(plan, batch, q, kv, scale, out=np.zeros((3, H, 576), np.uint16))
    with pytest.raises(mla.ShapeError, match="lse has shape"):
        run(plan, batch, q, kv, scale, lse=np.zeros((3, H, 1), np.float32))
    with pytest.raises(mla.ShapeError, match="kv_indices has"):
        run(plan, batch, q, kv, scale, kv_indices=batch.kv_indices[:-1])
    with pytest.raises(mla.ShapeError, match="num_pages"):
        run(plan, batch, q, kv, scale, num_pages=kv.shape[0] + 1)


def test_non_contiguous(setup):
    plan, batch, q, kv, scale = setup
    wide = np.zeros((q.shape[0], H, 1152), np.uint16)
    wide[..., ::2] = q
    with pytest.raises(mla.LayoutError, match="q is not contiguous"):
        run(plan, batch, wide[..., ::2], kv, scale)
    with pytest.raises(mla.LayoutError, match="kv is not contiguous"):
        run(plan, batch, q, np.ascontiguousarray(kv.transpose(1, 0, 2)).transpose(1, 0, 2), scale)
    out = np.zeros((3, 2 * H, 512), np.uint16)[:, ::2]
    with pytest.raises(mla.LayoutError, match="out is not contiguous"):
        run(plan, batch, q, kv, scale, out=out)


def test_read_only_output(setup):
    plan, batch, q, kv, scale = setup
    out = np.zeros((3, H, 512), np.uint16)
    out.flags.writeable = False
    with pytest.raises(mla.ArgumentError, match="read-only"):
        run(plan, batch, q, kv, scale, out=out)


def test_misaligned_pointer_refused_by_library(setup):
    plan, batch, q, kv, scale = setup
    buf = np.zeros(q.size + 8, np.uint16)
    shifted = buf[1:1 + q.size].reshape(q.shape)  # 2 bytes off 16-byte alignment
    shifted[...] = q
    with pytest.raises(mla.MisalignedError) as ei:
        run(plan, batch, shifted, kv, scale)
    assert "tensors->q" in ei.value.message


def test_page_out_of_range(setup):
    plan, batch, q, kv, scale = setup
    bad = batch.kv_indices.copy()
    bad[0] = kv.shape[0]
    with pytest.raises(mla.PageOutOfRangeError) as ei:
        run(plan, batch, q, kv, scale, kv_indices=bad)
    assert isinstance(ei.value, IndexError) and "kv_indices[0]" in ei.value.message
    bad[0] = -1
    with pytest.raises(mla.PageOutOfRangeError):
        run(plan, batch, q, kv, scale, kv_indices=bad)
    # identity page table that runs past the cache
    with pytest.raises(mla.PageOutOfRangeError):
        run(plan, batch, q, kv[:2], scale, kv_indices=None)


def test_scales(setup, rng):
    plan, batch, q, kv, scale = setup
    with pytest.raises(mla.InvalidValueError, match="kv_scale"):
        run(plan, batch, q, kv, -1.0)
    with pytest.raises(mla.InvalidValueError, match="kv_scale"):
        run(plan, batch, q, kv, float("inf"))
    with pytest.raises(mla.ArgumentError, match="q_scale is for FP8"):
        run(plan, batch, q, kv, scale, q_scale=1.0)
    with pytest.raises(mla.ArgumentError, match="kv_scale='big' must be a float"):
        run(plan, batch, q, kv, "big")
    with pytest.raises(mla.ArgumentError, match="kv_scale_stride is for MXFP4"):
        run(plan, batch, q, kv, scale, kv_scale_stride=18)
    # bf16 KV takes no scale
    qb, _, kvb, _ = random_inputs(rng, batch, H, "bf16", "bf16")
    with mla.Plan(H, kv_dtype="bf16", page_size=PS, max_q_len=2, backend="cpu") as p:
        p.build_metadata(batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len)
        with pytest.raises(mla.ArgumentError, match="kv_scale is for FP8 and MXFP4"):
            p.run(qb, kvb, kv_scale=1.0)


def test_fp8_q_scale(rng):
    batch = make_batch(rng, kv_lens=[10], q_lens=[1], page_size=1)
    q, qs, kv, ks = random_inputs(rng, batch, H, "fp8", "fp8")
    with mla.Plan(H, q_dtype="fp8", kv_dtype="fp8", backend="cpu") as p:
        p.build_metadata(batch.qo_indptr, batch.kv_indptr)
        with pytest.raises(mla.InvalidValueError, match="q_scale"):
            p.run(q, kv, kv_scale=ks, q_scale=-2.0)
        with pytest.raises(mla.DtypeError, match="q has dtype uint16"):
            p.run(mla.bf16(np.zeros((1, H, 576))), kv, kv_scale=ks)


def test_mxfp4_scales(rng):
    batch = make_batch(rng, kv_lens=[40], q_lens=[1], page_size=PS)
    q, _, kv, sc = random_inputs(rng, batch, H, "bf16", "mxfp4")
    with mla.Plan(H, kv_dtype="mxfp4", page_size=PS, backend="cpu") as p:
        p.build_metadata(batch.qo_indptr, batch.kv_indptr, batch.kv_last_page_len)
        with pytest.raises(mla.NullPointerError, match="kv_block_scales"):
            p.run(q, kv, kv_indices=batch.kv_indices)
        with pytest.raises(mla.ShapeError, match="kv_scale has shape"):
            p.run(q, kv, kv_scale=sc[:-1], kv_indices=batch.kv_indices)
        with pytest.raises(mla.ShapeError, match=">= 18"):
            p.run(q, kv, kv_scale=sc[..., :17].copy(), kv_indices=batch.kv_indices)
        with pytest.raises(mla.DtypeError, match="kv_scale has dtype float32"):
            p.run(q, kv, kv_scale=sc.astype(np.float32), kv_indices=batch.kv_indices)
        with pytest.raises(mla.ShapeError, match="kv_scale_stride=32"):
            p.run(q, kv, kv_scale=sc, kv_indices=batch.kv_indices, kv_scale_stride=32)
        with pytest.raises(mla.LayoutError):
            p.run(q, kv, kv_scale=np.ascontiguousarray(sc.transpose(1, 0, 2)).transpose(1, 0, 2),
                  kv_indices=batch.kv_indices)
        with pytest.raises(mla.DtypeError, match="kv has dtype uint16"):
            p.run(q, kv.view(np.uint16), kv_scale=sc, kv_indices=batch.kv_indices)


class FakeDeviceArray:
    """Claims to be GPU memory; never dereferenced by the checks under test."""

    def __init__(self, shape, typestr):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (0x10000, False),
                                         "version": 3, "strides": None, "stream": 1}


def test_device_arrays_on_a_cpu_plan(setup):
    plan, batch, q, kv, scale = setup
    with pytest.raises(mla.DeviceMismatchError, match="plan runs on the CPU"):
        run(plan, batch, FakeDeviceArray((3, H, 576), "<u2"), kv, scale)
    with pytest.raises(mla.DeviceMismatchError, match="plan runs on the CPU"):
        run(plan, batch, q, kv, scale, out=FakeDeviceArray((3, H, 512), "<u2"))
    with pytest.raises(mla.DeviceMismatchError):
        run(plan, batch, q, kv, scale, kv_indices=FakeDeviceArray((3,), "<i4"))
    with pytest.raises(mla.DeviceMismatchError, match="plan runs on the CPU"):
        plan.build_metadata(FakeDeviceArray((3,), "<i4"), FakeDeviceArray((3,), "<i4"))
    with pytest.raises(mla.DeviceMismatchError, match="all be host arrays or all device arrays"):
        plan.build_metadata(FakeDeviceArray((3,), "<i4"), [0, 1, 2])


def test_unsupported_objects(setup):
    plan, batch, q, kv, scale = setup
    with pytest.raises(mla.DtypeError, match="pass a NumPy array"):
        run(plan, batch, object(), kv, scale)
    with pytest.raises(mla.ArgumentError, match="stream="):
        run(plan, batch, q, kv, scale, stream="default")


def test_plan_used_by_two_threads_at_once(setup):
    plan, batch, q, kv, scale = setup
    assert plan._lock.acquire(blocking=False)  # as if another thread were inside run()
    try:
        with pytest.raises(mla.Error, match="another thread"):
            run(plan, batch, q, kv, scale)
    finally:
        plan._lock.release()
    run(plan, batch, q, kv, scale)


class FakeCupyDevice:
    def __init__(self, i):
        self.id = i


class FakeDeviceArrayOn(FakeDeviceArray):
    def __init__(self, shape, typestr, device):
        super().__init__(shape, typestr)
        self.device = FakeCupyDevice(device)


def test_gpu_plan_checks_made_in_python(setup, monkeypatch):
    # The Python-side checks of a GPU plan, exercised without a GPU: every
    # call below is refused before the library is reached.
    plan, batch, q, kv, scale = setup
    monkeypatch.setattr(plan, "_backend", mla.Backend.GPU)
    dq = FakeDeviceArrayOn((3, H, 576), "<u2", 0)
    dkv = FakeDeviceArrayOn(kv.shape, "|u1", 0)
    with pytest.raises(mla.DeviceMismatchError, match="q is in host memory"):
        plan.run(q, dkv, kv_scale=scale)
    with pytest.raises(mla.DeviceMismatchError, match="on GPU 1, but the plan runs on GPU 0"):
        plan.run(FakeDeviceArrayOn((3, H, 576), "<u2", 1), dkv, kv_scale=scale)
    with pytest.raises(mla.DeviceMismatchError, match="kv_indices"):
        plan.run(dq, dkv, kv_scale=scale, kv_indices=batch.kv_indices)
    with pytest.raises(mla.DtypeError, match="kv_indices has dtype int64"):
        plan.run(dq, dkv, kv_scale=scale, kv_indices=FakeDeviceArrayOn((3,), "<i8", 0))
    with pytest.raises(mla.ArgumentError, match="pass out="):
        plan.run(dq, dkv, kv_scale=scale)  # no allocator known for this array type
    with pytest.raises(mla.DtypeError, match="qo_indptr has dtype int64"):
        plan.build_metadata(FakeDeviceArrayOn((3,), "<i8", 0), FakeDeviceArrayOn((3,), "<i4", 0))
    with pytest.raises(mla.ShapeError, match="kv_indptr has 2 entries"):
        plan.build_metadata(FakeDeviceArrayOn((3,), "<i4", 0), FakeDeviceArrayOn((2,), "<i4", 0))


def test_stream_handles():
    from mla._arrays import producer_stream, stream_handle, view_of

    class TorchLike:
        cuda_stream = 0x1234

    class CupyLike:
        ptr = 0x5678

    assert stream_handle(None) is None and stream_handle(7) == 7
    assert stream_handle(TorchLike()) == 0x1234 and stream_handle(CupyLike()) == 0x5678
    with pytest.raises(mla.ArgumentError):
        stream_handle(True)
    a = FakeDeviceArray((1,), "<i4")
    a.__cuda_array_interface__["stream"] = 1
    assert producer_stream([view_of(a, "a")]) == 0       # legacy default stream
    a.__cuda_array_interface__["stream"] = 0xABC
    assert producer_stream([view_of(a, "a")]) == 0xABC
    assert producer_stream([view_of(np.zeros(1), "h")]) is None
