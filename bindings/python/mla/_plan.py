"""mla.Plan: the pythonic face of mla_plan_create / build_metadata / execute."""

from __future__ import annotations

import math
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Optional, Tuple, Union

import numpy as np

from . import core
from ._arrays import ArrayView, is_c_contiguous, producer_stream, stream_handle, view_of
from ._enums import Backend, BackendLike, DType, DTypeLike, Flags, Memory, parse_backend, parse_dtype
from ._errors import (ArgumentError, DeviceMismatchError, DtypeError, Error, LayoutError, NoMetadataError,
                      PlanClosedError, ShapeError, check)

__all__ = ["Plan", "ScheduleInfo"]

HEAD_DIM_QK = core.MLA_HEAD_DIM_QK
HEAD_DIM_V = core.MLA_HEAD_DIM_V
SCALES_PER_ROW = core.MLA_MXFP4_SCALES_PER_ROW

# Element dtypes accepted per role (raw integer views are always accepted).
_Q_DTYPES = {
    DType.BF16: ("uint16", "int16", "bfloat16"),
    DType.FP8_E4M3: ("uint8", "int8", "float8_e4m3fn"),
    DType.FP8_E4M3_FNUZ: ("uint8", "int8", "float8_e4m3fnuz"),
}
_KV_DTYPES = dict(_Q_DTYPES)
_KV_DTYPES[DType.MXFP4] = ("uint8", "int8", "float4_e2m1fn_x2")
_KV_ROW = {DType.BF16: HEAD_DIM_QK, DType.FP8_E4M3: HEAD_DIM_QK, DType.FP8_E4M3_FNUZ: HEAD_DIM_QK,
           DType.MXFP4: HEAD_DIM_QK // 2}
_SCALE_DTYPES = ("uint8", "float8_e8m0fnu")
_OUT_DTYPES = ("uint16", "int16", "bfloat16")
_INT32 = ("int32",)

# Counts every mla_plan_destroy this module made (tests check "exactly once").
destroy_count = 0


def _destroy(handle: Any) -> None:
    global destroy_count
    destroy_count += 1
    core.mla_plan_destroy(handle)


@dataclass(frozen=True)
class ScheduleInfo:
    """What the scheduler chose for the last metadata built from host arrays
    (``mla_schedule_info``)."""

    num_work_items: int
    """(sequence, head block, KV range) work items."""
    num_split_rows: int
    """Items that write partial results to be combined."""
    max_splits: int
    """Largest KV split count of any sequence."""
    rows_per_item: int
    """Query rows (tokens x heads) per work item."""
    head_blocks: int
    """Head blocks per sequence."""
    target_blocks: int
    """Balanced target KV blocks per item (0 = not applicable)."""
    block_tokens: int
    """KV tokens per scheduling block."""
    workers: int
    """Parallel workers the scheduler balanced for."""


@dataclass
class _Metadata:
    memory: Memory
    batch_size: int
    total_q: Optional[int]      # qo_indptr[-1] (host metadata only)
    total_pages: Optional[int]  # kv_indptr[-1] (host metadata only)


def _int_arg(value: Any, name: str, lo: int = -(2 ** 31), hi: int = 2 ** 31 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ArgumentError(f"{name}={value!r} must be an int")
    v = int(value)
    if not lo <= v <= hi:
        raise ArgumentError(f"{name}={v} is outside {lo}..{hi}")
    return v


def _float_arg(value: Any, name: str) -> float:
    if isinstance(value, bool):
        raise ArgumentError(f"{name}={value!r} must be a float")
    if _on_gpu_tensor(value):
        raise ArgumentError(f"{name} must be a Python float (reading a GPU tensor would synchronise the host)")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ArgumentError(f"{name}={value!r} must be a float") from None
    return v


def _on_gpu_tensor(value: Any) -> bool:
    if hasattr(value, "__cuda_array_interface__"):
        return True
    mod = type(value).__module__ or ""
    return mod.startswith("torch") and getattr(value, "is_cuda", False)


def _is_device_array(value: Any) -> bool:
    if value is None or isinstance(value, (list, tuple, np.ndarray)):
        return False
    if hasattr(value, "__cuda_array_interface__"):
        return True
    mod = type(value).__module__ or ""
    if mod.startswith("torch"):
        return bool(getattr(value, "is_cuda", False))
    dev = getattr(value, "__dlpack_device__", None)
    if dev is not None:
        try:
            return dev()[0] not in (1, 3)
        except Exception:  # noqa: BLE001 - an odd producer: treat as host
            return False
    return False


def _host_int32(value: Any, name: str) -> np.ndarray:
    """A host int32 copy of an integer sequence (index arrays are small and
    read synchronously, so converting them costs nothing that matters)."""
    mod = type(value).__module__ or ""
    if mod.startswith("torch"):
        value = value.numpy()
    a = np.asarray(value)
    if a.ndim != 1:
        raise ShapeError(f"{name} must be 1-D, got shape {a.shape}")
    if a.size and a.dtype.kind not in "iu":
        raise DtypeError(f"{name} must hold integers, got dtype {a.dtype}")
    if a.dtype != np.int32:
        if a.size and (a.min() < -(2 ** 31) or a.max() > 2 ** 31 - 1):
            raise ArgumentError(f"{name} has values outside the int32 range")
        a = a.astype(np.int32)
    return np.ascontiguousarray(a)


class Plan:
    """An MLA decode-attention plan (``mla_plan``): one static shape, reused
    for every decode step and layer.

    Parameters
    ----------
    num_heads : int
        Query heads on this device, 1..128 (DeepSeek-R1: 128 / TP degree).
    kv_dtype : str
        KV cache format: ``"bf16"``, ``"fp8"`` (= ``"fp8_e4m3"``, OCP, NVIDIA
        and gfx950), ``"fp8_fnuz"`` (= ``"fp8_e4m3_fnuz"``, gfx942) or
        ``"mxfp4"``.
    q_dtype : str
        Query format: ``"bf16"``, ``"fp8"`` or ``"fp8_fnuz"`` (an FP8 Q must
        be the same FP8 flavour as an FP8 KV cache).
    page_size : int
        Tokens per KV page, a power of two 1..256.
    max_batch_size : int
        Largest batch of any step (sizes the workspace).
    max_q_len : int
        Largest number of query tokens per sequence, 1..8 (MTP / speculative).
    backend : str
        ``"auto"`` (the GPU when one is present, else the CPU), ``"cpu"`` or
        ``"gpu"``.
    sm_scale : float or None
        Softmax scale; None = 1/sqrt(576).
    logit_cap : float
        > 0 applies ``s = cap * tanh(s / cap)`` to the scores; 0 = off.
    num_splits : int
        0 = choose the KV split count automatically; 1..64 forces it.
    deterministic : bool
        Batch-invariant splitting: a sequence's output is bitwise the same
        whatever else is in the batch (MLA_FLAG_DETERMINISTIC).
    validate_device_inputs : bool
        GPU debugging aid: check device-resident indptr / page tables on the
        device (synchronises; MLA_FLAG_VALIDATE_DEVICE_INPUTS).
    caller_workspace : bool
        The plan owns no workspace; every :meth:`run` passes ``workspace=``
        (MLA_FLAG_CALLER_WORKSPACE).
    device : int
        GPU ordinal of a GPU plan.
    num_threads : int
        CPU backend threads; 0 = all hardware threads.

    Use
    ---
    ::

        with mla.Plan(num_heads=16, kv_dtype="fp8", page_size=64) as plan:
            for step in decode_steps:                       # once per step
                plan.build_metadata(qo_indptr, kv_indptr, kv_last_page_len)
                for layer in layers:                        # once per layer
                    out = plan.run(q, kv_cache, kv_scale=s, kv_indices=page_table)

    Arrays
    ------
    CPU plans read NumPy arrays (or torch CPU tensors, or anything exposing
    ``__array_interface__`` / the buffer protocol); GPU plans read torch CUDA
    tensors, CuPy / Numba arrays (``__cuda_array_interface__``) or DLPack
    producers. Nothing is copied: every array must already have the dtype and
    the row-major layout below (raw integer views are always accepted)::

        q       [total_q, num_heads, 576]     uint16 bf16 bits | bfloat16
                                              uint8 | float8_e4m3fn(uz)  (fp8)
        kv      [num_pages, page_size, 576]   uint16 | bfloat16          (bf16)
                [num_pages, page_size, 576]   uint8 | float8_e4m3fn(uz)  (fp8)
                [num_pages, page_size, 288]   uint8, two E2M1 per byte   (mxfp4)
        kv_scale  fp8: a float;  mxfp4: E8M0 uint8 [num_pages, page_size, S],
                  S >= 18 (its row stride is passed as kv_scale_stride)
        kv_indices  int32 [>= kv_indptr[-1]] page table, None = identity
        out     [total_q, num_heads, 512]     uint16 bf16 bits | bfloat16
        lse     [total_q, num_heads]          float32, natural log

    GPU work is enqueued on the caller's current stream (torch's current
    stream, the ``__cuda_array_interface__`` stream, CuPy's current stream),
    or on ``stream=`` when given; the host is never synchronised.

    Errors
    ------
    Arrays of the wrong dtype, shape, device or layout raise
    :class:`mla.ArgumentError` subclasses (``DtypeError``, ``ShapeError``,
    ``DeviceMismatchError``, ``LayoutError``) before the library is called;
    the library's own refusals raise the :class:`mla.Error` subclass of their
    status (``InvalidIndptrError``, ``PageOutOfRangeError``, ...) with the
    library's message.

    Lifetime and threads
    --------------------
    :meth:`close` (or leaving the ``with`` block) destroys the C plan exactly
    once; later calls raise :class:`mla.PlanClosedError`. A plan that is
    garbage-collected unclosed is destroyed then. A GPU plan must not be
    closed while its work is still running: synchronise the stream first.
    A plan is used by one thread at a time (a second thread entering it
    raises :class:`mla.Error`); different plans run concurrently, and the
    GIL is released while the library works.
    """

    def __init__(self, num_heads: int = 16, *, kv_dtype: DTypeLike = "fp8", q_dtype: DTypeLike = "bf16",
                 page_size: int = 1, max_batch_size: int = 256, max_q_len: int = 1, backend: BackendLike = "auto",
                 sm_scale: Optional[float] = None, logit_cap: float = 0.0, num_splits: int = 0,
                 deterministic: bool = False, validate_device_inputs: bool = False, caller_workspace: bool = False,
                 device: int = 0, num_threads: int = 0) -> None:
        self._handle: Any = None
        self._finalizer: Optional[weakref.finalize] = None
        self._lock = threading.Lock()
        self._meta: Optional[_Metadata] = None
        self._dlpack_stream: Optional[int] = None  # the stream= of the call in progress, for __dlpack__

        self._num_heads = _int_arg(num_heads, "num_heads")
        self._q_dtype = parse_dtype(q_dtype, "q_dtype")
        self._kv_dtype = parse_dtype(kv_dtype, "kv_dtype")
        self._page_size = _int_arg(page_size, "page_size")
        self._max_batch_size = _int_arg(max_batch_size, "max_batch_size")
        self._max_q_len = _int_arg(max_q_len, "max_q_len")
        self._requested_backend = parse_backend(backend)
        self._sm_scale = 0.0 if sm_scale is None else _float_arg(sm_scale, "sm_scale")
        self._logit_cap = _float_arg(logit_cap, "logit_cap")
        self._num_splits = _int_arg(num_splits, "num_splits")
        self._device = _int_arg(device, "device")
        self._num_threads = _int_arg(num_threads, "num_threads")
        flags = Flags(0)
        if deterministic:
            flags |= Flags.DETERMINISTIC
        if validate_device_inputs:
            flags |= Flags.VALIDATE_DEVICE_INPUTS
        if caller_workspace:
            flags |= Flags.CALLER_WORKSPACE
        self._flags = flags

        desc = core.mla_plan_desc()
        check(core.mla_plan_desc_init(desc), "mla_plan_desc_init")
        desc.num_heads = self._num_heads
        desc.q_dtype = int(self._q_dtype)
        desc.kv_dtype = int(self._kv_dtype)
        desc.page_size = self._page_size
        desc.max_batch_size = self._max_batch_size
        desc.max_q_len = self._max_q_len
        desc.sm_scale = self._sm_scale
        desc.logit_cap = self._logit_cap
        desc.num_splits = self._num_splits
        desc.flags = int(flags)
        desc.backend = int(self._requested_backend)
        desc.device = self._device
        desc.num_threads = self._num_threads
        status, handle = core.mla_plan_create(desc)
        check(status, "mla_plan_create")
        self._handle = handle
        self._finalizer = weakref.finalize(self, _destroy, handle)

        st, kind = core.mla_plan_backend(handle)
        check(st, "mla_plan_backend")
        self._backend = Backend(kind)
        st, nbytes = core.mla_plan_workspace_size(handle)
        check(st, "mla_plan_workspace_size")
        self._workspace_size = int(nbytes)
        self._batch = core.mla_batch()
        self._tensors = core.mla_tensors()

    # ---- lifetime ------------------------------------------------------------

    def close(self) -> None:
        """Destroy the C plan (``mla_plan_destroy``), exactly once. Idempotent.
        For a GPU plan, synchronise the streams it ran on first.

        A plan that is never closed is destroyed when it is garbage-collected
        (or at interpreter exit), through a ``weakref.finalize`` that runs at
        most once, so deleting a plan is always safe."""
        with self._lock:
            if self._finalizer is not None:
                self._finalizer()  # runs _destroy at most once
            self._handle = None
            self._meta = None

    def __enter__(self) -> "Plan":
        self._require_open()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._handle is None

    @property
    def handle(self) -> Any:
        """The SWIG ``mla_plan *`` for the low-level :mod:`mla.core` API
        (``int(plan.handle)`` is its address); None once closed."""
        return self._handle

    def _require_open(self) -> Any:
        if self._handle is None:
            raise PlanClosedError("the plan is closed")
        return self._handle

    def _enter(self) -> Any:
        if not self._lock.acquire(blocking=False):
            raise Error("the plan is in use by another thread (a plan is used by one thread at a time)")
        if self._handle is None:
            self._lock.release()
            raise PlanClosedError("the plan is closed")
        return self._handle

    # ---- properties ----------------------------------------------------------

    @property
    def backend(self) -> str:
        """Where the plan runs: ``"cpu"`` or ``"gpu"`` (``"auto"`` resolved)."""
        return self._backend.name.lower()

    @property
    def workspace_size(self) -> int:
        """Bytes of workspace :meth:`run` needs (``mla_plan_workspace_size``)."""
        return self._workspace_size

    @property
    def num_heads(self) -> int:
        """Query heads."""
        return self._num_heads

    @property
    def q_dtype(self) -> str:
        """``"bf16"``, ``"fp8_e4m3"`` or ``"fp8_e4m3_fnuz"``."""
        return self._q_dtype.short_name

    @property
    def kv_dtype(self) -> str:
        """``"bf16"``, ``"fp8_e4m3"``, ``"fp8_e4m3_fnuz"`` or ``"mxfp4"``."""
        return self._kv_dtype.short_name

    @property
    def page_size(self) -> int:
        """Tokens per KV page."""
        return self._page_size

    @property
    def max_batch_size(self) -> int:
        """Largest batch a step may have."""
        return self._max_batch_size

    @property
    def max_q_len(self) -> int:
        """Largest q_len a sequence may have."""
        return self._max_q_len

    @property
    def sm_scale(self) -> float:
        """The softmax scale in use (1/sqrt(576) unless given)."""
        return self._sm_scale if self._sm_scale else 1.0 / math.sqrt(HEAD_DIM_QK)

    @property
    def logit_cap(self) -> float:
        """The logit cap (0 = off)."""
        return self._logit_cap

    @property
    def num_splits(self) -> int:
        """Forced KV splits (0 = automatic)."""
        return self._num_splits

    @property
    def flags(self) -> Flags:
        """The plan's :class:`mla.Flags`."""
        return self._flags

    @property
    def deterministic(self) -> bool:
        """True for batch-invariant plans."""
        return bool(self._flags & Flags.DETERMINISTIC)

    @property
    def device(self) -> int:
        """GPU ordinal (GPU plans)."""
        return self._device

    @property
    def num_threads(self) -> int:
        """CPU threads requested (0 = all)."""
        return self._num_threads

    def __repr__(self) -> str:
        state = "closed" if self.closed else self.backend
        return (f"mla.Plan(num_heads={self._num_heads}, q_dtype={self.q_dtype!r}, kv_dtype={self.kv_dtype!r}, "
                f"page_size={self._page_size}, max_batch_size={self._max_batch_size}, max_q_len={self._max_q_len}, "
                f"logit_cap={self._logit_cap}, flags={int(self._flags)}) [{state}]")

    # ---- per step ------------------------------------------------------------

    def build_metadata(self, qo_indptr: Any, kv_indptr: Any, kv_last_page_len: Any = None, *,
                       stream: Any = None) -> None:
        """Build the split-KV work list of one decode step
        (``mla_plan_build_metadata``); call once per step, before the layers.

        ``qo_indptr`` and ``kv_indptr`` have ``batch_size + 1`` entries, start
        at 0 and never decrease: sequence ``b`` owns query tokens
        ``qo_indptr[b]:qo_indptr[b+1]`` (0..max_q_len of them) and pages
        ``kv_indptr[b]:kv_indptr[b+1]`` of the page table.
        ``kv_last_page_len[b]`` (1..page_size) is the fill of its last page;
        None = full pages. A sequence with no pages has no keys (its output
        is 0, its lse -inf).

        Host arrays (NumPy, lists, torch CPU tensors; any integer dtype) are
        read now. Device arrays (int32, contiguous, on the plan's GPU) build
        the metadata with a kernel on ``stream`` (default: the producer's
        current stream) without synchronising the host, so the step can be
        captured in a CUDA graph.
        """
        handle = self._enter()
        try:
            self._dlpack_stream = stream_handle(stream)
            args = {"qo_indptr": qo_indptr, "kv_indptr": kv_indptr, "kv_last_page_len": kv_last_page_len}
            on_device = {k: _is_device_array(v) for k, v in args.items() if v is not None}
            device_mode = any(on_device.values())
            if device_mode and not all(on_device.values()):
                raise DeviceMismatchError(
                    "qo_indptr, kv_indptr and kv_last_page_len must all be host arrays or all device arrays; got "
                    + ", ".join(f"{k} on {'the device' if d else 'the host'}" for k, d in on_device.items()))
            b = self._batch
            check(core.mla_batch_init(b), "mla_batch_init")
            keep = []
            if not device_mode:
                qo = _host_int32(qo_indptr, "qo_indptr")
                kvp = _host_int32(kv_indptr, "kv_indptr")
                if qo.size < 1:
                    raise ShapeError("qo_indptr must have batch_size + 1 >= 1 entries, got an empty array")
                n = qo.size - 1
                if kvp.size != qo.size:
                    raise ShapeError(f"kv_indptr has {kvp.size} entries but qo_indptr has {qo.size}; both need "
                                     f"batch_size + 1")
                keep += [qo, kvp]
                b.qo_indptr = qo.ctypes.data
                b.kv_indptr = kvp.ctypes.data
                if kv_last_page_len is not None:
                    last = _host_int32(kv_last_page_len, "kv_last_page_len")
                    if last.size != n:
                        raise ShapeError(f"kv_last_page_len has {last.size} entries, expected batch_size = {n}")
                    keep.append(last)
                    b.kv_last_page_len = last.ctypes.data
                b.memory = int(Memory.HOST)
                b.batch_size = n
                s = stream_handle(stream)
                if s is None and self._backend == Backend.GPU:
                    s = self._current_stream()  # the upload is ordered before this stream's work
            else:
                if self._backend != Backend.GPU:
                    raise DeviceMismatchError("the plan runs on the CPU: pass host arrays (e.g. NumPy) to "
                                              "build_metadata, not device arrays")
                views = {k: self._device_view(v, k, _INT32) for k, v in args.items() if v is not None}
                for k, v in views.items():
                    if v.ndim != 1:
                        raise ShapeError(f"{k} must be 1-D, got shape {v.shape}")
                n = views["qo_indptr"].shape[0] - 1
                if n < 0:
                    raise ShapeError("qo_indptr must have batch_size + 1 >= 1 entries, got an empty array")
                if views["kv_indptr"].shape[0] != n + 1:
                    raise ShapeError(f"kv_indptr has {views['kv_indptr'].shape[0]} entries but qo_indptr has "
                                     f"{n + 1}; both need batch_size + 1")
                if "kv_last_page_len" in views:
                    if views["kv_last_page_len"].shape[0] != n:
                        raise ShapeError(f"kv_last_page_len has {views['kv_last_page_len'].shape[0]} entries, "
                                         f"expected batch_size = {n}")
                    b.kv_last_page_len = views["kv_last_page_len"].ptr
                b.qo_indptr = views["qo_indptr"].ptr
                b.kv_indptr = views["kv_indptr"].ptr
                b.memory = int(Memory.DEVICE)
                b.batch_size = n
                keep += list(views.values())
                s = stream_handle(stream)
                if s is None:
                    s = producer_stream(list(views.values()))
                if s is None:
                    s = self._current_stream()
            self._meta = None  # the library drops its metadata when it refuses this batch
            check(core.mla_plan_build_metadata(handle, b, s), "mla_plan_build_metadata")
            if device_mode:
                self._meta = _Metadata(Memory.DEVICE, n, None, None)
            else:
                self._meta = _Metadata(Memory.HOST, n, int(keep[0][-1]), int(keep[1][-1]))
            del keep
        finally:
            self._lock.release()

    def schedule_info(self) -> ScheduleInfo:
        """The scheduler's choices for the last metadata built from host
        arrays (``mla_plan_schedule_info``); :class:`mla.NoMetadataError`
        when there is none."""
        handle = self._enter()
        try:
            info = core.mla_schedule_info()
            check(core.mla_schedule_info_init(info), "mla_schedule_info_init")
            check(core.mla_plan_schedule_info(handle, info), "mla_plan_schedule_info")
            return ScheduleInfo(info.num_work_items, info.num_split_rows, info.max_splits, info.rows_per_item,
                                info.head_blocks, info.target_blocks, info.block_tokens, info.workers)
        finally:
            self._lock.release()

    # ---- per layer -------------------------------------------------------------

    def run(self, q: Any, kv: Any, kv_scale: Any = None, kv_indices: Any = None, q_scale: Optional[float] = None,
            out: Any = None, return_lse: bool = False, kv_scale_stride: Optional[int] = None,
            num_pages: Optional[int] = None, stream: Any = None, *, lse: Any = None,
            workspace: Any = None) -> Union[Any, Tuple[Any, Any]]:
        """Attention of one layer with the last metadata built
        (``mla_plan_execute``).

        Parameters
        ----------
        q : [total_q, num_heads, 576] array of q_dtype (see the class help).
        kv : [num_pages, page_size, row] KV cache of kv_dtype.
        kv_scale : fp8 KV: the float dequant scale (None = 1). mxfp4 KV: the
            E8M0 ``uint8`` array ``[num_pages, page_size, S]``, ``S >= 18``
            (required). bf16 KV: must be None.
        kv_indices : int32 page table, CSR over ``kv_indptr``; None = pages
            stored in order. Host arrays of other integer dtypes are
            converted for CPU plans.
        q_scale : fp8 Q: the float dequant scale (None = 1); bf16 Q: None.
        out : [total_q, num_heads, 512] bf16 output (``uint16`` bits or
            ``bfloat16``), written; None = allocate one (zeros) like ``q``
            (NumPy, torch or CuPy; on GPUs on that framework's current
            stream, so pass ``out`` when you pass another ``stream``).
        return_lse : also return the float32 ``[total_q, num_heads]``
            log-sum-exp of the scores (natural log; -inf where no key is
            visible).
        kv_scale_stride : mxfp4 only; checked against the scale array's row
            stride, which is what is passed (default: that stride).
        num_pages : pages in ``kv`` for the library's page-range checks;
            default ``kv.shape[0]``; 0 = do not check.
        stream : GPU stream (int handle, torch.cuda.Stream, CuPy stream);
            default: the producer's current stream.
        lse : a float32 ``[total_q, num_heads]`` array to write the lse into
            (implies ``return_lse``).
        workspace : a buffer of at least :attr:`workspace_size` bytes (any
            dtype, contiguous, 16-byte aligned); None = the plan's own.

        Returns
        -------
        ``out``, or ``(out, lse)`` when ``return_lse`` or ``lse`` is given.
        Rows of query tokens that no sequence owns are left untouched.
        """
        handle = self._enter()
        try:
            self._dlpack_stream = stream_handle(stream)
            return self._run(handle, q, kv, kv_scale, kv_indices, q_scale, out, return_lse or lse is not None,
                             kv_scale_stride, num_pages, stream, lse, workspace)
        finally:
            self._lock.release()

    # ---- internals ---------------------------------------------------------------

    def _where(self) -> str:
        return f"GPU {self._device}" if self._backend == Backend.GPU else "the CPU"

    def _current_stream(self) -> int:
        """The stream a GPU call uses when neither ``stream=`` nor the arrays
        name one: torch's current stream on the plan's device when torch has
        initialised CUDA, else CuPy's current stream when CuPy is loaded, else
        the default stream (0)."""
        torch = sys.modules.get("torch")
        if torch is not None:
            try:
                if torch.cuda.is_initialized():
                    return int(torch.cuda.current_stream(self._device).cuda_stream)
            except Exception:  # noqa: BLE001 - a torch without CUDA
                pass
        cupy = sys.modules.get("cupy")
        if cupy is not None:
            try:
                with cupy.cuda.Device(self._device):
                    return int(cupy.cuda.get_current_stream().ptr)
            except Exception:  # noqa: BLE001
                pass
        return 0

    def _check_side(self, v: ArrayView, name: str) -> None:
        if self._backend == Backend.GPU:
            if not v.on_gpu:
                raise DeviceMismatchError(f"{name} is in host memory, but the plan runs on {self._where()}: "
                                          f"pass a GPU tensor")
            if v.device >= 0 and v.device != self._device:
                raise DeviceMismatchError(f"{name} is on GPU {v.device}, but the plan runs on GPU {self._device}")
        elif v.on_gpu:
            raise DeviceMismatchError(f"{name} is on {v.where()}, but the plan runs on the CPU: pass a host array "
                                      f"(e.g. NumPy)")

    def _device_view(self, obj: Any, name: str, dtypes: Tuple[str, ...]) -> ArrayView:
        v = view_of(obj, name, self._dlpack_stream)
        self._check_side(v, name)
        if v.dtype not in dtypes:
            raise DtypeError(f"{name} has dtype {v.dtype}; expected {' or '.join(dtypes)}")
        if not is_c_contiguous(v.shape, v.strides):
            raise LayoutError(f"{name} is not contiguous (shape {v.shape}, strides {v.strides} elements)")
        return v

    def _array(self, obj: Any, name: str, dtypes: Tuple[str, ...], shape: Tuple[Optional[int], ...],
               what: str, writable: bool = False, contiguous: bool = True) -> ArrayView:
        v = view_of(obj, name, self._dlpack_stream)
        self._check_side(v, name)
        if v.dtype not in dtypes:
            raise DtypeError(f"{name} has dtype {v.dtype}; {what} needs {' or '.join(dtypes)}")
        if v.ndim != len(shape) or any(e is not None and e != s for e, s in zip(shape, v.shape)):
            want = "[" + ", ".join("*" if e is None else str(e) for e in shape) + "]"
            raise ShapeError(f"{name} has shape {list(v.shape)}; {what} needs {want}")
        if contiguous and not is_c_contiguous(v.shape, v.strides):
            raise LayoutError(f"{name} is not contiguous (shape {list(v.shape)}, strides {list(v.strides)} "
                              f"elements); pass a contiguous array (e.g. .copy() / .contiguous())")
        if writable and v.readonly:
            raise ArgumentError(f"{name} is read-only")
        return v

    def _alloc(self, like: ArrayView, shape: Tuple[int, ...], kind: str) -> Any:
        """Zeros of ``shape`` in ``like``'s framework and device: bf16 bits
        (``kind == "bf16"``) or float32."""
        obj = like.obj
        if like.framework == "torch":
            torch = sys.modules["torch"]
            if kind == "bf16":
                dt = obj.dtype if obj.dtype in (torch.int16, getattr(torch, "uint16", None)) else torch.bfloat16
            else:
                dt = torch.float32
            return torch.zeros(shape, dtype=dt, device=obj.device)
        if not like.on_gpu:
            return np.zeros(shape, dtype=np.uint16 if kind == "bf16" else np.float32)
        mod = type(obj).__module__ or ""
        if mod.startswith("cupy"):
            cupy = sys.modules["cupy"]
            with cupy.cuda.Device(like.device if like.device >= 0 else self._device):
                return cupy.zeros(shape, dtype=np.uint16 if kind == "bf16" else np.float32)
        raise ArgumentError(f"cannot allocate the output for a q of type {type(obj).__qualname__}: pass out= "
                            f"(and lse=) explicitly")

    def _run(self, handle: Any, q: Any, kv: Any, kv_scale: Any, kv_indices: Any, q_scale: Optional[float],
             out: Any, want_lse: bool, kv_scale_stride: Optional[int], num_pages: Optional[int], stream: Any,
             lse: Any, workspace: Any) -> Union[Any, Tuple[Any, Any]]:
        H, ps = self._num_heads, self._page_size
        qd, kd = self._q_dtype, self._kv_dtype
        qv = self._array(q, "q", _Q_DTYPES[qd], (None, H, HEAD_DIM_QK), f"a {qd.short_name} q")
        kvv = self._array(kv, "kv", _KV_DTYPES[kd], (None, ps, _KV_ROW[kd]), f"a {kd.short_name} KV cache")
        if kd == DType.BF16 and kvv.itemsize != 2 or kd != DType.BF16 and kvv.itemsize != 1:
            raise DtypeError(f"kv has {kvv.itemsize}-byte elements, which does not match kv_dtype {kd.short_name}")
        total_rows = qv.shape[0]
        meta = self._meta

        if meta is not None and meta.total_q is not None and total_rows < meta.total_q:
            raise ShapeError(f"q has {total_rows} token rows, but the batch's qo_indptr[-1] = {meta.total_q}")

        # Scales.
        t = self._tensors
        check(core.mla_tensors_init(t), "mla_tensors_init")
        keep = [qv, kvv]
        if qd.is_fp8:
            t.q_scale = 1.0 if q_scale is None else _float_arg(q_scale, "q_scale")
        elif q_scale is not None:
            raise ArgumentError(f"q_scale is for FP8 queries; this plan's q_dtype is {qd.short_name}")
        if kd.is_fp8:
            t.kv_scale = 1.0 if kv_scale is None else _float_arg(kv_scale, "kv_scale")
            if kv_scale_stride is not None:
                raise ArgumentError("kv_scale_stride is for MXFP4 KV caches")
        elif kd == DType.MXFP4:
            if kv_scale is not None:
                sv = self._array(kv_scale, "kv_scale", _SCALE_DTYPES, (kvv.shape[0], ps, None),
                                 "the MXFP4 E8M0 block scales", contiguous=False)
                stride = self._scale_row_stride(sv)
                if kv_scale_stride is not None and _int_arg(kv_scale_stride, "kv_scale_stride") != stride:
                    raise ShapeError(f"kv_scale_stride={kv_scale_stride}, but kv_scale's rows are {stride} bytes apart")
                t.kv_block_scales = sv.ptr
                t.kv_scale_stride = stride
                keep.append(sv)
            elif kv_scale_stride is not None:
                t.kv_scale_stride = _int_arg(kv_scale_stride, "kv_scale_stride")
        else:
            if kv_scale is not None:
                raise ArgumentError("kv_scale is for FP8 and MXFP4 KV caches; this plan's kv_dtype is bf16")
            if kv_scale_stride is not None:
                raise ArgumentError("kv_scale_stride is for MXFP4 KV caches")

        # Page table.
        if kv_indices is not None:
            if self._backend == Backend.GPU:
                iv = self._device_view(kv_indices, "kv_indices", _INT32)
                if iv.ndim != 1:
                    raise ShapeError(f"kv_indices must be 1-D, got shape {list(iv.shape)}")
                n_idx, ptr = iv.shape[0], iv.ptr
                keep.append(iv)
            else:
                if _is_device_array(kv_indices):
                    raise DeviceMismatchError("kv_indices is on a GPU, but the plan runs on the CPU")
                arr = _host_int32(kv_indices, "kv_indices")
                n_idx, ptr = arr.size, arr.ctypes.data
                keep.append(arr)
            if meta is not None and meta.total_pages is not None and n_idx < meta.total_pages:
                raise ShapeError(f"kv_indices has {n_idx} entries, but the batch's kv_indptr[-1] = {meta.total_pages}")
            t.kv_indices = ptr

        # Outputs.
        if out is None:
            out = self._alloc(qv, (total_rows, H, HEAD_DIM_V), "bf16")
        ov = self._array(out, "out", _OUT_DTYPES, (total_rows, H, HEAD_DIM_V), "the bf16 output",
                         writable=True)
        keep.append(ov)
        if want_lse:
            if lse is None:
                lse = self._alloc(qv, (total_rows, H), "float32")
            lv = self._array(lse, "lse", ("float32",), (total_rows, H), "the float32 lse", writable=True)
            t.lse = lv.ptr
            keep.append(lv)

        if workspace is not None:
            wv = view_of(workspace, "workspace", self._dlpack_stream)
            self._check_side(wv, "workspace")
            if not is_c_contiguous(wv.shape, wv.strides):
                raise LayoutError("workspace is not contiguous")
            t.workspace = wv.ptr
            t.workspace_size = wv.nbytes
            keep.append(wv)

        if num_pages is None:
            t.num_pages = kvv.shape[0]
        else:
            n = _int_arg(num_pages, "num_pages", 0, 2 ** 62)
            if n > kvv.shape[0]:
                raise ShapeError(f"num_pages={n}, but kv holds {kvv.shape[0]} pages")
            t.num_pages = n

        if total_rows == 0:
            # No query token: nothing to compute (and empty tensors may have
            # NULL data pointers, which the library refuses).
            if meta is None:
                raise NoMetadataError("run() called before a successful build_metadata()")
        else:
            t.q = qv.ptr
            t.kv = kvv.ptr
            t.out = ov.ptr
            s = stream_handle(stream)
            if s is None and self._backend == Backend.GPU:
                s = producer_stream(keep)
                if s is None:
                    s = self._current_stream()
            check(core.mla_plan_execute(handle, t, s), "mla_plan_execute")
        del keep
        return (out, lse) if want_lse else out

    @staticmethod
    def _scale_row_stride(sv: ArrayView) -> int:
        """Row stride (bytes per token) of an MXFP4 scale array
        [num_pages, page_size, n]: rows must be dense and evenly spaced."""
        pages, ps, n = sv.shape
        if n < SCALES_PER_ROW:
            raise ShapeError(f"kv_scale has {n} scale bytes per token; MXFP4 needs >= {SCALES_PER_ROW}")
        if n > 1 and sv.strides[2] != 1:
            raise LayoutError(f"kv_scale's last dimension is not contiguous (strides {list(sv.strides)})")
        if ps > 1:
            stride = sv.strides[1]
        elif pages > 1:
            stride = sv.strides[0]
        else:
            stride = n
        if stride < n:
            raise LayoutError(f"kv_scale's rows overlap (row stride {stride} < {n})")
        if pages > 1 and sv.strides[0] != ps * stride:
            raise LayoutError(f"kv_scale's pages are not {ps} x {stride} bytes apart (strides {list(sv.strides)})")
        return stride
