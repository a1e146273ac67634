//! Every error path: the right Status, the right origin, and a message that
//! names the offending argument.

mod common;
use common::*;
use mla::{
    Backend, Batch, Error, KvData, KvDtype, Origin, Plan, PlanBuilder, QData, QDtype, RawTensors, Status, Tensors,
};

fn expect_err<T: std::fmt::Debug>(r: mla::Result<T>, status: Status, origin: Origin, needle: &str) -> Error {
    let e = r.expect_err("expected an error");
    assert_eq!(e.status(), status, "wrong status: {}", e);
    assert_eq!(e.origin(), origin, "wrong origin: {}", e);
    assert!(
        e.message().contains(needle),
        "message {:?} does not mention {:?}",
        e.message(),
        needle
    );
    assert!(e.to_string().starts_with(status.name()), "{}", e);
    e
}

fn lib_err<T: std::fmt::Debug>(r: mla::Result<T>, status: Status, needle: &str) -> Error {
    expect_err(r, status, Origin::Library, needle)
}

fn rust_err<T: std::fmt::Debug>(r: mla::Result<T>, status: Status, needle: &str) -> Error {
    expect_err(r, status, Origin::Binding, needle)
}

fn cpu(heads: i32) -> PlanBuilder {
    PlanBuilder::new(heads).backend(Backend::Cpu)
}

#[test]
fn bad_dimensions() {
    lib_err(cpu(0).build(), Status::InvalidValue, "num_heads");
    lib_err(cpu(129).build(), Status::InvalidValue, "num_heads");
    lib_err(cpu(-1).build(), Status::InvalidValue, "num_heads");
    lib_err(cpu(16).page_size(3).build(), Status::InvalidValue, "page_size");
    lib_err(cpu(16).page_size(512).build(), Status::InvalidValue, "page_size");
    lib_err(cpu(16).max_q_len(9).build(), Status::InvalidValue, "max_q_len");
    lib_err(
        cpu(16).max_batch_size(-5).build(),
        Status::InvalidValue,
        "max_batch_size",
    );
    lib_err(cpu(16).num_splits(65).build(), Status::InvalidValue, "num_splits");
    lib_err(cpu(16).sm_scale(-1.0).build(), Status::InvalidValue, "sm_scale");
    lib_err(cpu(16).sm_scale(f32::NAN).build(), Status::InvalidValue, "sm_scale");
    lib_err(cpu(16).logit_cap(-2.0).build(), Status::InvalidValue, "logit_cap");
    lib_err(cpu(16).num_threads(-1).build(), Status::InvalidValue, "num_threads");
    lib_err(cpu(16).flags(1 << 20).build(), Status::InvalidValue, "flags");
    lib_err(cpu(16).device(-1).build(), Status::InvalidDevice, "device");
    // The message is also what mla_last_error_message() says on this thread.
    let e = cpu(0).build().unwrap_err();
    assert_eq!(mla::last_error_message(), e.message());
    // Boundaries are accepted.
    cpu(1).page_size(1).build().unwrap();
    cpu(128)
        .page_size(256)
        .max_q_len(8)
        .num_splits(64)
        .max_batch_size(2)
        .build()
        .unwrap();
}

#[test]
fn unsupported_dtype_pair() {
    lib_err(
        cpu(16).q_dtype(QDtype::Fp8E4m3).kv_dtype(KvDtype::Fp8E4m3Fnuz).build(),
        Status::UnsupportedDtype,
        "q_dtype",
    );
    lib_err(
        cpu(16).q_dtype(QDtype::Fp8E4m3Fnuz).kv_dtype(KvDtype::Fp8E4m3).build(),
        Status::UnsupportedDtype,
        "FP8",
    );
    // Mixed-format pairs that are supported.
    cpu(16)
        .q_dtype(QDtype::Fp8E4m3)
        .kv_dtype(KvDtype::Mxfp4)
        .build()
        .unwrap();
    cpu(16)
        .q_dtype(QDtype::Fp8E4m3Fnuz)
        .kv_dtype(KvDtype::Bf16)
        .build()
        .unwrap();
}

fn batch<'a>(qo: &'a [i32], kv: &'a [i32], lpl: Option<&'a [i32]>) -> Batch<'a> {
    Batch {
        qo_indptr: qo,
        kv_indptr: kv,
        kv_last_page_len: lpl,
    }
}

#[test]
fn bad_indptr() {
    let mut p = cpu(16).page_size(16).max_q_len(2).build().unwrap();
    lib_err(
        p.build_metadata(&batch(&[1, 2], &[0, 1], None)),
        Status::InvalidIndptr,
        "qo_indptr",
    );
    lib_err(
        p.build_metadata(&batch(&[0, 1], &[2, 3], None)),
        Status::InvalidIndptr,
        "kv_indptr",
    );
    lib_err(
        p.build_metadata(&batch(&[0, 1, 0], &[0, 1, 2], None)),
        Status::InvalidIndptr,
        "qo_indptr",
    );
    lib_err(
        p.build_metadata(&batch(&[0, 1, 2], &[0, 2, 1], None)),
        Status::InvalidIndptr,
        "kv_indptr",
    );
    // Slice lengths that disagree are refused before C.
    rust_err(
        p.build_metadata(&batch(&[], &[], None)),
        Status::InvalidValue,
        "qo_indptr",
    );
    rust_err(
        p.build_metadata(&batch(&[0, 1, 2], &[0, 1], None)),
        Status::InvalidValue,
        "kv_indptr",
    );
    rust_err(
        p.build_metadata(&batch(&[0, 1], &[0, 1], Some(&[1, 1]))),
        Status::InvalidValue,
        "kv_last_page_len",
    );
    // A failed build leaves the plan without metadata.
    assert_eq!(p.total_q(), None);
    p.build_metadata(&batch(&[0, 1], &[0, 1], None)).unwrap();
    assert_eq!(p.total_q(), Some(1));
    let _ = p.build_metadata(&batch(&[1, 1], &[0, 1], None));
    assert_eq!(p.total_q(), None);
}

#[test]
fn last_page_len_out_of_range() {
    let mut p = cpu(16).page_size(16).build().unwrap();
    lib_err(
        p.build_metadata(&batch(&[0, 1], &[0, 2], Some(&[0]))),
        Status::InvalidLastPageLen,
        "kv_last_page_len",
    );
    lib_err(
        p.build_metadata(&batch(&[0, 1], &[0, 2], Some(&[17]))),
        Status::InvalidLastPageLen,
        "kv_last_page_len",
    );
    lib_err(
        p.build_metadata(&batch(&[0, 1], &[0, 1], Some(&[-3]))),
        Status::InvalidLastPageLen,
        "kv_last_page_len",
    );
    p.build_metadata(&batch(&[0, 1], &[0, 2], Some(&[16]))).unwrap();
}

#[test]
fn batch_above_limits() {
    let mut p = cpu(16).max_batch_size(2).max_q_len(2).build().unwrap();
    lib_err(
        p.build_metadata(&batch(&[0, 1, 2, 3], &[0, 1, 2, 3], None)),
        Status::LimitExceeded,
        "max_batch_size",
    );
    lib_err(
        p.build_metadata(&batch(&[0, 3], &[0, 4], None)),
        Status::LimitExceeded,
        "max_q_len",
    );
    p.build_metadata(&batch(&[0, 2, 4], &[0, 4, 8], None)).unwrap();
}

/// A small valid setup: 16 heads, page 16, 2 sequences of lengths 20 and 5.
struct Setup {
    plan: Plan,
    c: Case,
    d: Data,
}

fn setup(q: QDtype, kv: KvDtype) -> Setup {
    let mut c = Case::new(16, 16, q, kv);
    c.q_lens = vec![1, 1];
    c.kv_lens = vec![20, 5];
    c.extra_pages = 1;
    let d = generate(&c);
    let mut plan = c.plan();
    plan.build_metadata(&d.batch()).unwrap();
    Setup { plan, c, d }
}

fn out_len(s: &Setup) -> usize {
    s.d.total_q() * s.c.heads * DV
}

#[test]
fn execute_before_metadata() {
    let s = setup(QDtype::Bf16, KvDtype::Bf16);
    let mut fresh = s.c.plan();
    let mut out = vec![0u16; out_len(&s)];
    rust_err(
        fresh.execute(&mut Tensors::new(s.d.q_data(&s.c), s.d.kv_data(&s.c), &mut out)),
        Status::NoMetadata,
        "build_metadata",
    );
    // The library's own check, reached through the raw API.
    let raw = RawTensors {
        q: s.d.q16.as_ptr().cast(),
        kv: s.d.kv16.as_ptr().cast(),
        out: out.as_mut_ptr().cast(),
        ..Default::default()
    };
    lib_err(
        unsafe { fresh.execute_raw(&raw, std::ptr::null_mut()) },
        Status::NoMetadata,
        "metadata",
    );
    // And after a failed build_metadata.
    let mut p = s.c.plan();
    let _ = p.build_metadata(&batch(&[0, 1], &[0, 1], Some(&[99])));
    rust_err(
        p.execute(&mut Tensors::new(s.d.q_data(&s.c), s.d.kv_data(&s.c), &mut out)),
        Status::NoMetadata,
        "build_metadata",
    );
}

#[test]
fn page_out_of_range() {
    let mut s = setup(QDtype::Bf16, KvDtype::Bf16);
    let n = out_len(&s);
    let mut out = vec![0u16; n];
    let num_pages = s.d.num_pages as i32;
    for bad in [num_pages, num_pages + 100, -1] {
        let mut idx = s.d.kv_indices.clone().unwrap();
        idx[1] = bad;
        let mut t = Tensors::new(s.d.q_data(&s.c), s.d.kv_data(&s.c), &mut out);
        t.kv_indices = Some(&idx);
        lib_err(s.plan.execute(&mut t), Status::PageOutOfRange, "page");
    }
    // Identity table with a cache one page short of what the batch references
    // (3 pages referenced, 2 given).
    let kv = &s.d.kv16[..2 * 16 * DQK];
    let mut t = Tensors::new(s.d.q_data(&s.c), KvData::Bf16(kv), &mut out);
    lib_err(s.plan.execute(&mut t), Status::PageOutOfRange, "num_pages");
}

#[test]
fn short_slices_are_rust_errors() {
    let mut s = setup(QDtype::Bf16, KvDtype::Bf16);
    let n = out_len(&s);
    let rows = s.d.total_q() * 16;
    let mut out = vec![0u16; n];
    let mut short_out = vec![0u16; n - 1];
    let mut lse = vec![0f32; rows - 1];
    let q = s.d.q_data(&s.c);
    let kv = s.d.kv_data(&s.c);
    let e = rust_err(
        s.plan.execute(&mut Tensors::new(
            QData::Bf16(&s.d.q16[..s.d.q16.len() - 1]),
            kv,
            &mut out,
        )),
        Status::InvalidValue,
        "tensors.q",
    );
    assert!(e.message().contains(&format!("{}", s.d.q16.len())), "{}", e);
    rust_err(
        s.plan.execute(&mut Tensors::new(q, kv, &mut short_out)),
        Status::InvalidValue,
        "tensors.out",
    );
    let mut t = Tensors::new(q, kv, &mut out);
    t.lse = Some(&mut lse);
    rust_err(s.plan.execute(&mut t), Status::InvalidValue, "tensors.lse");
    // KV not a whole number of pages.
    rust_err(
        s.plan.execute(&mut Tensors::new(
            q,
            KvData::Bf16(&s.d.kv16[..s.d.kv16.len() - 576]),
            &mut out,
        )),
        Status::InvalidValue,
        "multiple",
    );
    // No pages at all although the batch references some.
    rust_err(
        s.plan.execute(&mut Tensors::new(q, KvData::Bf16(&[]), &mut out)),
        Status::InvalidValue,
        "no pages",
    );
    // A page table shorter than kv_indptr[batch_size].
    let idx = s.d.kv_indices.clone().unwrap();
    let mut t = Tensors::new(q, kv, &mut out);
    t.kv_indices = Some(&idx[..idx.len() - 1]);
    rust_err(s.plan.execute(&mut t), Status::InvalidValue, "kv_indices");
    // Nothing was written by the refused calls.
    assert!(out.iter().all(|&v| v == 0));
    // The full-length call works.
    let mut t = Tensors::new(q, kv, &mut out);
    t.kv_indices = Some(&idx);
    s.plan.execute(&mut t).unwrap();
}

#[test]
fn short_mxfp4_scales() {
    let mut s = setup(QDtype::Bf16, KvDtype::Mxfp4);
    let mut out = vec![0u16; out_len(&s)];
    let idx = s.d.kv_indices.clone().unwrap();
    let q = s.d.q_data(&s.c);
    let data = &s.d.kv8[..];
    let scales = &s.d.scales[..];
    let mut t = Tensors::new(
        q,
        KvData::Mxfp4 {
            data,
            scales: &scales[..scales.len() - 1],
            scale_stride: 0,
        },
        &mut out,
    );
    t.kv_indices = Some(&idx);
    rust_err(s.plan.execute(&mut t), Status::InvalidValue, "scales");
    // A stride larger than the scales array allows.
    let mut t = Tensors::new(
        q,
        KvData::Mxfp4 {
            data,
            scales,
            scale_stride: 19,
        },
        &mut out,
    );
    t.kv_indices = Some(&idx);
    rust_err(s.plan.execute(&mut t), Status::InvalidValue, "scales");
    // A stride below 18 is the library's to refuse.
    let mut t = Tensors::new(
        q,
        KvData::Mxfp4 {
            data,
            scales,
            scale_stride: 17,
        },
        &mut out,
    );
    t.kv_indices = Some(&idx);
    lib_err(s.plan.execute(&mut t), Status::InvalidValue, "kv_scale_stride");
    let mut t = Tensors::new(
        q,
        KvData::Mxfp4 {
            data,
            scales,
            scale_stride: 0,
        },
        &mut out,
    );
    t.kv_indices = Some(&idx);
    s.plan.execute(&mut t).unwrap();
}

#[test]
fn data_variant_must_match_plan_dtype() {
    let mut s = setup(QDtype::Bf16, KvDtype::Fp8E4m3);
    let mut out = vec![0u16; out_len(&s)];
    let q8 = vec![0u8; s.d.q16.len()];
    let kv16 = vec![0u16; s.d.kv8.len()];
    rust_err(
        s.plan
            .execute(&mut Tensors::new(QData::Fp8(&q8), s.d.kv_data(&s.c), &mut out)),
        Status::UnsupportedDtype,
        "q_dtype",
    );
    rust_err(
        s.plan
            .execute(&mut Tensors::new(s.d.q_data(&s.c), KvData::Bf16(&kv16), &mut out)),
        Status::UnsupportedDtype,
        "kv_dtype",
    );
    rust_err(
        s.plan.execute(&mut Tensors::new(
            s.d.q_data(&s.c),
            KvData::Mxfp4 {
                data: &s.d.kv8,
                scales: &[],
                scale_stride: 0,
            },
            &mut out,
        )),
        Status::UnsupportedDtype,
        "kv_dtype",
    );
}

#[test]
fn bad_scales_and_misalignment() {
    let mut s = setup(QDtype::Fp8E4m3, KvDtype::Fp8E4m3);
    let n = out_len(&s);
    let mut out = vec![0u16; n + 8];
    let idx = s.d.kv_indices.clone().unwrap();
    for (qs, ks, name) in [
        (-1.0f32, 1.0f32, "q_scale"),
        (f32::NAN, 1.0, "q_scale"),
        (1.0, f32::INFINITY, "kv_scale"),
    ] {
        let mut t = Tensors::new(s.d.q_data(&s.c), s.d.kv_data(&s.c), &mut out);
        t.kv_indices = Some(&idx);
        t.q_scale = qs;
        t.kv_scale = ks;
        lib_err(s.plan.execute(&mut t), Status::InvalidValue, name);
    }
    // out one element into a 16-byte aligned buffer.
    let mut t = Tensors::new(s.d.q_data(&s.c), s.d.kv_data(&s.c), &mut out[1..]);
    t.kv_indices = Some(&idx);
    lib_err(s.plan.execute(&mut t), Status::Misaligned, "out");
    // q one byte in.
    let mut q = vec![0u8; s.d.q8.len() + 16];
    q[1..1 + s.d.q8.len()].copy_from_slice(&s.d.q8);
    let mut t = Tensors::new(QData::Fp8(&q[1..]), s.d.kv_data(&s.c), &mut out[..n]);
    t.kv_indices = Some(&idx);
    lib_err(s.plan.execute(&mut t), Status::Misaligned, "q");
}

#[test]
fn caller_workspace() {
    let mut c = Case::new(16, 16, QDtype::Bf16, KvDtype::Bf16);
    c.q_lens = vec![1, 1];
    c.kv_lens = vec![300, 5];
    c.num_splits = 4; // partials need workspace
    let d = generate(&c);
    let mut plan = PlanBuilder::new(16)
        .page_size(16)
        .backend(Backend::Cpu)
        .num_splits(4)
        .caller_workspace(true)
        .build()
        .unwrap();
    let need = plan.workspace_size();
    assert!(need > 0, "a plan with forced splits needs workspace for partials");
    plan.build_metadata(&d.batch()).unwrap();
    let mut out = vec![0u16; d.total_q() * 16 * DV];
    let idx = d.kv_indices.clone().unwrap();
    if need > 0 {
        let mut t = Tensors::new(d.q_data(&c), d.kv_data(&c), &mut out);
        t.kv_indices = Some(&idx);
        lib_err(plan.execute(&mut t), Status::WorkspaceTooSmall, "workspace");
        let mut small = vec![0u8; need - 1];
        let mut t = Tensors::new(d.q_data(&c), d.kv_data(&c), &mut out);
        t.kv_indices = Some(&idx);
        lib_err(
            plan.execute_with_workspace(&mut t, &mut small),
            Status::WorkspaceTooSmall,
            "workspace_size",
        );
        let mut t = Tensors::new(d.q_data(&c), d.kv_data(&c), &mut out);
        t.kv_indices = Some(&idx);
        lib_err(
            plan.execute_with_workspace(&mut t, &mut []),
            Status::WorkspaceTooSmall,
            "workspace",
        );
    }
    let mut ws = vec![0u8; need];
    let mut t = Tensors::new(d.q_data(&c), d.kv_data(&c), &mut out);
    t.kv_indices = Some(&idx);
    plan.execute_with_workspace(&mut t, &mut ws).unwrap();
    let (ro, _) = reference(&c, &d);
    let atol = default_atol(&ro);
    for (i, &o) in out.iter().enumerate() {
        let g = mla::bf16_to_f32(o) as f64;
        assert!(
            (g - ro[i]).abs() <= ro[i].abs() / 128.0 + atol,
            "out[{}] = {} ref {}",
            i,
            g,
            ro[i]
        );
    }
}

#[test]
fn gpu_backend_without_gpu() {
    if mla::gpu_device_count() > 0 {
        eprintln!("skipped: {} GPU(s) present", mla::gpu_device_count());
        return;
    }
    // The message depends on how libmla was built (no GPU backend, or one
    // whose runtime finds no device/driver); it must say something.
    let e = lib_err(
        PlanBuilder::new(16).backend(Backend::Gpu).build(),
        Status::BackendUnavailable,
        "",
    );
    assert!(!e.message().is_empty());
    // AUTO falls back to the CPU.
    let p = PlanBuilder::new(16).build().unwrap();
    assert_eq!(p.backend(), Backend::Cpu);
}

#[test]
fn schedule_info_needs_metadata() {
    let mut p = cpu(16).page_size(16).build().unwrap();
    lib_err(p.schedule_info(), Status::NoMetadata, "metadata");
    p.build_metadata(&batch(&[0, 1, 2], &[0, 3, 4], Some(&[5, 16])))
        .unwrap();
    let info = p.schedule_info().unwrap();
    assert!(info.num_work_items >= 2, "{:?}", info);
    assert!(info.block_tokens > 0);
}
