"""`ptlab soak`: the patched debug (or KASAN) kernel, every feature of the
series on, running stress-ng's page-table stressors under a memcg memory.high
smaller than their load, in parallel with our race tests in loops, for N
minutes (lab/guest/soak does the guest side).

Every switch of the series is on at its all-on value, from the one table of
switches in config/features.config (vm.cow_pte=2: every fork shares its
tables), NUMA balancing too; `--sysctl` overrides one.

The verdict: any console splat (the scanner of `ptlab test`, which includes
"Bad rss-counter" and "non-zero pgtables_bytes"), a stressor stress-ng
reports as failed or a non-zero stress-ng exit, a race-test run that failed,
a switch of the series missing from the kernel, a soak with COW page tables
on in which no table was shared or none broken (it soaked nothing of them),
or a guest that did not finish, fails the run."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from . import run, splat

# stress-ng's page-table stressors, one instance each.  Debian 12 has stress-ng
# 0.15.06: its mmapcow, vma and ksm stressors (and the --ksm option) came
# later; mmapfixed, mmapmany and mmapaddr churn VMAs instead, and KSM is
# covered by migration_walk's ksm test in a loop.
STRESSORS = ("fork", "forkheavy", "mmapfixed", "mmapmany", "mmapaddr", "madvise",
             "mmap", "mremap", "pagemove", "mprotect", "numa", "tlb-shootdown", "userfaultfd",
             "vm", "mmaphuge")
# ... and those that run outside the memcg, in a stress-ng of their own.
# mmapfork's 32 children each map and fill MAP_SHARED memory sized from the
# system's free RAM (sysinfo), not the cgroup's: half the guest's free memory
# in shmem, which only swap can take.  Inside a 1 GiB memcg that kept the
# cgroup far above memory.high for the whole soak, and every stressor in it
# was throttled: vm, mmap and mremap did 0 bogo ops in 30 min
# (2026-11-23).  Outside, it is the guest's own memory pressure.
UNCONFINED = ("mmapfork",)
# mmapfork runs for the first half of the soak only: beside it, forkheavy
# never forks (0 bogo ops in both 30-min soaks of 2026-11-23 and in three
# 1-2 min runs of the two alone, 2026-11-24), while alone it forked 571
# times in 60 s and beside `--cpu 4` 37 times.  Not for want of memory
# (MemFree stayed above 3.7 GB, swap unused) nor a failing fork (a
# kretprobe on kernel_clone saw no error): stress-ng 0.15.06's forkheavy
# loop forks only while its stress_low_memory() says no, and beside
# mmapfork it says yes; the exact test that trips is not known.
UNCONFINED_SHARE = 0.5
# Stressors a profile leaves out, and why.  Under KASAN (and TCG) forkheavy
# never gets to its fork loop: alone in the guest for 60 s it did 0, 8 and
# 0 bogo ops (2026-11-24; --forkheavy-allocs 64, 64 and 1: the option made
# no difference), its worker running in the kernel for 73-80 s with 4096
# files open: stress-ng 0.15.06's resource setup (pipes, ptys, sockets,
# memfds, message queues), not fork, is what KASAN slows down.  It forked
# 571 times alone in 60 s on the debug kernel.  Under KASAN, fork and
# mmapfork and our race tests' forks stay.
LEFT_OUT = {"kasan": ("forkheavy",)}


# The series' selftests that lab/guest/soak loops (tools/testing/selftests/mm/).
RACE_PROGRAMS = ("pt_reclaim", "migration_walk", "cow_pte_race", "cow_pte_equiv",
                 "uffd_race", "uffd_move")

# Not a switch of the series, on for the soak: NUMA hinting faults and the
# migrations they start, beside everything else.
SOAK_SYSCTLS = ("kernel.numa_balancing=1",)


def sysctls(all_on: list[str], overrides: list[str]) -> list[str]:
    """What the soak boots with: the series' switches at their all-on value
    and SOAK_SYSCTLS, each replaced by an override of the same name."""
    want = {kv.split("=", 1)[0]: kv for kv in [*all_on, *SOAK_SYSCTLS, *overrides]}
    return list(want.values())


# The counters that must move when COW page tables are on: a soak with no
# table shared or broken never reached the feature's paths.
COW_PTE_MUST_MOVE = ("cow_pte_share", "cow_pte_break")


# memory.high of the memcg, per profile: below what its stressors map, so
# that they reclaim and swap all along.  1G held the debug soak above it
# (166 "high" events, peak 1.07 GB, 2026-11-24); with trinity and more race
# loops beside them the stressors peaked at 948 MB, 0 "high" events
# (2026-11-27): 768M.  Under KASAN, without forkheavy, the stressors go
# slower and the memcg peaked at 586 MB under a 1G limit, with 0 "high"
# events (2026-11-24): 512M.
MEMCG_LIMIT = {"kasan": "512M"}


def memcg_limit(profile: str) -> str:
    return MEMCG_LIMIT.get(profile, "768M")


def stressors(profile: str) -> tuple[str, ...]:
    """The memcg's stressors for a kernel profile."""
    return tuple(s for s in STRESSORS if s not in LEFT_OUT.get(profile, ()))


def _group_args(stressors: tuple[str, ...], seconds: int) -> list[str]:
    return [a for s in stressors for a in (f"--{s}", "1")] + \
        ["--timeout", f"{seconds}s", "--metrics-brief"]


# Sizes for TCG and a debug kernel, where a page fault costs ~20x native:
# with stress-ng's defaults (vm: 256M and every method in turn, of which
# some walk each bit) or with vm 512M and mmap 256M, vm, mmap and mremap
# did not finish one bogo op in 60 s alone in the guest, nor in the 30 min
# of the first soak (2026-11-23); with vm 256M write64, mmap 32M and
# mremap 32M, vm and mremap did, mmap still not in 3 min of soak; forkheavy:
# 4096 processes by default, 16 here.
SIZES = ("--vm-bytes", "256M", "--vm-method", "write64", "--mmap-bytes", "4M",
         "--mremap-bytes", "32M", "--forkheavy-procs", "16")


# Trinity (Debian 12's 1.9+git20230109) fuzzes the mm system calls beside
# the rest, as nobody, in a memcg of its own (TRINITY_MEMCG_MAX: its
# children map at random and would otherwise push the soak's memcg and our
# tests into the OOM killer).  Its children are forked by trinity's main
# process and inherit its mappings, then each one calls these at random, on
# shared tables too (vm.cow_pte=2).  Trinity refuses fork, vfork, clone,
# clone3 and brk even when named (AVOID_SYSCALL in its tables): forks come
# from its respawns of children, and from stress-ng and our tests.
# Sockets off: their setup alone took trinity's first seconds (~100 address
# families, most refused in our guest).  Perf events off: opening one flips
# perf's static keys, and QEMU TCG now and then runs a stale copy of the
# kernel text patched for it ("Oops: int3" in do_user_addr_fault(), seen in
# a soak), as with kernel.numa_balancing (lab/guest/soak).
TRINITY_SYSCALLS = ("mmap", "munmap", "mremap", "mprotect", "pkey_mprotect", "madvise",
                    "process_madvise", "process_mrelease", "mlock", "mlock2", "munlock",
                    "mlockall", "munlockall", "msync", "mincore", "remap_file_pages",
                    "mbind", "set_mempolicy", "migrate_pages", "move_pages", "userfaultfd",
                    "process_vm_readv", "process_vm_writev", "vmsplice", "memfd_create")
TRINITY_CHILDREN = 2
TRINITY_MEMCG_MAX = "256M"
# Its arguments reach lab/guest/soak as one word joined by this (the plan
# line goes through sh; trinity's own arguments hold commas)
TRINITY_SEP = ":"
# Under the soak's load trinity started ~2 min late (2026-11-27): a shorter
# soak may end before its first system call, and only says so
TRINITY_MIN_MINUTES = 5


def trinity_args() -> list[str]:
    """Trinity's command line (lab/guest/soak runs it as nobody, restarted
    until the soak's end, each run stopped by SIGINT so that it prints its
    "Ran N syscalls" line)."""
    return ["-q", "-l", "off", "-C", str(TRINITY_CHILDREN), "--disable-fds=sockets,perf",
            *(a for s in TRINITY_SYSCALLS for a in ("-c", f"{s},64"))]


def stress_args(minutes: int, profile: str = "debug") -> list[str]:
    """stress-ng's command line in the memcg (lab/guest/soak runs it)."""
    return _group_args(stressors(profile), minutes * 60) + list(SIZES)


def unconfined_args(minutes: int) -> list[str]:
    """The command line of the stress-ng outside the memcg."""
    return _group_args(UNCONFINED, max(30, int(minutes * 60 * UNCONFINED_SHARE)))


# stress-ng --metrics-brief: "stress-ng: info:  [123] fork   1234   60.00 ..."
_METRIC = re.compile(r"stress-ng: (?:info|metrc): +\[\d+\] +([a-z][\w-]*) +(\d+) +[\d.]+ ")
# a stressor's failure: "stress-ng: fail:  [123] vm: detected memory error ..."
_FAIL = re.compile(r"stress-ng: fail: +\[\d+\] (.*)")
# and, from stress-ng 0.16 on, the summary "... failed: 2: vm (1) mmap (1)"
_FAILED = re.compile(r"stress-ng: \w+: +\[\d+\] failed: (\d+)(?:: (.*))?")
_RACE = re.compile(r"SOAK-RACE (\S+) runs=(\d+) failed=(\d+)")
_TRINITY = re.compile(r"SOAK-TRINITY runs=(\d+) syscalls=(\d+) unfinished=(\d+)"
                      r" oom_kills=(\d+)")
# the two stress-ng runs, as lab/guest/soak names their blocks
GROUPS = ("memcg", "root")


@dataclass
class SoakResult:
    switches: dict[str, str] = field(default_factory=dict)
    bogo_ops: dict[str, int] = field(default_factory=dict)
    stress_failed: list[str] = field(default_factory=list)
    stress_rc: dict[str, int] = field(default_factory=dict)   # per group: memcg, root
    reported: dict[str, set] = field(default_factory=dict)    # per group: who printed metrics
    races: dict[str, tuple[int, int]] = field(default_factory=dict)
    race_logs: dict[str, list[str]] = field(default_factory=dict)
    memcg: str = ""
    vmstat: str = ""
    counters: dict[str, int] = field(default_factory=dict)  # our vmstat deltas over the soak
    asked: tuple[str, ...] = STRESSORS     # the memcg's stressors (stressors())
    memcg_high: int | None = None          # memory.events "high": times above it
    # trinity's runs, system calls, runs without a summary, OOM kills in its memcg
    trinity: tuple[int, int, int, int] | None = None
    trinity_log: list[str] = field(default_factory=list)   # the last run without one

    def problems(self) -> list[str]:
        out = [f"switch {p} is missing from this kernel"
               for p, v in self.switches.items() if v == "missing"]
        for group in GROUPS:
            if group not in self.stress_rc:
                out.append(f"stress-ng ({group}) did not report (the guest stopped early?)")
            elif self.stress_rc[group]:
                out.append(f"stress-ng ({group}) exited with {self.stress_rc[group]}")
        out += [f"stress-ng: stressor failed: {s}" for s in self.stress_failed]
        # a stressor that died (stress-ng 0.15.06's madvise, killed by the
        # SIGBUS of its own MADV_HWPOISON as root, 2026-11-24) prints no
        # metrics line, and its death showed only as stress-ng's exit status
        for group, asked in zip(GROUPS, (self.asked, UNCONFINED)):
            if group in self.stress_rc:
                out += [f"stressor {n} ({group}) printed no metrics: it died or never ran"
                        f" (its stress-ng log is in results.txt)"
                        for n in asked if n not in self.reported.get(group, ())]
        if self.stress_rc and not self.bogo_ops:
            out.append("stress-ng printed no metrics")
        # a stressor that did nothing did not soak anything
        out += [f"stressor {n} did no work (0 bogo ops)"
                for n, ops in sorted(self.bogo_ops.items()) if not ops]
        # a memcg never above its memory.high reclaimed nothing: the soak's
        # premise (reclaim, swap and compaction all along) did not hold
        if self.memcg_high == 0:
            out.append("the memcg never went above memory.high: nothing reclaimed under "
                       "the limit (a lower --memcg-limit would)")
        cow = self.switches.get("/proc/sys/vm/cow_pte", "0")
        if cow not in ("0", "missing"):
            out += [f"vm.cow_pte={cow} and {c} did not move: the soak reached no shared table"
                    for c in COW_PTE_MUST_MOVE if not self.counters.get(c)]
        out += [f"race test {n}: {f} of {r} runs failed"
                for n, (r, f) in self.races.items() if f]
        out += [f"race test {n} never ran" for n, (r, f) in self.races.items() if not r]
        if self.trinity is None:
            out.append("trinity did not report (the guest stopped early?)")
        return out


def parse(lines: list[str], profile: str = "debug") -> SoakResult:
    res = SoakResult(asked=stressors(profile))
    log = group = None
    for line in lines:
        if line.startswith("SOAK-RACE-LOG-BEGIN "):
            log = res.race_logs.setdefault(line.split()[1], [])
            continue
        if line.startswith("SOAK-TRINITY-LOG-BEGIN"):
            log = res.trinity_log
            continue
        if line.startswith(("SOAK-RACE-LOG-END", "SOAK-TRINITY-LOG-END")):
            log = None
            continue
        if log is not None:
            log.append(line)
            continue
        if line.startswith("SOAK-SWITCH "):
            _, path, value = line.split(maxsplit=2)
            res.switches[path] = value.strip()
        elif m := _RACE.match(line):
            res.races[m.group(1)] = (int(m.group(2)), int(m.group(3)))
        elif m := _TRINITY.match(line):
            res.trinity = tuple(int(g) for g in m.groups())
        elif line.startswith("SOAK-STRESSNG-BEGIN "):
            group = line.split()[1]
        elif m := re.match(r"SOAK-STRESSNG-END (\w+) rc=(\d+)", line):
            res.stress_rc[m.group(1)] = int(m.group(2))
            group = None
        elif line.startswith("SOAK-MEMCG "):
            res.memcg = (res.memcg + " " + line[len("SOAK-MEMCG "):]).strip()
            if m := re.search(r"\bhigh (\d+)", line):
                res.memcg_high = int(m.group(1))
        elif line.startswith("SOAK-COUNTERS "):
            res.counters = {k: int(v) for k, v in
                            (kv.split("=", 1) for kv in line.split()[1:])}
        elif line.startswith("SOAK-VMSTAT "):
            res.vmstat = line[len("SOAK-VMSTAT "):].strip()
        elif m := _FAIL.search(line):
            res.stress_failed.append(m.group(1).strip())
        elif m := _FAILED.search(line):
            if int(m.group(1)):
                res.stress_failed += re.findall(r"([\w-]+) \(\d+\)", m.group(2) or "") or \
                    [m.group(2) or "?"]
        elif m := _METRIC.search(line):
            if m.group(1) != "stressor":
                res.bogo_ops[m.group(1)] = int(m.group(2))
                res.reported.setdefault(group, set()).add(m.group(1))
    return res


def report(res: SoakResult, out: run.Outcome, minutes: int,
           profile: str = "debug") -> tuple[str, bool]:
    """The text to print and whether the soak passed."""
    lines = [f"soak: {minutes} min; {res.memcg}"]
    if LEFT_OUT.get(profile):
        lines.append(f"left out under {profile}: {', '.join(LEFT_OUT[profile])}"
                     " (why: lab/soak.py LEFT_OUT)")
    lines.append("switches: " + ", ".join(f"{Path(p).name}={v}"
                                           for p, v in res.switches.items()))
    lines.append(f"{'stressor':20} {'bogo ops':>12}")
    for name, ops in sorted(res.bogo_ops.items()):
        lines.append(f"{name:20} {ops:12}")
    lines.append(f"{'race test':20} {'runs':>6} {'failed':>7}")
    for name, (runs, failed) in sorted(res.races.items()):
        lines.append(f"{name:20} {runs:6} {failed:7}")
    if res.trinity:
        runs, calls, unfinished, oom_kills = res.trinity
        lines.append(f"trinity (as nobody, {len(TRINITY_SYSCALLS)} mm system calls): {calls}"
                     f" system calls in {runs} runs, {unfinished} of them ended without its"
                     f" summary; {oom_kills} OOM kills in its memcg ({TRINITY_MEMCG_MAX})")
    if res.vmstat:
        lines.append("vmstat: " + res.vmstat)
    if res.counters:
        lines.append("our counters over the soak: "
                     + ", ".join(f"{k} {v}" for k, v in sorted(res.counters.items())))
    for name, log in res.race_logs.items():
        lines.append(f"--- failed runs of {name}: their failed cases, the last one's tail ---")
        lines += log
    if res.trinity_log:
        lines.append("--- the last trinity run without a system call or its summary (tail) ---")
        lines += res.trinity_log
    problems = res.problems()
    if res.trinity and not res.trinity[1]:
        what = ("trinity made no system call" + (" (its last log is above)"
                if res.trinity_log else " (it never ran)"))
        if minutes >= TRINITY_MIN_MINUTES:
            problems.append(what)
        else:
            lines.append(f"note: {what}; under {TRINITY_MIN_MINUTES} min that is no"
                         " failure (trinity starts late under the soak's load)")
    problems += [f"guest setup: {what}" for what in out.setup]
    if out.splats:
        problems.append(f"{len(out.splats)} splat(s) on the console ({out.console})")
        lines.append(splat.format_report(out.splats))
    if not out.finished:
        problems.append(f"the guest did not finish; console: {out.console}")
    lines += [f"FAIL: {p}" for p in problems]
    ok = not problems
    lines.append(f"soak: {'PASS' if ok else 'FAIL'}")
    return "\n".join(lines), ok
