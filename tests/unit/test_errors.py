"""Every expected failure as a user meets it: the real ``streamapp`` command in a subprocess,
one line ``streamapp: error: <what> — <fix>`` on stderr, no traceback, and its own exit code."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from streamapp.errors import ExitCode, StreamappError
from streamapp.tools.localkafka.processes import free_port


def run_cli(*argv: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamapp.cli.main", *argv], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})}, cwd=cwd)


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int, *phrases: str) -> None:
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.startswith("streamapp: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    for phrase in phrases:
        assert phrase in proc.stderr
    assert "Unclosed" not in proc.stderr


def bin_dir_with(tmp_path: Path, *tools: str) -> str:
    """A PATH of just these tools (symlinks to the real ones)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in tools:
        found = shutil.which(tool)
        if found is None:
            pytest.skip(f"{tool} is not installed")
        (folder / tool).symlink_to(found)
    return str(folder)


def no_broker() -> dict[str, str]:
    return {"STREAMAPP_BROKER": f"127.0.0.1:{free_port()}"}


def test_every_error_carries_its_what_its_fix_and_its_code():
    error = StreamappError("the thing broke", "do this", exit_code=ExitCode.NO_BROKER)
    assert str(error) == "the thing broke — do this" and error.exit_code == 6
    assert str(StreamappError("only what")) == "only what" and StreamappError("x").exit_code == 1


def test_a_bad_flag_exits_2():
    proc = run_cli("produce", "--synthetic", "--fps", "fast")
    assert_one_line_error(proc, ExitCode.USAGE, "--fps", "see `streamapp produce --help`")


def test_a_bad_setting_exits_2_and_a_negative_duration_says_it_must_be_positive():
    proc = run_cli("topics", "create", env={"STREAMAPP_JOIN_TTL": "-5s"})
    assert_one_line_error(proc, ExitCode.USAGE, "STREAMAPP_JOIN_TTL='-5s'", "must be positive")
    assert "unit" not in proc.stderr


@pytest.mark.parametrize("argv", [["produce", "--synthetic", "--frames", "3"], ["record", "--out", "x.rec"],
                                  ["topics", "create"]])
def test_no_broker_exits_6_and_closes_its_client(tmp_path, argv):
    proc = run_cli(*argv, env=no_broker(), cwd=tmp_path)
    assert_one_line_error(proc, ExitCode.NO_BROKER, "no Kafka broker answers at 127.0.0.1:",
                          "streamapp broker start")


def test_replay_with_no_broker_exits_6(tmp_path):
    recording = tmp_path / "two.rec"
    assert run_cli("record", "--synthetic", "--frames", "2", "--out", str(recording)).returncode == 0
    proc = run_cli("replay", str(recording), "--speed", "max", env=no_broker())
    assert_one_line_error(proc, ExitCode.NO_BROKER, "no Kafka broker answers")


def broker_env(tmp_path: Path, path: str) -> dict[str, str]:
    env = {"PATH": path, "XDG_STATE_HOME": str(tmp_path / "state"),
           "STREAMAPP_KAFKA_HOME": str(tmp_path / "kafka")}
    return env


def test_no_java_exits_4(tmp_path, monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    proc = run_cli("broker", "start", "--port", str(free_port()), env=broker_env(tmp_path, str(tmp_path)))
    assert_one_line_error(proc, ExitCode.NO_JAVA, "Java not found", "install a JDK 17")


def test_the_demo_without_java_says_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    proc = run_cli("demo", "--synthetic", "--port", str(free_port()), "--out", str(tmp_path / "out"),
                   env=broker_env(tmp_path, str(tmp_path)))
    assert_one_line_error(proc, ExitCode.NO_JAVA, "Java not found")


def test_no_maven_for_missing_jars_exits_5(tmp_path, monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    proc = run_cli("broker", "start", "--port", str(free_port()),
                   env=broker_env(tmp_path, bin_dir_with(tmp_path, "java")))
    assert_one_line_error(proc, ExitCode.NO_MAVEN, "Maven (`mvn`) is not installed", "install Maven")


@pytest.mark.parametrize("setting, phrase", [
    ("STREAMAPP_JOIN_TTL=-5s", "STREAMAPP_JOIN_TTL='-5s': '-5s' is negative; a duration must be positive"),
    ("STREAMAPP_MEMORY_BUDGET=512M", "unit 'M' in '512M' is ambiguous"),
    ("STREAMAPP_STAGES=resize,nope", "unknown stage(s) ['nope']"),
    ("STREAMAPP_DETECTOR=nope", "detector 'nope': expected one of color"),
])
def test_a_worker_with_a_bad_setting_exits_2_in_one_line(tmp_path, setting, phrase):
    variable, value = setting.split("=", 1)
    proc = run_infer_worker(tmp_path, {variable: value})
    assert_one_line_error(proc, ExitCode.USAGE, phrase)
    assert proc.stdout == ""


def test_a_sink_worker_whose_disk_cannot_hold_one_video_segment_exits_2_in_one_line(tmp_path):
    proc = run_infer_worker(tmp_path, {"STREAMAPP_STAGES": "sink", "STREAMAPP_SINK_DISK_BUDGET": "100TiB",
                                       "STREAMAPP_OUT_DIR": str(tmp_path / "out")})
    assert_one_line_error(proc, ExitCode.USAGE, f"STREAMAPP_OUT_DIR {tmp_path / 'out'} is on a file system of",
                          "STREAMAPP_SINK_DISK_BUDGET=102400.0GiB", "give the sink a larger disk")


def test_an_infer_worker_without_its_model_files_exits_1_saying_how_to_fetch_them(tmp_path):
    proc = run_infer_worker(tmp_path, {"STREAMAPP_DETECTOR": "yolo", "STREAMAPP_ASSETS_HOME": str(tmp_path)})
    assert_one_line_error(proc, ExitCode.FAILURE, "detector 'yolo'", "run `streamapp model`")


def run_infer_worker(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "faust"), "-A", "streamapp.app", "worker"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, **no_broker(), "STREAMAPP_STAGES": "infer", **env})


def test_every_exit_code_is_documented():
    operations = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    for code in ExitCode:
        assert f"\n| {code.value} | " in operations, code
