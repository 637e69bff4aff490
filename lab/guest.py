"""Boot a kernel under QEMU with an initramfs of static test programs.

The initramfs holds busybox, bash, our init (lab/guest/init), the plan
(one test a line), the test binaries and the host's stress-ng, numactl,
redis-server and trinity with their shared libraries. The console (ttyS0)
goes to console.log and is scanned for splats; the results channel (ttyS1)
carries each test's output between PTLAB-BEGIN/END markers and the final
PTLAB-DONE.

Why not virtme-ng: it boots the host's root over 9p (~9 s per boot under
TCG against ~1.5 s here, measured before the lab existed), needs extra kernel
options (a different option set means another full build), and makes
the guest's file I/O go to the host; the benchmarks boot many times and
want a guest whose memory is all its own. See docs/lab.md.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from . import splat
from .run import Outcome, PlanItem, parse_channel
from .common import GuestError, Progress, cache_dir, info, step, warn
from .qemu_config import DEFAULT, Machine

INIT = Path(__file__).resolve().parent / "guest" / "init"
HELPERS = [Path(__file__).resolve().parent / "guest" / n for n in ("with-hugepages", "soak")]
HOST_TOOLS = ("stress-ng", "numactl", "migratepages", "setpriv", "redis-server", "trinity")


def _copy_with_libs(binary: str, root: Path) -> None:
    path = shutil.which(binary)
    if not path:
        return
    files = [path]
    ldd = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
    files += re.findall(r"(/\S+) \(0x", ldd)
    for f in files:
        dst = root / f.lstrip("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(f), dst)


def make_initramfs(workdir: Path, plan: list[PlanItem], bins: list[Path],
                   shell: bool = False, command: str = "") -> Path:
    """Write workdir/root.cpio (newc, uncompressed) and return it. `shell`:
    a shell instead of the plan, or `command` run by sh -c if one is given."""
    root = workdir / "root"
    shutil.rmtree(root, ignore_errors=True)
    for d in ("bin", "sbin", "usr/bin", "ptlab/bin", "lib64"):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2("/bin/busybox", root / "bin/busybox")
    shutil.copy2("/bin/bash-static", root / "bin/bash")
    shutil.copy2(INIT, root / "init")
    for b in [*bins, *HELPERS]:
        shutil.copy2(b, root / "ptlab/bin" / b.name)
    for tool in HOST_TOOLS:
        _copy_with_libs(tool, root)
    (root / "ptlab/plan").write_text("".join(p.line() + "\n" for p in plan))
    if shell:
        (root / "ptlab/shell").write_text(command)
    cpio = workdir / "root.cpio"
    files = subprocess.run(["find", "."], cwd=root, capture_output=True, text=True).stdout
    with open(cpio, "wb") as out:
        subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=root, input=files.encode(),
                       stdout=out, check=True)
    return cpio


KVM_PROBE_SILENT = 10


def probe_accel(vmlinux: Path) -> str:
    """'kvm' if a probe boot under KVM works on this machine, else 'tcg'.
    The answer is cached per machine (PTLAB_ACCEL overrides it)."""
    forced = os.environ.get("PTLAB_ACCEL")
    if forced in ("kvm", "tcg"):
        return forced
    cached = cache_dir() / "accel"
    if cached.exists():
        return cached.read_text().strip()
    accel = "tcg"
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        info("no usable /dev/kvm: using TCG (QEMU's emulation; absolute times mean nothing)")
    else:
        step("probe KVM with a short boot (once per machine)")
        work = cache_dir() / "runs" / "kvm-probe"
        work.mkdir(parents=True, exist_ok=True)
        # a kernel under KVM writes to its console within a second: a guest
        # silent for KVM_PROBE_SILENT s is stuck (nested KVM that cannot run it)
        out = boot(vmlinux, [PlanItem("probe", "echo", 10, ["echo", "ok"])], [], work,
                   accel="kvm", timeout=60, quiet=True, silent_limit=KVM_PROBE_SILENT)
        if out.ok and out.runs and out.runs[0].rc == 0:
            accel = "kvm"
            info("KVM works: using it")
        else:
            qemu_log = work / "qemu.log"
            why = (qemu_log.read_text(errors="replace").strip().splitlines() or [""])[-1] \
                if qemu_log.exists() else ""
            info("KVM unavailable (/dev/kvm is there, but a probe boot under it "
                 + (f"failed: {why[:160]}" if why else
                    f"wrote nothing in {KVM_PROBE_SILENT} s") + "): using TCG")
    cached.write_text(accel + "\n")
    return accel


def kernel_params(features: list[str], sysctls: list[str]) -> list[str]:
    """What boot() adds to the kernel command line for the guest's init."""
    params = [f"sysctl.{kv}" for kv in sysctls]
    if sysctls:
        params.append("ptlab.sysctls=" + ",".join(sysctls))
    if features:
        params.append("ptlab.features=" + ",".join(features))
    return params


def boot(vmlinux: Path, plan: list[PlanItem], bins: list[Path], workdir: Path,
         accel: str | None = None, timeout: int = 3600, machine: Machine = DEFAULT,
         quiet: bool = False, on_test=None, features: list[str] = (),
         sysctls: list[str] = (), silent_limit: float | None = None) -> Outcome:
    """Boot, run the plan, power off. `on_test(run)` is called as each test ends.
    `features`: sysctls the kernel must have (ptlab.features=): the guest
    fails the run without one (the tests read /proc/config.gz for the
    same).  `sysctls`: "name=value" items
    the kernel sets at boot (its own sysctl.name=value parameters); the
    guest reads each back and fails the run if one is missing or differs.
    `silent_limit`: kill the guest if its console is still empty after that
    many seconds."""
    workdir.mkdir(parents=True, exist_ok=True)
    cpio = make_initramfs(workdir, plan, bins)
    accel = accel or probe_accel(vmlinux)
    console, results = workdir / "console.log", workdir / "results.txt"
    for f in (console, results):
        f.write_text("")
    machine = replace(machine, cmdline=(*machine.cmdline, *kernel_params(features, sysctls)))
    args = machine.qemu_args(accel, str(vmlinux), str(cpio),
                             ["-serial", f"file:{console}"], f"file:{results}")
    (workdir / "qemu-cmdline").write_text(" ".join(args) + "\n")
    t0 = time.monotonic()
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    prog = Progress(every=20.0)
    seen = 0
    timed_out = False
    while proc.poll() is None:
        time.sleep(0.5)
        runs = parse_channel(results.read_text(errors="replace")).runs
        ended = [r for r in runs if r.rc is not None]
        for r in ended[seen:]:
            if on_test:
                prog.done()
                on_test(r)
        seen = len(ended)
        if not quiet:
            cur = runs[-1].suite + "/" + runs[-1].test if runs and runs[-1].rc is None else "boot"
            prog.update(f"guest: {seen}/{len(plan)} tests done, running {cur}, "
                        f"{int(time.monotonic() - t0)} s")
        if time.monotonic() - t0 > timeout or (
                silent_limit and time.monotonic() - t0 > silent_limit
                and not console.stat().st_size):
            timed_out = True
            proc.kill()
    prog.done()
    qemu_out = proc.stdout.read()
    if proc.returncode not in (0, None) and not timed_out and "qemu" in qemu_out.lower():
        (workdir / "qemu.log").write_text(qemu_out)
    out = collect(workdir, time.monotonic() - t0)
    for r in out.runs[seen:]:
        if r.rc is not None and on_test:
            on_test(r)
    if timed_out and not quiet:
        warn(f"guest killed after {int(time.monotonic() - t0)} s (host timeout)")
    elif not out.finished and not quiet:
        warn("guest stopped before the end of the plan (crash or panic?); "
             f"console: {console}" + (f"; qemu said: {qemu_out.strip()[:300]}" if qemu_out else ""))
    return out


def collect(workdir: Path, wall: float = 0.0) -> Outcome:
    """Read a run's results channel and console (also for a finished run)."""
    console, results = workdir / "console.log", workdir / "results.txt"
    if not results.exists():
        raise GuestError(f"{workdir} has no results.txt: the guest never started, "
                         "or this is not a run directory")
    ch = parse_channel(results.read_text(errors="replace"))
    text = console.read_text(errors="replace") if console.exists() else ""
    log, scanned = console, text
    if ch.dmesg is not None:
        # the ring buffer holds every level and what the console dropped
        log, scanned = workdir / "dmesg.txt", "\n".join(ch.dmesg) + "\n"
        log.write_text(scanned)
    return Outcome(ch.runs, ch.done, splat.scan(scanned), console, results, ch.boot, wall, log,
                   splat.dropped(text), ch.setup)


def shell(vmlinux: Path, bins: list[Path], workdir: Path, machine: Machine = DEFAULT,
          command: str = "", append: list[str] = (), timeout: int = 3600) -> int:
    """Boot with the console on this terminal and a shell instead of the plan;
    with `command`, run it (sh -c, in /ptlab/bin, stdin /dev/null) and power
    off: the exit status is the command's, QEMU is killed after `timeout`
    seconds. `append`: more kernel parameters."""
    workdir.mkdir(parents=True, exist_ok=True)
    cpio = make_initramfs(workdir, [], bins, shell=True, command=command)
    accel = probe_accel(vmlinux)
    machine = replace(machine, cmdline=(*machine.cmdline, *append))
    results = workdir / "results.txt"
    results.write_text("")
    args = machine.qemu_args(accel, str(vmlinux), str(cpio), ["-serial", "mon:stdio"],
                             f"file:{results}")
    (workdir / "qemu-cmdline").write_text(" ".join(args) + "\n")
    if not command:
        step(f"boot {vmlinux} ({accel}); Ctrl-A X quits QEMU")
        return subprocess.call(args)
    step(f"boot {vmlinux} ({accel}) and run: {command}")
    try:
        subprocess.run(args, stdin=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise GuestError(f"the guest did not end within {timeout} s: QEMU killed",
                         hint=f"--timeout; see {workdir}") from None
    m = re.search(r"^PTLAB-SHELL-EXIT (\d+)", results.read_text(errors="replace"), re.M)
    if not m:
        raise GuestError("the guest stopped before the command ended", hint=f"see {workdir}")
    return int(m.group(1))
