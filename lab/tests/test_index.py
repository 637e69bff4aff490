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


def test_a_switch_on_one_side_is_no_floor_and_odd_files_are_skipped(tmp_path):
    for d, text in (("r", '{"kernels": {"a": {"name": "patched"}, "b": {"name": "patched",'
                          ' "sysctls": ["vm.cow_pte=2"]}}, "date": null}'),
                    ("odd", "[1, 2]"), ("bad", "{")):
        (tmp_path / d).mkdir()
        (tmp_path / d / "results.json").write_text(text)
    text = index.build_index(tmp_path)
    assert "patched (vm.cow_pte=2) vs patched |" in text and "(floor)" not in text
