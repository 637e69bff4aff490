# SPDX-License-Identifier: GPL-2.0
"""Parse the KTAP/TAP output of one kselftest binary.

Formats follow tools/testing/selftests/kselftest.h and kselftest_harness.h:

  TAP version 13                  (omitted when KSFT_TAP_LEVEL is set)
  1..N                            (1..0 # SKIP reason: whole binary skipped)
  # [RUN] Basic COW after fork() ... with base page
  ok 1 No leak from parent into child
  ok 2 # SKIP MADV_PAGEOUT did not work, is swap enabled?
  ok 3 # XFAIL Leak from child into parent
  not ok 4 # error reason
  ok 5 fixture.variant.test # SKIP reason   (harness, " #  msg" otherwise)
  Bail out! mmap failed
  # Totals: pass:1 fail:0 xfail:1 xpass:0 skip:1 error:1

Only the top level is parsed; nested output ("# ok 1 ...", indented KTAP
subtests) is treated as diagnostics.  The prefix in front of the first
"TAP version"/"KTAP version" line is stripped from the following lines that
carry it; a line without it is read as it is (a stray "xyz " in front of the
header must not turn "not ok" lines into "ok" ones).

What the stream says about itself must hold: a numbering gap, a duplicate
plan or "# Totals:" that disagree with the result lines make an error case
("<inconsistent TAP: ...>"), as do planned cases that never came.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable

from .splat import TIMESTAMP

STATUSES = ("pass", "fail", "skip", "xfail", "xpass", "error")


@dataclass
class Case:
    """One test result line."""
    name: str          # description after "ok N ", "- " and directive removed
    status: str        # one of STATUSES
    detail: str = ""   # directive reason, or what went wrong for "error"
    context: str = ""  # last "# [RUN] ..." diagnostic seen before this result


@dataclass
class Result:
    """Everything parsed from one binary's output."""
    cases: list[Case] = field(default_factory=list)
    planned: int | None = None
    totals_line: str | None = None
    problems: list[str] = field(default_factory=list)


_ANSI = re.compile(r'\x1b\[[0-9;?]*[A-Za-z]')
_HEADER = re.compile(r'K?TAP version \d+\s*$')
_PLAN = re.compile(r'^1\.\.(\d+)\s*(?:#\s*(.*))?$')
_RESULT = re.compile(r'^(not ok|ok)\s+(\d+)(?:\s+(.*))?$')
_DIRECTIVE_SEP = re.compile(r'(?:^|\s)#(?:\s+|$)')
_DIRECTIVE = re.compile(r'(SKIP|TODO|XFAIL|XPASS|ERROR)\b[:\s]*(.*)$', re.I)
_BAIL = re.compile(r'^Bail out!\s*(.*)$')
_TOTALS = re.compile(r'^#\s*Totals:\s*(.*)$')
_RUN = re.compile(r'^#\s*(\[RUN\].*)$')


def _clean(lines: Iterable[str]) -> Iterable[str]:
    """Split on \\r, drop escape sequences and kernel timestamps."""
    for raw in lines:
        for part in raw.rstrip('\r\n').split('\r'):
            yield TIMESTAMP.sub('', _ANSI.sub('', part)).rstrip()


def _result_case(ok: bool, num: int, desc: str) -> Case:
    """Build a Case from the text after "ok N"."""
    desc = desc.strip()
    if desc.startswith('- '):
        desc = desc[2:].lstrip()
    name, directive = desc, ''
    m = _DIRECTIVE_SEP.search(desc)
    if m:
        name, directive = desc[:m.start()].strip(), desc[m.end():].strip()
    status, detail = ('pass' if ok else 'fail'), directive
    d = _DIRECTIVE.match(directive)
    if d:
        word, detail = d.group(1).upper(), d.group(2).strip()
        if word == 'TODO':
            status = 'xpass' if ok else 'xfail'
        else:
            status = word.lower()
    if not name:
        name = detail or f'<unnamed {num}>'
    return Case(name, status, detail)


def parse(lines: Iterable[str]) -> Result:
    """Parse kselftest output (an iterable of lines, or one string)."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    res = Result()
    real: list[Case] = []         # cases backed by an "ok"/"not ok" line
    prefix: str | None = None     # None until the TAP stream starts
    bailed = False
    context = ''
    for line in _clean(lines):
        if prefix is None:
            if m := _HEADER.search(line):
                prefix = line[:m.start()]
                continue
            if not any(r.match(line) for r in (_PLAN, _RESULT, _BAIL)):
                continue  # garbage before the TAP stream
            prefix = ''
        if prefix and line.startswith(prefix):
            line = line[len(prefix):]
        if _HEADER.match(line):
            continue
        if m := _RESULT.match(line):
            num = int(m.group(2))
            if num != len(real) + 1:
                res.problems.append(f'expected case {len(real) + 1}, got {num}')
            case = _result_case(m.group(1) == 'ok', num, m.group(3) or '')
            case.context = context
            real.append(case)
            res.cases.append(case)
        elif m := _PLAN.match(line):
            if res.planned is not None:
                res.problems.append(f'duplicate plan: {line}')
                continue
            res.planned = int(m.group(1))
            if res.planned == 0 and m.group(2):  # "1..0 # SKIP reason"
                d = _DIRECTIVE.match(m.group(2))
                reason = (d.group(2) if d else m.group(2)).strip()
                res.cases.append(Case(reason or '<skipped>', 'skip', reason))
        elif m := _BAIL.match(line):
            bailed = True
            msg = m.group(1).strip()
            res.problems.append(f'bail out: {msg}' if msg else 'bail out')
            res.cases.append(Case('<bail out>', 'error', msg, context))
        elif _TOTALS.match(line):
            res.totals_line = line.strip()
        elif m := _RUN.match(line):
            context = m.group(1).strip()
    _check(res, real, prefix is not None, bailed)
    return res


def _check(res: Result, real: list[Case], seen_tap: bool,
           bailed: bool) -> None:
    """Note missing/inconsistent output; only missing planned cases (and
    Bail out!) become error cases, so output without TAP yields no cases."""
    if not seen_tap:
        res.problems.append('no TAP output')
        return
    if res.planned is None:
        if not res.cases:
            res.problems.append('no plan and no results')
    elif len(real) != res.planned and not (res.planned == 0 and res.cases):
        msg = f'planned {res.planned} cases, saw {len(real)}'
        res.problems.append(msg)
        missing = res.planned - len(real)
        if missing > 0 and not bailed:
            after = f" after '{unique_names(real)[-1][0]}'" if real else ''
            res.cases.append(Case(f'<missing {missing} cases{after}>',
                                  'error', msg))
    if res.totals_line:
        counts = dict(re.findall(r'(\w+):(\d+)', res.totals_line))
        for st in STATUSES:
            n = sum(c.status == st for c in real)
            if st in counts and int(counts[st]) != n:
                res.problems.append(f'totals say {st}:{counts[st]}, saw {n}')
    odd = [p for p in res.problems if not p.startswith(('planned ', 'bail out'))]
    if odd:
        res.cases.append(Case(f'<inconsistent TAP: {odd[0]}>', 'error', '; '.join(odd)))


def unique_names(cases: Iterable[Case]) -> list[tuple[str, Case]]:
    """Pair each case with a stable unique name: the "[RUN] ..." line when the
    binary announces what it runs (cow repeats its result texts under every
    [RUN], and a result's text changes with its outcome: "No leak ..." vs
    "Leak ...", or the SKIP reason), else the result's text; repeats get
    " #2", " #3", ..."""
    seen: dict[str, int] = {}
    out = []
    for c in cases:
        base = c.context or c.name
        seen[base] = seen.get(base, 0) + 1
        n = seen[base]
        out.append((base if n == 1 else f'{base} #{n}', c))
    return out


_UFFD_TEST = re.compile(r'^Testing (.+?)\.\.\. ?(.*)$')
_UFFD_END = re.compile(r'(done|skipped|failed)(?: \[reason: (.*?)\]?)?\s*$')


_COLOR_STEP = re.compile(r'^(.*?)\s*\x1b\[3([123])m(.*?)\x1b\[0m\s*$')
_RUN_TEST = re.compile(r'^Run test: (.*)$')


def parse_steps(lines: Iterable[str]) -> Result:
    """khugepaged's "Run test: <name>" blocks of "<step>... <colored verdict>"
    (green passed, red failed, yellow skipped)."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    res = Result()
    block = ''
    for raw in lines:
        raw = raw.rstrip('\r\n')
        if m := _RUN_TEST.match(raw):
            block = m.group(1).strip() + ': '
        elif m := _COLOR_STEP.match(raw):
            status = {'1': 'fail', '2': 'pass', '3': 'skip'}[m.group(2)]
            res.cases.append(Case(block + m.group(1).rstrip('.').strip(), status,
                                  m.group(3) if status != 'pass' else ''))
    return res


def parse_uffd(lines: Iterable[str]) -> Result:
    """uffd-unit-tests' "Testing <name>... done|skipped [reason: r]|failed
    [reason: r]" (the verdict may come lines after the name); a name without
    a verdict is an error (the binary stopped there)."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    res = Result()
    name = None
    for line in _clean(lines):
        m = _UFFD_TEST.match(line)
        if m:
            if name is not None:
                res.cases.append(Case(name, 'error', 'no verdict printed'))
            name, line = m.group(1), m.group(2)
        if name is None:
            continue
        e = _UFFD_END.search(line)
        if e:
            status = {'done': 'pass', 'skipped': 'skip', 'failed': 'fail'}[e.group(1)]
            res.cases.append(Case(name, status, (e.group(2) or '').strip()))
            name = None
    if name is not None:
        res.cases.append(Case(name, 'error', 'no verdict: the binary stopped here'))
    return res


# the formats lab/suites.py names for each program
FORMATS = {'ktap': parse, 'uffd': parse_uffd, 'steps': parse_steps,
           'exit': lambda lines: Result()}
