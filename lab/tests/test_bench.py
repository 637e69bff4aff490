"""Benchmark output protocol and statistics."""
from lab import bench


def test_parse_output_verified_and_failed():
    ok = ["# sizes: 1G", "metric fork_latency 53.2 ms lower", "verify ok"]
    ms, err = bench.parse_output(ok, 0)
    assert err == "" and ms["fork_latency"] == (53.2, "ms", "lower")
    ms, err = bench.parse_output(["metric x 1 ms lower", "verify FAILED page 3 bad"], 1)
    assert ms == {} and "FAILED" in err
    ms, err = bench.parse_output(["metric x 1 ms lower"], 0)      # never verified
    assert ms == {} and "verify" in err
    ms, err = bench.parse_output(["# skip: no NUMA"], 4)
    assert ms == {} and err.startswith("skipped")


def test_aggregate_ratio_and_spread():
    b = bench.BENCHES[0]
    runs = {b.name: {"a": [({"t": (v, "ms", "lower")}, "") for v in (10, 12, 11)],
                     "b": [({"t": (v, "ms", "lower")}, "") for v in (5, 6, 7)] + [({}, "boom")]}}
    e = bench.aggregate(runs, [b])[b.name]
    t = e["metrics"]["t"]
    assert t["a"] == {"median": 11, "min": 10, "max": 12, "n": 3}
    assert t["b"]["n"] == 3 and abs(t["ratio"] - 6 / 11) < 1e-9
    assert e["errors"] == {"b": ["boom"]}


def test_select():
    assert {b.group for b in bench.select(["migrate"])} == {"migrate"}
    try:
        bench.select(["nope"])
    except Exception as e:
        assert "nope" in str(e)
    else:
        raise AssertionError("unknown benchmark accepted")


def test_abba_order():
    assert [bench.order(r) for r in (1, 2, 3, 4)] == [("a", "b"), ("b", "a")] * 2


def test_a_skip_on_one_side_fails_the_command():
    b = bench.BENCHES[0]
    runs = {b.name: {"a": [({"t": (10, "ms", "lower")}, "")] * 2,
                     "b": [({}, "skipped: no NUMA")] * 2}}
    e = bench.aggregate(runs, [b])[b.name]
    assert bench.unskipped_on_one_side(e) == ["B skipped (skipped: no NUMA) while A measured"]
    both = {b.name: {s: [({}, "skipped: no NUMA")] for s in ("a", "b")}}
    assert bench.unskipped_on_one_side(bench.aggregate(both, [b])[b.name]) == []


def test_a_metric_without_samples_is_not_a_zero():
    # bench_uffd_compact prints no latency metric when no read hit a fault
    ms, err = bench.parse_output(["metric compactor_ms 5 ms lower", "verify ok"], 0)
    b = bench.BENCHES[0]
    runs = {b.name: {"a": [(ms, err)],
                     "b": [({"compactor_ms": (5, "ms", "lower"),
                             "fault_latency_p99_us": (7, "us", "lower")}, "")]}}
    t = bench.aggregate(runs, [b])[b.name]["metrics"]["fault_latency_p99_us"]
    assert t["a"]["n"] == 0 and t["a"]["median"] is None and t["ratio"] is None
    assert "no samples" in bench.table("x", bench.aggregate(runs, [b])[b.name], "A", "B")


def test_reps_below_one_refused_before_building(monkeypatch):
    import pytest
    from lab.common import LabError
    monkeypatch.setattr(bench.deps, "ensure_apt", lambda: (_ for _ in ()).throw(
        AssertionError("installed/built before checking --reps")))
    with pytest.raises(LabError):
        bench.run_bench("vanilla", "patched", [], 0, "default", None)


def test_icount_machine_runs_single_threaded_tcg():
    from dataclasses import replace
    from lab.qemu_config import DEFAULT
    args = replace(DEFAULT, icount=0).qemu_args("tcg", "k", "i", [], "r")
    assert "tcg,thread=single" in args and "shift=0,sleep=off,align=off" in args
    assert "tcg,thread=multi" in DEFAULT.qemu_args("tcg", "k", "i", [], "r")
