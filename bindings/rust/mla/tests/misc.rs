//! Status mirror, versions, ownership (Drop, Send), threads, empty batches,
//! the bf16 helpers.

mod common;
use common::*;
use mla::{Backend, Batch, KvData, KvDtype, PlanBuilder, QData, QDtype, Status, Tensors};

#[test]
fn status_mirrors_c_enum() {
    let all = [
        Status::Success,
        Status::NullPointer,
        Status::StructSize,
        Status::InvalidValue,
        Status::UnsupportedDtype,
        Status::InvalidIndptr,
        Status::InvalidLastPageLen,
        Status::PageOutOfRange,
        Status::LimitExceeded,
        Status::NoMetadata,
        Status::BackendUnavailable,
        Status::InvalidDevice,
        Status::DeviceRuntime,
        Status::OutOfMemory,
        Status::Misaligned,
        Status::WorkspaceTooSmall,
        Status::DeviceValidationFailed,
        Status::Internal,
    ];
    for (i, s) in all.iter().enumerate() {
        assert_eq!(s.to_raw(), i as i32);
        assert_eq!(Status::from_raw(i as i32), *s);
        assert!(s.name().starts_with("MLA_"), "{}", s.name());
        assert_eq!(s.to_string(), s.name());
    }
    assert_eq!(Status::NullPointer.name(), "MLA_ERROR_NULL_POINTER");
    assert_eq!(Status::Internal.name(), "MLA_ERROR_INTERNAL");
    assert_eq!(Status::from_raw(1000), Status::Unknown(1000));
    assert_eq!(Status::Unknown(1000).to_raw(), 1000);
    assert_eq!(Status::Unknown(1000).name(), "MLA_STATUS_UNKNOWN");
    assert!(Status::Success.is_success() && !Status::Internal.is_success());
}

#[test]
fn versions_agree() {
    assert_eq!(mla::version(), mla::HEADER_VERSION);
    assert_eq!(mla::version().to_string(), "0.1.0");
}

#[test]
fn drop_destroys_many_plans() {
    for i in 0..200 {
        let p = PlanBuilder::new(1 + (i % 128))
            .page_size(1 << (i % 9))
            .max_batch_size(8)
            .backend(Backend::Cpu)
            .num_threads(1)
            .build()
            .unwrap();
        assert_eq!(p.num_heads(), (1 + i % 128) as usize);
        assert_eq!(p.page_size(), 1 << (i % 9));
        drop(p);
    }
    // Resolved defaults.
    let p = PlanBuilder::new(16).backend(Backend::Cpu).build().unwrap();
    assert_eq!((p.page_size(), p.max_batch_size(), p.max_q_len()), (1, 256, 1));
    assert_eq!(p.q_dtype(), QDtype::Bf16);
    assert_eq!(p.kv_dtype(), KvDtype::Bf16);
    assert!(format!("{:?}", p).contains("num_heads: 16"));
    assert!(!p.as_raw().is_null());
}

#[test]
fn plan_moves_to_another_thread() {
    let c = Case::new(16, 16, QDtype::Bf16, KvDtype::Fp8E4m3);
    let mut plan = c.plan();
    let h = std::thread::spawn(move || {
        let d = generate(&c);
        let got = run(&mut plan, &c, &d);
        let (ro, rl) = reference(&c, &d);
        check_close(&c, &d, &got, &ro, &rl, default_atol(&ro));
        plan // and back
    });
    let plan = h.join().unwrap();
    assert_eq!(plan.total_q(), Some(4));
}

#[test]
fn different_plans_run_concurrently() {
    let handles: Vec<_> = (0..4u64)
        .map(|i| {
            std::thread::spawn(move || {
                let mut c = Case::new(
                    8,
                    16,
                    QDtype::Bf16,
                    if i % 2 == 0 { KvDtype::Bf16 } else { KvDtype::Mxfp4 },
                );
                c.seed = 40 + i;
                c.num_threads = 1;
                for _ in 0..3 {
                    run_case(&c);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn empty_batches() {
    let mut plan = PlanBuilder::new(16)
        .page_size(16)
        .backend(Backend::Cpu)
        .build()
        .unwrap();
    // No sequences at all, empty slices everywhere.
    plan.build_metadata(&Batch {
        qo_indptr: &[0],
        kv_indptr: &[0],
        kv_last_page_len: None,
    })
    .unwrap();
    assert_eq!(plan.total_q(), Some(0));
    let mut out: Vec<u16> = Vec::new();
    plan.execute(&mut Tensors::new(QData::Bf16(&[]), KvData::Bf16(&[]), &mut out))
        .unwrap();

    // Queries but no cached tokens: zeros and -inf, with an empty cache.
    plan.build_metadata(&Batch {
        qo_indptr: &[0, 1, 2],
        kv_indptr: &[0, 0, 0],
        kv_last_page_len: None,
    })
    .unwrap();
    let q = vec![mla::f32_to_bf16(1.0); 2 * 16 * DQK];
    let mut out = vec![0x1234u16; 2 * 16 * DV];
    let mut lse = vec![0f32; 2 * 16];
    let mut t = Tensors::new(QData::Bf16(&q), KvData::Bf16(&[]), &mut out);
    t.lse = Some(&mut lse);
    plan.execute(&mut t).unwrap();
    assert!(out.iter().all(|&o| o == 0 || o == 0x8000), "L = 0 must write zeros");
    assert!(lse.iter().all(|&l| l == f32::NEG_INFINITY));
}

#[test]
fn bf16_helpers() {
    let xs = [0.0f32, 1.0, -1.5, 3.140625, 1e-3, 65504.0];
    let h = mla::f32_slice_to_bf16(&xs);
    let back = mla::bf16_slice_to_f32(&h);
    for (x, y) in xs.iter().zip(&back) {
        assert!((x - y).abs() <= x.abs() / 256.0, "{} -> {}", x, y);
    }
    assert_eq!(mla::f32_to_bf16(3.140625), 0x4049);
    // RNE against a float64 definition on many random finite values: of the
    // two bf16 neighbours (truncated magnitude and the next one up), the
    // nearer one, the even one on a tie.
    let mut rng = Rng::new(77);
    for _ in 0..200_000 {
        let x = f32::from_bits(rng.next_u64() as u32);
        if !x.is_finite() {
            continue;
        }
        let down = (x.to_bits() >> 16) as u16;
        let up = down + 1; // next magnitude (may be infinity)
        let xd = x as f64;
        let dd = (mla::bf16_to_f32(down) as f64 - xd).abs();
        let du = if up & 0x7fff == 0x7f80 {
            // Rounding up to infinity happens iff x is at least halfway to
            // the (virtual) next value 2^128.
            let half = (mla::bf16_to_f32(down) as f64 + 2f64.powi(128) * xd.signum()) / 2.0;
            if xd.abs() >= half.abs() {
                0.0
            } else {
                f64::INFINITY
            }
        } else {
            (mla::bf16_to_f32(up) as f64 - xd).abs()
        };
        let want = if dd < du || (dd == du && down & 1 == 0) {
            down
        } else {
            up
        };
        assert_eq!(mla::f32_to_bf16(x), want, "x = {:e} ({:#010x})", x, x.to_bits());
    }
}

#[test]
fn builder_fills_descriptor() {
    let d = PlanBuilder::new(32)
        .q_dtype(QDtype::Fp8E4m3)
        .kv_dtype(KvDtype::Fp8E4m3)
        .page_size(64)
        .max_batch_size(128)
        .max_q_len(2)
        .sm_scale(0.1)
        .logit_cap(30.0)
        .num_splits(3)
        .deterministic(true)
        .caller_workspace(true)
        .validate_device_inputs(true)
        .deterministic(false)
        .backend(Backend::Gpu)
        .device(1)
        .num_threads(4)
        .to_desc();
    assert_eq!(d.struct_size, std::mem::size_of::<mla::sys::mla_plan_desc>());
    assert_eq!(d.num_heads, 32);
    assert_eq!(d.q_dtype, mla::sys::mla_dtype::MLA_DTYPE_FP8_E4M3);
    assert_eq!(d.kv_dtype, mla::sys::mla_dtype::MLA_DTYPE_FP8_E4M3);
    assert_eq!(
        (d.page_size, d.max_batch_size, d.max_q_len, d.num_splits),
        (64, 128, 2, 3)
    );
    assert_eq!((d.sm_scale, d.logit_cap), (0.1, 30.0));
    assert_eq!(d.flags, 0b110);
    assert_eq!(d.backend, mla::sys::mla_backend::MLA_BACKEND_GPU);
    assert_eq!((d.device, d.num_threads), (1, 4));
}
