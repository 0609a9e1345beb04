"""Sizes and durations are read strictly; settings survive the trip through the environment."""

from __future__ import annotations

import dataclasses
import string
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from streamapp.settings import STAGES, Settings, SettingsError, parse_resolution
from streamapp.units import UnitError, format_bytes, parse_bytes, parse_duration
from streamapp.wire import parse_stream_id

MIB = 1024**2


@pytest.mark.parametrize("text, expected", [
    ("512MiB", 512 * MIB),
    ("16MB", 16_000_000),
    ("16 MiB", 16 * MIB),
    ("1.5KiB", 1536),
    ("1048576", 1048576),
    ("0", 0),
    ("10B", 10),
    ("2GiB", 2 * 1024**3),
    ("1TB", 10**12),
    (" 3kB ", 3000),
    (4096, 4096),
])
def test_parse_bytes_accepts_units_with_one_meaning(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["16M", "16m", "16mb", "16mib", "1K", "1k", "2G", "1gb", "5 Mb", "3KB"])
def test_parse_bytes_rejects_ambiguous_units_naming_the_setting(text):
    with pytest.raises(UnitError) as info:
        parse_bytes(text, name="STREAMAPP_MAX_FRAME_BYTES")
    message = str(info.value)
    assert "STREAMAPP_MAX_FRAME_BYTES" in message
    assert "ambiguous" in message and "MiB" in message and "MB" in message


@pytest.mark.parametrize("value", ["", "MiB", "-1MiB", "1.5B", "1,5MiB", "ten", True, -5])
def test_parse_bytes_rejects_nonsense(value):
    with pytest.raises(UnitError, match="frame"):
        parse_bytes(value, name="frame")


@pytest.mark.parametrize("text, expected", [
    ("5s", 5.0), ("250ms", 0.25), ("2min", 120.0), ("1h", 3600.0), ("0.5s", 0.5), (3, 3.0), (1.5, 1.5),
])
def test_parse_duration(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["5", "5 sec", "5S", "1m", "2 mins", "", "-1", "1d"])
def test_parse_duration_needs_a_known_unit(text):
    with pytest.raises(UnitError, match="STREAMAPP_JOIN_TTL.*needs a unit"):
        parse_duration(text, name="STREAMAPP_JOIN_TTL")


@pytest.mark.parametrize("text", ["-5s", "-250ms", " -1h"])
def test_a_negative_duration_is_reported_as_negative_not_as_unitless(text):
    with pytest.raises(UnitError, match="STREAMAPP_JOIN_TTL.*is negative; a duration must be positive"):
        parse_duration(text, name="STREAMAPP_JOIN_TTL")


def test_format_bytes():
    assert format_bytes(512) == "512B"
    assert format_bytes(1536) == "1.5KiB"
    assert format_bytes(16 * MIB) == "16.0MiB"
    assert format_bytes(3 * 1024**4) == "3072.0GiB"


@given(st.integers(0, 10**6), st.sampled_from(["B", "kB", "MB", "GB", "KiB", "MiB", "GiB"]))
def test_parse_bytes_whole_numbers_of_any_unit(number, unit):
    factor = {"B": 1, "kB": 1000, "MB": 1000**2, "GB": 1000**3, "KiB": 1024, "MiB": MIB, "GiB": 1024**3}
    assert parse_bytes(f"{number}{unit}") == number * factor[unit]


# --- settings ------------------------------------------------------------------------------


def test_defaults_are_valid_and_empty_environment_gives_defaults():
    assert Settings.from_env({}) == Settings()


@pytest.mark.parametrize("variable, value", [
    ("STREAMAPP_MAX_FRAME_BYTES", "16M"),
    ("STREAMAPP_MEMORY_BUDGET", "1g"),
    ("STREAMAPP_SINK_DISK_BUDGET", "100mb"),
    ("STREAMAPP_BROKER_DISK_BUDGET", "2G"),
    ("STREAMAPP_JOIN_TTL", "5"),
    ("STREAMAPP_SWEEP_INTERVAL", "1 second"),
    ("STREAMAPP_INPUT_RETENTION", "1d"),
    ("STREAMAPP_PARTITIONS", "four"),
    ("STREAMAPP_STAGES", "resize,crop"),
    ("STREAMAPP_RESIZE", "320by240"),
    ("STREAMAPP_TOPIC_PREFIX", "bad prefix/"),
    ("STREAMAPP_TOPIC_PREFIX", "site1.\n"),
    ("STREAMAPP_YOLO_INPUT", "400"),
    ("STREAMAPP_YOLO_INPUT", "4096"),
    ("STREAMAPP_YOLO_CONFIDENCE", "1.5"),
    ("STREAMAPP_YOLO_CONFIDENCE", "nan"),
    ("STREAMAPP_YOLO_NMS", "0"),
    ("STREAMAPP_YOLO_NMS", "half"),
    ("STREAMAPP_INFER_BATCH", "0"),
    ("STREAMAPP_STATIC_MEMBERSHIP", "maybe"),
    ("STREAMAPP_SESSION_TIMEOUT", "45"),
    ("STREAMAPP_SESSION_TIMEOUT", "5s"),
    ("STREAMAPP_SESSION_TIMEOUT", "2min"),
])
def test_bad_values_are_rejected_with_the_variable_name(variable, value):
    with pytest.raises(SettingsError) as info:
        Settings.from_env({variable: value})
    assert variable in str(info.value)


@pytest.mark.parametrize("changes, variable", [
    ({"join_ttl_s": 1.0, "sweep_interval_s": 2.0}, "STREAMAPP_SWEEP_INTERVAL"),
    ({"join_ttl_s": 10.0, "done_marker_ttl_s": 5.0}, "STREAMAPP_DONE_MARKER_TTL"),
    ({"max_frame_bytes": 1024}, "STREAMAPP_MAX_FRAME_BYTES"),
    ({"partitions": 0}, "STREAMAPP_PARTITIONS"),
    ({"stages": ()}, "STREAMAPP_STAGES"),
])
def test_inconsistent_settings_are_rejected(changes, variable):
    with pytest.raises(SettingsError, match=variable):
        Settings(**changes)


def test_stages_all_and_lists():
    assert Settings.from_env({"STREAMAPP_STAGES": "all"}).stages == STAGES
    settings = Settings.from_env({"STREAMAPP_STAGES": " infer , join "})
    assert settings.stages == ("infer", "join")
    assert settings.group_id == "streamapp-infer-join"
    assert Settings().group_id == "streamapp-all"


def test_yolo_classes_are_a_comma_list():
    assert Settings.from_env({"STREAMAPP_YOLO_CLASSES": " person, car ,"}).yolo_classes == ("person", "car")
    assert Settings.from_env({}).yolo_classes == ()


def test_a_customised_settings_round_trips_through_the_environment():
    settings = Settings(
        broker="kafka://kafka:9092", app_id="cam", topic_prefix="site1.", stages=("resize", "sink"),
        partitions=8, bucket_size=30, join_ttl_s=2.5, sweep_interval_s=0.25, done_marker_ttl_s=120.0,
        max_frame_bytes=8 * MIB, memory_budget_bytes=512 * MIB, input_retention_s=600.0,
        broker_disk_budget_bytes=3 * 1024**3, sink_disk_budget_bytes=512 * 1024**2,
        disk_reserve_bytes=8 * 1024**2, data_dir=Path("/var/lib/streamapp"), out_dir=Path("results"),
        web_port=6067, resize_width=640, resize_height=480, jpeg_quality=75, detector="yolo",
        yolo_input=320, yolo_confidence=0.4, yolo_nms=0.5, yolo_classes=("person", "traffic light"),
        infer_batch=8, static_membership=False, session_timeout_s=45.0,
    )
    assert Settings.from_env(settings.to_env()) == settings
    assert Settings.from_env(Settings().to_env()) == Settings()


def test_every_setting_but_the_secrets_and_the_resolution_names_its_own_variable():
    """A field added without its variable could not be set, nor handed to another process."""
    unnamed = {field.name for field in dataclasses.fields(Settings) if "variable" not in field.metadata}
    assert unnamed == {"web_token", "resize_width", "resize_height", "security"}


def test_a_duration_is_in_whole_milliseconds_rounded_wherever_it_is_used():
    settings = Settings(join_ttl_s=1.001, done_marker_ttl_s=2.0029, input_retention_s=0.0291)  # 1.001 is 1.000999...
    assert (settings.join_ttl_ms, settings.done_marker_ttl_ms, settings.input_retention_ms) == (1001, 2003, 29)


# Durations in milliseconds, as people write them (Python prints much smaller or larger floats
# in exponent notation, which the duration syntax does not accept).
durations = st.integers(1, 10**9).map(lambda ms: ms / 1000)
names = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=20)


@st.composite
def settings(draw):
    join_ttl = draw(durations)
    frame = draw(st.integers(64 * 1024, 256 * MIB))
    return Settings(
        app_id=draw(names),
        topic_prefix=draw(st.text("abc._-", max_size=5)),
        stages=tuple(draw(st.lists(st.sampled_from(STAGES), min_size=1, max_size=4, unique=True))),
        partitions=draw(st.integers(1, 1000)),
        bucket_size=draw(st.integers(1, 10**6)),
        join_ttl_s=join_ttl,
        sweep_interval_s=draw(st.integers(1, int(join_ttl * 1000)).map(lambda ms: ms / 1000)),
        done_marker_ttl_s=join_ttl + draw(durations),
        max_frame_bytes=frame,
        memory_budget_bytes=frame * draw(st.integers(8, 64)),
        sink_disk_budget_bytes=frame * draw(st.integers(8, 64)),
        input_retention_s=draw(durations),
        broker_disk_budget_bytes=draw(st.integers(0, 2**50)),
        disk_reserve_bytes=draw(st.integers(0, 2**40)),
        web_port=draw(st.integers(1, 65535)),
        resize_width=draw(st.integers(16, 4096)),
        resize_height=draw(st.integers(16, 4096)),
        jpeg_quality=draw(st.integers(1, 100)),
        detector=draw(names),
        yolo_input=draw(st.integers(4, 32)) * 32,
        yolo_confidence=draw(st.integers(1, 99)) / 100,
        yolo_nms=draw(st.integers(1, 100)) / 100,
        yolo_classes=tuple(draw(st.lists(names, max_size=3))),
        infer_batch=draw(st.integers(1, 64)),
    )


@given(settings())
def test_any_valid_settings_round_trip_through_the_environment(s):
    assert Settings.from_env(s.to_env()) == s


def test_parse_resolution_and_stream_id():
    assert parse_resolution("320x240") == (320, 240)
    assert parse_resolution(" 640 X 480 ") == (640, 480)
    with pytest.raises(ValueError, match="--size"):
        parse_resolution("640", "--size")
    assert parse_stream_id("cam-1.a_b") == "cam-1.a_b"
    for bad in ("", "a/b", "x" * 65, "cam 1", "cam1\n", "cam1\r\n", "\ncam1"):
        with pytest.raises(ValueError):
            parse_stream_id(bad)


@pytest.mark.parametrize("text, expected", [("true", True), ("1", True), ("on", True), ("False", False),
                                            ("0", False), ("no", False)])
def test_static_membership_is_a_yes_or_no(text, expected):
    assert Settings.from_env({"STREAMAPP_STATIC_MEMBERSHIP": text}).static_membership is expected


def test_a_worker_is_the_same_static_member_on_every_start_and_no_other_worker_is():
    worker = Settings(stages=("join",), data_dir=Path("data/join-a"))
    member = worker.group_instance_id("http://host:6066")
    assert member == worker.replace().group_instance_id("http://host:6066")
    assert member.startswith("streamapp-join.")
    assert len(member) <= 249
    assert set(member) <= set(string.ascii_letters + string.digits + "._-")
    others = {worker.replace(data_dir=Path("data/join-b")).group_instance_id("http://host:6066"),
              worker.group_instance_id("http://host:6067"),
              worker.replace(stages=("sink",)).group_instance_id("http://host:6066")}
    assert member not in others and len(others) == 3


def test_without_static_membership_there_is_no_member_name():
    assert Settings(static_membership=False).group_instance_id("http://host:6066") is None


@pytest.mark.parametrize(("stages", "guarantee", "refused"), [
    (STAGES, "exactly_once", True),
    (("resize", "join"), "exactly_once", True),
    (("resize", "infer"), "exactly_once", False),
    (("join", "sink"), "exactly_once", False),
    (STAGES, "at_least_once", False),
])
def test_a_worker_under_exactly_once_never_runs_two_stages_committing_one_input(stages, guarantee, refused):
    settings = Settings(stages=stages, processing_guarantee=guarantee)  # a pipeline's settings may name all
    if refused:
        with pytest.raises(SettingsError, match="resize and join both read frames"):
            settings.check_worker()
    else:
        settings.check_worker()
