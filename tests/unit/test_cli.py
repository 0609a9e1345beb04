"""The ``streamapp`` command line: exit codes and error messages without tracebacks."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys

import pytest

from streamapp.cli.main import COMMANDS, build_parser, main
from streamapp.tools.localkafka.processes import free_port


def test_every_registered_command_is_in_the_parser():
    parser = build_parser()
    [subcommands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(subcommands.choices) == {command.name for command in COMMANDS}
    args = parser.parse_args(["broker", "status"])
    assert args.command == "broker" and args.action == "status"


def test_no_command_is_a_usage_error(capsys):
    assert main([]) == 2
    assert "streamapp: error:" in capsys.readouterr().err


def test_broker_without_action_is_a_usage_error(capsys):
    assert main(["broker"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("streamapp: error: the following arguments are required: {start,stop,status,env}")
    assert "see `streamapp broker --help`" in err and err.count("\n") == 1


def test_help_exits_zero(capsys):
    assert main(["broker", "start", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--port" in out and "--data-dir" in out and "--timeout" in out


def test_ambiguous_size_is_a_usage_error(capsys, tmp_path):
    assert main(["broker", "start", "--data-dir", str(tmp_path), "--max-message-bytes", "16M"]) == 2
    assert "ambiguous" in capsys.readouterr().err


@pytest.mark.parametrize("argv, reason", [
    (["bench", "chaos", "--fps", "-3"], "expected 0 (as fast as possible) to 1000 per second"),
    (["bench", "chaos", "--fps", "0"], "expected a steady rate above 0"),
    (["bench", "chaos", "--wipe-join-store-every", "-1"], "expected at least 0"),
    (["bench", "soak", "--stall", "nan"], "expected a finite number"),
    (["demo", "--timeout", "-5"], "expected seconds above 0"),
    (["demo", "--port", "70000"], "expected at most 65535"),
    (["broker", "stop", "--timeout", "soon"], "expected a number"),
])
def test_bad_numbers_are_usage_errors_before_anything_starts(capsys, argv, reason):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error:" in err and reason in err


def test_status_of_a_stopped_broker_exits_3(capsys, tmp_path):
    assert main(["broker", "status", "--data-dir", str(tmp_path / "b"), "--port", str(free_port())]) == 3
    assert "not running" in capsys.readouterr().out


def test_status_of_a_stopped_cluster_lists_every_node_and_exits_3(capsys, tmp_path):
    assert main(["broker", "status", "--nodes", "3", "--data-dir", str(tmp_path / "c"), "--port", "19092"]) == 3
    out = capsys.readouterr().out
    assert [line.split()[:4] for line in out.splitlines()] == [
        ["node", str(number), "not", "running"] for number in (1, 2, 3)]


def test_a_cluster_is_one_or_three_nodes(capsys):
    assert main(["broker", "start", "--nodes", "2"]) == 2
    assert "invalid choice: 2" in capsys.readouterr().err


def test_stop_of_a_stopped_broker_is_fine(capsys, tmp_path):
    assert main(["broker", "stop", "--data-dir", str(tmp_path / "b")]) == 0
    assert "not running" in capsys.readouterr().out


def test_a_busy_port_exits_7_without_traceback(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "streamapp.cli.main", "broker", "start", "--port", str(port),
             "--data-dir", str(tmp_path / "b")],
            capture_output=True, text=True, timeout=60,
        )
    assert proc.returncode == 7
    assert proc.stderr.startswith(f"streamapp: error: port {port} on 127.0.0.1 is already in use")
    assert proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr


def test_samples_prints_the_cached_videos(capsys, sample_videos):
    assert main(["samples"]) == 0
    assert capsys.readouterr().out.split() == [str(path) for path in sample_videos.values()]


def test_a_fetch_that_fails_is_an_error_without_traceback(capsys, monkeypatch, tmp_path):
    home = tmp_path / "not-a-directory"
    home.write_text("")
    monkeypatch.setenv("STREAMAPP_ASSETS_HOME", str(home))
    assert main(["model"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("streamapp: error: cannot create the cache") and "STREAMAPP_ASSETS_HOME" in err


def test_demo_synthetic_and_video_exclude_each_other(capsys, tmp_path):
    assert main(["demo", "--synthetic", "--video", str(tmp_path / "a.mp4")]) == 2
    assert "--synthetic and --video exclude each other" in capsys.readouterr().err


def test_topics_create_refuses_a_broker_budget_too_small_in_one_line(capsys, monkeypatch):
    monkeypatch.setenv("STREAMAPP_BROKER_DISK_BUDGET", "1GiB")
    monkeypatch.setenv("STREAMAPP_BROKER", f"kafka://127.0.0.1:{free_port()}")  # never reached
    assert main(["topics", "create"]) == 1
    captured = capsys.readouterr()
    [line] = captured.err.splitlines()
    assert line.startswith("streamapp: error: STREAMAPP_BROKER_DISK_BUDGET=1.0GiB cannot hold 21 partitions")
    assert captured.out == ""
