"""Verdicts against the vanilla baseline, and the closing line."""
from lab import results
from lab.guest import TestRun as Run, _parse_results
from lab.suites import Test as SuiteTest

T = SuiteTest("cow", "cow", ("cow",), 60)


def run_of(text: str, rc: int) -> Run:
    return Run("cow", "cow", text.splitlines(), rc)


TAP = """TAP version 13
1..3
ok 1 a
not ok 2 b
ok 3 # SKIP c needs THP
"""


def test_regression_and_known_failure():
    cases = results.cases_of(T, run_of(TAP, 1))
    base = {"cow/cow": {"a": "pass", "b": "fail", "c needs THP": "skip"}}
    results.judge(cases, base, flaky={})
    assert [c.verdict for c in cases] == ["pass", "known", "skip"]
    base["cow/cow"]["b"] = "pass"
    results.judge(cases, base, flaky={})
    assert [c.verdict for c in cases] == ["pass", "fail", "skip"]
    assert results.closing_line(cases) == "1 passed, 1 failed, 1 skipped"


def test_flaky_case_is_known():
    cases = results.cases_of(T, run_of(TAP, 1))
    results.judge(cases, {"cow/cow": {"b": "pass"}}, flaky={("cow/cow", "b"): "seen once"})
    assert cases[1].verdict == "known" and "seen once" in cases[1].note
    assert ("uffd-unit-tests/uffd-unit-tests", "events on anon") in results.load_flaky()


def test_newly_skipped_is_a_failure():
    cases = results.cases_of(T, run_of(TAP, 1))
    results.judge(cases, {"cow/cow": {"c needs THP": "pass", "b": "fail"}}, flaky={})
    assert cases[2].verdict == "fail" and "vanilla" in cases[2].note


def test_timeout_crash_and_no_tap():
    killed = results.cases_of(T, run_of("TAP version 13\n1..2\nok 1 a\n", 137))
    assert any(c.status == "error" and "timeout" in c.detail for c in killed)
    assert results.cases_of(T, None)[0].status == "error"
    assert results.cases_of(T, run_of("hello\n", 0))[0].status == "pass"
    assert results.cases_of(T, run_of("hello\n", 4))[0].status == "skip"
    assert results.cases_of(T, run_of("hello\n", 1))[0].status == "fail"


def test_nonzero_exit_without_failed_case_is_an_error():
    cases = results.cases_of(T, run_of("TAP version 13\n1..1\nok 1 a\n", 139))
    assert cases[-1].status == "error"


def test_results_channel_framing():
    text = ("PTLAB-BOOT 6.12.117 cpus=4\nPTLAB-BEGIN cow cow\nTAP version 13\r\n"
            "ok 1 a\nPTLAB-END cow cow rc=0 secs=1.5\nPTLAB-BEGIN misc mkdirty\nok 1 x\n")
    runs, done, boot = _parse_results(text)
    assert boot.startswith("6.12.117") and not done
    assert runs[0].rc == 0 and runs[0].secs == 1.5 and runs[0].output == ["TAP version 13", "ok 1 a"]
    assert runs[1].rc is None     # the guest died inside mkdirty
