"""pipeline.records: strict JSON, and undefined values written as null with their reason beside them."""

from __future__ import annotations

import copy
import json
import pickle

import numpy as np
import pytest

from pipeline.metrics.fms import fms
from pipeline.metrics.tapas import tapascore
from pipeline.records import Undefined, jsonable, write_json


def test_undefined_is_nan_and_keeps_its_reason_through_arithmetic_and_pickling():
    u = Undefined("no pair to score")
    assert np.isnan(u) and u != u and isinstance(u, float)
    for derived in (u - 0.3, 0.3 - u, 2 * u, u / 2, -u, u + Undefined("other")):
        assert isinstance(derived, Undefined) and derived.reason == "no pair to score"
    for copied in (pickle.loads(pickle.dumps(u)), copy.deepcopy(u)):
        assert isinstance(copied, Undefined) and copied.reason == u.reason


def test_a_non_finite_number_is_null_with_its_reason_beside_it(tmp_path):
    record = {"fms": Undefined("no concept can be split"), "cknna": np.float32(0.5), "ratio": float("inf"), "nan": np.nan,
              "curve": [1.0, float("nan")], "n": np.int64(3), "ok": np.bool_(True), "nested": {"delta": Undefined("x") - 0.1}}
    path = tmp_path / "metrics.json"
    write_json(path, record)
    text = path.read_text()
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} is not JSON")) == {
        "fms": None, "fms_undefined": "no concept can be split", "cknna": 0.5, "ratio": None, "ratio_undefined": "infinite",
        "nan": None, "nan_undefined": "not a number", "curve": [1.0, None], "n": 3, "ok": True, "nested": {"delta": None, "delta_undefined": "x"},
    }
    assert not list(tmp_path.glob("*.tmp")), "written atomically"


def test_degenerate_metric_inputs_give_their_reason_in_the_record():
    all_zero = fms(np.zeros((8, 3)), np.array([1, 1, 1, 1, 0, 0, 0, 0], dtype=bool))
    nothing_matched = tapascore(np.zeros((2, 3), bool), np.zeros((2, 3), bool), np.array([0, 1]), np.array([1, 0]),
                                [np.array([], np.int64), np.array([], np.int64)], empty="zero")
    record = jsonable({"fms": all_zero.fms, "tapas": nothing_matched.score, "delta_add": nothing_matched.delta_add})
    assert record["fms"] is None and "no concept" in record["fms_undefined"]
    assert record["tapas"] is None and "no pair has a non-empty" in record["tapas_undefined"]
    assert record["delta_add"] == pytest.approx(0.0)  # "zero" convention: every pair is a term
