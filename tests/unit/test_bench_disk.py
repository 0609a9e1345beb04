"""`streamapp bench disk` without a broker: its arguments, its phases and file-system sizes, and
the verdict over a sampled series."""

import pytest

from streamapp.cli.main import main
from streamapp.errors import UsageError
from streamapp.settings import Settings
from streamapp.tools.bench.disk_scenario import (
    DRAIN,
    SLOW_SINK,
    STALL,
    STEADY,
    DiskBenchOptions,
    accounting,
    budgets,
    check_options,
    deleted_unread_of,
    disk_verdict,
    filesystem_bytes,
    passed,
    phase_at,
    phases,
    plateaued,
)

MIB = 1024**2


@pytest.mark.parametrize("argv, reason", [
    (["--duration", "20"], "needs a unit"),
    (["--duration", "0s"], "expected a duration above 0"),
    (["--stall=-5min"], "is negative"),
    (["--slow-sink", "soon"], "needs a unit"),
    (["--drain", "0min"], "expected a duration above 0"),
    (["--sink-stopped", "1"], "between 0 and 1"),
    (["--sink-stopped", "x"], "expected a number between 0 and 1"),
    (["--streams", "0"], "expected at least 1"),
    (["--fps", "0"], "a steady rate above 0"),
    (["--size", "640"], "--size"),
    (["--partitions", "two"], "expected a whole number"),
    (["--broker-budget", "512M"], "size"),
    (["--join-budget", "lots"], "size"),
    (["--duration", "2min"], "leaves -480s of steady input"),
    (["--broker-budget", "300MiB"], "--broker-budget=300.0MiB cannot hold 11 partitions"),
    (["--join-budget", "32MiB"], "STREAMAPP_DISK_BUDGET must be at least 64MiB"),
    (["--sink-budget", "3MiB"], "STREAMAPP_SINK_DISK_BUDGET must hold at least 8 frames"),  # x 2 streams
    (["--size", "8000x8000"], "too large for --max-frame-bytes"),
    (["--fs", "xfs"], "--fs: expected one of tmpfs, ext4, got 'xfs'"),
])
def test_bad_arguments_are_one_line_usage_errors(capsys, monkeypatch, argv, reason):
    monkeypatch.setattr("os.geteuid", lambda: 0)  # arguments are checked before anything else
    assert main(["bench", "disk", *argv]) == 2
    error = capsys.readouterr().err
    assert reason in error and error.count("\n") == 1 and "Traceback" not in error


def test_without_root_it_says_so_in_one_line_and_exits_8(capsys, monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert main(["bench", "disk", "--duration", "3min", "--stall", "1min", "--slow-sink", "1min"]) == 8
    error = capsys.readouterr().err
    assert "needs root" in error and error.count("\n") == 1


def test_the_faults_come_one_after_the_other_in_the_middle():
    plan = phases(DiskBenchOptions(duration_s=1200, stall_s=300, slow_s=300))
    assert [(phase.name, phase.start_s, phase.end_s) for phase in plan] == [
        (STEADY, 0, 300), (STALL, 300, 600), (SLOW_SINK, 600, 900), (STEADY, 900, 1200)]
    assert [phase_at(plan, t) for t in (0, 299.9, 300, 650, 900, 1200)] == [STEADY, STEADY, STALL, SLOW_SINK,
                                                                             STEADY, DRAIN]


def test_each_file_system_is_its_budget_plus_the_reserve():
    options = DiskBenchOptions(streams=2, sink_budget_bytes=256 * MIB, max_frame_bytes=1 * MIB,
                               broker_budget_bytes=1536 * MIB, join_budget_bytes=128 * MIB, reserve_bytes=64 * MIB)
    # The sink keeps its budget per stream, plus each stream's open segment (a quarter) and a frame.
    assert budgets(options) == {"broker": 1536 * MIB, "join": 128 * MIB, "sink": 2 * (256 + 64 + 1) * MIB}
    assert filesystem_bytes(options) == {"broker": 1600 * MIB, "join": 192 * MIB, "sink": 706 * MIB}


def test_the_defaults_make_a_valid_run():
    settings = check_options(DiskBenchOptions(), Settings())
    assert (settings.partitions, settings.disk_budget_bytes, settings.detector) == (2, 128 * MIB, "color")


def test_a_scenario_without_steady_input_is_refused():
    with pytest.raises(UsageError, match="needs at least 60s"):
        check_options(DiskBenchOptions(duration_s=600, stall_s=300, slow_s=250), Settings())


def _samples(series: dict[str, list[int]]) -> list[dict]:
    length = len(next(iter(series.values())))
    return [{component: {"used_bytes": values[number]} for component, values in series.items()}
            for number in range(length)]


RISING_THEN_FLAT = [10, 40, 70, 90, 95, 96, 95, 97, 96, 95, 96, 97]


def test_a_series_that_levels_off_has_plateaued_and_one_still_climbing_has_not():
    assert plateaued(RISING_THEN_FLAT, budget=100) is True
    assert plateaued([10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120], budget=1000) is False
    assert plateaued([1, 2, 3], budget=100) is None  # too short to say


def test_the_verdict_is_per_component_and_needs_every_sample_below_its_budget():
    verdict = disk_verdict(_samples({"broker": RISING_THEN_FLAT, "join": [5] * 12,
                                     "sink": [10, 50, 101, 90, 90, 90, 90, 90, 90, 90, 90, 90]}),
                           {"broker": 100, "join": 100, "sink": 100})
    assert verdict["broker"]["below_budget"] and verdict["broker"]["plateaued"]
    assert verdict["broker"]["peak_used_bytes"] == 97 and verdict["broker"]["last_quarter_peak_bytes"] == 97
    assert verdict["join"]["below_budget"] and verdict["join"]["plateaued"]
    assert verdict["sink"]["plateaued"] and not verdict["sink"]["below_budget"]  # one sample over it
    all_frames = accounting(sent=100, matched=90, unmatched=10, shed=0, dead_lettered=0)
    assert not passed(verdict, all_frames, workers_died=[])


def test_every_frame_is_joined_unmatched_shed_or_dead_lettered():
    assert accounting(sent=100, matched=60, unmatched=30, shed=6, dead_lettered=4)["all_accounted"]
    missing = accounting(sent=100, matched=60, unmatched=30, shed=6, dead_lettered=0)
    assert missing["missing"] == 4 and not missing["all_accounted"]


def test_frames_deleted_by_retention_before_the_join_read_them_are_accounted_for_as_such():
    join = {'kafka_consumer_deleted_unread_records_total{topic="disk-1.frames",partition="0"}': 3,
            'kafka_consumer_deleted_unread_records_total{topic="disk-1.frames",partition="1"}': 4,
            'kafka_consumer_deleted_unread_records_total{topic="disk-1.detections",partition="0"}': 50,
            "join_joined_total": 60}
    deleted = deleted_unread_of(join, "disk-1.frames")
    assert deleted == 7
    frames = accounting(sent=100, matched=60, unmatched=33, shed=0, dead_lettered=0, deleted_unread=deleted)
    assert frames["all_accounted"] and frames["deleted_unread"] == 7


def test_a_run_passes_only_with_no_worker_dead_every_frame_accounted_and_every_disk_flat_below_budget():
    verdict = disk_verdict(_samples({"broker": RISING_THEN_FLAT, "join": [5] * 12, "sink": RISING_THEN_FLAT}),
                           {"broker": 100, "join": 100, "sink": 100})
    frames = accounting(sent=100, matched=90, unmatched=10, shed=0, dead_lettered=0)
    assert passed(verdict, frames, workers_died=[])
    assert not passed(verdict, frames, workers_died=["infer"])
    assert not passed(verdict, accounting(sent=101, matched=90, unmatched=10, shed=0, dead_lettered=0), [])
    climbing = disk_verdict(_samples({"broker": RISING_THEN_FLAT, "join": [5] * 12,
                                      "sink": [10, 20, 30, 40, 50, 60, 70, 80, 85, 90, 95, 99]}),
                            {"broker": 100, "join": 100, "sink": 100})
    assert not passed(climbing, frames, workers_died=[])


def test_sigterm_ends_the_run_as_ctrl_c_does_so_its_cleanup_runs():
    import asyncio
    import os
    import signal

    from streamapp.tools.bench.disk import terminate_as_interrupt

    cleaned = []

    async def run():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(30)
        finally:
            cleaned.append("tasks")

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), terminate_as_interrupt():
        try:
            asyncio.run(run())
        finally:
            cleaned.append("mounts")
    assert cleaned == ["tasks", "mounts"]
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="mounting a tmpfs needs root")
def test_small_disks_are_real_file_systems_of_their_size_and_all_go_away(tmp_path):
    import shutil

    from streamapp.tools.bench.disk import DiskBenchError, SmallDisks, mounts_under

    disks = SmallDisks()
    try:
        first = disks.mount(tmp_path / "a" / "logs", 4 * MIB)
        disks.mount(tmp_path / "b", 8 * MIB)
        assert shutil.disk_usage(first).total == 4 * MIB
        assert sorted(mounts_under(tmp_path)) == [str(tmp_path / "a" / "logs"), str(tmp_path / "b")]
        with pytest.raises(DiskBenchError, match="already a mount point"):
            disks.mount(first, MIB)
    finally:
        disks.unmount_all()
    assert mounts_under(tmp_path) == [] and not (tmp_path / "b").exists()


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="loop-mounting an ext4 image needs root")
def test_an_ext4_small_disk_holds_its_size_refuses_more_and_leaves_nothing_behind(tmp_path):
    import errno
    import os
    import shutil
    import subprocess

    from streamapp.tools.bench.disk import SmallDisks, ext4_image_bytes, mounts_under

    size = 24 * MIB
    images = tmp_path / "images"
    disks = SmallDisks("ext4", images)
    try:
        disk = disks.mount(tmp_path / "join", size)
        [image] = images.iterdir()
        with open("/proc/mounts") as mounts:
            assert [line.split()[2] for line in mounts if line.split()[1] == str(disk)] == ["ext4"]
        assert list(disk.iterdir()) == []  # no lost+found: a broker's log dir must hold only its partitions
        usage = shutil.disk_usage(disk)
        assert size <= usage.free < usage.total < ext4_image_bytes(size) == image.stat().st_size
        assert image.stat().st_blocks * 512 < size  # sparse: only what ext4 has written takes space
        with pytest.raises(OSError) as raised, open(disk / "filler", "wb") as filler:
            for _ in range(2 * size // MIB):
                filler.write(b"\1" * MIB)
                filler.flush()
                os.fsync(filler.fileno())
        assert raised.value.errno == errno.ENOSPC
        assert (disk / "filler").stat().st_size >= size  # the whole size was there to write
    finally:
        disks.unmount_all()
    assert mounts_under(tmp_path) == [] and not images.exists() and not (tmp_path / "join").exists()
    loops = subprocess.run(["losetup", "--list", "--noheadings", "--output", "BACK-FILE"], capture_output=True,
                           text=True, check=True).stdout
    assert str(image) not in loops  # the loop device went with the mount


def test_an_unknown_file_system_is_a_one_line_error():
    from streamapp.tools.bench.disk import DiskBenchError, SmallDisks

    with pytest.raises(DiskBenchError, match="unknown file system 'xfs' — choose one of tmpfs, ext4"):
        SmallDisks("xfs")


def test_the_plateau_is_judged_while_the_cameras_play_not_over_the_drain():
    climbing = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120]
    samples = _samples({"broker": climbing + [120] * 12, "join": [5] * 24, "sink": [5] * 24})
    for sample in samples[:12]:
        sample["phase"] = STEADY
    for sample in samples[12:]:
        sample["phase"] = DRAIN
    verdict = disk_verdict(samples, {"broker": 1000, "join": 100, "sink": 100})
    assert verdict["broker"]["plateaued"] is False and verdict["broker"]["last_quarter_peak_bytes"] == 120
    assert verdict["join"]["plateaued"] is True
