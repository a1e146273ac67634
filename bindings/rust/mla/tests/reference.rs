//! libmla's CPU backend against the float64 reference of DESIGN §1, on random
//! inputs, for every supported dtype pair and the shape features (paging,
//! causal q_len > 1, logit cap, forced splits, determinism).

#![allow(clippy::needless_range_loop)]

mod common;
use common::*;
use mla::{KvDtype, QDtype, Tensors};

#[test]
fn bf16_q_bf16_kv_page16() {
    run_case(&Case::new(16, 16, QDtype::Bf16, KvDtype::Bf16));
}

#[test]
fn bf16_q_bf16_kv_page1_identity_table() {
    let mut c = Case::new(16, 1, QDtype::Bf16, KvDtype::Bf16);
    c.paged = false;
    c.extra_pages = 2;
    c.seed = 2;
    run_case(&c);
}

#[test]
fn bf16_full_pages_without_last_page_len() {
    let mut c = Case::new(8, 64, QDtype::Bf16, KvDtype::Bf16);
    c.kv_lens = vec![64, 128, 192];
    c.q_lens = vec![1, 1, 1];
    c.last_page_len = false;
    c.seed = 3;
    run_case(&c);
}

#[test]
fn bf16_q_fp8_e4m3_kv_page64() {
    let mut c = Case::new(16, 64, QDtype::Bf16, KvDtype::Fp8E4m3);
    c.kv_scale = 0.375;
    c.seed = 4;
    run_case(&c);
}

#[test]
fn fp8_e4m3_q_fp8_e4m3_kv() {
    let mut c = Case::new(16, 16, QDtype::Fp8E4m3, KvDtype::Fp8E4m3);
    c.q_scale = 0.25;
    c.kv_scale = 0.5;
    c.seed = 5;
    run_case(&c);
}

#[test]
fn bf16_q_fp8_fnuz_kv() {
    let mut c = Case::new(16, 16, QDtype::Bf16, KvDtype::Fp8E4m3Fnuz);
    c.kv_scale = 0.75;
    c.seed = 6;
    run_case(&c);
}

#[test]
fn fp8_fnuz_q_fp8_fnuz_kv_page1() {
    let mut c = Case::new(16, 1, QDtype::Fp8E4m3Fnuz, KvDtype::Fp8E4m3Fnuz);
    c.q_scale = 0.5;
    c.kv_scale = 0.5;
    c.kv_lens = vec![3, 50, 77, 1];
    c.seed = 7;
    run_case(&c);
}

#[test]
fn bf16_q_mxfp4_kv_padded_scale_stride() {
    let mut c = Case::new(16, 16, QDtype::Bf16, KvDtype::Mxfp4);
    c.scale_stride = 24; // padding bytes are NaN and must not be read
    c.q_amp = 1.0;
    c.seed = 8;
    run_case(&c);
}

#[test]
fn fp8_q_mxfp4_kv_default_stride_page64() {
    let mut c = Case::new(16, 64, QDtype::Fp8E4m3, KvDtype::Mxfp4);
    c.q_scale = 0.125;
    c.seed = 9;
    run_case(&c);
}

#[test]
fn fnuz_q_mxfp4_kv() {
    let mut c = Case::new(8, 16, QDtype::Fp8E4m3Fnuz, KvDtype::Mxfp4);
    c.q_scale = 0.125;
    c.scale_stride = 32;
    c.seed = 10;
    run_case(&c);
}

#[test]
fn causal_multi_token_queries() {
    // q_len 1..4, including a sequence shorter than its q_len (rows with no
    // visible key: zeros and -inf) and an empty sequence.
    for (kv, seed) in [(KvDtype::Bf16, 11u64), (KvDtype::Fp8E4m3, 12), (KvDtype::Mxfp4, 13)] {
        let mut c = Case::new(16, 16, QDtype::Bf16, kv);
        c.q_lens = vec![4, 2, 3, 1, 4, 2];
        c.kv_lens = vec![70, 1, 2, 0, 33, 16];
        c.kv_scale = 0.5;
        c.q_amp = 2.0;
        c.seed = seed;
        run_case(&c);
    }
}

#[test]
fn sequences_without_queries_and_without_keys() {
    let mut c = Case::new(16, 16, QDtype::Bf16, KvDtype::Bf16);
    c.q_lens = vec![0, 1, 1, 0, 2];
    c.kv_lens = vec![40, 0, 17, 0, 5];
    c.seed = 14;
    run_case(&c);
}

#[test]
fn logit_cap_and_sm_scale() {
    let mut c = Case::new(16, 16, QDtype::Bf16, KvDtype::Bf16);
    c.logit_cap = 2.5;
    c.sm_scale = 0.2; // scores well beyond the cap
    c.q_lens = vec![1, 2, 1];
    c.kv_lens = vec![90, 31, 5];
    c.seed = 15;
    run_case(&c);
    let mut c2 = Case::new(16, 64, QDtype::Fp8E4m3, KvDtype::Fp8E4m3);
    c2.logit_cap = 10.0;
    c2.q_scale = 0.5;
    c2.kv_scale = 0.25;
    c2.seed = 16;
    run_case(&c2);
}

#[test]
fn forced_splits_threads_and_deterministic() {
    let base = {
        let mut c = Case::new(32, 16, QDtype::Bf16, KvDtype::Bf16);
        c.kv_lens = vec![500, 3, 260, 64];
        c.q_lens = vec![1, 1, 2, 1];
        c.seed = 17;
        c
    };
    for (splits, det, threads) in [(4, false, 0), (1, false, 1), (0, true, 2), (64, false, 2)] {
        let mut c = base.clone();
        c.num_splits = splits;
        c.deterministic = det;
        c.num_threads = threads;
        run_case(&c);
    }
}

#[test]
fn head_counts_and_page_sizes() {
    for (heads, ps, seed) in [(1usize, 256usize, 18u64), (128, 4, 19), (64, 2, 20), (3, 128, 21)] {
        let mut c = Case::new(heads, ps, QDtype::Bf16, KvDtype::Fp8E4m3);
        c.kv_lens = vec![300, 2];
        c.q_lens = vec![1, 1];
        c.extra_pages = 1;
        c.kv_scale = 0.5;
        c.seed = seed;
        run_case(&c);
    }
}

#[test]
fn without_lse() {
    let mut c = Case::new(16, 16, QDtype::Bf16, KvDtype::Bf16);
    c.with_lse = false;
    c.seed = 22;
    run_case(&c);
}

/// With one visible key, out = V of that key exactly: every FP8 code (NaN
/// codes excepted) decoded through the library must equal the reference
/// decoder, including subnormals and the extremes.
fn decode_table_fp8(kv: KvDtype, nan: &[u8], kv_scale: f32) {
    let mut c = Case::new(4, 1, QDtype::Bf16, kv);
    c.q_lens = vec![1, 1];
    c.kv_lens = vec![1, 1];
    c.extra_pages = 0;
    c.kv_scale = kv_scale;
    let mut d = generate(&c);
    d.q16.iter_mut().for_each(|v| *v = 0); // all scores 0
    for r in 0..2 {
        for e in 0..DQK {
            let code = ((e + r * 128) % 256) as u8;
            d.kv8[r * DQK + e] = if nan.contains(&code) { 0 } else { code };
        }
    }
    let mut plan = c.plan();
    let got = run(&mut plan, &c, &d);
    let (ro, rl) = reference(&c, &d);
    check_close(&c, &d, &got, &ro, &rl, 0.0);
}

#[test]
fn decode_table_fp8_e4m3() {
    decode_table_fp8(KvDtype::Fp8E4m3, &[0x7f, 0xff], 1.0);
    decode_table_fp8(KvDtype::Fp8E4m3, &[0x7f, 0xff], 0.5);
}

#[test]
fn decode_table_fp8_e4m3_fnuz() {
    decode_table_fp8(KvDtype::Fp8E4m3Fnuz, &[0x80], 1.0);
    decode_table_fp8(KvDtype::Fp8E4m3Fnuz, &[0x80], 2.0);
}

#[test]
fn decode_table_mxfp4() {
    // Every nibble in both positions of a byte, under scales 2^-127 .. 2^23.
    let mut c = Case::new(4, 1, QDtype::Bf16, KvDtype::Mxfp4);
    c.q_lens = vec![1, 1, 1];
    c.kv_lens = vec![1, 1, 1];
    c.extra_pages = 0;
    c.scale_stride = 20;
    let mut d = generate(&c);
    d.q16.iter_mut().for_each(|v| *v = 0);
    let scale_sets: [[u8; 3]; 3] = [[0, 1, 100], [120, 127, 130], [140, 150, 127]];
    for r in 0..3 {
        for b in 0..DQK / 2 {
            let lo = (b % 16) as u8;
            let hi = ((b / 16 + r) % 16) as u8;
            d.kv8[r * DQK / 2 + b] = lo | (hi << 4);
        }
        for k in 0..18 {
            d.scales[r * 20 + k] = scale_sets[r][k % 3];
        }
    }
    let mut plan = c.plan();
    let got = run(&mut plan, &c, &d);
    let (ro, rl) = reference(&c, &d);
    check_close(&c, &d, &got, &ro, &rl, 0.0);
}

/// MLA_FLAG_DETERMINISTIC: a sequence's output is bitwise identical whatever
/// else is in the batch, and from run to run.
#[test]
fn deterministic_is_batch_invariant() {
    let mut alone = Case::new(16, 16, QDtype::Bf16, KvDtype::Bf16);
    alone.deterministic = true;
    alone.q_lens = vec![1];
    alone.kv_lens = vec![3000];
    alone.extra_pages = 0;
    alone.paged = false;
    alone.seed = 30;
    let d = generate(&alone);

    // The same sequence first in a bigger batch: its pages come first (identity
    // table), other sequences' pages after.
    let mut batch = alone.clone();
    batch.q_lens = vec![1, 1, 1, 1];
    batch.kv_lens = vec![3000, 5000, 17, 900];
    let mut d2 = generate(&batch);
    let rows_a = d.kv16.len();
    d2.kv16[..rows_a].copy_from_slice(&d.kv16);
    d2.q16[..d.q16.len()].copy_from_slice(&d.q16);

    let mut p1 = alone.plan();
    let o1 = run(&mut p1, &alone, &d);
    let o1b = run(&mut p1, &alone, &d);
    let mut p2 = batch.plan();
    let o2 = run(&mut p2, &batch, &d2);
    let n = 16 * DV;
    assert_eq!(o1.out[..n], o1b.out[..n], "not reproducible run to run");
    assert_eq!(o1.out[..n], o2.out[..n], "output depends on the rest of the batch");
    assert_eq!(o1.lse[..16], o2.lse[..16]);
    let (ro, rl) = reference(&alone, &d);
    check_close(&alone, &d, &o1, &ro, &rl, default_atol(&ro));
}

/// Metadata is built once per step and reused by several layers' executes.
#[test]
fn metadata_reused_across_layers() {
    let c = Case::new(16, 16, QDtype::Bf16, KvDtype::Fp8E4m3);
    let mut plan = c.plan();
    let d0 = generate(&c);
    plan.build_metadata(&d0.batch()).unwrap();
    for layer in 0..3u64 {
        let mut cl = c.clone();
        cl.seed = 100 + layer;
        let d = generate(&cl); // same lengths, new data
        let rows = d.total_q() * c.heads;
        let mut out = vec![OUT_SENTINEL; rows * DV + TAIL];
        let mut lse = vec![LSE_SENTINEL; rows + TAIL];
        plan.execute(&mut Tensors {
            q: d.q_data(&cl),
            kv: d.kv_data(&cl),
            kv_indices: d.kv_indices.as_deref(),
            q_scale: 1.0,
            kv_scale: 1.0,
            out: &mut out,
            lse: Some(&mut lse),
        })
        .unwrap();
        let (ro, rl) = reference(&cl, &d);
        check_close(&cl, &d, &Output { out, lse }, &ro, &rl, default_atol(&ro));
    }
}
