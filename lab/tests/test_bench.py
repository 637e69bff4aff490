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
