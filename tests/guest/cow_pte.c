// SPDX-License-Identifier: GPL-2.0
/*
 * COW page tables at fork (CONFIG_COW_PTE).
 *
 * The switches: vm.cow_pte takes 0, 1 (default) and 2, nothing else;
 * PR_SET_COW_PTE takes 0 or 1 with zero arguments after it, PR_GET_COW_PTE
 * only zeros; fork inherits the flag, exec drops it.
 *
 * The scenarios of docs/cow-pte.md, data checked page by page
 * in every process: each page carries a tag naming who wrote it last, and
 * every process checks every page it can see against what it must see.
 * On a kernel with the feature, the vmstat counters prove the tables were
 * shared and broken: a scenario that shared nothing checked nothing.
 *
 * Allocation failures: with fault injection (CONFIG_FAULT_INJECTION, the
 * debug profile), /proc/thread-self/fail-nth makes the break's allocations
 * fail one by one (fail_cow_pte): each syscall that breaks must fail with
 * ENOMEM and leave nothing done, and a copy given up halfway must give
 * back what it took.  Each such test checks that the failure it set up
 * was injected (fail-nth reads 0 after), so it cannot pass without it.
 */
#include <errno.h>
#include <fcntl.h>
#include <numaif.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/swap.h>
#include <sys/sysinfo.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kselftest_harness.h"

/*
 * The harness gives each TEST() 30 s.  With three guests on the 2-core
 * host (session 25), this program ran 3x its time alone, and
 * migration_and_reclaim_change_shared_tables and
 * shared_table_moved_by_mremap_changes_in_place passed that limit.
 */
#undef TEST_TIMEOUT_DEFAULT
#define TEST_TIMEOUT_DEFAULT	120
#include "guest_util.h"

#ifndef PR_SET_COW_PTE
#define PR_SET_COW_PTE	0x43505445
#define PR_GET_COW_PTE	0x43505446
#endif


/* The kernel command line holds @s (a sysctl set at boot, say) */
static bool cmdline_has(const char *s)
{
	char line[4096] = "";
	FILE *f = fopen("/proc/cmdline", "r");

	if (f) {
		if (!fgets(line, sizeof(line), f))
			line[0] = 0;
		fclose(f);
	}
	return strstr(line, s);
}

/* The kernel has COW page tables and vm.cow_pte does not turn them off */
static bool cow_pte_on(void)
{
	char val[32];

	return !read_knob(COW_PTE_SYSCTL, val, sizeof(val)) &&
	       strcmp(val, "0");
}

static int get_flag(void)
{
	return prctl(PR_GET_COW_PTE, 0, 0, 0, 0);
}

TEST(sysctl_takes_0_1_2)
{
	static const char * const bad[] = { "3\n", "-1\n", "abc\n" };
	char before[32], val[32];

	if (!switch_present(COW_PTE_SYSCTL))
		SKIP(return, "no %s (vanilla kernel?)", COW_PTE_SYSCTL);
	ASSERT_EQ(0, read_knob(COW_PTE_SYSCTL, before, sizeof(before)));
	if (!cmdline_has("sysctl.vm.cow_pte="))
		EXPECT_STREQ("1", before) TH_LOG("opt-in by default");
	for (int v = 0; v <= 2; v++) {
		char line[8], want[8];

		snprintf(line, sizeof(line), "%d\n", v);
		snprintf(want, sizeof(want), "%d", v);
		EXPECT_EQ(0, write_knob(COW_PTE_SYSCTL, line));
		ASSERT_EQ(0, read_knob(COW_PTE_SYSCTL, val, sizeof(val)));
		EXPECT_STREQ(want, val);
	}
	EXPECT_EQ(0, write_knob(COW_PTE_SYSCTL, before));
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		EXPECT_EQ(-EINVAL, write_knob(COW_PTE_SYSCTL, bad[i]))
			TH_LOG("writing %.*s", (int)strlen(bad[i]) - 1, bad[i]);
		ASSERT_EQ(0, read_knob(COW_PTE_SYSCTL, val, sizeof(val)));
		EXPECT_STREQ(before, val) TH_LOG("a rejected write changed it");
	}
}

TEST(prctl_rejects_bad_arguments)
{
	if (!switch_present(COW_PTE_SYSCTL))
		SKIP(return, "no %s (vanilla kernel?)", COW_PTE_SYSCTL);
	EXPECT_EQ(0, get_flag()) TH_LOG("off until asked for");
	EXPECT_EQ(-1, prctl(PR_SET_COW_PTE, 2, 0, 0, 0));
	EXPECT_EQ(EINVAL, errno);
	for (int arg = 3; arg <= 5; arg++) {
		unsigned long a[6] = { 0, 1, 0, 0, 0, 0 };

		a[arg - 1] = 1;
		EXPECT_EQ(-1, prctl(PR_SET_COW_PTE, a[1], a[2], a[3], a[4]))
			TH_LOG("SET with arg%d non-zero", arg);
		EXPECT_EQ(EINVAL, errno);
	}
	EXPECT_EQ(-1, prctl(PR_GET_COW_PTE, 1, 0, 0, 0));
	EXPECT_EQ(EINVAL, errno);
	EXPECT_EQ(0, get_flag()) TH_LOG("a rejected SET changed the flag");
	ASSERT_EQ(0, prctl(PR_SET_COW_PTE, 1, 0, 0, 0));
	EXPECT_EQ(1, get_flag());
	ASSERT_EQ(0, prctl(PR_SET_COW_PTE, 1, 0, 0, 0)) TH_LOG("idempotent");
	ASSERT_EQ(0, prctl(PR_SET_COW_PTE, 0, 0, 0, 0));
	EXPECT_EQ(0, get_flag());
}

/* The flag in a child after fork, and after the child execs itself */
TEST(fork_inherits_exec_drops)
{
	int status;
	pid_t pid;

	if (!switch_present(COW_PTE_SYSCTL))
		SKIP(return, "no %s (vanilla kernel?)", COW_PTE_SYSCTL);
	ASSERT_EQ(0, prctl(PR_SET_COW_PTE, 1, 0, 0, 0));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		if (get_flag() != 1)
			_exit(10);
		execl("/proc/self/exe", "cow_pte", "--print-flag", NULL);
		_exit(11);
	}
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	ASSERT_TRUE(WIFEXITED(status));
	EXPECT_NE(10, WEXITSTATUS(status)) TH_LOG("fork did not inherit the flag");
	EXPECT_NE(11, WEXITSTATUS(status)) TH_LOG("exec failed");
	EXPECT_EQ(0, WEXITSTATUS(status)) TH_LOG("exec kept the flag");
	ASSERT_EQ(0, prctl(PR_SET_COW_PTE, 0, 0, 0, 0));
}

/* --- the scenarios ---------------------------------------------------- */

#define TABLES		8			/* PTE tables of an area */
#define AREA		(TABLES * SZ_2M)
#define PAGES		(AREA / PAGE_SIZE)
#define PER_TABLE	(SZ_2M / PAGE_SIZE)

/* The tag of page @i written by writer @who (1: the first parent) */
static unsigned long tag(int who, unsigned long i)
{
	return (unsigned long)who << 32 | i;
}

static void fill(char *p, unsigned long first, unsigned long n, int who)
{
	for (unsigned long i = first; i < first + n; i++)
		write_tag(p + i * PAGE_SIZE, tag(who, i));
}

/* Pages of [first, first + n) whose tag is not @who's: 0 when all are */
static unsigned long count_bad(char *p, unsigned long first, unsigned long n,
			       int who)
{
	unsigned long bad = 0;

	for (unsigned long i = first; i < first + n; i++) {
		char *page = p + i * PAGE_SIZE;

		if (load_word(first_word(page)) != tag(who, i) ||
		    load_word(last_word(page)) != tag(who, i))
			bad++;
	}
	return bad;
}

/* Pages of [first, first + n) that read anything but zeros */
static unsigned long count_nonzero(char *p, unsigned long first,
				   unsigned long n)
{
	unsigned long bad = 0;

	for (unsigned long i = first; i < first + n; i++)
		if (load_word(first_word(p + i * PAGE_SIZE)) ||
		    load_word(last_word(p + i * PAGE_SIZE)))
			bad++;
	return bad;
}

enum { SHARE, BREAK, REUSE, ADOPT, DROP, NR_COUNTERS };
static const char * const counter_names[NR_COUNTERS] = {
	"cow_pte_share", "cow_pte_break", "cow_pte_reuse", "cow_pte_adopt",
	"cow_pte_drop",
};

struct counters {
	long v[NR_COUNTERS];
};

static void read_counters(struct counters *c)
{
	for (int i = 0; i < NR_COUNTERS; i++)
		c->v[i] = vmstat(counter_names[i]);
}

/* How much each counter moved since @c, logged */
static void counters_since(struct __test_metadata *_metadata,
			   const struct counters *c, struct counters *delta)
{
	struct counters now;

	read_counters(&now);
	for (int i = 0; i < NR_COUNTERS; i++)
		delta->v[i] = now.v[i] - c->v[i];
	TH_LOG("share %ld break %ld reuse %ld adopt %ld drop %ld",
	       delta->v[SHARE], delta->v[BREAK], delta->v[REUSE],
	       delta->v[ADOPT], delta->v[DROP]);
}

/*
 * A pipe each way between a process and its child: the one side steps,
 * the other waits for it.  A lost peer reads as an exit of the waiter.
 */
struct chan {
	int down[2], up[2];
};

static int chan_open(struct chan *ch)
{
	return pipe(ch->down) || pipe(ch->up) ? -1 : 0;
}

static void chan_put(int fd)
{
	if (write(fd, "x", 1) != 1)
		_exit(100);
}

/* In the child: let go of the parent's ends, so that a lost parent reads as EOF */
static void chan_child(struct chan *ch)
{
	close(ch->down[1]);
	close(ch->up[0]);
}

static void chan_get(int fd)
{
	char c;

	if (read(fd, &c, 1) != 1)
		_exit(101);
}

/* A result from a process that is not our child (an orphan) */
static void chan_send(int fd, int code)
{
	unsigned char c = code;

	if (write(fd, &c, 1) != 1)
		_exit(100);
}

/* What chan_send() sent, or -1 if every writer is gone */
static int chan_recv(int fd)
{
	unsigned char c;

	return read(fd, &c, 1) == 1 ? c : -1;
}

/* The exit code of child @pid (-1: any child), -1 if it did not exit */
static int reap(pid_t pid)
{
	int status;

	if (waitpid(pid, &status, 0) <= 0 || !WIFEXITED(status))
		return -1;
	return WEXITSTATUS(status);
}

struct scen {
	char *p;
	bool feature;		/* the kernel shares tables at fork now */
	struct counters before;
	long pagetables;
};

/* A filled area, the process opted in, the counters before its fork */
static void scen_setup(struct __test_metadata *_metadata, struct scen *s)
{
	s->feature = cow_pte_on();
	s->p = map_aligned(AREA, SZ_2M, PROT_READ | PROT_WRITE);
	ASSERT_NE(NULL, s->p);
	ASSERT_EQ(0, madvise(s->p, AREA, MADV_NOHUGEPAGE));
	fill(s->p, 0, PAGES, 1);
	if (s->feature)
		ASSERT_EQ(0, prctl(PR_SET_COW_PTE, 1, 0, 0, 0));
	s->pagetables = pagetables_kb();
	read_counters(&s->before);
}

/*
 * After every process of the scenario is gone but this one: what the
 * counters say, and page-table memory back where it was (RCU frees
 * tables late: wait up to a second).
 */
static void scen_check(struct __test_metadata *_metadata, struct scen *s,
		       long min_shares)
{
	struct counters d;
	long pt = pagetables_kb();

	for (int i = 0; i < 100 && pt > s->pagetables; i++) {
		usleep(10 * 1000);
		pt = pagetables_kb();
	}
	counters_since(_metadata, &s->before, &d);
	TH_LOG("PageTables %ld kB before the fork, %ld after", s->pagetables,
	       pt);
	EXPECT_LE(pt, s->pagetables + 8);
	if (s->feature)
		EXPECT_LE(min_shares, d.v[SHARE]) TH_LOG("nothing was shared");
}

/*
 * 1. Writes stay private both ways: the child writes two tables, the
 * parent two others after the child's; each sees its own and the other
 * side's never, and the tables nobody wrote stay the first parent's.
 */
TEST(writes_private_both_ways)
{
	struct scen s;
	struct chan ch;
	pid_t pid;

	scen_setup(_metadata, &s);
	ASSERT_EQ(0, chan_open(&ch));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		if (count_bad(s.p, 0, PAGES, 1))
			_exit(1);
		fill(s.p, 0, 2 * PER_TABLE, 2);
		if (count_bad(s.p, 2 * PER_TABLE, 6 * PER_TABLE, 1))
			_exit(2);
		chan_put(ch.up[1]);
		chan_get(ch.down[0]);
		if (count_bad(s.p, 0, 2 * PER_TABLE, 2) ||
		    count_bad(s.p, 2 * PER_TABLE, 6 * PER_TABLE, 1))
			_exit(3);
		_exit(0);
	}
	chan_get(ch.up[0]);
	EXPECT_EQ(0, count_bad(s.p, 0, PAGES, 1)) TH_LOG("the child's writes show");
	fill(s.p, 6 * PER_TABLE, 2 * PER_TABLE, 3);
	chan_put(ch.down[1]);
	EXPECT_EQ(0, reap(pid)) TH_LOG("1: child saw other data; 2, 3: its writes leaked");
	EXPECT_EQ(0, count_bad(s.p, 0, 6 * PER_TABLE, 1));
	EXPECT_EQ(0, count_bad(s.p, 6 * PER_TABLE, 2 * PER_TABLE, 3));
	/* the tables only the parent holds now: private again, in place */
	fill(s.p, 0, PAGES, 4);
	EXPECT_EQ(0, count_bad(s.p, 0, PAGES, 4));
	ASSERT_EQ(0, munmap(s.p, AREA));
	scen_check(_metadata, &s, TABLES);
}

/* 2. A child that exits without writing: its tables are dropped, not copied */
TEST(child_exits_without_writing)
{
	struct counters d;
	struct scen s;
	pid_t pid;

	scen_setup(_metadata, &s);
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid)
		_exit(count_bad(s.p, 0, PAGES, 1) ? 1 : 0);
	EXPECT_EQ(0, reap(pid));
	fill(s.p, 0, PAGES, 2);
	EXPECT_EQ(0, count_bad(s.p, 0, PAGES, 2));
	counters_since(_metadata, &s.before, &d);
	if (s.feature) {
		EXPECT_LE(TABLES, d.v[DROP]) TH_LOG("the child's exit copied or kept tables");
		EXPECT_LE(TABLES, d.v[REUSE]) TH_LOG("the parent's writes copied tables");
	}
	ASSERT_EQ(0, munmap(s.p, AREA));
	scen_check(_metadata, &s, TABLES);
}

/*
 * 3. The parent exits first: the child, last holder of tables it does not
 * own, adopts them (their RSS, their pages no longer exclusive) and writes.
 */
TEST(parent_exits_first)
{
	struct scen s;
	struct chan ch;
	pid_t mid;

	s.feature = cow_pte_on();
	ASSERT_EQ(0, chan_open(&ch));
	read_counters(&s.before);
	s.pagetables = pagetables_kb();
	/* the orphan becomes our child: its exit is over when we reap it */
	ASSERT_EQ(0, prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0));
	mid = fork();
	ASSERT_LE(0, mid);
	if (!mid) {
		/* the parent of the scenario, which exits before its child */
		struct scen m;
		pid_t pid;

		scen_setup(_metadata, &m);
		pid = fork();
		if (pid < 0)
			_exit(1);
		if (!pid) {
			int code = 0;

			chan_get(ch.down[0]);	/* its parent is gone */
			if (count_bad(m.p, 0, PAGES, 1))
				code = 2;
			fill(m.p, 0, PAGES, 2);
			if (!code && count_bad(m.p, 0, PAGES, 2))
				code = 3;
			/* what it maps is its own: VmRSS counts every page */
			if (!code && status_kb("VmRSS:") < (long)(AREA >> 10))
				code = 4;
			chan_send(ch.up[1], code);
			_exit(0);
		}
		_exit(0);
	}
	close(ch.up[1]);
	EXPECT_EQ(0, reap(mid));
	chan_put(ch.down[1]);
	EXPECT_EQ(0, chan_recv(ch.up[0]))
		TH_LOG("the orphan: 2 saw other data, 3 lost its writes, 4 VmRSS short, -1 died");
	EXPECT_EQ(0, reap(-1)) TH_LOG("the orphan was not ours to reap");
	scen_check(_metadata, &s, TABLES);
	if (s.feature) {
		struct counters d;

		counters_since(_metadata, &s.before, &d);
		EXPECT_LE(TABLES, d.v[ADOPT]) TH_LOG("the orphan did not adopt its tables");
	}
}

/*
 * 4. Three holders: a grandchild shares what its parent shares with its
 * own parent.  Each writes its own tables; the middle one exits first.
 */
TEST(grandchildren)
{
	struct scen s;
	struct chan b;
	pid_t mid;

	scen_setup(_metadata, &s);
	ASSERT_EQ(0, chan_open(&b));
	/* the orphaned grandchild becomes our child: reaped, its tables are gone */
	ASSERT_EQ(0, prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0));
	mid = fork();
	ASSERT_LE(0, mid);
	if (!mid) {
		pid_t pid = fork();

		if (pid < 0)
			_exit(1);
		if (!pid) {
			chan_get(b.down[0]);	/* the middle one is gone */
			if (count_bad(s.p, 0, PAGES, 1)) {
				chan_send(b.up[1], 2);
				_exit(0);
			}
			fill(s.p, 6 * PER_TABLE, 2 * PER_TABLE, 3);
			chan_send(b.up[1], count_bad(s.p, 6 * PER_TABLE,
						     2 * PER_TABLE, 3) ? 3 : 0);
			_exit(0);
		}
		/* the grandchild forked before these writes */
		fill(s.p, 4 * PER_TABLE, 2 * PER_TABLE, 2);
		_exit(count_bad(s.p, 0, 4 * PER_TABLE, 1) ? 4 : 0);
	}
	close(b.up[1]);
	EXPECT_EQ(0, reap(mid)) TH_LOG("the middle process saw other data");
	EXPECT_EQ(0, count_bad(s.p, 0, PAGES, 1));
	chan_put(b.down[1]);
	EXPECT_EQ(0, chan_recv(b.up[0]))
		TH_LOG("the grandchild: 2 saw other data, 3 lost its writes, -1 died");
	EXPECT_EQ(0, reap(-1)) TH_LOG("the grandchild was not ours to reap");
	EXPECT_EQ(0, count_bad(s.p, 0, PAGES, 1)) TH_LOG("a descendant's writes show");
	fill(s.p, 0, PAGES, 5);
	ASSERT_EQ(0, munmap(s.p, AREA));
	scen_check(_metadata, &s, 2 * TABLES);
}

/*
 * 5. Neighbours inside one 2 MiB that fork does not copy as it is
 * (DONTFORK: absent in the child; WIPEONFORK: zeros there): the table
 * they lie in is copied, the others shared, and the data is right in both.
 */
TEST(dontfork_wipeonfork_neighbours)
{
	const unsigned long hole = 16, wipe = 32;	/* pages of table 0 */
	unsigned char vec;
	struct scen s;
	pid_t pid;

	scen_setup(_metadata, &s);
	ASSERT_EQ(0, madvise(s.p + hole * PAGE_SIZE, PAGE_SIZE, MADV_DONTFORK));
	ASSERT_EQ(0, madvise(s.p + wipe * PAGE_SIZE, 4 * PAGE_SIZE,
			     MADV_WIPEONFORK));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		if (!mincore(s.p + hole * PAGE_SIZE, PAGE_SIZE, &vec) ||
		    errno != ENOMEM)
			_exit(1);
		if (count_nonzero(s.p, wipe, 4))
			_exit(2);
		if (count_bad(s.p, 0, hole, 1) ||
		    count_bad(s.p, hole + 1, wipe - hole - 1, 1) ||
		    count_bad(s.p, wipe + 4, PAGES - wipe - 4, 1))
			_exit(3);
		fill(s.p, 0, hole, 2);
		fill(s.p, PER_TABLE, PER_TABLE, 2);
		_exit(0);
	}
	EXPECT_EQ(0, reap(pid)) TH_LOG("1: DONTFORK page mapped, 2: WIPEONFORK not wiped, 3: data");
	EXPECT_EQ(0, count_bad(s.p, 0, PAGES, 1));
	ASSERT_EQ(0, munmap(s.p, AREA));
	scen_check(_metadata, &s, TABLES - 1);
}

/*
 * 6. The child changes part of a shared range: MADV_DONTNEED of half a
 * table, munmap of half another, mprotect of a third, mremap of two whole
 * tables elsewhere; the parent's data never moves.
 */
TEST(child_changes_part_of_a_range)
{
	const unsigned long half = PER_TABLE / 2;
	struct scen s;
	pid_t pid;

	scen_setup(_metadata, &s);
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		char *to, *q;

		if (madvise(s.p + half * PAGE_SIZE, half * PAGE_SIZE, MADV_DONTNEED))
			_exit(1);
		if (count_nonzero(s.p, half, half) || count_bad(s.p, 0, half, 1))
			_exit(2);
		if (munmap(s.p + (PER_TABLE + half) * PAGE_SIZE, half * PAGE_SIZE))
			_exit(3);
		if (count_bad(s.p, PER_TABLE, half, 1))
			_exit(4);
		if (mprotect(s.p + 2 * SZ_2M, SZ_2M, PROT_READ) ||
		    count_bad(s.p, 2 * PER_TABLE, PER_TABLE, 1))
			_exit(5);
		to = map_aligned(2 * SZ_2M, SZ_2M, PROT_NONE);
		if (!to)
			_exit(6);
		q = mremap(s.p + 4 * SZ_2M, 2 * SZ_2M, 2 * SZ_2M,
			   MREMAP_MAYMOVE | MREMAP_FIXED, to);
		if (q != to)
			_exit(7);
		for (unsigned long i = 0; i < 2 * PER_TABLE; i++)
			if (load_word(first_word(q + i * PAGE_SIZE)) !=
			    tag(1, 4 * PER_TABLE + i))
				_exit(8);
		fill(s.p, 0, half, 2);
		fill(s.p, 6 * PER_TABLE, 2 * PER_TABLE, 2);
		for (unsigned long i = 0; i < 2 * PER_TABLE; i++)
			write_tag(q + i * PAGE_SIZE, tag(2, i));
		_exit(0);
	}
	EXPECT_EQ(0, reap(pid)) TH_LOG("the child's step that failed: exit code");
	EXPECT_EQ(0, count_bad(s.p, 0, PAGES, 1));
	ASSERT_EQ(0, munmap(s.p, AREA));
	scen_check(_metadata, &s, TABLES);
}

/*
 * The swap devices of /proc/swaps: how many, the first one's path in @dev
 * (if it fits in @size).
 */
static int swap_devices(char *dev, size_t size)
{
	FILE *f = fopen("/proc/swaps", "r");
	char line[256];
	int n = 0;

	if (!f)
		return 0;
	/* a header, then a device per line: its path is the first field */
	if (fgets(line, sizeof(line), f))
		while (fgets(line, sizeof(line), f)) {
			line[strcspn(line, " \t")] = 0;
			if (!n && strlen(line) >= size)
				break;
			if (!n++)
				strcpy(dev, line);
		}
	fclose(f);
	return n;
}

/* The first swap device in @dev: false if there is none */
static bool swap_device(char *dev, size_t size)
{
	return swap_devices(dev, size) > 0;
}

/* 7. Swapped-out entries in a shared table, swapped in from either side */
TEST(swap_entries_either_side)
{
	char dev[128];
	struct scen s;
	pid_t pid;

	if (!swap_device(dev, sizeof(dev)))
		SKIP(return, "no swap");
	scen_setup(_metadata, &s);
	ASSERT_EQ(0, madvise(s.p, AREA, MADV_PAGEOUT));
	TH_LOG("%ld kB resident after PAGEOUT", status_kb("VmRSS:"));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		if (count_bad(s.p, 0, 4 * PER_TABLE, 1))
			_exit(1);
		fill(s.p, 0, 2 * PER_TABLE, 2);
		_exit(count_bad(s.p, 0, 2 * PER_TABLE, 2) ? 2 : 0);
	}
	EXPECT_EQ(0, count_bad(s.p, 4 * PER_TABLE, 4 * PER_TABLE, 1));
	EXPECT_EQ(0, reap(pid));
	EXPECT_EQ(0, count_bad(s.p, 0, PAGES, 1));
	ASSERT_EQ(0, munmap(s.p, AREA));
	scen_check(_metadata, &s, TABLES);
}

static void on_alarm(int sig)
{
}

/*
 * swapoff @dev, stopped by an alarm after @secs if it takes longer (0: no
 * alarm), then swapon @dev again if it went: 0, or swapoff's errno (EINTR:
 * it did not finish in time).
 */
static int swapoff_and_back(struct __test_metadata *_metadata,
			    const char *dev, unsigned int secs)
{
	struct sigaction sa = { .sa_handler = on_alarm };
	int ret, err;

	if (sigaction(SIGALRM, &sa, NULL))
		return errno;
	alarm(secs);
	ret = swapoff(dev);
	err = errno;
	alarm(0);
	if (ret)
		return err;
	EXPECT_EQ(0, swapon(dev, 0)) TH_LOG("swapon %s: %s", dev,
					     strerror(errno));
	return 0;
}

/*
 * 7b. swapoff finds swap entries in a table only a child holds: the parent
 * swapped the area out and forked (the child shares its tables and their
 * swap entries, reading none of them), then let go of the area.  swapoff
 * visits the mms of the swap users' list (mmlist); fork puts a child there
 * when it copies a swap entry, so a share must too, or swapoff never finds
 * the child's entries and retries until a signal (here, an alarm after
 * 15 s) stops it with EINTR.
 */
TEST(swapoff_finds_a_child_holding_swap_entries)
{
	struct chan ch;
	char dev[128];
	struct scen s;
	int err;
	pid_t pid;

	if (!swap_device(dev, sizeof(dev)))
		SKIP(return, "no swap");
	scen_setup(_metadata, &s);
	ASSERT_EQ(0, madvise(s.p, AREA, MADV_PAGEOUT));
	ASSERT_EQ(0, chan_open(&ch));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		chan_get(ch.down[0]);	/* the parent's swapoff is done */
		_exit(count_bad(s.p, 0, PAGES, 1) ? 1 : 0);
	}
	ASSERT_EQ(0, munmap(s.p, AREA));
	err = swapoff_and_back(_metadata, dev, 15);
	chan_put(ch.down[1]);
	EXPECT_EQ(0, err) TH_LOG("swapoff %s: %s", dev, strerror(err));
	EXPECT_EQ(0, reap(pid)) TH_LOG("the child's data changed");
	scen_check(_metadata, &s, TABLES);
}

#define CGROUP		CGROUP_ROOT "/ptlab_cow_pte"

/* The pages of [@p, @p + @n pages) not on @node (move_pages() asks) */
static unsigned long count_off_node(char *p, unsigned long n, int node)
{
	void **addrs = calloc(n, sizeof(*addrs));
	int *status = calloc(n, sizeof(*status));
	unsigned long off = n;

	if (addrs && status) {
		for (unsigned long i = 0; i < n; i++)
			addrs[i] = p + i * PAGE_SIZE;
		if (!move_pages(0, n, addrs, NULL, status, 0))
			for (off = 0; n--; )
				off += status[n] != node;
	}
	free(addrs);
	free(status);
	return off;
}

/*
 * Move [@p, @p + @n pages) to @node: the pages that did not get there.
 * MPOL_MF_MOVE_ALL: the pages of a shared table are mapped by its other
 * holders too, which MPOL_MF_MOVE leaves alone, as vanilla does pages that
 * fork copied (this runs as root, with CAP_SYS_NICE).
 */
static unsigned long move_to_node(char *p, unsigned long n, int node)
{
	void **addrs = calloc(n, sizeof(*addrs));
	int *nodes = calloc(n, sizeof(*nodes));
	int *status = calloc(n, sizeof(*status));
	unsigned long off = n;

	if (addrs && nodes && status) {
		for (unsigned long i = 0; i < n; i++) {
			addrs[i] = p + i * PAGE_SIZE;
			nodes[i] = node;
		}
		if (move_pages(0, n, addrs, nodes, status, MPOL_MF_MOVE_ALL) >= 0)
			for (off = 0; n--; )
				off += status[n] != node;
	}
	free(addrs);
	free(nodes);
	free(status);
	return off;
}

/*
 * What the tests of migration and reclaim in place need: two nodes, swap,
 * and this process in CGROUP (left with leave_memcg()).  NULL, or what is
 * missing.
 */
static const char *enter_migration_and_reclaim(void)
{
	char dev[128];

	if (access("/sys/devices/system/node/node1", F_OK))
		return "needs two NUMA nodes";
	if (!swap_device(dev, sizeof(dev)))
		return "no swap";
	if (!enter_memcg(CGROUP))
		return "no memory cgroup at " CGROUP;
	return NULL;
}

/* The node @p is not on (of two) */
static int other_node(char *p)
{
	return count_off_node(p, 1, 0) ? 0 : 1;
}

/*
 * 10. Migration and reclaim of a shared table's pages change the table in
 * place, for every holder at once.  The parent moves its pages to the
 * other node with move_pages() and the child finds its pages (the same)
 * there; memory.reclaim of their memcg swaps the pages out and both find
 * swap entries, and each counts them in its VmSwap, as after a fork that
 * copied the tables.  Each one's peak RSS (VmHWM) covers what it had when
 * its RSS fell: the tables and 8 MiB it locked after the fork (the rmap
 * walk changes the table through one holder's VMA, and every holder's
 * peak must be taken before its RSS falls).
 * Nobody writes, so nothing breaks until each reads its pages back: every
 * page checked on both sides, and a "Bad rss-counter" at exit would fail
 * the run.  (Before rmap walkers changed shared tables in place, the pages
 * stayed where they were, mapped.)
 */
#define HWM_EXTRA	(8 * SZ_1M)

/* @len bytes mapped and locked (so reclaim leaves them), or NULL */
static char *locked_area(unsigned long len)
{
	char *p = map_aligned(len, SZ_2M, PROT_READ | PROT_WRITE);

	if (p && mlock(p, len)) {
		munmap(p, len);
		return NULL;
	}
	return p;
}

TEST(migration_and_reclaim_change_shared_tables)
{
	const char *missing = enter_migration_and_reclaim();
	unsigned long off, swapped = 0;
	struct chan ch;
	struct scen s;
	char *pages;
	int node;
	pid_t pid;

	if (missing)
		SKIP(return, "%s", missing);
	scen_setup(_metadata, &s);
	pages = s.p;
	node = other_node(pages);
	ASSERT_EQ(0, chan_open(&ch));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		if (!locked_area(HWM_EXTRA))
			_exit(6);
		chan_get(ch.down[0]);
		chan_send(ch.up[1], count_off_node(pages, PAGES, node) ? 1 : 0);
		chan_get(ch.down[0]);
		swapped = count_pagemap(pages, PAGES, PM_SWAP);
		if (!swapped)
			_exit(2);
		if (labs(status_kb("VmSwap:") - (long)(swapped * PAGE_SIZE >> 10)) >
		    RSS_SLACK_KB)
			_exit(4);
		if (status_kb("VmHWM:") < (long)((AREA + HWM_EXTRA) >> 10) -
		    RSS_SLACK_KB)
			_exit(5);
		_exit(count_bad(pages, 0, PAGES, 1) ? 3 : 0);
	}

	ASSERT_NE(NULL, locked_area(HWM_EXTRA));
	off = move_to_node(pages, PAGES, node);
	EXPECT_EQ(0, off) TH_LOG("%lu of %lu pages not moved to node %d",
				 off, PAGES, node);
	chan_put(ch.down[1]);
	EXPECT_EQ(0, chan_recv(ch.up[0])) TH_LOG("the child's pages did not move");

	for (int i = 0; i < 20 && swapped < PAGES / 2; i++) {
		memcg_reclaim(CGROUP, "32M");
		swapped = count_pagemap(pages, PAGES, PM_SWAP);
	}
	TH_LOG("%lu of %lu pages swapped out, VmSwap %ld kB", swapped, PAGES,
	       status_kb("VmSwap:"));
	EXPECT_LE(PAGES / 2, swapped);
	EXPECT_GE(RSS_SLACK_KB, labs(status_kb("VmSwap:") -
				     (long)(swapped * PAGE_SIZE >> 10)));
	EXPECT_LE((long)((AREA + HWM_EXTRA) >> 10) - RSS_SLACK_KB,
		  status_kb("VmHWM:"));
	chan_put(ch.down[1]);
	EXPECT_EQ(0, reap(pid))
		TH_LOG("the child's step that failed: exit code (4: VmSwap, 5: VmHWM)");
	EXPECT_EQ(0, count_bad(pages, 0, PAGES, 1));
	leave_memcg(CGROUP);
	ASSERT_EQ(0, munmap(pages, AREA));
	scen_check(_metadata, &s, TABLES);
}

/*
 * 10b. A shared table that the child moved whole with mremap() (its PMD
 * moves, read-only, to the new address) is still one mapping, found by the
 * rmap through either holder's VMA at either address.  The parent migrates,
 * then reclaims, every page; the child finds the pages of the table it
 * moved, at their new address, on the new node and then swapped out, each
 * with the parent's data.
 */
TEST(shared_table_moved_by_mremap_changes_in_place)
{
	const char *missing = enter_migration_and_reclaim();
	const unsigned long first = 2 * PER_TABLE;	/* the table moved */
	unsigned long off, swapped = 0;
	struct chan ch;
	struct scen s;
	int node, bad;
	char *dst;
	pid_t pid;

	if (missing)
		SKIP(return, "%s", missing);
	scen_setup(_metadata, &s);
	dst = map_aligned(SZ_2M, SZ_2M, PROT_NONE);	/* where it goes */
	ASSERT_NE(NULL, dst);
	node = other_node(s.p);
	ASSERT_EQ(0, chan_open(&ch));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		char *q = mremap(s.p + first * PAGE_SIZE, SZ_2M, SZ_2M,
				 MREMAP_MAYMOVE | MREMAP_FIXED, dst);

		chan_send(ch.up[1], q == dst ? 0 : 1);
		chan_get(ch.down[0]);		/* migrated */
		chan_send(ch.up[1], count_off_node(dst, PER_TABLE, node) ? 2 : 0);
		chan_get(ch.down[0]);		/* reclaimed */
		if (count_pagemap(dst, PER_TABLE, PM_SWAP) < PER_TABLE / 2)
			_exit(3);
		for (unsigned long i = 0; i < PER_TABLE; i++)
			if (load_word(first_word(dst + i * PAGE_SIZE)) !=
			    tag(1, first + i))
				_exit(4);
		_exit(count_bad(s.p, 0, first, 1) ? 5 : 0);
	}
	ASSERT_EQ(0, chan_recv(ch.up[0])) TH_LOG("the child's mremap failed");

	off = move_to_node(s.p, PAGES, node);
	EXPECT_EQ(0, off) TH_LOG("%lu of %lu pages not moved to node %d",
				 off, PAGES, node);
	chan_put(ch.down[1]);
	bad = chan_recv(ch.up[0]);
	EXPECT_EQ(0, bad) TH_LOG("the pages the child moved are off node %d",
				 node);

	for (int i = 0; i < 20 && swapped < PER_TABLE / 2; i++) {
		memcg_reclaim(CGROUP, "32M");
		swapped = count_pagemap(s.p + first * PAGE_SIZE, PER_TABLE,
					PM_SWAP);
	}
	TH_LOG("%lu of %lu pages of the moved table swapped out", swapped,
	       PER_TABLE);
	EXPECT_LE(PER_TABLE / 2, swapped);
	chan_put(ch.down[1]);
	EXPECT_EQ(0, reap(pid)) TH_LOG("the child's step that failed: exit code");
	EXPECT_EQ(0, count_bad(s.p, 0, PAGES, 1));
	leave_memcg(CGROUP);
	ASSERT_EQ(0, munmap(dst, SZ_2M));
	ASSERT_EQ(0, munmap(s.p, AREA));
	scen_check(_metadata, &s, TABLES);
}

/*
 * 10c. swapoff copies only the shared tables it swaps entries in for
 * (vanilla allocates nothing there): a swapoff that swaps in a private
 * area of the parent (so that it walks the swap users' list, mmlist, where
 * the share put both holders) ends no share of the tables fork shared,
 * which hold no swap entry.  The counters are the whole system's: none
 * may move, except under the soak, where fewer than this test's TABLES
 * (the swapoff that broke every shared table ended 2 * TABLES) allow for
 * other processes' breaks meanwhile.
 */
TEST(swapoff_breaks_only_what_it_swaps_in)
{
	struct counters before, d;
	struct chan ch;
	char dev[128], *priv;
	struct scen s;
	int err;
	long ended;
	pid_t pid;

	if (swap_devices(dev, sizeof(dev)) != 1)
		SKIP(return, "needs exactly one swap device");
	scen_setup(_metadata, &s);
	if (!s.feature)
		SKIP(return, "no COW page tables on this kernel");
	ASSERT_EQ(0, chan_open(&ch));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		chan_child(&ch);
		chan_get(ch.down[0]);	/* the swapoff is done */
		_exit(count_bad(s.p, 0, PAGES, 1) ? 1 : 0);
	}
	priv = map_aligned(SZ_2M, SZ_2M, PROT_READ | PROT_WRITE);
	ASSERT_NE(NULL, priv);
	memset(priv, 0x5a, SZ_2M);
	ASSERT_EQ(0, madvise(priv, SZ_2M, MADV_PAGEOUT));
	EXPECT_LT(0, count_pagemap(priv, PER_TABLE, PM_SWAP))
		TH_LOG("nothing of the private area swapped out");
	read_counters(&before);
	err = swapoff_and_back(_metadata, dev, 0);
	EXPECT_EQ(0, err) TH_LOG("swapoff %s: %s", dev, strerror(err));
	counters_since(_metadata, &before, &d);
	ended = d.v[BREAK] + d.v[REUSE] + d.v[ADOPT];
	EXPECT_GT(in_soak() ? TABLES : 1, ended)
		TH_LOG("swapoff ended %ld shares of tables without swap entries",
		       ended);
	EXPECT_EQ(0x5a, priv[0]);
	EXPECT_EQ(0, memcmp(priv, priv + 1, SZ_2M - 1));
	chan_put(ch.down[1]);
	EXPECT_EQ(0, reap(pid)) TH_LOG("the child's data changed");
	ASSERT_EQ(0, munmap(priv, SZ_2M));
	ASSERT_EQ(0, munmap(s.p, AREA));
	scen_check(_metadata, &s, TABLES);
}

/*
 * 10d. swapoff after a swapoff emptied the swap users' list: a swapoff
 * that leaves no swap in use (any that succeeds, with one device) takes
 * every mm off it, the holders of shared tables too (they joined it
 * at fork).  Reclaim then swaps the shared pages out through one holder's
 * VMA and puts that mm back on the list, as vanilla does with each mm
 * whose entry it replaces: the other holder of the table must go back on
 * it too, or the next swapoff breaks the first one's share, swaps its copy
 * in, and never finds the other's entries: it retries until a signal (an
 * alarm after 30 s) stops it with EINTR.  Only the shared area's pages are
 * charged to CGROUP: the parent fills it there, and both sides run in the
 * root cgroup from the fork on, so that nothing else of theirs is swapped
 * out (which would put them back on the list on its own).  One swap device
 * only: the list is emptied when none has swap in use.
 */
TEST(swapoff_after_the_list_was_emptied)
{
	unsigned long swapped = 0;
	struct chan ch;
	char dev[128];
	struct scen s;
	int err;
	pid_t pid;

	if (swap_devices(dev, sizeof(dev)) != 1)
		SKIP(return, "needs exactly one swap device");
	if (!enter_memcg(CGROUP))
		SKIP(return, "no memory cgroup at " CGROUP);
	scen_setup(_metadata, &s);
	ASSERT_EQ(0, move_to_cgroup(CGROUP_ROOT));
	ASSERT_EQ(0, chan_open(&ch));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		chan_child(&ch);
		chan_get(ch.down[0]);	/* the second swapoff is done */
		_exit(count_bad(s.p, 0, PAGES, 1) ? 1 : 0);
	}
	err = swapoff_and_back(_metadata, dev, 0);
	ASSERT_EQ(0, err) TH_LOG("swapoff %s: %s", dev, strerror(err));
	for (int i = 0; i < 20 && swapped < PAGES / 2; i++) {
		memcg_reclaim(CGROUP, "32M");
		swapped = count_pagemap(s.p, PAGES, PM_SWAP);
	}
	TH_LOG("%lu of %lu pages swapped out", swapped, PAGES);
	EXPECT_LE(PAGES / 2, swapped);
	err = swapoff_and_back(_metadata, dev, 30);
	chan_put(ch.down[1]);
	EXPECT_EQ(0, err) TH_LOG("swapoff %s: %s", dev, strerror(err));
	EXPECT_EQ(0, reap(pid)) TH_LOG("the child's data changed");
	EXPECT_EQ(0, count_bad(s.p, 0, PAGES, 1));
	leave_memcg(CGROUP);
	ASSERT_EQ(0, munmap(s.p, AREA));
	scen_check(_metadata, &s, TABLES);
}

#define ZRAM_CONTROL	"/sys/class/zram-control/"

/* A new zram disk of @size ("1M"): its id, or -1 */
static int zram_add(const char *size)
{
	char id[16], path[64];
	int n;

	if (read_knob(ZRAM_CONTROL "hot_add", id, sizeof(id)))
		return -1;
	n = atoi(id);
	snprintf(path, sizeof(path), "/sys/block/zram%d/disksize", n);
	if (write_knob(path, size)) {
		snprintf(id, sizeof(id), "%d\n", n);
		write_knob(ZRAM_CONTROL "hot_remove", id);
		return -1;
	}
	return n;
}

static void zram_remove(int n)
{
	char id[16];

	snprintf(id, sizeof(id), "%d\n", n);
	write_knob(ZRAM_CONTROL "hot_remove", id);
}

/*
 * 11. O_DIRECT in and out of a shared table: the block layer pins the
 * pages (FOLL_PIN; FOLL_WRITE too for a read into memory), GUP-fast bails
 * on the read-only PMD and GUP-slow breaks the table first, so a read's
 * data lands in the parent's page and never in the child's, and a write
 * takes the parent's data.  A process that pinned pages then shares
 * nothing at its next fork (MMF_HAS_PINNED: a pinned page must stay
 * exclusive to it).
 */
TEST(o_direct_breaks_and_stops_sharing)
{
	char dev[64], buf[PAGE_SIZE] = "";
	struct counters before, d;
	struct chan ch;
	struct scen s;
	int fd, bfd, zram;
	pid_t pid;

	zram = zram_add("1M");
	if (zram < 0)
		SKIP(return, "no zram disk to add (%s)", ZRAM_CONTROL);
	snprintf(dev, sizeof(dev), "/dev/zram%d", zram);
	/* buffered I/O outside the area: a pin before the fork stops sharing */
	bfd = open(dev, O_RDWR);
	ASSERT_LE(0, bfd) TH_LOG("%s: %s", dev, strerror(errno));
	write_tag(buf, tag(3, 0));
	ASSERT_EQ(PAGE_SIZE, pwrite(bfd, buf, PAGE_SIZE, 0));
	ASSERT_EQ(0, fsync(bfd));
	fd = open(dev, O_RDWR | O_DIRECT);
	ASSERT_LE(0, fd) TH_LOG("%s: %s", dev, strerror(errno));

	scen_setup(_metadata, &s);
	ASSERT_EQ(0, chan_open(&ch));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		chan_get(ch.down[0]);
		_exit(count_bad(s.p, 0, PAGES, 1) ? 1 : 0);
	}
	/* the device's page 0 into page 5 of table 0 */
	ASSERT_EQ(PAGE_SIZE, pread(fd, s.p + 5 * PAGE_SIZE, PAGE_SIZE, 0));
	EXPECT_EQ(tag(3, 0), load_word(first_word(s.p + 5 * PAGE_SIZE)));
	/* page 0 of table 1 to the device's page 1, and back */
	ASSERT_EQ(PAGE_SIZE, pwrite(fd, s.p + PER_TABLE * PAGE_SIZE,
				    PAGE_SIZE, PAGE_SIZE));
	ASSERT_EQ(PAGE_SIZE, pread(bfd, buf, PAGE_SIZE, PAGE_SIZE));
	EXPECT_EQ(tag(1, PER_TABLE), load_word(first_word(buf)));
	EXPECT_EQ(tag(1, PER_TABLE), load_word(last_word(buf)));
	chan_put(ch.down[1]);
	EXPECT_EQ(0, reap(pid)) TH_LOG("the device's data reached the child");
	counters_since(_metadata, &s.before, &d);
	if (s.feature)
		EXPECT_LE(2, d.v[BREAK]) TH_LOG("the pins did not break");

	/* pinned once: the next fork copies every table */
	read_counters(&before);
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid)
		_exit(count_bad(s.p, PER_TABLE, PAGES - PER_TABLE, 1) ? 1 : 0);
	EXPECT_EQ(0, reap(pid));
	counters_since(_metadata, &before, &d);
	EXPECT_EQ(0, d.v[SHARE]) TH_LOG("a process that pinned shared tables");

	close(fd);
	close(bfd);
	zram_remove(zram);
	ASSERT_EQ(0, munmap(s.p, AREA));
	scen_check(_metadata, &s, TABLES);
}

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE	25
#endif

/*
 * 8. The child mlocks one table and collapses another into a THP
 * (MADV_COLLAPSE): both break the share first; the parent's pages and data
 * stay as they were.
 */
TEST(child_mlocks_and_collapses)
{
	struct scen s;
	pid_t pid;

	scen_setup(_metadata, &s);
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		if (mlock(s.p, SZ_2M))
			_exit(1);
		if (count_bad(s.p, 0, PER_TABLE, 1))
			_exit(2);
		if (madvise(s.p + SZ_2M, SZ_2M, MADV_HUGEPAGE))
			_exit(3);
		/* EINVAL: no THP in this kernel; else it must collapse */
		if (madvise(s.p + SZ_2M, SZ_2M, MADV_COLLAPSE) && errno != EINVAL)
			_exit(4);
		if (count_bad(s.p, PER_TABLE, PER_TABLE, 1))
			_exit(5);
		fill(s.p, 0, 2 * PER_TABLE, 2);
		_exit(count_bad(s.p, 0, 2 * PER_TABLE, 2) ? 6 : 0);
	}
	EXPECT_EQ(0, reap(pid)) TH_LOG("the child's step that failed: exit code");
	EXPECT_EQ(0, count_bad(s.p, 0, PAGES, 1));
	ASSERT_EQ(0, munmap(s.p, AREA));
	scen_check(_metadata, &s, TABLES);
}


static int write_clear_refs(const char *type)
{
	int fd = open("/proc/self/clear_refs", O_WRONLY);
	int ret = write(fd, type, strlen(type)) == (ssize_t)strlen(type) ? 0 : -1;

	close(fd);
	return ret;
}

/*
 * 9. clear_refs and pagemap in a holder: clearing accessed bits (1-3)
 * leaves shared tables alone (the debug write check warns otherwise),
 * soft-dirty (4) breaks them; pagemap shows every page present through
 * the shared tables, and new pages where the child wrote.
 */
TEST(clear_refs_and_pagemap)
{
	uint64_t *pfn;
	struct scen s;
	pid_t pid;
	int pm;

	scen_setup(_metadata, &s);
	pfn = calloc(PAGES, sizeof(*pfn));
	ASSERT_NE(NULL, pfn);
	pm = open("/proc/self/pagemap", O_RDONLY);
	ASSERT_LE(0, pm);
	for (unsigned long i = 0; i < PAGES; i++) {
		uint64_t ent = pagemap_entry(pm, s.p + i * PAGE_SIZE);

		ASSERT_TRUE(ent & PM_PRESENT);
		pfn[i] = ent & PM_PFN;
	}
	ASSERT_NE(0, pfn[0]) TH_LOG("pagemap hides PFNs: not root?");
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		if (write_clear_refs("1") || write_clear_refs("2") ||
		    write_clear_refs("3"))
			_exit(1);
		if (count_bad(s.p, 0, PAGES, 1))
			_exit(2);
		fill(s.p, 0, PER_TABLE, 2);
		if (write_clear_refs("4"))
			_exit(3);
		fill(s.p, PER_TABLE, 1, 2);
		/* the child's own: /proc/self was the parent at the open */
		close(pm);
		pm = open("/proc/self/pagemap", O_RDONLY);
		for (unsigned long i = 0; i < PAGES; i++) {
			uint64_t ent = pagemap_entry(pm, s.p + i * PAGE_SIZE);
			bool mine = i < PER_TABLE + 1;

			/* not "same PFN" where unwritten: compaction moves pages */
			if (!(ent & PM_PRESENT) ||
			    (mine && (ent & PM_PFN) == pfn[i]))
				_exit(4);
		}
		_exit(count_bad(s.p, 0, PER_TABLE + 1, 2) ||
		      count_bad(s.p, PER_TABLE + 1, PAGES - PER_TABLE - 1, 1) ?
		      5 : 0);
	}
	EXPECT_EQ(0, reap(pid)) TH_LOG("the child's step that failed: exit code");
	EXPECT_EQ(0, count_bad(s.p, 0, PAGES, 1));
	close(pm);
	free(pfn);
	ASSERT_EQ(0, munmap(s.p, AREA));
	scen_check(_metadata, &s, TABLES);
}

/*
 * 10. A hole in a table at fork, then a file mapped into it and truncated.
 * Fork shares only the tables one VMA maps whole, so the table with the
 * hole is copied and the others shared.  In the child, a file mapped into
 * the hole and truncated (unmap_mapping_range(), a zap without mmap_lock,
 * which once walked the VMA tree of a table shared around the hole) and
 * then written through the mapping changes nothing of the area, on either
 * side, and nothing may warn.
 */
TEST(file_mapped_into_a_hole)
{
	const unsigned long hole = 2 * PER_TABLE + PER_TABLE / 4, len = 16;
	struct scen s;
	pid_t pid;

	scen_setup(_metadata, &s);
	ASSERT_EQ(0, munmap(s.p + hole * PAGE_SIZE, len * PAGE_SIZE));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		int fd = memfd_create("cow_pte_hole", 0);
		char *f;

		if (fd < 0 || ftruncate(fd, len * PAGE_SIZE))
			_exit(1);
		f = mmap(s.p + hole * PAGE_SIZE, len * PAGE_SIZE,
			 PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
		if (f != s.p + hole * PAGE_SIZE)
			_exit(2);
		/* unmap_mapping_range(): a zap of part of the shared table */
		if (ftruncate(fd, 0) || ftruncate(fd, len * PAGE_SIZE))
			_exit(3);
		if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			      0, PAGE_SIZE))
			_exit(4);
		if (count_bad(s.p, 2 * PER_TABLE, hole - 2 * PER_TABLE, 1) ||
		    count_bad(s.p, hole + len, 3 * PER_TABLE - hole - len, 1))
			_exit(5);
		fill(f, 0, len, 2);
		if (count_bad(f, 0, len, 2) ||
		    count_bad(s.p, 2 * PER_TABLE, hole - 2 * PER_TABLE, 1))
			_exit(6);
		_exit(0);
	}
	EXPECT_EQ(0, reap(pid)) TH_LOG("the child's step that failed: exit code");
	EXPECT_EQ(0, count_bad(s.p, 0, hole, 1));
	EXPECT_EQ(0, count_bad(s.p, hole + len, PAGES - hole - len, 1));
	ASSERT_EQ(0, munmap(s.p, AREA));
	scen_check(_metadata, &s, TABLES - 1);
}

#define KSM		"/sys/kernel/mm/ksm/"

/* ksmd's full scans: -1 if there is no KSM */
static long ksm_full_scans(void)
{
	char buf[32];

	return read_knob(KSM "full_scans", buf, sizeof(buf)) ? -1 : atol(buf);
}

/* Let ksmd scan everything twice (20 s at most); false if it did not */
static bool ksm_scan_twice(void)
{
	long start = ksm_full_scans(), end = now_ms() + 20000;

	while (ksm_full_scans() < start + 2 && now_ms() < end)
		usleep(50 * 1000);
	return ksm_full_scans() >= start + 2;
}

/*
 * 11. KSM over shared tables: two tables of identical pages, MADV_MERGEABLE,
 * shared with a waiting child while ksmd scans both mms twice.  KSM
 * write-protects a page through the rmap before merging it, and rmap
 * walkers leave shared tables alone: it may merge nothing there, but must
 * not write a shared table (the debug write check would warn) nor change
 * what either side reads.  Then the child writes a page of each table and
 * exits, the parent too (its tables become private again), and ksmd
 * merges the parent's identical pages again: the shares left nothing
 * behind that keeps KSM out.
 */
TEST(ksm_scans_shared_tables)
{
	const unsigned long n = 2 * PER_TABLE;
	unsigned long merged_end = 0;
	char skipped[32] = "";
	struct scen s;
	struct chan ch;
	pid_t pid;

	if (access(KSM "run", W_OK))
		SKIP(return, "no KSM here");
	scen_setup(_metadata, &s);
	for (unsigned long i = 0; i < n; i++)
		memset(s.p + i * PAGE_SIZE, 0x5c, PAGE_SIZE);
	ASSERT_EQ(0, madvise(s.p, n * PAGE_SIZE, MADV_MERGEABLE));
	ASSERT_EQ(0, chan_open(&ch));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		chan_get(ch.down[0]);
		for (unsigned long i = 0; i < n; i++)
			if (load_word(first_word(s.p + i * PAGE_SIZE)) !=
			    0x5c5c5c5c5c5c5c5cUL)
				_exit(1);
		if (count_bad(s.p, n, PAGES - n, 1))
			_exit(2);
		fill(s.p, 0, 1, 2);
		fill(s.p, PER_TABLE, 1, 2);
		fill(s.p, n, 1, 2);
		_exit(count_bad(s.p, 0, 1, 2) || count_bad(s.p, n, 1, 2) ? 3 : 0);
	}
	write_knob(KSM "sleep_millisecs", "0");
	write_knob(KSM "pages_to_scan", "4096");
	/*
	 * No smart scan: the pages KSM could not merge while their tables were
	 * shared age, and it then skips them for up to 8 scans each (6.7's
	 * ksm_smart_scan); merging after the share was then slow, and in one
	 * run of 9 under TCG none came within the 20 s below.
	 */
	write_knob(KSM "smart_scan", "0");
	ASSERT_EQ(0, write_knob(KSM "run", "1"));
	EXPECT_TRUE(ksm_scan_twice()) TH_LOG("ksmd did not scan");
	TH_LOG("%lu of %lu identical pages merged while the tables were shared",
	       count_merged(s.p, n), n);
	chan_put(ch.down[1]);
	EXPECT_EQ(0, reap(pid)) TH_LOG("1: identical pages changed, 2: tagged pages changed, 3: own writes lost");
	fill(s.p, 1, 1, 3);
	fill(s.p, PER_TABLE + 1, 1, 3);
	EXPECT_EQ(0, count_bad(s.p, n, PAGES - n, 1));
	EXPECT_EQ(0, count_bad(s.p, 1, 1, 3));
	/*
	 * Merging is slow under KASAN and TCG (23 to 77 of the 510 pages in
	 * 20 s): ask only that KSM merges again, not how fast.
	 */
	for (long end = now_ms() + 20000; now_ms() < end;) {
		merged_end = count_merged(s.p + 2 * PAGE_SIZE, PER_TABLE - 2);
		if (merged_end >= 2)
			break;
		usleep(100 * 1000);
	}
	ASSERT_EQ(0, write_knob(KSM "run", "2"));
	read_knob(KSM "pages_skipped", skipped, sizeof(skipped));
	TH_LOG("%lu merged after the share; pages_skipped %s", merged_end, skipped);
	EXPECT_LE(2, merged_end)
		TH_LOG("KSM merged none of the parent's pages after the share");
	for (unsigned long i = 2; i < n; i++)
		if (i != PER_TABLE + 1)
			ASSERT_EQ(0x5c5c5c5c5c5c5c5cUL,
				  load_word(first_word(s.p + i * PAGE_SIZE)));
	ASSERT_EQ(0, munmap(s.p, AREA));
	scen_check(_metadata, &s, TABLES);
}

/* --- allocation failures: fault injection ------------------------------ */

#define FAIL_NTH	"/proc/thread-self/fail-nth"
#define FAIL_COW_PTE	"/sys/kernel/debug/fail_cow_pte/"
#define FAIL_PAGE_ALLOC	"/sys/kernel/debug/fail_page_alloc/"

/* What the fault-injection tests change, put back at exit */
static struct knob knobs[] = {
	{ .path = FAIL_COW_PTE "probability" },
	{ .path = FAIL_COW_PTE "times" },
	{ .path = FAIL_COW_PTE "task-filter" },
	{ .path = FAIL_COW_PTE "verbose" },
	{ .path = FAIL_PAGE_ALLOC "min-order" },
	{ .path = FAIL_PAGE_ALLOC "ignore-gfp-highmem" },
	{ .path = FAIL_PAGE_ALLOC "verbose" },
	{ .path = KSM "run" },
	{ .path = KSM "sleep_millisecs" },
	{ .path = KSM "pages_to_scan" },
	{ .path = KSM "smart_scan" },
};

static void __attribute__((constructor)) save_knobs(void)
{
	save_knob_list(knobs, sizeof(knobs) / sizeof(knobs[0]));
}

static void __attribute__((destructor)) restore_knobs(void)
{
	restore_knob_list(knobs, sizeof(knobs) / sizeof(knobs[0]));
}

/*
 * Make the @nth fault-injection site this thread reaches next fail (0:
 * none); false if the kernel has no fault injection.
 */
static bool fail_nth_set(int nth)
{
	char val[16];
	int fd = open(FAIL_NTH, O_WRONLY);
	bool ok;

	if (fd < 0)
		return false;
	snprintf(val, sizeof(val), "%d", nth);
	ok = write(fd, val, strlen(val)) == (ssize_t)strlen(val);
	close(fd);
	return ok;
}

/* Sites left before the failure set last: 0 once it was injected */
static int fail_nth_get(void)
{
	char val[16] = "";
	int fd = open(FAIL_NTH, O_RDONLY);
	ssize_t n = fd < 0 ? -1 : read(fd, val, sizeof(val) - 1);

	if (fd >= 0)
		close(fd);
	return n > 0 ? atoi(val) : -1;
}

/* The permissions ("rw-p") of the VMA over @p in /proc/self/maps */
static bool vma_prot_is(char *p, const char *perms)
{
	unsigned long start, end;
	char line[512], have[8];
	bool match = false;
	FILE *f = fopen("/proc/self/maps", "r");

	while (f && fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%lx-%lx %7s", &start, &end, have) == 3 &&
		    start <= (unsigned long)p && (unsigned long)p < end)
			match = !strcmp(have, perms);
	}
	if (f)
		fclose(f);
	return match;
}

/*
 * Each syscall that breaks a share, run once with the first allocation of
 * the break failing: it must fail with ENOMEM, the injected failure must
 * be the one it met, and nothing of it may show (data, protections, locks,
 * mappings); run again without, it must succeed.  A write fault that
 * meets the failure gets VM_FAULT_OOM, is retried and the write lands.
 * mlockall and clear_refs come last: they break every share left.
 * Returns the step that went wrong, 0 if none.
 */
static int enomem_steps(char *p)
{
	const unsigned long half = PER_TABLE / 2;
	char *to;

	/* 1. mprotect of a whole shared table */
	if (!fail_nth_set(1) || mprotect(p, SZ_2M, PROT_READ) != -1 ||
	    errno != ENOMEM)
		return 10;
	if (fail_nth_get() || !vma_prot_is(p, "rw-p") ||
	    count_bad(p, 0, PER_TABLE, 1))
		return 11;
	if (mprotect(p, SZ_2M, PROT_READ) || !vma_prot_is(p, "r--p") ||
	    count_bad(p, 0, PER_TABLE, 1))
		return 12;

	/* 2. munmap of half a table */
	if (!fail_nth_set(1) ||
	    munmap(p + (PER_TABLE + half) * PAGE_SIZE, half * PAGE_SIZE) != -1 ||
	    errno != ENOMEM)
		return 20;
	if (fail_nth_get() || count_bad(p, PER_TABLE, PER_TABLE, 1))
		return 21;
	if (munmap(p + (PER_TABLE + half) * PAGE_SIZE, half * PAGE_SIZE) ||
	    count_bad(p, PER_TABLE, half, 1))
		return 22;

	/* 3. mlock of a whole table */
	if (!fail_nth_set(1) || mlock(p + 2 * SZ_2M, SZ_2M) != -1 ||
	    errno != ENOMEM)
		return 30;
	if (fail_nth_get() || status_kb("VmLck:") != 0 ||
	    count_bad(p, 2 * PER_TABLE, PER_TABLE, 1))
		return 31;
	if (mlock(p + 2 * SZ_2M, SZ_2M) || status_kb("VmLck:") != 2048 ||
	    munlock(p + 2 * SZ_2M, SZ_2M))
		return 32;

	/* 4. MADV_DONTNEED of half a table */
	if (!fail_nth_set(1) ||
	    madvise(p + 3 * SZ_2M, half * PAGE_SIZE, MADV_DONTNEED) != -1 ||
	    errno != ENOMEM)
		return 40;
	if (fail_nth_get() || count_bad(p, 3 * PER_TABLE, PER_TABLE, 1))
		return 41;
	if (madvise(p + 3 * SZ_2M, half * PAGE_SIZE, MADV_DONTNEED) ||
	    count_nonzero(p, 3 * PER_TABLE, half) ||
	    count_bad(p, 3 * PER_TABLE + half, half, 1))
		return 42;

	/* 5. mremap of half a table: entry by entry, not the PMD whole */
	to = map_aligned(SZ_2M, SZ_2M, PROT_NONE);
	if (!to)
		return 50;
	if (!fail_nth_set(1) ||
	    mremap(p + 4 * SZ_2M, half * PAGE_SIZE, half * PAGE_SIZE,
		   MREMAP_MAYMOVE | MREMAP_FIXED, to) != MAP_FAILED ||
	    errno != ENOMEM)
		return 51;
	/* the destination, unmapped first by MREMAP_FIXED, must still be there */
	if (fail_nth_get() || count_bad(p, 4 * PER_TABLE, PER_TABLE, 1) ||
	    !vma_prot_is(to, "---p"))
		return 52;
	if (mremap(p + 4 * SZ_2M, half * PAGE_SIZE, half * PAGE_SIZE,
		   MREMAP_MAYMOVE | MREMAP_FIXED, to) != to ||
	    count_bad(p, 4 * PER_TABLE + half, half, 1))
		return 53;
	for (unsigned long i = 0; i < half; i++)
		if (load_word(first_word(to + i * PAGE_SIZE)) !=
		    tag(1, 4 * PER_TABLE + i))
			return 54;

	/* 6. a write fault: VM_FAULT_OOM, retried, the write lands */
	if (!fail_nth_set(1))
		return 60;
	fill(p, 7 * PER_TABLE, 1, 2);
	if (fail_nth_get() || count_bad(p, 7 * PER_TABLE, 1, 2) ||
	    count_bad(p, 7 * PER_TABLE + 1, PER_TABLE - 1, 1))
		return 61;

	/*
	 * 7. MADV_FREE over a table of its own (a write broke it: its pages
	 * can be freed lazily) and into a shared one: the break of the
	 * second fails, and nothing of the first may be lazily freed.  Then
	 * the first alone, without a break: it is.  The pages are written
	 * again after, so that reclaim cannot free them from under step 8.
	 */
	fill(p, 5 * PER_TABLE, 1, 2);
	if (!fail_nth_set(1) ||
	    madvise(p + 5 * SZ_2M, SZ_2M + PAGE_SIZE, MADV_FREE) != -1 ||
	    errno != ENOMEM)
		return 70;
	if (fail_nth_get() || smaps_kb(p + 5 * SZ_2M, "LazyFree:") != 0 ||
	    count_bad(p, 5 * PER_TABLE, 1, 2) ||
	    count_bad(p, 5 * PER_TABLE + 1, 2 * PER_TABLE - 1, 1))
		return 71;
	/* reclaim may free or re-dirty lazy pages before smaps reads: > 0 */
	if (madvise(p + 5 * SZ_2M, SZ_2M, MADV_FREE) ||
	    smaps_kb(p + 5 * SZ_2M, "LazyFree:") <= 0)
		return 72;
	fill(p, 5 * PER_TABLE, PER_TABLE, 1);

	/*
	 * 8. mlockall(MCL_CURRENT): every VMA, so every share of the mm left;
	 * nothing may be locked.  It ignores mlock_fixup()'s errors: it
	 * returned 0 with the VMA of the failed break left unlocked.  (It
	 * succeeds after step 9, which needs a share left.)
	 */
	if (!fail_nth_set(1) || mlockall(MCL_CURRENT) != -1 || errno != ENOMEM)
		return 80;
	if (fail_nth_get() || status_kb("VmLck:") != 0)
		return 81;

	/* 9. clear_refs soft-dirty: every share of the mm left */
	if (!fail_nth_set(1) || write_clear_refs("4") != -1 || errno != ENOMEM)
		return 90;
	if (fail_nth_get() || count_bad(p, 5 * PER_TABLE, 2 * PER_TABLE, 1))
		return 91;
	if (write_clear_refs("4"))
		return 92;

	/* 10. mlockall again, with no share left: the area locked (less step 2's) */
	if (mlockall(MCL_CURRENT) || status_kb("VmLck:") < (AREA >> 10) - 2048 ||
	    munlockall())
		return 100;
	return 0;
}

/*
 * 11. No syscall is half applied when a break cannot allocate: the child,
 * holder of shared tables, runs each syscall that breaks one with the
 * break's allocation failing (fail-nth), then again without; the parent's
 * data never moves.
 */
TEST(enomem_leaves_nothing_half_done)
{
	struct scen s;
	pid_t pid;

	if (!cow_pte_on())
		SKIP(return, "no COW page tables on this kernel");
	if (!fail_nth_set(0))
		SKIP(return, "no fault injection (CONFIG_FAULT_INJECTION)");
	/* a line per injected failure in the log, not a stack */
	write_knob(FAIL_COW_PTE "verbose", "1");
	/*
	 * fail-nth counts every fault-injection site the task reaches: keep
	 * fail_page_alloc's out of it (no order is that high), so that the
	 * failure lands on the break's allocation.  Under KASAN, step 9 once
	 * saw clear_refs succeed: its failure had gone elsewhere, we think to
	 * the stack depot's order-2 GFP_NOWAIT pool allocation.
	 */
	if (!access(FAIL_PAGE_ALLOC, F_OK))
		ASSERT_EQ(0, write_knob(FAIL_PAGE_ALLOC "min-order", "11"));
	scen_setup(_metadata, &s);
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid)
		_exit(enomem_steps(s.p));
	EXPECT_EQ(0, reap(pid)) TH_LOG("step NM of the child went wrong: "
				       "N the syscall, M 0 no ENOMEM, 1 half done, "
				       "2 did not work after");
	EXPECT_EQ(0, count_bad(s.p, 0, PAGES, 1));
	ASSERT_EQ(0, munmap(s.p, AREA));
	scen_check(_metadata, &s, TABLES);
}

/*
 * 13. A 1 GiB hugetlb page is a PUD leaf, not a PMD table: the walks that
 * look for shared tables before a syscall changes entries (mprotect,
 * mlockall, munmap's edges, userfaultfd registration, clear_refs) must
 * not read its data as PMDs.  Its first qword is made to look like the PMD
 * of a shared table (present, user, read-only, pointing at a page of
 * zeros); mprotect and mlockall over it must leave the data alone.  The
 * lookup they used (mm_find_pmd()) stops at a present PUD only.
 */
#ifndef MAP_HUGE_1GB
#define MAP_HUGE_1GB	(30 << 26)
#endif
#define GIGANTIC	"/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"

TEST(gigantic_page_is_no_table)
{
	struct knob nr = { GIGANTIC };
	unsigned long *p, fake;
	char *zeros, have[16] = "";
	int pm;

	if (!cow_pte_on())
		SKIP(return, "no COW page tables on this kernel");
	if (access(GIGANTIC, F_OK))
		SKIP(return, "no 1 GiB hugetlb pages");
	save_knob_list(&nr, 1);
	/*
	 * A 1 GiB page is a contiguous GiB of one node: late in a long run
	 * the page cache and unmovable allocations break it up (this test
	 * skipped once after 20 min of tests).  Ask again after dropping the
	 * caches and compacting.
	 */
	for (int tries = 0; tries < 2; tries++) {
		if (!write_knob(GIGANTIC, "1\n") &&
		    !read_knob(GIGANTIC, have, sizeof(have)) && !strcmp(have, "1"))
			break;
		write_knob("/proc/sys/vm/drop_caches", "3\n");
		write_knob("/proc/sys/vm/compact_memory", "1\n");
	}
	if (strcmp(have, "1")) {
		restore_knob_list(&nr, 1);
		SKIP(return, "no 1 GiB page at hand");
	}
	p = mmap(NULL, SZ_1G, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_HUGE_1GB, -1, 0);
	zeros = mmap(NULL, PAGE_SIZE, PROT_READ | PROT_WRITE,
		     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, p);
	ASSERT_NE(MAP_FAILED, zeros);
	zeros[0] = 0;				/* a page of its own */
	pm = open("/proc/self/pagemap", O_RDONLY);
	ASSERT_LE(0, pm);
	fake = (pagemap_entry(pm, zeros) & PM_PFN) << 12 | 0x5;	/* P|U */
	close(pm);
	ASSERT_NE(0x5, fake) TH_LOG("no PFN in pagemap");
	p[0] = fake;

	EXPECT_EQ(0, mprotect(p, SZ_1G, PROT_READ));
	EXPECT_EQ(0, mprotect(p, SZ_1G, PROT_READ | PROT_WRITE));
	EXPECT_EQ(0, mlockall(MCL_CURRENT));
	EXPECT_EQ(0, munlockall());
	EXPECT_EQ(fake, p[0]) TH_LOG("the page's data was taken for a PMD");
	munmap(p, SZ_1G);
	munmap(zeros, PAGE_SIZE);
	restore_knob_list(&nr, 1);
}

/*
 * 19b. The walk that breaks shares before a syscall changes entries skips
 * what no PGD, P4D or PUD entry maps, and nothing else: a 1 TiB
 * reservation of which only the last 16 MiB is written (the first 512 GiB
 * have no top-level entry), shared by fork, then mprotect(PROT_NONE) of
 * all of it.  A read of the written part must fault (vanilla: SIGSEGV).
 * Each level's end is taken within the one above: on a kernel built
 * without X86_5LEVEL, p4d_addr_end() returns the end it is given, and a
 * walk that took it from the range's end stopped at the first empty top-
 * level entry; it then left the shared tables readable.  Our kernels are
 * built with X86_5LEVEL, where that walk passes too: here the test guards
 * the walk's shape, not that defect.
 */
static sigjmp_buf probe_env;

static void probe_fault(int sig)
{
	siglongjmp(probe_env, 1);
}

/* Can this process read @p? */
static bool readable(const volatile char *p)
{
	struct sigaction sa = { .sa_handler = probe_fault }, old;

	if (sigaction(SIGSEGV, &sa, &old))
		return true;	/* the caller's check fails */
	if (sigsetjmp(probe_env, 1)) {
		sigaction(SIGSEGV, &old, NULL);
		return false;
	}
	(void)*p;
	sigaction(SIGSEGV, &old, NULL);
	return true;
}

#define RESERVATION	(1UL << 40)

TEST(mprotect_of_a_sparse_reservation)
{
	unsigned long len = RESERVATION + SZ_2M;
	struct chan ch;
	struct scen s;
	char *raw, *res;
	pid_t pid;

	raw = mmap(NULL, len, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	ASSERT_NE(MAP_FAILED, raw);
	res = (char *)(((unsigned long)raw + SZ_2M - 1) & ~(SZ_2M - 1UL));
	s.feature = cow_pte_on();
	s.p = res + RESERVATION - AREA;
	ASSERT_EQ(0, madvise(s.p, AREA, MADV_NOHUGEPAGE));
	fill(s.p, 0, PAGES, 1);
	if (s.feature)
		ASSERT_EQ(0, prctl(PR_SET_COW_PTE, 1, 0, 0, 0));
	s.pagetables = pagetables_kb();
	read_counters(&s.before);
	ASSERT_EQ(0, chan_open(&ch));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		chan_child(&ch);
		chan_get(ch.down[0]);	/* the parent's mprotect() is done */
		_exit(count_bad(s.p, 0, PAGES, 1) ? 1 : 0);
	}
	ASSERT_EQ(0, mprotect(res, RESERVATION, PROT_NONE));
	EXPECT_FALSE(readable(s.p + AREA - PAGE_SIZE))
		TH_LOG("a page read after mprotect(PROT_NONE)");
	ASSERT_EQ(0, mprotect(res, RESERVATION, PROT_READ));
	EXPECT_EQ(0, count_bad(s.p, 0, PAGES, 1));
	chan_put(ch.down[1]);
	EXPECT_EQ(0, reap(pid)) TH_LOG("the child's data changed");
	ASSERT_EQ(0, munmap(raw, len));
	scen_check(_metadata, &s, TABLES);
}

#define SWAP_MAP_MAX	0x3e	/* swap count without a continuation */
/*
 * 12. A break gives up a half-made copy: one page in the middle of a
 * shared table is swapped out, and each of SWAP_MAP_MAX children breaks
 * the table, so that each copy takes a swap count.  The last copy needs a
 * swap count continuation: the copy's atomic allocation of it fails
 * (fail-nth through fail_page_alloc, order 0 allowed), the break drops its
 * locks to allocate it, and that fails too (fail_cow_pte, once, for this
 * task only): the entries it copied are released, the fault is retried
 * and copies the whole table.  Every child sees the data before and
 * after; PageTables comes back when they exit.
 */
TEST(break_gives_up_a_half_copy)
{
	const unsigned long mid = PER_TABLE / 2;
	int go[2], ready[2], pm;
	pid_t pids[SWAP_MAP_MAX];
	struct counters d;
	char c, times[8];
	struct scen s;
	int rc = 0;

	if (!cow_pte_on())
		SKIP(return, "no COW page tables on this kernel");
	if (!fail_nth_set(0))
		SKIP(return, "no fault injection (CONFIG_FAULT_INJECTION)");
	if (access(FAIL_PAGE_ALLOC, F_OK))
		SKIP(return, "no fail_page_alloc (CONFIG_FAIL_PAGE_ALLOC)");
	ASSERT_EQ(0, access(FAIL_COW_PTE, F_OK)) TH_LOG("no fail_cow_pte");
	s.feature = true;
	s.p = map_aligned(SZ_2M, SZ_2M, PROT_READ | PROT_WRITE);
	ASSERT_NE(NULL, s.p);
	ASSERT_EQ(0, madvise(s.p, SZ_2M, MADV_NOHUGEPAGE));
	fill(s.p, 0, PER_TABLE, 1);
	ASSERT_EQ(0, madvise(s.p + mid * PAGE_SIZE, PAGE_SIZE, MADV_PAGEOUT));
	pm = open("/proc/self/pagemap", O_RDONLY);
	ASSERT_LE(0, pm);
	if (!(pagemap_entry(pm, s.p + mid * PAGE_SIZE) & PM_SWAP))
		SKIP(return, "the page was not swapped out (no swap?)");
	close(pm);
	/* the continuation: alloc_page(GFP_ATOMIC | __GFP_HIGHMEM) */
	ASSERT_EQ(0, write_knob(FAIL_PAGE_ALLOC "min-order", "0"));
	ASSERT_EQ(0, write_knob(FAIL_PAGE_ALLOC "ignore-gfp-highmem", "N"));
	ASSERT_EQ(0, write_knob(FAIL_PAGE_ALLOC "verbose", "1"));
	ASSERT_EQ(0, write_knob(FAIL_COW_PTE "task-filter", "Y"));
	ASSERT_EQ(0, write_knob(FAIL_COW_PTE "times", "1"));
	ASSERT_EQ(0, write_knob(FAIL_COW_PTE "verbose", "1"));
	ASSERT_EQ(0, write_knob(FAIL_COW_PTE "probability", "100"));
	ASSERT_EQ(0, prctl(PR_SET_COW_PTE, 1, 0, 0, 0));
	s.pagetables = pagetables_kb();
	read_counters(&s.before);
	ASSERT_EQ(0, pipe(go));
	ASSERT_EQ(0, pipe(ready));

	/* one child at a time: the last one's copy must be the 63rd */
	for (int i = 0; i < SWAP_MAP_MAX; i++) {
		pids[i] = fork();
		ASSERT_LE(0, pids[i]);
		if (pids[i]) {
			chan_get(ready[0]);
			continue;
		}
		close(go[1]);
		/*
		 * The last child: fail_cow_pte fails its one time in this
		 * task; fail-nth passes the table's allocation (a site of
		 * fail_cow_pte) and fails the next, the continuation's.
		 */
		if (i == SWAP_MAP_MAX - 1 &&
		    (write_knob("/proc/self/make-it-fail", "1") ||
		     !fail_nth_set(2))) {
			rc = 1;
		} else {
			fill(s.p, 0, 1, 2 + i);
			if (i == SWAP_MAP_MAX - 1 &&
			    (fail_nth_get() ||
			     read_knob(FAIL_COW_PTE "times", times, sizeof(times)) ||
			     strcmp(times, "0")))
				rc = 2;
			/* not the swapped page yet: a swap-in drops a count */
			else if (count_bad(s.p, 1, mid - 1, 1) ||
				 count_bad(s.p, mid + 1, PER_TABLE - mid - 1, 1))
				rc = 3;
		}
		chan_put(ready[1]);
		if (rc)
			_exit(rc);
		/* keep the copy, and its swap count, until the last one */
		if (read(go[0], &c, 1) != 0)
			_exit(4);
		_exit(count_bad(s.p, 0, 1, 2 + i) ||
		      count_bad(s.p, 1, PER_TABLE - 1, 1) ? 5 : 0);
	}
	close(go[0]);
	close(go[1]);
	for (int i = 0; i < SWAP_MAP_MAX; i++)
		rc |= reap(pids[i]);
	EXPECT_EQ(0, rc) TH_LOG("a child: 2 a failure not injected, 3 and 5 bad data");
	EXPECT_EQ(0, write_knob(FAIL_COW_PTE "probability", "0"));
	EXPECT_EQ(0, count_bad(s.p, 0, PER_TABLE, 1));
	counters_since(_metadata, &s.before, &d);
	EXPECT_LE(SWAP_MAP_MAX, d.v[BREAK]);
	ASSERT_EQ(0, munmap(s.p, SZ_2M));
	scen_check(_metadata, &s, SWAP_MAP_MAX);
}

int main(int argc, char **argv)
{
	/* the exec'd child of fork_inherits_exec_drops: exit with the flag */
	if (argc == 2 && !strcmp(argv[1], "--print-flag"))
		return get_flag() == 0 ? 0 : 12;
	return test_harness_run(argc, argv);
}
