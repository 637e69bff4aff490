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
from dataclasses import dataclass, replace
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


def split_plan(plan: list[PlanItem], jobs: int) -> list[list[PlanItem]]:
    """The plan in `jobs` parts of about the same expected time (each item's
    `secs`, longest first onto the least loaded part); each part keeps the
    plan's order, and the same plan always splits the same way. The busy
    items all go to the first part, one after another: two of them side by
    side keep more vCPUs busy than the host has CPUs, and then each takes
    far longer (uffd-unit-tests 598 s instead of 187 beside
    hugetlb_fault_after_madv, 418 s instead of 223, on 2 CPUs, 2026-11-28)."""
    parts: list[list[int]] = [[] for _ in range(max(1, jobs))]
    load = [0.0] * len(parts)
    for i, item in enumerate(plan):
        if item.busy:
            parts[0].append(i)
            load[0] += item.secs
    for i in sorted((i for i, item in enumerate(plan) if not item.busy),
                    key=lambda i: (-plan[i].secs, i)):
        k = min(range(len(parts)), key=lambda k: (load[k], k))
        parts[k].append(i)
        load[k] += plan[i].secs
    return [[plan[i] for i in sorted(p)] for p in parts if p]


def default_jobs(machine: Machine = DEFAULT) -> int:
    """How many guests `ptlab test` runs side by side: one per two host CPUs,
    the share each guest had when the plan's time limits and the baseline
    were set, as many as the host's available memory holds (the guest's RAM
    and 2 GiB for QEMU), at most 4. On 2 CPUs: one. Two guests on 2 CPUs
    (-j 2) took 1390 s instead of ~1720, but each busy test took 2-3 times as
    long beside the other guest, and tests that race their own threads saw
    timings no run had seen: uffd-stress hugetlb-private, whose 32 huge pages
    leave none for the temporary copy of hugetlb_mfill_atomic_pte()'s retry,
    failed with ENOMEM (2026-11-28)."""
    avail = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            avail = int(line.split()[1]) // 1024
    per = sum(machine.nodes) + 2048
    return max(1, min((os.cpu_count() or 1) // 2, avail // per, 4))


@dataclass
class _Guest:
    """One QEMU running part of a plan."""
    workdir: Path
    proc: subprocess.Popen
    t0: float
    seen: int = 0               # tests whose end on_test() was told
    killed: bool = False        # by the host's timeout or silent_limit
    current: str = "boot"


def _start(vmlinux: Path, plan: list[PlanItem], bins: list[Path], workdir: Path,
           accel: str, machine: Machine) -> _Guest:
    workdir.mkdir(parents=True, exist_ok=True)
    cpio = make_initramfs(workdir, plan, bins)
    console, results = workdir / "console.log", workdir / "results.txt"
    for f in (console, results):
        f.write_text("")
    args = machine.qemu_args(accel, str(vmlinux), str(cpio),
                             ["-serial", f"file:{console}"], f"file:{results}")
    (workdir / "qemu-cmdline").write_text(" ".join(args) + "\n")
    with open(workdir / "qemu.log", "w") as log:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)
    return _Guest(workdir, proc, time.monotonic())


def boot(vmlinux: Path, plan: list[PlanItem], bins: list[Path], workdir: Path,
         accel: str | None = None, timeout: int = 3600, machine: Machine = DEFAULT,
         quiet: bool = False, on_test=None, features: list[str] = (),
         sysctls: list[str] = (), silent_limit: float | None = None,
         jobs: int = 1) -> Outcome:
    """Boot, run the plan, power off. `on_test(run)` is called as each test ends.
    `features`: sysctls the kernel must have (ptlab.features=): the guest
    fails the run without one (the tests read /proc/config.gz for the
    same).  `sysctls`: "name=value" items
    the kernel sets at boot (its own sysctl.name=value parameters); the
    guest reads each back and fails the run if one is missing or differs.
    `silent_limit`: kill the guest if its console is still empty after that
    many seconds. `jobs` > 1: that many guests side by side, each with a
    part of the plan (split_plan()) in workdir/guest-N; `timeout` is each
    guest's."""
    workdir.mkdir(parents=True, exist_ok=True)
    accel = accel or probe_accel(vmlinux)
    machine = replace(machine, cmdline=(*machine.cmdline, *kernel_params(features, sysctls)))
    parts = split_plan(plan, jobs) if jobs > 1 else [plan]
    dirs = [workdir] if len(parts) == 1 else \
        [workdir / f"guest-{i + 1}" for i in range(len(parts))]
    t0 = time.monotonic()
    guests = [_start(vmlinux, p, bins, d, accel, machine) for p, d in zip(parts, dirs)]
    prog = Progress(every=20.0)
    while any(g.proc.poll() is None for g in guests):
        time.sleep(0.5)
        for g in guests:
            runs = parse_channel((g.workdir / "results.txt").read_text(errors="replace")).runs
            ended = [r for r in runs if r.rc is not None]
            for r in ended[g.seen:]:
                if on_test:
                    prog.done()
                    on_test(r)
            g.seen = len(ended)
            g.current = runs[-1].suite + "/" + runs[-1].test \
                if runs and runs[-1].rc is None else ("boot" if not runs else "-")
            now = time.monotonic()
            if g.proc.poll() is None and (now - g.t0 > timeout or (
                    silent_limit and now - g.t0 > silent_limit
                    and not (g.workdir / "console.log").stat().st_size)):
                g.killed = True
                g.proc.kill()
        if not quiet:
            running = ", ".join(g.current for g in guests if g.proc.poll() is None)
            prog.update(f"guest{'s' if len(guests) > 1 else ''}: "
                        f"{sum(g.seen for g in guests)}/{len(plan)} tests done, "
                        f"running {running}, {int(time.monotonic() - t0)} s")
    prog.done()
    out = collect(workdir, time.monotonic() - t0)
    for g in guests:
        ch = parse_channel((g.workdir / "results.txt").read_text(errors="replace"))
        for r in [r for r in ch.runs if r.rc is not None][g.seen:]:
            if on_test:
                on_test(r)
        if quiet:
            continue
        name = "guest" if len(guests) == 1 else g.workdir.name
        said = (g.workdir / "qemu.log").read_text(errors="replace").strip()
        if g.killed:
            warn(f"{name} killed after {int(time.monotonic() - g.t0)} s (host timeout)")
        elif not ch.done:
            warn(f"{name} stopped before the end of its plan (crash or panic?); "
                 f"console: {g.workdir / 'console.log'}"
                 + (f"; qemu said: {said[:300]}" if said else ""))
    return out


def collect(workdir: Path, wall: float = 0.0) -> Outcome:
    """Read a run's results channel and console (also for a finished run);
    a run of several guests (workdir/guest-N) as one."""
    parts = sorted(workdir.glob("guest-*"), key=lambda d: int(d.name.split("-")[1]))
    if parts:
        outs = [collect(d) for d in parts]
        splats = []
        for d, o in zip(parts, outs):
            splats += [replace(sp, log=f"{d.name}/{o.log.name}") for sp in o.splats]
        return Outcome([r for o in outs for r in o.runs], all(o.finished for o in outs),
                       splats, workdir, workdir, f"{outs[0].boot}; {len(outs)} guests", wall,
                       workdir, sum(o.dropped for o in outs),
                       [s for o in outs for s in o.setup],
                       all(o.dmesg_saved for o in outs))
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
    splats = [replace(sp, log=log.name) for sp in splat.scan(scanned)]
    return Outcome(ch.runs, ch.done, splats, console, results, ch.boot, wall, log,
                   splat.dropped(text), ch.setup, ch.dmesg is not None)


def host_root_args(cwd: Path) -> tuple[list[str], list[str]]:
    """(QEMU arguments, kernel parameters) that give the guest's init the
    host's files: / read-only and the lab's cache read-write over 9p, the
    command run in them (chroot) from `cwd`"""
    cache = cache_dir().resolve()
    for what, path in (("this directory", cwd), ("the lab's cache", cache)):
        if re.search(r"[\s,'\"\\]", str(path)):
            raise GuestError(f"{what}, {path}, has a space, comma, quote or backslash: it "
                             "cannot go on the kernel command line or QEMU's -virtfs",
                             hint="run from, and set PTLAB_CACHE to, a plain path")
    fs = "local,security_model=none,multidevs=remap,path="
    # trace_event=: as for the benchmarks' guest (bench.BENCH_MACHINE): bench
    # --here would otherwise enable tlb:tlb_flush at run time, which patches
    # kernel text that TCG may then run stale
    return (["-virtfs", f"{fs}/,mount_tag=ptlab-host,readonly=on",
             "-virtfs", f"{fs}{cache},mount_tag=ptlab-cache"],
            [f"ptlab.hostroot={cwd}", f"ptlab.cache={cache}", "trace_event=tlb:tlb_flush"])


def shell(vmlinux: Path, bins: list[Path], workdir: Path, machine: Machine = DEFAULT,
          command: str = "", append: list[str] = (), timeout: int = 3600,
          host_root: Path | None = None) -> int:
    """Boot with the console on this terminal and a shell instead of the plan;
    with `command`, run it (sh -c, in /ptlab/bin, stdin /dev/null) and power
    off: the exit status is the command's, QEMU is killed after `timeout`
    seconds. `append`: more kernel parameters. `host_root`: run `command`
    in the host's files from that directory (host_root_args())."""
    workdir.mkdir(parents=True, exist_ok=True)
    cpio = make_initramfs(workdir, [], bins, shell=True, command=command)
    accel = probe_accel(vmlinux)
    qemu, params = host_root_args(host_root) if host_root else ([], [])
    machine = replace(machine, cmdline=(*machine.cmdline, *append, *params),
                      extra=[*machine.extra, *qemu])
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
