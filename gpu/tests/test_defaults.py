"""defaults.json is the one definition of the trainer's defaults
(kiln_gpu/defaults.py): the dataclasses' defaults are its values, and a
plan's "loss" may have exactly its fields. The Go side's check is
gpu/defaults_test.go (kiln-train's flags read the same file)."""

import dataclasses
import json
from pathlib import Path

import pytest

from kiln_gpu.batches import Plan, PlanError
from kiln_gpu.defaults import LOSS
from kiln_gpu.loss import LossConfig
from kiln_gpu.objectives import Objective
from kiln_gpu.train import objective_from_plan

FILE = Path(__file__).parent.parent / "kiln_gpu" / "defaults.json"


def plan_with_loss(loss: dict) -> Plan:
    plan = Plan.__new__(Plan)
    plan.path, plan.loss, plan.temperature = "plan.json", loss, 1.0
    return plan


def test_dataclass_defaults_are_the_files():
    want = json.loads(FILE.read_text())["loss"]
    base = dataclasses.asdict(LossConfig())
    obj = Objective()
    got = {**base, "objective": obj.objective, "kl_coef": obj.kl_coef, "entropy_coef": obj.entropy_coef,
           "score_centering": obj.score_centering, "score_centering_path": obj.sc_path,
           "old_logprobs": obj.old_logprobs}
    assert got == want


def test_an_empty_loss_is_the_defaults():
    assert objective_from_plan(plan_with_loss({})) == Objective()


def test_a_loss_field_overrides_its_default():
    o = objective_from_plan(plan_with_loss({"eps_clip": 0.3, "correction": "tis"}))
    assert o.base.eps_clip == 0.3 and o.base.correction == "tis"
    assert o.base.correction_high == LOSS["correction_high"]


def test_unknown_loss_fields_are_refused():
    with pytest.raises(PlanError, match=r"loss has unknown fields \['eps_clipp'\]"):
        objective_from_plan(plan_with_loss({"eps_clipp": 0.3}))
