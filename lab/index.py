"""results/README.md: the index of every committed benchmark report, made
from their results.json files (`ptlab index`; a unit test fails when the
committed index is not what this writes). Per report: when, what against
what, which series and repository, on which machine, and per benchmark
its headline ratio (its first metric with a ratio, B median / A median)."""
from __future__ import annotations

import json
from pathlib import Path

from .common import RESULTS_DIR

HEADER = """# Results

Every benchmark report committed under `results/`, newest first: made by `./ptlab index` from
the reports' `results.json` (do not edit by hand). A report is one `ptlab bench` run: B against
A over interleaved boots; each ratio is B's median over A's, the headline of each benchmark
being its first metric with a ratio (the report has them all, with min and max). A report of a
kernel against itself ("floor") is a noise floor: read a ratio against the floor of the same
machine and sizes (`./ptlab compare RUN FLOOR` marks each ratio outside it). A "--here" run
measured one kernel on the machine that ran it (`./ptlab compare A B` pairs two). Reports older than 2026-11-28 do not record their machine; they were all
measured on 2-core hosts under QEMU TCG.
"""


def _headlines(data: dict) -> str:
    out = []
    benches = data.get("benchmarks")
    for name, entry in (benches.items() if isinstance(benches, dict) else ()):
        metrics = entry.get("metrics") if isinstance(entry, dict) else None
        for metric, m in (metrics.items() if isinstance(metrics, dict) else ()):
            if isinstance(m, dict) and isinstance(m.get("ratio"), (int, float)):
                out.append(f"{name} {m['ratio']:.3f} ({metric})")
                break
    return "; ".join(out)


def _side(k: dict) -> str:
    """A kernel as the report names it, with the sysctls set on it"""
    sysctls = k.get("sysctls") or []
    return str(k.get("name", "?")) + (f" ({', '.join(map(str, sysctls))})" if sysctls else "")


def _row(path: Path, data: dict, results: Path) -> tuple[str, str]:
    ks = data.get("kernels") if isinstance(data.get("kernels"), dict) else {}
    a, b = (_side(ks.get(s) if isinstance(ks.get(s), dict) else {}) for s in ("a", "b"))
    what = f"{a} vs {a} (floor)" if a == b else f"{b} vs {a}"
    if data.get("kind") == "here":      # one kernel, `ptlab bench --here`
        k = data.get("kernel") if isinstance(data.get("kernel"), dict) else {}
        what = f"{k.get('name', '?')}, running (--here)"
    m = data.get("machine") if isinstance(data.get("machine"), dict) else None
    mach = f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores" if m else "-"
    clock = data.get("clock") or "host"
    rel = path.parent.relative_to(results)
    date = str(data.get("date") or "")
    cells = [f"[{rel}]({rel}/report.md)", date[:16] or "?", what,
             str(data.get("series_revision") or "-"), str(data.get("repo_commit") or "-"),
             mach, f"{data.get('accel') or '?'}, clock {clock}",
             f"{data.get('sizes') or '?'}, {data.get('repetitions') or '?'}", _headlines(data)]
    return date, "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


def build_index(results: Path = RESULTS_DIR) -> str:
    rows = []
    for p in sorted(results.rglob("results.json")):
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        rows.append(_row(p, data, results))
    rows.sort(key=lambda r: r[0], reverse=True)
    table = ["| report | date | what | series | repository | machine | accelerator, clock "
             "| sizes, boots | headline ratios |", "|---|---|---|---|---|---|---|---|---|"]
    return HEADER + "\n" + "\n".join(table + [r for _, r in rows]) + "\n"


def write_index(results: Path = RESULTS_DIR) -> Path:
    out = results / "README.md"
    out.write_text(build_index(results))
    return out
