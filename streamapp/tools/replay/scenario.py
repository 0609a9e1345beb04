"""Scenarios: a recording, the transforms that disturb it, and what the join must make of it."""

from __future__ import annotations

import json
from pathlib import Path

from streamapp.settings import Settings
from streamapp.tools.replay.publish import ReplayTarget, epoch_offset_to_now, open_recordings
from streamapp.tools.replay.transforms import ReplayError, ShiftEpochs, apply, parse_transform


class ReplayPlan:
    """What to replay, how: recordings, transforms (seeded), speed and target topics."""

    def __init__(self, recordings: list[Path], specs: list[str], *, seed: int, speed: float | None,
                 settings: Settings, rename: dict[str, str] | None = None, by_key: bool = False,
                 fresh_epochs: bool = False) -> None:
        if not recordings:
            raise ReplayError("no recording given (pass one or more files, or --scenario)")
        self.recordings, self.speed = recordings, speed
        records, partitions = open_recordings(recordings)
        self.target = ReplayTarget(rename or {}, partitions, by_key)
        self.transforms = [parse_transform(spec, seed=seed, position=position,
                                                  bucket_size=settings.bucket_size)
                           for position, spec in enumerate(specs)]
        if fresh_epochs:
            offset = epoch_offset_to_now(records)
            self.transforms.insert(0, ShiftEpochs(offset, settings.bucket_size))

    def records(self):
        """The transformed records; a new pass each call (transforms restart from their seed)."""
        records, _ = open_recordings(self.recordings)
        return apply(records, self.transforms)


class Scenario:
    """A scenario file (JSON, see docs/recording-format.md): recordings (relative to the file),
    transforms, seed, speed, the ``STREAMAPP_*`` settings its expectations hold for (``env``),
    and the expected counters of the join."""

    def __init__(self, path: Path, data: dict) -> None:
        self.path = path
        self.name = path.stem
        try:
            self.description = str(data.get("description", ""))
            self.recordings = [path.parent / name for name in data["recordings"]]
            self.transforms = [str(spec) for spec in data.get("transforms", [])]
            self.seed = int(data.get("seed", 0))
            self.speed = None if data.get("speed") == "max" else float(data.get("speed", 1.0))
            self.env = {str(name): str(value) for name, value in data.get("env", {}).items()}
            self.expect = {str(key): int(value) for key, value in data.get("expect", {}).items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise ReplayError(f"{path}: not a scenario file: {exc!r}") from None

    @classmethod
    def load(cls, path: Path) -> Scenario:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ReplayError(f"{path}: cannot read the scenario: {exc}") from None
        if not isinstance(data, dict):
            raise ReplayError(f"{path}: a scenario is a JSON object")
        return cls(Path(path), data)

    def settings(self, base: Settings) -> Settings:
        """``base`` with this scenario's settings applied."""
        return Settings.from_env({**base.to_env(), **self.env})
