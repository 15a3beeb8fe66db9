"""Trainer metric names → ``steps`` columns, and values → storable scalars."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch

from sorl_monitor.integrations.names import HF_TRAINER_NAMES, TRL_NAMES, VERL_NAMES, scalar, to_columns
from sorl_monitor.schema import STEP_METRICS


def test_mapped_names_become_schema_columns_and_others_are_snake_cased():
    row = to_columns({"actor/pg_clipfrac": 0.2, "timing_s/gen": 1.0, "val-core/gsm8k/acc@1": 0.5}, VERL_NAMES)
    assert row == {"clip_frac_active": 0.2, "timing_s_gen": 1.0, "val_core_gsm8k_acc_1": 0.5}


def test_a_mapped_name_wins_over_an_unmapped_one_that_snake_cases_to_the_same_column():
    assert to_columns({"clip_frac_active": 0.9, "actor/pg_clipfrac": 0.2}, VERL_NAMES) == {
        "clip_frac_active": 0.2
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (np.float32(0.5), 0.5),
        (np.int64(7), 7.0),
        (torch.tensor(1.5), 1.5),
        (torch.tensor([2.5]), 2.5),
        (np.array(3.0), 3.0),
        (10**400, math.inf),
        (-(10**400), -math.inf),
        (True, True),
        ("fsdp", "fsdp"),
        ([1, 2], None),
        ({"a": 1}, None),
        (torch.ones(3), None),
        (None, None),
    ],
)
def test_values_become_floats_bools_strings_or_are_left_out(value, expected):
    assert scalar(value) == expected


def test_mapped_targets_are_schema_columns_or_documented_extras():
    extras = {"clip_frac_active_low", "clip_frac_active_high", "dual_clip_frac"}
    for names in (HF_TRAINER_NAMES, TRL_NAMES, VERL_NAMES):
        assert set(names.values()) <= set(STEP_METRICS) | extras


def test_every_mapped_trl_and_transformers_name_is_logged_by_the_installed_sources():
    trl = pytest.importorskip("trl")
    import transformers.trainer

    source = inspect.getsource(trl.GRPOTrainer) + inspect.getsource(transformers.trainer)
    for name in TRL_NAMES:
        assert f'"{name}"' in source, name
