"""Where a round's time goes: every phase is timed per round, in report.json and in the printed summary."""

import json
from dataclasses import asdict

import pytest
import torch

from kfca_llm.fl.records import RoundClock, RoundTiming, timing_note
from kfca_llm.simulate import reward_table

PHASES = ("train_s", "pack_s", "score_s", "aggregate_s", "save_s")


def test_every_round_times_each_phase_within_its_wall_time(short_federation):
    _, _, result = short_federation
    assert sorted(result.timings) == [1, 2, 3]
    for t, timing in result.timings.items():
        # Each phase does work in every round of this run (adapters are saved: save_s too), so each is
        # measured above zero; the phases are disjoint laps, so together they fit in the round.
        assert all(getattr(timing, phase) > 0 for phase in PHASES), (t, timing)
        assert sum(getattr(timing, phase) for phase in PHASES) <= timing.wall_s
        if torch.cuda.is_available():  # the federation trains on CUDA where there is one
            assert timing.peak_device_bytes > 0
        else:
            assert timing.peak_device_bytes is None


def test_report_lists_the_timing_per_round_apart_from_the_reproducible_records(short_federation):
    _, _, result = short_federation
    report = json.loads(json.dumps(result.to_report()))
    assert report["timing"] == [asdict(result.timings[t]) for t in (1, 2, 3)]
    # Records stay bit-identical between two runs of one seed (resume and multi-process tests compare them).
    assert all("timing" not in r and "train_s" not in r for r in report["round_records"])


def test_summary_gives_the_mean_time_per_phase(short_federation):
    _, _, result = short_federation
    report = result.to_report()
    table = " ".join(reward_table(report).split())  # the table wraps long notes
    expected = timing_note(report["timing"])
    assert expected in table
    mean_train = sum(t.train_s for t in result.timings.values()) / 3
    assert f"training {mean_train:.3g} s" in expected and "mean of 3" in expected


def test_summary_skips_rounds_without_timing_and_shows_peak_memory():
    timed = {"train_s": 2.0, "pack_s": 0.25, "score_s": 0.5, "aggregate_s": 0.125, "save_s": 1.0, "wall_s": 4.0,
             "peak_device_bytes": 3 * 2**30}
    other = {**timed, "train_s": 4.0, "peak_device_bytes": 2**30}
    note = timing_note([timed, other])
    assert note == ("time per round (mean of 2): training 3 s, packing 0.25 s, scoring 0.5 s, aggregating 0.125 s, "
                    "saving 1 s, of 4 s; peak device memory 3 GiB")
    assert "peak" not in timing_note([{**timed, "peak_device_bytes": None}])
    report = {"domain": "d", "recipe": "d", "seed": 0, "rounds": 2, "categorical_world": [True, True],
              "strategies": {"honest": {"mean_reward": 0.2, "per_round": [0.2, 0.2]}},
              "honest_clients": {"mean_reward": 0.2}, "timing": [None, timed]}  # round 1 resumed from disk
    assert "time per round (mean of 1): training 2 s" in " ".join(reward_table(report).split())


def test_clock_laps_are_disjoint_and_the_cpu_has_no_peak_memory():
    clock = RoundClock(torch.device("cpu"))
    laps = [clock.lap() for _ in range(3)]
    timing = clock.timing(train_s=laps[0], pack_s=laps[1], score_s=laps[2], aggregate_s=0.0, save_s=0.0)
    assert isinstance(timing, RoundTiming) and timing.peak_device_bytes is None
    assert all(lap >= 0 for lap in laps) and sum(laps) <= timing.wall_s


@pytest.mark.skipif(not torch.cuda.is_available(), reason="peak device memory is measured on CUDA only")
def test_clock_reports_the_peak_allocation_of_the_round_on_cuda():
    device = torch.device("cuda")
    before = torch.cuda.memory_allocated(device)
    earlier = torch.empty(512 * 2**20, dtype=torch.uint8, device=device)  # a peak before the round
    del earlier
    clock = RoundClock(device)
    block = torch.empty(32 * 2**20, dtype=torch.uint8, device=device)
    timing = clock.timing(train_s=0.0, pack_s=0.0, score_s=0.0, aggregate_s=0.0, save_s=0.0)
    assert before + 32 * 2**20 <= timing.peak_device_bytes < before + 512 * 2**20  # reset when the round starts
    del block
