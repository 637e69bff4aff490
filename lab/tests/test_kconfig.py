"""Profiles and their fragments."""
import pytest

from lab import kconfig
from lab.common import ConfigError


def names(profile):
    return [p.name for p in kconfig.fragments(profile)]


def test_every_profile_has_its_fragment():
    for profile in kconfig.PROFILES:
        assert (kconfig.CONFIG_DIR / f"{profile}.config").exists(), profile


def test_kasan_builds_on_debug():
    assert names("kasan")[:3] == ["base.config", "debug.config", "kasan.config"]
    assert kconfig.baseline_profile("kasan") == "debug"


def test_plain_profiles():
    assert names("perf")[:2] == ["base.config", "perf.config"]
    assert kconfig.baseline_profile("perf") == "perf"


def test_unknown_profile():
    with pytest.raises(ConfigError):
        kconfig.fragments("nosuch")
