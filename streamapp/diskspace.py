"""A full file system is a pause, not a crash: the stage that meets it waits for space, then goes on.

Writers check free space ahead of time (a reserve), but a write between checks can still meet
"No space left on device". Either way the stage stops taking records (Kafka keeps them), logs
why once per pause, shows it in a gauge, and resumes by itself once enough space is free again.

RocksDB meets a full disk mostly in its background flushes; it then stops taking writes until a
flush succeeds. A write that would wait for that is refused instead ("write stall", see
tables/store.py), since waiting would block the event loop: a refused write is tried again
shortly, and counts as a full disk while free space is short.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from streamapp.units import format_bytes

log = logging.getLogger(__name__)
T = TypeVar("T")

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# RocksDB reports a full disk as an untyped error carrying the OS message.
_FULL_MESSAGES = ("No space left on device", "Disk quota exceeded")
_STALL_MESSAGE = "Write stall"
# Free space below which a paused stage does not try again, even with no reserve configured.
MIN_RESUME_BYTES = 4 * 1024**2


def resume_bytes_for(reserve_bytes: int) -> int:
    """The free space a paused stage waits for: its reserve, and at least MIN_RESUME_BYTES."""
    return max(reserve_bytes, MIN_RESUME_BYTES)


class DiskFull(OSError):
    """A write failed because its file system is full; nothing it started was kept."""


def is_disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
        return True
    return any(message in str(exc) for message in _FULL_MESSAGES)


def is_write_stall(exc: BaseException) -> bool:
    return _STALL_MESSAGE in str(exc)


def usage_of(path: Path):
    """``shutil.disk_usage`` of the file system holding ``path`` (its nearest existing ancestor)."""
    existing = Path(path).absolute()
    while not existing.exists():
        existing = existing.parent
    return shutil.disk_usage(existing)


def free_bytes_of(path: Path) -> Callable[[], int]:
    """Free bytes of the file system holding ``path``, asked anew at each call."""
    return lambda: usage_of(path).free


class SpacePause:
    """The paused/running state of one stage's writes to one file system."""

    def __init__(self, what: str, free_bytes: Callable[[], int], *, resume_bytes: int,
                 poll_s: float = 0.5, make_room: Callable[[], Awaitable[object]] | None = None) -> None:
        self.what = what
        self.free_bytes = free_bytes
        self.resume_bytes = resume_bytes_for(resume_bytes)
        self.poll_s = poll_s
        # Asked while paused, before each look at the free space: a stage that can free space of
        # its own (the sink, its oldest files) does so here.
        self.make_room = make_room
        self.pauses = 0
        self._space = asyncio.Event()
        self._space.set()

    @property
    def paused(self) -> bool:
        return not self._space.is_set()

    def pause(self, reason: str) -> None:
        if self.paused:
            return
        self.pauses += 1
        self._space.clear()
        log.error("disk full (%s): %s takes no records until %s are free (nothing is lost: they wait "
                  "in Kafka)", reason, self.what, format_bytes(self.resume_bytes))

    def check(self) -> bool:
        """Resume if paused and space is back; True while paused."""
        if self.paused:
            free = self.free_bytes()
            if free >= self.resume_bytes:
                self._space.set()
                log.warning("disk space is back (%s free); %s goes on", format_bytes(free), self.what)
        return self.paused

    async def still_paused(self) -> bool:
        """:meth:`check`, after letting the stage make room if it is paused."""
        if self.check() and self.make_room is not None:
            await self.make_room()
            return self.check()
        return self.paused

    async def wait(self) -> None:
        """Returns at once unless paused; then once space has come back."""
        while await self.still_paused():
            try:
                await asyncio.wait_for(self._space.wait(), self.poll_s)
            except TimeoutError:
                pass

    async def retry(self, write: Callable[[], T], *, offload: Callable | None = None) -> T:
        """Run ``write`` (in ``offload`` if given) until it does not meet a full disk."""
        while True:
            await self.wait()
            try:
                return await offload(write) if offload else write()
            except Exception as exc:  # noqa: BLE001 - RocksDB raises plain Exception
                self._met(exc)
                await asyncio.sleep(self.poll_s)  # a stall with space free clears once RocksDB has flushed

    async def unless_full(self, work: Callable[[], Awaitable[object]]) -> None:
        """Run ``work`` (periodic upkeep) unless paused; one that meets a full disk pauses."""
        if await self.still_paused():
            return
        try:
            await work()
        except Exception as exc:  # noqa: BLE001 - RocksDB raises plain Exception
            self._met(exc)

    def _met(self, exc: Exception) -> None:
        """Pause for a full disk or a stall while space is short; re-raise anything else. With
        space free again, RocksDB goes on refusing writes for a few seconds until it has resumed
        by itself: the caller tries again, without a new pause."""
        if not (is_disk_full(exc) or is_write_stall(exc)):
            raise exc
        if self.free_bytes() < self.resume_bytes:
            self.pause(_first_line(exc))
        else:
            log.debug("%s: a write was refused with space free, tried again: %s", self.what, _first_line(exc))

    def as_metrics(self, prefix: str = "") -> dict[str, float]:
        return {f"{prefix}disk_full_paused": int(self.paused),
                f"{prefix}disk_full_pauses_total": self.pauses}


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]
