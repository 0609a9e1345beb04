import cv2
import numpy as np
import pytest

from streamapp.tools.contactsheet import contact_sheet, save_contact_sheet


def _images(tmp_path, count: int) -> list:
    paths = []
    for index in range(count):
        path = tmp_path / f"{index}.jpg"
        cv2.imwrite(str(path), np.full((60, 80, 3), 40 + 40 * index, np.uint8))
        paths.append(path)
    return paths


def test_contact_sheet(tmp_path):
    paths = _images(tmp_path, 5)
    sheet = contact_sheet(paths, columns=2, tile_width=100)
    assert sheet.shape == (3 * 75, 2 * 100, 3)
    assert sheet[:75, :100].mean() == pytest.approx(40, abs=2)  # the first image, top left
    assert sheet[-75:, :100].mean() == pytest.approx(200, abs=2)  # the fifth, bottom left
    assert sheet[-75:, 100:].max() == 0  # the sixth tile is empty
    written = save_contact_sheet(tmp_path / "contact_sheet.png", paths, columns=3, tile_width=64)
    assert cv2.imread(str(written)).shape == (2 * 48, 3 * 64, 3)
    with pytest.raises(ValueError):
        contact_sheet([])
