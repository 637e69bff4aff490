# SPDX-License-Identifier: GPL-2.0
"""Find kernel splats (oopses, BUGs, WARNINGs, lockdep, ...) in a console log.

Trigger lines are matched against the printk message with the timestamp
("[   12.345678] ", optional "[T123]" caller id) stripped, anchored at the
start of the message, so benign boot messages such as
"Spectre V2 : WARNING: Unprivileged eBPF is enabled ..." or a userspace
"traps: cow[73] general protection fault ip:..." never match.

A report extends from its "cut here" / "=====" line (or from a preceding
dump_page() block, or its first line) to "---[ end trace ... ]---",
"---[ end Kernel panic ... ]---", the closing "=====" of a *SAN/KFENCE
report, or else the end of its last Call Trace block; it stops early at the
next report and is capped at MAX_LINES lines.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

MAX_LINES = 80


@dataclass
class Splat:
    """One kernel report found in the log."""
    kind: str   # "oops", "bug", "warning", "lockdep", "kasan", ...
    title: str  # first line of the report proper (timestamp stripped)
    text: str   # full report as it appears in the log
    line: int   # 1-based log line where the report starts
    log: str = ""   # the log's file in the run directory ("guest-2/dmesg.txt")


# Order matters: the first match wins.
# "WARNING:" is only a splat for __warn()'s "WARNING: CPU: N PID: N at ..."
# and lockdep's report titles; other "WARNING:" messages (e.g. boot-time
# pr_warn() from the Spectre/RETBleed mitigation code) are not splats.
_TRIGGERS = [(k, re.compile(r)) for k, r in [
    ('kasan', r'BUG: KASAN: '),
    ('bad-page', r'BUG: Bad page (state|map|cache)\b'),
    ('rss-counter', r'BUG: Bad rss-counter state'),
    ('pgtables-bytes', r'BUG: non-zero pgtables_bytes on freeing mm'),
    ('soft-lockup', r'(watchdog: )?BUG: soft lockup'),
    ('oops', r'BUG: (unable to handle|kernel NULL pointer dereference)'),
    ('oops', r'Unable to handle kernel '),
    ('lockdep', r'BUG: (MAX_\w+ too low!|key \S+ has not been registered'
                r'|looking up invalid subclass)'),
    ('lockdep', r'INFO: trying to register non-static key'),
    ('bug', r'(kernel BUG at |Kernel BUG at |BUG: )'),
    ('oops', r'(Oops: |Internal error: Oops|general protection fault)'),
    ('lockdep', r'WARNING: (possible circular locking dependency'
                r'|possible recursive locking|suspicious RCU usage'
                r'|inconsistent lock state|bad unlock balance'
                r'|lock held when returning to user space'
                r'|possible irq lock inversion|\S+-safe -> \S+-unsafe'
                r'|held lock freed|chain_key collision|Nested lock was not'
                r'|bad contention detected|\S+/\d+ still has locks held)'),
    ('warning', r'WARNING: CPU: \d+ PID: \d+ '),
    ('hung-task', r'INFO: task .+ blocked for more than \d+ seconds'),
    ('rcu-stall', r'(rcu: )?INFO: \S+ (detected (expedited )?stalls?'
                  r'|self-detected stall)'),
    ('panic', r'Kernel panic - not syncing'),
    ('ubsan', r'UBSAN: '),
    ('bug', r'(NMI )?watchdog: Watchdog detected hard LOCKUP'),
    # pmd_ERROR() & co (pmd_clear_bad(): a corrupt page table entry)
    ('bad-pgtable', r'\S+:\d+: bad (pte|pmd|pud|p4d|pgd) '),
    ('bad-swap', r'(\S+: )?(Bad swap (file|offset) entry|Unused swap offset entry) '),
    # SLUB debug: "BUG kmalloc-64 (Not tainted): Poison overwritten"
    ('slub', r'BUG \S+ \((Not tainted|Tainted: [^)]*)\): '),
]]
_SINGLE_LINE = {'rss-counter', 'pgtables-bytes', 'bad-pgtable', 'bad-swap'}

# a printk line's "[   12.345678] " (and "<6>" level, "[T123]" caller id)
TIMESTAMP = re.compile(r'^(?:<\d>)?\[\s*\d+\.\d+\](?:\[\s*[CT]\d+\])? ?')
_OOPS_HEADER = re.compile(r'(Oops: |Internal error: Oops|general protection)')
_CUT = re.compile(r'^-+\[ cut here \]-+\s*$')
_RULE = re.compile(r'^={20,}\s*$')
_END = re.compile(r'^---\[ end (trace|Kernel panic)')
_FRAMED = re.compile(r'BUG: (K[A-Z]+SAN|KFENCE): ')  # closed by a "=====" line
_CALL_TRACE = re.compile(r'^Call [Tt]race:')
_FRAME = re.compile(
    r'^\s+(\? )?\S+\+0x[0-9a-f]+/0x[0-9a-f]+'   # " ? foo+0x12/0x34 [mod]"
    r'|^\s*</?[A-Z]+>\s*$'                     # " <TASK>", " </IRQ>"
    r'|^\s*\[<[0-9a-f]+>\]'                    # old-style "[<ffff...>]"
    r'|^(RIP|EIP|RSP|ESP|RAX|EAX|ESI|RDX|RBP|R\d+|FS|CS|CR2|DR\d|PKRU|Code):')
_PAGE_DUMPED = re.compile(r'^page dumped because: ')
_PAGE_FIRST = re.compile(r'^page: ')


def _msg(line: str) -> str:
    """The printk message: no trailing CR, no timestamp."""
    return TIMESTAMP.sub('', line.rstrip('\r'))


def _trigger(msg: str) -> str | None:
    for kind, rx in _TRIGGERS:
        if rx.match(msg):
            return kind
    return None


def _start(msgs: list[str], body: int, floor: int) -> int:
    """Index of the first line of the report whose title is msgs[body]."""
    start = body
    if body - 1 >= floor and _RULE.match(msgs[body - 1]):
        start = body - 1
    else:
        for j in range(body - 1, max(floor, body - 6) - 1, -1):
            if _CUT.match(msgs[j]):
                start = j
                break
    # VM_BUG_ON_PAGE() & co: dump_page() output right before the report
    if start - 1 >= floor and _PAGE_DUMPED.match(msgs[start - 1]):
        for j in range(start - 1, max(floor, start - 16) - 1, -1):
            if _PAGE_FIRST.match(msgs[j]):
                return j
    return start


def _end(msgs: list[str], start: int, body: int, kind: str) -> int:
    """Index of the last line of the report whose title is msgs[body]."""
    limit = min(len(msgs), start + MAX_LINES)
    if kind in _SINGLE_LINE:
        end = body
        while end + 1 < limit and _trigger(msgs[end + 1]) == kind:
            end += 1
        return end
    framed = bool(_FRAMED.match(msgs[body]))
    end, in_trace, traced = body, False, False
    for i in range(body + 1, limit):
        m = msgs[i]
        if _END.match(m) or (framed and _RULE.match(m)):
            return i
        if _CUT.match(m) or _RULE.match(m):
            break
        if _trigger(m):
            # "BUG: unable to handle ..." / "kernel BUG at" + "Oops: ..."
            # is one report; any other trigger starts the next one.
            if traced or in_trace or i - body > 15 or not _OOPS_HEADER.match(m):
                break
        if _CALL_TRACE.match(m):
            if traced and kind != 'rcu-stall':
                break  # an unrelated dump_stack() after the report
            in_trace, end = True, i
        elif in_trace:
            if _FRAME.match(m):
                end = i
            else:
                in_trace, traced = False, True
    return end


def scan(text: str) -> list[Splat]:
    """Return all splats in a console log, in log order."""
    lines = [ln.rstrip('\r') for ln in text.split('\n')]
    msgs = [_msg(ln) for ln in lines]
    splats: list[Splat] = []
    i = floor = 0
    while i < len(msgs):
        kind = _trigger(msgs[i])
        if not kind:
            i += 1
            continue
        start = _start(msgs, i, floor)
        end = min(_end(msgs, start, i, kind), start + MAX_LINES - 1)
        splats.append(Splat(kind, msgs[i].strip(),
                            '\n'.join(lines[start:end + 1]), start + 1))
        i = floor = end + 1
    return splats


_DROPPED = re.compile(r'\*\* (\d+) printk messages dropped \*\*')


def dropped(text: str) -> int:
    """How many messages the console says it dropped."""
    return sum(int(m.group(1)) for m in _DROPPED.finditer(text))


def format_report(splats: list[Splat], max_splats: int = 5) -> str:
    """Human-readable summary of splats for a terminal."""
    if not splats:
        return 'no kernel splats found'
    kinds = Counter(s.kind for s in splats)
    out = [f'{len(splats)} kernel splat(s): ' +
           ', '.join(f'{n} {k}' for k, n in kinds.most_common())]
    for s in splats[:max_splats]:
        out.append(f'--- {s.kind} at line {s.line}: {s.title}')
        out.append(s.text)
    rest = splats[max_splats:]
    if rest:
        out.append(f'--- {len(rest)} more not shown: ' +
                   ', '.join(f'{s.kind}@{s.line}' for s in rest[:20]) +
                   (' ...' if len(rest) > 20 else ''))
    return '\n'.join(out)
