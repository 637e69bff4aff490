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

from . import kconfig
from .common import (BENCH_DIR, GUEST_TESTS_DIR, BuildError, Progress, cache_dir, info, jobs, run,
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
FIRST_BUILD_STEPS = {"kernel-debug": 2210, "kernel-perf": 2150, "selftests": 45}


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
    """Configure and build vmlinux for `profile`; returns its path."""
    build = build_dir(kernel_dir, profile)
    # the patched tree must keep every option of our series; vanilla and the
    # older commits a benchmark may name need not have them
    kconfig.configure(src, build, profile, strict=kernel_dir.name == "patched")
    step(f"build {kernel_dir.name} kernel ({profile}), -j{jobs()} with ccache")
    cmd = ["make", "-C", str(src), f"O={build}", f"-j{jobs()}", "CC=ccache gcc", "vmlinux"]
    _make_with_progress(cmd, build / "ptlab-build.log", f"{kernel_dir.name}/{profile}",
                        f"kernel-{profile}")
    return build / "vmlinux"


SELFTEST_NAMES_NEEDED = ("cow", "uffd-unit-tests", "migration", "madv_populate")


def build_selftests(src: Path, kernel_dir: Path) -> Path:
    """Static mm selftests from `src`; returns the directory with the binaries."""
    out = kernel_dir / "selftests"
    hdr = out / "usr"
    stamp = out / ".ptlab-head"
    head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip() or "nogit"
    dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--",
                            "tools/testing/selftests", "include/uapi"],
                           capture_output=True, text=True).stdout
    bins = out / "kselftest" / "mm"
    if stamp.exists() and stamp.read_text() == head and not dirty and \
            all((bins / n).exists() for n in SELFTEST_NAMES_NEEDED):
        return bins
    step(f"build mm selftests (static) from {kernel_dir.name}")
    out.mkdir(parents=True, exist_ok=True)
    run(["make", "-C", str(src), f"O={out}", "-s", "headers"], err=BuildError,
        what="make headers")
    cmd = ["make", "-C", str(src / "tools/testing/selftests"), "TARGETS=mm", f"O={out}",
           f"-j{jobs()}", "EXTRA_CFLAGS=-static", "USERLDFLAGS=-static",
           f"KHDR_INCLUDES=-isystem {hdr}/include", "CC=ccache gcc"]
    _make_with_progress(cmd, out / "ptlab-build.log", "mm selftests", "selftests")
    stamp.write_text(head)
    return bins


GUEST_SOURCE_DIRS = (GUEST_TESTS_DIR, BENCH_DIR)


def build_guest_programs(src: Path, kernel_dir: Path) -> Path:
    """Our own guest tests (tests/guest/*.c) and benchmarks (bench/*.c), static,
    against the tree's uapi headers and kselftest_harness.h."""
    out = kernel_dir / "guest-bin"
    out.mkdir(parents=True, exist_ok=True)
    hdr = kernel_dir / "selftests" / "usr" / "include"
    for d in GUEST_SOURCE_DIRS:
        for c in sorted(d.glob("*.c")):
            exe = out / c.stem
            deps = [c, *d.glob("*.h")]
            if exe.exists() and all(x.stat().st_mtime < exe.stat().st_mtime for x in deps):
                continue
            run(["gcc", "-static", "-O2", "-g", "-Wall", "-Werror", "-D_GNU_SOURCE",
                 "-isystem", str(hdr), "-I", str(src / "tools/testing/selftests"),
                 "-I", str(d), str(c), "-o", str(exe), "-lpthread", "-lnuma"],
                err=BuildError, what=f"compile {c.relative_to(d.parent)}")
            info(f"built {c.relative_to(d.parent)}")
    return out


def programs(src: Path, kernel_dir: Path) -> tuple[Path, Path]:
    """What runs in the guest, built from the patched tree for both kernels
    (tools/ does not change the kernel): (mm selftests dir, our programs dir)."""
    return build_selftests(src, kernel_dir), build_guest_programs(src, kernel_dir)
