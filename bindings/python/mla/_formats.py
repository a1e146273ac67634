"""Element formats of DESIGN §2 in NumPy: bf16, FP8 E4M3 (OCP and FNUZ) and
MXFP4 (E2M1 pairs + E8M0 block scales), encoders and decoders.

Encoded data is held in plain integer arrays, which is what the library
reads: bf16 as ``uint16`` bit patterns, FP8 and packed MXFP4 as ``uint8``.
All encoders round to nearest, ties to even, and saturate at the largest
finite value; NaN stays NaN.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

from ._errors import DtypeError, ShapeError

__all__ = [
    "bf16", "from_bf16",
    "to_fp8", "from_fp8", "quantize_fp8", "dequantize_fp8",
    "quantize_mxfp4", "dequantize_mxfp4",
    "FP8_E4M3_MAX", "FP8_E4M3_FNUZ_MAX", "MXFP4_BLOCK",
]

FP8_E4M3_MAX = 448.0
FP8_E4M3_FNUZ_MAX = 240.0
MXFP4_BLOCK = 32
_E2M1_MAX = 6.0
_E2M1_EMAX = 2  # exponent of E2M1's largest binade (4 .. 6)


def _float_input(x, what: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind not in "fiub":
        raise DtypeError(f"{what} must be a real numeric array, got dtype {a.dtype}")
    return a


def _raw_input(x, dtype, what: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype != dtype:
        if a.dtype.kind in "iu" and a.dtype.itemsize == np.dtype(dtype).itemsize:
            return a.view(dtype)
        if a.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz") and a.dtype.itemsize == np.dtype(dtype).itemsize:
            return a.view(dtype)
        raise DtypeError(f"{what} must hold raw {np.dtype(dtype).name} codes, got dtype {a.dtype}")
    return a


# ---- bf16 ------------------------------------------------------------------

def bf16(x) -> np.ndarray:
    """Round ``x`` to bfloat16 (nearest, ties to even) and return the bit
    patterns as ``uint16`` — the form the library reads for bf16 Q and KV."""
    a = np.ascontiguousarray(_float_input(x, "x"), dtype=np.float32)
    bits = a.view(np.uint32)
    nan = np.isnan(a)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    out = rounded.astype(np.uint16)
    if nan.any():
        out[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return out


def from_bf16(u16) -> np.ndarray:
    """Decode bfloat16 bit patterns (``uint16``, or a bfloat16 dtype) to float32."""
    a = np.ascontiguousarray(_raw_input(u16, np.uint16, "u16"))
    return (a.astype(np.uint32) << np.uint32(16)).view(np.float32)


# ---- FP8 E4M3 ----------------------------------------------------------------

def _fp8_table(fnuz: bool) -> np.ndarray:
    """float64 value of each of the 256 codes."""
    codes = np.arange(256, dtype=np.int64)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = (codes & 0x7).astype(np.float64)
    bias = 8 if fnuz else 7
    normal = (1.0 + man / 8.0) * np.exp2(exp.astype(np.float64) - bias)
    sub = man / 8.0 * np.exp2(1.0 - bias)
    vals = sign * np.where(exp == 0, sub, normal)
    if fnuz:
        vals[0x80] = np.nan
    else:
        vals[0x7F] = np.nan
        vals[0xFF] = np.nan
    return vals


_FP8_TABLES = {False: _fp8_table(False), True: _fp8_table(True)}
# Non-negative finite magnitudes, indexed by code (increasing with the code).
_FP8_MAGS = {False: _FP8_TABLES[False][:0x7F], True: _FP8_TABLES[True][:0x80]}


def _nearest_code(mag: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Index of the nearest entry of the increasing ``table`` to each
    ``mag`` (>= 0, finite), ties to the even index, saturating at the end."""
    hi = np.clip(np.searchsorted(table, mag, side="left"), 1, len(table) - 1)
    lo = hi - 1
    d_lo = mag - table[lo]
    d_hi = table[hi] - mag
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    idx = np.where(pick_hi, hi, lo)
    idx = np.where(mag >= table[-1], len(table) - 1, idx)
    return idx


def to_fp8(x, fnuz: bool = False) -> np.ndarray:
    """Encode ``x`` as FP8 E4M3 codes (``uint8``) without scaling: OCP
    ``e4m3fn`` (max 448), or ``e4m3fnuz`` (max 240) when ``fnuz``. Rounds to
    nearest even, saturates, NaN → the NaN code."""
    a = np.asarray(_float_input(x, "x"), dtype=np.float64)
    mags = _FP8_MAGS[bool(fnuz)]
    m = np.abs(a)
    nan = np.isnan(a)
    code = _nearest_code(np.where(nan, 0.0, m), mags).astype(np.uint8)
    negative = np.signbit(a) & ~nan
    if fnuz:
        negative &= code != 0  # FNUZ has no negative zero (0x80 is NaN)
    code = np.where(negative, code | np.uint8(0x80), code)
    code = np.where(nan, np.uint8(0x80 if fnuz else 0x7F), code).astype(np.uint8)
    return code


def from_fp8(u8, fnuz: bool = False) -> np.ndarray:
    """Decode FP8 E4M3 codes (OCP, or FNUZ when ``fnuz``) to float32."""
    a = _raw_input(u8, np.uint8, "u8")
    return _FP8_TABLES[bool(fnuz)].astype(np.float32)[a]


def quantize_fp8(x, fnuz: bool = False) -> Tuple[np.ndarray, float]:
    """Per-tensor FP8 E4M3 quantization, as sglang's ``scaled_fp8_quant``.

    ``scale = amax(|x|) / 448`` (``/ 240`` for FNUZ; 1.0 when ``x`` is all
    zero); returns ``(codes, scale)`` with ``codes = to_fp8(x / scale)``
    (``uint8``, same shape), so ``x ≈ from_fp8(codes) * scale``. Pass
    ``scale`` as ``q_scale`` / ``kv_scale``."""
    a = np.asarray(_float_input(x, "x"), dtype=np.float64)
    amax = float(np.max(np.abs(a))) if a.size else 0.0
    if not np.isfinite(amax):
        raise ValueError("quantize_fp8: x contains inf or NaN")
    fmax = FP8_E4M3_FNUZ_MAX if fnuz else FP8_E4M3_MAX
    scale = float(np.float32(amax / fmax)) if amax > 0 else 1.0
    return to_fp8(a / scale, fnuz), scale


def dequantize_fp8(u8, scale: float = 1.0, fnuz: bool = False) -> np.ndarray:
    """Inverse of :func:`quantize_fp8`: ``from_fp8(u8) * scale`` as float32."""
    return from_fp8(u8, fnuz) * np.float32(scale)


# ---- MXFP4 ---------------------------------------------------------------------

_E2M1_MAGS = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_E2M1_VALUES = np.concatenate([_E2M1_MAGS, -_E2M1_MAGS]).astype(np.float32)


def quantize_mxfp4(x) -> Tuple[np.ndarray, np.ndarray]:
    """OCP MX FP4 quantization over the last dimension (a multiple of 32;
    576 for KV rows), as aiter's ``dynamic_mxfp4_quant``.

    For each block of 32 elements the shared scale is
    ``2^(floor(log2(amax)) - 2)`` (2 = emax of E2M1), stored as the E8M0 byte
    ``exponent + 127`` (clamped to 0..254; 255 only for a non-finite block);
    elements are divided by it, rounded to the nearest E2M1 value (ties to
    even) and saturated at ±6.

    Returns ``(packed, scales)``: ``packed[..., n // 2]`` ``uint8`` with the even
    element in the low nibble, and ``scales[..., n // 32]`` ``uint8`` — for
    KV, ``[..., 288]`` and ``[..., 18]``: pass ``scales`` as ``kv_scale``.
    """
    a = np.asarray(_float_input(x, "x"), dtype=np.float64)
    if a.ndim == 0 or a.shape[-1] % MXFP4_BLOCK != 0:
        raise ShapeError(f"quantize_mxfp4: the last dimension must be a multiple of {MXFP4_BLOCK}, "
                         f"got shape {a.shape}")
    n = a.shape[-1]
    blocks = a.reshape(a.shape[:-1] + (n // MXFP4_BLOCK, MXFP4_BLOCK))
    amax = np.max(np.abs(blocks), axis=-1)
    finite = np.isfinite(amax)
    with np.errstate(divide="ignore", invalid="ignore"):
        exp = np.floor(np.log2(np.where(finite & (amax > 0), amax, 1.0))) - _E2M1_EMAX
    exp = np.where(finite & (amax > 0), exp, -127.0)
    exp = np.clip(exp, -127.0, 127.0)
    scales = np.where(finite, exp + 127.0, 255.0).astype(np.uint8)
    scaled = blocks / np.exp2(exp)[..., None]
    scaled = np.where(np.isfinite(scaled), scaled, 0.0)
    mag = _nearest_code(np.abs(scaled), _E2M1_MAGS)
    nibble = np.where(np.signbit(scaled) & (mag != 0), mag | 8, mag).astype(np.uint8)
    nibble = nibble.reshape(a.shape[:-1] + (n // 2, 2))
    packed = (nibble[..., 0] | (nibble[..., 1] << np.uint8(4))).astype(np.uint8)
    return np.ascontiguousarray(packed), np.ascontiguousarray(scales)


def dequantize_mxfp4(packed, scales) -> np.ndarray:
    """Inverse of :func:`quantize_mxfp4`: E2M1 pairs ``[..., n // 2]`` and E8M0
    scales ``[..., >= n // 32]`` (extra trailing scale bytes, e.g. a padded
    ``kv_scale_stride``, are ignored) → float32 ``[..., n]``. E8M0 255 → NaN."""
    p = _raw_input(packed, np.uint8, "packed")
    s = _raw_input(scales, np.uint8, "scales")
    n = p.shape[-1] * 2
    if n % MXFP4_BLOCK != 0:
        raise ShapeError(f"dequantize_mxfp4: packed's last dimension {p.shape[-1]} is not a multiple of "
                         f"{MXFP4_BLOCK // 2}")
    nb = n // MXFP4_BLOCK
    if s.shape[:-1] != p.shape[:-1] or s.shape[-1] < nb:
        raise ShapeError(f"dequantize_mxfp4: scales of shape {s.shape} do not match packed of shape {p.shape} "
                         f"(need [..., >= {nb}])")
    lo = _E2M1_VALUES[p & np.uint8(0xF)]
    hi = _E2M1_VALUES[p >> np.uint8(4)]
    vals = np.stack([lo, hi], axis=-1).reshape(p.shape[:-1] + (nb, MXFP4_BLOCK))
    e = s[..., :nb].astype(np.uint32)
    # 2^(e - 127) built from its float32 bits, as the library does (e = 0 is
    # the subnormal 2^-127, e = 255 is NaN).
    bits = np.where(e == 0, np.uint32(0x00400000), e << np.uint32(23))
    bits = np.where(e == 255, np.uint32(0x7FC00000), bits).astype(np.uint32)
    factor = bits.view(np.float32)
    return (vals * factor[..., None]).reshape(p.shape[:-1] + (n,)).astype(np.float32)
