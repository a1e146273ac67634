"""mla.reference against values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

import mla


def test_two_keys_by_hand():
    # One head, one query, two keys: scores a and b, softmax weights by hand.
    q = np.zeros((1, 1, 576))
    q[0, 0, 0] = 24.0                      # sm_scale 1/24 turns q.k into k[0]
    kv = np.zeros((2, 1, 576))
    kv[0, 0, 0], kv[1, 0, 0] = 1.0, 3.0
    kv[0, 0, 1], kv[1, 0, 1] = 10.0, 20.0
    out, lse = mla.reference(q, kv, [0, 1], [0, 2])
    w0, w1 = math.exp(1) / (math.exp(1) + math.exp(3)), math.exp(3) / (math.exp(1) + math.exp(3))
    assert out[0, 0, 0] == pytest.approx(w0 * 1 + w1 * 3)
    assert out[0, 0, 1] == pytest.approx(w0 * 10 + w1 * 20)
    assert lse[0, 0] == pytest.approx(math.log(math.exp(1) + math.exp(3)))
    # logit cap: s -> cap * tanh(s / cap)
    out, lse = mla.reference(q, kv, [0, 1], [0, 2], logit_cap=2.0)
    s0, s1 = 2 * math.tanh(0.5), 2 * math.tanh(1.5)
    assert lse[0, 0] == pytest.approx(math.log(math.exp(s0) + math.exp(s1)))


def test_causal_mask_and_empty_rows():
    # kv_len 2, q_len 3: row 0 sees nothing, row 1 sees key 0, row 2 both.
    q = np.ones((3, 2, 576))
    kv = np.arange(2 * 576, dtype=np.float64).reshape(2, 1, 576) / 1000
    out, lse = mla.reference(q, kv, [0, 3], [0, 2])
    assert np.isneginf(lse[0]).all() and (out[0] == 0).all()
    assert np.allclose(out[1], kv[0, 0, :512])
    assert np.isfinite(lse[2]).all()
    # An empty sequence and rows no sequence owns.
    out, lse = mla.reference(np.ones((4, 1, 576)), kv, [0, 1, 2], [0, 0, 1])
    assert np.isneginf(lse[0]).all() and np.isfinite(lse[1]).all() and np.isneginf(lse[2:]).all()


def test_page_table_and_last_page_len():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 4, 576))
    rows = rng.standard_normal((10, 576))
    # Pages of 4 rows, stored in reverse order; 10 tokens = 2 full pages + 2.
    cache = np.zeros((3, 4, 576))
    cache[2], cache[1], cache[0, :2] = rows[0:4], rows[4:8], rows[8:10]
    paged = mla.reference(q, cache, [0, 1], [0, 3], kv_last_page_len=[2], kv_indices=[2, 1, 0])
    flat = mla.reference(q, rows[:, None, :], [0, 1], [0, 10])
    assert np.allclose(paged[0], flat[0]) and np.allclose(paged[1], flat[1])


def test_decodes_raw_formats():
    rng = np.random.default_rng(2)
    qf = rng.standard_normal((1, 2, 576)).astype(np.float32)
    kvf = rng.standard_normal((3, 1, 576)).astype(np.float32)
    kv8, s = mla.quantize_fp8(kvf)
    a = mla.reference(mla.bf16(qf), kv8, [0, 1], [0, 3], kv_scale=s)
    b = mla.reference(mla.from_bf16(mla.bf16(qf)), mla.dequantize_fp8(kv8, s), [0, 1], [0, 3])
    # dequantize_fp8 rounds code * scale to float32; the reference keeps float64
    assert np.allclose(a[0], b[0], atol=1e-6) and np.allclose(a[1], b[1], atol=1e-6)
    packed, sc = mla.quantize_mxfp4(kvf)
    a = mla.reference(qf, packed, [0, 1], [0, 3], kv_scale=sc)
    b = mla.reference(qf, mla.dequantize_mxfp4(packed, sc), [0, 1], [0, 3])
    assert np.allclose(a[0], b[0])
