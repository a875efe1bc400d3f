"""lmspec.runtime.compat.seam: version checks name both releases; a swapped attribute is always restored,
a defined one always removed."""

from __future__ import annotations

import types

import pytest

from lmspec.runtime.compat.seam import (
    UpstreamVersionError,
    defined,
    expect,
    installed_version,
    require,
    swapped,
    version_matches,
)


@pytest.mark.parametrize(
    ("version", "expected", "matches"),
    [
        ("0.16.1", "0.16.1", True),
        ("0.16.10", "0.16.1", False),
        ("0.32.0+cpu", "0.32.0", True),
        ("0.32.4", "0.32.*", True),
        ("0.320.0", "0.32.*", False),
        ("0.33.0", "0.32.*", False),
    ],
)
def test_version_matches_a_release_or_a_series(version: str, expected: str, matches: bool) -> None:
    assert version_matches(version, expected) is matches


def test_require_names_the_installed_and_the_expected_release() -> None:
    have = installed_version("jsonschema")
    assert have is not None
    require("a seam", "jsonschema", have)
    with pytest.raises(UpstreamVersionError) as info:
        require("a seam", "jsonschema", "0.0.1")
    assert f"jsonschema {have} is installed, but a seam was written for jsonschema 0.0.1" in str(info.value)
    with pytest.raises(UpstreamVersionError, match="no-such-dist-lmspec is not installed"):
        require("a seam", "no-such-dist-lmspec", "1.0")


def test_expect_warns_once_and_says_what_happens_instead(caplog: pytest.LogCaptureFixture) -> None:
    assert expect("a seam", "jsonschema", "0.0.1", "the patch is skipped") is False
    [record] = caplog.records
    assert record.levelname == "WARNING" and record.getMessage().endswith("; the patch is skipped")


def test_swapped_restores_the_attribute_also_when_the_block_fails() -> None:
    owner = types.SimpleNamespace(f="original")
    with pytest.raises(RuntimeError), swapped(owner, "f", "patched") as original:
        assert owner.f == "patched" and original == "original"
        raise RuntimeError
    assert owner.f == "original"
    with pytest.raises(AttributeError), swapped(owner, "gone", 1):
        pass
    assert not hasattr(owner, "gone")


def test_defined_adds_a_missing_name_for_the_block_only() -> None:
    owner = types.SimpleNamespace(present=1)
    with pytest.raises(RuntimeError), defined(owner, "missing", None):
        assert owner.missing is None
        raise RuntimeError
    assert not hasattr(owner, "missing")
    with pytest.raises(AttributeError, match="present is defined upstream now"), defined(owner, "present", 2):
        pass
    assert owner.present == 1
