"""The C plan is destroyed exactly once: by close(), the with block, or the
garbage collector; never for a plan that failed to be created."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import mla
from mla import _plan


@pytest.fixture
def destroyed(monkeypatch):
    """Addresses passed to mla_plan_destroy during the test."""
    calls = []
    real = mla.core.mla_plan_destroy

    def counting(handle):
        calls.append(int(handle) if handle is not None else None)
        real(handle)

    monkeypatch.setattr(mla.core, "mla_plan_destroy", counting)
    return calls


def test_close_twice_destroys_once(destroyed):
    plan = mla.Plan(16, backend="cpu")
    address = int(plan.handle)
    before = _plan.destroy_count
    assert not plan.closed
    plan.close()
    plan.close()
    assert destroyed == [address]
    assert _plan.destroy_count == before + 1
    assert plan.handle is None and plan.closed
    del plan
    gc.collect()
    assert destroyed == [address]


def test_with_block_closes(destroyed):
    with mla.Plan(16, backend="cpu") as plan:
        address = int(plan.handle)
        assert destroyed == []
    assert plan.closed and destroyed == [address]
    plan.close()
    assert destroyed == [address]


def test_with_block_closes_on_exception(destroyed):
    with pytest.raises(RuntimeError):
        with mla.Plan(16, backend="cpu") as plan:
            raise RuntimeError("boom")
    assert plan.closed and len(destroyed) == 1


def test_garbage_collected_plan_is_destroyed(destroyed):
    plan = mla.Plan(16, backend="cpu")
    address = int(plan.handle)
    del plan
    gc.collect()
    assert destroyed == [address]


def test_failed_creation_destroys_nothing(destroyed):
    with pytest.raises(mla.InvalidValueError):
        mla.Plan(0, backend="cpu")
    gc.collect()
    assert destroyed == []


def test_closed_plan_refuses_work():
    plan = mla.Plan(16, kv_dtype="bf16", backend="cpu")
    plan.build_metadata([0, 1], [0, 1])
    plan.close()
    q = np.zeros((1, 16, 576), np.uint16)
    kv = np.zeros((1, 1, 576), np.uint16)
    with pytest.raises(mla.PlanClosedError):
        plan.run(q, kv)
    with pytest.raises(mla.PlanClosedError):
        plan.build_metadata([0, 1], [0, 1])
    with pytest.raises(mla.PlanClosedError):
        plan.schedule_info()
    with pytest.raises(mla.PlanClosedError):
        with plan:
            pass
    assert "closed" in repr(plan)


def test_many_plans(destroyed):
    plans = [mla.Plan(16, backend="cpu", max_batch_size=8) for _ in range(20)]
    addresses = sorted(int(p.handle) for p in plans)
    for p in plans[::2]:
        p.close()
    del plans, p
    gc.collect()
    assert sorted(destroyed) == addresses
