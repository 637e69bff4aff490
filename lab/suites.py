"""What `ptlab test` runs in the guest: the upstream mm selftests (a curated
list in run_vmtests.sh's spirit, each with a timeout sized for TCG and a
debug kernel) and the series' own, which its selftests patches add there."""
from __future__ import annotations

from dataclasses import dataclass

from .run import PlanItem


@dataclass(frozen=True)
class Test:
    suite: str
    test: str        # unique in the suite; the baseline's key with the case name
    argv: tuple[str, ...]    # argv[0]: the binary
    timeout: int     # seconds, killed after that (a hung test fails, the rest still run)
    hugepages: int | None = None   # exactly this many reserved (lab/guest/with-hugepages)
    fmt: str = "ktap"   # its output (lab/ktap.py FORMATS): ktap, uffd ("Testing x... done"),
                        # steps (khugepaged's coloured steps), exit (no cases: exit status)
    secs: float = 10.0  # about how long it runs (debug kernel, TCG, one guest): only
                        # to split the plan between guests (guest.split_plan)
    busy: bool = False  # keeps several vCPUs busy (threads that race): such tests
                        # run one after another in the first guest (guest.split_plan)

    def plan(self) -> PlanItem:
        wrap = ["with-hugepages", str(self.hugepages)] if self.hugepages is not None else []
        return PlanItem(self.suite, self.test, self.timeout, wrap + list(self.argv), self.secs,
                        self.busy)


def _t(suite: str, *argv: str, timeout: int = 600, test: str = "",
       hugepages: int | None = None, fmt: str = "ktap", secs: float = 10.0,
       busy: bool = False) -> Test:
    return Test(suite, test or argv[0], argv, timeout, hugepages, fmt, secs, busy)


UPSTREAM = [
    _t("cow", "cow", timeout=900, secs=31),
    _t("uffd-unit-tests", "uffd-unit-tests", timeout=1200, fmt="uffd", secs=187, busy=True),
    _t("migration", "migration", timeout=900, secs=120, busy=True),
    _t("madv_populate", "madv_populate"),
    _t("mremap_test", "mremap_test", timeout=900),
    _t("ksm_functional_tests", "ksm_functional_tests", secs=18),
    _t("pagemap_ioctl", "pagemap_ioctl", timeout=900, secs=37),
    _t("khugepaged", "khugepaged", timeout=1200, fmt="steps", secs=32),
    _t("khugepaged", "khugepaged", "-s", "2", timeout=1200, test="khugepaged-s2", fmt="steps",
       secs=31),
    _t("split_huge_page_test", "split_huge_page_test", timeout=900),
    _t("hugetlb", "hugepage-mmap"),
    _t("hugetlb", "hugepage-shm", fmt="exit"),
    _t("hugetlb", "map_hugetlb"),
    _t("hugetlb", "hugepage-mremap"),
    _t("hugetlb", "hugepage-vmemmap", fmt="exit"),
    _t("hugetlb", "hugetlb-madvise", fmt="exit"),
    _t("hugetlb", "hugetlb_dio"),
    # 10000 rounds of threads racing MADV_DONTNEED and a fault: 155-380 s under TCG
    _t("hugetlb", "hugetlb_fault_after_madv", hugepages=1, fmt="exit", timeout=1500, secs=220, busy=True),
    _t("hugetlb", "hugetlb_madv_vs_map", hugepages=1, fmt="exit"),
    _t("gup", "gup_longterm"),
    _t("gup", "gup_test", "-ct", "-F", "0x1", "0", "19", "0x1000", test="gup_test-ct"),
    _t("misc", "mkdirty"),
    _t("misc", "soft-dirty", secs=44),
    _t("misc", "mremap_dontunmap"),
    _t("misc", "map_fixed_noreplace"),
    _t("misc", "mlock2-tests"),
    _t("misc", "uffd-stress", "anon", "20", "16", test="uffd-stress-anon", fmt="exit",
       secs=15, busy=True),
    # issue 27: suites that reach COW page tables' neighbours. process_mrelease
    # (the OOM reaper's zap of a dying mm), KSM merging, THP churn,
    # compaction, userfaultfd on shmem and hugetlb (run_vmtests.sh's
    # arguments; hugetlb: half of the pages reserved for each of its two
    # areas, as run_vmtests.sh does; transhuge-stress: 256 MiB, not all of
    # RAM, whose first loop under TCG would outlast its 20 s)
    _t("misc", "uffd-stress", "shmem", "20", "16", test="uffd-stress-shmem", fmt="exit",
       secs=21, busy=True),
    _t("misc", "uffd-stress", "shmem-private", "20", "16", test="uffd-stress-shmem-private",
       fmt="exit", secs=20, busy=True),
    _t("misc", "uffd-stress", "hugetlb", "32", "32", test="uffd-stress-hugetlb", hugepages=32,
       fmt="exit", secs=35, busy=True),
    _t("misc", "uffd-stress", "hugetlb-private", "32", "32", test="uffd-stress-hugetlb-private",
       hugepages=32, fmt="exit", secs=32, busy=True),
    _t("mrelease", "mrelease_test"),
    _t("compaction", "compaction_test", timeout=900, secs=107),
    _t("thp", "transhuge-stress", "-d", "20", "256", timeout=300, secs=20),
    _t("ksm", "ksm_tests", "-H", "-s", "100", test="ksm_tests-H"),
    _t("ksm", "ksm_tests", "-P", "-s", "100", test="ksm_tests-P"),
    _t("ksm", "ksm_tests", "-M", "-p", "10", test="ksm_tests-M"),
    _t("ksm", "ksm_tests", "-U", test="ksm_tests-U"),
    _t("ksm", "ksm_tests", "-Z", "-p", "10", "-z", "0", test="ksm_tests-Z0"),
    _t("ksm", "ksm_tests", "-Z", "-p", "10", "-z", "1", test="ksm_tests-Z1"),
    _t("ksm", "ksm_tests", "-N", "-m", "1", test="ksm_tests-N1"),
    _t("ksm", "ksm_tests", "-N", "-m", "0", test="ksm_tests-N0"),
]

# The series' own tests: tools/testing/selftests/mm/<name>.c, added by its
# selftests patches (0039-0042) and built with the mm selftests.
OURS = [
    _t("ptlab", "pt_fork", timeout=600),
    _t("ptlab", "migration_walk", timeout=900, secs=91),
    _t("ptlab", "pt_reclaim", timeout=600, secs=79),
    _t("ptlab", "uffd_race", timeout=600, secs=60, busy=True),
    _t("ptlab", "uffd_move", timeout=600, secs=37),
    _t("ptlab", "cow_pte", timeout=900, secs=25),
    _t("ptlab", "cow_pte_race", timeout=600, secs=55, busy=True),
    _t("ptlab", "cow_pte_equiv", timeout=600, secs=29),
    # the differential test: seeded sequences with vm.cow_pte=0 and =2, the
    # same seeds in every run (about 1 s a seed under TCG); thousands more
    # by hand, `-n` and `-s` (docs/cow-pte.md)
    _t("ptlab", "cow_pte_diff", "-n", "100", timeout=1200, test="cow_pte_diff", secs=90),
    # with move_pages() and mbind() between the two nodes too (-x)
    _t("ptlab", "cow_pte_diff", "-x", "-n", "50", timeout=1200, test="cow_pte_diff-x",
       secs=93),
    # with PTE-mapped THPs, UFFDIO_MOVE out of the area and steps on threads (-e)
    _t("ptlab", "cow_pte_diff", "-e", "-n", "60", timeout=1200, test="cow_pte_diff-e",
       secs=64),
    # both (-x -e), on seeds 2621-2630: 2628 moved pages of a PTE-mapped THP
    # that vanilla refused to move (fixed by 0033)
    _t("ptlab", "cow_pte_diff", "-x", "-e", "-s", "2621", "-n", "10", timeout=600,
       test="cow_pte_diff-x-e", secs=17),
    # the same with both runs at 0 and at 2: the test's own determinism
    _t("ptlab", "cow_pte_diff", "-n", "20", "-a", "0", "-b", "0", timeout=900,
       test="cow_pte_diff-0-0", secs=15),
    _t("ptlab", "cow_pte_diff", "-n", "20", "-a", "2", "-b", "2", timeout=900,
       test="cow_pte_diff-2-2", secs=15),
    _t("ptlab", "cow_pte_diff", "-x", "-n", "10", "-a", "2", "-b", "2", timeout=900,
       test="cow_pte_diff-x-2-2", secs=16),
    _t("ptlab", "cow_pte_diff", "-e", "-n", "10", "-a", "2", "-b", "2", timeout=900,
       test="cow_pte_diff-e-2-2", secs=8),
]

ALL = UPSTREAM + OURS


def suites() -> list[str]:
    out = []
    for t in ALL:
        if t.suite not in out:
            out.append(t.suite)
    return out


def select(names: list[str]) -> list[Test]:
    """Pick by suite ("cow"), by test ("hugetlb/map_hugetlb" or "map_hugetlb")."""
    if not names:
        return list(ALL)
    out = []
    for n in names:
        hits = [t for t in ALL if n in (t.suite, t.test, f"{t.suite}/{t.test}")]
        if not hits:
            from .common import LabError
            raise LabError(f"no suite or test named {n!r}",
                           hint="suites: " + ", ".join(suites()))
        out += [t for t in hits if t not in out]
    return out
