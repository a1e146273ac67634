"""Exceptions. Every error the package raises is an :class:`mla.Error`.

Refusals by the C library raise a subclass chosen by the returned
``mla_status`` (``mla.InvalidIndptrError`` for MLA_ERROR_INVALID_INDPTR, ...)
and carry the library's own sentence (``mla_last_error_message()``).
Problems the Python layer finds before calling the library (an array of the
wrong dtype, shape, device or layout) raise :class:`mla.ArgumentError`
subclasses, which are also ``ValueError`` / ``TypeError``.
"""

from __future__ import annotations

from typing import Dict, Optional, Type

from . import core
from ._enums import Status


class Error(Exception):
    """Base class of every libmla error.

    Attributes:
        status: the :class:`mla.Status` the C library returned, or ``None``
            for a check made in Python.
        message: the library's (or the Python check's) sentence.
        function: the C function that refused, or ``None``.
    """

    status: Optional[Status] = None

    def __init__(self, message: str, status: Optional[Status] = None, function: Optional[str] = None):
        self.message = message
        if status is not None:
            self.status = Status(status)
        self.function = function
        text = message
        if self.status is not None:
            text = f"{self.status_name}: {message}" if message else self.status_name
            if function:
                text = f"{function}: {text}"
        super().__init__(text)

    @property
    def status_name(self) -> Optional[str]:
        """The C name of the status, e.g. ``"MLA_ERROR_INVALID_INDPTR"``."""
        if self.status is None:
            return None
        return core.mla_status_string(int(self.status))


# ---- one class per status (the library's refusals) ------------------------

class NullPointerError(Error):
    """MLA_ERROR_NULL_POINTER: a required pointer was NULL."""
    status = Status.NULL_POINTER


class StructSizeError(Error):
    """MLA_ERROR_STRUCT_SIZE: a descriptor's struct_size is wrong."""
    status = Status.STRUCT_SIZE


class InvalidValueError(Error, ValueError):
    """MLA_ERROR_INVALID_VALUE: a dimension, count or scalar out of range."""
    status = Status.INVALID_VALUE


class UnsupportedDtypeError(Error, ValueError):
    """MLA_ERROR_UNSUPPORTED_DTYPE: an unsupported dtype combination."""
    status = Status.UNSUPPORTED_DTYPE


class InvalidIndptrError(Error, ValueError):
    """MLA_ERROR_INVALID_INDPTR: qo_indptr / kv_indptr not starting at 0,
    decreasing, or a sequence length out of range."""
    status = Status.INVALID_INDPTR


class InvalidLastPageLenError(Error, ValueError):
    """MLA_ERROR_INVALID_LAST_PAGE_LEN: kv_last_page_len outside 1..page_size."""
    status = Status.INVALID_LAST_PAGE_LEN


class PageOutOfRangeError(Error, IndexError):
    """MLA_ERROR_PAGE_OUT_OF_RANGE: a kv_indices entry outside 0..num_pages-1."""
    status = Status.PAGE_OUT_OF_RANGE


class LimitExceededError(Error, ValueError):
    """MLA_ERROR_LIMIT_EXCEEDED: batch or q_len above the plan's limits."""
    status = Status.LIMIT_EXCEEDED


class NoMetadataError(Error, RuntimeError):
    """MLA_ERROR_NO_METADATA: run before a successful build_metadata."""
    status = Status.NO_METADATA


class BackendUnavailableError(Error, RuntimeError):
    """MLA_ERROR_BACKEND_UNAVAILABLE: backend not built in or no device."""
    status = Status.BACKEND_UNAVAILABLE


class InvalidDeviceError(Error, ValueError):
    """MLA_ERROR_INVALID_DEVICE: no such device, or used on another device."""
    status = Status.INVALID_DEVICE


class DeviceRuntimeError(Error, RuntimeError):
    """MLA_ERROR_DEVICE_RUNTIME: a GPU runtime call failed."""
    status = Status.DEVICE_RUNTIME


class OutOfMemoryError(Error, MemoryError):
    """MLA_ERROR_OUT_OF_MEMORY: host or device allocation failed."""
    status = Status.OUT_OF_MEMORY


class MisalignedError(Error, ValueError):
    """MLA_ERROR_MISALIGNED: a pointer misses its alignment (q, kv, out: 16 bytes)."""
    status = Status.MISALIGNED


class WorkspaceTooSmallError(Error, ValueError):
    """MLA_ERROR_WORKSPACE_TOO_SMALL: caller workspace smaller than needed."""
    status = Status.WORKSPACE_TOO_SMALL


class DeviceValidationFailedError(Error, ValueError):
    """MLA_ERROR_DEVICE_VALIDATION_FAILED: bad device-resident metadata."""
    status = Status.DEVICE_VALIDATION_FAILED


class InternalError(Error, RuntimeError):
    """MLA_ERROR_INTERNAL: a bug in libmla; please report the message."""
    status = Status.INTERNAL


_BY_STATUS: Dict[Status, Type[Error]] = {
    cls.status: cls
    for cls in (NullPointerError, StructSizeError, InvalidValueError, UnsupportedDtypeError, InvalidIndptrError,
                InvalidLastPageLenError, PageOutOfRangeError, LimitExceededError, NoMetadataError,
                BackendUnavailableError, InvalidDeviceError, DeviceRuntimeError, OutOfMemoryError, MisalignedError,
                WorkspaceTooSmallError, DeviceValidationFailedError, InternalError)
}


# ---- checks made in Python, before the library is called -----------------

class ArgumentError(Error, ValueError):
    """An argument refused by the Python layer (status is None)."""


class ShapeError(ArgumentError):
    """An array has the wrong number of dimensions or the wrong extents."""


class DtypeError(ArgumentError, TypeError):
    """An array has the wrong element type, or a dtype name is unknown."""


class LayoutError(ArgumentError):
    """An array is not laid out as the library reads it (not contiguous)."""


class DeviceMismatchError(ArgumentError):
    """An array lives on the host for a GPU plan, on the GPU for a CPU plan,
    or on another GPU than the plan's."""


class PlanClosedError(Error, ValueError):
    """The plan was closed (or failed to be created)."""


def error_for_status(status: int, function: Optional[str] = None) -> Error:
    """The exception for a failed C call, with the thread's last message."""
    try:
        st = Status(status)
    except ValueError:  # a status appended by a newer library
        err = Error(core.mla_last_error_message() or f"unknown mla_status {status}")
        err.status = None
        return err
    cls = _BY_STATUS.get(st, Error)
    return cls(core.mla_last_error_message(), st, function)


def check(status: int, function: str) -> None:
    """Raise the matching :class:`mla.Error` unless ``status`` is MLA_SUCCESS."""
    if status != 0:
        raise error_for_status(status, function)
