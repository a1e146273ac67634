"""Zero-copy views of the arrays callers pass in.

Accepted, in this order:
  * ``torch.Tensor`` (CPU or CUDA/ROCm): ``data_ptr()``, ``stride()`` and
    ``dtype`` are read directly (torch is only imported when the object's type
    comes from it);
  * ``numpy.ndarray`` (and anything exposing ``__array_interface__`` or the
    buffer protocol, seen through ``numpy.asarray`` without a copy);
  * anything with ``__cuda_array_interface__`` (CuPy, Numba, ...);
  * anything with ``__dlpack__`` (CPU via ``numpy.from_dlpack``; CUDA/ROCm by
    reading the DLPack capsule with ctypes).

Nothing is ever copied or converted: an array that is not already in the
dtype and layout the library reads is refused with an :class:`mla.Error`.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from ._errors import ArgumentError, DeviceMismatchError, DtypeError, LayoutError

__all__ = ["ArrayView", "view_of", "stream_handle", "is_c_contiguous"]


@dataclass
class ArrayView:
    """What the library needs to know about one array."""

    obj: Any                      # the caller's object
    ptr: int                      # address of element [0, 0, ...]
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]      # in elements
    dtype: str                    # canonical name: uint8, uint16, bfloat16, float8_e4m3fn, float32, int32, ...
    itemsize: int
    device: Optional[int]         # None: host memory; else the GPU ordinal (-1: a GPU, ordinal unknown)
    framework: str                # "numpy", "torch", "cuda_array_interface", "dlpack"
    stream: Optional[int] = None  # the producer's stream (__cuda_array_interface__ v3), if it said
    readonly: bool = False
    keepalive: Any = None         # e.g. the DLPack capsule, held while the library reads the memory

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def on_gpu(self) -> bool:
        return self.device is not None

    def where(self) -> str:
        if self.device is None:
            return "host memory"
        return "a GPU" if self.device < 0 else f"GPU {self.device}"


def is_c_contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Row-major and dense (strides in elements; extents of 1 are ignored)."""
    if any(s == 0 for s in shape):
        return True
    expected = 1
    for extent, stride in zip(reversed(shape), reversed(strides)):
        if extent != 1 and stride != expected:
            return False
        expected *= extent
    return True


# ---- per framework -----------------------------------------------------------

def _is_torch_tensor(obj: Any) -> bool:
    mod = type(obj).__module__ or ""
    if not (mod == "torch" or mod.startswith("torch.")):
        return False
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _torch_view(t: Any, name: str) -> ArrayView:
    dev = t.device
    if dev.type == "cpu":
        device = None
    elif dev.type == "cuda":  # ROCm builds of torch also say "cuda"
        device = dev.index if dev.index is not None else -1
    else:
        raise DeviceMismatchError(f"{name} is a torch tensor on device '{dev}'; libmla reads CPU or CUDA/ROCm tensors")
    if t.layout is not sys.modules["torch"].strided:
        raise LayoutError(f"{name} is a torch tensor with layout {t.layout}; a dense (strided) tensor is needed")
    dtype = str(t.dtype).replace("torch.", "")
    return ArrayView(obj=t, ptr=int(t.data_ptr()), shape=tuple(int(s) for s in t.shape),
                     strides=tuple(int(s) for s in t.stride()), dtype=dtype, itemsize=int(t.element_size()),
                     device=device, framework="torch")


def _numpy_view(a: np.ndarray, name: str, obj: Any = None) -> ArrayView:
    itemsize = a.dtype.itemsize
    strides = []
    for s in a.strides:
        if itemsize == 0 or s % itemsize != 0:
            raise LayoutError(f"{name} has byte strides {a.strides} that are not multiples of its item size {itemsize}")
        strides.append(s // itemsize)
    return ArrayView(obj=a if obj is None else obj, ptr=int(a.__array_interface__["data"][0]), shape=tuple(a.shape),
                     strides=tuple(strides), dtype=a.dtype.name, itemsize=itemsize, device=None,
                     framework="numpy", readonly=not a.flags.writeable, keepalive=a)


_TYPESTR = {"u1": "uint8", "i1": "int8", "u2": "uint16", "i2": "int16", "f2": "float16", "u4": "uint32",
            "i4": "int32", "f4": "float32", "u8": "uint64", "i8": "int64", "f8": "float64", "b1": "bool"}


def _cai_view(obj: Any, name: str) -> ArrayView:
    cai = obj.__cuda_array_interface__
    typestr = cai["typestr"]
    if typestr[0] == ">":
        raise DtypeError(f"{name} is big-endian ({typestr})")
    key = typestr[1:]
    if key not in _TYPESTR:
        raise DtypeError(f"{name} has __cuda_array_interface__ typestr {typestr!r}, which libmla does not read")
    itemsize = int(key[1:])
    shape = tuple(int(s) for s in cai["shape"])
    if cai.get("mask") is not None:
        raise LayoutError(f"{name} is a masked array")
    if cai.get("strides") is None:
        strides = []
        acc = 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= s
        strides = tuple(reversed(strides))
    else:
        strides = []
        for s in cai["strides"]:
            if s % itemsize != 0:
                raise LayoutError(f"{name} has byte strides {cai['strides']} that are not multiples of {itemsize}")
            strides.append(int(s) // itemsize)
        strides = tuple(strides)
    ptr, readonly = cai["data"]
    device = -1
    dev = getattr(obj, "device", None)
    dev_id = getattr(dev, "id", None)
    if isinstance(dev_id, int):
        device = dev_id
    stream = cai.get("stream") if cai.get("version", 0) >= 3 else None
    return ArrayView(obj=obj, ptr=int(ptr or 0), shape=shape, strides=strides, dtype=_TYPESTR[key], itemsize=itemsize,
                     device=device, framework="cuda_array_interface",
                     stream=int(stream) if stream is not None else None, readonly=bool(readonly))


# DLPack (dlpack.h): the legacy unversioned capsule, named "dltensor".
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_ROCM, _DL_CUDA_MANAGED = 1, 2, 3, 10, 13
_DL_CODES = {(0, 8): "int8", (0, 16): "int16", (0, 32): "int32", (0, 64): "int64",
             (1, 8): "uint8", (1, 16): "uint16", (1, 32): "uint32", (1, 64): "uint64",
             (2, 16): "float16", (2, 32): "float32", (2, 64): "float64", (4, 16): "bfloat16",
             (10, 8): "float8_e4m3fn", (11, 8): "float8_e4m3fnuz"}


def _capsule_tensor(capsule: Any, name: str) -> _DLTensor:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    is_valid = ctypes.pythonapi.PyCapsule_IsValid
    is_valid.restype = ctypes.c_int
    is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
    if not is_valid(capsule, b"dltensor"):
        raise ArgumentError(f"{name}.__dlpack__() did not return an unconsumed 'dltensor' capsule")
    # DLManagedTensor starts with its DLTensor.
    return _DLTensor.from_address(get(capsule, b"dltensor"))


def _dlpack_view(obj: Any, name: str, stream: Optional[int]) -> ArrayView:
    dev_type, dev_id = obj.__dlpack_device__()
    if dev_type in (_DL_CPU, _DL_CUDA_HOST):
        from_dlpack = getattr(np, "from_dlpack", None) or getattr(np, "_from_dlpack")
        return _numpy_view(from_dlpack(obj), name, obj)
    if dev_type not in (_DL_CUDA, _DL_ROCM, _DL_CUDA_MANAGED):
        raise DeviceMismatchError(f"{name} lives on DLPack device type {dev_type}; libmla reads host or GPU memory")
    capsule = obj.__dlpack__(stream=stream)
    t = _capsule_tensor(capsule, name)
    key = (t.dtype.code, t.dtype.bits)
    if t.dtype.lanes != 1 or key not in _DL_CODES:
        raise DtypeError(f"{name} has DLPack dtype code {t.dtype.code} bits {t.dtype.bits} lanes {t.dtype.lanes}, "
                         f"which libmla does not read")
    ndim = int(t.ndim)
    shape = tuple(int(t.shape[i]) for i in range(ndim))
    if t.strides:
        strides = tuple(int(t.strides[i]) for i in range(ndim))
    else:
        acc, rev = 1, []
        for s in reversed(shape):
            rev.append(acc)
            acc *= s
        strides = tuple(reversed(rev))
    ptr = int(t.data or 0) + int(t.byte_offset)
    return ArrayView(obj=obj, ptr=ptr, shape=shape, strides=strides, dtype=_DL_CODES[key], itemsize=t.dtype.bits // 8,
                     device=int(dev_id), framework="dlpack", keepalive=capsule)


def view_of(obj: Any, name: str, dlpack_stream: Optional[int] = None) -> ArrayView:
    """An :class:`ArrayView` of ``obj`` (no copy), or :class:`mla.DtypeError`."""
    if obj is None:
        raise ArgumentError(f"{name} is None")
    if _is_torch_tensor(obj):
        return _torch_view(obj, name)
    if isinstance(obj, np.ndarray):
        return _numpy_view(obj, name)
    if hasattr(obj, "__cuda_array_interface__"):
        return _cai_view(obj, name)
    if hasattr(obj, "__array_interface__") or hasattr(obj, "__array_struct__") or isinstance(obj, (bytearray, memoryview)):
        return _numpy_view(np.asarray(obj), name, obj)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _dlpack_view(obj, name, dlpack_stream)
    raise DtypeError(f"{name} is a {type(obj).__module__}.{type(obj).__qualname__}; pass a NumPy array, a torch "
                     f"tensor, or an object with __cuda_array_interface__ or __dlpack__")


# ---- streams ---------------------------------------------------------------------

def stream_handle(stream: Any) -> Optional[int]:
    """A cudaStream_t / hipStream_t as an int from an int, a torch.cuda.Stream
    (``.cuda_stream``), a CuPy stream (``.ptr``), a Numba stream
    (``.handle``), a ctypes pointer, or None (None stays None)."""
    if stream is None:
        return None
    if isinstance(stream, bool):
        raise ArgumentError(f"stream={stream!r} is not a stream")
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    h = getattr(stream, "handle", None)
    if h is not None:
        v = getattr(h, "value", h)
        if isinstance(v, int) or v is None:
            return v or 0
    if isinstance(stream, ctypes.c_void_p):
        return stream.value or 0
    try:
        return int(stream)
    except (TypeError, ValueError):
        raise ArgumentError(f"stream={stream!r} is not a stream (int handle, torch.cuda.Stream, cupy stream, ...)") from None


def producer_stream(views: Sequence[ArrayView]) -> Optional[int]:
    """The stream the producers of ``views`` work on: torch's current stream
    for torch CUDA tensors, the ``__cuda_array_interface__`` stream, or CuPy's
    current stream; None when none of them says."""
    for v in views:
        if v is None or not v.on_gpu:
            continue
        if v.framework == "torch":
            torch = sys.modules["torch"]
            return int(torch.cuda.current_stream(v.obj.device).cuda_stream)
    for v in views:
        if v is None or not v.on_gpu:
            continue
        if v.stream is not None:
            # CAI: 1 = the legacy default stream (NULL), 2 = per-thread default.
            return 0 if v.stream == 1 else v.stream
        if v.framework == "dlpack":
            # Exported by __dlpack__(stream=None): ordered on the legacy default stream.
            return 0
        mod = type(v.obj).__module__ or ""
        if mod.startswith("cupy"):
            cupy = sys.modules.get("cupy")
            if cupy is not None:
                return int(cupy.cuda.get_current_stream().ptr)
    return None
