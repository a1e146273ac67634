"""libmla: MLA (DeepSeek absorbed Multi-head Latent Attention) decode
attention, from Python.

    import numpy as np, mla

    plan = mla.Plan(num_heads=16, q_dtype="bf16", kv_dtype="fp8", page_size=64, backend="cpu")
    plan.build_metadata(qo_indptr, kv_indptr, kv_last_page_len)   # once per decode step
    out, lse = plan.run(q, kv, kv_scale=scale, kv_indices=page_table, return_lse=True)  # per layer
    plan.close()

Contents:
    Plan                   the plan: build_metadata() per step, run() per layer
    reference              float64 NumPy implementation, for checking
    bf16 / from_bf16       float <-> bfloat16 bit patterns (uint16)
    quantize_fp8 / dequantize_fp8 / to_fp8 / from_fp8
                           per-tensor FP8 E4M3 (OCP or FNUZ)
    quantize_mxfp4 / dequantize_mxfp4
                           OCP MXFP4: E2M1 pairs + E8M0 scales per 32 values
    Error and subclasses   one per mla_status, plus ArgumentError & co for
                           checks made in Python
    Status, DType, Backend, Memory, Flags
                           the C enumerations
    core                   the SWIG wrapper of include/mla.h, one to one
    version(), gpu_device_count(), HEAD_DIM_QK, HEAD_DIM_V, MAX_* constants

Arrays are NumPy arrays for CPU plans and torch / CuPy / DLPack GPU tensors
for GPU plans; they are never copied. See help(mla.Plan).
"""

from __future__ import annotations

from . import core
from ._enums import Backend, DType, Flags, Memory, Status
from ._errors import (ArgumentError, BackendUnavailableError, DeviceMismatchError, DeviceRuntimeError,
                      DeviceValidationFailedError, DtypeError, Error, InternalError, InvalidDeviceError,
                      InvalidIndptrError, InvalidLastPageLenError, InvalidValueError, LayoutError,
                      LimitExceededError, MisalignedError, NoMetadataError, NullPointerError, OutOfMemoryError,
                      PageOutOfRangeError, PlanClosedError, ShapeError, StructSizeError, UnsupportedDtypeError,
                      WorkspaceTooSmallError)
from ._formats import (FP8_E4M3_FNUZ_MAX, FP8_E4M3_MAX, bf16, dequantize_fp8, dequantize_mxfp4, from_bf16, from_fp8,
                       quantize_fp8, quantize_mxfp4, to_fp8)
from ._plan import Plan, ScheduleInfo
from ._reference import reference

HEAD_DIM_QK: int = core.MLA_HEAD_DIM_QK
HEAD_DIM_V: int = core.MLA_HEAD_DIM_V
MAX_HEADS: int = core.MLA_MAX_HEADS
MAX_Q_LEN: int = core.MLA_MAX_Q_LEN
MAX_PAGE_SIZE: int = core.MLA_MAX_PAGE_SIZE
MAX_SPLITS: int = core.MLA_MAX_SPLITS
MXFP4_BLOCK: int = core.MLA_MXFP4_BLOCK
MXFP4_SCALES_PER_ROW: int = core.MLA_MXFP4_SCALES_PER_ROW


def version() -> str:
    """Version of the loaded libmla, e.g. ``"0.1.0"`` (``mla_version()``)."""
    v = core.mla_version()
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


def gpu_device_count() -> int:
    """Usable GPUs for the GPU backend (0 when none, or not built in)."""
    return int(core.mla_gpu_device_count())


__version__ = version()

__all__ = [
    "Plan", "ScheduleInfo", "reference",
    "bf16", "from_bf16", "quantize_fp8", "dequantize_fp8", "to_fp8", "from_fp8", "quantize_mxfp4",
    "dequantize_mxfp4", "FP8_E4M3_MAX", "FP8_E4M3_FNUZ_MAX",
    "Error", "ArgumentError", "ShapeError", "DtypeError", "LayoutError", "DeviceMismatchError", "PlanClosedError",
    "NullPointerError", "StructSizeError", "InvalidValueError", "UnsupportedDtypeError", "InvalidIndptrError",
    "InvalidLastPageLenError", "PageOutOfRangeError", "LimitExceededError", "NoMetadataError",
    "BackendUnavailableError", "InvalidDeviceError", "DeviceRuntimeError", "OutOfMemoryError", "MisalignedError",
    "WorkspaceTooSmallError", "DeviceValidationFailedError", "InternalError",
    "Status", "DType", "Backend", "Memory", "Flags", "core",
    "version", "gpu_device_count", "HEAD_DIM_QK", "HEAD_DIM_V", "MAX_HEADS", "MAX_Q_LEN", "MAX_PAGE_SIZE",
    "MAX_SPLITS", "MXFP4_BLOCK", "MXFP4_SCALES_PER_ROW",
]
