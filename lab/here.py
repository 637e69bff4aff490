"""`ptlab bench --here`: the benchmark programs of `ptlab bench` on the kernel
that runs ptlab, a real machine after `ptlab package` and a reboot, say.
One run measures one kernel; `ptlab compare A B` makes the A/B report of
two such runs (lab/compare.py), with the tables and plots of an in-QEMU
run. What the guest's init does around each program is done here too:
memory compacted before each one, tlb:tlb_flush traced while one counts."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from . import bench, build, deps, index, kconfig, splat, tree
from .common import BENCH_DIR, RESULTS_DIR, LabError, cache_dir, info, step, warn

TRACEFS = Path("/sys/kernel/tracing")
TLB_EVENT = TRACEFS / "events/tlb/tlb_flush"


def _read(f: Path) -> str | None:
    try:
        return f.read_text()
    except OSError:
        return None


@contextmanager
def tlb_event_enabled():
    """tlb:tlb_flush on for the run (bench.h counts whole-mm flushes with it;
    the guest enables it from the kernel command line); the event's enable
    and filter and tracefs' tracing_on, which the programs write, put back
    after"""
    files = [TLB_EVENT / "enable", TLB_EVENT / "filter", TRACEFS / "tracing_on"]
    saved = {f: _read(f) for f in files}
    if saved[files[0]] is None:
        warn(f"no {TLB_EVENT} (tracefs not mounted?): full flushes are not counted")
    elif saved[files[0]].strip() == "0":
        try:
            files[0].write_text("1")
        except OSError as e:
            warn(f"tlb:tlb_flush cannot be enabled ({e}): full flushes are not counted")
    try:
        yield
    finally:
        for f, text in saved.items():
            # a filter reads back as "none" when there was none; "0" clears it
            value = "0" if f.name == "filter" and text and text.strip() == "none" else text
            if value is not None:
                try:
                    f.write_text(value.strip() + "\n")
                except OSError as e:
                    warn(f"{f} not put back ({e})")


def compact() -> None:
    """What the guest's init does before each program"""
    try:
        Path("/proc/sys/vm/compact_memory").write_text("1")
    except OSError:
        pass        # a kernel without CONFIG_COMPACTION: nothing to do


def dmesg() -> list[str]:
    proc = subprocess.run(["dmesg"], capture_output=True, text=True)
    return proc.stdout.splitlines()


def new_lines(before: list[str], after: list[str]) -> list[str]:
    """What the kernel logged since `before` was read (the ring buffer may
    have dropped its start)"""
    if not before:
        return after
    last = before[-1]
    for i in range(len(after) - 1, -1, -1):
        if after[i] == last:
            return after[i + 1:]
    return after


def kernel_info() -> dict:
    """The running kernel as a report names it: its release, and the
    switches of our features it has, with their values"""
    switches = {}
    for name in kconfig.feature_sysctls():
        f = Path("/proc/sys") / name.replace(".", "/")
        if f.exists():
            switches[name] = f.read_text().strip()
    feats = ", ".join(f"{k}={v}" for k, v in switches.items()) or "none of the series' switches"
    return {"name": platform.release(), "dir": "", "sysctls": [],
            "desc": f"{platform.release()} (running; {feats})", "switches": switches,
            "version": Path("/proc/version").read_text().strip()}


def programs(benches: list[bench.Bench]) -> Path:
    """The benchmark programs, built from the patched tree's headers when one
    is missing or older than its source. When all are current the kernel
    tree is not looked at: its status is a walk of ~80 000 files, minutes
    over the 9p of `ptlab shell --host-root`."""
    bindir = tree.kernel_dir("patched") / "guest-bin"
    if all(build.program_current(bindir / b.argv[0], BENCH_DIR / f"{b.argv[0]}.c")
           for b in benches):
        return bindir
    return build.programs(tree.ensure_patched(), tree.kernel_dir("patched"))[1]


def run_here(names: list[str], reps: int, sizes: str, outdir: Path | None) -> int:
    if os.geteuid() != 0:
        raise LabError("bench --here needs root: the programs set sysctls and sysfs knobs, "
                       "move pages between nodes and trace TLB flushes",
                       hint="sudo ./ptlab bench --here ...")
    if reps < 1:
        raise LabError("--reps must be at least 1")
    benches = bench.select(names)
    deps.ensure_apt(deps.APT_HERE)
    bindir = programs(benches)
    kernel = kernel_info()
    size_arg = {"quick": ["--quick"], "default": [], "full": ["--full"]}[sizes]
    outdir = outdir or cache_dir() / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-here"
    runs: dict[str, list] = {b.name: [] for b in benches}
    used: dict[str, str] = {}
    splats: list[str] = []
    logs = outdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    step(f"{len(benches)} benchmarks x {reps} on the running kernel {kernel['name']} "
         f"(sizes: {sizes}); report in {outdir}")
    with tlb_event_enabled():
        for rep in range(1, reps + 1):
            for b in benches:
                compact()
                before = dmesg()
                t0 = time.monotonic()
                argv = [str(bindir / b.argv[0]), *b.argv[1:], *size_arg]
                timeout = b.timeout * (3 if sizes == "full" else 1)
                try:
                    proc = subprocess.run(argv, capture_output=True, text=True,
                                          timeout=timeout, start_new_session=True)
                    lines, rc = (proc.stdout + proc.stderr).splitlines(), proc.returncode
                except subprocess.TimeoutExpired as e:
                    out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
                    lines, rc = out.splitlines(), None
                (logs / f"{b.name}-{rep}.txt").write_text("\n".join(lines) + "\n")
                res = bench.parse_output(lines, rc) if rc is not None else \
                    ({}, f"killed after its {timeout} s timeout")
                found = splat.scan("\n".join(new_lines(before, dmesg())))
                if found:
                    splats += [f"{b.name}: {s.title}" for s in found]
                    res = ({}, f"kernel splat: {found[0].title}")
                if bench.sizes_of(lines):
                    used[b.name] = bench.sizes_of(lines)
                runs[b.name].append(res)
                ms, err = res
                info(f"{rep}/{reps} {b.name}: " + (err or ", ".join(
                    f"{m}={bench._fmt(v[0])}{v[1]}" for m, v in list(ms.items())[:4]))
                    + f" ({time.monotonic() - t0:.0f} s)")
    data = {"kind": "here", "kernel": kernel,
            "series_revision": tree.patches_hash()[:12], "repo_commit": bench.repo_commit(),
            "machine": bench.host_machine(qemu=False), "accel": "none (the running kernel)",
            "clock": "host", "sizes": sizes, "repetitions": reps,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "workdir": bench.workdir_state(kernel_tree=False),
            "splats": splats, "sizes_used": used, "runs": runs}
    write_report(outdir, data)
    if RESULTS_DIR in outdir.resolve().parents:
        info(f"{index.write_index()}: the index of the reports, with this one")
    print(f"\nreport: {outdir}/report.md; with another kernel's run: "
          f"ptlab compare {outdir} OTHER-RUN")
    failed = [n for n, rs in runs.items() if any(e and not e.startswith("skipped")
                                                 for _, e in rs)]
    if failed:
        print(f"runs without a number (verification failed, crash or splat): "
              f"{', '.join(failed)}")
    return 1 if failed else 0


def summary(runs: list) -> list[str]:
    """One benchmark's metrics over its repetitions: median [min-max]"""
    rows = []
    names = list(dict.fromkeys(m for ms, _ in runs for m in ms))
    for m in names:
        vals = [ms[m][0] for ms, _ in runs if m in ms]
        unit, better = next(ms[m][1:] for ms, _ in runs if m in ms)
        s = bench.summarize(vals)
        rows.append(f"  {m:24} {unit:6} {bench._fmt(s['median']):>10} "
                    f"[{bench._fmt(s['min'])}-{bench._fmt(s['max'])}]  n={s['n']}  "
                    f"({better} is better)")
    errs = [e for _, e in runs if e]
    if errs:
        rows.append(f"  runs without a number: {len(errs)}: {errs[0]}")
    return rows


def write_report(outdir: Path, data: dict) -> None:
    (outdir / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    k, m = data["kernel"], data["machine"]
    md = [f"# ptlab bench --here: {k['name']}", "",
          f"- kernel: {k['desc']}", f"- {k['version']}",
          f"- machine: {m['cpu']}, {m['cores']} cores",
          f"- sizes {data['sizes']}, {data['repetitions']} repetitions, {data['date']}",
          f"- series revision (the programs'): {data['series_revision']}, "
          f"repository {data['repo_commit']}",
          *([f"- **kernel splats: {'; '.join(data['splats'])}**"] if data["splats"] else []),
          "", "One kernel; `ptlab compare A B` makes the A/B report of two such runs.", ""]
    for name, runs in data["runs"].items():
        sizes = data["sizes_used"].get(name)
        md += ["```", name + (f"   ({sizes})" if sizes else ""), *summary(runs), "```", ""]
    (outdir / "report.md").write_text("\n".join(md))
