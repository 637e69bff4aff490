"""From guest output to per-case verdicts against the recorded vanilla
baseline, and the tables `ptlab test` prints."""
from __future__ import annotations

import json
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from . import kconfig, ktap
from .common import BASELINE_DIR, LabError
from .run import TestRun
from .suites import Test

GOOD = ("pass", "xfail")
BAD = ("fail", "error", "xpass")
KILLED = 137        # 128 + SIGKILL
NAMED_ABSENT = 5    # absent cases named one by one; the rest are counted


@dataclass
class Case:
    suite: str
    test: str
    name: str
    status: str             # pass fail skip xfail xpass error
    detail: str = ""
    vanilla: str | None = None
    verdict: str = ""       # pass fail skip known
    note: str = ""

    @property
    def key(self) -> str:
        return f"{self.suite}/{self.test}"


def parse_output(lines: list[str], fmt: str = "ktap") -> ktap.Result:
    """A program's output in the format lab/suites.py names for it."""
    return ktap.FORMATS[fmt](lines)


def cases_of(t: Test, run: TestRun | None) -> list[Case]:
    """The cases one test binary reported, plus synthetic ones for what its
    exit status says and its TAP did not (crash, timeout, no TAP at all)."""
    mk = lambda name, status, detail="": Case(t.suite, t.test, name, status, detail)  # noqa
    if run is None or run.rc is None:
        return [mk("<run>", "error", "not run to the end: the guest stopped")]
    parsed = parse_output(run.output, t.fmt)
    out = [mk(name, c.status, c.detail) for name, c in ktap.unique_names(parsed.cases)]
    # runs from before the guest said timeout=: a SIGKILL at the limit
    if run.timed_out or (run.rc == KILLED and run.secs >= t.timeout):
        out.append(mk("<run>", "error", f"killed after the {t.timeout} s timeout"))
    elif run.rc == KILLED:
        out.append(mk("<run>", "error", "killed by SIGKILL before its time limit "
                                        "(the OOM killer? see the kernel log)"))
    elif not out and t.fmt == "exit":
        status = {0: "pass", 4: "skip"}.get(run.rc, "fail")
        out.append(mk("<run>", status, f"exit status {run.rc}"))
    elif not out:
        out.append(mk("<run>", "error", f"no case in its output ({t.fmt} format), "
                                        f"exit status {run.rc}"))
    elif run.rc not in (0, 4) and not any(c.status in BAD for c in out):
        out.append(mk("<run>", "error", f"exit status {run.rc} but no case failed"))
    return out


def load_flaky(path: Path | None = None) -> dict[tuple[str, str], str]:
    """baseline/flaky.txt: (suite/test, case) -> what was seen on vanilla."""
    out = {}
    path = path or BASELINE_DIR / "flaky.txt"
    for n, line in enumerate(path.read_text().splitlines() if path.exists() else [], 1):
        if line.strip() and not line.startswith("#"):
            key, sep, rest = line.partition(": ")
            case, _, why = rest.partition(" -- ")
            if not sep or "/" not in key or not case.strip():
                raise LabError(f"{path}:{n}: not '<suite>/<test>: <case> -- <what was seen>'",
                               details=line)
            out[(key.strip(), case.strip())] = why.strip()
    return out


def judge(cases: list[Case], baseline: dict[str, dict[str, str]] | None,
          flaky: dict[tuple[str, str], str] | None = None) -> None:
    flaky = load_flaky() if flaky is None else flaky
    for c in cases:
        c.vanilla = (baseline or {}).get(c.key, {}).get(c.name)
        if c.status in BAD and (c.key, c.name) in flaky:
            c.verdict, c.note = "known", f"flaky on vanilla: {flaky[(c.key, c.name)]}"
            continue
        if c.status in GOOD:
            c.verdict = "pass"
        elif c.status == "skip":
            if c.vanilla in GOOD:
                c.verdict, c.note = "fail", "skipped here, passes on vanilla"
            else:
                c.verdict = "skip"
        elif c.vanilla in BAD:
            c.verdict, c.note = "known", "fails on vanilla too"
        else:
            c.verdict = "fail"
            c.note = {None: "not in the vanilla baseline" if baseline else "no baseline"}.get(
                c.vanilla, f"{c.vanilla} on vanilla")


def _shape(name: str) -> str:
    """A case name with its numbers blanked: some names carry a measurement
    ("transact_test Extra pages 62 (0.1%), ...") that differs run to run."""
    return re.sub(r"\d+", "#", name)


def absent_cases(tests: list[Test], cases: list[Case],
                 baseline: dict[str, dict[str, str]] | None) -> list[Case]:
    """What passed on vanilla and this run does not show, whatever the
    program's plan or exit status said: a case that vanished or became a
    skip under another name (kselftest.h names a skip after its reason), a
    shrunken plan, a "1..0 # SKIP" where vanilla ran cases.  By name, and
    by the number of passes for a program whose names all changed."""
    out = []
    for t in tests:
        key = f"{t.suite}/{t.test}"
        vanilla = (baseline or {}).get(key)
        if not vanilla:
            continue
        mine = [c for c in cases if c.key == key]
        names = {_shape(c.name) for c in mine}
        gone = [n for n, st in vanilla.items() if st in GOOD and _shape(n) not in names]
        for n in gone[:NAMED_ABSENT]:
            out.append(Case(t.suite, t.test, n, "error", "absent from this run",
                            vanilla=vanilla[n], verdict="fail", note="passes on vanilla"))
        if len(gone) > NAMED_ABSENT:
            rest = len(gone) - NAMED_ABSENT
            out.append(Case(t.suite, t.test, f"<{rest} more cases absent>", "error",
                            f"{rest} more cases that pass on vanilla are absent from this run",
                            verdict="fail", note="pass on vanilla"))
        want = sum(st in GOOD for st in vanilla.values())
        have = sum(c.status in GOOD for c in mine)
        if not gone and have < want and not any(c.status in BAD for c in mine):
            out.append(Case(t.suite, t.test, f"<{want - have} passes fewer than vanilla>",
                            "error", f"{have} passed, {want} on vanilla", verdict="fail",
                            note="passes on vanilla"))
    return out


def judge_run(out, tests: list[Test], profile: str, kernel: str) -> list[Case]:
    """Every verdict of a `ptlab test` run, for `test` and `parse` alike:
    each case against the vanilla baseline, what vanilla passed and this run
    lacks, every splat on the console, and a guest that did not finish."""
    by_key = {(r.suite, r.test): r for r in out.runs}
    cases = [c for t in tests for c in cases_of(t, by_key.get((t.suite, t.test)))]
    base = load_baseline(profile)
    vanilla = (base or {}).get("tests")
    judge(cases, vanilla)
    if kernel != "vanilla":
        cases += absent_cases(tests, cases, vanilla)
    for sp in out.splats:
        cases.append(Case("console", "splat", sp.title, "error", verdict="fail",
                          note=f"{sp.kind} at {sp.log or 'console.log'}:{sp.line}"))
    for what in out.setup:
        cases.append(Case("guest", "setup", what, "error", verdict="fail",
                          note="the guest could not set up the run asked for"))
    if not out.finished:
        cases.append(Case("guest", "plan", "<the guest did not finish the plan>", "error",
                          verdict="fail", note=f"console: {out.console}"))
    return cases


def failed(cases: list[Case], extra: Counter | None = None) -> bool:
    return any(c.verdict == "fail" for c in cases) or bool((extra or Counter())["fail"])


# --- the baseline -------------------------------------------------------

def baseline_path(profile: str) -> Path:
    return BASELINE_DIR / f"vanilla-{kconfig.baseline_profile(profile)}.json"


def load_baseline(profile: str) -> dict | None:
    p = baseline_path(profile)
    return json.loads(p.read_text()) if p.exists() else None


def record_baseline(profile: str, cases: list[Case], meta: dict) -> Path:
    """Merge this run's cases into the baseline file (tests not run keep
    their recorded results)."""
    old = load_baseline(profile) or {}
    tests = old.get("tests", {})
    for key in {c.key for c in cases}:
        tests[key] = {c.name: c.status for c in cases if c.key == key}
    data = {**meta, "recorded": time.strftime("%Y-%m-%d"), "tests": dict(sorted(tests.items()))}
    BASELINE_DIR.mkdir(exist_ok=True)
    baseline_path(profile).write_text(json.dumps(data, indent=1) + "\n")
    return baseline_path(profile)


# --- printing -----------------------------------------------------------

def suite_table(cases: list[Case], secs: dict[str, float]) -> str:
    lines = [f"{'suite':24} {'passed':>7} {'failed':>7} {'skipped':>8} {'known':>6} "
             f"{'xfail':>6} {'time':>7}"]
    order = []
    for c in cases:
        if c.suite not in order:
            order.append(c.suite)
    for s in order:
        cs = [c for c in cases if c.suite == s]
        v = Counter(c.verdict for c in cs)
        xf = sum(c.status == "xfail" for c in cs)
        lines.append(f"{s:24} {v['pass']:7} {v['fail']:7} {v['skip']:8} {v['known']:6} "
                     f"{xf:6} {secs.get(s, 0):6.0f}s")
    return "\n".join(lines)


def counter_table(runs) -> str:
    """What each suite did with our features: the sums of its programs'
    vmstat counter deltas (PTLAB-COUNTERS), suites that moved none left out."""
    sums: dict[str, Counter] = {}
    for r in runs:
        if r.counters:
            sums.setdefault(r.suite, Counter()).update(r.counters)
    if not sums:
        return ""
    lines = ["our vmstat counters, per suite (deltas over its programs):"]
    for suite, c in sums.items():
        items = ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
        lines.append(f"  {suite}: {items}")
    return "\n".join(lines)


def problems(cases: list[Case], limit: int = 60) -> str:
    out = []
    for c in cases:
        if c.verdict in ("fail", "known"):
            tag = "FAIL " if c.verdict == "fail" else "known"
            out.append(f"  {tag} {c.key}: {c.name} [{c.status}]"
                       + (f" ({c.detail})" if c.detail else "") + (f" -- {c.note}" if c.note else ""))
    if len(out) > limit:
        out = out[:limit] + [f"  ... and {len(out) - limit} more"]
    return "\n".join(out)


def closing_line(cases: list[Case], extra: Counter | None = None) -> str:
    """The kernel's cases; the lab's own unit tests (`extra`) apart"""
    v = Counter(c.verdict for c in cases)
    out = f"{v['pass']} passed, {v['fail']} failed, {v['skip']} skipped"
    if extra:
        out += (f" (lab unit tests apart: {extra['pass']} passed, {extra['fail']} failed, "
                f"{extra['skip']} skipped)")
    return out
