"""`streamapp produce` on the real broker reports its progress; off a terminal as plain lines."""

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path


def test_produce_ends_with_a_progress_line_of_every_frame(kafka_bootstrap):
    streamapp = Path(sys.executable).with_name("streamapp")
    env = {**os.environ, "STREAMAPP_BROKER": f"kafka://{kafka_bootstrap}",
           "STREAMAPP_TOPIC_PREFIX": f"progress-{uuid.uuid4().hex[:8]}."}
    subprocess.run([str(streamapp), "topics", "create"], env=env, check=True, capture_output=True, timeout=120)
    result = subprocess.run(
        [str(streamapp), "produce", "--synthetic", "--streams", "2", "--frames", "10", "--fps", "0",
         "--size", "160x120"],
        env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "published 20 frames" in result.stdout
    assert "\r" not in result.stderr
    assert re.search(r"^produce: 20/20 frames in [\d.]+ s \([\d.]+ frames/s\)$", result.stderr, re.M), result.stderr
