"""Plots for a bench report: one PNG per benchmark group, one panel per
variant, every metric as B/A with each run's spread. Run with the lab's
venv python (matplotlib): python plot.py <report-dir>."""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(outdir: Path) -> None:
    data = json.loads((outdir / "results.json").read_text())
    groups: dict[str, list] = {}
    for name, entry in data["benchmarks"].items():
        groups.setdefault(entry["group"], []).append((name, entry))
    a, b = data["kernels"]["a"]["name"], data["kernels"]["b"]["name"]
    for group, items in groups.items():
        items = [(n, e) for n, e in items if e["metrics"]]
        if not items:
            continue
        fig, axes = plt.subplots(len(items), 1, figsize=(9, 1.2 + 0.45 * sum(
            len(e["metrics"]) for _, e in items) + 0.6 * len(items)), squeeze=False)
        for ax, (name, entry) in zip(axes[:, 0], items):
            labels, y = [], 0
            for m, e in entry["metrics"].items():
                ma = e["a"]["median"]
                if not ma:
                    continue
                for side, color, dy in (("a", "tab:blue", 0.15), ("b", "tab:orange", -0.15)):
                    vals = [v / ma for v in e["values"][side]]
                    ax.scatter(vals, [y + dy] * len(vals), color=color, s=14,
                               label={"a": f"A {a}", "b": f"B {b}"}[side] if y == 0 else None)
                if e["ratio"] is not None:
                    ax.plot([e["ratio"]], [y - 0.15], marker="|", color="black", ms=14)
                labels.append(f"{m} ({e['better']} better)")
                y += 1
            ax.axvline(1.0, color="grey", lw=0.8, ls="--")
            ax.set_yticks(range(len(labels)), labels, fontsize=8)
            ax.set_title(name, fontsize=9, loc="left")
            ax.set_xlabel("value / A median (each dot one boot; | = B median / A median)",
                          fontsize=8)
            ax.legend(fontsize=7, loc="best")
        fig.suptitle(f"{group}: {b} vs {a} ({data['sizes']} sizes, {data['accel']})",
                     fontsize=10)
        fig.tight_layout()
        fig.savefig(outdir / f"{group}.png", dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
