"""Calibration's measurements kept on disk (`hf_dynaspec.generation.planning.measured`): the next process reads them
instead of timing again; a different target shape, machine or setting measures anew; broken files are
measured over."""

from __future__ import annotations

import json

import pytest
from helpers import tiny_target

from hf_dynaspec.generation.planning import calibration, measured


@pytest.fixture
def disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DYNASPEC_CACHE", str(tmp_path))
    monkeypatch.setenv(measured.ENV, "disk")
    return tmp_path / "measurements"


def fresh_process(monkeypatch):
    """Forget what this process memoised, as a new process would."""
    monkeypatch.setattr(calibration, "_MEASURED", type(calibration._MEASURED)())
    monkeypatch.setattr(calibration, "_WALK_HEADS", type(calibration._WALK_HEADS)())


def refuse_timing(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("timed again although the measurement was on disk")

    monkeypatch.setattr(calibration, "_time_verify_costs", fail)
    monkeypatch.setattr(calibration, "_median_seconds", fail)


def test_verify_costs_and_walk_head_timings_are_read_back_by_the_next_process(disk_cache, monkeypatch):
    target = tiny_target()
    monkeypatch.setenv(measured.ENV, "fresh")  # measured in full, as `hf-dynaspec calibrate` does
    costs = calibration.measure_verify_costs(target, max_tokens=6)
    head = calibration.measure_walk_head(target, max_rows=3, repeats=1)
    assert len(list(disk_cache.glob("*.json"))) == 3  # costs, the walk head's timings (twice: default + 3 rows)
    monkeypatch.setenv(measured.ENV, "disk")
    fresh_process(monkeypatch)
    refuse_timing(monkeypatch)
    again = tiny_target()  # same shapes, other weights: the timings hold
    assert calibration.measure_verify_costs(again, max_tokens=6) == costs
    assert calibration.measure_walk_head(again, max_rows=3, repeats=1).seconds == head.seconds


def test_another_shape_or_setting_measures_anew_and_broken_files_are_replaced(disk_cache, monkeypatch):
    calibration.measure_verify_costs(tiny_target(), max_tokens=5)
    fresh_process(monkeypatch)
    files = sorted(disk_cache.glob("*.json"))
    calibration.measure_verify_costs(tiny_target(vocab_size=96), max_tokens=5)  # another shape: costs (head untimed)
    calibration.measure_verify_costs(tiny_target(), max_tokens=4)  # another setting: costs
    assert len(sorted(disk_cache.glob("*.json"))) == len(files) + 2
    for path in disk_cache.glob("*.json"):
        path.write_text("{not json")
    fresh_process(monkeypatch)
    costs = calibration.measure_verify_costs(tiny_target(), max_tokens=5)
    assert len(costs.costs) == 5 and costs(1) == 1.0


def test_memory_mode_writes_nothing_and_bad_modes_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DYNASPEC_CACHE", str(tmp_path))
    monkeypatch.setenv(measured.ENV, "memory")
    calibration.measure_verify_costs(tiny_target(), max_tokens=3)
    assert not (tmp_path / "measurements").exists()
    monkeypatch.setenv(measured.ENV, "sometimes")
    with pytest.raises(ValueError, match="HF_DYNASPEC_MEASURE='sometimes'"):
        measured.mode()


def test_timed_sizes_cover_both_ends():
    assert calibration.timed_sizes(1) == [1]
    assert calibration.timed_sizes(6) == [1, 2, 3, 4, 5, 6]
    sizes = calibration.timed_sizes(21)
    assert sizes[0] == 1 and sizes[-1] == 21 and sizes == sorted(set(sizes)) and len(sizes) < 21


def test_a_cold_first_call_times_a_few_sizes_and_leaves_the_head_untimed(disk_cache, monkeypatch):
    """disk mode, nothing stored: c(n) from `quick_sizes` (stored, read back by the next process), the walk head
    in the model's own layout without a timing."""
    timed_sizes = []
    real = calibration.time_forward
    monkeypatch.setattr(calibration, "time_forward",
                        lambda target, cache, context, n, *a, **k: timed_sizes.append(n) or real(target, cache, context, n, *a, **k))
    target = tiny_target()
    head = calibration.measure_walk_head(target, layouts=("rows", "columns", "prefilter"))
    assert (head.layout, head.rows, head.seconds) == ("rows", calibration.EXPECTED_WALK, {})
    quick = calibration.measure_verify_costs(target, max_tokens=12, walk_head=head)
    assert sorted(set(timed_sizes)) == [1, 2, 4, 8, 12] and len(quick.costs) == 12 and quick(1) == 1.0
    assert len(list(disk_cache.glob("*.json"))) == 1  # the quick costs; no walk-head timings
    fresh_process(monkeypatch)
    refuse_timing(monkeypatch)
    assert calibration.measure_verify_costs(tiny_target(), max_tokens=12, walk_head=head) == quick


def test_a_full_measurement_is_read_before_a_quick_one(disk_cache, monkeypatch):
    head = calibration.default_walk_head(tiny_target(), ("rows",), calibration.EXPECTED_WALK)
    calibration.measure_verify_costs(tiny_target(), max_tokens=12, walk_head=head)  # disk, cold: quick
    (quick_file,) = disk_cache.glob("*.json")
    stored = json.loads(quick_file.read_text())
    marker = [1.0] + [1000.0] * 11  # a table no timing of a tiny model gives: recognisable if read
    quick_file.write_text(json.dumps({**stored, "value": marker}))
    monkeypatch.setenv(measured.ENV, "fresh")
    fresh_process(monkeypatch)
    full = calibration.measure_verify_costs(tiny_target(), max_tokens=12, walk_head=head)
    assert len(list(disk_cache.glob("*.json"))) == 2 and list(full.costs) != marker  # both stored, own keys
    monkeypatch.setenv(measured.ENV, "disk")
    fresh_process(monkeypatch)
    refuse_timing(monkeypatch)
    assert calibration.measure_verify_costs(tiny_target(), max_tokens=12, walk_head=head) == full
