//! Test support: a float64 reference of DESIGN §1 (paging, causal masking for
//! q_len > 1, logit cap, LSE), independent decoders of every element format
//! (written from the format definitions, not from libmla's code), random case
//! generation with a tiny xorshift PRNG, and the tolerance check.
#![allow(dead_code)]
#![allow(clippy::needless_range_loop, clippy::neg_cmp_op_on_partial_ord)]

use mla::{Backend, Batch, KvData, KvDtype, Plan, PlanBuilder, QData, QDtype, Tensors, HEAD_DIM_QK, HEAD_DIM_V};

pub const DQK: usize = HEAD_DIM_QK;
pub const DV: usize = HEAD_DIM_V;

// ---- PRNG -------------------------------------------------------------------

/// xorshift64*.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform integer in lo..=hi.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
    /// Uniform in [-a, a).
    pub fn uniform(&mut self, a: f64) -> f64 {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * a
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.range(0, i as u64) as usize;
            v.swap(i, j);
        }
    }
}

// ---- Element decoders (float64, from the format definitions) ---------------

pub fn dec_bf16(h: u16) -> f64 {
    f32::from_bits((h as u32) << 16) as f64
}

/// OCP FP8 E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities;
/// S.1111.111 is NaN; exponent 0 is subnormal (m/8 * 2^-6).
pub fn dec_e4m3(v: u8) -> f64 {
    let sign = if v & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((v >> 3) & 0xf) as i32;
    let m = (v & 7) as f64;
    if e == 15 && m == 7.0 {
        return f64::NAN;
    }
    if e == 0 {
        sign * (m / 8.0) * 2f64.powi(1 - 7)
    } else {
        sign * (1.0 + m / 8.0) * 2f64.powi(e - 7)
    }
}

/// FP8 E4M3 FNUZ: bias 8, no infinities, no negative zero: 0x80 is NaN.
pub fn dec_e4m3_fnuz(v: u8) -> f64 {
    if v == 0x80 {
        return f64::NAN;
    }
    let sign = if v & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((v >> 3) & 0xf) as i32;
    let m = (v & 7) as f64;
    if e == 0 {
        sign * (m / 8.0) * 2f64.powi(1 - 8)
    } else {
        sign * (1.0 + m / 8.0) * 2f64.powi(e - 8)
    }
}

/// E2M1 nibble: magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 the sign.
pub fn dec_e2m1(n: u8) -> f64 {
    const MAG: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let m = MAG[(n & 7) as usize];
    if n & 8 != 0 {
        -m
    } else {
        m
    }
}

/// E8M0: 2^(e - 127); 255 is NaN.
pub fn dec_e8m0(e: u8) -> f64 {
    if e == 255 {
        f64::NAN
    } else {
        2f64.powi(e as i32 - 127)
    }
}

pub fn dec_fp8(d: QDtype, v: u8) -> f64 {
    match d {
        QDtype::Fp8E4m3 => dec_e4m3(v),
        QDtype::Fp8E4m3Fnuz => dec_e4m3_fnuz(v),
        QDtype::Bf16 => unreachable!(),
    }
}

/// A random FP8 code with exponent field in lo..=hi, or (1 in 8) a subnormal
/// or zero; never a NaN code.
pub fn rand_fp8(rng: &mut Rng, fnuz: bool, lo: u64, hi: u64) -> u8 {
    let sign = rng.range(0, 1) as u8;
    let e = if rng.range(0, 7) == 0 {
        0
    } else {
        rng.range(lo, hi) as u8
    };
    let m = rng.range(0, 7) as u8;
    let mut v = (sign << 7) | (e << 3) | m;
    if !fnuz && e == 15 && m == 7 {
        v &= !1; // S.1111.110 = ±448
    }
    if fnuz && v == 0x80 {
        v = 0; // not the NaN code
    }
    v
}

// ---- Cases ------------------------------------------------------------------

/// One test case: plan settings and sequence shapes.
#[derive(Clone, Debug)]
pub struct Case {
    pub heads: usize,
    pub page_size: usize,
    pub q_dtype: QDtype,
    pub kv_dtype: KvDtype,
    pub q_lens: Vec<usize>,
    pub kv_lens: Vec<usize>,
    /// Unreferenced pages added to the cache (filled with NaN).
    pub extra_pages: usize,
    /// Use a shuffled page table (`kv_indices`); else the identity.
    pub paged: bool,
    /// Pass kv_last_page_len; else every kv_len must be a multiple of page_size.
    pub last_page_len: bool,
    pub sm_scale: f32,
    pub logit_cap: f32,
    pub q_scale: f32,
    pub kv_scale: f32,
    /// MXFP4 scale stride (0 = 18).
    pub scale_stride: usize,
    pub num_splits: i32,
    pub deterministic: bool,
    pub num_threads: i32,
    /// Amplitude of bf16 Q values.
    pub q_amp: f64,
    pub with_lse: bool,
    pub seed: u64,
}

impl Case {
    pub fn new(heads: usize, page_size: usize, q_dtype: QDtype, kv_dtype: KvDtype) -> Case {
        Case {
            heads,
            page_size,
            q_dtype,
            kv_dtype,
            q_lens: vec![1, 1, 1, 1],
            kv_lens: vec![1, 37, 100, 130],
            extra_pages: 3,
            paged: true,
            last_page_len: true,
            sm_scale: 0.0,
            logit_cap: 0.0,
            q_scale: 1.0,
            kv_scale: 1.0,
            scale_stride: 0,
            num_splits: 0,
            deterministic: false,
            num_threads: 0,
            q_amp: 4.0,
            with_lse: true,
            seed: 1,
        }
    }

    pub fn plan(&self) -> Plan {
        let max_q = self.q_lens.iter().copied().max().unwrap_or(1).max(1);
        PlanBuilder::new(self.heads as i32)
            .q_dtype(self.q_dtype)
            .kv_dtype(self.kv_dtype)
            .page_size(self.page_size as i32)
            .max_batch_size(self.q_lens.len().max(1) as i32)
            .max_q_len(max_q as i32)
            .sm_scale(self.sm_scale)
            .logit_cap(self.logit_cap)
            .num_splits(self.num_splits)
            .deterministic(self.deterministic)
            .num_threads(self.num_threads)
            .backend(Backend::Cpu)
            .build()
            .expect("plan")
    }

    pub fn effective_sm_scale(&self) -> f64 {
        if self.sm_scale == 0.0 {
            (1.0f32 / (DQK as f32).sqrt()) as f64
        } else {
            self.sm_scale as f64
        }
    }

    pub fn stride(&self) -> usize {
        if self.scale_stride == 0 {
            18
        } else {
            self.scale_stride
        }
    }
}

/// Generated inputs of a case.
pub struct Data {
    pub qo_indptr: Vec<i32>,
    pub kv_indptr: Vec<i32>,
    pub last_page_len: Option<Vec<i32>>,
    pub kv_indices: Option<Vec<i32>>,
    pub num_pages: usize,
    pub q16: Vec<u16>,
    pub q8: Vec<u8>,
    pub kv16: Vec<u16>,
    pub kv8: Vec<u8>,
    pub scales: Vec<u8>,
}

impl Data {
    pub fn total_q(&self) -> usize {
        *self.qo_indptr.last().unwrap() as usize
    }

    pub fn batch(&self) -> Batch<'_> {
        Batch {
            qo_indptr: &self.qo_indptr,
            kv_indptr: &self.kv_indptr,
            kv_last_page_len: self.last_page_len.as_deref(),
        }
    }

    pub fn q_data(&self, c: &Case) -> QData<'_> {
        match c.q_dtype {
            QDtype::Bf16 => QData::Bf16(&self.q16),
            _ => QData::Fp8(&self.q8),
        }
    }

    pub fn kv_data(&self, c: &Case) -> KvData<'_> {
        match c.kv_dtype {
            KvDtype::Bf16 => KvData::Bf16(&self.kv16),
            KvDtype::Fp8E4m3 | KvDtype::Fp8E4m3Fnuz => KvData::Fp8(&self.kv8),
            KvDtype::Mxfp4 => KvData::Mxfp4 {
                data: &self.kv8,
                scales: &self.scales,
                scale_stride: c.scale_stride,
            },
        }
    }

    /// Physical row (page * page_size + slot) of token j of sequence b.
    pub fn row_of(&self, c: &Case, b: usize, j: usize) -> usize {
        let slot = self.kv_indptr[b] as usize + j / c.page_size;
        let page = match &self.kv_indices {
            Some(ix) => ix[slot] as usize,
            None => slot,
        };
        page * c.page_size + j % c.page_size
    }

    /// Decoded KV row (576 values, dequant scales applied) at a physical row.
    pub fn kv_row(&self, c: &Case, row: usize) -> Vec<f64> {
        match c.kv_dtype {
            KvDtype::Bf16 => self.kv16[row * DQK..(row + 1) * DQK]
                .iter()
                .map(|&h| dec_bf16(h))
                .collect(),
            KvDtype::Fp8E4m3 => self.kv8[row * DQK..(row + 1) * DQK]
                .iter()
                .map(|&v| dec_e4m3(v) * c.kv_scale as f64)
                .collect(),
            KvDtype::Fp8E4m3Fnuz => self.kv8[row * DQK..(row + 1) * DQK]
                .iter()
                .map(|&v| dec_e4m3_fnuz(v) * c.kv_scale as f64)
                .collect(),
            KvDtype::Mxfp4 => {
                let bytes = &self.kv8[row * DQK / 2..(row + 1) * DQK / 2];
                let sc = &self.scales[row * c.stride()..row * c.stride() + 18];
                (0..DQK)
                    .map(|e| {
                        let byte = bytes[e / 2];
                        let nib = if e % 2 == 0 { byte & 0xf } else { byte >> 4 };
                        dec_e2m1(nib) * dec_e8m0(sc[e / 32])
                    })
                    .collect()
            }
        }
    }

    /// Decoded q row of token t, head h.
    pub fn q_row(&self, c: &Case, t: usize, h: usize) -> Vec<f64> {
        let off = (t * c.heads + h) * DQK;
        match c.q_dtype {
            QDtype::Bf16 => self.q16[off..off + DQK].iter().map(|&v| dec_bf16(v)).collect(),
            d => self.q8[off..off + DQK]
                .iter()
                .map(|&v| dec_fp8(d, v) * c.q_scale as f64)
                .collect(),
        }
    }
}

/// NaN bit patterns used to poison memory that must not be read.
fn poison(c: &Case, d: &mut Data, row: usize) {
    match c.kv_dtype {
        KvDtype::Bf16 => d.kv16[row * DQK..(row + 1) * DQK].fill(0x7fc0),
        KvDtype::Fp8E4m3 => d.kv8[row * DQK..(row + 1) * DQK].fill(0x7f),
        KvDtype::Fp8E4m3Fnuz => d.kv8[row * DQK..(row + 1) * DQK].fill(0x80),
        KvDtype::Mxfp4 => {
            let s = c.stride();
            d.scales[row * s..(row + 1) * s].fill(0xff);
        }
    }
}

pub fn generate(c: &Case) -> Data {
    assert_eq!(c.q_lens.len(), c.kv_lens.len());
    let mut rng = Rng::new(c.seed);
    let ps = c.page_size;
    let mut qo_indptr = vec![0i32];
    let mut kv_indptr = vec![0i32];
    let mut lpl = Vec::new();
    for (&n, &l) in c.q_lens.iter().zip(&c.kv_lens) {
        let pages = (l + ps - 1) / ps;
        qo_indptr.push(qo_indptr.last().unwrap() + n as i32);
        kv_indptr.push(kv_indptr.last().unwrap() + pages as i32);
        if !c.last_page_len {
            assert_eq!(l % ps, 0, "kv_len must be whole pages without kv_last_page_len");
        }
        lpl.push(if pages == 0 { 1 } else { (l - (pages - 1) * ps) as i32 });
    }
    let used_pages = *kv_indptr.last().unwrap() as usize;
    let num_pages = used_pages + c.extra_pages;
    let kv_indices = if c.paged {
        let mut all: Vec<i32> = (0..num_pages as i32).collect();
        rng.shuffle(&mut all);
        all.truncate(used_pages);
        Some(all)
    } else {
        None
    };
    let total_q = *qo_indptr.last().unwrap() as usize;
    let rows = num_pages * ps;

    let mut d = Data {
        qo_indptr,
        kv_indptr,
        last_page_len: if c.last_page_len { Some(lpl) } else { None },
        kv_indices,
        num_pages,
        q16: Vec::new(),
        q8: Vec::new(),
        kv16: Vec::new(),
        kv8: Vec::new(),
        scales: Vec::new(),
    };
    let nq = total_q * c.heads * DQK;
    match c.q_dtype {
        QDtype::Bf16 => d.q16 = (0..nq).map(|_| mla::f32_to_bf16(rng.uniform(c.q_amp) as f32)).collect(),
        QDtype::Fp8E4m3 => d.q8 = (0..nq).map(|_| rand_fp8(&mut rng, false, 4, 9)).collect(),
        QDtype::Fp8E4m3Fnuz => d.q8 = (0..nq).map(|_| rand_fp8(&mut rng, true, 5, 10)).collect(),
    }
    match c.kv_dtype {
        KvDtype::Bf16 => {
            d.kv16 = (0..rows * DQK)
                .map(|_| mla::f32_to_bf16(rng.uniform(1.0) as f32))
                .collect()
        }
        KvDtype::Fp8E4m3 => d.kv8 = (0..rows * DQK).map(|_| rand_fp8(&mut rng, false, 3, 8)).collect(),
        KvDtype::Fp8E4m3Fnuz => d.kv8 = (0..rows * DQK).map(|_| rand_fp8(&mut rng, true, 4, 9)).collect(),
        KvDtype::Mxfp4 => {
            d.kv8 = (0..rows * DQK / 2).map(|_| rng.next_u64() as u8).collect();
            let s = c.stride();
            d.scales = vec![0xff; rows * s]; // padding beyond 18 stays NaN
            for r in 0..rows {
                for k in 0..18 {
                    d.scales[r * s + k] = rng.range(124, 128) as u8;
                }
            }
        }
    }
    // Poison every row no sequence owns: unreferenced pages and the tails of
    // last pages.
    let mut owned = vec![false; rows];
    for b in 0..c.kv_lens.len() {
        for j in 0..c.kv_lens[b] {
            owned[d.row_of(c, b, j)] = true;
        }
    }
    for (r, &o) in owned.iter().enumerate() {
        if !o {
            poison(c, &mut d, r);
        }
    }
    d
}

// ---- Reference --------------------------------------------------------------

/// DESIGN §1 in float64: returns out[total_q, heads, 512] and lse[total_q, heads].
pub fn reference(c: &Case, d: &Data) -> (Vec<f64>, Vec<f64>) {
    let total_q = d.total_q();
    let mut out = vec![0.0f64; total_q * c.heads * DV];
    let mut lse = vec![f64::NEG_INFINITY; total_q * c.heads];
    let scale = c.effective_sm_scale();
    let cap = c.logit_cap as f64;
    for b in 0..c.kv_lens.len() {
        let l = c.kv_lens[b];
        let n = c.q_lens[b];
        let keys: Vec<Vec<f64>> = (0..l).map(|j| d.kv_row(c, d.row_of(c, b, j))).collect();
        for i in 0..n {
            let t = d.qo_indptr[b] as usize + i;
            // Visible keys: j <= L - n + i.
            let visible = (l as i64 - n as i64 + i as i64 + 1).clamp(0, l as i64) as usize;
            for h in 0..c.heads {
                let r = t * c.heads + h;
                if visible == 0 {
                    continue; // zeros and -inf
                }
                let q = d.q_row(c, t, h);
                let s: Vec<f64> = keys[..visible]
                    .iter()
                    .map(|k| {
                        let mut s = scale * q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>();
                        if cap > 0.0 {
                            s = cap * (s / cap).tanh();
                        }
                        s
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let sum: f64 = w.iter().sum();
                for (j, wj) in w.iter().enumerate() {
                    let p = wj / sum;
                    for e in 0..DV {
                        out[r * DV + e] += p * keys[j][e];
                    }
                }
                lse[r] = m + sum.ln();
            }
        }
    }
    (out, lse)
}

// ---- Running and checking ------------------------------------------------------

/// Sentinel left in output space beyond the rows of the batch.
pub const OUT_SENTINEL: u16 = 0x7fc1;
pub const LSE_SENTINEL: f32 = 12345.5;
pub const TAIL: usize = 37;

/// Output of one execute.
pub struct Output {
    pub out: Vec<u16>,
    pub lse: Vec<f32>,
}

/// Builds metadata and executes; out/lse have TAIL extra sentinel elements.
pub fn run(plan: &mut Plan, c: &Case, d: &Data) -> Output {
    plan.build_metadata(&d.batch()).expect("build_metadata");
    let rows = d.total_q() * c.heads;
    let mut out = vec![OUT_SENTINEL; rows * DV + TAIL];
    let mut lse = vec![LSE_SENTINEL; rows + TAIL];
    plan.execute(&mut Tensors {
        q: d.q_data(c),
        kv: d.kv_data(c),
        kv_indices: d.kv_indices.as_deref(),
        q_scale: c.q_scale,
        kv_scale: c.kv_scale,
        out: &mut out,
        lse: if c.with_lse { Some(&mut lse) } else { None },
    })
    .expect("execute");
    Output { out, lse }
}

/// Tolerance for bf16 output: |got - ref| <= 2^-7 |ref| + atol.
pub fn check_close(c: &Case, d: &Data, got: &Output, ref_out: &[f64], ref_lse: &[f64], atol: f64) {
    let rows = d.total_q() * c.heads;
    let mut worst = (0.0f64, 0usize);
    for i in 0..rows * DV {
        let g = mla::bf16_to_f32(got.out[i]) as f64;
        let r = ref_out[i];
        let tol = r.abs() / 128.0 + atol;
        let err = (g - r).abs();
        if !(err <= tol) {
            let row = i / DV;
            panic!(
                "{:?}\nout mismatch at token {} head {} elem {}: got {} ref {} (|d| {} > tol {})",
                c,
                row / c.heads,
                row % c.heads,
                i % DV,
                g,
                r,
                err,
                tol
            );
        }
        if err / tol > worst.0 {
            worst = (err / tol, i);
        }
    }
    assert!(
        got.out[rows * DV..].iter().all(|&v| v == OUT_SENTINEL),
        "out written beyond the batch's rows"
    );
    if c.with_lse {
        for r in 0..rows {
            let g = got.lse[r] as f64;
            let e = ref_lse[r];
            if e == f64::NEG_INFINITY {
                assert_eq!(g, f64::NEG_INFINITY, "lse[{}] = {}, expected -inf ({:?})", r, g, c);
            } else {
                let tol = 1e-4 * e.abs().max(1.0);
                assert!((g - e).abs() <= tol, "lse[{}] = {} ref {} ({:?})", r, g, e, c);
            }
        }
        assert!(
            got.lse[rows..].iter().all(|&v| v == LSE_SENTINEL),
            "lse written beyond the batch's rows"
        );
    } else {
        assert!(got.lse.iter().all(|&v| v == LSE_SENTINEL));
    }
}

/// Default absolute tolerance: 2^-10 of the largest reference magnitude.
pub fn default_atol(ref_out: &[f64]) -> f64 {
    let m = ref_out.iter().fold(0.0f64, |a, &b| a.max(b.abs()));
    m / 1024.0 + 1e-6
}

/// Generate, run, compare with the reference.
pub fn run_case(c: &Case) {
    let d = generate(c);
    let mut plan = c.plan();
    let got = run(&mut plan, c, &d);
    let (ro, rl) = reference(c, &d);
    check_close(c, &d, &got, &ro, &rl, default_atol(&ro));
}
