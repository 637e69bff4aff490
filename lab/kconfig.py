"""Kernel configuration from the repo's fragments, the way kunit_config does
it: defconfig + kvm_guest.config + config/base.config (the lab's guest) +
config/mm.config + config/<profile>.config (a profile may build on another:
kasan = debug + kasan.config; package = perf + package.config, without
base.config's trimming: a kernel for real machines)
(+ config/features.config: options of our series, ignored on a tree whose
Kconfig does not know them), merged with scripts/kconfig/merge_config.sh,
then olddefconfig, then a check that every requested option survived."""
from __future__ import annotations

import re
from pathlib import Path

from .common import CONFIG_DIR, ConfigError, info, run, sha256_files, step

# profile -> the profiles its fragments build on: kasan is debug + KASAN
PROFILES = {"debug": (), "perf": (), "kasan": ("debug",), "package": ("perf",)}
# The profiles whose kernels only the lab's guest boots: config/base.config
# turns off what it lacks (hardware, filesystems, modules). A package is for
# real machines too: defconfig's drivers stay.
GUEST_ONLY = ("debug", "perf", "kasan")
_LINE = re.compile(r"^(CONFIG_\w+)=(.*)$|^# (CONFIG_\w+) is not set$")


def fragments(profile: str) -> list[Path]:
    if profile not in PROFILES:
        raise ConfigError(f"unknown profile {profile!r}", hint=f"one of {', '.join(PROFILES)}")
    out = [CONFIG_DIR / "base.config"] if profile in GUEST_ONLY else []
    out += [CONFIG_DIR / "mm.config"]
    out += [CONFIG_DIR / f"{p}.config" for p in (*PROFILES[profile], profile)]
    feat = CONFIG_DIR / "features.config"
    return out + ([feat] if feat.exists() else [])


def parse(text: str) -> dict[str, str]:
    """CONFIG_FOO -> value ('n' for 'is not set'); later lines win."""
    out = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            if m.group(3):
                out[m.group(3)] = "n"
            else:
                out[m.group(1)] = "n" if m.group(2) == "n" else m.group(2)
    return out


def _declared_symbols(src: Path) -> set[str]:
    syms = set()
    for k in src.rglob("Kconfig*"):
        if k.is_file():
            syms.update(re.findall(r"^\s*(?:menu)?config\s+(\w+)", k.read_text(errors="replace"),
                                   re.M))
    return syms


def _switches() -> list[tuple[str, str]]:
    """The "# sysctl: <name>=<value>" lines of config/features.config: the
    one table of the series' run-time switches and their all-on values."""
    feat = CONFIG_DIR / "features.config"
    text = feat.read_text() if feat.exists() else ""
    return re.findall(r"^# sysctl: ([\w.]+)=(\S+)\s*$", text, re.M)


def feature_sysctls() -> list[str]:
    """The run-time switches of our features ("vm.pte_table_reclaim")."""
    return [name for name, _ in _switches()]


def all_on_sysctls() -> list[str]:
    """Every switch of the series at its all-on value ("vm.cow_pte=2"): what
    `ptlab soak` boots with."""
    return [f"{name}={value}" for name, value in _switches()]


def check(src: Path, dotconfig: Path, frags: list[Path], strict: bool = True) -> None:
    """Raise ConfigError naming every requested option that Kconfig dropped.
    Not `strict` (a tree without our series): features.config's options
    that its Kconfig does not declare are left out."""
    got = parse(dotconfig.read_text())
    declared = None
    bad = []
    for frag in frags:
        for sym, want in parse(frag.read_text()).items():
            have = got.get(sym, "n")
            if have == want:
                continue
            if frag.name == "features.config" and not strict:
                declared = declared if declared is not None else _declared_symbols(src)
                if sym[7:] not in declared:
                    continue    # a feature this kernel does not have
            bad.append(f"{sym}: requested {want}, got {have}   ({frag.name})")
    if bad:
        raise ConfigError(f"Kconfig dropped {len(bad)} requested option(s) "
                          "(missing dependency or typo)", details="\n".join(bad),
                          hint="fix the fragment in config/, see `make menuconfig` "
                               "for the dependencies")


def _stamp(src: Path, profile: str) -> str:
    kconfigs = sorted(p for p in src.rglob("Kconfig*") if p.is_file())
    base = [src / "arch/x86/configs/x86_64_defconfig", src / "kernel/configs/kvm_guest.config"]
    return sha256_files(fragments(profile) + base + kconfigs, extra=profile)


def configure(src: Path, build: Path, profile: str, strict: bool = True) -> Path:
    """Write build/.config for `profile`; a no-op when nothing changed.
    `strict`: every option of config/features.config must survive (the
    patched kernel); else those the tree does not declare are skipped."""
    build.mkdir(parents=True, exist_ok=True)
    dotconfig = build / ".config"
    stamp_file = build / ".ptlab-config.sha256"
    stamp = _stamp(src, profile)
    if dotconfig.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        return dotconfig
    step(f"configure {build.name}: defconfig + kvm_guest.config + "
         + " + ".join(f.name for f in fragments(profile)))
    make = ["make", "-C", str(src), f"O={build}", "-s"]
    run(make + ["defconfig"], err=ConfigError, what="make defconfig")
    frags = [src / "kernel/configs/kvm_guest.config", *fragments(profile)]
    run([str(src / "scripts/kconfig/merge_config.sh"), "-m", "-O", str(build), str(dotconfig),
         *map(str, frags)], cwd=src, err=ConfigError, what="merge_config.sh")
    run(make + ["olddefconfig"], err=ConfigError, what="make olddefconfig")
    check(src, dotconfig, fragments(profile), strict)
    stamp_file.write_text(stamp)
    info(f"{dotconfig}: every requested option is set")
    return dotconfig


def baseline_profile(profile: str) -> str:
    """The profile whose vanilla results judge this one: a profile that
    only adds checks to another (kasan) has that one's results."""
    return (*PROFILES[profile], profile)[0]
