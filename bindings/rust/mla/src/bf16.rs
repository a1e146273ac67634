//! bfloat16 conversions. libmla's bf16 tensors (Q, KV, out) are `u16` bit
//! patterns in Rust.

/// Converts an `f32` to bf16 bits, rounding to nearest, ties to even.
/// NaN stays a quiet NaN (sign kept); infinities and overflow become ±inf.
///
/// ```
/// assert_eq!(mla::f32_to_bf16(1.0), 0x3f80);
/// assert_eq!(mla::bf16_to_f32(mla::f32_to_bf16(-2.5)), -2.5);
/// ```
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if (bits & 0x7fff_ffff) > 0x7f80_0000 {
        // NaN: keep the top payload bits and force the quiet bit.
        return ((bits >> 16) as u16) | 0x0040;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

/// Converts bf16 bits to `f32` (exact).
#[inline]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Converts a slice of `f32` to bf16 bits ([`f32_to_bf16`] per element).
pub fn f32_slice_to_bf16(src: &[f32]) -> Vec<u16> {
    src.iter().map(|&x| f32_to_bf16(x)).collect()
}

/// Converts a slice of bf16 bits to `f32` ([`bf16_to_f32`] per element).
pub fn bf16_slice_to_f32(src: &[u16]) -> Vec<f32> {
    src.iter().map(|&h| bf16_to_f32(h)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_values_roundtrip() {
        for &x in &[
            0.0f32,
            -0.0,
            1.0,
            -1.0,
            0.5,
            3.0,
            65280.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ] {
            assert_eq!(bf16_to_f32(f32_to_bf16(x)).to_bits(), x.to_bits());
        }
    }

    #[test]
    fn rounds_to_nearest_even() {
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(f32_to_bf16(1.0 + 1.0 / 256.0), 0x3f80);
        // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even).
        assert_eq!(f32_to_bf16(1.0 + 3.0 / 256.0), 0x3f82);
        // Just above halfway rounds up.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        // Overflow to infinity.
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80);
    }

    #[test]
    fn nan_stays_nan() {
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        assert!(bf16_to_f32(f32_to_bf16(f32::from_bits(0x7f80_0001))).is_nan());
        assert!(bf16_to_f32(f32_to_bf16(f32::from_bits(0xff80_0001))).is_nan());
    }
}
