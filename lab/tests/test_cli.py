"""Newcomer paths (issue 11, item 8): a clear error, nothing changed."""
import pytest

from lab import cli, guest, results
from lab.common import LabError


def test_a_typo_in_a_suite_name_changes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PTLAB_CACHE", str(tmp_path))
    assert cli.main(["test", "--no-unit", "cow", "nosuchsuite"]) == 2
    err = capsys.readouterr().err
    assert "no suite or test named 'nosuchsuite'" in err and "hint: suites:" in err
    assert not (tmp_path / "runs").exists()     # runs/latest was not moved


def test_cache_that_is_a_file(tmp_path, monkeypatch, capsys):
    f = tmp_path / "file"
    f.write_text("")
    monkeypatch.setenv("PTLAB_CACHE", str(f))
    assert cli.main(["parse"]) == 2
    err = capsys.readouterr().err
    assert "cannot use" in err and "PTLAB_CACHE" in err and "Traceback" not in err


def test_parse_of_a_directory_without_results(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PTLAB_CACHE", str(tmp_path / "cache"))
    (tmp_path / "run.json").write_text('{"kernel": "patched", "profile": "debug", '
                                       '"tests": ["cow"]}')
    assert cli.main(["parse", str(tmp_path)]) == 2
    assert "no results.txt" in capsys.readouterr().err
    assert cli.main(["parse", str(tmp_path / "nothing")]) == 2
    assert "not a `ptlab test` run directory" in capsys.readouterr().err


def test_malformed_flaky_line(tmp_path):
    f = tmp_path / "flaky.txt"
    f.write_text("# comment\ncow/cow: a case -- seen once\nthis line has no separator\n")
    with pytest.raises(LabError) as e:
        results.load_flaky(f)
    assert "flaky.txt:3" in e.value.message


def test_every_option_has_help():
    import argparse
    p = cli.build_parser()
    assert "./ptlab test" in p.description and "./ptlab bench" in p.description
    subs = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    for name, sp in subs.choices.items():
        for a in sp._actions:
            if not isinstance(a, argparse._HelpAction):
                assert a.help, f"ptlab {name} {a.option_strings or a.dest}: no help"
    assert all(c.help for c in subs._choices_actions)


@pytest.mark.parametrize("bad", ["vm.x", "=1", "vm=1", "vm.x=1 2", "vm.x=1,vm.y=2", "Vm.x=1"])
def test_a_malformed_sysctl_changes_nothing(tmp_path, monkeypatch, capsys, bad):
    monkeypatch.setenv("PTLAB_CACHE", str(tmp_path))
    assert cli.main(["test", "--no-unit", "--sysctl", bad, "cow"]) == 2
    assert "expected NAME=VALUE" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_no_baseline_with_a_sysctl(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PTLAB_CACHE", str(tmp_path))
    assert cli.main(["test", "--vanilla", "--record-baseline",
                     "--sysctl", "vm.overcommit_memory=1"]) == 2
    assert "baseline is recorded with the kernel's own sysctl values" in capsys.readouterr().err


def test_sysctls_reach_the_kernel_and_the_guest():
    """The kernel sets sysctl.name=value itself; init checks ptlab.sysctls."""
    assert guest.kernel_params(["vm.a"], ["vm.b=2", "kernel.c=0"]) == [
        "sysctl.vm.b=2", "sysctl.kernel.c=0", "ptlab.sysctls=vm.b=2,kernel.c=0",
        "ptlab.features=vm.a"]
    assert guest.kernel_params([], []) == []


def test_build_parses_without_a_kernel_and_refuses_a_typo():
    p = cli.build_parser()
    assert p.parse_args(["build"]).kernel == []
    assert p.parse_args(["build", "vanilla", "patched"]).kernel == ["vanilla", "patched"]
    with pytest.raises(SystemExit):
        p.parse_args(["build", "vanila"])


def test_bench_sysctls_per_side():
    from lab.cli import bench_sysctls
    assert bench_sysctls(["b:vm.cow_pte=2", "vm.pte_table_reclaim=0"]) == {
        "a": ["vm.pte_table_reclaim=0"], "b": ["vm.cow_pte=2", "vm.pte_table_reclaim=0"]}
    with pytest.raises(LabError):
        bench_sysctls(["a:vm.cow_pte"])


def test_bench_sysctls_last_of_a_name_wins():
    from lab.cli import bench_sysctls
    assert bench_sysctls(["vm.x=1", "a:vm.x=2"]) == {"a": ["vm.x=2"], "b": ["vm.x=1"]}
