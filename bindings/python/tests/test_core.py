"""The SWIG layer (mla.core) mirrors include/mla.h."""

from __future__ import annotations

import numpy as np
import pytest

from mla import core


def test_constants_match_the_header():
    assert core.MLA_HEAD_DIM_QK == 576 and core.MLA_HEAD_DIM_V == 512
    assert core.MLA_MAX_HEADS == 128 and core.MLA_MAX_Q_LEN == 8 and core.MLA_MAX_PAGE_SIZE == 256
    assert core.MLA_MXFP4_SCALES_PER_ROW == 18 and core.MLA_MXFP4_BLOCK == 32
    assert core.MLA_VERSION == core.mla_version()
    assert core.MLA_VERSION == core.MLA_VERSION_MAJOR * 10000 + core.MLA_VERSION_MINOR * 100 + core.MLA_VERSION_PATCH
    assert core.MLA_FLAG_CALLER_WORKSPACE == 4 and core.MLA_DTYPE_MXFP4 == 4 and core.MLA_ERROR_INTERNAL == 17


def test_struct_init_and_fields():
    d = core.mla_plan_desc()
    assert core.mla_plan_desc_init(d) == core.MLA_SUCCESS
    assert d.struct_size > 0 and d.num_heads == 0
    t = core.mla_tensors()
    core.mla_tensors_init(t)
    assert t.q == 0 and t.lse == 0
    t.q = 0x1000
    t.kv = np.int64(0x2000)
    t.lse = None
    assert (t.q, t.kv, t.lse) == (0x1000, 0x2000, 0)
    with pytest.raises(TypeError, match="expected an address"):
        t.out = "nope"
    b = core.mla_batch()
    core.mla_batch_init(b)
    a = np.array([0, 1], np.int32)
    b.qo_indptr = a.ctypes.data
    assert b.qo_indptr == a.ctypes.data


def test_plan_round_trip():
    d = core.mla_plan_desc()
    core.mla_plan_desc_init(d)
    d.num_heads = 16
    d.backend = core.MLA_BACKEND_CPU
    status, plan = core.mla_plan_create(d)
    assert status == core.MLA_SUCCESS and plan is not None and int(plan) != 0
    status, nbytes = core.mla_plan_workspace_size(plan)
    assert status == 0 and nbytes >= 0
    assert core.mla_plan_backend(plan) == [0, core.MLA_BACKEND_CPU]
    t = core.mla_tensors()
    core.mla_tensors_init(t)
    assert core.mla_plan_execute(plan, t, None) == core.MLA_ERROR_NO_METADATA
    assert "mla_plan_build_metadata" in core.mla_last_error_message()
    assert core.mla_status_string(core.MLA_ERROR_NO_METADATA) == "MLA_ERROR_NO_METADATA"
    core.mla_plan_destroy(plan)
    core.mla_plan_destroy(None)  # NULL is a no-op


def test_create_failure_returns_none():
    d = core.mla_plan_desc()
    core.mla_plan_desc_init(d)
    status, plan = core.mla_plan_create(d)  # num_heads 0
    assert status == core.MLA_ERROR_INVALID_VALUE and plan is None
    assert "num_heads" in core.mla_last_error_message()
    assert core.mla_plan_create(None)[0] == core.MLA_ERROR_NULL_POINTER
