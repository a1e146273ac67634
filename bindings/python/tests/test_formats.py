"""bf16 / FP8 / MXFP4 helpers: known encodings, rounding, saturation, and
agreement with the library's decoders (through a bf16-exact run)."""

from __future__ import annotations

import numpy as np
import pytest

import mla


def test_bf16_known_values():
    x = np.array([1.0, -2.0, 0.0, -0.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -7 + 2 ** -9, np.inf, -np.inf,
                  3.0e38, 1e-40], np.float32)
    got = mla.bf16(x)
    assert got.dtype == np.uint16
    assert got.tolist()[:7] == [0x3F80, 0xC000, 0x0000, 0x8000, 0x3F80, 0x3F82, 0x3F81]
    assert got[7] == 0x7F80 and got[8] == 0xFF80
    assert got[9] == 0x7F62  # 3.0e38 rounds to a finite bf16
    assert mla.from_bf16(got[10:11])[0] == pytest.approx(1e-40, rel=1e-2)
    nan = mla.bf16(np.array([np.nan], np.float32))
    assert np.isnan(mla.from_bf16(nan)).all()


def test_bf16_round_trip(rng):
    bits = rng.integers(0, 2 ** 16, 5000, dtype=np.uint16)
    f = mla.from_bf16(bits)
    finite = np.isfinite(f)
    assert np.array_equal(mla.bf16(f[finite]), bits[finite])
    x = rng.standard_normal(5000).astype(np.float32)
    err = np.abs(mla.from_bf16(mla.bf16(x)) - x)
    assert (err <= np.abs(x) * 2 ** -8).all()


@pytest.mark.parametrize("fnuz", [False, True])
def test_fp8_all_codes_round_trip(fnuz):
    codes = np.arange(256, dtype=np.uint8)
    vals = mla.from_fp8(codes, fnuz)
    finite = ~np.isnan(vals)
    assert finite.sum() == (255 if fnuz else 254)
    back = mla.to_fp8(vals[finite], fnuz)
    if fnuz:
        assert np.array_equal(back, codes[finite])
    else:
        # +0 and -0 are distinct codes in OCP E4M3
        assert np.array_equal(back, codes[finite])


def test_fp8_known_values():
    x = np.array([1.0, -2.0, 448.0, 500.0, -1e9, 1.0625, 1.1875, 2 ** -9, 2 ** -10, 0.0])
    assert mla.to_fp8(x).tolist() == [0x38, 0xC0, 0x7E, 0x7E, 0xFE, 0x38, 0x3A, 0x01, 0x00, 0x00]
    assert mla.to_fp8(np.array([np.nan]))[0] == 0x7F
    y = np.array([1.0, 240.0, 1000.0, -1.0, -0.0, 2 ** -10])
    assert mla.to_fp8(y, fnuz=True).tolist() == [0x40, 0x7F, 0x7F, 0xC0, 0x00, 0x01]
    assert mla.to_fp8(np.array([np.nan]), fnuz=True)[0] == 0x80
    assert np.isnan(mla.from_fp8(np.array([0x80], np.uint8), fnuz=True)[0])
    assert np.isnan(mla.from_fp8(np.array([0x7F, 0xFF], np.uint8))).all()
    assert mla.from_fp8(np.array([0x7E], np.uint8))[0] == 448.0


@pytest.mark.parametrize("fnuz", [False, True])
def test_quantize_fp8(rng, fnuz):
    x = rng.standard_normal((7, 576)) * 3
    data, scale = mla.quantize_fp8(x, fnuz=fnuz)
    assert data.dtype == np.uint8 and data.shape == x.shape and isinstance(scale, float)
    fmax = 240.0 if fnuz else 448.0
    assert scale == pytest.approx(np.abs(x).max() / fmax, rel=1e-6)
    back = mla.dequantize_fp8(data, scale, fnuz=fnuz)
    assert back.dtype == np.float32
    assert (np.abs(back - x) <= np.abs(x) * 2 ** -4 + scale * 2 ** -9).all()
    assert np.abs(back).max() == pytest.approx(np.abs(x).max(), rel=2 ** -4)
    zero, s0 = mla.quantize_fp8(np.zeros(4))
    assert s0 == 1.0 and (zero == 0).all()


def test_mxfp4_known_block():
    x = np.zeros(576)
    x[:8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, -6.0]     # block 0: amax 6 -> scale 2^0
    x[32:36] = [0.25, 0.75, 5.0, 7.0]                     # block 1: amax 7 -> scale 2^0; ties to even
    x[64:66] = [1.0, -0.125]                              # block 2: amax 1 -> scale 2^-2
    packed, scales = mla.quantize_mxfp4(x)
    assert packed.shape == (288,) and scales.shape == (18,)
    assert packed.dtype == np.uint8 and scales.dtype == np.uint8
    assert scales[0] == 127 and scales[1] == 127 and scales[2] == 125
    assert scales[3] == 0  # an all-zero block
    assert packed[:4].tolist() == [0x10, 0x32, 0x54, 0xF6]  # low nibble = even element
    assert packed[16:18].tolist() == [0x20, 0x76]          # 0.25->0, 0.75->1.0, 5->4, 7->6 (saturated)
    assert packed[32] == 0x96                              # 4 (=1/2^-2), then -0.5 (=-0.125/2^-2)
    back = mla.dequantize_mxfp4(packed, scales)
    assert back[:8].tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, -6.0]
    assert back[32:36].tolist() == [0.0, 1.0, 4.0, 6.0]
    assert back[64:66].tolist() == [1.0, -0.125]


def test_mxfp4_round_trip_error(rng):
    x = rng.standard_normal((3, 5, 576)) * np.exp2(rng.integers(-8, 8, (3, 5, 1)))
    packed, scales = mla.quantize_mxfp4(x)
    assert packed.shape == (3, 5, 288) and scales.shape == (3, 5, 18)
    back = mla.dequantize_mxfp4(packed, scales)
    blocks = np.abs(x).reshape(3, 5, 18, 32).max(-1)
    err = np.abs(back - x).reshape(3, 5, 18, 32).max(-1)
    assert (err <= blocks / 4 + 1e-12).all()
    # Padded scale rows (kv_scale_stride > 18) decode the same.
    padded = np.concatenate([scales, np.full((3, 5, 14), 255, np.uint8)], axis=-1)
    assert np.array_equal(mla.dequantize_mxfp4(packed, padded), back)
    assert np.isnan(mla.dequantize_mxfp4(packed, np.full_like(scales, 255))).all()


def test_mxfp4_bad_shape():
    with pytest.raises(mla.ShapeError):
        mla.quantize_mxfp4(np.zeros(100))
    with pytest.raises(mla.ShapeError):
        mla.dequantize_mxfp4(np.zeros(288, np.uint8), np.zeros(17, np.uint8))


def test_library_decodes_like_the_helpers(rng):
    # One key row, q = e_k: the output is the key row decoded by the library
    # (softmax over one key is 1), rounded to bf16.
    H = 1
    kvf = rng.standard_normal((1, 1, 576)) * 2
    for kv_dtype in ("bf16", "fp8", "fp8_fnuz", "mxfp4"):
        if kv_dtype == "bf16":
            kv, scale = mla.bf16(kvf), None
            expect = mla.from_bf16(kv)
        elif kv_dtype == "mxfp4":
            kv, scale = mla.quantize_mxfp4(kvf)
            expect = mla.dequantize_mxfp4(kv, scale)
        else:
            kv, scale = mla.quantize_fp8(kvf, fnuz=kv_dtype == "fp8_fnuz")
            expect = mla.dequantize_fp8(kv, scale, fnuz=kv_dtype == "fp8_fnuz")
        q = mla.bf16(np.zeros((1, H, 576), np.float32))
        with mla.Plan(H, kv_dtype=kv_dtype, backend="cpu") as plan:
            plan.build_metadata([0, 1], [0, 1])
            out = plan.run(q, kv, kv_scale=scale)
        assert np.array_equal(out[0, 0], mla.bf16(expect[0, 0, :512])), kv_dtype
