"""The vocabulary of a guest run, shared by test, bench and soak: the plan
(PlanItem), what each test program did (TestRun), what the boot came to
(Outcome), and the parser of the results channel (ttyS1), on which the
guest's init writes each test's output between PTLAB-BEGIN and PTLAB-END
markers, its counters, the guest's dmesg and the final PTLAB-DONE."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from . import splat


@dataclass
class PlanItem:
    suite: str
    test: str
    timeout: int
    argv: list[str]
    secs: float = 10.0      # expected time, to split a plan between guests
    busy: bool = False      # keeps several vCPUs busy: not beside another such test

    def line(self) -> str:
        return f"{self.suite} {self.test} {self.timeout} {' '.join(self.argv)}"


@dataclass
class TestRun:
    suite: str
    test: str
    output: list[str] = field(default_factory=list)
    rc: int | None = None
    secs: float = 0.0
    timed_out: bool = False     # killed by the guest's per-test time limit
    counters: dict[str, int] = field(default_factory=dict)  # our vmstat counters' deltas


@dataclass
class Outcome:
    runs: list[TestRun]
    finished: bool          # PTLAB-DONE seen: the guest ran the whole plan
    splats: list[splat.Splat]
    console: Path
    results: Path
    boot: str
    wall: float
    log: Path | None = None     # what was scanned for splats: dmesg.txt or the console
    dropped: int = 0            # "** N printk messages dropped **" on the console
    setup: list[str] = field(default_factory=list)   # PTLAB-SETUP: what the guest lacked
    dmesg_saved: bool = False   # the guest's dmesg was scanned, not its console

    @property
    def ok(self) -> bool:
        return self.finished and not self.splats


@dataclass
class Channel:
    """What the guest wrote on the results channel."""
    runs: list[TestRun] = field(default_factory=list)
    done: bool = False                  # PTLAB-DONE: the plan ran to its end
    boot: str = ""                      # PTLAB-BOOT: what init saw at boot
    dmesg: list[str] | None = None      # the guest's dmesg, if written to its end
    setup: list[str] = field(default_factory=list)  # PTLAB-SETUP: what init could not set up


def parse_channel(text: str) -> Channel:
    """Parse the channel; `text` may end inside a line that the guest is
    still writing (the host polls while it runs).  Only whole lines are
    control lines: a partial last line counts only as the output of the
    test that was running."""
    ch = Channel()
    cur = None
    in_dmesg = False
    *lines, partial = text.split("\n")
    for line in lines:
        line = line.rstrip("\r")
        if in_dmesg:
            if line == "PTLAB-DMESG-END":
                in_dmesg = False
            else:
                ch.dmesg.append(line)
            continue
        if line == "PTLAB-DMESG":
            in_dmesg, ch.dmesg = True, []
        elif line.startswith("PTLAB-BOOT "):
            ch.boot = line[len("PTLAB-BOOT "):]
        elif line.startswith("PTLAB-SETUP "):
            ch.setup.append(line[len("PTLAB-SETUP "):])
        elif line.startswith("PTLAB-BEGIN "):
            _, suite, test = line.split(maxsplit=2)
            cur = TestRun(suite, test)
            ch.runs.append(cur)
        elif line.startswith("PTLAB-END ") and cur:
            m = re.search(r"rc=(\d+) secs=([\d.]+)(?: timeout=(\d))?", line)
            if m:
                cur.rc, cur.secs = int(m.group(1)), float(m.group(2))
                cur.timed_out = m.group(3) == "1"
            if cur.output and cur.output[-1] == "":
                cur.output.pop()        # the newline written before PTLAB-END
            cur = None
        elif line.startswith("PTLAB-COUNTERS") and ch.runs and not cur:
            ch.runs[-1].counters = {k: int(v) for k, v in
                                    (kv.split("=", 1) for kv in line.split()[1:])}
        elif line.startswith("PTLAB-DONE"):
            ch.done = True
        elif cur:
            cur.output.append(line)
    if partial.rstrip("\r") and cur and not in_dmesg:
        cur.output.append(partial.rstrip("\r"))
    if in_dmesg:
        ch.dmesg = None                 # cut off: the guest died while writing it
    return ch
