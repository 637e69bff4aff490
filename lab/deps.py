"""Install what the lab needs on a Debian 12 host, all of it Debian packages
(pytest and matplotlib too: python3-pytest, python3-matplotlib, run with
Debian's python3). Idempotent: a second call costs one dpkg-query."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from .common import SetupError, run, step

KERNEL_SOURCE_PKG = "linux-source-6.12"
KERNEL_SOURCE_VERSION = "6.12.117-1~deb12u1"   # the series is made for this one

APT_BUILD = ["build-essential", "flex", "bison", "bc", "libelf-dev", "libssl-dev",
             "dwarves", "cpio", "ccache", "xz-utils", "rsync", "kmod", "git"]
APT_SELFTESTS = ["libnuma-dev", "libcap-dev", "liburing-dev"]
APT_GUEST = ["qemu-system-x86", "busybox-static", "bash-static", "stress-ng", "numactl",
             "redis-server", "trinity"]
APT_PYTHON = ["python3-pytest", "python3-matplotlib"]
# checkpatch.pl's SPDX check runs scripts/spdxcheck.py, which imports ply and git
APT_CHECK = ["python3-ply", "python3-git"]
# `ptlab package` only: make bindeb-pkg's debian/rules runs debhelper
APT_PACKAGE = ["debhelper", "dpkg-dev"]
# `ptlab bench --here` on a real machine: the programs' build and the plots,
# and the host's redis-server that bench_redis runs (no QEMU, no guest tools)
APT_HERE = APT_BUILD + APT_SELFTESTS + APT_PYTHON + ["redis-server"]
APT_ALL = APT_BUILD + APT_SELFTESTS + APT_GUEST + APT_PYTHON + APT_CHECK
SYSTEM_PYTHON = Path("/usr/bin/python3")


def _missing_apt(pkgs: list[str]) -> list[str]:
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Status}\n", *pkgs],
                         capture_output=True, text=True).stdout
    ok = {l.split()[0] for l in out.splitlines() if l.endswith(" installed")}
    return [p for p in pkgs if p not in ok]


def _apt_install(pkgs: list[str]) -> None:
    if os.geteuid() != 0:
        raise SetupError(f"missing Debian packages: {' '.join(pkgs)}",
                         hint=f"run as root, or: sudo apt-get install {' '.join(pkgs)}")
    step(f"apt-get install {' '.join(pkgs)}")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], env=env, err=SetupError, what="apt-get update")
    run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *pkgs], env=env,
        err=SetupError, what="apt-get install")


def ensure_apt(pkgs: list[str] = APT_ALL) -> None:
    missing = _missing_apt(pkgs + [KERNEL_SOURCE_PKG])
    if not missing:
        return
    if KERNEL_SOURCE_PKG in missing:
        missing.remove(KERNEL_SOURCE_PKG)
        _apt_install(missing + [f"{KERNEL_SOURCE_PKG}={KERNEL_SOURCE_VERSION}"]) \
            if _version_available() else _apt_install(missing + [KERNEL_SOURCE_PKG])
    else:
        _apt_install(missing)


def _version_available() -> bool:
    subprocess.run(["apt-get", "update", "-qq"], capture_output=True)
    out = subprocess.run(["apt-cache", "madison", KERNEL_SOURCE_PKG],
                         capture_output=True, text=True).stdout
    return KERNEL_SOURCE_VERSION in out


def python() -> Path:
    """Debian's python3, which has APT_PYTHON's packages (pytest for the lab's
    unit tests, matplotlib for the bench plots) whatever python runs ptlab."""
    return SYSTEM_PYTHON
