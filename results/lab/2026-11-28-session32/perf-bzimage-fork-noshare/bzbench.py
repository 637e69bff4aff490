# one-off experiment (session 32): the perf kernels booted as bzImage
# (SeaBIOS + the kernel's own decompressor), not vmlinux by PVH
import sys
from pathlib import Path
sys.path.insert(0, "/work/main")
from lab import bench, build
orig = build.build_kernel
def bz(src, kdir, profile):
    v = orig(src, kdir, profile)
    return v.parent / "arch/x86/boot/bzImage"
bench.build.build_kernel = bz
sys.exit(bench.run_bench("vanilla", "patched", ["fork-noshare"], 3, "default",
                         Path(sys.argv[1]).resolve()))
