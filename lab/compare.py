"""`ptlab compare`: reading reports against each other, apart from measuring
them (the way mmtests keeps collecting and comparing apart).

- `compare RUN FLOOR`: RUN's ratios, each marked where it lies outside the
  spread that FLOOR (a report of one kernel against itself, same machine
  and sizes) shows for the same metric.
- `compare A B [--floor FLOOR]`: two runs of `ptlab bench --here` (one kernel
  each, e.g. vanilla and patched installed on one machine) made into the A/B
  report an in-QEMU `ptlab bench` writes: results.json, report.md, plots.

The floor's spread of a metric is the range of the ratios between any two
of its values, A's and B's pooled (both sides are one kernel: each value
is one boot, or one repetition of a --here run), together with its ratio
of medians. A ratio outside it differs more than two boots of the same
kernel ever did in the floor's runs; inside, this machine's measure does
not show the difference. Pooled rather than per pair: a floor of 2 boots
a side has 2 pairs, and vanilla's purges per second under --icount moved
from 42.7 to 63.1 between its boots while both pairs' ratios stayed within
0.88-1.33 (2026-11-28). For a count (IPIs, pages) the spread is usually
[1.000-1.000]: any difference is outside."""
from __future__ import annotations

import json
import time
from pathlib import Path

from . import bench, index
from .common import RESULTS_DIR, LabError, cache_dir, info


def load(path: str | Path) -> tuple[Path, dict]:
    """A report directory or its results.json -> (directory, data)"""
    p = Path(path)
    f = p / "results.json" if p.is_dir() else p
    if not f.is_file():
        raise LabError(f"{path}: no results.json there",
                       hint="a report directory of `ptlab bench` or `ptlab bench --here`")
    try:
        data = json.loads(f.read_text())
    except ValueError as e:
        raise LabError(f"{f}: not JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks") or data.get("runs"),
                                                    dict):
        raise LabError(f"{f}: not a report of ptlab bench (no benchmarks)")
    return f.parent, data


def is_here(data: dict) -> bool:
    return data.get("kind") == "here"


def spread(metric: dict) -> dict | None:
    """The floor's spread of one metric (see the module's doc), or None
    when the floor has fewer than two values for it."""
    vals = metric.get("values") or {}
    pooled = [*(vals.get("a") or []), *(vals.get("b") or [])]
    # a 0 beside a non-zero value: the floor went from nothing to something,
    # and any ratio lies within it; 0 beside 0 is the same
    ratios = [x / y if y else (float("inf") if x else 1.0)
              for i, x in enumerate(pooled) for j, y in enumerate(pooled) if i != j]
    if metric.get("ratio") is not None:
        ratios.append(metric["ratio"])
    if not ratios:
        return None
    hi = max(ratios)
    # no upper bound: None, which JSON has (results.json), where inf is not
    return {"lo": min(ratios), "hi": None if hi == float("inf") else hi,
            "values": len(pooled)}


def mark(ratio: float | None, floor: dict | None, better: str) -> str:
    """'' inside the floor's spread (or nothing to read it against); else
    'better' or 'worse' by the metric's direction"""
    if ratio is None or floor is None:
        return ""
    hi = float("inf") if floor["hi"] is None else floor["hi"]
    if floor["lo"] <= ratio <= hi:
        return ""
    up = ratio > hi
    return "better" if up == (better == "higher") else "worse"


def annotate(data: dict, floor: dict, floor_name: str) -> int:
    """Add each metric's floor spread and mark to `data` (a report's
    results.json); returns how many ratios lie outside their spread."""
    outside = 0
    fb = floor.get("benchmarks") or {}
    for name, entry in data["benchmarks"].items():
        for m, e in entry["metrics"].items():
            fm = (fb.get(name) or {}).get("metrics", {}).get(m)
            sp = spread(fm) if fm else None
            e["floor"] = sp
            e["mark"] = mark(e.get("ratio"), sp, e["better"])
            outside += bool(e["mark"])
    data["floor"] = floor_name
    return outside


def floor_check(data: dict, floor: dict) -> list[str]:
    """What makes FLOOR a poor measure for RUN: not a floor, other sizes,
    another machine, another clock."""
    out = []
    ks = floor.get("kernels") or {}
    names = {(ks.get(s) or {}).get("name") for s in ("a", "b")}
    sysctls = [tuple((ks.get(s) or {}).get("sysctls") or []) for s in ("a", "b")]
    if len(names) != 1 or sysctls[0] != sysctls[1]:
        out.append("the floor is not a kernel against itself")
    # older reports do not say their clock: it was the host's
    default = {"clock": "host"}
    for key in ("sizes", "clock", "accel", "profile"):
        mine, theirs = (d.get(key) or default.get(key) for d in (data, floor))
        if mine != theirs:
            out.append(f"{key}: {mine} here, {theirs} in the floor")
    m, fm = data.get("machine") or {}, floor.get("machine") or {}
    if (m.get("cpu"), m.get("cores")) != (fm.get("cpu"), fm.get("cores")):
        out.append(f"machine: {m.get('cpu', '?')} ({m.get('cores', '?')} cores) here, "
                   f"{fm.get('cpu', '?')} ({fm.get('cores', '?')} cores) in the floor")
    return out


def pair(a: dict, b: dict, a_name: str, b_name: str) -> dict:
    """Two --here runs -> the results.json of an A/B report"""
    for what, d in (("A", a), ("B", b)):
        if not is_here(d):
            raise LabError(f"{what} is not a run of `ptlab bench --here`",
                           hint="compare an A/B report with its floor as "
                                "`ptlab compare RUN FLOOR`")
    if a.get("sizes") != b.get("sizes"):
        raise LabError(f"A ran the {a.get('sizes')} sizes, B the {b.get('sizes')} ones")
    names = [n for n in a["runs"] if n in b["runs"]]
    if not names:
        raise LabError("A and B have no benchmark in common")
    benches = [next(x for x in bench.BENCHES if x.name == n) for n in names
               if any(x.name == n for x in bench.BENCHES)]
    runs = {n: {"a": [tuple(r) for r in a["runs"][n]], "b": [tuple(r) for r in b["runs"][n]]}
            for n in names}
    sizes = {**(a.get("sizes_used") or {}), **(b.get("sizes_used") or {})}
    ma, mb = a.get("machine") or {}, b.get("machine") or {}
    return {"kernels": {"a": {**a["kernel"], "name": a_name},
                        "b": {**b["kernel"], "name": b_name}},
            "series_revision": b.get("series_revision") or a.get("series_revision"),
            "repo_commit": b.get("repo_commit") or a.get("repo_commit"),
            "machine": ma if ma == mb else {**ma, "note": f"B on {mb}"},
            "profile": "installed", "accel": "none (the running kernel)",
            "clock": "host", "sizes": a.get("sizes"),
            "repetitions": min(a.get("repetitions") or 0, b.get("repetitions") or 0),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "order": f"A's run at {a.get('date')}, B's at {b.get('date')} (not interleaved)",
            "workdir": "", "here": True, "benchmarks": bench.aggregate(runs, benches, sizes)}


def run_compare(x: str, y: str, floor: str | None, out: str | None) -> int:
    xdir, xd = load(x)
    ydir, yd = load(y)
    if is_here(xd) != is_here(yd):
        raise LabError("one of the two is a run of `ptlab bench --here`, the other an A/B "
                       "report", hint="two --here runs (compare A B), or an A/B report "
                                      "and its floor (compare RUN FLOOR)")
    if is_here(xd):
        data = pair(xd, yd, xd["kernel"]["name"], yd["kernel"]["name"])
        fdir, fd = load(floor) if floor else (None, None)
        if fd is not None and is_here(fd):
            raise LabError(f"--floor {floor} is one --here run, not a floor",
                           hint="make the floor of two runs of one kernel: ptlab compare "
                                "RUN1 RUN2 --out FLOOR")
        outdir = Path(out) if out else \
            cache_dir() / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-compare"
    else:
        if floor:
            raise LabError("two A/B reports: the second is the floor, --floor is for "
                           "two --here runs", hint="ptlab compare RUN FLOOR")
        data, (fdir, fd), outdir = xd, (ydir, yd), Path(out) if out else None
    outside = None
    if fd is not None:
        for w in floor_check(data, fd):
            info(f"note: {w}")
        outside = annotate(data, fd, str(fdir))
    if outdir is not None:
        bench.write_report(outdir, data)
        bench.plot(outdir)
        bench.write_report(outdir, data)
        if RESULTS_DIR in outdir.resolve().parents:
            info(f"{index.write_index()}: the index of the reports, with this one")
    a, b = data["kernels"]["a"]["name"], data["kernels"]["b"]["name"]
    for name, entry in data["benchmarks"].items():
        print(bench.table(name, entry, f"A={a}", f"B={b}"))
        print()
    if outside is not None:
        n = sum(len(e["metrics"]) for e in data["benchmarks"].values())
        print(f"{outside} of {n} ratios outside the floor's spread ({fdir})")
    if outdir is not None:
        print(f"report: {outdir}/report.md")
    return 0
