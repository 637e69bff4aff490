// SPDX-License-Identifier: GPL-2.0
/*
 * cow_pte_equiv: what a program observes of memory that fork left in a PTE
 * table shared by COW page tables (CONFIG_COW_PTE) must be what it observes
 * on vanilla: contents, syscall results, /proc, core dumps.  Each test is a
 * scenario that a review found wrong; each runs on any kernel (on vanilla it
 * checks vanilla's behaviour, which is the reference) and, on a kernel with
 * the feature, opts in and checks that its fork shared tables, so that it
 * cannot pass without reaching the shared case.
 */
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <numaif.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kselftest_harness.h"
#include "guest_util.h"

#ifndef PR_SET_COW_PTE
#define PR_SET_COW_PTE	0x43505445
#endif

#define PER_TABLE	(SZ_2M / PAGE_SIZE)

static unsigned long tag(unsigned long round, unsigned long i)
{
	return round << 32 | i | 1UL << 63;
}

static void fill(char *p, unsigned long n, unsigned long round)
{
	for (unsigned long i = 0; i < n; i++)
		write_tag(p + i * PAGE_SIZE, tag(round, i));
}

/* Pages [first, first + n) of @p that do not hold @round's tags */
static unsigned long count_bad_from(char *p, unsigned long first,
				    unsigned long n, unsigned long round)
{
	unsigned long bad = 0;

	for (unsigned long i = first; i < first + n; i++)
		if (load_word(first_word(p + i * PAGE_SIZE)) != tag(round, i) ||
		    load_word(last_word(p + i * PAGE_SIZE)) != tag(round, i))
			bad++;
	return bad;
}

static unsigned long count_bad(char *p, unsigned long n, unsigned long round)
{
	return count_bad_from(p, 0, n, round);
}

static unsigned long count_nonzero(char *p, unsigned long n)
{
	unsigned long bad = 0;

	for (unsigned long i = 0; i < n; i++)
		if (load_word(first_word(p + i * PAGE_SIZE)) ||
		    load_word(last_word(p + i * PAGE_SIZE)))
			bad++;
	return bad;
}

/*
 * The kernel shares tables at fork for this process from now on: true on a
 * kernel with the feature switched on (opt-in by prctl, or vm.cow_pte=2);
 * false on vanilla, where the scenario then runs as the reference.
 */
static bool opt_in(void)
{
	char val[8];

	if (!switch_present(COW_PTE_SYSCTL) ||
	    read_knob(COW_PTE_SYSCTL, val, sizeof(val)) || !strcmp(val, "0"))
		return false;
	return !prctl(PR_SET_COW_PTE, 1, 0, 0, 0);
}

/* An area of @tables PTE tables of 4 KiB pages, @round's tags in it */
static char *tagged_area(unsigned long tables, unsigned long round)
{
	char *p = map_aligned(tables * SZ_2M, SZ_2M, PROT_READ | PROT_WRITE);

	if (!p)
		return NULL;
	if (madvise(p, tables * SZ_2M, MADV_NOHUGEPAGE)) {
		munmap(p, tables * SZ_2M);
		return NULL;
	}
	fill(p, tables * PER_TABLE, round);
	return p;
}

/*
 * The tests need no fixture; one gives them a time limit of their own:
 * under `ptlab soak` (stress-ng beside them on TCG) a 16 MiB fill, fork and
 * check took longer than the harness's default 30 s.
 */
FIXTURE(equiv) {};
FIXTURE_SETUP(equiv) {}
FIXTURE_TEARDOWN(equiv) {}

#define EQUIV_TIMEOUT	300

/*
 * A child that holds what fork gave it until the parent closes @fds[1],
 * then checks it; the parent closes @fds[0].
 */
static pid_t holder(char *p, unsigned long pages, unsigned long round,
		    int fds[2])
{
	pid_t pid = fork();
	char c;

	if (pid) {
		close(fds[0]);
		return pid;
	}
	close(fds[1]);
	if (read(fds[0], &c, 1) < 0)
		_exit(2);
	_exit(p && count_bad(p, pages, round) ? 1 : 0);
}

/* The exit code of @pid, -1 if it did not exit */
static int reap(pid_t pid)
{
	int status;

	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
		return -1;
	return WEXITSTATUS(status);
}

/* Fork a child that exits at once, letting go of what fork gave it: 0 */
static int fork_a_child_that_exits(void)
{
	pid_t pid = fork();

	if (!pid)
		_exit(0);
	return pid < 0 ? -1 : reap(pid);
}

/*
 * 1. mmap(MAP_FIXED) over exactly the 2 MiB of a shared table that a
 * madvise(MADV_DONTFORK) has split into three VMAs.  The new mapping
 * replaces the old one while the old VMAs are still in the tree, so each
 * VMA's zap sees only a part of the table: it must still let go of the
 * table as a whole.  Vanilla: the new mappings read zeros, the parent's
 * RssAnon drops by the area, the child keeps its copy, and no page table
 * is left behind once both are gone.
 */
#define FIXED_TABLES	8

TEST_F_TIMEOUT(equiv, map_fixed_over_a_split_shared_table, EQUIV_TIMEOUT)
{
	unsigned long len = FIXED_TABLES * SZ_2M;
	long pt_before, pt_after, rss_filled, rss_fixed;
	long shares = vmstat("cow_pte_share");
	bool feature = opt_in();
	int fds[2];
	pid_t pid;
	char *p;

	pt_before = pagetables_kb();
	p = tagged_area(FIXED_TABLES, 1);
	ASSERT_NE(NULL, p);
	rss_filled = status_kb("RssAnon:");
	ASSERT_EQ(0, pipe(fds));
	pid = holder(p, FIXED_TABLES * PER_TABLE, 1, fds);
	ASSERT_LE(0, pid);

	for (int t = 0; t < FIXED_TABLES; t++) {
		char *table = p + t * SZ_2M;

		ASSERT_EQ(0, madvise(table + SZ_1M, PAGE_SIZE, MADV_DONTFORK));
		ASSERT_EQ(table, mmap(table, SZ_2M, PROT_READ | PROT_WRITE,
				      MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
				      -1, 0));
	}
	EXPECT_EQ(0, count_nonzero(p, FIXED_TABLES * PER_TABLE))
		TH_LOG("the new mappings must read zeros");
	rss_fixed = status_kb("RssAnon:");
	TH_LOG("RssAnon %ld kB filled, %ld kB after MAP_FIXED", rss_filled,
	       rss_fixed);
	EXPECT_GE(rss_filled - rss_fixed, (long)(len >> 10) - 512)
		TH_LOG("the pages replaced are still counted");

	close(fds[1]);
	EXPECT_EQ(0, reap(pid)) TH_LOG("the child lost its copy");
	ASSERT_EQ(0, munmap(p, len));
	pt_after = pagetables_kb();
	for (int i = 0; i < 100 && pt_after > pt_before; i++) {
		usleep(10 * 1000);	/* tables are freed after RCU */
		pt_after = pagetables_kb();
	}
	TH_LOG("PageTables %ld kB before, %ld kB after", pt_before, pt_after);
	/*
	 * Under the soak, other processes' tables come and go meanwhile (4648
	 * kB before, 12168 after in one soak): there a leaked table shows as the
	 * splats the soak fails on (the WARNINGs at cow_pte_zap() and
	 * free_pgd_range(), "Bad rss-counter" at exit).
	 */
	if (!in_soak())
		EXPECT_LE(pt_after, pt_before + 8) TH_LOG("page tables left behind");
	if (feature)
		EXPECT_LE(FIXED_TABLES, vmstat("cow_pte_share") - shares)
			TH_LOG("the fork shared nothing");
}

/*
 * 2. MADV_DONTNEED of a shared 2 MiB while another thread writes its last
 * page: the write breaks the share (a copy, as the child still holds the
 * table) while the zap waits for the PMD lock.  Once MADV_DONTNEED has
 * returned 0, every page it covered must read zero, except the one the
 * thread writes, which reads zero (written before the zap took it: the
 * zap discarded the write) or the thread's word alone on a zero page
 * (written after), never its old contents.
 */
#define RACE_ROUNDS	1000
#define RACE_MS		8000

struct writer {
	char *page;
	int go;			/* __atomic: the round to write in */
	int done;		/* __atomic: the last round written */
	bool stop;
};

static unsigned long written(int round)
{
	return 0x5752495445000000UL | round;	/* "WRITE" */
}

static void *write_last_page(void *arg)
{
	struct writer *w = arg;
	int round = 0;

	for (;;) {
		while (__atomic_load_n(&w->go, __ATOMIC_ACQUIRE) == round)
			if (__atomic_load_n(&w->stop, __ATOMIC_RELAXED))
				return NULL;
		round++;
		store_word(first_word(w->page), written(round));
		__atomic_store_n(&w->done, round, __ATOMIC_RELEASE);
	}
}

TEST_F_TIMEOUT(equiv, dontneed_meets_a_break, EQUIV_TIMEOUT)
{
	long shares = vmstat("cow_pte_share"), breaks = vmstat("cow_pte_break");
	unsigned long stale = 0, stale_rounds = 0;
	bool feature = opt_in();
	struct writer w = { 0 };
	long start = now_ms();
	pthread_t thread;
	int round;
	char *p;

	p = tagged_area(1, 0);
	ASSERT_NE(NULL, p);
	w.page = p + (PER_TABLE - 1) * PAGE_SIZE;
	ASSERT_EQ(0, pthread_create(&thread, NULL, write_last_page, &w));
	for (round = 1; round <= RACE_ROUNDS; round++) {
		unsigned long first, bad;
		int fds[2];
		pid_t pid;

		fill(p, PER_TABLE, round);
		ASSERT_EQ(0, pipe(fds));
		pid = holder(p, PER_TABLE, round, fds);
		ASSERT_LE(0, pid);

		__atomic_store_n(&w.go, round, __ATOMIC_RELEASE);
		ASSERT_EQ(0, madvise(p, SZ_2M, MADV_DONTNEED));
		while (__atomic_load_n(&w.done, __ATOMIC_ACQUIRE) != round)
			;
		bad = count_nonzero(p, PER_TABLE - 1);
		first = load_word(first_word(w.page));
		if (load_word(last_word(w.page)) ||
		    (first && first != written(round)))
			bad++;
		if (bad) {
			if (!stale_rounds)
				TH_LOG("round %d: %lu pages kept their contents",
				       round, bad);
			stale_rounds++;
			stale += bad;
		}
		close(fds[1]);
		ASSERT_EQ(0, reap(pid)) TH_LOG("the child lost its copy");
		if (now_ms() - start > RACE_MS)
			break;
	}
	__atomic_store_n(&w.stop, true, __ATOMIC_RELAXED);
	pthread_join(thread, NULL);
	TH_LOG("%d rounds; shares %ld, breaks %ld", round - 1,
	       vmstat("cow_pte_share") - shares,
	       vmstat("cow_pte_break") - breaks);
	EXPECT_EQ(0, stale_rounds)
		TH_LOG("%lu rounds, %lu pages not zeroed by MADV_DONTNEED",
		       stale_rounds, stale);
	if (feature) {
		EXPECT_LE(round - 1, vmstat("cow_pte_share") - shares);
		EXPECT_LT(0, vmstat("cow_pte_break") - breaks)
			TH_LOG("the writes never broke a shared table");
	}
	munmap(p, SZ_2M);
}

/*
 * 3. The core dump of a child that aborts with memory in a shared table
 * holds that memory, as vanilla's does: the dump reads it through GUP
 * (FOLL_DUMP | FOLL_GET), which must get the pages, not holes.
 */
#define CORE_TABLES	2
#define CORE_PATTERN	"/proc/sys/kernel/core_pattern"
#define CORE_DIR	"/tmp/ptlab_cow_pte_equiv"

/* Pages of the PT_LOAD segment at @p in core file @path that hold tags */
static long core_tagged_pages(const char *path, char *p, unsigned long n)
{
	long good = -1;
	Elf64_Ehdr eh;
	char *page;
	int fd;

	fd = open(path, O_RDONLY);
	if (fd < 0)
		return -2;
	page = malloc(PAGE_SIZE);
	if (pread(fd, &eh, sizeof(eh), 0) != sizeof(eh) ||
	    memcmp(eh.e_ident, ELFMAG, SELFMAG) || eh.e_type != ET_CORE)
		goto out;
	for (int i = 0; i < eh.e_phnum; i++) {
		Elf64_Phdr ph;

		if (pread(fd, &ph, sizeof(ph), eh.e_phoff + i * sizeof(ph)) !=
		    sizeof(ph))
			goto out;
		if (ph.p_type != PT_LOAD || ph.p_vaddr != (unsigned long)p)
			continue;
		good = 0;
		if (ph.p_filesz < n * PAGE_SIZE)
			break;
		for (unsigned long j = 0; j < n; j++) {
			if (pread(fd, page, PAGE_SIZE,
				  ph.p_offset + j * PAGE_SIZE) != PAGE_SIZE)
				break;
			if (*first_word(page) == tag(1, j) &&
			    *last_word(page) == tag(1, j))
				good++;
		}
		break;
	}
out:
	free(page);
	close(fd);
	return good;
}

/*
 * The pages of the core dump of a child that aborts holding @p's
 * CORE_TABLES shared tables; with @fail_break, the first break the child
 * tries fails (fail_cow_pte, for it alone).
 */
static long dump_child(struct __test_metadata *_metadata, char *p,
		       bool fail_break)
{
	struct knob pattern = { CORE_PATTERN };
	char path[128];
	int status;
	long good;
	pid_t pid;

	save_knob_list(&pattern, 1);
	mkdir(CORE_DIR, 0700);
	if (write_knob(CORE_PATTERN, CORE_DIR "/core.%p\n"))
		return -2;
	pid = fork();
	if (pid < 0)
		return -2;
	if (!pid) {
		struct rlimit rl = { RLIM_INFINITY, RLIM_INFINITY };

		setrlimit(RLIMIT_CORE, &rl);
		prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
		if (fail_break && write_knob("/proc/self/make-it-fail", "1"))
			_exit(1);
		abort();
	}
	waitpid(pid, &status, 0);
	restore_knob_list(&pattern, 1);
	EXPECT_TRUE(WIFSIGNALED(status) && WCOREDUMP(status))
		TH_LOG("no core dump (status %#x)", status);
	snprintf(path, sizeof(path), CORE_DIR "/core.%d", pid);
	good = core_tagged_pages(path, p, CORE_TABLES * PER_TABLE);
	unlink(path);
	rmdir(CORE_DIR);
	return good;
}

TEST_F_TIMEOUT(equiv, core_dump_holds_a_shared_table, EQUIV_TIMEOUT)
{
	unsigned long pages = CORE_TABLES * PER_TABLE;
	long shares = vmstat("cow_pte_share");
	bool feature = opt_in();
	long good;
	char *p;

	p = tagged_area(CORE_TABLES, 1);
	ASSERT_NE(NULL, p);
	good = dump_child(_metadata, p, false);
	ASSERT_LE(0, good) TH_LOG("no segment of the area in the dump (%ld)",
				  good);
	EXPECT_EQ(pages, good) TH_LOG("the dump lost the area's contents");
	if (feature)
		EXPECT_LE(CORE_TABLES, vmstat("cow_pte_share") - shares)
			TH_LOG("the fork shared nothing");
	munmap(p, pages * PAGE_SIZE);
}

/*
 * 4. A child's RSS after its parent rewrote the memory they shared: on
 * vanilla the child maps every page fork gave it, and VmRSS/RssAnon say so,
 * as does smaps_rollup.  Shared tables used to be counted by one owner mm:
 * once the parent (the owner) broke, nobody counted them, and the child's
 * VmRSS stayed near zero (820 kB of 65 536 in the review's 64 MiB) while
 * smaps_rollup, which walks the tables, found them all.  Every holder
 * counts them now.  16 MiB show it as well, and the parent's 4096 COW
 * faults stay well inside the time limit under the soak's load (its
 * 16 384 for 64 MiB timed out in 2 of 5 runs of a 30-min soak).
 */
#define RSS_TABLES	8

/* The number after @field in /proc/@pid/@file, kB */
static long pid_kb(pid_t pid, const char *file, const char *field)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/%d/%s", pid, file);
	return proc_field(path, field);
}

TEST_F_TIMEOUT(equiv, child_rss_after_the_parent_rewrites, EQUIV_TIMEOUT)
{
	long area_kb = RSS_TABLES * SZ_2M >> 10, rss, anon, rollup, swap, rollup_swap;
	int fds[2];
	pid_t pid;
	char *p;

	opt_in();
	p = tagged_area(RSS_TABLES, 1);
	ASSERT_NE(NULL, p);
	ASSERT_EQ(0, pipe(fds));
	pid = holder(p, RSS_TABLES * PER_TABLE, 1, fds);
	ASSERT_LE(0, pid);
	fill(p, RSS_TABLES * PER_TABLE, 2);	/* the parent's own copy */
	/*
	 * Reclaim (the soak's) may swap the child's pages out meanwhile: they
	 * then count in VmSwap and smaps_rollup's Swap, on vanilla too.  Each
	 * swap figure is read after its RSS figure: a page that moves between
	 * the two reads counts twice, never not at all (the child touches
	 * nothing, so none comes back in).
	 */
	rss = pid_kb(pid, "status", "VmRSS:");
	anon = pid_kb(pid, "status", "RssAnon:");
	swap = pid_kb(pid, "status", "VmSwap:");
	rollup = pid_kb(pid, "smaps_rollup", "Rss:");
	rollup_swap = pid_kb(pid, "smaps_rollup", "Swap:");
	close(fds[1]);
	EXPECT_EQ(0, reap(pid)) TH_LOG("the child lost its copy");
	munmap(p, RSS_TABLES * SZ_2M);
	TH_LOG("child: VmRSS %ld kB, RssAnon %ld kB, VmSwap %ld kB, smaps_rollup Rss %ld kB Swap %ld kB; the area %ld kB",
	       rss, anon, swap, rollup, rollup_swap, area_kb);
	EXPECT_GE(anon + swap, area_kb - RSS_SLACK_KB);
	EXPECT_GE(rss + swap, area_kb - RSS_SLACK_KB);
	EXPECT_GE(rollup + rollup_swap, area_kb);
}

/*
 * 5. What /proc and page migration say of memory that a child holds by
 * fork: on vanilla each page is mapped by two mms.  smaps' Pss is half the
 * Rss and every page is Shared, pagemap clears the exclusive bit, numa_maps
 * says mapmax=2; move_pages(MPOL_MF_MOVE) refuses each page (-EACCES) and
 * mbind(MPOL_MF_MOVE) leaves them where they are, as moving them would move
 * another process's memory (MPOL_MF_MOVE_ALL, with CAP_SYS_NICE, may).  A
 * table shared by fork counts once in each page's mapcount: the kernel must
 * count its holders.
 */
#define PROC_TABLES	4

/* mapmax= of the numa_maps line of the VMA at @p; 1 if none is printed */
static long numa_mapmax(char *p)
{
	char line[1024], want[32], *m;
	FILE *f = fopen("/proc/self/numa_maps", "r");
	long val = -1;

	if (!f)
		return -1;
	snprintf(want, sizeof(want), "%lx ", (unsigned long)p);
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, want, strlen(want))) {
			m = strstr(line, " mapmax=");
			val = m ? strtol(m + 8, NULL, 10) : 1;
		}
	fclose(f);
	return val;
}

/* The nodes of the @n pages at @p, in @nodes; false: move_pages() failed */
static bool page_nodes(char *p, unsigned long n, int *nodes)
{
	void *pages[n];

	for (unsigned long i = 0; i < n; i++)
		pages[i] = p + i * PAGE_SIZE;
	return !syscall(SYS_move_pages, 0, n, pages, NULL, nodes, 0);
}

/* The pages of @n at @p whose move_pages() status is @status */
static unsigned long count_status(int *status, unsigned long n, int want)
{
	unsigned long count = 0;

	for (unsigned long i = 0; i < n; i++)
		count += status[i] == want;
	return count;
}

/*
 * move_pages(MPOL_MF_MOVE) of the @n pages at @p, each to @to[i], or all
 * to @node if @to is NULL; @status gets theirs
 */
static long move_to_nodes(char *p, unsigned long n, const int *to, int node, int *status)
{
	void *addrs[n];
	int nodes[n];

	for (unsigned long i = 0; i < n; i++) {
		addrs[i] = p + i * PAGE_SIZE;
		nodes[i] = to ? to[i] : node;
	}
	return syscall(SYS_move_pages, 0, n, addrs, nodes, status, MPOL_MF_MOVE);
}

/*
 * @tables tables of tagged pages, held by a child (holder()) until the
 * caller closes @fds[1].  On a kernel with the feature the process opts in
 * first, and the fork must share every table.  NULL: no area, pipe or
 * child.
 */
static char *__held_area(struct __test_metadata *_metadata,
			 unsigned long tables, int fds[2], pid_t *pid)
{
	bool feature = opt_in();
	long before = vmstat("cow_pte_share");
	char *p = tagged_area(tables, 1);

	if (!p || pipe(fds))
		return NULL;
	*pid = holder(p, tables * PER_TABLE, 1, fds);
	if (feature)
		EXPECT_LE(tables, vmstat("cow_pte_share") - before)
			TH_LOG("the fork did not share the tables");
	return *pid < 0 ? NULL : p;
}
#define held_area(tables, fds, pid)	__held_area(_metadata, tables, fds, pid)

TEST_F_TIMEOUT(equiv, proc_and_migration_count_every_holder, EQUIV_TIMEOUT)
{
	const unsigned long pages = PROC_TABLES * PER_TABLE;
	long rss, pss, shared, mapmax;
	static int status[PROC_TABLES * PER_TABLE];
	static int nodes[PROC_TABLES * PER_TABLE];
	static int other[PROC_TABLES * PER_TABLE];
	unsigned long excl, moved, mask;
	int fds[2], node;
	pid_t pid;
	char *p;

	p = held_area(PROC_TABLES, fds, &pid);
	ASSERT_NE(NULL, p);

	rss = smaps_kb(p, "Rss:");
	pss = smaps_kb(p, "Pss:");
	shared = smaps_kb(p, "Shared_Clean:") + smaps_kb(p, "Shared_Dirty:");
	excl = count_pagemap(p, pages, PM_PRESENT | PM_MMAP_EXCLUSIVE);
	mapmax = numa_mapmax(p);
	TH_LOG("smaps Rss %ld kB Pss %ld kB Shared %ld kB; %lu of %lu pages exclusive in pagemap; numa_maps mapmax=%ld",
	       rss, pss, shared, excl, pages, mapmax);
	EXPECT_EQ((long)(pages * PAGE_SIZE >> 10), rss);
	EXPECT_GE(1, labs(pss - rss / 2));
	EXPECT_EQ(rss, shared);
	EXPECT_EQ(0, excl);
	EXPECT_EQ(2, mapmax);

	/*
	 * Migration: each page would move the child's memory too.  Under the
	 * soak, NUMA balancing moves pages meanwhile, and move_pages() reports
	 * a page already on the target node as there, not refused (1124 of
	 * 2048 in one soak): placement is not this test's to check there.
	 * Each page is sent to the node it is not on: a fill during which the
	 * scheduler moved this task to the other node's CPUs left pages on
	 * both (29 and 2019 in a run of 2026-11-28 with a second guest beside;
	 * every second page under numactl --interleave=all).
	 */
	ASSERT_TRUE(page_nodes(p, pages, nodes));
	node = nodes[0];
	if (node < 0 || access("/sys/devices/system/node/node1", F_OK) ||
	    in_soak()) {
		close(fds[1]);
		EXPECT_EQ(0, reap(pid)) TH_LOG("the child lost its copy");
		munmap(p, PROC_TABLES * SZ_2M);
		SKIP(return, "%s", in_soak() ? "NUMA balancing (the soak's) moves pages"
					     : "one NUMA node");
	}
	for (unsigned long i = 0; i < pages; i++)
		other[i] = !nodes[i];
	EXPECT_EQ(0, move_to_nodes(p, pages, other, 0, status));
	EXPECT_EQ(pages, count_status(status, pages, -EACCES))
		TH_LOG("move_pages(MPOL_MF_MOVE): %lu of %lu pages refused",
		       count_status(status, pages, -EACCES), pages);
	/* mbind() to one node: the pages on the other stay there */
	mask = 1UL << !node;
	EXPECT_EQ(0, syscall(SYS_mbind, p, pages * PAGE_SIZE, MPOL_BIND, &mask,
			     sizeof(mask) * 8, MPOL_MF_MOVE));
	ASSERT_TRUE(page_nodes(p, pages, status));
	moved = 0;
	for (unsigned long i = 0; i < pages; i++)
		moved += status[i] != nodes[i];
	EXPECT_EQ(0, moved) TH_LOG("mbind(MPOL_MF_MOVE) moved %lu of %lu pages",
				   moved, pages);

	close(fds[1]);
	EXPECT_EQ(0, reap(pid)) TH_LOG("the child lost its copy");
	munmap(p, PROC_TABLES * SZ_2M);
}

/*
 * 6. clear_refs over memory a child holds by fork: writing 1 to
 * /proc/self/clear_refs clears the accessed bits of every page of the
 * process (and the pages' referenced flags), and smaps' Referenced then
 * reads 0 until the pages are touched again.  A shared table's accessed
 * bits are all its holders': they are cleared in place, as aging does.
 */
TEST_F_TIMEOUT(equiv, clear_refs_clears_shared_tables, EQUIV_TIMEOUT)
{
	const unsigned long pages = PROC_TABLES * PER_TABLE;
	long before, after;
	int fds[2];
	pid_t pid;
	char *p;

	p = held_area(PROC_TABLES, fds, &pid);
	ASSERT_NE(NULL, p);
	before = smaps_kb(p, "Referenced:");
	EXPECT_EQ(0, write_knob("/proc/self/clear_refs", "1\n"));
	after = smaps_kb(p, "Referenced:");
	TH_LOG("smaps Referenced %ld kB before clear_refs, %ld kB after", before,
	       after);
	EXPECT_EQ((long)(pages * PAGE_SIZE >> 10), before);
	EXPECT_EQ(0, after);
	close(fds[1]);
	EXPECT_EQ(0, reap(pid)) TH_LOG("the child lost its copy");
	munmap(p, PROC_TABLES * SZ_2M);
}

/*
 * 7. What reads the RSS of a child that nothing asked before: a fork that
 * shares a table leaves it out of the child's RSS counters, and counts it
 * when they are first read (the lazy count, which keeps fork O(tables)).
 * Each child here holds the area by fork and makes one first read: on
 * vanilla every one finds the area, as the fork counted every page.
 *  - exit, exec: the peak RSS that wait4() reports (ru_maxrss), taken
 *    as the mm goes;
 *  - munmap of the area, then VmHWM: the tables went uncounted;
 *  - /proc/self/statm and /proc/self/stat: their resident pages;
 *  - the parent reads /proc/<child>/oom_score: the child's score is the
 *    parent's (both map the area; the parent's own 2 MiB aside).
 */
#define PEAK_TABLES	64

enum first_read { AT_EXIT, AT_EXEC, AFTER_MUNMAP, STATM_STAT };

/* Resident pages in /proc/self/statm (2nd field) or stat (24th), -1 */
static long resident_pages(const char *file)
{
	char buf[1024], *s;
	long val = -1;
	size_t n;
	FILE *f;

	f = fopen(file, "r");
	if (!f)
		return -1;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	if (!strcmp(file, "/proc/self/statm")) {
		sscanf(buf, "%*s %ld", &val);
		return val;
	}
	/* after the command's ")": fields 3 (state) to 23, then rss */
	s = strrchr(buf, ')');
	for (int field = 3; s && field <= 24; field++)
		s = strchr(s + 1, ' ');
	if (s)
		sscanf(s, "%ld", &val);
	return val;
}

/* Fork a child that makes @how its first read; its ru_maxrss (kB), -1 */
static long first_read_child(char *p, unsigned long len, enum first_read how)
{
	long min_kb = (len >> 10) - RSS_SLACK_KB;
	long min_pages = min_kb / (PAGE_SIZE >> 10);
	struct rusage ru;
	int status;
	pid_t pid;

	pid = fork();
	if (!pid) {
		switch (how) {
		case AT_EXIT:
			_exit(0);
		case AT_EXEC:
			execl("/bin/true", "true", NULL);
			_exit(2);
		case AFTER_MUNMAP:
			if (munmap(p, len))
				_exit(2);
			_exit(status_kb("VmHWM:") < min_kb ? 3 : 0);
		case STATM_STAT:
			if (resident_pages("/proc/self/statm") < min_pages)
				_exit(4);
			_exit(resident_pages("/proc/self/stat") < min_pages ? 5 : 0);
		}
	}
	if (pid < 0 || wait4(pid, &status, 0, &ru) != pid ||
	    !WIFEXITED(status))
		return -1;
	if (WEXITSTATUS(status))
		return -WEXITSTATUS(status);
	return ru.ru_maxrss;
}

static long oom_score(pid_t pid)
{
	char path[64], val[32];

	snprintf(path, sizeof(path), "/proc/%d/oom_score", pid);
	return read_knob(path, val, sizeof(val)) ? -1 : atol(val);
}

TEST_F_TIMEOUT(equiv, first_reads_of_a_child_rss, EQUIV_TIMEOUT)
{
	static const char * const names[] = {
		"exit", "exec", "munmap, VmHWM", "statm, stat",
	};
	/*
	 * Under the soak a quarter: 128 MiB filled and read four times
	 * outlasted the test's time limit in 1 of 4 runs of a 30-min soak
	 */
	const unsigned long tables = in_soak() ? PEAK_TABLES / 4 : PEAK_TABLES;
	const unsigned long len = tables * SZ_2M;
	long maxrss, child, parent;
	int fds[2];
	pid_t pid;
	char *p;

	p = held_area(tables, fds, &pid);
	ASSERT_NE(NULL, p);
	child = oom_score(pid);
	parent = oom_score(getpid());
	TH_LOG("oom_score: child %ld, parent %ld", child, parent);
	EXPECT_LT(0, child);
	EXPECT_GE(1, labs(child - parent));
	close(fds[1]);
	EXPECT_EQ(0, reap(pid)) TH_LOG("the child lost its copy");

	for (int how = AT_EXIT; how <= STATM_STAT; how++) {
		maxrss = first_read_child(p, len, how);
		TH_LOG("first read at %s: ru_maxrss %ld kB (the area %lu kB)",
		       names[how], maxrss, len >> 10);
		EXPECT_LE((long)(len >> 10) - RSS_SLACK_KB, maxrss)
			TH_LOG("at %s: a negative number is the child's failed step (3: VmHWM, 4: statm, 5: stat)",
			       names[how]);
	}
	munmap(p, len);
}

/*
 * 8. A memcg OOM while a child holds shared tables nothing has counted yet:
 * the OOM killer's badness counts them (if it gets the child's mmap_lock at
 * once), under the task's lock, then picks its victim.  On vanilla the
 * victim is the process that ran the memcg out of memory: it maps the most.
 * The holder and its parent keep their memory, and nothing splats (the run
 * fails on a lockdep report).
 */
#define OOM_CGROUP	CGROUP_ROOT "/ptlab-equiv-oom"
#define OOM_TABLES	16

static int write_memcg(const char *file, const char *val)
{
	char path[256];

	snprintf(path, sizeof(path), "%s/%s", OOM_CGROUP, file);
	return write_knob(path, val);
}

static void show_memcg_events(void)
{
	char line[256];
	FILE *f = fopen(OOM_CGROUP "/memory.events", "r");

	while (f && fgets(line, sizeof(line), f))
		printf("# memory.events: %s", line);
	if (f)
		fclose(f);
}

#define OOM_WAIT_SECONDS	240

/* Print a file of /proc/@pid, each line with @pid before it */
static void show_proc(pid_t pid, const char *file)
{
	char path[64], line[256];
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/%s", pid, file);
	f = fopen(path, "r");
	while (f && fgets(line, sizeof(line), f))
		printf("# %d %s: %s", pid, file, line);
	if (f)
		fclose(f);
}

/*
 * Wait up to @secs for @pid; if it still runs then, print its state, its
 * kernel stack and the memcg's events, kill it and reap it.  true: it
 * ended by itself, and @status says how.
 */
static bool wait_or_show(pid_t pid, int *status, int secs)
{
	for (int i = 0; i < secs * 10; i++) {
		if (waitpid(pid, status, WNOHANG) == pid)
			return true;
		usleep(100 * 1000);
	}
	show_proc(pid, "status");
	show_proc(pid, "wchan");
	show_proc(pid, "stack");
	show_memcg_events();
	kill(pid, SIGKILL);
	waitpid(pid, status, 0);
	return false;
}

TEST_F_TIMEOUT(equiv, memcg_oom_meets_uncounted_tables, EQUIV_TIMEOUT)
{
	const unsigned long hog_len = 256 * SZ_1M;
	int fds[2], status;
	pid_t pid, hog;
	char *p;

	if (!enter_memcg(OOM_CGROUP))
		SKIP(return, "no memory cgroup");
	if (write_memcg("memory.max", "96M\n") ||
	    write_memcg("memory.swap.max", "0\n")) {
		leave_memcg(OOM_CGROUP);
		SKIP(return, "no memory.max or memory.swap.max");
	}
	p = held_area(OOM_TABLES, fds, &pid);
	ASSERT_NE(NULL, p);
	hog = fork();
	if (!hog) {
		char *h = mmap(NULL, hog_len, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (h == MAP_FAILED)
			_exit(2);
		for (unsigned long off = 0; off < hog_len; off += PAGE_SIZE)
			h[off] = 1;
		_exit(3);	/* not killed: the limit did not hold */
	}
	ASSERT_LE(0, hog);
	/*
	 * A KASAN soak saw this test pass its 300 s twice (sessions 23 and
	 * 25), with no hung task and no splat: what the hog is doing then is
	 * worth more than the harness's timeout.
	 */
	ASSERT_TRUE(wait_or_show(hog, &status, OOM_WAIT_SECONDS))
		TH_LOG("the hog still ran after %d s", OOM_WAIT_SECONDS);
	EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
		TH_LOG("the hog was not the OOM victim: status %#x", status);
	close(fds[1]);
	EXPECT_EQ(0, reap(pid)) TH_LOG("the holder was killed or lost its copy");
	EXPECT_EQ(0, count_bad(p, OOM_TABLES * PER_TABLE, 1));
	munmap(p, OOM_TABLES * SZ_2M);
	leave_memcg(OOM_CGROUP);
}

/*
 * 9. The faults a program counts (getrusage()'s ru_minflt, /proc's minflt,
 * perf's page-faults): one per access that faults, as on vanilla, where
 * the child's tables are copies.  A read of a hole and a write of a page
 * that fork left to both: one fault each.  Under a shared table the first
 * such access of a holder also breaks the share; that must not make it a
 * second fault (the break used to return, and the access fault again).
 */
#define FAULT_TABLES	16

/* This thread's faults so far, minor and major */
static long minflt(long *majflt)
{
	struct rusage ru;

	getrusage(RUSAGE_THREAD, &ru);
	*majflt = ru.ru_majflt;
	return ru.ru_minflt;
}

/* Read the hole of each of the first tables, write a page of each other */
static void __attribute__((noinline)) access_tables(char *p, unsigned long hole,
						    unsigned long round)
{
	for (int t = 0; t < FAULT_TABLES; t++)
		load_word(first_word(p + t * SZ_2M + hole * PAGE_SIZE));
	for (int t = FAULT_TABLES; t < 2 * FAULT_TABLES; t++)
		write_tag(p + t * SZ_2M, tag(round, t));
}

TEST_F_TIMEOUT(equiv, faults_count_once_under_shared_tables, EQUIV_TIMEOUT)
{
	const unsigned long len = 2 * FAULT_TABLES * SZ_2M;
	const unsigned long hole = PER_TABLE - 1;
	long before = vmstat("cow_pte_share"), breaks;
	bool feature = opt_in();
	long faults, majflt, majflt_after;
	char *warm;
	int fds[2];
	pid_t pid;
	char *p;

	p = tagged_area(2 * FAULT_TABLES, 1);
	ASSERT_NE(NULL, p);
	/* the first FAULT_TABLES tables get a hole: their last page */
	for (int t = 0; t < FAULT_TABLES; t++)
		ASSERT_EQ(0, madvise(p + t * SZ_2M + hole * PAGE_SIZE,
				     PAGE_SIZE, MADV_DONTNEED));
	ASSERT_EQ(0, pipe(fds));
	pid = holder(p, 0, 1, fds);
	ASSERT_LE(0, pid);
	if (feature)
		EXPECT_LE(2 * FAULT_TABLES, vmstat("cow_pte_share") - before)
			TH_LOG("the fork did not share the tables");

	/*
	 * Run the code once first, on an area of its own: the harness forks
	 * each test, and the text and stack pages it has not run yet fault
	 * once (the first getrusage() copies out to a stack page fork
	 * write-protected).
	 */
	warm = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, warm);
	access_tables(warm, hole, 2);
	minflt(&majflt);
	breaks = vmstat("cow_pte_break") + vmstat("cow_pte_reuse");
	faults = minflt(&majflt);
	access_tables(p, hole, 2);
	faults = minflt(&majflt_after) - faults;
	breaks = vmstat("cow_pte_break") + vmstat("cow_pte_reuse") - breaks;
	TH_LOG("%ld faults for %d reads of holes and %d writes, each in a table of its own",
	       faults, FAULT_TABLES, FAULT_TABLES);
	if (feature)
		EXPECT_LE(2 * FAULT_TABLES, breaks) TH_LOG("the accesses broke no share");
	/*
	 * Exactly one per access: the code and stack are touched already.
	 * Not under the soak, nor after a major fault: a page swapped out or
	 * under migration (NUMA balancing) faults again, on vanilla too.
	 */
	if (in_soak() || majflt_after != majflt)
		TH_LOG("not counted: %s", in_soak() ? "the soak" : "a major fault");
	else
		EXPECT_EQ(2 * FAULT_TABLES, faults);

	close(fds[1]);
	EXPECT_EQ(0, reap(pid)) TH_LOG("the child lost its copy");
	munmap(warm, len);
	munmap(p, len);
}

/*
 * 10. process_mrelease() of a child killed while it holds shared tables:
 * the OOM reaper's zap (no mmap_lock for write, the VMAs still in the tree)
 * lets go of each table the child holds, while the parent keeps them.  On
 * vanilla it frees the child's copies.  Either way the parent's data and
 * RSS stay.  The call must come after the kill and before the child's
 * exit_mm() (else ESRCH: nothing left to reap): the child runs on the
 * parent's CPU at nice 19, so that the parent's call comes first; a round
 * that still loses the race is tried again.
 */
#define MRELEASE_TABLES	16
#define MRELEASE_ROUNDS	10

TEST_F_TIMEOUT(equiv, mrelease_of_a_holder, EQUIV_TIMEOUT)
{
	const unsigned long pages = MRELEASE_TABLES * PER_TABLE;
	long rss_before, rss_after, drops;
	int fds[2], pidfd, ret, round;
	bool feature = opt_in();
	cpu_set_t cpu0;
	pid_t pid;
	char *p;

	CPU_ZERO(&cpu0);
	CPU_SET(0, &cpu0);
	ASSERT_EQ(0, sched_setaffinity(0, sizeof(cpu0), &cpu0));
	for (round = 1; round <= MRELEASE_ROUNDS; round++) {
		p = held_area(MRELEASE_TABLES, fds, &pid);
		ASSERT_NE(NULL, p);
		ASSERT_EQ(0, setpriority(PRIO_PROCESS, pid, 19));
		rss_before = status_kb("RssAnon:");
		drops = vmstat("cow_pte_drop");
		pidfd = syscall(SYS_pidfd_open, pid, 0);
		ASSERT_LE(0, pidfd);
		ASSERT_EQ(0, syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0));
		ret = syscall(SYS_process_mrelease, pidfd, 0);
		if (ret)
			ASSERT_EQ(ESRCH, errno) TH_LOG("process_mrelease: %s", strerror(errno));
		/*
		 * The reaper's own drops: the child, at nice 19 on this CPU,
		 * has not run its exit yet, nor has anybody else on the
		 * plan's idle guest (a lower bound under the soak)
		 */
		if (feature && !ret)
			EXPECT_LE(MRELEASE_TABLES, vmstat("cow_pte_drop") - drops)
				TH_LOG("process_mrelease dropped no shared table");
		EXPECT_EQ(-1, reap(pid)) TH_LOG("the child was not killed");
		close(pidfd);
		close(fds[1]);

		rss_after = status_kb("RssAnon:");
		EXPECT_EQ(0, count_bad(p, pages, 1)) TH_LOG("the parent lost data");
		/* under the soak's pressure the parent's pages may swap out */
		if (!in_soak())
			EXPECT_GE(RSS_SLACK_KB, labs(rss_after - rss_before))
				TH_LOG("RssAnon %ld kB before, %ld after",
				       rss_before, rss_after);
		munmap(p, MRELEASE_TABLES * SZ_2M);
		if (!ret)
			break;
	}
	if (round <= MRELEASE_ROUNDS)
		TH_LOG("process_mrelease reaped the child in round %d", round);
	else
		TH_LOG("the child's exit came first in every round");
	EXPECT_GE(MRELEASE_ROUNDS, round);
}


/*
 * 11. Pages that look pinned, in memory that fork shared.  A page
 * vmsplice()d over a thousand times has the refcount of a pinned page
 * (folio_maybe_dma_pinned()), and fork copies such a page for the child
 * only if the parent ever pinned (MMF_HAS_PINNED): this parent had not,
 * so vanilla's child maps the parent's page.  The child then pins
 * something (process_vm_readv() pins what it reads) and writes another
 * page of the first table (a break, here), and the parent pins and forks
 * again while the second table is still shared (a fork that copies out of
 * it, here).  Vanilla: both children map the parent's pages (the second
 * fork finds them shared already, not exclusive: nothing to copy), at the
 * same pfn, not exclusive in pagemap.  A break or a fork that took the
 * pin it saw then for one at the share copied the page: another pfn.
 */
#define PIN_TABLES	2

/* Pin a page of this process (MMF_HAS_PINNED): 0, or -1 */
static int pin_something(void)
{
	char buf[64], src[64] = "pinned by process_vm_readv";
	struct iovec local = { buf, sizeof(buf) };
	struct iovec remote = { src, sizeof(src) };

	return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) ==
	       sizeof(buf) ? 0 : -1;
}

/* The pagemap entry of @addr in this process (0 if unreadable) */
static uint64_t own_pagemap(char *addr)
{
	int fd = open("/proc/self/pagemap", O_RDONLY);
	uint64_t e = fd < 0 ? 0 : pagemap_entry(fd, addr);

	if (fd >= 0)
		close(fd);
	return e;
}

/*
 * 0 if this process maps @addr at @pfn and not exclusively, else @err.
 * Under the soak's memory pressure reclaim may swap the page out (it is
 * not exclusive after the fork, on vanilla too): no pfn to compare then.
 */
static int maps_shared_pfn(char *addr, uint64_t pfn, int err)
{
	uint64_t e = own_pagemap(addr);

	if (!(e & PM_PRESENT) && in_soak())
		return 0;
	return (e & PM_PRESENT) && (e & PM_PFN) == pfn &&
	       !(e & PM_MMAP_EXCLUSIVE) ? 0 : err;
}

TEST_F_TIMEOUT(equiv, maybe_pinned_pages_are_not_copied, EQUIV_TIMEOUT)
{
	const unsigned long pages = PIN_TABLES * PER_TABLE;
	struct vmsplice_pin pin1, pin2;
	bool feature = opt_in();
	long shares = vmstat("cow_pte_share");
	uint64_t pfn1, pfn2;
	char *p, *x1, *x2, c;
	int fds[2], rc;
	pid_t a, b;

	p = tagged_area(PIN_TABLES, 1);
	ASSERT_NE(NULL, p);
	x1 = p + PER_TABLE / 2 * PAGE_SIZE;
	x2 = x1 + SZ_2M;
	ASSERT_LE(GUP_PIN_COUNTING_BIAS + 64, vmsplice_pin(&pin1, x1));
	ASSERT_LE(GUP_PIN_COUNTING_BIAS + 64, vmsplice_pin(&pin2, x2));
	pfn1 = own_pagemap(x1) & PM_PFN;
	pfn2 = own_pagemap(x2) & PM_PFN;
	ASSERT_TRUE(pfn1 && pfn2) TH_LOG("no pfn in pagemap (not root?)");
	ASSERT_EQ(0, pipe(fds));

	a = fork();
	ASSERT_LE(0, a);
	if (!a) {
		close(fds[1]);
		if (pin_something())
			_exit(1);
		/* the same tag again: a write, which breaks the share */
		fill(p, 1, 1);
		rc = maps_shared_pfn(x1, pfn1, 2);
		if (!rc && count_bad(p, pages, 1))
			rc = 3;
		/* the second table stays shared until the parent's fork */
		if (read(fds[0], &c, 1) < 0 && !rc)
			rc = 4;
		_exit(rc);
	}
	close(fds[0]);
	if (feature)
		EXPECT_LE(PIN_TABLES, vmstat("cow_pte_share") - shares)
			TH_LOG("the fork did not share the tables");

	ASSERT_EQ(0, pin_something());
	b = fork();
	ASSERT_LE(0, b);
	if (!b)
		_exit(maps_shared_pfn(x2, pfn2, 2) ?:
		      count_bad(p, pages, 1) ? 3 : 0);
	EXPECT_EQ(0, reap(b))
		TH_LOG("the second child: 2 its page of the shared table is another or exclusive, 3 bad data");
	close(fds[1]);
	EXPECT_EQ(0, reap(a))
		TH_LOG("the first child: 1 no pin, 2 the page after its write elsewhere is another or exclusive, 3 bad data");
	EXPECT_EQ(0, count_bad(p, pages, 1));
	vmsplice_unpin(&pin1);
	vmsplice_unpin(&pin2);
	munmap(p, PIN_TABLES * SZ_2M);
}


/*
 * 12. The parent writes memory its child let go of without writing it
 * (the child exited).  Vanilla's fork write-protected the parent's entries
 * and cleared its pages' exclusive bits: each write then faults once, and
 * a page that something else still references (vmsplice()d into a pipe
 * before the fork) is copied, so the pipe keeps what the page held at
 * fork.  A last holder that took its table back as it was wrote in place,
 * without a fault: the pipe's reader saw the write made after the fork.
 */
#define LETGO_TABLES	4

TEST_F_TIMEOUT(equiv, parent_writes_after_the_child_let_go, EQUIV_TIMEOUT)
{
	const unsigned long pages = LETGO_TABLES * PER_TABLE;
	const unsigned long mid = PER_TABLE / 2;
	long before = vmstat("cow_pte_share");
	long faults, majflt, majflt_after;
	bool feature = opt_in();
	unsigned long word;
	struct iovec iov;
	char *p, *warm;
	int fds[2];

	p = tagged_area(LETGO_TABLES, 1);
	ASSERT_NE(NULL, p);
	ASSERT_EQ(0, pipe(fds));
	iov.iov_base = p + mid * PAGE_SIZE;
	iov.iov_len = PAGE_SIZE;
	ASSERT_EQ(PAGE_SIZE, vmsplice(fds[1], &iov, 1, 0));
	ASSERT_EQ(0, fork_a_child_that_exits());
	if (feature)
		EXPECT_LE(LETGO_TABLES, vmstat("cow_pte_share") - before)
			TH_LOG("the fork did not share the tables");

	/* the code and stack fault before, as in faults_count_once_... */
	warm = mmap(NULL, pages * PAGE_SIZE, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, warm);
	fill(warm, pages, 2);
	minflt(&majflt);
	faults = minflt(&majflt);
	fill(p, pages, 2);
	faults = minflt(&majflt_after) - faults;
	TH_LOG("%ld faults for the first writes of %lu pages", faults, pages);
	if (in_soak() || majflt_after != majflt)
		TH_LOG("not counted: %s", in_soak() ? "the soak" : "a major fault");
	else
		EXPECT_EQ((long)pages, faults);
	ASSERT_EQ(sizeof(word), read(fds[0], &word, sizeof(word)));
	EXPECT_EQ(tag(1, mid), word)
		TH_LOG("the pipe reads %lx, written after the fork", word);
	EXPECT_EQ(0, count_bad(p, pages, 2));
	close(fds[0]);
	close(fds[1]);
	munmap(warm, pages * PAGE_SIZE);
	munmap(p, pages * PAGE_SIZE);
}

/*
 * 13. A THP that a split left mapped by PTEs (one page write-protected and
 * back), its upper half unmapped, held by the parent and two children.
 * The parent unmaps all but the last KEPT pages of the rest and asks to
 * move those with move_pages(MPOL_MF_MOVE).  The kernel guesses whether a
 * large folio is mapped by other processes from its total mapcount, then
 * from the mapcount of its first page (folio_likely_mapped_shared()).
 * Vanilla refuses every page (-EACCES): the two children map the first
 * page.  Had fork shared the table, that page would count once for both
 * children, and with 256 + KEPT mappings in all the folio would look like
 * the parent's own: it moved (as in seed 2628 of cow_pte_diff -x -e, with
 * mbind()).  A table that maps a large folio must not be shared.
 */
#define HALF	(PER_TABLE / 2)
#define KEPT	4

TEST_F_TIMEOUT(equiv, thp_mapped_by_ptes_stays_shared, EQUIV_TIMEOUT)
{
	static int status[KEPT];
	long before = vmstat("cow_pte_share");
	bool feature = opt_in();
	int fds[2], node;
	pid_t pid[2];
	char *p;

	if (access("/sys/devices/system/node/node1", F_OK) || in_soak())
		SKIP(return, "%s", in_soak() ? "NUMA balancing (the soak's) moves pages"
					     : "one NUMA node");
	p = map_aligned(SZ_2M, SZ_2M, PROT_READ | PROT_WRITE);
	ASSERT_NE(NULL, p);
	if (madvise(p, SZ_2M, MADV_HUGEPAGE))
		SKIP(return, "no THP");
	fill(p, PER_TABLE, 1);
	if (smaps_kb(p, "AnonHugePages:") != SZ_2M >> 10) {
		munmap(p, SZ_2M);
		SKIP(return, "no THP came at the fault");
	}
	/* split the PMD, not the folio; khugepaged must not collapse it back */
	ASSERT_EQ(0, mprotect(p + PAGE_SIZE, PAGE_SIZE, PROT_READ));
	ASSERT_EQ(0, mprotect(p + PAGE_SIZE, PAGE_SIZE, PROT_READ | PROT_WRITE));
	ASSERT_EQ(0, madvise(p, SZ_2M, MADV_NOHUGEPAGE));
	EXPECT_EQ(0, smaps_kb(p, "AnonHugePages:"));
	ASSERT_EQ(0, madvise(p + HALF * PAGE_SIZE, HALF * PAGE_SIZE, MADV_DONTNEED));

	/* two holders on one pipe: each would keep the other's open */
	ASSERT_EQ(0, pipe(fds));
	for (int i = 0; i < 2; i++) {
		pid[i] = holder(p, HALF, 1, (int [2]){ dup(fds[0]), fds[1] });
		ASSERT_LE(0, pid[i]);
	}
	close(fds[0]);
	TH_LOG("%ld tables shared by the forks%s", vmstat("cow_pte_share") - before,
	       feature ? "" : " (no COW page tables)");
	ASSERT_EQ(0, madvise(p, (HALF - KEPT) * PAGE_SIZE, MADV_DONTNEED));

	ASSERT_TRUE(page_nodes(p + (HALF - KEPT) * PAGE_SIZE, 1, &node));
	ASSERT_LE(0, node);
	EXPECT_EQ(0, move_to_nodes(p + (HALF - KEPT) * PAGE_SIZE, KEPT, NULL, !node,
				   status));
	EXPECT_EQ(KEPT, count_status(status, KEPT, -EACCES))
		TH_LOG("move_pages(MPOL_MF_MOVE): %lu of %d pages refused, %lu moved",
		       count_status(status, KEPT, -EACCES), KEPT,
		       count_status(status, KEPT, !node));
	EXPECT_EQ(0, count_bad_from(p, HALF - KEPT, KEPT, 1));

	close(fds[1]);
	for (int i = 0; i < 2; i++)
		EXPECT_EQ(0, reap(pid[i])) TH_LOG("a child lost its copy");
	munmap(p, SZ_2M);
}

/*
 * 14. NUMA balancing of pages that a fork left to the parent alone: the
 * child exits without touching them, and the parent, moved to a CPU of the
 * other node, only reads them.  On vanilla each page is mapped once after
 * the exit: the scanner makes its entries PROT_NONE, the reads take hinting
 * faults and the pages move to the reader's node.  With the tables shared,
 * the parent is their last holder, and they stay read-only until it writes
 * them: the scanner must not pass them by (it did: 0 pages moved).  The
 * scanner's debugfs knobs (CONFIG_SCHED_DEBUG) make it scan every 10 ms.
 */
#define NUMAB_DIR	"/sys/kernel/debug/sched/numa_balancing"
#define NUMAB_TABLES	2
#define NUMAB_SECONDS	60

static struct knob numab_knobs[] = {
	{ .path = "/proc/sys/kernel/numa_balancing" },
	{ .path = NUMAB_DIR "/scan_delay_ms" },
	{ .path = NUMAB_DIR "/scan_period_min_ms" },
	{ .path = NUMAB_DIR "/scan_period_max_ms" },
};

TEST_F_TIMEOUT(equiv, numa_balancing_moves_a_last_holders_pages, EQUIV_TIMEOUT)
{
	const unsigned long pages = NUMAB_TABLES * PER_TABLE;
	int cpu0 = node_first_cpu(0), cpu1 = node_first_cpu(1);
	long before = vmstat("cow_pte_share");
	bool feature = opt_in();
	unsigned long moved = 0;
	static int nodes[NUMAB_TABLES * PER_TABLE];
	time_t end;
	char *p;

	if (cpu1 < 0 || in_soak())
		SKIP(return, "%s", in_soak() ? "NUMA balancing is the soak's"
					     : "one NUMA node");
	if (access(NUMAB_DIR, F_OK))
		SKIP(return, "no %s (CONFIG_SCHED_DEBUG)", NUMAB_DIR);
	ASSERT_EQ(0, pin_to_cpu(cpu0));
	p = tagged_area(NUMAB_TABLES, 1);
	ASSERT_NE(NULL, p);
	ASSERT_TRUE(page_nodes(p, pages, nodes));
	for (unsigned long i = 0; i < pages; i++)
		if (nodes[i] != 0)
			SKIP(return, "page %lu came on node %d, not 0", i, nodes[i]);

	ASSERT_EQ(0, fork_a_child_that_exits());
	if (feature)
		EXPECT_LE(NUMAB_TABLES, vmstat("cow_pte_share") - before)
			TH_LOG("the fork shared nothing");

	save_knob_list(numab_knobs, ARRAY_SIZE(numab_knobs));
	ASSERT_EQ(0, write_knob(NUMAB_DIR "/scan_delay_ms", "0\n"));
	ASSERT_EQ(0, write_knob(NUMAB_DIR "/scan_period_min_ms", "10\n"));
	ASSERT_EQ(0, write_knob(NUMAB_DIR "/scan_period_max_ms", "10\n"));
	ASSERT_EQ(0, write_knob("/proc/sys/kernel/numa_balancing", "1\n"));
	ASSERT_EQ(0, pin_to_cpu(cpu1));
	/* read until half the pages moved, or the time is up */
	for (end = time(NULL) + NUMAB_SECONDS; time(NULL) < end && moved < pages / 2;) {
		EXPECT_EQ(0, count_bad(p, pages, 1));
		ASSERT_TRUE(page_nodes(p, pages, nodes));
		moved = 0;
		for (unsigned long i = 0; i < pages; i++)
			moved += nodes[i] == 1;
	}
	restore_knob_list(numab_knobs, ARRAY_SIZE(numab_knobs));
	TH_LOG("%lu of %lu pages moved to node 1 in %ld s of reads", moved,
	       pages, NUMAB_SECONDS - (long)(end - time(NULL)));
	EXPECT_LT(0, moved);
	munmap(p, NUMAB_TABLES * SZ_2M);
}

/*
 * 15. A core dump when a break cannot allocate: the dump reads the pages
 * of a shared table through it, as vanilla reads a page fork left to both.
 * It broke each table instead, and a page whose break failed was a hole
 * of zeros in the dump (1 of 1024 pages lost with the first break
 * failing), where vanilla allocates nothing and loses nothing.
 */
#define FAIL_COW_PTE	"/sys/kernel/debug/fail_cow_pte/"

static struct knob fail_knobs[] = {
	{ .path = FAIL_COW_PTE "probability" },
	{ .path = FAIL_COW_PTE "times" },
	{ .path = FAIL_COW_PTE "task-filter" },
};

TEST_F_TIMEOUT(equiv, core_dump_allocates_nothing, EQUIV_TIMEOUT)
{
	unsigned long pages = CORE_TABLES * PER_TABLE;
	long good;
	char *p;

	if (!opt_in() || access(FAIL_COW_PTE, F_OK))
		SKIP(return, "no COW page tables or no fail_cow_pte");
	p = tagged_area(CORE_TABLES, 1);
	ASSERT_NE(NULL, p);
	save_knob_list(fail_knobs, ARRAY_SIZE(fail_knobs));
	ASSERT_EQ(0, write_knob(FAIL_COW_PTE "task-filter", "Y"));
	ASSERT_EQ(0, write_knob(FAIL_COW_PTE "times", "1"));
	ASSERT_EQ(0, write_knob(FAIL_COW_PTE "probability", "100"));
	good = dump_child(_metadata, p, true);
	restore_knob_list(fail_knobs, ARRAY_SIZE(fail_knobs));
	ASSERT_LE(0, good) TH_LOG("no segment of the area in the dump (%ld)",
				  good);
	EXPECT_EQ(pages, good) TH_LOG("the dump lost pages: a break failed");
	munmap(p, pages * PAGE_SIZE);
}

/*
 * 16. The first write to a shared table, by a thread whose sibling on
 * another CPU has been reading the page: once the sibling sees the
 * writer's flag, stored after the write, the page reads what was written.
 * With the feature, that write breaks the share and copies the page in
 * the break (one TLB flush for both): a flush that missed the sibling's
 * CPU leaves it reading the old page through its TLB, the fork-time tag.
 * The flag lives in a MAP_SHARED page, which no fork makes COW.  Each
 * round shares a fresh table with a holder and writes another page of it.
 */
#define SEEN_ROUNDS	200
#define SEEN_MS		8000

struct sibling {
	unsigned long *word;	/* the word watched, published by @go */
	unsigned long *flag;	/* __atomic: the round whose write is done */
	int go, ready;		/* __atomic: the round to watch, watching */
	int checked;		/* __atomic: the last round read after its flag */
	unsigned long stale;	/* rounds that read the old value after the flag */
	bool old;		/* the first of them read the fork-time tag */
	bool stop;
};

static void *watch_word(void *arg)
{
	struct sibling *s = arg;
	int round = 0;

	pin_to_cpu(1);
	for (;;) {
		unsigned long *word, val;

		while (__atomic_load_n(&s->go, __ATOMIC_ACQUIRE) == round)
			if (__atomic_load_n(&s->stop, __ATOMIC_RELAXED))
				return NULL;
		round++;
		word = s->word;
		/* the old page in this CPU's TLB before the write */
		(void)load_word(word);
		__atomic_store_n(&s->ready, round, __ATOMIC_RELEASE);
		while (__atomic_load_n(s->flag, __ATOMIC_ACQUIRE) != round)
			(void)load_word(word);
		val = load_word(word);
		if (val != written(round) && !s->stale++)
			s->old = val == tag(round, round % PER_TABLE);
		__atomic_store_n(&s->checked, round, __ATOMIC_RELEASE);
	}
}

TEST_F_TIMEOUT(equiv, first_write_is_seen_by_every_thread, EQUIV_TIMEOUT)
{
	long breaks = vmstat("cow_pte_break");
	bool feature = opt_in();
	struct sibling s = { 0 };
	long start = now_ms();
	pthread_t thread;
	int round;
	char *p;

	if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
		SKIP(return, "one CPU");
	p = tagged_area(1, 0);
	ASSERT_NE(NULL, p);
	s.flag = mmap(NULL, PAGE_SIZE, PROT_READ | PROT_WRITE,
		      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, s.flag);
	pin_to_cpu(0);
	ASSERT_EQ(0, pthread_create(&thread, NULL, watch_word, &s));
	for (round = 1; round <= SEEN_ROUNDS; round++) {
		int fds[2];
		pid_t pid;

		fill(p, PER_TABLE, round);
		ASSERT_EQ(0, pipe(fds));
		pid = holder(p, PER_TABLE, round, fds);
		ASSERT_LE(0, pid);

		s.word = first_word(p + (round % PER_TABLE) * PAGE_SIZE);
		__atomic_store_n(&s.go, round, __ATOMIC_RELEASE);
		while (__atomic_load_n(&s.ready, __ATOMIC_ACQUIRE) != round)
			;
		store_word(s.word, written(round));
		__atomic_store_n(s.flag, round, __ATOMIC_RELEASE);
		/* the next round's fill() must not overwrite what it reads */
		while (__atomic_load_n(&s.checked, __ATOMIC_ACQUIRE) != round)
			;

		close(fds[1]);
		ASSERT_EQ(0, reap(pid)) TH_LOG("the child lost its copy");
		if (now_ms() - start > SEEN_MS)
			break;
	}
	__atomic_store_n(&s.stop, true, __ATOMIC_RELAXED);
	pthread_join(thread, NULL);
	TH_LOG("%d rounds; breaks %ld", round - 1,
	       vmstat("cow_pte_break") - breaks);
	EXPECT_EQ(0, s.stale)
		TH_LOG("%lu rounds: the sibling read %s after the write",
		       s.stale, s.old ? "the old page" : "neither page");
	if (feature)
		EXPECT_LE(round - 1, vmstat("cow_pte_break") - breaks)
			TH_LOG("the writes did not break shared tables");
	munmap(s.flag, PAGE_SIZE);
	munmap(p, SZ_2M);
}

TEST_HARNESS_MAIN
