"""Out-of-tree kernel builds with ccache, the mm selftests and our own guest
programs. Build directories sit beside the source (kernels/<name>/build-<profile>)
so that every tree has the same relative layout and ccache hits across them."""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

from . import deps, kconfig
from .common import (BENCH_DIR, BuildError, Progress, cache_dir, info, jobs, run,
                     step)

# Fixed so that a fresh tree at a new place, or another machine, hits the cache.
BUILD_ENV = {
    "CCACHE_DIR": "",      # filled in by build_env()
    "CCACHE_BASEDIR": "/",
    "CCACHE_SLOPPINESS": "include_file_mtime,include_file_ctime,time_macros,locale",
    "CCACHE_MAXSIZE": "5G",
    "KBUILD_BUILD_TIMESTAMP": "Sun Nov 17 00:00:00 UTC 2024",
    "KBUILD_BUILD_USER": "ptlab",
    "KBUILD_BUILD_HOST": "ptlab",
    "LOCALVERSION": "",
}
_STEP = re.compile(r"^\s+(CC|AS|LD|AR|HOSTCC|HOSTLD|GEN|CHK|UPD|OBJCOPY|VDSO\w*|RELOCS|"
                   r"SYSHDR|SYSTBL|WRAP|HYPERCAP|MKELF|COPY|SHIPPED|POLICY|LEX|YACC|"
                   r"ZOFFSET|VOFFSET|KSYMS|NM|SORTTAB|CPUSTR|MKCAP|LDS|TEST|DESCEND|"
                   r"INSTALL|HDRINST|HDRTEST)\s")
_ERROR = re.compile(r"error|Error \d|undefined reference|No rule to make", re.I)


# Steps of a full build, measured here; until this machine has done one.
FIRST_BUILD_STEPS = {"kernel-debug": 2210, "kernel-perf": 2150, "kernel-package": 3000,
                     "selftests": 45}


def build_env() -> dict[str, str]:
    env = dict(BUILD_ENV)
    env["CCACHE_DIR"] = str(cache_dir() / "ccache")
    return env


def build_dir(kernel_dir: Path, profile: str) -> Path:
    return kernel_dir / f"build-{profile}"


def _counts_file() -> Path:
    return cache_dir() / "build-steps.json"


def _make_with_progress(cmd: list[str], log: Path, label: str, expect_key: str) -> None:
    """Run make, count its quiet-mode steps against the last full build's count."""
    counts = json.loads(_counts_file().read_text()) if _counts_file().exists() else {}
    expected = counts.get(expect_key) or FIRST_BUILD_STEPS.get(expect_key, 0)
    prog = Progress()
    t0 = time.monotonic()
    n = 0
    with open(log, "w") as lf:
        lf.write("$ " + " ".join(cmd) + "\n")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env={**os.environ, **build_env()})
        for line in proc.stdout:
            lf.write(line)
            if _STEP.match(line):
                n += 1
                pct = f" of ~{expected} ({min(99, 100 * n // expected)}%)" if expected else ""
                prog.update(f"{label}: {n} steps{pct}, {int(time.monotonic() - t0)} s")
        rc = proc.wait()
    prog.done()
    if rc != 0:
        lines = log.read_text(errors="replace").splitlines()
        errs = [l for l in lines if _ERROR.search(l)][:40]
        raise BuildError(f"{label} failed (exit {rc}); full log: {log}",
                         details="\n".join(errs or lines[-40:]))
    if n > expected * 0.5 or not expected:   # a full build: remember its size
        counts[expect_key] = n
        _counts_file().write_text(json.dumps(counts, indent=1))
    info(f"{label}: {n} steps in {int(time.monotonic() - t0)} s (log {log})")


def build_kernel(src: Path, kernel_dir: Path, profile: str) -> Path:
    """Configure and build vmlinux for `profile`; returns its path (for the
    package profile: the kernel image that its linux-image package installs)."""
    build = build_dir(kernel_dir, profile)
    # the patched tree must keep every option of our series; vanilla and the
    # older commits a benchmark may name need not have them
    kconfig.configure(src, build, profile, strict=kernel_dir.name == "patched")
    if profile == "package":
        return package_image(build_package(src, kernel_dir, build), build)
    step(f"build {kernel_dir.name} kernel ({profile}), -j{jobs()} with ccache")
    cmd = ["make", "-C", str(src), f"O={build}", f"-j{jobs()}", "CC=ccache gcc", "vmlinux"]
    _make_with_progress(cmd, build / "ptlab-build.log", f"{kernel_dir.name}/{profile}",
                        f"kernel-{profile}")
    return build / "vmlinux"


# --- Debian packages (`ptlab package`) ----------------------------------

def package_release(kernel_name: str) -> str:
    """LOCALVERSION of a packaged kernel: 6.12.117-ptlab is the series',
    6.12.117-ptlab-vanilla the kernel it is measured against; both can be
    installed side by side."""
    return "-ptlab" if kernel_name == "patched" else f"-ptlab-{kernel_name}"


def build_package(src: Path, kernel_dir: Path, build: Path) -> list[Path]:
    """`make bindeb-pkg` of a configured package build: linux-image and
    linux-headers (and linux-libc-dev) .debs in kernel_dir, returned."""
    deps.ensure_apt(deps.APT_PACKAGE)
    local = package_release(kernel_dir.name)
    version = subprocess.run(["make", "-s", "-C", str(src), "kernelversion"],
                             capture_output=True, text=True).stdout.strip()
    step(f"build {kernel_dir.name} kernel ({version}{local}), -j{jobs()} with ccache")
    # KBUILD_BUILD_VERSION: the "#1" of uname -v, which bindeb-pkg sets to
    # the package's revision; the same here, or each build links anew
    make = ["make", "-C", str(src), f"O={build}", f"-j{jobs()}", "CC=ccache gcc",
            f"LOCALVERSION={local}", "KBUILD_BUILD_VERSION=1", "KBUILD_VERBOSE=0"]
    _make_with_progress([*make, "all"], build / "ptlab-build.log",
                        f"{kernel_dir.name}/package", "kernel-package")
    # packaging again takes a minute: only when the image or a module is newer
    order = build / "modules.order"
    built = [build / "arch/x86/boot/bzImage"] + \
        [build / (m[:-2] + ".ko") for m in (order.read_text().split()
                                             if order.exists() else [])]
    newest = max(f.stat().st_mtime for f in built if f.exists())
    debs = sorted(kernel_dir.glob("*.deb"))
    done = build / ".ptlab-packaged"      # written once bindeb-pkg has succeeded
    if done.exists() and any(d.name.startswith("linux-image-") for d in debs) and \
            all(d.stat().st_mtime > newest for d in debs):
        return debs
    done.unlink(missing_ok=True)
    for old in debs:
        old.unlink()
    step(f"make bindeb-pkg: the {kernel_dir.name} kernel's packages")
    # the package's revision: the release's, so that a rebuild replaces it
    run([*make, f"KDEB_PKGVERSION={version}-1", "bindeb-pkg"], env=build_env(),
        err=BuildError, what="make bindeb-pkg")
    debs = sorted(kernel_dir.glob("*.deb"))
    if not any(d.name.startswith("linux-image-") for d in debs):
        raise BuildError(f"make bindeb-pkg made no linux-image package in {kernel_dir}",
                         details=", ".join(d.name for d in debs) or "no .deb at all")
    done.write_text(" ".join(d.name for d in debs) + "\n")
    return debs


def package_image(debs: list[Path], build: Path) -> Path:
    """The kernel image (/boot/vmlinuz-*) that the linux-image package
    installs, taken out of the .deb: what the lab boots to test a package."""
    deb = next(d for d in debs if d.name.startswith("linux-image-") and "-dbg_" not in d.name)
    out = build / "package-root"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    out.mkdir(parents=True)
    run(["dpkg-deb", "-x", str(deb), str(out)], err=BuildError, what=f"dpkg-deb -x {deb.name}")
    images = sorted((out / "boot").glob("vmlinuz-*"))
    if not images:
        raise BuildError(f"{deb.name} installs no /boot/vmlinuz-*")
    return images[0]


# upstream's, and the series' own (its selftests patches): a build without
# one of them is rebuilt
SELFTEST_NAMES_NEEDED = ("cow", "uffd-unit-tests", "migration", "madv_populate",
                         "pt_fork", "migration_walk", "pt_reclaim", "uffd_race",
                         "uffd_move", "cow_pte", "cow_pte_race", "cow_pte_equiv",
                         "cow_pte_diff")

# Static, so that the initramfs needs no libraries, and position-independent,
# so that the address space is laid out as for upstream's dynamically linked
# PIE programs. A static non-PIE program's heap starts anywhere in the 1 GiB
# above its .bss (x86-64 arch_randomize_brk()), and so can cover an address
# that a test maps at: khugepaged's mmap() hint of 1 GiB, "Failed to allocate
# VMA at 0x40000000" once in a run of 2026-11-28 (in a guest, bash-static's
# heap started above 512 MiB in 204 of 400 runs, at 0x405a4000 at most). A
# PIE's heap follows the program, at 2/3 of the address space.
STATIC = "-static-pie"


def elf_type(exe: Path) -> int | None:
    """ELF e_type: 2 (ET_EXEC) for a program at fixed addresses, 3 (ET_DYN)
    for a PIE; None for a file that is not ELF (a script)."""
    with open(exe, "rb") as f:
        head = f.read(18)
    return int.from_bytes(head[16:18], "little") if head[:4] == b"\x7fELF" else None


def is_pie(exe: Path) -> bool:
    return elf_type(exe) == 3


def _check_pie(exes: list[Path]) -> None:
    fixed = sorted(e.name for e in exes if e.is_file() and elf_type(e) == 2)
    if fixed:
        raise BuildError("not position-independent (" + STATIC + "): " + ", ".join(fixed),
                         hint="remove the build directory's programs and build again")


def build_selftests(src: Path, kernel_dir: Path) -> Path:
    """Static PIE mm selftests from `src`; returns the directory with the binaries."""
    out = kernel_dir / "selftests"
    hdr = out / "usr"
    stamp = out / ".ptlab-head"
    head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip() or "nogit"
    head += " " + STATIC
    dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--",
                            "tools/testing/selftests", "include/uapi"],
                           capture_output=True, text=True).stdout
    bins = out / "kselftest" / "mm"
    if stamp.exists() and stamp.read_text() == head and not dirty and \
            all((bins / n).exists() for n in SELFTEST_NAMES_NEEDED):
        return bins
    step(f"build mm selftests ({STATIC}) from {kernel_dir.name}")
    out.mkdir(parents=True, exist_ok=True)
    if stamp.exists() and not stamp.read_text().endswith(" " + STATIC) and bins.is_dir():
        # built with other flags, which make does not see
        for f in bins.iterdir():
            if f.is_file() and elf_type(f):
                f.unlink()
    run(["make", "-C", str(src), f"O={out}", "-s", "headers"], err=BuildError,
        what="make headers")
    cmd = ["make", "-C", str(src / "tools/testing/selftests"), "TARGETS=mm", f"O={out}",
           f"-j{jobs()}", f"EXTRA_CFLAGS={STATIC}", f"USERLDFLAGS={STATIC}",
           f"KHDR_INCLUDES=-isystem {hdr}/include", "CC=ccache gcc"]
    _make_with_progress(cmd, out / "ptlab-build.log", "mm selftests", "selftests")
    _check_pie(list(bins.iterdir()))
    stamp.write_text(head)
    return bins


def program_current(exe: Path, c: Path) -> bool:
    """Whether `exe` is a PIE built after its source `c` and the headers beside it"""
    return exe.exists() and is_pie(exe) and \
        all(x.stat().st_mtime < exe.stat().st_mtime for x in [c, *c.parent.glob("*.h")])


def build_guest_programs(src: Path, kernel_dir: Path) -> Path:
    """The benchmark programs (bench/*.c), static PIE, against the tree's uapi
    headers. (The series' own tests are mm selftests: build_selftests().)"""
    out = kernel_dir / "guest-bin"
    out.mkdir(parents=True, exist_ok=True)
    hdr = kernel_dir / "selftests" / "usr" / "include"
    for c in sorted(BENCH_DIR.glob("*.c")):
        exe = out / c.stem
        if program_current(exe, c):
            continue
        run(["gcc", STATIC, "-O2", "-g", "-Wall", "-Werror", "-D_GNU_SOURCE",
             "-isystem", str(hdr), "-I", str(src / "tools/testing/selftests"),
             "-I", str(BENCH_DIR), str(c), "-o", str(exe), "-lpthread", "-lnuma"],
            err=BuildError, what=f"compile bench/{c.name}")
        info(f"built bench/{c.name}")
    _check_pie(list(out.iterdir()))
    return out


def programs(src: Path, kernel_dir: Path) -> tuple[Path, Path]:
    """What runs in the guest, built from the patched tree for both kernels
    (tools/ does not change the kernel): (mm selftests dir, benchmarks dir)."""
    return build_selftests(src, kernel_dir), build_guest_programs(src, kernel_dir)
