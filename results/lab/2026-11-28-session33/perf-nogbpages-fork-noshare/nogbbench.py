# one-off experiment (session 33): the perf kernels booted by PVH (the lab's
# default) with nogbpages, so that the direct map has no 1 GiB pages; does
# fork-noshare's host-time ratio move toward the bzImage boot's 1.13-1.15?
import sys
from dataclasses import replace
from pathlib import Path
sys.path.insert(0, "/work/main")
from lab import bench
bench.BENCH_MACHINE = replace(bench.BENCH_MACHINE,
                              cmdline=(*bench.BENCH_MACHINE.cmdline, "nogbpages"))
sys.exit(bench.run_bench("vanilla", "patched", ["fork-noshare"], 3, "default",
                         Path(sys.argv[1]).resolve()))
