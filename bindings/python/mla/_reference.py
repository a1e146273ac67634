"""mla.reference: DESIGN §1 in float64 NumPy, for checking results."""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import numpy as np

from ._enums import DType, DTypeLike, parse_dtype
from ._errors import ArgumentError, DtypeError, InvalidIndptrError, ShapeError
from ._formats import dequantize_mxfp4, from_bf16, from_fp8

__all__ = ["reference"]

_D_QK, _D_V = 576, 512


def _host(x: Any, name: str) -> np.ndarray:
    mod = type(x).__module__ or ""
    if mod.startswith("torch"):
        t = x.detach().cpu()
        name_ = str(t.dtype)
        if name_ == "torch.bfloat16":
            import torch  # noqa: F401 - present, since x is a tensor
            return t.view(torch.int16).numpy().view(np.uint16)
        if "float8" in name_:
            import torch
            return t.view(torch.uint8).numpy()
        return t.numpy()
    if hasattr(x, "__cuda_array_interface__") and hasattr(x, "get"):
        return x.get()  # CuPy
    return np.asarray(x)


def _decode(a: np.ndarray, dtype: Optional[DType], scale: float, name: str) -> np.ndarray:
    """Values of q / fp8-or-bf16 kv as float64."""
    if a.dtype.kind == "f" and a.dtype.itemsize >= 4:
        return a.astype(np.float64) * scale
    if dtype is None:
        if a.dtype.itemsize == 2 and a.dtype.kind in "iuV" or a.dtype.name == "bfloat16":
            dtype = DType.BF16
        elif a.dtype.itemsize == 1:
            dtype = DType.FP8_E4M3_FNUZ if a.dtype.name == "float8_e4m3fnuz" else DType.FP8_E4M3
        else:
            raise DtypeError(f"{name} has dtype {a.dtype}; pass float values, uint16 bf16 bits or uint8 fp8 codes")
    if dtype == DType.BF16:
        if a.dtype.itemsize != 2:
            raise DtypeError(f"{name}: bf16 data must have 2-byte elements, got {a.dtype}")
        return from_bf16(a.view(np.uint16)).astype(np.float64)
    if dtype.is_fp8:
        if a.dtype.itemsize != 1:
            raise DtypeError(f"{name}: fp8 data must have 1-byte elements, got {a.dtype}")
        return from_fp8(a.view(np.uint8), dtype == DType.FP8_E4M3_FNUZ).astype(np.float64) * scale
    raise DtypeError(f"{name}: dtype {dtype.short_name} is not valid here")


def reference(q: Any, kv: Any, qo_indptr: Any, kv_indptr: Any, kv_last_page_len: Any = None,
              kv_indices: Any = None, page_size: Optional[int] = None, q_dtype: Optional[DTypeLike] = None,
              kv_dtype: Optional[DTypeLike] = None, q_scale: float = 1.0, kv_scale: Any = None,
              sm_scale: Optional[float] = None, logit_cap: float = 0.0) -> Tuple[np.ndarray, np.ndarray]:
    """MLA decode attention (DESIGN §1) in float64, on the host.

    Takes the same arrays as :meth:`mla.Plan.run` plus the batch of
    :meth:`mla.Plan.build_metadata`: ``q [total_q, heads, 576]`` and
    ``kv [num_pages, page_size, row]`` either as raw encoded data (bf16
    ``uint16`` bits, fp8 ``uint8`` codes, mxfp4 ``uint8`` pairs) or as float
    values (float32/float64, used as given). ``q_dtype`` / ``kv_dtype``
    default to what the dtype and row width say (``uint16`` → bf16, ``uint8``
    with 576 columns → fp8 E4M3, 288 → mxfp4); pass ``"fp8_fnuz"`` for FNUZ
    data. ``q_scale`` / ``kv_scale`` as in :meth:`mla.Plan.run` (for mxfp4,
    ``kv_scale`` is the E8M0 array ``[num_pages, page_size, >= 18]``).
    ``page_size`` defaults to ``kv.shape[1]``.

    Returns ``(out, lse)``: float64 ``[total_q, heads, 512]`` and
    ``[total_q, heads]``. Rows without a visible key (and rows no sequence
    owns) get ``out = 0`` and ``lse = -inf``.
    """
    qa = _host(q, "q")
    kva = _host(kv, "kv")
    if qa.ndim != 3 or qa.shape[2] != _D_QK:
        raise ShapeError(f"q must be [total_q, heads, {_D_QK}], got shape {qa.shape}")
    if kva.ndim == 2:
        kva = kva[:, None, :]
    if kva.ndim != 3:
        raise ShapeError(f"kv must be [num_pages, page_size, row], got shape {kva.shape}")
    ps = kva.shape[1] if page_size is None else int(page_size)
    if ps != kva.shape[1]:
        raise ShapeError(f"page_size={ps} but kv has shape {kva.shape}")

    qd = parse_dtype(q_dtype, "q_dtype") if q_dtype is not None else None
    kd = parse_dtype(kv_dtype, "kv_dtype") if kv_dtype is not None else None
    if kd is None and kva.dtype.itemsize == 1 and kva.shape[2] == _D_QK // 2:
        kd = DType.MXFP4

    qf = _decode(qa, qd, float(q_scale) if q_scale is not None else 1.0, "q")
    if kd == DType.MXFP4:
        if kv_scale is None:
            raise ArgumentError("an mxfp4 KV cache needs kv_scale, its E8M0 block scales")
        sa = _host(kv_scale, "kv_scale")
        if kva.shape[2] != _D_QK // 2:
            raise ShapeError(f"mxfp4 kv rows are {_D_QK // 2} bytes, got shape {kva.shape}")
        if sa.ndim == 2:
            sa = sa[:, None, :]
        kvf = dequantize_mxfp4(kva.view(np.uint8), sa.view(np.uint8)).astype(np.float64)
    else:
        scale = 1.0 if kv_scale is None else float(kv_scale)
        kvf = _decode(kva, kd, scale, "kv")
    if kvf.shape[2] != _D_QK:
        raise ShapeError(f"kv rows must decode to {_D_QK} values, got shape {kvf.shape}")

    qo = np.asarray(_host(qo_indptr, "qo_indptr"), dtype=np.int64)
    kvp = np.asarray(_host(kv_indptr, "kv_indptr"), dtype=np.int64)
    n_seq = qo.size - 1
    if n_seq < 0 or kvp.size != qo.size:
        raise ShapeError("qo_indptr and kv_indptr must both have batch_size + 1 entries")
    last = None if kv_last_page_len is None else np.asarray(_host(kv_last_page_len, "kv_last_page_len"), np.int64)
    pages_table = None if kv_indices is None else np.asarray(_host(kv_indices, "kv_indices"), np.int64)
    sm = 1.0 / math.sqrt(_D_QK) if sm_scale is None or sm_scale == 0 else float(sm_scale)
    cap = float(logit_cap)

    total_q, heads = qa.shape[0], qa.shape[1]
    out = np.zeros((total_q, heads, _D_V), dtype=np.float64)
    lse = np.full((total_q, heads), -np.inf, dtype=np.float64)
    for b in range(n_seq):
        q0, q1, p0, p1 = int(qo[b]), int(qo[b + 1]), int(kvp[b]), int(kvp[b + 1])
        if q1 < q0 or p1 < p0 or q1 > total_q:
            raise InvalidIndptrError(f"reference: bad indptr at sequence {b}")
        n = q1 - q0
        pages = p1 - p0
        L = 0 if pages == 0 else (pages - 1) * ps + (ps if last is None else int(last[b]))
        if n == 0 or L == 0:
            continue
        ids = np.arange(p0, p1) if pages_table is None else pages_table[p0:p1]
        K = kvf[ids].reshape(-1, _D_QK)[:L]                       # [L, 576]
        s = np.einsum("nhd,ld->nhl", qf[q0:q1], K) * sm            # [n, H, L]
        if cap > 0:
            s = cap * np.tanh(s / cap)
        visible = np.arange(L)[None, :] <= (L - n + np.arange(n))[:, None]  # [n, L]
        s = np.where(visible[:, None, :], s, -np.inf)
        m = np.max(s, axis=-1, keepdims=True)
        ok = np.isfinite(m)
        m = np.where(ok, m, 0.0)
        e = np.exp(s - m)
        denom = np.sum(e, axis=-1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            p = np.where(ok, e / np.where(denom > 0, denom, 1.0), 0.0)
            lse[q0:q1] = np.where(ok[..., 0], (m + np.log(np.where(denom > 0, denom, 1.0)))[..., 0], -np.inf)
        out[q0:q1] = np.einsum("nhl,ld->nhd", p, K[:, :_D_V])
    return out, lse
