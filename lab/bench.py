"""`ptlab bench`: the same benchmarks on two kernels (A, B; by default
vanilla and patched), perf profile, same guest, interleaved boots
in ABBA order (A B, B A, A B, ...), repeated; a table per benchmark and a report directory
(report.md, results.json, PNG plots)."""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

from . import build, deps, guest, index, run, tree
from .qemu_config import DEFAULT
from .common import REPO, RESULTS_DIR, LabError, cache_dir, info, step, warn

SIZES = ("quick", "default", "full")


@dataclass(frozen=True)
class Bench:
    name: str                 # variant, the key of results.json
    group: str                # one of GROUPS
    argv: tuple[str, ...]
    timeout: int = 900


def _b(name: str, group: str, *argv: str, timeout: int = 900) -> Bench:
    return Bench(name, group, argv, timeout)


BENCHES = [
    # --cow-pte: the kernel's COW page table opt-in where it has one (else ignored)
    _b("fork", "fork", "bench_fork", "--cow-pte"),
    _b("fork-thp", "fork", "bench_fork", "--thp", "--cow-pte"),
    # the same without asking: what the series costs a fork that does not share
    _b("fork-noshare", "fork", "bench_fork"),
    # the same process with 4 MiB instead of the area: what fork costs with
    # (almost) nothing to copy or share, the floor of fork_latency on each kernel
    _b("fork-4m", "fork", "bench_fork", "--size", "4M", "--cow-pte"),
    # Redis (the host's redis-server in the guest): BGSAVE's fork and the
    # client latency while the snapshot runs; --cow-pte sets vm.cow_pte=2
    # (Redis cannot opt in itself: exec drops the prctl)
    _b("redis", "redis", "bench_redis", "--cow-pte", timeout=1800),
    _b("pt_reclaim-dontneed", "pt_reclaim", "bench_pt_reclaim"),
    _b("pt_reclaim-free", "pt_reclaim", "bench_pt_reclaim", "--free"),
    _b("fault-1proc", "pt_reclaim", "bench_pt_reclaim", "--fault", "--procs", "1"),
    _b("fault-2proc", "pt_reclaim", "bench_pt_reclaim", "--fault", "--procs", "2"),
    _b("purge-tlb", "purge", "bench_purge", "--tlb"),
    _b("purge-faults", "purge", "bench_purge", "--faults"),
    _b("migrate-0", "migrate", "bench_migrate", "--children", "0"),
    _b("migrate-1000", "migrate", "bench_migrate", timeout=1800),
    _b("migrate-1000-mthp64", "migrate", "bench_migrate", "--mthp64", timeout=1800),
    # move_pages() of 64 MiB that a forked child maps too: the IPIs it sends
    # (counts), with the child's tables shared where the kernel can, and copied
    _b("flush", "flush", "bench_flush", "--cow-pte"),
    _b("flush-private", "flush", "bench_flush"),
    # the first write to each table after fork, by 2 or 4 threads of the child
    # in one GiB: the IPIs and full flushes per table (a break and a COW, or a
    # COW); and the exit of a child that holds every table
    _b("break", "break", "bench_break", "--cow-pte"),
    _b("break-4t", "break", "bench_break", "--cow-pte", "--threads", "4"),
    # mprotect() and MADV_FREE of a 64 TiB PROT_NONE area: the walks before
    # a syscall changes entries, with the kernel's default vm.cow_pte (opt-in,
    # nobody opted in), with 0, and in an mm that holds shared tables
    _b("walk", "walk", "bench_walk"),
    _b("walk-off", "walk", "bench_walk", "--no-cow-pte"),
    _b("walk-shared", "walk", "bench_walk", "--shared"),
    _b("teardown-4k", "teardown", "bench_teardown", "--folio", "4k"),
    _b("teardown-64k", "teardown", "bench_teardown", "--folio", "64k"),
    _b("teardown-2m", "teardown", "bench_teardown", "--folio", "2m"),
    # UFFDIO_MOVE vs UFFDIO_COPY+DONTNEED: chunks of 4k, 64k and 2m of 4 KiB pages,
    # 64k of 64 KiB mTHPs, 2m of THPs; with 2 mutator threads reading the
    # destination, and with none ("-m0": the compactor's own cost, without the
    # cross-CPU TLB flushes that TCG makes costly)
    *[_b(f"uffd-{mode}-{name}{m0}", "uffd_compact", "bench_uffd_compact", "--mode", mode,
         "--move-size", chunk, "--backing", backing, "--mutators", "0" if m0 else "2")
      for m0 in ("", "-m0") for mode in ("copy", "move")
      for name, chunk, backing in (("4k", "4k", "4k"), ("64k", "64k", "4k"),
                                   ("2m", "2m", "4k"), ("64k-mthp", "64k", "64k"),
                                   ("2m-thp", "2m", "2m"))],
    # two compactor threads in one mm, 64k chunks of 4 KiB pages: batches that
    # overlap must not end in full flushes of the mm (full_flushes), nor slow
    # each mover down (chunks_per_s_per_mover against uffd-move-64k[-m0])
    *[_b(f"uffd-move-64k-movers2{m0}", "uffd_compact", "bench_uffd_compact", "--mode", "move",
         "--move-size", "64k", "--backing", "4k", "--movers", "2",
         "--mutators", "0" if m0 else "2") for m0 in ("", "-m0")],
]
GROUPS = list(dict.fromkeys(b.group for b in BENCHES))

# The benchmarks' guest: tlb:tlb_flush enabled from boot, for the programs that
# count whole-mm flushes (bench.h); enabled at run time it would patch kernel
# text, which TCG then sometimes runs stale ("Oops: int3" in 1 of 3 boots per
# kernel, 2026-11-28).  The guest's init keeps tracing off until one counts.
BENCH_MACHINE = replace(DEFAULT, cmdline=(*DEFAULT.cmdline, "trace_event=tlb:tlb_flush"))

_METRIC = re.compile(r"^metric (\S+) (\S+) (\S+) (lower|higher)\s*$")


def select(names: list[str]) -> list[Bench]:
    if not names:
        return list(BENCHES)
    out = [b for b in BENCHES if b.name in names or b.group in names]
    unknown = [n for n in names if not any(n in (b.name, b.group) for b in BENCHES)]
    if unknown:
        raise LabError(f"no benchmark named {', '.join(unknown)}",
                       hint="benchmarks: " + ", ".join(GROUPS) + "; variants: "
                            + ", ".join(b.name for b in BENCHES))
    return out


def parse_output(lines: list[str], rc: int | None) -> tuple[dict, str]:
    """(metrics, error); a run whose verification failed has no metrics."""
    metrics = {}
    verified = False
    for line in lines:
        m = _METRIC.match(line.strip())
        if m:
            metrics[m.group(1)] = (float(m.group(2)), m.group(3), m.group(4))
        elif line.startswith("verify FAILED"):
            return {}, line.strip()
        elif line.strip() == "verify ok":
            verified = True
    if rc == 4:
        skip = next((l for l in lines if l.startswith("# skip")), "# skip")
        return {}, "skipped: " + skip[2:]
    if rc != 0 or not verified:
        return {}, f"exit status {rc}" + ("" if verified else ", no 'verify ok'")
    return metrics, ""


# --- statistics and the report ------------------------------------------

def summarize(values: list[float]) -> dict:
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def sizes_of(lines: list[str]) -> str:
    """The "# sizes: ..." line every benchmark program prints."""
    return next((l.split(":", 1)[1].strip() for l in lines if l.startswith("# sizes:")), "")


def aggregate(runs: dict, benches: list[Bench], sizes: dict | None = None) -> dict:
    """runs[bench][side] = list of (metrics, error) -> results.json's 'benchmarks'."""
    out = {}
    for b in benches:
        entry = {"group": b.group, "argv": list(b.argv), "sizes": (sizes or {}).get(b.name, ""),
                 "metrics": {}, "errors": {}}
        for side in ("a", "b"):
            errs = [e for _, e in runs[b.name][side] if e]
            if errs:
                entry["errors"][side] = errs
        names = list(dict.fromkeys(m for side in ("a", "b") for ms, _ in runs[b.name][side]
                                   for m in ms))
        for m in names:
            vals = {side: [ms[m][0] for ms, _ in runs[b.name][side] if m in ms]
                    for side in ("a", "b")}
            unit, better = next(ms[m][1:] for side in ("a", "b")
                                for ms, _ in runs[b.name][side] if m in ms)
            a, bb = summarize(vals["a"]), summarize(vals["b"])
            ratio = (bb["median"] / a["median"]) if a["median"] and bb["median"] is not None \
                else None
            entry["metrics"][m] = {"unit": unit, "better": better, "a": a, "b": bb,
                                   "ratio": ratio, "values": vals}
        out[b.name] = entry
    return out


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:.0f}"
    return f"{x:.3g}" if abs(x) < 10 else f"{x:.1f}"


def table(name: str, entry: dict, a: str, b: str) -> str:
    """One benchmark's metrics; with the floor's spread of each ratio and a
    mark where it lies outside, once `ptlab compare` has added them"""
    floor = any("floor" in e for e in entry["metrics"].values())
    rows = [f"{name}" + (f"   ({entry['sizes']})" if entry.get("sizes") else "")]
    rows.append(f"  {'metric':24} {'unit':6} {a + ' median [min-max]':>28} "
                f"{b + ' median [min-max]':>28} {'ratio':>7}"
                + (f" {'floor':>15}" if floor else ""))
    for m, e in entry["metrics"].items():
        cell = lambda s: (f"{_fmt(s['median'])} [{_fmt(s['min'])}-{_fmt(s['max'])}]"  # noqa
                          if s["n"] else "no samples")
        ratio = f"{e['ratio']:.3f}" if e["ratio"] is not None else "-"
        sp = e.get("floor")
        hi = "inf" if sp and sp["hi"] is None else format(sp["hi"], ".3f") if sp else ""
        fcell = (f" {'[' + format(sp['lo'], '.3f') + '-' + hi + ']':>15}"
                 if sp else f" {'-':>15}") if floor else ""
        rows.append(f"  {m:24} {e['unit']:6} {cell(e['a']):>28} {cell(e['b']):>28} "
                    f"{ratio:>7}{fcell}  ({e['better']} is better)"
                    + (f"  ** outside the floor: {e['mark']}" if e.get("mark") else ""))
    for side, errs in entry["errors"].items():
        rows.append(f"  {side.upper()} runs without a number: {len(errs)}: {errs[0]}")
    return "\n".join(rows)


def write_report(outdir: Path, data: dict) -> None:
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    a, b = data["kernels"]["a"]["name"], data["kernels"]["b"]["name"]
    md = [f"# ptlab bench: {b} vs {a}", "",
          f"- A: {data['kernels']['a']['desc']}", f"- B: {data['kernels']['b']['desc']}",
          f"- profile {data['profile']}, accelerator {data['accel']}, "
          f"guest clock {data.get('clock', 'host')}, sizes {data['sizes']}, "
          f"{data['repetitions']} "
          + ("runs" if data.get("here") else "interleaved boots") + f" per kernel, {data['date']}",
          f"- series revision: {data['series_revision']}"
          + (f", repository {data['repo_commit']}" if data.get("repo_commit") else "")
          + (f"; **{data['workdir']}**" if data.get("workdir") else ""),
          *([f"- machine: {m.get('cpu')}, {m.get('cores')} cores"
             + (f", {m['qemu']}" if m.get("qemu") else "")
             + (f" ({m['note']})" if m.get("note") else "")]
            if (m := data.get("machine")) else []),
          f"- order within each pair of boots: {data.get('order', 'AB')}",
          *([f"- floor: {data['floor']} (`ptlab compare`: \"**\" marks a ratio outside "
             "the floor's spread: ratios between any two of its boots)"]
            if data.get("floor") else []), "",
          "ratio = B median / A median; whether lower or higher is better is given per "
          "metric. Under TCG absolute times mean nothing; compare ratios with the noise "
          "floor of the same machine (results/README.md lists them; `ptlab compare RUN "
          "FLOOR` marks each ratio outside the floor's spread).", ""]
    for name, entry in data["benchmarks"].items():
        md += ["```", table(name, entry, "A", "B"), "```", ""]
        if (outdir / f"{entry['group']}.png").exists() and \
                f"![{entry['group']}]({entry['group']}.png)" not in md:
            md += [f"![{entry['group']}]({entry['group']}.png)", ""]
    (outdir / "report.md").write_text("\n".join(md))


def repo_commit() -> str:
    """The repository's HEAD (the lab and the series as committed)"""
    proc = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


def host_machine(qemu: bool = True) -> dict:
    """What the figures were measured on: they hold for that host only
    (and the QEMU that ran the guest, unless they were measured --here)"""
    cpu = "unknown"
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in
                   Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    if not qemu:
        return {"cpu": cpu, "cores": os.cpu_count()}
    proc = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True)
    return {"cpu": cpu, "cores": os.cpu_count(),
            "qemu": (proc.stdout.splitlines() or ["unknown"])[0]}


def plot(outdir: Path) -> None:
    py = deps.python()
    proc = subprocess.run([str(py), str(REPO / "lab" / "plot.py"), str(outdir)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        warn("plots failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1])


# --- the command --------------------------------------------------------

def unskipped_on_one_side(entry: dict) -> list[str]:
    """A benchmark that skipped on one kernel while the other measured:
    no ratio, and a claim nobody can check."""
    out = []
    for side, other in (("a", "b"), ("b", "a")):
        errs = entry["errors"].get(side, [])
        counts = [(e[side]["n"], e[other]["n"]) for e in entry["metrics"].values()]
        if errs and all(e.startswith("skipped") for e in errs) and \
                any(o for _, o in counts) and not any(n for n, _ in counts):
            out.append(f"{side.upper()} skipped ({errs[0]}) while {other.upper()} measured")
    return out


def workdir_state(kernel_tree: bool = True) -> str:
    """What the numbers may not be of: work-tree commits not in patches/
    (unless not `kernel_tree`: a --here run measures the running kernel),
    uncommitted changes in the repo (bench programs, configs, patches)."""
    notes = []
    st = tree.status() if kernel_tree else None
    if st and st.exists and st.unexported:
        notes.append(f"the work tree holds {len(st.unexported)} commit(s) not exported "
                     "to patches/")
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"],
                           capture_output=True, text=True).stdout.splitlines()
    if dirty:
        notes.append(f"the repo has {len(dirty)} uncommitted change(s): "
                     + ", ".join(l[3:] for l in dirty[:5]) + (" ..." if len(dirty) > 5 else ""))
    return "; ".join(notes)


def order(rep: int) -> tuple[str, str]:
    """ABBA: A first in odd repetitions, B first in even ones, so that a drift
    over the run (host load, thermal) does not always favour one side."""
    return ("a", "b") if rep % 2 else ("b", "a")


def run_bench(a_spec: str, b_spec: str, names: list[str], reps: int, sizes: str,
              outdir: Path | None, sysctls: dict | None = None,
              icount: int | None = None, profile: str = "perf") -> int:
    """`sysctls`: per side ("a", "b"), "name=value" items set at each boot.
    `icount`: the guest's clock counts instructions (Machine.icount), TCG.
    `profile`: perf, or package (the images of `ptlab package`)"""
    sysctls = sysctls or {}
    vm = replace(BENCH_MACHINE, icount=icount)
    if reps < 1:
        raise LabError("--reps must be at least 1")
    benches = select(names)
    deps.ensure_apt()
    kernels = {}
    for side, spec in (("a", a_spec), ("b", b_spec)):
        name, src = tree.resolve_kernel(spec)
        vmlinux = build.build_kernel(src, tree.kernel_dir(name), profile)
        set_ = list(sysctls.get(side, []))
        kernels[side] = {"name": spec, "dir": name, "vmlinux": vmlinux, "sysctls": set_,
                         "desc": tree.describe(name, src) + (f", with {', '.join(set_)}"
                                                        if set_ else "")}
    patched = tree.ensure_patched()
    _, bindir = build.programs(patched, tree.kernel_dir("patched"))
    bins = sorted({bindir / b.argv[0] for b in benches})
    size_arg = {"quick": ["--quick"], "default": [], "full": ["--full"]}[sizes]
    plan = [run.PlanItem("bench", b.name, b.timeout * (3 if sizes == "full" else 1),
                           [*b.argv, *size_arg]) for b in benches]
    # the host's limit on a boot: each program's own limit, and some for the
    # boot (under --icount the guest's limits count instructions, not seconds)
    host_timeout = sum(p.timeout for p in plan) + 600
    rundir = cache_dir() / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-bench"
    outdir = outdir or rundir     # the report; boots' consoles and initramfs stay in rundir
    runs = {b.name: {"a": [], "b": []} for b in benches}
    used = {}  # benchmark -> the sizes it printed
    accel = "tcg" if icount is not None else guest.probe_accel(kernels["a"]["vmlinux"])
    clock = f"icount shift={icount}" if icount is not None else "host"
    step(f"{len(benches)} benchmarks x {reps} interleaved boots of A={a_spec} and "
         f"B={b_spec} (sizes: {sizes}, {accel}, clock: {clock}); report in {outdir}")
    state = workdir_state()
    if state:
        warn(state)
    for rep in range(1, reps + 1):
        for side in order(rep):
            k = kernels[side]
            step(f"boot {rep}/{reps} of {side.upper()} ({k['name']})")

            def show(r, side=side):
                ms, err = parse_output(r.output, r.rc)
                txt = err or ", ".join(f"{m}={_fmt(v[0])}{v[1]}" for m, v in list(ms.items())[:4])
                info(f"{r.test}: {txt} ({r.secs:.0f} s)")

            out = guest.boot(k["vmlinux"], plan, bins, rundir / f"boot-{rep}-{side}",
                             accel=accel, on_test=show, machine=vm, timeout=host_timeout,
                             sysctls=k["sysctls"])
            by = {r.test: r for r in out.runs}
            for b in benches:
                r = by.get(b.name)
                if r and sizes_of(r.output):
                    used[b.name] = sizes_of(r.output)
                res = parse_output(r.output, r.rc) if r else ({}, "not run: guest stopped")
                if out.splats:
                    res = ({}, f"console splat: {out.splats[0].title}")
                elif out.setup:     # a --sysctl the kernel lacks or did not take
                    res = ({}, f"guest setup: {out.setup[0]}")
                runs[b.name][side].append(res)
    data = {"kernels": {s: {k: v for k, v in kernels[s].items() if k != "vmlinux"}
                        for s in ("a", "b")},
            "series_revision": tree.patches_hash()[:12],
            "repo_commit": repo_commit(), "machine": host_machine(),
            "profile": profile, "accel": accel, "clock": clock, "sizes": sizes,
            "repetitions": reps,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "order": "ABBA",
            "workdir": state,
            "benchmarks": aggregate(runs, benches, used)}
    write_report(outdir, data)
    plot(outdir)
    write_report(outdir, data)        # again, now that the plots exist
    if RESULTS_DIR in outdir.resolve().parents:
        info(f"{index.write_index()}: the index of the reports, with this one")
    print()
    for name, entry in data["benchmarks"].items():
        print(table(name, entry, f"A={a_spec}", f"B={b_spec}"))
        print()
    print(f"report: {outdir}/report.md (results.json, plots); boot logs: {rundir}")
    failed = [n for n, e in data["benchmarks"].items()
              if any(not err.startswith("skipped") for errs in e["errors"].values()
                     for err in errs)]
    if failed:
        print(f"runs without a number (verification failed, crash or splat): "
              f"{', '.join(failed)}")
    lopsided = {n: unskipped_on_one_side(e) for n, e in data["benchmarks"].items()}
    for n, why in lopsided.items():
        for w in why:
            print(f"{n}: {w}")
    if state:
        print(f"note: {state}")
    return 1 if failed or any(lopsided.values()) else 0
