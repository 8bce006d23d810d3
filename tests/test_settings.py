"""weightdiag/settings.py: every environment variable, read at call time, bad values are exit 2."""

from __future__ import annotations

import pytest

from weightdiag import settings
from weightdiag.errors import BadInputError


def test_values_are_read_at_call_time(monkeypatch):
    monkeypatch.setenv("WEIGHTDIAG_HTTP_ATTEMPTS", "3")
    monkeypatch.setenv("WEIGHTDIAG_HTTP_BACKOFF", "0.25")
    assert settings.http_retries() == (3, 0.25)
    monkeypatch.delenv("WEIGHTDIAG_HTTP_ATTEMPTS")
    monkeypatch.delenv("WEIGHTDIAG_HTTP_BACKOFF")
    assert settings.http_retries() == (6, 0.5)
    monkeypatch.setenv("WEIGHTDIAG_DB", "/tmp/some-db")
    assert settings.db_dir() == "/tmp/some-db"
    monkeypatch.delenv("WEIGHTDIAG_DB")
    assert settings.db_dir() == "DATABASE"
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    assert settings.ray_address() == "ray://head:10001"
    monkeypatch.setenv("HF_HUB_CACHE", "/tmp/hf-cache")
    assert settings.hf_cache_dir() == "/tmp/hf-cache"
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    assert settings.progress_bars() is False


@pytest.mark.parametrize(
    ("name", "value", "read"),
    [
        ("WEIGHTDIAG_HTTP_ATTEMPTS", "many", settings.http_retries),
        ("WEIGHTDIAG_HTTP_BACKOFF", "soon", settings.http_retries),
        ("WEIGHTDIAG_HTTP_TIMEOUT", "-1", settings.http_timeout),
        ("WEIGHTDIAG_THREADS", "0", settings.threads),
    ],
)
def test_bad_values_are_bad_input_naming_the_variable(monkeypatch, name, value, read):
    monkeypatch.setenv(name, value)
    with pytest.raises(BadInputError, match=name):
        read()
