"""Liveness and readiness of a worker, for probes (Kubernetes, Compose healthchecks).

* ``/healthz``: 200 whenever the event loop answers. The page is served by that loop, so a
  blocked loop (or a dead process) fails the probe by timing out.
* ``/readyz``: 200 when every readiness condition holds, else 503; both list each condition and
  whether it holds, so a 503 names what is not met.

A condition is a name and a function that says whether it holds now; the app adds its own
(partitions assigned, tables recovered) and each stage adds what can stop it taking records
(:meth:`Readiness.add`, one line per condition).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import faust
from faust.tables import TableManager

from streamapp.worker.metrics import Metrics


class Readiness:
    """Named conditions that must all hold for the worker to be ready."""

    def __init__(self) -> None:
        self._conditions: dict[str, Callable[[], bool]] = {}

    def add(self, name: str, holds: Callable[[], bool]) -> None:
        if name in self._conditions:
            raise ValueError(f"readiness condition {name!r} is added twice")
        self._conditions[name] = holds

    def report(self) -> dict[str, bool]:
        return {name: bool(holds()) for name, holds in self._conditions.items()}

    def unmet(self) -> list[str]:
        return [name for name, met in self.report().items() if not met]


class Assignment:
    """Whether the consumer holds the assignment of the group's current generation: false from
    the start and from each revocation until the partitions are assigned (an empty assignment
    counts: a worker beyond the partition count is idle, not broken)."""

    def __init__(self, app: faust.App) -> None:
        self.assigned = False
        # mode types its receivers more narrowly than any method can match; it calls them as
        # receiver(sender, *args, signal=..., **kwargs).
        app.on_partitions_revoked.connect(cast(Any, self._revoked))
        app.on_partitions_assigned.connect(cast(Any, self._assigned))

    def _revoked(self, sender: Any, *args: Any, **kwargs: Any) -> None:
        self.assigned = False

    def _assigned(self, sender: Any, *args: Any, **kwargs: Any) -> None:
        self.assigned = True


def tables_recovered(app: faust.App) -> bool:
    """Faust has read every assigned table partition back from its changelog and resumed the
    streams (trivially so on a worker without tables); a rebalance clears it until then."""
    recovery = cast(TableManager, app.tables).recovery
    return recovery.completed.is_set() and not app.rebalancing and not app.in_recovery


def register(app: faust.App, readiness: Readiness, metrics: Metrics) -> None:
    """Add the app's own conditions, serve ``/healthz`` and ``/readyz``, and show readiness as
    the ``worker_ready`` gauge (for an alert on a worker that stays not ready)."""
    assignment = Assignment(app)
    readiness.add("partitions assigned", lambda: assignment.assigned)
    readiness.add("tables recovered", lambda: tables_recovered(app))
    metrics.add_gauges(lambda: {"worker_ready": 0 if readiness.unmet() else 1})

    @app.page("/healthz")
    async def healthz(web, request):
        return web.json({"live": True})

    @app.page("/readyz")
    async def readyz(web, request):
        conditions = readiness.report()
        unmet = [name for name, met in conditions.items() if not met]
        return web.json({"ready": not unmet, "unmet": unmet, "conditions": conditions},
                        status=503 if unmet else 200, headers={"Cache-Control": "no-store"})
