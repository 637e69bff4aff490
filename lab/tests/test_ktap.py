from pathlib import Path

from lab import ktap

DATA = Path(__file__).parent / 'data'


def load(name):
    return ktap.parse((DATA / name).read_text().splitlines())


def statuses(res):
    return [(c.name, c.status) for c in res.cases]


def test_cow_xfail_skip_and_totals():
    res = load('tap_cow.txt')
    assert res.planned == 12
    assert res.problems == []
    assert res.totals_line.startswith('# Totals: pass:5 fail:1')
    assert len(res.cases) == 12
    c = res.cases
    assert (c[0].name, c[0].status) == ('No leak from parent into child', 'pass')
    assert c[0].context == '[RUN] Basic COW after fork() ... with base page'
    assert (c[1].name, c[1].status) == ('MADV_PAGEOUT did not work, is swap enabled?', 'skip')
    assert c[1].detail == 'MADV_PAGEOUT did not work, is swap enabled?'
    assert (c[4].name, c[4].status, c[4].detail) == (
        'Leak from parent into child', 'xfail', 'Leak from parent into child')
    assert c[8].status == 'fail'
    assert c[8].context.endswith('with PTE-mapped THP (2048 kB)')


def test_unique_names():
    names = [n for n, _ in ktap.unique_names(load('tap_cow.txt').cases)]
    assert len(set(names)) == len(names)
    # keyed by the [RUN] line: the same whether the case passes, fails or skips
    assert names[0] == '[RUN] Basic COW after fork() ... with base page'
    assert names[1] == '[RUN] Basic COW after fork() ... with swapped out base page'
    plain = [n for n, _ in ktap.unique_names(load('tap_crash.txt').cases)]
    assert len(set(plain)) == len(plain)


def test_plain_uffd_format():
    res = ktap.parse_uffd((DATA / 'uffd_unit_tests.txt').read_text())
    assert len(res.cases) > 50
    assert res.cases[0].name == 'UFFDIO_API (with syscall)' and res.cases[0].status == 'pass'
    assert all(c.status in ('pass', 'skip') for c in res.cases)
    cut = ktap.parse_uffd('Testing a... done\nTesting b... failed [reason: x]\nTesting c... ')
    assert [(c.name, c.status) for c in cut.cases] == [('a', 'pass'), ('b', 'fail'),
                                                       ('c', 'error')]
    assert cut.cases[1].detail == 'x'


def test_crash_midway():
    res = load('tap_crash.txt')
    assert res.planned == 10
    assert [c.status for c in res.cases] == ['pass'] * 4 + ['error']
    miss = res.cases[-1]
    assert miss.name == "<missing 6 cases after '[RUN] test_prot_write #3'>"
    assert 'planned 10 cases, saw 4' in res.problems
    assert res.totals_line is None


def test_missing_name_uses_unique_name():
    res = ktap.parse(['1..3', 'ok 1 a', 'ok 2 a'])
    assert res.cases[-1].name == "<missing 1 cases after 'a #2'>"
    res = ktap.parse(['TAP version 13', '1..2'])
    assert statuses(res) == [('<missing 2 cases>', 'error')]


def test_harness():
    res = load('tap_harness.txt')
    assert res.problems == []
    assert statuses(res) == [
        ('global.check_expand', 'pass'),
        ('global.check_file_mmap', 'pass'),
        ('hmm.hmm_device_private.open_close', 'skip'),
        ('hmm.hmm_device_private.anon_read', 'fail'),
        ('hmm2.hmm2_device_private.migrate_mixed', 'xpass'),
        ('hmm2.hmm2_device_private.double_map', 'xfail'),
    ]
    assert res.cases[2].detail == 'DEVICE_COHERENT not available'


def test_bail_out():
    res = load('tap_bailout.txt')
    assert statuses(res) == [('Test test_simple', 'pass'), ('<bail out>', 'error')]
    assert res.cases[1].detail == 'mmap failed: Cannot allocate memory (12)'
    assert 'bail out: mmap failed: Cannot allocate memory (12)' in res.problems
    assert 'planned 4 cases, saw 1' in res.problems


def test_directives():
    res = ktap.parse('''KTAP version 1
1..9
ok 1 - dash name
ok 2 name # skip lower case reason
not ok 3 known broken # TODO not fixed yet
ok 4 fixed # TODO
not ok 5 # error something broke
ok 6 # SKIP
not ok 7 selftests: mm: cow # TIMEOUT 180 seconds
not ok 8 selftests: mm: run_vmtests.sh # exit=1
ok 9 harness.case #  diagnostic text
''')
    assert res.problems == []
    assert [(c.name, c.status, c.detail) for c in res.cases] == [
        ('dash name', 'pass', ''),
        ('name', 'skip', 'lower case reason'),
        ('known broken', 'xfail', 'not fixed yet'),
        ('fixed', 'xpass', ''),
        ('something broke', 'error', 'something broke'),
        ('<unnamed 6>', 'skip', ''),
        ('selftests: mm: cow', 'fail', 'TIMEOUT 180 seconds'),
        ('selftests: mm: run_vmtests.sh', 'fail', 'exit=1'),
        ('harness.case', 'pass', 'diagnostic text'),
    ]


def test_whole_binary_skipped():
    res = ktap.parse(['TAP version 13', '1..0 # SKIP Test requires root'])
    assert res.planned == 0
    assert statuses(res) == [('Test requires root', 'skip')]
    assert res.problems == []


def test_console_noise_cr_and_prefix():
    lines = [
        '/ # ./mremap_test\r',
        'guest| TAP version 13\r',
        'guest| 1..3\r',
        'guest| # [RUN] mremap\r',
        '[   12.000001] random: crng init done\r',
        'guest| ok 1 mremap expand\r',
        'guest| # ok 9 nested result is a diagnostic\r',
        '\x1b[0mguest| not ok 2 mremap shrink\r',
        'garbage \x00 line',
        'guest| ok 3 # SKIP no THP\r',
        'guest| # Totals: pass:1 fail:1 xfail:0 xpass:0 skip:1 error:0\r',
    ]
    res = ktap.parse(lines)
    assert res.problems == []
    assert statuses(res) == [('mremap expand', 'pass'), ('mremap shrink', 'fail'),
                             ('no THP', 'skip')]
    assert res.totals_line == '# Totals: pass:1 fail:1 xfail:0 xpass:0 skip:1 error:0'


def test_nested_runner_output_only_top_level():
    res = ktap.parse('''TAP version 13
1..2
# timeout set to 180
# selftests: mm: cow
# TAP version 13
# 1..3
# ok 1 a
# not ok 2 b
# ok 3 c
# # Totals: pass:2 fail:1 xfail:0 xpass:0 skip:0 error:0
not ok 1 selftests: mm: cow # exit=1
ok 2 selftests: mm: gup_test
''')
    assert statuses(res) == [('selftests: mm: cow', 'fail'), ('selftests: mm: gup_test', 'pass')]
    assert res.totals_line is None


def test_no_header_uses_plan():
    # KSFT_TAP_LEVEL set: no "TAP version" line
    res = ktap.parse(['some noise', '1..1', 'ok 1 works'])
    assert statuses(res) == [('works', 'pass')]


def test_no_tap_output():
    res = ktap.parse(['hello', 'world'])
    assert res.cases == [] and res.planned is None
    assert res.problems == ['no TAP output']
    assert ktap.parse([]).problems == ['no TAP output']


def test_inconsistencies_reported():
    res = ktap.parse(['1..2', 'ok 1 a', 'ok 3 b',
                      '# Totals: pass:1 fail:0 xfail:0 xpass:0 skip:0 error:0'])
    assert 'expected case 2, got 3' in res.problems
    assert 'totals say pass:1, saw 2' in res.problems


def test_plain_khugepaged_format():
    res = ktap.parse_steps((DATA / 'khugepaged.txt').read_text().splitlines())
    assert len(res.cases) > 60 and all(c.status == 'pass' for c in res.cases)
    names = [n for n, _ in ktap.unique_names(res.cases)]
    assert 'collapse_full (madvise:anon): Collapse multiple fully populated PTE table' in names
    bad = ktap.parse_steps(['Run test: x (madvise:anon)', 'Step one... \x1b[31mFail\x1b[0m',
                            'Step two... \x1b[33mSkip\x1b[0m'])
    assert [(c.name, c.status) for c in bad.cases] == [('x (madvise:anon): Step one', 'fail'),
                                                      ('x (madvise:anon): Step two', 'skip')]


def test_text_before_the_header_does_not_hide_failures():
    res = ktap.parse(['xyz TAP version 13', '1..2', 'not ok 1 a', 'not ok 2 b'])
    assert statuses(res) == [('a', 'fail'), ('b', 'fail')]
    # a prefix that every line carries is still stripped
    res = ktap.parse(['  TAP version 13', '  1..1', '  not ok 1 a'])
    assert statuses(res) == [('a', 'fail')]


def test_inconsistent_stream_is_an_error_case():
    gap = ktap.parse(['TAP version 13', '1..3', 'ok 1 a', 'ok 3 c', 'ok 4 d'])
    assert gap.cases[-1].status == 'error'
    assert gap.cases[-1].name.startswith('<inconsistent TAP: expected case 2, got 3')
    totals = ktap.parse(['TAP version 13', '1..1', 'ok 1 a',
                         '# Totals: pass:0 fail:1 xfail:0 xpass:0 skip:0 error:0'])
    assert [c.status for c in totals.cases] == ['pass', 'error']
    assert 'totals say pass:0, saw 1' in totals.cases[-1].detail
    twice = ktap.parse(['TAP version 13', '1..1', '1..1', 'ok 1 a'])
    assert twice.cases[-1].name.startswith('<inconsistent TAP: duplicate plan')
    assert ktap.parse(['TAP version 13', '1..1', 'ok 1 a']).problems == []
