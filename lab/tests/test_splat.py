from pathlib import Path

from lab import splat

DATA = Path(__file__).parent / 'data'


def scan(name):
    return splat.scan((DATA / name).read_text())


def kinds(splats):
    return [s.kind for s in splats]


def test_clean_boot_has_no_splats():
    # lower-case "warning", "no BUGs", Spectre/RETBleed "WARNING:", userspace
    # "general protection fault" and segfault lines are all benign
    assert scan('boot_clean.log') == []


def test_warnings():
    text = (DATA / 'warning.log').read_text()
    ss = splat.scan(text)
    assert kinds(ss) == ['warning', 'warning']
    w = ss[0]
    assert w.title == 'WARNING: CPU: 1 PID: 103 at mm/memory.c:3401 wp_page_copy+0x4d5/0x6e0'
    assert w.line == 3
    lines = w.text.splitlines()
    assert lines[0].endswith('------------[ cut here ]------------')
    assert lines[-1].endswith('---[ end trace 0000000000000000 ]---')
    assert text.splitlines()[w.line - 1] == lines[0]
    assert any(' </TASK>' in ln for ln in lines)
    assert 'ptlab: running' not in w.text and 'exited with' not in w.text
    # WARN() with a message: the message sits between "cut here" and WARNING:
    w2 = ss[1]
    assert w2.line == 49
    assert 'unexpected folio state' in w2.text.splitlines()[1]
    assert w2.title.startswith('WARNING: CPU: 0 PID: 104 at mm/rmap.c:1370')


def test_lockdep_no_timestamps():
    ss = scan('lockdep.log')
    assert kinds(ss) == ['lockdep', 'lockdep']
    circ, rcu = ss
    assert circ.title == 'WARNING: possible circular locking dependency detected'
    assert circ.line == 6 and circ.text.startswith('=====')
    assert len(circ.text.splitlines()) <= splat.MAX_LINES
    assert 'stack backtrace:' in circ.text
    assert 'ok 1 Pages were unmerged' not in circ.text
    assert rcu.title == 'WARNING: suspicious RCU usage'
    assert rcu.text.splitlines()[-1] == ' </TASK>'
    assert 'ptlab: done' not in rcu.text


def test_hung_task():
    (h,) = scan('hung_task.log')
    assert h.kind == 'hung-task' and h.line == 2
    assert h.title == 'INFO: task uffd-unit-test:212 blocked for more than 122 seconds.'
    assert h.text.splitlines()[-1].endswith(' </TASK>')
    assert 'rwsem_down_write_slowpath' in h.text


def test_rss_counter_and_pgtables_bytes():
    ss = scan('rss_counter.log')
    assert kinds(ss) == ['rss-counter', 'pgtables-bytes', 'rss-counter']
    assert [s.line for s in ss] == [2, 4, 6]
    assert len(ss[0].text.splitlines()) == 2  # both counters of one mm
    assert ss[1].title == 'BUG: non-zero pgtables_bytes on freeing mm: 4096'


def test_oops_is_one_splat_then_panic():
    text = (DATA / 'oops_panic.log').read_text()
    assert '\r' in open(DATA / 'oops_panic.log', newline='').read()
    ss = splat.scan(open(DATA / 'oops_panic.log', newline='').read())
    assert kinds(ss) == ['oops', 'panic']
    oops, panic = ss
    assert oops.title == 'BUG: kernel NULL pointer dereference, address: 0000000000000008'
    assert 'Oops: Oops: 0000 [#1] PREEMPT SMP NOPTI' in oops.text
    assert oops.text.splitlines()[-1] == '---[ end trace 0000000000000000 ]---'
    assert '\r' not in oops.text
    assert panic.title == 'Kernel panic - not syncing: Fatal exception'
    assert panic.text.splitlines()[-1].startswith('---[ end Kernel panic')
    assert kinds(splat.scan(text)) == ['oops', 'panic']


def test_misc_kinds():
    ss = scan('misc.log')
    assert kinds(ss) == ['bug', 'bug', 'kasan', 'bad-page', 'ubsan', 'soft-lockup', 'panic']
    bug, sleeping, kasan, bad, ubsan, soft, panic = ss
    # VM_BUG_ON_PAGE-style: the dump_page() lines before "cut here" belong to it
    assert bug.title == 'kernel BUG at mm/page_table_check.c:76!'
    assert bug.line == 2 and 'page dumped because' in bug.text
    assert 'Oops: invalid opcode' in bug.text
    # the unrelated allocation-failure dump after the report is not included
    assert 'page allocation failure' not in sleeping.text
    assert sleeping.text.splitlines()[-1].endswith(' </TASK>')
    assert kasan.text.splitlines()[0].endswith('=' * 66)
    assert kasan.text.splitlines()[-1].endswith('=' * 66)
    assert 'Memory state around the buggy address' in kasan.text
    assert bad.title.startswith('BUG: Bad page state in process cow')
    assert ubsan.text.splitlines()[-1].endswith('---[ end trace ]---')
    assert soft.title.startswith('watchdog: BUG: soft lockup - CPU#1')
    assert 'deferred_split_scan' in soft.text
    assert panic.title == 'Kernel panic - not syncing: softlockup: hung tasks'


def test_rcu_stall():
    (r,) = scan('rcu_stall.log')
    assert r.kind == 'rcu-stall'
    assert 'rcu_gp_fqs_loop' in r.text  # second backtrace still belongs to it
    assert 'test finished' not in r.text


def test_bug_variants_and_kinds():
    log = '\n'.join([
        'BUG: Bad page map in process cow  pte:8000000005a40025 pmd:05a5e067',
        'BUG: workqueue lockup - pool cpus=0 node=0 flags=0x0 nice=0 stuck for 35s!',
        'BUG: scheduling while atomic: cow/103/0x00000002',
        'WARNING: possible recursive locking detected',
        'WARNING: inconsistent lock state',
        'WARNING: bad unlock balance detected!',
        'WARNING: lock held when returning to user space!',
        'rcu: INFO: rcu_sched detected stalls on CPUs/tasks:',
        'general protection fault, probably for non-canonical address 0xdead000000000100: 0000 [#1] SMP',
        'UBSAN: array-index-out-of-bounds in mm/vmscan.c:1:2',
        'WARNING: CPU: 0 PID: 1 at mm/gup.c:2345 foo+0x1/0x2',
        'BUG: MAX_LOCKDEP_CHAINS too low!',
        'BUG: KFENCE: out-of-bounds read in foo+0x1/0x2',
    ])
    assert kinds(splat.scan(log)) == [
        'bad-page', 'bug', 'bug', 'lockdep', 'lockdep', 'lockdep', 'lockdep',
        'rcu-stall', 'oops', 'ubsan', 'warning', 'lockdep', 'bug']


def test_not_splats():
    log = '\n'.join([
        '[    1.0] Spectre V2 : WARNING: Unprivileged eBPF is enabled',
        '[    1.0] some driver: WARNING: odd firmware',
        '[    1.0] ACPI: PCI Root Bridge [PCI0], no BUGs here',
        '[    1.0] ok 1 WARNING: CPU: in a test name',
        '[    1.0] # BUG: printed by a selftest',
        '[    1.0] traps: cow[97] general protection fault ip:7f1c sp:7ffd error:0',
        'INFO: lockdep is turned off.',
        '---[ end trace 0000000000000000 ]---',
    ])
    assert splat.scan(log) == []


def test_caller_id_and_length_cap():
    lines = ['[    3.000000][    T1] ------------[ cut here ]------------',
             '[    3.000001][    T1] WARNING: CPU: 0 PID: 1 at mm/mmap.c:1 x+0x1/0x2',
             '[    3.000002][    T1] Call Trace:']
    lines += [f'[    3.000003][    T1]  frame{i}+0x1/0x2' for i in range(200)]
    lines += ['[    3.000004][    T1] ---[ end trace 0000000000000000 ]---']
    (w,) = splat.scan('\n'.join(lines))
    assert w.kind == 'warning' and w.line == 1
    assert len(w.text.splitlines()) == splat.MAX_LINES


def test_format_report():
    ss = scan('misc.log')
    out = splat.format_report(ss, max_splats=2)
    assert out.splitlines()[0].startswith('7 kernel splat(s): 2 bug')
    assert '--- bug at line 2: kernel BUG at mm/page_table_check.c:76!' in out
    assert 'kernel BUG at mm/page_table_check.c:76!' in out
    assert '5 more not shown: kasan@44' in out
    assert splat.format_report([]) == 'no kernel splats found'


def test_page_table_swap_and_slub_reports():
    text = '\n'.join([
        '[   10.000001] ptlab: something benign',
        '[   10.100000] mm/pgtable-generic.c:53: bad pmd 00000000a1b2c3d4(8000000102345067)',
        '[   11.000000] get_swap_device: Bad swap file entry 40000000000003e0',
        '[   12.000000] =============================================================================',
        '[   12.000001] BUG kmalloc-64 (Not tainted): Poison overwritten',
        '[   12.000002] -----------------------------------------------------------------------------',
        '[   12.000003] ',
        '[   12.000004] 0xffff888100a2c010-0xffff888100a2c010 @offset=16. First byte 0x6a instead of 0x6b',
        '[   13.000000] BUG kmalloc-64 (Tainted: G    B            ): Object already free',
        '[   14.000000] a bad pmd is not a report unless the kernel prints it so',
    ])
    ss = splat.scan(text)
    assert kinds(ss) == ['bad-pgtable', 'bad-swap', 'slub', 'slub']
    assert ss[2].line == 4      # from the rule above the title
    assert ss[0].title.startswith('mm/pgtable-generic.c:53: bad pmd')


def test_dropped_console_messages_are_counted():
    text = ('[    5.0] ** 12 printk messages dropped **\n[    6.0] x\n'
            '[    7.0] ** 3 printk messages dropped **\n')
    assert splat.dropped(text) == 15
    assert splat.dropped('[    1.0] hello\n') == 0


def test_collect_scans_the_dmesg_when_the_guest_wrote_it(tmp_path):
    """The console shows loglevel<5 and may drop messages; the dmesg the
    guest dumps after its plan has all of it (a hung task's stack is INFO)."""
    from lab import guest
    hung = (DATA / 'hung_task.log').read_text()
    (tmp_path / 'console.log').write_text('[    1.0] ** 40 printk messages dropped **\n')
    (tmp_path / 'results.txt').write_text(
        'PTLAB-BOOT x\nPTLAB-DMESG\n' + hung + 'PTLAB-DMESG-END\nPTLAB-DONE\n')
    out = guest.collect(tmp_path)
    assert out.log == tmp_path / 'dmesg.txt' and out.dropped == 40
    assert kinds(out.splats) == kinds(splat.scan(hung)) and out.splats
    # no dmesg (the guest died): the console is what there is
    (tmp_path / 'results.txt').write_text('PTLAB-BOOT x\nPTLAB-DMESG\n[ 1.0] cut')
    (tmp_path / 'console.log').write_text(hung)
    out = guest.collect(tmp_path)
    assert out.log == tmp_path / 'console.log' and out.splats
