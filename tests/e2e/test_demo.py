"""The whole pipeline as four worker processes on the real broker: every frame out exactly once,
each with the boxes of its own ground truth."""

import json

import pytest

from streamapp.settings import Settings
from streamapp.tools.demo import DemoOptions, run_demo

pytestmark = pytest.mark.e2e


def test_demo_outputs_every_frame_once_with_its_own_boxes(kafka_bootstrap, tmp_path):
    port = int(kafka_bootstrap.rsplit(":", 1)[1])
    options = DemoOptions(synthetic=True, streams=2, frames=40, fps=20.0, out=tmp_path / "out",
                          broker_port=port, timeout_s=120)
    # A TTL well above the pipeline's latency on a loaded CI machine: this test is about the
    # join's correctness, the TTL path has tests of its own.
    summary = run_demo(options, Settings(join_ttl_s=15.0))

    assert summary["frames_produced"] == 80
    assert summary["exactly_once"] is True
    assert summary["frames_missing"] == 0 and summary["foreign_records"] == 0
    assert summary["joined"] == 80 and summary["unmatched_frames"] == 0
    assert summary["duplicates"] == 0 and summary["orphan_results"] == 0
    assert summary["ground_truth_mismatches"] == 0
    assert summary["min_iou"] >= 0.9
    out = tmp_path / "out"
    assert json.loads((out / "summary.json").read_text())["joined"] == 80
    assert (out / "contact_sheet.png").stat().st_size > 10_000
    assert len(summary["videos"]) == 2
    for video in summary["videos"]:
        assert (out / video).stat().st_size > 10_000
