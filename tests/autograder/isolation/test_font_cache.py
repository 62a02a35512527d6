"""autograder.isolation.font_cache: the sandboxes' font list is used only while the font folders
are as they were when it was made (a font installed after `make setup`, e.g. with chromium,
must not be missing from every sandbox's list)."""
import json

import pytest

from autograder.isolation import font_cache


@pytest.fixture
def made(tmp_path, monkeypatch):
    """A font list in a CACHE of its own, stamped from one font folder (with a subfolder)."""
    fonts, cache = tmp_path / "fonts", tmp_path / "cache"
    (fonts / "truetype").mkdir(parents=True)
    (fonts / "truetype" / "a.ttf").write_bytes(b"font")
    cache.mkdir()
    (cache / "fontlist-v390.json").write_text("{}")
    folders = [str(fonts), str(tmp_path / "not-there")]
    (cache / font_cache.STAMP).write_text(json.dumps({"folders": folders, "fingerprint": font_cache.fingerprint(folders)}))
    monkeypatch.setattr(font_cache, "CACHE", cache)
    return fonts, cache


def test_a_fresh_list_is_used(made):
    assert font_cache.cache_dir() == made[1]


@pytest.mark.parametrize("change", ["font added", "font removed", "folder added", "missing folder appears"])
def test_a_list_made_before_the_fonts_changed_is_not_used(made, change):
    fonts, cache = made
    if change == "font added":
        (fonts / "truetype" / "b.ttf").write_bytes(b"font")
    elif change == "font removed":
        (fonts / "truetype" / "a.ttf").unlink()
    elif change == "folder added":
        (fonts / "opentype").mkdir()
    else:
        (fonts.parent / "not-there").mkdir()
    assert font_cache.cache_dir() is None, change


@pytest.mark.parametrize("stamp", [None, "not json", '{"folders": ["/"]}', '{"folders": 3, "fingerprint": "x"}'])
def test_no_or_a_broken_stamp_means_no_list(made, stamp):
    path = made[1] / font_cache.STAMP
    if stamp is None:
        path.unlink()
    else:
        path.write_text(stamp)
    assert font_cache.cache_dir() is None


def test_no_font_list_means_none(made):
    (made[1] / "fontlist-v390.json").unlink()
    assert font_cache.cache_dir() is None
