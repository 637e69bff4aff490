"""ptlab soak: the guest's report is parsed and judged (synthetic logs in the
format of lab/guest/soak and stress-ng 0.15.06 --metrics-brief)."""
import shutil
import subprocess
from pathlib import Path

import pytest

from lab import soak
from lab.run import Outcome

GOOD = """\
SOAK-SWITCH /proc/sys/vm/pte_table_reclaim 1
SOAK-SWITCH /proc/sys/vm/migration_walk_early_exit 1
SOAK-SWITCH /proc/sys/kernel/numa_balancing 1
SOAK-SWITCH /proc/sys/vm/cow_pte 2
SOAK-MEMCG memory.high=1073741824
SOAK-RACE migration-stress runs=12 failed=0
SOAK-RACE sweep-vs-munmap runs=40 failed=0
SOAK-TRINITY runs=2 syscalls=81234 unfinished=1 oom_kills=3
SOAK-STRESSNG-BEGIN memcg
stress-ng: info:  [210] setting to a 1800 second run per stressor
stress-ng: info:  [210] dispatching hogs: 1 fork, 1 mmap, 1 vm
stress-ng: metrc: [210] stressor       bogo ops real time  usr time  sys time   bogo ops/s     bogo ops/s
stress-ng: metrc: [210]                           (secs)    (secs)    (secs)   (real time) (usr+sys time)
stress-ng: metrc: [210] fork                379      3.01      0.26      0.18       126.12         860.36
stress-ng: metrc: [210] mmap                 13      3.08      0.32      1.79         4.22           6.16
stress-ng: metrc: [210] tlb-shootdown         7      3.08      0.32      1.79         4.22           6.16
stress-ng: info:  [210] successful run completed in 3.08s
SOAK-STRESSNG-END memcg rc=0
SOAK-STRESSNG-BEGIN root
stress-ng: info:  [211] dispatching hogs: 1 mmapfork
stress-ng: metrc: [211] mmapfork             41   1800.10     12.00    300.00         0.02           0.13
stress-ng: info:  [211] successful run completed in 1800.10s
SOAK-STRESSNG-END root rc=0
SOAK-MEMCG high 25 oom 0 oom_kill 0
SOAK-COUNTERS cow_pte_share=5120 cow_pte_break=812 cow_pte_drop=4000 pt_reclaim_pte_freed=99
SOAK-VMSTAT pswpout 1234 pt_reclaim_pte_freed 99
""".splitlines()
# every other stressor the soak asks for in the memcg reports too
_DONE = GOOD.index("stress-ng: info:  [210] successful run completed in 3.08s")
GOOD[_DONE:_DONE] = [f"stress-ng: metrc: [210] {n:16} 5      3.01      0.26      0.18     1.0     1.0"
                     for n in soak.STRESSORS if n not in ("fork", "mmap", "tlb-shootdown")]


def _outcome(tmp_path: Path, finished=True, splats=()):
    return Outcome([], finished, list(splats), tmp_path / "console.log",
                   tmp_path / "results.txt", "", 0.0)


def _judge(tmp_path: Path, lines, minutes=30):
    """The soak's report on @lines and whether it passed."""
    return soak.report(soak.parse(lines), _outcome(tmp_path), minutes)


def test_good_run_passes(tmp_path):
    res = soak.parse(GOOD)
    assert {n: res.bogo_ops[n] for n in ("fork", "mmap", "tlb-shootdown", "mmapfork")} == \
        {"fork": 379, "mmap": 13, "tlb-shootdown": 7, "mmapfork": 41}
    assert set(res.bogo_ops) == set(soak.STRESSORS) | set(soak.UNCONFINED)
    assert res.races == {"migration-stress": (12, 0), "sweep-vs-munmap": (40, 0)}
    assert res.stress_rc == {"memcg": 0, "root": 0}
    assert "pt_reclaim_pte_freed 99" in res.vmstat
    text, ok = soak.report(res, _outcome(tmp_path), 30)
    assert ok, text
    assert "fork" in text and "379" in text and text.endswith("soak: PASS")


def test_failed_stressor_race_and_missing_switch_fail(tmp_path):
    lines = [l.replace("numa_balancing 1", "numa_balancing missing") for l in GOOD]
    lines = [l.replace("runs=40 failed=0", "runs=40 failed=2") for l in lines]
    lines.insert(lines.index("SOAK-STRESSNG-END memcg rc=0"),
                 "stress-ng: fail:  [212] vm: detected 3 bit errors while stressing memory")
    lines = [l.replace("SOAK-STRESSNG-END memcg rc=0", "SOAK-STRESSNG-END memcg rc=2")
             for l in lines]
    res = soak.parse(lines)
    text, ok = soak.report(res, _outcome(tmp_path), 30)
    assert not ok
    assert "FAIL: switch /proc/sys/kernel/numa_balancing is missing" in text
    assert "FAIL: race test sweep-vs-munmap: 2 of 40 runs failed" in text
    assert "FAIL: stress-ng (memcg) exited with 2" in text
    assert "vm: detected 3 bit errors" in text


def test_race_log_is_kept(tmp_path):
    lines = GOOD[:5] + ["SOAK-RACE-LOG-BEGIN migration-stress", "# FAIL  stress.anon",
                        "not ok 1 stress.anon", "SOAK-RACE-LOG-END migration-stress"] + GOOD[5:]
    res = soak.parse(lines)
    assert res.race_logs["migration-stress"] == ["# FAIL  stress.anon", "not ok 1 stress.anon"]
    assert "SOAK-RACE" not in "".join(res.race_logs["migration-stress"])


def test_unfinished_guest_or_splat_fails(tmp_path):
    res = soak.parse(GOOD[:6])      # the guest died before stress-ng reported
    text, ok = soak.report(res, _outcome(tmp_path, finished=False), 30)
    assert not ok
    assert "stress-ng (memcg) did not report" in text and "did not finish" in text


def test_idle_stressor_or_missing_group_fails(tmp_path):
    """A stressor throttled to nothing soaked nothing: the 2026-11-23 soak had
    vm, mmap, mremap and forkheavy at 0 bogo ops and still only failed on
    stress-ng's exit status."""
    lines = [l.replace("mmap                 13", "mmap                  0") for l in GOOD]
    end = lines.index("SOAK-STRESSNG-BEGIN root")
    lines = lines[:end] + lines[lines.index("SOAK-STRESSNG-END root rc=0") + 1:]
    text, ok = soak.report(soak.parse(lines), _outcome(tmp_path), 30)
    assert not ok
    assert "FAIL: stressor mmap did no work (0 bogo ops)" in text
    assert "FAIL: stress-ng (root) did not report" in text


def test_stressor_without_metrics_fails(tmp_path):
    """stress-ng 0.15.06's madvise died of the SIGBUS of its own MADV_HWPOISON
    in every soak until 2026-11-24, and printed no metrics line: only the
    exit status (2) showed it, and nothing said which stressor it was."""
    lines = [l for l in GOOD if not l.startswith("stress-ng: metrc: [210] madvise ")]
    text, ok = soak.report(soak.parse(lines), _outcome(tmp_path), 30)
    assert not ok
    assert "FAIL: stressor madvise (memcg) printed no metrics" in text
    # the same name in the other group does not count for this one
    lines = [l for l in GOOD if not l.startswith("stress-ng: metrc: [211] mmapfork ")]
    lines.insert(lines.index("SOAK-STRESSNG-END memcg rc=0"),
                 "stress-ng: metrc: [210] mmapfork            41   1800.10  12.00  300.00  0.02  0.13")
    text, ok = soak.report(soak.parse(lines), _outcome(tmp_path), 30)
    assert "FAIL: stressor mmapfork (root) printed no metrics" in text


@pytest.mark.skipif(not shutil.which("stress-ng"), reason="no stress-ng on this host")
def test_stress_ng_takes_our_arguments():
    """The guest runs the host's stress-ng: --dry-run parses the command line
    (an option it lacks, like --ksm in 0.15.06, fails it) and runs nothing."""
    for args in (soak.stress_args(1), soak.unconfined_args(1)):
        proc = subprocess.run(["stress-ng", "--dry-run", *args], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


def test_a_profile_leaves_out_what_it_says():
    """Under KASAN forkheavy is not run, so its missing metrics are no
    failure there; the debug soak still asks for it and misses it."""
    assert "--forkheavy" not in soak.stress_args(1, "kasan")
    assert "--forkheavy" in soak.stress_args(1, "debug")
    lines = [l for l in GOOD if not l.startswith("stress-ng: metrc: [210] forkheavy ")]
    text, ok = soak.report(soak.parse(lines, "kasan"), _outcome(Path("/nonexistent")), 30, "kasan")
    assert "left out under kasan: forkheavy" in text
    assert "forkheavy" not in "\n".join(l for l in text.splitlines() if l.startswith("FAIL"))
    text, ok = soak.report(soak.parse(lines, "debug"), _outcome(Path("/nonexistent")), 30, "debug")
    assert "FAIL: stressor forkheavy (memcg) printed no metrics" in text


def test_a_memcg_never_above_its_limit_fails(tmp_path):
    """The soak's premise is reclaim under memory.high: a memcg whose
    memory.events counted no "high" event did not soak reclaim."""
    res = soak.parse(GOOD)
    assert res.memcg_high == 25 and not res.problems()
    lines = [l.replace("high 25 ", "high 0 ") for l in GOOD]
    text, ok = soak.report(soak.parse(lines), _outcome(tmp_path), 30)
    assert not ok and "FAIL: the memcg never went above memory.high" in text
    assert soak.memcg_limit("kasan") == "512M" and soak.memcg_limit("debug") == "768M"


def test_a_soak_that_shares_no_table_fails(tmp_path):
    """Issue 27: with vm.cow_pte on, a soak in which no fork shared a table
    (or no table was broken) never reached COW page tables' paths."""
    res = soak.parse(GOOD)
    assert res.counters["cow_pte_share"] == 5120
    text, ok = soak.report(res, _outcome(tmp_path), 30)
    assert ok and "cow_pte_break 812" in text
    lines = [l.replace("cow_pte_break=812", "cow_pte_break=0") for l in GOOD]
    text, ok = _judge(tmp_path, lines)
    assert not ok and "cow_pte_break did not move" in text
    lines = [l for l in GOOD if not l.startswith("SOAK-COUNTERS")]
    text, ok = _judge(tmp_path, lines)
    assert not ok and "cow_pte_share did not move" in text
    # sharing switched off on purpose (--sysctl vm.cow_pte=0): nothing to reach
    lines = [l.replace("vm/cow_pte 2", "vm/cow_pte 0") for l in lines]
    assert _judge(tmp_path, lines)[1]


def test_the_soak_boots_with_every_switch_all_on():
    """One table of switches (config/features.config) for test, bench and
    soak: the soak turns on every one at its all-on value, and --sysctl
    replaces one by name."""
    from lab import kconfig
    on = kconfig.all_on_sysctls()
    assert "vm.cow_pte=2" in on and "vm.pte_table_reclaim=1" in on
    assert [kv.split("=")[0] for kv in on] == kconfig.feature_sysctls()
    got = soak.sysctls(on, ["vm.cow_pte=1"])
    assert "vm.cow_pte=1" in got and "vm.cow_pte=2" not in got
    assert "kernel.numa_balancing=1" in got and len(got) == len(on) + 1


def test_trinity_is_reported_and_must_call(tmp_path):
    """Issue 27's fuzz: trinity runs in every soak, and a soak in which it
    made no system call (its main process dying at once, as Debian 12's did
    in our guest in a first try) fuzzed nothing."""
    res = soak.parse(GOOD)
    assert res.trinity == (2, 81234, 1, 3)
    text, ok = soak.report(res, _outcome(tmp_path), 30)
    assert ok and "81234 system calls in 2 runs" in text
    lines = [l.replace("syscalls=81234", "syscalls=0") for l in GOOD]
    at = lines.index("SOAK-TRINITY runs=2 syscalls=0 unfinished=1 oom_kills=3") + 1
    lines[at:at] = ["SOAK-TRINITY-LOG-BEGIN", "[main] Segmentation fault", "SOAK-TRINITY-LOG-END"]
    res = soak.parse(lines)
    assert res.trinity_log == ["[main] Segmentation fault"]
    assert res.memcg_high == 25     # what follows the log block is still read
    text, ok = soak.report(res, _outcome(tmp_path), 30)
    assert not ok and "FAIL: trinity made no system call (its last log is above)" in text
    assert "[main] Segmentation fault" in text
    # a short soak may end before trinity's first call (it starts late under load)
    text, ok = soak.report(res, _outcome(tmp_path), soak.TRINITY_MIN_MINUTES - 1)
    assert ok and "note: trinity made no system call" in text
    lines = [l.replace("runs=2 syscalls=81234", "runs=0 syscalls=0") for l in GOOD]
    text, ok = _judge(tmp_path, lines)
    assert not ok and "FAIL: trinity made no system call (it never ran)" in text
    lines = [l for l in GOOD if not l.startswith("SOAK-TRINITY")]
    text, ok = _judge(tmp_path, lines)
    assert not ok and "FAIL: trinity did not report" in text


def test_arguments_survive_their_separator():
    """The guest splits each argument list on one character (lab/guest/soak:
    IFS=, and IFS=:): no argument may hold it (trinity's
    --disable-fds=sockets,perf and -c mmap,64 did, and reached it as
    --disable-fds=sockets, perf, -c mmap, 64: perf fds stayed on)."""
    for args, sep in ((soak.unconfined_args(30), ","),
                      (soak.trinity_args(), soak.TRINITY_SEP)):
        assert sep.join(args).split(sep) == args
    assert "--disable-fds=sockets,perf" in soak.trinity_args()


@pytest.mark.skipif(not shutil.which("trinity"), reason="no trinity on this host")
def test_trinity_calls_what_we_name(tmp_path):
    """Trinity skips a system call it marks AVOID (fork, clone, brk) even when
    named, and one it does not know: each of ours must be listed, enabled."""
    out = subprocess.run(["trinity", "-L"], capture_output=True, text=True,
                         cwd=tmp_path).stdout   # it leaves trinity-child*.log behind
    listed = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0] == "entrypoint" and parts[4] == "[64-bit]":
            listed[parts[2]] = line
    for name in soak.TRINITY_SYSCALLS:
        assert name in listed, name
        assert "Enabled" in listed[name] and "AVOID" not in listed[name], listed[name]
