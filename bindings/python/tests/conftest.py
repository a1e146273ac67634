"""Shared helpers of the mla Python tests.

Run from a build tree: PYTHONPATH=<builddir>/bindings/python python3 -m pytest
bindings/python/tests (``meson test --suite python`` does exactly that).
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import pytest

import mla

SEED = int(os.environ.get("MLA_TEST_SEED", "20240611"))


def pytest_report_header(config):
    return [f"mla {mla.__version__} from {os.path.dirname(mla.__file__)}; MLA_TEST_SEED={SEED}"]


@pytest.fixture
def rng(request):
    # A per-test stream derived from the seed and the test's name: stable
    # whatever subset of the suite runs.
    return np.random.default_rng([SEED, zlib.crc32(request.node.nodeid.encode())])


@dataclass
class Batch:
    qo_indptr: np.ndarray
    kv_indptr: np.ndarray
    kv_last_page_len: np.ndarray
    kv_indices: np.ndarray
    num_pages: int
    page_size: int
    kv_lens: List[int]
    q_lens: List[int]

    @property
    def total_q(self) -> int:
        return int(self.qo_indptr[-1])


def make_batch(rng, kv_lens: Sequence[int], q_lens: Sequence[int], page_size: int, spare_pages: int = 3,
               shuffle: bool = True) -> Batch:
    """CSR batch for the given lengths, with a shuffled page table over a
    cache holding a few pages more than needed."""
    pages = [(L + page_size - 1) // page_size for L in kv_lens]
    kv_indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    qo_indptr = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    last = np.array([L - (p - 1) * page_size if p else 1 for L, p in zip(kv_lens, pages)], dtype=np.int32)
    num_pages = int(kv_indptr[-1]) + spare_pages
    if shuffle:
        indices = rng.permutation(num_pages)[: int(kv_indptr[-1])].astype(np.int32)
    else:
        indices = np.arange(int(kv_indptr[-1]), dtype=np.int32)
    return Batch(qo_indptr, kv_indptr, last, indices, num_pages, page_size, list(kv_lens), list(q_lens))


def encode_q(qf: np.ndarray, q_dtype: str):
    """(raw q, q_scale) for a float q."""
    if q_dtype == "bf16":
        return mla.bf16(qf), None
    data, scale = mla.quantize_fp8(qf, fnuz=q_dtype == "fp8_fnuz")
    return data, scale


def encode_kv(kvf: np.ndarray, kv_dtype: str):
    """(raw kv, kv_scale) for a float cache [num_pages, page_size, 576]."""
    if kv_dtype == "bf16":
        return mla.bf16(kvf), None
    if kv_dtype == "mxfp4":
        return mla.quantize_mxfp4(kvf)
    return mla.quantize_fp8(kvf, fnuz=kv_dtype == "fp8_fnuz")


def random_inputs(rng, batch: Batch, num_heads: int, q_dtype: str, kv_dtype: str, q_mult: float = 1.0):
    qf = rng.standard_normal((batch.total_q, num_heads, 576)).astype(np.float32) * q_mult
    kvf = rng.standard_normal((batch.num_pages, batch.page_size, 576)).astype(np.float32)
    q, q_scale = encode_q(qf, q_dtype)
    kv, kv_scale = encode_kv(kvf, kv_dtype)
    return q, q_scale, kv, kv_scale


def assert_close(out_bf16, lse, ref_out, ref_lse, rows: Optional[slice] = None):
    """The library's bf16 output and float32 lse against the float64 reference:
    bf16 rounding of out plus float32 accumulation."""
    o = mla.from_bf16(np.asarray(out_bf16)).astype(np.float64)
    scale = max(float(np.max(np.abs(ref_out))) if ref_out.size else 0.0, 1e-6)
    err = np.abs(o - ref_out)
    tol = 8e-3 * np.abs(ref_out) + 2e-3 * scale
    bad = err > tol
    assert not bad.any(), (f"out differs at {np.argwhere(bad)[:5].tolist()}: max error {err.max():.3g} "
                           f"(|ref| max {scale:.3g})")
    if lse is not None:
        lse = np.asarray(lse, dtype=np.float64)
        inf_ref = np.isneginf(ref_lse)
        assert np.array_equal(np.isneginf(lse), inf_ref), "lse is -inf in different places"
        fin = ~inf_ref
        d = np.abs(lse[fin] - ref_lse[fin])
        assert (d <= 1e-4 + 2e-5 * np.abs(ref_lse[fin])).all(), f"lse max error {d.max() if d.size else 0:.3g}"
        assert (o[inf_ref] == 0).all(), "rows without a visible key must be 0"
