"""`ptlab compare`: the floor's spread, the marks, and two --here runs made
into an A/B report."""
import json

import pytest

from lab import bench, compare, here
from lab.common import LabError


def metric(a, b, better="lower"):
    e = {"unit": "ms", "better": better, "values": {"a": a, "b": b},
         "a": bench.summarize(a), "b": bench.summarize(b)}
    e["ratio"] = e["b"]["median"] / e["a"]["median"]
    return e


def test_spread_is_the_range_of_ratios_between_any_two_values_of_the_floor():
    sp = compare.spread(metric([10, 10, 10], [9, 10, 12]))
    assert (sp["lo"], sp["hi"], sp["values"]) == (0.75, 12 / 9, 6)
    assert compare.spread({"values": {}, "ratio": None}) is None


def test_spread_pools_the_sides_of_a_floor_of_one_kernel():
    """2026-11-28, purges per second under --icount: each pair's ratio is
    within 0.88-1.33, the boots themselves 42.7-63.1"""
    sp = compare.spread(metric([48.7, 47.4], [42.7, 63.1], better="higher"))
    assert sp["lo"] == pytest.approx(42.7 / 63.1) and sp["hi"] == pytest.approx(63.1 / 42.7)
    assert compare.mark(43.5 / 57.5, sp, "higher") == ""


def test_a_count_with_a_flat_floor_is_marked_on_any_difference():
    floor = compare.spread(metric([4, 4], [4, 4]))
    assert compare.mark(1.0, floor, "lower") == ""
    assert compare.mark(1.25, floor, "lower") == "worse"
    assert compare.mark(1.25, floor, "higher") == "better"
    assert compare.mark(0.5, floor, "lower") == "better"
    assert compare.mark(None, floor, "lower") == "" and compare.mark(2, None, "lower") == ""


def report(a, b, name="fork", **kw):
    return {"kernels": {"a": {"name": "vanilla"}, "b": {"name": kw.get("b_name", "vanilla")}},
            "sizes": "default", "clock": "host", "accel": "tcg",
            "benchmarks": {name: {"group": "fork", "metrics": {"fork_latency": metric(a, b)},
                                  "errors": {}}}}


def test_annotate_marks_what_lies_outside_and_says_what_it_read_against():
    run = report([10, 10], [5, 6], b_name="patched")
    n = compare.annotate(run, report([10, 10], [9, 11]), "floor-dir")
    e = run["benchmarks"]["fork"]["metrics"]["fork_latency"]
    assert n == 1 and e["mark"] == "better" and e["floor"]["lo"] == pytest.approx(9 / 11)
    assert run["floor"] == "floor-dir"
    assert "outside the floor: better" in bench.table("fork", run["benchmarks"]["fork"], "A", "B")


def test_a_floor_of_two_kernels_or_other_sizes_is_noted():
    run = report([10], [5], b_name="patched")
    notes = compare.floor_check(run, {**report([10], [10], b_name="patched"), "sizes": "full"})
    assert any("not a kernel against itself" in n for n in notes)
    assert any(n.startswith("sizes:") for n in notes)


def here_run(name, values, sizes="default"):
    return {"kind": "here", "kernel": {"name": name, "desc": name, "sysctls": []},
            "sizes": sizes, "repetitions": len(values), "date": "2026-11-28",
            "machine": {"cpu": "x", "cores": 2}, "sizes_used": {"fork": "area 1G"},
            "runs": {"fork": [[{"fork_latency": [v, "ms", "lower"]}, ""] for v in values],
                     "gone-bench": [[{}, "x"]]}}


def test_two_here_runs_make_the_report_of_an_in_qemu_run(tmp_path):
    for d, v in (("a", [10, 12, 11]), ("b", [5, 6, 4])):
        (tmp_path / d).mkdir()
        (tmp_path / d / "results.json").write_text(json.dumps(here_run(f"k-{d}", v)))
    out = tmp_path / "ab"
    assert compare.run_compare(str(tmp_path / "a"), str(tmp_path / "b"), None, str(out)) == 0
    data = json.loads((out / "results.json").read_text())
    m = data["benchmarks"]["fork"]["metrics"]["fork_latency"]
    assert m["ratio"] == pytest.approx(5 / 11) and m["values"] == {"a": [10, 12, 11],
                                                                  "b": [5, 6, 4]}
    assert data["kernels"]["a"]["name"] == "k-a" and "gone-bench" not in data["benchmarks"]
    assert "# ptlab bench: k-b vs k-a" in (out / "report.md").read_text()


def test_here_runs_of_other_sizes_or_an_ab_report_are_refused():
    with pytest.raises(LabError):
        compare.pair(here_run("a", [1]), here_run("b", [1], sizes="full"), "a", "b")
    with pytest.raises(LabError):
        compare.pair(here_run("a", [1]), report([1], [1]), "a", "b")


def test_new_lines_are_what_the_kernel_logged_since():
    assert here.new_lines(["a", "b"], ["a", "b", "c"]) == ["c"]
    assert here.new_lines(["x"], ["b", "c"]) == ["b", "c"]     # wrapped: all of it
    assert here.new_lines([], ["c"]) == ["c"]


def test_a_floor_that_went_from_nothing_to_something_holds_any_ratio():
    sp = compare.spread(metric([0, 1], [1, 0]))
    assert sp["lo"] == 0 and sp["hi"] is None       # unbounded, and JSON can say so
    assert compare.mark(1.0, sp, "lower") == ""


def test_a_here_run_beside_an_ab_report_or_as_the_floor_is_refused(tmp_path):
    for d, data in (("h", here_run("k", [1, 2])), ("h2", here_run("k2", [1, 2])),
                    ("ab", report([1], [1]))):
        (tmp_path / d).mkdir()
        (tmp_path / d / "results.json").write_text(json.dumps(data))
    with pytest.raises(LabError):
        compare.run_compare(str(tmp_path / "ab"), str(tmp_path / "h"), None, None)
    with pytest.raises(LabError):
        compare.run_compare(str(tmp_path / "h"), str(tmp_path / "h2"), str(tmp_path / "h"),
                            str(tmp_path / "out"))


def test_a_report_without_a_clock_was_measured_on_the_host_clock():
    old = report([10], [10])
    del old["clock"]
    assert not any("clock" in n for n in compare.floor_check(old, report([10], [10])))
