"""The harness's pure parts: the one producer configuration, and a stage that restarts as the same
worker."""

from __future__ import annotations

from streamapp.cli.publisher import producer_config, synthetic_streams
from streamapp.settings import Settings
from streamapp.tools.harness import Pipeline
from streamapp.topics import max_record_bytes


def test_every_tool_produces_durably_within_the_frame_limit():
    settings = Settings(broker="kafka://127.0.0.1:9999", max_frame_bytes=4 * 1024**2)
    config = producer_config(settings)
    assert config["bootstrap_servers"] == "127.0.0.1:9999"
    assert config["acks"] == "all" and config["enable_idempotence"] is True
    assert config["max_request_size"] == max_record_bytes(settings)
    assert config["max_batch_size"] <= min(max_record_bytes(settings), 1024**2)
    assert producer_config(settings, linger_ms=0)["linger_ms"] == 0


def test_a_restarted_stage_keeps_its_web_port_and_data(tmp_path):
    pipeline = Pipeline(Settings(), tmp_path)
    first, again = pipeline.stage_settings("join"), pipeline.stage_settings("join")
    other = pipeline.stage_settings("sink")
    assert first.web_port == again.web_port != other.web_port
    assert first.data_dir == again.data_dir == tmp_path / ".data" / "join"
    assert first.stages == ("join",) and other.stages == ("sink",)


def test_synthetic_streams_are_cameras_of_one_epoch():
    streams = synthetic_streams(3, 64, 64, frames=2, fps=10.0, epoch=7, prefix="cam")
    frames = [frame for stream in streams for frame, _ in stream]
    assert sorted({frame.id.stream for frame in frames}) == ["cam1", "cam2", "cam3"]
    assert {frame.id.epoch for frame in frames} == {7} and len(frames) == 6
