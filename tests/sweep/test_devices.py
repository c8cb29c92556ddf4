"""Device assignment of the local sweep: pure functions, checked without GPUs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from perception.rounds import idle_lanes
from perception.sweep.devices import child_env, plan_waves, visible_gpus
from perception.sweep.design import study_runs


def test_visible_gpus_follow_torch_count_and_cuda_visible_devices():
    assert visible_gpus({}, 0) == []
    assert visible_gpus({}, 4) == ["0", "1", "2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}, 2) == ["2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": " 5 , 7 "}, 2) == ["5", "7"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-1a2b,GPU-3c4d"}, 2) == ["GPU-1a2b", "GPU-3c4d"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, 0) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1,-1,2"}, 1) == ["1"]  # CUDA stops at an invalid id
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2"}, 2) == ["0", "1"]


def test_cpu_runs_one_at_a_time_in_study_order():
    runs = study_runs("s", 3)
    waves = plan_waves(runs, [])
    assert waves == [[(r, None)] for r in runs]
    assert [(r.arm, r.fold) for r in runs] == [
        ("shared", 0),
        ("per_horizon", 0),
        ("shared", 1),
        ("per_horizon", 1),
        ("shared", 2),
        ("per_horizon", 2),
    ]


def test_two_gpus_train_both_variants_of_a_fold_side_by_side():
    waves = plan_waves(study_runs("s", 3), ["0", "1"])
    assert len(waves) == 3
    for fold, wave in enumerate(waves):
        assert [(r.arm, r.fold, d) for r, d in wave] == [("shared", fold, "0"), ("per_horizon", fold, "1")]


def test_eight_gpus_run_the_whole_study_at_once():
    [wave] = plan_waves(study_runs("s", 3), [str(i) for i in range(8)])
    assert [d for _, d in wave] == ["0", "1", "2", "3", "4", "5"]


@given(n_runs=st.integers(0, 20), gpus=st.lists(st.sampled_from("0123456789"), unique=True, max_size=8))
def test_every_run_once_and_no_gpu_twice_in_a_wave(n_runs, gpus):
    runs = list(range(n_runs))
    waves = plan_waves(runs, gpus)
    assert [r for wave in waves for r, _ in wave] == runs
    for wave in waves:
        devices = [d for _, d in wave]
        assert len(wave) == (len(gpus) if gpus else 1) or wave is waves[-1]
        assert 1 <= len(wave) <= max(1, len(gpus))
        if gpus:
            assert len(set(devices)) == len(devices) and set(devices) <= set(gpus)
        else:
            assert devices == [None]


def test_child_env_pins_one_gpu_or_leaves_the_environment_alone():
    base = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "4,5"}
    assert child_env(base, "5") == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "5"}
    assert child_env(base, None) == base
    assert base["CUDA_VISIBLE_DEVICES"] == "4,5"  # not mutated


def test_cpu_lanes_run_side_by_side_and_stay_off_gpus():
    from perception.sweep.devices import CPU_LANE, child_env

    waves = plan_waves(study_runs("s", 3), [CPU_LANE] * 3)
    assert [len(w) for w in waves] == [3, 3]
    assert child_env({"CUDA_VISIBLE_DEVICES": "0,1"}, CPU_LANE)["CUDA_VISIBLE_DEVICES"] == ""


@given(pending=st.integers(0, 30), lanes=st.integers(0, 8))
def test_the_idle_lanes_fill_the_last_round_without_adding_one(pending, lanes):
    idle = idle_lanes(pending, lanes)
    gpus = [str(i) for i in range(lanes)]
    rounds = plan_waves(list(range(pending)), gpus)
    assert len(plan_waves(list(range(pending + idle)), gpus)) == len(rounds)
    if rounds and gpus:
        assert len(rounds[-1]) + idle == lanes  # the last round then uses every lane
    else:
        assert idle == 0  # nothing trains, or one training at a time: no lane is idle


def test_a_three_arm_wave_on_six_gpus_leaves_three_lanes_idle():
    assert idle_lanes(9, 6) == 3 and idle_lanes(6, 6) == 0 and idle_lanes(2, 8) == 6 and idle_lanes(5, 0) == 0
