"""The guest machine as data (cf. kunit's qemu_configs/): one place to read
what the kernel runs on."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Machine:
    cpus: int = 4                 # the migration selftest skips below 3 CPUs
    nodes: tuple[int, ...] = (4096, 4096)   # MiB per NUMA node: 8 GiB in all
    zram_swap_mib: int = 1024     # without swap, cow skips its MADV_PAGEOUT cases
    hugepages_2m: int = 128       # reserved at boot for the hugetlb tests
    cmdline: tuple[str, ...] = ("console=ttyS0", "panic=-1", "loglevel=5",
                                "printk.time=1", "nokaslr",
                                # the guest's dmesg, dumped after the plan, is
                                # scanned: big enough for a whole run
                                "log_buf_len=16M")
    extra: list[str] = field(default_factory=list)
    # QEMU's -icount shift (TCG only): the guest's clocks follow the
    # instructions it executes, 2**shift ns each, not the host's time; vCPUs
    # then run in turn on one host thread (no MTTCG). None: the host's time
    icount: int | None = None

    def qemu_args(self, accel: str, kernel: str, initrd: str, console: list[str],
                  results: str) -> list[str]:
        mem = sum(self.nodes)
        args = ["qemu-system-x86_64", "-nodefaults", "-nographic", "-no-reboot",
                "-m", f"{mem}M",
                # one socket per node, so the caches QEMU describes match the nodes
                "-smp", f"{self.cpus},sockets={len(self.nodes)},"
                        f"cores={self.cpus // len(self.nodes)},threads=1"]
        if accel == "kvm":
            args += ["-accel", "kvm", "-cpu", "host"]
        elif self.icount is not None:
            args += ["-accel", "tcg,thread=single", "-cpu", "max",
                     "-icount", f"shift={self.icount},sleep=off,align=off"]
        else:
            args += ["-accel", "tcg,thread=multi", "-cpu", "max"]
        per = self.cpus // len(self.nodes)
        for i, size in enumerate(self.nodes):
            args += ["-object", f"memory-backend-ram,id=m{i},size={size}M",
                     "-numa", f"node,nodeid={i},cpus={i * per}-{(i + 1) * per - 1},memdev=m{i}"]
        cmdline = [*self.cmdline, f"hugepages={self.hugepages_2m}",
                   f"ptlab.zram={self.zram_swap_mib}"]
        args += ["-kernel", kernel, "-initrd", initrd, "-append", " ".join(cmdline),
                 *console, "-serial", results, *self.extra]
        return args


DEFAULT = Machine()
