"""The command line: each stage callable alone, like kunit.py."""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from . import (bench, build, check, compare, deps, here, index, run, guest, kconfig,
               results, soak, splat, suites, tree)
from .common import REPO, LabError, cache_dir, info, step, warn


def kernel_src(name: str, force: bool = False):
    return tree.ensure_vanilla() if name == "vanilla" else tree.ensure_patched(force)


def cmd_tree(args) -> int:
    src = tree.ensure_patched(force=args.force)
    st = tree.status()
    print(f"work tree: {src}")
    print(f"base: tag {tree.BASE_TAG}; series: {len(tree.series())} patches; "
          f"{'in sync with patches/' if st.clean else 'NOT in sync with patches/'}")
    return 0


def cmd_export(args) -> int:
    files = tree.export()
    for f in files:
        print(f"patches/{f.name}")
    print(f"{len(files)} patches written; commit patches/ in the repo")
    return 0


def cmd_check(args) -> int:
    """The series' hygiene (lab/check.py): exit 0 only if every patch is clean."""
    deps.ensure_apt()
    src = tree.ensure_patched(force=False)
    found = check.check_series(src)
    if args.builds:
        found += check.build_each_commit(args.builds, args.first)
    for f in found:
        print(f"\n{f.patch}: {f.what}")
    print(f"\n{len(tree.series())} patches checked"
          + (f", each built on its own ({args.builds})" if args.builds else "")
          + f", {len({f.patch for f in found})} with findings")
    return 1 if found else 0


def cmd_index(args) -> int:
    print(f"{index.write_index()}: every report under results/")
    return 0


def cmd_status(args) -> int:
    st = tree.status()
    if not st.exists:
        print("no work tree with the series applied (`ptlab tree` makes it): nothing to lose")
        return 0
    for l in st.unexported:
        print(l)
    if st.behind:
        print("patches/ has changed since the tree was synced: `ptlab tree` re-applies it")
    if st.unexported:
        print(f"{tree.src_dir('patched')}: work not in patches/; `ptlab export` and commit")
        return 1
    if not st.behind:
        print("work tree and patches/ are in sync")
    return 0


def cmd_build(args) -> int:
    deps.ensure_apt()
    for name in args.kernel or ["patched"]:
        src = kernel_src(name)
        vmlinux = build.build_kernel(src, tree.kernel_dir(name), args.profile)
        print(vmlinux)
    return 0


def _run_dir(kind: str) -> Path:
    d = cache_dir() / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{kind}"
    d.mkdir(parents=True, exist_ok=True)
    latest = cache_dir() / "runs" / "latest"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    latest.symlink_to(d.name)
    return d


def run_unit_tests(run_dir) -> Counter:
    """The lab's own unit tests (Debian's pytest)."""
    py = deps.python()
    step("lab unit tests (pytest lab/tests)")
    xml = run_dir / "pytest.xml"
    proc = subprocess.run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"--junitxml={xml}", str(REPO / "lab" / "tests")],
                          cwd=REPO, capture_output=True, text=True)
    if not xml.exists():
        raise LabError("pytest did not run", details=proc.stdout[-2000:] + proc.stderr[-2000:])
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    bad = n["failures"] + n["errors"]
    info(f"{n['tests'] - bad - n['skipped']} passed, {bad} failed, {n['skipped']} skipped")
    if bad:
        print(proc.stdout[-4000:])
    return Counter({"pass": n["tests"] - bad - n["skipped"], "fail": bad, "skip": n["skipped"]})


def prepare(kernel: str, profile: str, force_tree: bool):
    """Everything a boot needs: (vmlinux, mm selftests dir, benchmark programs dir)."""
    deps.ensure_apt()
    patched = tree.ensure_patched(force=force_tree)
    src = tree.ensure_vanilla() if kernel == "vanilla" else patched
    vmlinux = build.build_kernel(src, tree.kernel_dir(kernel), profile)
    st_dir, ours = build.programs(patched, tree.kernel_dir("patched"))
    return vmlinux, st_dir, ours


def _binaries(tests, st_dir):
    """The programs of `tests`: all in the mm selftests, the series' own tests too"""
    bins, missing = [], []
    for t in tests:
        path = st_dir / t.argv[0]
        (bins if path.exists() else missing).append(path)
    if missing:
        raise LabError("test binaries missing: " + ", ".join(p.name for p in missing),
                       hint="see the selftests build log in " + str(st_dir.parent.parent))
    return sorted(set(bins))


def _one_liner(r: run.TestRun) -> None:
    fmt = next((t.fmt for t in suites.ALL if (t.suite, t.test) == (r.suite, r.test)), "ktap")
    c = Counter(x.status for x in results.parse_output(r.output, fmt).cases)
    summary = ", ".join(f"{v} {k}" for k, v in sorted(c.items())) or \
        ("judged by its exit status" if fmt == "exit" else f"no case in its output ({fmt})")
    print(f"        {r.suite}/{r.test}: {summary}; exit {r.rc}, {r.secs:.0f} s", flush=True)


_SYSCTL = re.compile(r"([a-z0-9_]+(?:\.[a-z0-9_-]+)+)=([^\s,=]+)")


def _check_sysctl(kv: str) -> str:
    """`--sysctl vm.name=value`, checked before anything changes state."""
    m = _SYSCTL.fullmatch(kv)
    if not m:
        raise LabError(f"--sysctl {kv!r}: expected NAME=VALUE, such as vm.pte_table_reclaim=0",
                       hint="the name as sysctl(8) writes it (dots); one value, without "
                            "spaces or commas")
    return kv


def cmd_test(args) -> int:
    kernel = "vanilla" if args.vanilla else "patched"
    if args.record_baseline and kernel != "vanilla":
        raise LabError("--record-baseline records the vanilla kernel's results",
                       hint="ptlab test --vanilla --record-baseline")
    base = kconfig.baseline_profile(args.profile)
    if args.record_baseline and base != args.profile:
        raise LabError(f"the {args.profile} profile is judged by the {base} baseline",
                       hint=f"ptlab test --vanilla --record-baseline --profile {base}")
    if args.sysctl and args.record_baseline:
        raise LabError("a baseline is recorded with the kernel's own sysctl values",
                       hint="ptlab test --vanilla --record-baseline, without --sysctl")
    sysctls = [_check_sysctl(kv) for kv in args.sysctl]
    tests = suites.select(args.only)        # a typo stops here, before anything changes
    if args.timeout < 1:
        raise LabError("--timeout must be at least 1 second")
    if args.jobs is not None and args.jobs < 1:
        raise LabError("--jobs must be at least 1")
    jobs = min(args.jobs or guest.default_jobs(), len(tests))
    deps.ensure_apt()
    run_dir = _run_dir(f"test-{kernel}")
    extra = Counter()
    if not args.no_unit and not args.only:
        extra = run_unit_tests(run_dir)
    vmlinux, st_dir, _ = prepare(kernel, args.profile, force_tree=bool(os.environ.get("CI")))
    bins = _binaries(tests, st_dir)
    # before the boot: an interrupted run can be judged with `ptlab parse`
    meta = {"kernel": kernel, "version": tree.kernel_version(tree.src_dir(kernel)),
            "profile": args.profile, "accel": guest.probe_accel(vmlinux),
            "tests": [f"{t.suite}/{t.test}" for t in tests], "sysctls": sysctls,
            "guests": jobs}
    (run_dir / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
    step(f"boot {kernel} ({args.profile}) and run {len(tests)} test programs"
         + (f" in {jobs} guests side by side" if jobs > 1 else "") + f"; logs in {run_dir}")
    out = guest.boot(vmlinux, [t.plan() for t in tests], bins, run_dir,
                     timeout=args.timeout, on_test=_one_liner, jobs=jobs,
                     features=kconfig.feature_sysctls() if kernel == "patched" else [],
                     sysctls=sysctls)
    info(f"guest: {out.boot}; {out.wall:.0f} s")
    return report(run_dir, out, tests, meta, extra, args.record_baseline)


def report(run_dir: Path, out: run.Outcome, tests: list, meta: dict, extra: Counter,
           record: bool) -> int:
    """Print what results.judge_run() decided: the tables, the closing line."""
    cases = results.judge_run(out, tests, meta["profile"], meta["kernel"])
    if results.load_baseline(meta["profile"]) is None and meta["kernel"] != "vanilla":
        warn(f"no vanilla baseline {results.baseline_path(meta['profile'])}: "
             "every failure counts")
    secs = Counter()
    for r in out.runs:
        secs[r.suite] += r.secs
    (run_dir / "cases.json").write_text(json.dumps([c.__dict__ for c in cases], indent=1))

    print()
    print(results.suite_table(cases, secs))
    counters = results.counter_table(out.runs)
    if counters:
        print("\n" + counters)
    if extra:
        print(f"{'lab unit tests (pytest)':24} {extra['pass']:7} {extra['fail']:7} "
              f"{extra['skip']:8}")
    bad = results.problems(cases)
    if bad:
        print("\n" + bad)
    if out.splats:
        print(f"\nthe kernel log shows {len(out.splats)} splat(s) ({out.log}):")
        print(splat.format_report(out.splats))
    if out.dropped:
        print(f"\nthe console dropped {out.dropped} message(s); "
              + ("the guest's dmesg, scanned instead, has them" if out.dmesg_saved
                 else "the guest died before its dmesg was saved: a splat may be missing"))
    if record:
        if meta["kernel"] != "vanilla" or not out.ok:
            raise LabError("a baseline is recorded only from a complete vanilla run "
                           "without splats")
        bmeta = {"kernel": f"vanilla {meta['version']}", "profile": meta["profile"],
                 "accel": meta["accel"]}
        own = [c for c in cases if c.suite not in ("console", "guest")]
        print(f"\nbaseline written: {results.record_baseline(meta['profile'], own, bmeta)}")
    if meta.get("sysctls"):
        print("\nsysctls set for this run: " + ", ".join(meta["sysctls"]))
    print(f"\nlogs: {run_dir}")
    print(results.closing_line(cases, extra))
    return 1 if results.failed(cases, extra) else 0


def cmd_parse(args) -> int:
    """Judge a finished run again (e.g. after a parser fix), without booting."""
    run_dir = Path(args.run_dir or cache_dir() / "runs" / "latest").resolve()
    if not (run_dir / "run.json").exists():
        raise LabError(f"{run_dir} is not a `ptlab test` run directory (no run.json)")
    meta = json.loads((run_dir / "run.json").read_text())
    tests = suites.select(meta["tests"])
    return report(run_dir, guest.collect(run_dir), tests, meta, Counter(), args.record_baseline)


def cmd_shell(args) -> int:
    kernel = "vanilla" if args.vanilla else "patched"
    if args.host_root and not args.exec:
        raise LabError("--host-root runs the command of --exec", hint="add --exec CMD")
    vmlinux, st_dir, _ = prepare(kernel, args.profile, force_tree=False)
    if args.host_root:
        cfg = kconfig.parse((build.build_dir(tree.kernel_dir(kernel), args.profile)
                             / ".config").read_text())
        if cfg.get("CONFIG_9P_FS") != "y" or cfg.get("CONFIG_NET_9P_VIRTIO") != "y":
            raise LabError(f"the {args.profile} kernel has no 9p over virtio for the "
                           "host's files (config/base.config turns it off)",
                           hint="--profile package: the kernel of `ptlab package`")
    bins = _binaries(suites.ALL, st_dir)
    return guest.shell(vmlinux, bins, _run_dir(f"shell-{kernel}"), command=args.exec or "",
                       append=args.append, timeout=args.timeout,
                       host_root=Path.cwd() if args.host_root else None)


def cmd_soak(args) -> int:
    if args.minutes < 1:
        raise LabError("--minutes must be at least 1")
    deps.ensure_apt()
    run_dir = _run_dir(f"soak-{args.profile}")
    vmlinux, st_dir, _ = prepare("patched", args.profile, force_tree=False)
    bins = [st_dir / name for name in soak.RACE_PROGRAMS]
    # every switch of the series at its all-on value (vm.cow_pte=2: every
    # fork shares), NUMA balancing on; --sysctl overrides by name
    sysctls = soak.sysctls(kconfig.all_on_sysctls(),
                           [_check_sysctl(kv) for kv in args.sysctl])
    secs = args.minutes * 60
    plan = [run.PlanItem("soak", "soak", secs + 600,
                           ["soak", str(args.minutes),
                            args.memcg_limit or soak.memcg_limit(args.profile),
                            ",".join(soak.unconfined_args(args.minutes)),
                            soak.TRINITY_SEP.join(soak.trinity_args()), soak.TRINITY_MEMCG_MAX,
                            *soak.stress_args(args.minutes, args.profile)])]
    step(f"boot patched ({args.profile}) and soak for {args.minutes} min; logs in {run_dir}")
    out = guest.boot(vmlinux, plan, bins, run_dir, timeout=secs + 900,
                     features=kconfig.feature_sysctls(), sysctls=sysctls)
    res = soak.parse(out.runs[0].output if out.runs else [], args.profile)
    text, ok = soak.report(res, out, args.minutes, args.profile)
    (run_dir / "soak.txt").write_text(text + "\n")
    print(text)
    print(f"\nlogs: {run_dir}")
    return 0 if ok else 1


def cmd_bench(args) -> int:
    if args.icount is not None and not 0 <= args.icount <= 10:
        raise LabError(f"--icount {args.icount}: QEMU takes a shift of 0 to 10")
    outdir = Path(args.out).resolve() if args.out else None
    sizes = "quick" if args.quick else "full" if args.full else "default"
    if args.here:
        given = [o for o, v in (("--a", args.a != "vanilla"), ("--b", args.b != "patched"),
                                ("--sysctl", args.sysctl), ("--icount", args.icount is not None),
                                ("--profile", args.profile != "perf"))
                 if v]
        if given:
            raise LabError(f"--here measures the running kernel: {', '.join(given)} "
                           "name(s) a kernel to boot",
                           hint="set sysctls with sysctl(8) before the run; compare two "
                                "runs with `ptlab compare A B`")
        return here.run_here(args.only, args.reps, sizes, outdir)
    return bench.run_bench(args.a, args.b, args.only, args.reps, sizes, outdir,
                           bench_sysctls(args.sysctl), args.icount, args.profile)


def cmd_compare(args) -> int:
    return compare.run_compare(args.x, args.y, args.floor, args.out)


def cmd_package(args) -> int:
    """Debian packages of the kernels (build.build_package), copied to --out"""
    deps.ensure_apt()
    out = Path(args.out).resolve() if args.out else cache_dir() / "packages"
    out.mkdir(parents=True, exist_ok=True)
    images = []
    for name in args.kernel or ["vanilla", "patched"]:
        build.build_kernel(kernel_src(name), tree.kernel_dir(name), "package")
        for deb in sorted(tree.kernel_dir(name).glob("*.deb")):
            if deb.name.startswith("linux-libc-dev"):
                continue        # the uapi headers of /usr/include: not for a test kernel
            shutil.copy2(deb, out / deb.name)
            images += [out / deb.name] if deb.name.startswith("linux-image-") else []
            print(out / deb.name)
    print(f"\non a Debian 12 x86-64 machine: apt install {' '.join('./' + i.name for i in images)}"
          "\nthen boot each kernel in turn (the GRUB menu, \"Advanced options\") and run, "
          "as root, from this repository:\n  ./ptlab bench --here --out RUN-OF-THAT-KERNEL\n"
          "and last: ./ptlab compare RUN-OF-VANILLA RUN-OF-PATCHED --out REPORT "
          "(docs/lab.md, \"On your own hardware\")")
    return 0


def bench_sysctls(items: list[str]) -> dict[str, list[str]]:
    """`--sysctl [a:|b:]NAME=VALUE` items -> each side's NAME=VALUE list"""
    out = {"a": {}, "b": {}}
    for item in items:
        side, sep, kv = item.partition(":")
        if not sep or side not in out:
            side, kv = "", item
        for s in (side,) if side else ("a", "b"):
            name = _check_sysctl(kv).split("=", 1)[0]
            out[s].pop(name, None)          # the last one of a name wins
            out[s][name] = kv
    return {s: list(d.values()) for s, d in out.items()}


DESCRIPTION = """\
ptlab builds Linux 6.12 with our page-table series (patches/) and without it,
boots each under QEMU and runs the kernel's own mm selftests and ours, or
benchmarks the two kernels against each other.

  ./ptlab test     the tests of the patched kernel, judged against vanilla's
                   recorded results (baseline/): the README's test command
  ./ptlab bench    vanilla vs patched, interleaved boots, median [min-max]

Everything it needs is installed on first use (Debian packages); kernels,
builds and run logs live in ~/.cache/ptlab (PTLAB_CACHE moves it)."""

PROFILE_HELP = ("kernel configuration: debug (lockdep, DEBUG_VM; the default), "
                "perf (what benchmarks run), kasan (debug + KASAN), package (perf for "
                "real machines: the image of `ptlab package`'s linux-image .deb)")


def _kernel_name(name: str) -> str:
    if name not in tree.KERNELS:
        raise argparse.ArgumentTypeError(
            f"invalid choice: {name!r} (choose from {', '.join(tree.KERNELS)})")
    return name


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ptlab", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    s = sub.add_parser("test", help="build, boot and run the tests (the README's command)",
                       description="Build the kernel, boot it under QEMU, run every test "
                                   "program and judge each case against vanilla's results "
                                   "in baseline/. Exit 0 only if nothing failed.")
    s.add_argument("only", nargs="*", metavar="SUITE|TEST",
                   help="run only these suites or tests (default: all); "
                        "suites: " + ", ".join(suites.suites()))
    s.add_argument("--vanilla", action="store_true", help="test the vanilla kernel")
    s.add_argument("--profile", default="debug", choices=tuple(kconfig.PROFILES),
                   help=PROFILE_HELP)
    s.add_argument("--record-baseline", action="store_true",
                   help="with --vanilla: write the results to baseline/")
    s.add_argument("--no-unit", action="store_true", help="skip the lab's pytest unit tests")
    s.add_argument("--timeout", type=int, default=3600,
                   help="seconds for each guest's run (default 3600)")
    s.add_argument("-j", "--jobs", type=int, metavar="N",
                   help="guests side by side, each with a part of the plan (default: "
                        "one per two host CPUs that the host's memory holds, at most 4; "
                        "-j 1: the whole plan in one guest)")
    s.add_argument("--sysctl", action="append", default=[], metavar="NAME=VALUE",
                   help="set a sysctl at boot, for the whole plan (repeatable), e.g. "
                        "vm.pte_table_reclaim=0; the run fails if the kernel lacks it. "
                        "Judged against the same vanilla baseline")
    s.set_defaults(fn=cmd_test)
    s = sub.add_parser("bench", help="benchmarks, vanilla vs patched (the README's command)")
    s.add_argument("only", nargs="*", metavar="BENCH",
                   help="benchmarks or variants to run (default: all): "
                        + ", ".join(bench.GROUPS))
    s.add_argument("--reps", type=int, default=5, help="boots per kernel (default 5)")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="smallest sizes (a smoke run)")
    g.add_argument("--full", action="store_true", help="the seed experiments' sizes")
    s.add_argument("--a", default="vanilla", metavar="KERNEL",
                   help="kernel A: vanilla (default), patched, or a commit of the work tree")
    s.add_argument("--b", default="patched", metavar="KERNEL", help="kernel B (default patched)")
    s.add_argument("--out", metavar="DIR", help="report directory (default: a new one "
                                                "under the cache's runs/)")
    s.add_argument("--sysctl", action="append", default=[], metavar="[a:|b:]NAME=VALUE",
                   help="set a sysctl at boot (repeatable) on both kernels, or with a: or "
                        "b: on one, e.g. b:vm.cow_pte=2; the run fails if the kernel lacks it")
    s.add_argument("--icount", type=int, nargs="?", const=0, metavar="SHIFT",
                   help="the guest's clock counts executed instructions (QEMU -icount "
                        "shift=SHIFT, default 0: 1 ns each), not the host's time: "
                        "deterministic figures for single-threaded work; TCG, one host thread")
    s.add_argument("--profile", default="perf", choices=("perf", "package"),
                   help="the kernels' configuration: perf (the default), or package (the "
                        "images of `ptlab package`, configured for real machines)")
    s.add_argument("--here", action="store_true",
                   help="run the benchmark programs on the kernel that runs ptlab (a real "
                        "machine, as root), --reps times each, no boot; one kernel's "
                        "results.json for `ptlab compare A B`")
    s.set_defaults(fn=cmd_bench)
    s = sub.add_parser("compare", help="a report against its noise floor, or two "
                                       "`bench --here` runs as an A/B report",
                       description="compare RUN FLOOR: RUN's ratios, each marked where it "
                                   "lies outside the spread of FLOOR (one kernel against "
                                   "itself). compare A B: two `bench --here` runs made into "
                                   "the A/B report of `ptlab bench` (report.md, results.json, "
                                   "plots), marked against --floor if given.")
    s.add_argument("x", metavar="RUN|A", help="a report directory (or its results.json)")
    s.add_argument("y", metavar="FLOOR|B", help="a report directory (or its results.json)")
    s.add_argument("--floor", metavar="FLOOR",
                   help="with two --here runs: the A/B report of one kernel against itself")
    s.add_argument("--out", metavar="DIR",
                   help="write the report here (default for two --here runs: a new "
                        "directory under the cache's runs/; else only printed)")
    s.set_defaults(fn=cmd_compare)
    s = sub.add_parser("package", help="Debian packages of the vanilla and patched kernels "
                                       "for a real machine (make bindeb-pkg)")
    s.add_argument("kernel", nargs="*", type=_kernel_name, metavar="KERNEL",
                   help="vanilla and/or patched (default: both)")
    s.add_argument("--out", metavar="DIR",
                   help="where the .deb files go (default: the cache's packages/)")
    s.set_defaults(fn=cmd_package)
    s = sub.add_parser("parse", help="judge a finished test run again, without booting")
    s.add_argument("run_dir", nargs="?", metavar="RUN_DIR",
                   help="a run directory (default: the cache's runs/latest)")
    s.add_argument("--record-baseline", action="store_true",
                   help="if it was a complete vanilla run: write it to baseline/")
    s.set_defaults(fn=cmd_parse)
    s = sub.add_parser("soak", help="stress-ng and our race tests for N minutes on the "
                                    "patched kernel, every feature on")
    s.add_argument("--minutes", type=int, default=30, help="how long (default 30)")
    s.add_argument("--profile", default="debug", choices=tuple(kconfig.PROFILES),
                   help=PROFILE_HELP)
    s.add_argument("--memcg-limit", metavar="SIZE",
                   help="memory.high of stress-ng's cgroup, below its load (default 768M; "
                        "512M with --profile kasan)")
    s.add_argument("--sysctl", action="append", default=[], metavar="NAME=VALUE",
                   help="set a sysctl at boot (repeatable), over the all-on value of "
                        "config/features.config, e.g. vm.cow_pte=1")
    s.set_defaults(fn=cmd_soak)
    s = sub.add_parser("shell", help="boot the test kernel with a shell on this terminal")
    s.add_argument("--vanilla", action="store_true", help="boot the vanilla kernel")
    s.add_argument("--exec", metavar="CMD", help="run CMD (sh -c, in the test programs' "
                   "directory) instead of a shell, then power off; exit with its status")
    s.add_argument("--append", action="append", default=[], metavar="ARG",
                   help="a kernel parameter more (repeatable), e.g. trace_event=tlb:tlb_flush")
    s.add_argument("--timeout", type=int, default=3600,
                   help="with --exec: seconds before QEMU is killed (default 3600)")
    s.add_argument("--host-root", action="store_true",
                   help="with --exec: run CMD in the host's files (its / read-only over "
                        "9p, the lab's cache read-write), from this directory: the guest "
                        "as a stand-in for a real machine, e.g. --exec './ptlab bench "
                        "--here ...'; needs --profile package")
    s.add_argument("--profile", default="debug", choices=tuple(kconfig.PROFILES),
                   help=PROFILE_HELP)
    s.set_defaults(fn=cmd_shell)
    s = sub.add_parser("build", help="configure and build kernels")
    s.add_argument("--profile", default="debug", choices=tuple(kconfig.PROFILES),
                   help=PROFILE_HELP)
    # not choices=: argparse checks an empty nargs="*" list against them as
    # a whole, and refused `ptlab build` without a kernel
    s.add_argument("kernel", nargs="*", type=_kernel_name,
                   metavar="{" + ",".join(tree.KERNELS) + "}",
                   help="which kernels (default: patched)")
    s.set_defaults(fn=cmd_build)
    s = sub.add_parser("tree", help="create the kernel work tree or re-apply patches/")
    s.add_argument("--force", action="store_true",
                   help="re-apply patches/ even over unexported work (saved on a branch)")
    s.set_defaults(fn=cmd_tree)
    s = sub.add_parser("export", help="write the work tree's commits to patches/")
    s.set_defaults(fn=cmd_export)
    s = sub.add_parser("check", help="checkpatch --strict, Signed-off-by and Fixes: tags "
                                     "of every patch in patches/series")
    s.add_argument("--builds", nargs="?", const="debug", choices=tuple(kconfig.PROFILES),
                   metavar="PROFILE",
                   help="also build each commit of the series on its own (default profile "
                        "debug): incremental, ~1-10 min a commit on 2 CPUs")
    s.add_argument("--from", dest="first", type=int, default=1, metavar="N",
                   help="with --builds, start at patch N (resume an interrupted run)")
    s.set_defaults(fn=cmd_check)
    s = sub.add_parser("index", help="write results/README.md, the index of the "
                                     "committed benchmark reports")
    s.set_defaults(fn=cmd_index)
    s = sub.add_parser("status", help="fail if the work tree holds work not in patches/")
    s.set_defaults(fn=cmd_status)
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except LabError as e:
        print(f"\nptlab: error: {e.message}", file=sys.stderr)
        if e.details:
            print("  " + e.details.replace("\n", "\n  "), file=sys.stderr)
        if e.hint:
            print(f"hint: {e.hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nptlab: interrupted", file=sys.stderr)
        return 130
