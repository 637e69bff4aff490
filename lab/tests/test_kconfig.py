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
    assert names("kasan")[:4] == ["base.config", "mm.config", "debug.config", "kasan.config"]
    assert kconfig.baseline_profile("kasan") == "debug"


def test_plain_profiles():
    assert names("perf")[:3] == ["base.config", "mm.config", "perf.config"]
    assert kconfig.baseline_profile("perf") == "perf"


def test_a_package_is_not_trimmed_for_the_guest():
    """`ptlab package`: perf's options and the mm under test, but defconfig's
    drivers and filesystems (base.config's trimming) kept for real machines"""
    assert names("package")[:3] == ["mm.config", "perf.config", "package.config"]
    assert kconfig.baseline_profile("package") == "perf"


def test_unknown_profile():
    with pytest.raises(ConfigError):
        kconfig.fragments("nosuch")


def test_a_compiled_out_feature_fails_the_patched_kernel(tmp_path):
    """Issue 11, item 3: our series' options must survive olddefconfig on
    the patched kernel, whether or not its Kconfig declares them (a patch
    that lost its Kconfig entry must not pass as vanilla)."""
    feat = tmp_path / "features.config"
    feat.write_text("# sysctl: vm.pte_table_reclaim=1\nCONFIG_PTE_TABLE_RECLAIM=y\n")
    dotconfig = tmp_path / ".config"
    dotconfig.write_text("# CONFIG_PTE_TABLE_RECLAIM is not set\n")
    src = tmp_path / "src"
    src.mkdir()             # declares nothing: like vanilla
    with pytest.raises(ConfigError) as e:
        kconfig.check(src, dotconfig, [feat], strict=True)
    assert "CONFIG_PTE_TABLE_RECLAIM" in e.value.details
    kconfig.check(src, dotconfig, [feat], strict=False)     # vanilla: skipped
    (src / "Kconfig").write_text("config PTE_TABLE_RECLAIM\n\tbool\n")
    with pytest.raises(ConfigError):                        # declared: never skipped
        kconfig.check(src, dotconfig, [feat], strict=False)


def test_feature_sysctls_come_from_features_config():
    assert kconfig.feature_sysctls() == ["vm.migration_walk_early_exit", "vm.pte_table_reclaim",
                                         "vm.cow_pte", "vm.uffd_move_batch"]
