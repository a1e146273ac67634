"""Enumerations of the C API as Python enums, and the name parsing the
pythonic API accepts ("bf16", "fp8", "auto", ...)."""

from __future__ import annotations

import enum
from typing import Union

from . import core


class Status(enum.IntEnum):
    """``mla_status``: the result of every C call (values never renumbered)."""

    SUCCESS = core.MLA_SUCCESS
    NULL_POINTER = core.MLA_ERROR_NULL_POINTER
    STRUCT_SIZE = core.MLA_ERROR_STRUCT_SIZE
    INVALID_VALUE = core.MLA_ERROR_INVALID_VALUE
    UNSUPPORTED_DTYPE = core.MLA_ERROR_UNSUPPORTED_DTYPE
    INVALID_INDPTR = core.MLA_ERROR_INVALID_INDPTR
    INVALID_LAST_PAGE_LEN = core.MLA_ERROR_INVALID_LAST_PAGE_LEN
    PAGE_OUT_OF_RANGE = core.MLA_ERROR_PAGE_OUT_OF_RANGE
    LIMIT_EXCEEDED = core.MLA_ERROR_LIMIT_EXCEEDED
    NO_METADATA = core.MLA_ERROR_NO_METADATA
    BACKEND_UNAVAILABLE = core.MLA_ERROR_BACKEND_UNAVAILABLE
    INVALID_DEVICE = core.MLA_ERROR_INVALID_DEVICE
    DEVICE_RUNTIME = core.MLA_ERROR_DEVICE_RUNTIME
    OUT_OF_MEMORY = core.MLA_ERROR_OUT_OF_MEMORY
    MISALIGNED = core.MLA_ERROR_MISALIGNED
    WORKSPACE_TOO_SMALL = core.MLA_ERROR_WORKSPACE_TOO_SMALL
    DEVICE_VALIDATION_FAILED = core.MLA_ERROR_DEVICE_VALIDATION_FAILED
    INTERNAL = core.MLA_ERROR_INTERNAL


class DType(enum.IntEnum):
    """``mla_dtype``: element formats of Q, KV and the output."""

    DEFAULT = core.MLA_DTYPE_DEFAULT
    BF16 = core.MLA_DTYPE_BF16
    FP8_E4M3 = core.MLA_DTYPE_FP8_E4M3
    FP8_E4M3_FNUZ = core.MLA_DTYPE_FP8_E4M3_FNUZ
    MXFP4 = core.MLA_DTYPE_MXFP4
    FLOAT32 = core.MLA_DTYPE_FLOAT32

    @property
    def short_name(self) -> str:
        """The name the pythonic API prints: "bf16", "fp8_e4m3", ..."""
        return self.name.lower()

    @property
    def is_fp8(self) -> bool:
        return self in (DType.FP8_E4M3, DType.FP8_E4M3_FNUZ)


class Backend(enum.IntEnum):
    """``mla_backend``: where a plan runs."""

    AUTO = core.MLA_BACKEND_AUTO
    CPU = core.MLA_BACKEND_CPU
    GPU = core.MLA_BACKEND_GPU


class Memory(enum.IntEnum):
    """``mla_memory``: where the arrays of a batch live."""

    HOST = core.MLA_MEMORY_HOST
    DEVICE = core.MLA_MEMORY_DEVICE


class Flags(enum.IntFlag):
    """``mla_flags``: plan flags."""

    DETERMINISTIC = core.MLA_FLAG_DETERMINISTIC
    VALIDATE_DEVICE_INPUTS = core.MLA_FLAG_VALIDATE_DEVICE_INPUTS
    CALLER_WORKSPACE = core.MLA_FLAG_CALLER_WORKSPACE


DTypeLike = Union[str, DType, int]
BackendLike = Union[str, Backend, int]

_DTYPE_NAMES = {
    "bf16": DType.BF16,
    "bfloat16": DType.BF16,
    "fp8": DType.FP8_E4M3,
    "fp8_e4m3": DType.FP8_E4M3,
    "fp8_e4m3fn": DType.FP8_E4M3,
    "float8_e4m3fn": DType.FP8_E4M3,
    "e4m3": DType.FP8_E4M3,
    "fp8_fnuz": DType.FP8_E4M3_FNUZ,
    "fp8_e4m3_fnuz": DType.FP8_E4M3_FNUZ,
    "fp8_e4m3fnuz": DType.FP8_E4M3_FNUZ,
    "float8_e4m3fnuz": DType.FP8_E4M3_FNUZ,
    "mxfp4": DType.MXFP4,
    "fp4": DType.MXFP4,
}

_BACKEND_NAMES = {"auto": Backend.AUTO, "cpu": Backend.CPU, "gpu": Backend.GPU,
                  "cuda": Backend.GPU, "hip": Backend.GPU, "rocm": Backend.GPU}


def parse_dtype(value: DTypeLike, what: str) -> DType:
    """Turn "bf16", "fp8" / "fp8_e4m3", "fp8_fnuz" / "fp8_e4m3_fnuz", "mxfp4"
    (any case) or a DType into a DType; raise mla.DtypeError otherwise."""
    from ._errors import DtypeError

    if isinstance(value, DType):
        return value
    if isinstance(value, str):
        key = value.strip().lower().replace("-", "_")
        if key in _DTYPE_NAMES:
            return _DTYPE_NAMES[key]
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            return DType(value)
        except ValueError:
            pass
    raise DtypeError(f"{what}={value!r} is not a dtype; use one of 'bf16', 'fp8' ('fp8_e4m3'), "
                     f"'fp8_fnuz' ('fp8_e4m3_fnuz') or 'mxfp4'")


def parse_backend(value: BackendLike) -> Backend:
    """Turn "auto" / "cpu" / "gpu" (any case) or a Backend into a Backend."""
    from ._errors import ArgumentError

    if isinstance(value, Backend):
        return value
    if isinstance(value, str) and value.strip().lower() in _BACKEND_NAMES:
        return _BACKEND_NAMES[value.strip().lower()]
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return Backend(value)
        except ValueError:
            pass
    raise ArgumentError(f"backend={value!r} is not a backend; use 'auto', 'cpu' or 'gpu'")
