"""The live preview: the latest annotated frame of each stream, on a page any browser shows.

The sink keeps the frames (streamapp.previewframes.LatestFrames, within STREAMAPP_PREVIEW_BYTES)
and hands them to :meth:`Stage.serve_preview <streamapp.worker.stage.Stage.serve_preview>`; the
worker serves

* ``/preview/``: the page, one tile per stream and the worker's counters, refreshed twice a
  second by a few lines of script (no external files, nothing to install);
* ``/preview/streams.json``: what the page shows;
* ``/preview/frame/{stream}``: the latest annotated JPEG of a stream.
"""

from __future__ import annotations

from pathlib import Path

from streamapp.previewframes import LatestFrames
from streamapp.worker.metrics import Metrics

PAGE = Path(__file__).with_name("preview.html")


def main_counters(snapshot: dict[str, float]) -> dict[str, float]:
    """The worker's outcome counters, for the page (process internals left out)."""
    return {name: value for name, value in sorted(snapshot.items())
            if name.endswith("_total") and "{" not in name and not name.startswith("gc_")}


def register(stage, frames: LatestFrames) -> None:
    """Serve the preview pages from this worker's web port."""
    metrics: Metrics = stage.metrics
    metrics.add_gauges(frames.gauges)
    page = PAGE.read_bytes()

    @stage.app.page("/preview/")
    async def preview_page(web, request):
        return web.bytes(page, content_type="text/html")

    @stage.app.page("/preview/streams.json")
    async def preview_streams(web, request):
        return web.json({"streams": frames.streams(), "counters": main_counters(metrics.snapshot())},
                        headers={"Cache-Control": "no-store"})

    @stage.app.page("/preview/frame/{stream}")
    async def preview_frame(web, request, stream):
        frame = frames.get(stream)
        if frame is None:
            # The name is echoed: no browser may take the answer for anything but text.
            return web.text(f"no frame of stream {stream!r}", status=404, headers={"X-Content-Type-Options": "nosniff"})
        return web.bytes(frame.jpeg, content_type="image/jpeg", headers={"Cache-Control": "no-store"})
