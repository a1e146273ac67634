//! One decode step on the CPU backend: 16 heads, page size 16, bf16 Q and KV,
//! a batch of 4 sequences of different lengths with a shuffled page table.
//!
//! Run with `cargo run --offline --example decode` (from bindings/rust, with
//! PKG_CONFIG_PATH pointing at libmla, see README.md).

use mla::{bf16_to_f32, f32_to_bf16, Backend, Batch, KvData, PlanBuilder, QData, Tensors, HEAD_DIM_QK, HEAD_DIM_V};

/// A tiny xorshift64 generator: deterministic data without crates.
struct XorShift(u64);

impl XorShift {
    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

fn main() -> Result<(), mla::Error> {
    const HEADS: usize = 16;
    const PAGE: usize = 16;
    let kv_lens = [100usize, 1, 37, 256];

    let mut plan = PlanBuilder::new(HEADS as i32)
        .page_size(PAGE as i32)
        .max_batch_size(kv_lens.len() as i32)
        .backend(Backend::Cpu)
        .build()?;

    // Lengths -> CSR page offsets and last-page fills.
    let mut qo_indptr = vec![0i32];
    let mut kv_indptr = vec![0i32];
    let mut last_page_len = Vec::new();
    for &len in &kv_lens {
        let pages = (len + PAGE - 1) / PAGE;
        qo_indptr.push(qo_indptr.last().unwrap() + 1);
        kv_indptr.push(kv_indptr.last().unwrap() + pages as i32);
        last_page_len.push((len - (pages - 1) * PAGE) as i32);
    }
    let total_pages = *kv_indptr.last().unwrap() as usize;
    let total_q = *qo_indptr.last().unwrap() as usize;

    // A page table that is a permutation of the cache's pages.
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut kv_indices: Vec<i32> = (0..total_pages as i32).collect();
    for i in (1..kv_indices.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        kv_indices.swap(i, j);
    }

    let q: Vec<u16> = (0..total_q * HEADS * HEAD_DIM_QK)
        .map(|_| f32_to_bf16(rng.uniform()))
        .collect();
    let kv: Vec<u16> = (0..total_pages * PAGE * HEAD_DIM_QK)
        .map(|_| f32_to_bf16(rng.uniform()))
        .collect();
    let mut out = vec![0u16; total_q * HEADS * HEAD_DIM_V];
    let mut lse = vec![0f32; total_q * HEADS];

    plan.build_metadata(&Batch {
        qo_indptr: &qo_indptr,
        kv_indptr: &kv_indptr,
        kv_last_page_len: Some(&last_page_len),
    })?;
    plan.execute(&mut Tensors {
        q: QData::Bf16(&q),
        kv: KvData::Bf16(&kv),
        kv_indices: Some(&kv_indices),
        q_scale: 1.0,
        kv_scale: 1.0,
        out: &mut out,
        lse: Some(&mut lse),
    })?;

    let finite = out.iter().all(|&o| bf16_to_f32(o).is_finite()) && lse.iter().all(|l| l.is_finite());
    let checksum: f64 = out.iter().map(|&o| bf16_to_f32(o) as f64).sum();
    println!(
        "libmla {} decode: batch {} heads {} page {} kv_lens {:?}: out[0] = {:.6}, lse[0] = {:.6}, checksum {:.6}, finite: {}",
        mla::version(),
        kv_lens.len(),
        HEADS,
        PAGE,
        kv_lens,
        bf16_to_f32(out[0]),
        lse[0],
        checksum,
        finite
    );
    if !finite {
        eprintln!("non-finite output");
        std::process::exit(1);
    }
    Ok(())
}
