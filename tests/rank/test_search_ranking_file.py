"""The ranking file ``kernaudit bench --search --ranking`` follows, malformed every way we could
think of: each is refused by ``load_ranking`` with one line (a BenchError), never a traceback or
a ranking the walk would trip over later (a negative prediction raised to a fractional slope is
a complex number; a config ranked twice would be measured twice)."""

from __future__ import annotations

import copy
import json
import math

import pytest

from kernaudit_pipeline.bench.runner import BenchError
from kernaudit_pipeline.bench.search import load_ranking

KERNEL = "cpu_work"


def _valid() -> list[dict]:
    return [{"kernel_name": KERNEL, "shape_name": "n65536", "stated_error": 0.3,
             "ranked": [{"config_id": f"c{i}", "predicted_us": 10.0 + i, "config": {"WORK": i}} for i in range(4)]},
            {"kernel_name": "other", "shape_name": "n65536", "ranked": "not even a list"}]


def _set(path: tuple, value) -> list[dict]:
    doc = _valid()
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


_DELETE = object()
BAD_NUMBERS = [None, _DELETE, "fast", "", True, False, [], {}, math.nan, math.inf, -math.inf, -1.0, 0, 0.0, -0.0,
               10 ** 400, -(10 ** 400)]
CASES = (
    [("top", v) for v in ({}, "ranking", 3, None, True)]
    + [("entries", [v]) for v in (1, "x", None, [], True)]  # no entry for the kernel at all
    + [("kernel", [{**_valid()[0], "kernel_name": v}]) for v in ("CPU_WORK", None, 3, "")]
    + [("shape", _set((0, "shape_name"), v)) for v in (None, _DELETE, 3, "", [], {}, True)]
    + [("ranked", _set((0, "ranked"), v)) for v in ({}, "x", 5, True, {"c0": 1})]
    + [("entry", _set((0, "ranked", 1), v)) for v in (1, "x", None, [], True, {})]
    + [("config_id", _set((0, "ranked", 2, "config_id"), v)) for v in (None, _DELETE, 3, "", [], {}, True, 1.5)]
    + [("predicted_us", _set((0, "ranked", 3, "predicted_us"), v)) for v in BAD_NUMBERS]
    + [("stated_error", _set((0, "stated_error"), v)) for v in
       (-0.1, math.nan, math.inf, -math.inf, "a fifth", True, 10, 1e9, [], {}, 10 ** 400)]
    + [("twice", _set((0, "ranked", 3, "config_id"), "c0")),
       ("twice", [_valid()[0], copy.deepcopy(_valid()[0])])]
)
RAW = [b"", b"   ", b"{not json", b"[", b"[{]", b"\xff\xfe\x00garbage", b"null", b"\xef\xbb\xbf[]",
       b"[" * 100000 + b"]" * 100000, b'[{"kernel_name": "cpu_work", "shape_name": "s", "ranked": [' + b"1e999" + b"]}]",
       b"NaN", b"[]", b'"a string"', b"\x00" * 64]


def _write(tmp_path, doc) -> object:
    path = tmp_path / "ranking.json"
    # NaN/Infinity as the literals Python's json reads back (json.dumps writes them by default)
    path.write_text(json.dumps(doc))
    return path


def test_there_are_enough_malformed_rankings():
    assert len(CASES) + len(RAW) >= 80


@pytest.mark.parametrize("what, doc", CASES, ids=[f"{w}-{i}" for i, (w, _) in enumerate(CASES)])
def test_a_malformed_ranking_is_refused_in_one_line(tmp_path, what, doc):
    with pytest.raises(BenchError) as err:
        load_ranking(_write(tmp_path, doc), KERNEL)
    message = str(err.value)
    assert "\n" not in message and str(tmp_path) in message


@pytest.mark.parametrize("raw", RAW, ids=[f"raw-{i}" for i in range(len(RAW))])
def test_unreadable_bytes_are_refused_in_one_line(tmp_path, raw):
    path = tmp_path / "ranking.json"
    path.write_bytes(raw)
    with pytest.raises(BenchError) as err:
        load_ranking(path, KERNEL)
    assert "\n" not in str(err.value)


def test_paths_that_are_not_files_are_refused_in_one_line(tmp_path):
    for path in (tmp_path / "missing.json", tmp_path):
        with pytest.raises(BenchError, match="not a readable ranking"):
            load_ranking(path, KERNEL)


def test_the_valid_ranking_loads_and_ignores_other_kernels_and_unusable_configs(tmp_path):
    doc = _valid()
    doc[0]["ranked"][0]["config"] = "not a dict"
    doc[0]["ranked"][1]["predicted_us"] = "11.0"  # a number written as a string reads as the number
    ranking, stated = load_ranking(_write(tmp_path, doc), KERNEL)
    assert stated == 0.3 and list(ranking) == ["n65536"]
    assert [c.config_id for c in ranking["n65536"]] == ["c0", "c1", "c2", "c3"]
    assert [c.predicted_us for c in ranking["n65536"]] == [10.0, 11.0, 12.0, 13.0]
    assert ranking["n65536"][0].config == () and ranking["n65536"][1].config == (("WORK", 1),)
    doc[0]["stated_error"] = None  # no stated error: the caller's default applies
    assert load_ranking(_write(tmp_path, doc), KERNEL)[1] is None
