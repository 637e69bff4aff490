"""results/README.md is the index `ptlab index` writes of the reports there."""
from lab import index
from lab.common import RESULTS_DIR


def test_the_committed_index_is_current():
    assert (RESULTS_DIR / "README.md").read_text() == index.build_index(), \
        "results/README.md is stale: run ./ptlab index and commit it"


def test_headline_is_the_first_metric_with_a_ratio(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "results.json").write_text(
        '{"kernels": {"a": {"name": "vanilla"}, "b": {"name": "vanilla"}}, "date": "2026",'
        ' "benchmarks": {"fork": {"metrics": {"on": {"ratio": null},'
        ' "fork_latency": {"ratio": 0.5}, "x": {"ratio": 2}}}}}')
    text = index.build_index(tmp_path)
    assert "vanilla vs vanilla (floor)" in text and "fork 0.500 (fork_latency)" in text
