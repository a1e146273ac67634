//! Smoke tests of the raw declarations against the linked library.

use mla_sys::*;
use std::ffi::CStr;

#[test]
fn version_matches_header() {
    let v = unsafe { mla_version() };
    assert_eq!(v as u32, MLA_VERSION);
}

#[test]
fn init_fills_struct_size() {
    unsafe {
        let mut d: mla_plan_desc = std::mem::zeroed();
        assert_eq!(mla_plan_desc_init(&mut d), mla_status::MLA_SUCCESS);
        assert_eq!(d.struct_size, std::mem::size_of::<mla_plan_desc>());
        let mut b: mla_batch = std::mem::zeroed();
        assert_eq!(mla_batch_init(&mut b), mla_status::MLA_SUCCESS);
        assert_eq!(b.struct_size, std::mem::size_of::<mla_batch>());
        let mut t: mla_tensors = std::mem::zeroed();
        assert_eq!(mla_tensors_init(&mut t), mla_status::MLA_SUCCESS);
        assert_eq!(t.struct_size, std::mem::size_of::<mla_tensors>());
    }
}

#[test]
fn null_desc_is_refused() {
    unsafe {
        let mut plan: *mut mla_plan = std::ptr::null_mut();
        let s = mla_plan_create(std::ptr::null(), &mut plan);
        assert_eq!(s, mla_status::MLA_ERROR_NULL_POINTER);
        assert!(plan.is_null());
        let name = CStr::from_ptr(mla_status_string(s)).to_str().unwrap();
        assert_eq!(name, "MLA_ERROR_NULL_POINTER");
        let msg = CStr::from_ptr(mla_last_error_message()).to_str().unwrap();
        assert!(msg.contains("desc"), "message {:?}", msg);
        mla_plan_destroy(std::ptr::null_mut());
    }
}

#[test]
fn cpu_plan_roundtrip() {
    unsafe {
        let mut d: mla_plan_desc = std::mem::zeroed();
        mla_plan_desc_init(&mut d);
        d.num_heads = 16;
        d.backend = mla_backend::MLA_BACKEND_CPU;
        let mut plan: *mut mla_plan = std::ptr::null_mut();
        assert_eq!(mla_plan_create(&d, &mut plan), mla_status::MLA_SUCCESS);
        assert!(!plan.is_null());
        let mut be = mla_backend(99);
        assert_eq!(mla_plan_backend(plan, &mut be), mla_status::MLA_SUCCESS);
        assert_eq!(be, mla_backend::MLA_BACKEND_CPU);
        mla_plan_destroy(plan);
    }
}
