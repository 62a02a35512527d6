"""Without a browser the smoke test never passes silently: a skip with the reason and a warning,
or a failure under CI."""
import pytest

from .conftest import _not_run


def test_missing_browser_skips_with_reason_and_warning(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.warns(UserWarning, match="BROWSER TESTS NOT RUN: no chromium"), \
            pytest.raises(pytest.skip.Exception, match="BROWSER TESTS NOT RUN: no chromium"):
        _not_run("no chromium")


def test_missing_browser_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="BROWSER TESTS NOT RUN: no chromium"):
        _not_run("no chromium")
