// SPDX-License-Identifier: GPL-2.0
/*
 * cow_pte_race: COW page tables (CONFIG_COW_PTE) against everything that
 * walks or changes a PTE table at the same time, for RACE_SECONDS.
 *
 * The parent opts in and owns a 16 MiB area of tagged pages.  Its threads:
 *  - fork: forks children back to back, up to MAX_CHILDREN alive, each of
 *    which shares the area's tables (a share of tables already shared);
 *  - write: rewrites random pages with their tag: a break (copy) while a
 *    child holds the table, a reuse once none does, under the VMA lock
 *    first (which retries under mmap_lock);
 *  - gup: reads random pages through /proc/self/mem (GUP-slow, which
 *    breaks) and vmsplice() (GUP-fast, which must bail on a shared table);
 *  - reclaim: MADV_PAGEOUT of a random table (skips shared ones), and
 *    memory.reclaim of the memcg the parent and its children run in: its
 *    rmap walks age and swap out pages of shared tables in place;
 *  - migrate: move_pages() of a random table to the other node (moves the
 *    pages of shared tables in place);
 *  - zap: MADV_DONTNEED of a whole random table (a drop while shared; PT
 *    reclaim frees the table once empty and private).
 * Each child meanwhile reads and writes random pages (breaks), zaps part of
 * a table (breaks its edges) or all of it (a drop), forks a grandchild that
 * does the same now and then, checks every page and exits: drops of what it
 * still shares, in whatever order against its parent and grandchild.
 *
 * Every word checked holds the page's tag, zero (zapped), or in a child the
 * tag of whoever wrote it last in its own view (itself, or its parent before
 * the fork): anything else is another process's write, or a write lost.  On
 * a kernel with the feature the counters must show shares, breaks and
 * drops; a table leaked or miscounted makes the kernel's own checks splat
 * (pgtables_bytes, rss-counter, a table freed while shared).
 */
#include <errno.h>
#include <fcntl.h>
#include <numaif.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kselftest_harness.h"
#include "guest_util.h"

#ifndef PR_SET_COW_PTE
#define PR_SET_COW_PTE	0x43505445
#endif

#define RACE_SECONDS	10
#define MIN_FORKS	10	/* enough to have raced anything */
#define AREA		(16 * SZ_1M)
#define PAGES		(AREA / PAGE_SIZE)
#define TABLES		(AREA / SZ_2M)
#define PER_TABLE	(SZ_2M / PAGE_SIZE)
#define MAX_CHILDREN	4
#define CGROUP		CGROUP_ROOT "/ptlab_cow_pte_race"
#define CHILD_OPS	400
#define IO_PAGES	8

/* What a page must hold, as a process sees it: state[] */
#define PARENT		0	/* its tag or zero: never written here */
#define ZERO		1	/* zero: zapped here */
/* else the writer whose tag it holds: this process or its parent */

struct race {
	char *p;
	bool stop;			/* __atomic */
	bool two_nodes;
	bool memcg;			/* in CGROUP */
	unsigned long bad, errors;	/* __atomic */
	unsigned long bad_idx, bad_val;
	const char *last_op;
	int last_errno;
	unsigned long forks, children_failed, child_code;
	unsigned int *state;		/* each process its own copy */
};

static unsigned long tag(unsigned long who, unsigned long i)
{
	return who << 32 | i;
}

static bool stopped(struct race *r)
{
	return __atomic_load_n(&r->stop, __ATOMIC_RELAXED);
}

static void race_error(struct race *r, const char *op)
{
	r->last_errno = errno;
	r->last_op = op;
	__atomic_fetch_add(&r->errors, 1, __ATOMIC_RELAXED);
}

/* The parent's view of a page: its tag or zero */
static void parent_check(struct race *r, char *page, unsigned long i)
{
	unsigned long v[] = { load_word(first_word(page)), load_word(last_word(page)) };

	for (int k = 0; k < 2; k++) {
		if (!v[k] || v[k] == tag(1, i))
			continue;
		if (!__atomic_fetch_add(&r->bad, 1, __ATOMIC_RELAXED)) {
			r->bad_idx = i;
			r->bad_val = v[k];
		}
	}
}

/* --- the parent's threads ---------------------------------------------- */

static void *do_write(void *arg)
{
	struct race *r = arg;
	unsigned int seed = 1;

	while (!stopped(r)) {
		unsigned long i = rand_r(&seed) % PAGES;

		parent_check(r, r->p + i * PAGE_SIZE, i);
		write_tag(r->p + i * PAGE_SIZE, tag(1, i));
	}
	return NULL;
}

static void *do_gup(void *arg)
{
	struct race *r = arg;
	char buf[IO_PAGES * PAGE_SIZE];
	unsigned int seed = 2;
	int mem = open("/proc/self/mem", O_RDONLY);
	int fds[2];

	if (mem < 0 || pipe(fds)) {
		race_error(r, "open /proc/self/mem or pipe");
		return NULL;
	}
	for (unsigned long n = 0; !stopped(r); n++) {
		unsigned long first = rand_r(&seed) % (PAGES - IO_PAGES + 1);
		char *from = r->p + first * PAGE_SIZE;
		struct iovec iov = { from, sizeof(buf) };
		ssize_t got = 0, k;

		if (n % 2) {
			got = pread(mem, buf, sizeof(buf), (unsigned long)from);
		} else if (vmsplice(fds[1], &iov, 1, 0) == sizeof(buf)) {
			while (got < (ssize_t)sizeof(buf) &&
			       (k = read(fds[0], buf + got, sizeof(buf) - got)) > 0)
				got += k;
		}
		if (got != sizeof(buf)) {
			race_error(r, n % 2 ? "pread /proc/self/mem" : "vmsplice");
			break;
		}
		for (unsigned long i = 0; i < IO_PAGES; i++)
			parent_check(r, buf + i * PAGE_SIZE, first + i);
	}
	close(fds[0]);
	close(fds[1]);
	close(mem);
	return NULL;
}

static void *do_reclaim(void *arg)
{
	struct race *r = arg;
	unsigned int seed = 3;

	while (!stopped(r)) {
		char *t = r->p + rand_r(&seed) % TABLES * SZ_2M;

		/* EAGAIN/ENOMEM under pressure: not a failure of ours */
		madvise(t, SZ_2M, MADV_PAGEOUT);
		if (r->memcg)
			memcg_reclaim(CGROUP, "2M");
		usleep(2000);
	}
	return NULL;
}

static void *do_migrate(void *arg)
{
	struct race *r = arg;
	void *addrs[PER_TABLE];
	int nodes[PER_TABLE], status[PER_TABLE];
	unsigned int seed = 4;

	for (unsigned long n = 0; r->two_nodes && !stopped(r); n++) {
		char *t = r->p + rand_r(&seed) % TABLES * SZ_2M;

		for (unsigned long i = 0; i < PER_TABLE; i++) {
			addrs[i] = t + i * PAGE_SIZE;
			nodes[i] = n % 2;
		}
		/*
		 * A page busy (a GUP, a break's copy) stays: no failure.  The
		 * children map these pages too: MPOL_MF_MOVE would leave them.
		 */
		move_pages(0, PER_TABLE, addrs, nodes, status, MPOL_MF_MOVE_ALL);
	}
	return NULL;
}

static void *do_zap(void *arg)
{
	struct race *r = arg;
	unsigned int seed = 5;

	while (!stopped(r)) {
		char *t = r->p + rand_r(&seed) % TABLES * SZ_2M;

		if (madvise(t, SZ_2M, MADV_DONTNEED))
			race_error(r, "MADV_DONTNEED of a table");
		usleep(1000);
	}
	return NULL;
}

/* --- the children -------------------------------------------------------- */

/* A child's check of page @i: exit code 10 + what was wrong */
static int child_check(struct race *r, unsigned long who, unsigned long i)
{
	char *page = r->p + i * PAGE_SIZE;
	unsigned long v[] = { load_word(first_word(page)), load_word(last_word(page)) };

	for (int k = 0; k < 2; k++) {
		switch (r->state[i]) {
		case PARENT:
			if (v[k] && v[k] != tag(1, i))
				return 13;	/* another process's write */
			break;
		case ZERO:
			if (v[k])
				return 12;	/* zapped, yet something shows */
			break;
		default:
			if (v[k] != tag(r->state[i], i))
				return 11;	/* its (parent's) write lost */
		}
	}
	return 0;
}

static int child_run(struct race *r, unsigned long who, unsigned int seed,
		     int depth)
{
	pid_t grandchild = -1;
	int status, ret;

	for (int op = 0; op < CHILD_OPS; op++) {
		unsigned long i = rand_r(&seed) % PAGES;
		unsigned long t = i / PER_TABLE * PER_TABLE;
		unsigned int what = rand_r(&seed) % 32;

		ret = child_check(r, who, i);
		if (ret)
			return ret;
		if (what < 20) {
			write_tag(r->p + i * PAGE_SIZE, tag(who, i));
			r->state[i] = who;
		} else if (what < 28) {
			/* part of a table: the edges break first */
			unsigned long n = 1 + rand_r(&seed) % 64;

			n = i + n > t + PER_TABLE ? t + PER_TABLE - i : n;
			if (madvise(r->p + i * PAGE_SIZE, n * PAGE_SIZE, MADV_DONTNEED))
				return 2;
			for (unsigned long k = i; k < i + n; k++)
				r->state[k] = ZERO;
		} else if (what < 31) {
			/* all of it: the share is dropped, nothing copied */
			if (madvise(r->p + t * PAGE_SIZE, SZ_2M, MADV_DONTNEED))
				return 3;
			for (unsigned long k = t; k < t + PER_TABLE; k++)
				r->state[k] = ZERO;
		} else if (depth == 0 && grandchild < 0) {
			grandchild = fork();
			if (grandchild < 0)
				return 4;
			if (!grandchild)
				_exit(child_run(r, who + 1000, seed + 7, 1));
		}
	}
	for (unsigned long i = 0; i < PAGES; i++) {
		ret = child_check(r, who, i);
		if (ret)
			return ret;
	}
	if (grandchild > 0) {
		if (waitpid(grandchild, &status, 0) != grandchild ||
		    !WIFEXITED(status))
			return 5;
		if (WEXITSTATUS(status))
			return WEXITSTATUS(status) + 20;
	}
	return 0;
}

static void reap_one(struct race *r, pid_t pid, int status)
{
	if (pid <= 0)
		return;
	if (!WIFEXITED(status) || WEXITSTATUS(status)) {
		r->children_failed++;
		r->child_code = WIFEXITED(status) ? WEXITSTATUS(status) : 256;
	}
}

static void *do_fork(void *arg)
{
	struct race *r = arg;
	int alive = 0, status;
	pid_t pid;

	while (!stopped(r)) {
		while (alive >= MAX_CHILDREN) {
			pid = waitpid(-1, &status, 0);
			reap_one(r, pid, status);
			alive -= pid > 0;
		}
		pid = fork();
		if (pid < 0) {
			race_error(r, "fork");
			break;
		}
		if (!pid) {
			/* our own state: copied from the parent's all-PARENT */
			_exit(child_run(r, 2 + r->forks, 11 + r->forks, 0));
		}
		r->forks++;
		alive++;
		while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
			reap_one(r, pid, status);
			alive--;
		}
	}
	while (alive-- > 0) {
		pid = waitpid(-1, &status, 0);
		reap_one(r, pid, status);
	}
	return NULL;
}

static void *(*const workers[])(void *) = {
	do_fork, do_write, do_gup, do_reclaim, do_migrate, do_zap,
};

static const char * const counter_names[] = {
	"cow_pte_share", "cow_pte_break", "cow_pte_reuse", "cow_pte_adopt",
	"cow_pte_drop",
	/* logged only: how much reclaim and migration the race got */
	"pswpout", "pgmigrate_success",
};
#define NR_COUNTERS	(sizeof(counter_names) / sizeof(counter_names[0]))

FIXTURE(race) {
};

FIXTURE_SETUP(race)
{
}

FIXTURE_TEARDOWN(race)
{
}

/* 10 s of the race, and the time its children and checks take under TCG */
TEST_F_TIMEOUT(race, breaks_drops_exits_against_everything, 300)
{
	const int nr = sizeof(workers) / sizeof(workers[0]);
	long before[NR_COUNTERS], after[NR_COUNTERS], pt_before, pt_after;
	pthread_t threads[sizeof(workers) / sizeof(workers[0])];
	bool feature = vmstat("cow_pte_share") >= 0;
	struct race r = { 0 };
	long t0;

	/* before the area is filled: a page is charged where it was faulted */
	r.memcg = enter_memcg(CGROUP);
	r.p = map_aligned(AREA, SZ_2M, PROT_READ | PROT_WRITE);
	ASSERT_NE(NULL, r.p);
	ASSERT_EQ(0, madvise(r.p, AREA, MADV_NOHUGEPAGE));
	r.state = calloc(PAGES, sizeof(*r.state));	/* PARENT everywhere */
	ASSERT_NE(NULL, r.state);
	for (unsigned long i = 0; i < PAGES; i++)
		write_tag(r.p + i * PAGE_SIZE, tag(1, i));
	r.two_nodes = !access("/sys/devices/system/node/node1", F_OK);
	if (feature)
		ASSERT_EQ(0, prctl(PR_SET_COW_PTE, 1, 0, 0, 0));
	for (int k = 0; k < NR_COUNTERS; k++)
		before[k] = vmstat(counter_names[k]);
	pt_before = status_kb("VmPTE:");

	t0 = now_ms();
	for (int k = 0; k < nr; k++)
		ASSERT_EQ(0, pthread_create(&threads[k], NULL, workers[k], &r));
	/*
	 * RACE_SECONDS, and MIN_FORKS at least: KASAN on a host that runs
	 * other guests beside this one made 9 forks in 10 s.  Six times as
	 * long at most: fewer forks then is a failure below.
	 */
	for (int s = 0; s < 6 * RACE_SECONDS; s++) {
		if (s >= RACE_SECONDS &&
		    __atomic_load_n(&r.forks, __ATOMIC_RELAXED) > MIN_FORKS)
			break;
		sleep(1);
	}
	__atomic_store_n(&r.stop, true, __ATOMIC_RELAXED);
	for (int k = 0; k < nr; k++)
		ASSERT_EQ(0, pthread_join(threads[k], NULL));
	TH_LOG("%lu forks in %.1f s, two nodes: %d, memcg: %d", r.forks,
	       (now_ms() - t0) / 1000.0, r.two_nodes, r.memcg);

	for (unsigned long i = 0; i < PAGES; i++)
		parent_check(&r, r.p + i * PAGE_SIZE, i);
	EXPECT_EQ(0, r.bad) TH_LOG("page %lu holds %lx", r.bad_idx, r.bad_val);
	EXPECT_EQ(0, r.errors) TH_LOG("%s: %s", r.last_op, strerror(r.last_errno));
	EXPECT_EQ(0, r.children_failed) TH_LOG("a child exited with %lu: 2-5 a "
		"syscall, 11 its write lost, 12 a zapped page not zero, 13 "
		"another's write, 2x its grandchild", r.child_code);
	/*
	 * Enough forks to have raced anything; under `ptlab soak` (stress-ng
	 * beside it on 4 vCPUs of TCG) one is enough: the soak judges by the
	 * counters over the whole soak, not by this run's pace.
	 */
	EXPECT_LT(in_soak() ? 0 : MIN_FORKS, r.forks);
	for (int k = 0; k < NR_COUNTERS; k++) {
		after[k] = vmstat(counter_names[k]);
		TH_LOG("%s +%ld", counter_names[k], after[k] - before[k]);
	}
	if (feature) {
		EXPECT_LT(before[0], after[0]) TH_LOG("nothing shared");
		EXPECT_LT(before[1], after[1]) TH_LOG("nothing broken");
		EXPECT_LT(before[4], after[4]) TH_LOG("nothing dropped");
	}
	/* a leaked or miscounted table: the kernel's own checks splat */
	ASSERT_EQ(0, munmap(r.p, AREA));
	pt_after = status_kb("VmPTE:");
	TH_LOG("VmPTE %ld kB before, %ld kB after the area went", pt_before,
	       pt_after);
	free(r.state);
	if (r.memcg)
		leave_memcg(CGROUP);
}

/*
 * rmap walkers against breaks, nothing else: the parent's threads migrate
 * every page of the area between the nodes and reclaim its memcg, whose
 * rmap walks visit the parent's and each child's VMA, while a child at a
 * time breaks all 8 tables (one write each) and the parent breaks them
 * too before the child exits.  A walker maps a table from a PMD it read
 * without a lock and waits for the table's lock, which a break holds while
 * it copies 512 entries; when it gets the lock, the PMD may map the copy:
 * the walk must not take the old table, now the other holders' only, for
 * this mm's own (before the fix: "Bad rss-counter state" at an exit, and a
 * migration entry of the copy never restored, the warning in
 * remove_migration_ptes()).  The kernel's checks splat; the data is
 * checked on both sides.
 */
#define WALK_SECONDS	10

struct walk_race {
	char *p;
	bool stop;	/* __atomic */
	bool memcg;	/* in CGROUP */
	bool reclaim;	/* a thread reclaims CGROUP */
	pthread_t mig, rec;
};

static void *walk_migrate(void *arg)
{
	struct walk_race *w = arg;
	static void *addrs[PAGES];
	static int nodes[PAGES], status[PAGES];

	for (unsigned long n = 0; !__atomic_load_n(&w->stop, __ATOMIC_RELAXED); n++) {
		for (unsigned long i = 0; i < PAGES; i++) {
			addrs[i] = w->p + i * PAGE_SIZE;
			nodes[i] = n % 2;
		}
		/* MPOL_MF_MOVE would leave the pages other mms map */
		move_pages(0, PAGES, addrs, nodes, status, MPOL_MF_MOVE_ALL);
	}
	return NULL;
}

static void *walk_reclaim(void *arg)
{
	struct walk_race *w = arg;

	while (!__atomic_load_n(&w->stop, __ATOMIC_RELAXED)) {
		memcg_reclaim(CGROUP, "4M");
		usleep(1000);
	}
	return NULL;
}

/* Pages of the area not holding tag(@who, i), tag(1, i) elsewhere */
static unsigned long walk_bad(char *p, unsigned long who)
{
	unsigned long bad = 0;

	for (unsigned long i = 0; i < PAGES; i++) {
		unsigned long want = tag(i % PER_TABLE ? 1 : who, i);

		bad += load_word(first_word(p + i * PAGE_SIZE)) != want;
	}
	return bad;
}

/*
 * The parent's area: 8 whole tables of tagged small pages, opted in;
 * @advice MADV_NOHUGEPAGE, or MADV_NORMAL for a VMA that may hold THPs
 * (small pages all the same: THP is "madvise" in our guests)
 */
static char *walk_area(int advice)
{
	char *p = map_aligned(AREA, SZ_2M, PROT_READ | PROT_WRITE);

	if (!p || madvise(p, AREA, advice) ||
	    prctl(PR_SET_COW_PTE, 1, 0, 0, 0))
		return NULL;
	for (unsigned long i = 0; i < PAGES; i++)
		write_tag(p + i * PAGE_SIZE, tag(1, i));
	return p;
}

/* Why the walker tests cannot run on this machine, or NULL */
static const char *walk_skip(void)
{
	if (vmstat("cow_pte_share") < 0)
		return "no COW page tables on this kernel";
	if (access("/sys/devices/system/node/node1", F_OK))
		return "needs two NUMA nodes";
	return NULL;
}

/*
 * The parent's area (walk_area(@advice)) and the threads that walk the
 * rmap: one migrates every page, one (if @reclaim) reclaims the memcg the
 * parent enters first.  0, or -1 with nothing started.
 */
static int walk_start(struct walk_race *w, int advice, bool reclaim)
{
	if (reclaim)
		w->memcg = enter_memcg(CGROUP);
	w->reclaim = reclaim;
	w->p = walk_area(advice);
	if (!w->p || pthread_create(&w->mig, NULL, walk_migrate, w))
		return -1;
	if (reclaim && pthread_create(&w->rec, NULL, walk_reclaim, w)) {
		__atomic_store_n(&w->stop, true, __ATOMIC_RELAXED);
		pthread_join(w->mig, NULL);
		return -1;
	}
	return 0;
}

static void walk_stop(struct walk_race *w)
{
	__atomic_store_n(&w->stop, true, __ATOMIC_RELAXED);
	pthread_join(w->mig, NULL);
	if (w->reclaim)
		pthread_join(w->rec, NULL);
}

/* The area unmapped (its return) and the memcg left */
static int walk_end(struct walk_race *w)
{
	int ret = munmap(w->p, AREA);

	if (w->memcg)
		leave_memcg(CGROUP);
	return ret;
}

/* Reap @pid: true unless it exited with 0 */
static bool walk_child_failed(pid_t pid)
{
	int status;

	return waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
	       WEXITSTATUS(status);
}

TEST_F_TIMEOUT(race, walkers_meet_breaks, 300)
{
	struct walk_race w = { };
	unsigned long rounds = 0, failed = 0, before, breaks;
	const char *skip = walk_skip();
	time_t end;

	if (skip)
		SKIP(return, "%s", skip);
	before = vmstat("cow_pte_break");
	ASSERT_EQ(0, walk_start(&w, MADV_NOHUGEPAGE, true));
	for (end = time(NULL) + WALK_SECONDS; time(NULL) < end; rounds++) {
		pid_t pid = fork();

		ASSERT_LE(0, pid);
		if (!pid) {
			/* the first page of each table: a break each */
			for (unsigned long t = 0; t < TABLES; t++)
				write_tag(w.p + t * SZ_2M, tag(2, t * PER_TABLE));
			_exit(walk_bad(w.p, 2) ? 1 : 0);
		}
		/* the owner breaks (or reuses) them too, meanwhile */
		for (unsigned long t = 0; t < TABLES; t++)
			write_tag(w.p + t * SZ_2M, tag(1, t * PER_TABLE));
		failed += walk_child_failed(pid);
	}
	walk_stop(&w);
	breaks = vmstat("cow_pte_break") - before;
	TH_LOG("%lu rounds, %lu breaks, pswpout %ld, pgmigrate_success %ld",
	       rounds, breaks, vmstat("pswpout"), vmstat("pgmigrate_success"));
	EXPECT_EQ(0, failed) TH_LOG("children that read a wrong page");
	EXPECT_EQ(0, walk_bad(w.p, 1));
	EXPECT_LT(rounds, breaks);
	ASSERT_EQ(0, walk_end(&w));
}

/*
 * A last holder's drop against migration: each round the parent breaks all
 * 8 tables (a copy each) while its child still shares them, then the child
 * drops them all with MADV_DONTNEED, as their last holder, while a thread
 * of the parent migrates every page of the area between the nodes.  A migration has its
 * entries in the shared table and in the parent's copy from try_to_migrate()
 * until its restore walk takes each table's lock, and keeps the folio
 * locked until then.  The drop must let go of those entries while the
 * restore walk can still reach the table: once the PMD is cleared, the walk
 * no longer finds it, finishes and unlocks (and frees) the folio, and the
 * drop releasing the entry afterwards finds a migration entry of an
 * unlocked folio (before the fix: kernel BUG at include/linux/swapops.h in
 * cow_pte_release_entries(), and the count of 0006 decremented for a folio
 * that may be another migration's by then).
 */
TEST_F_TIMEOUT(race, last_drops_meet_migration, 300)
{
	struct walk_race w = { };
	unsigned long rounds = 0, failed = 0, before, drops;
	const char *skip = walk_skip();
	time_t end;

	if (skip)
		SKIP(return, "%s", skip);
	before = vmstat("cow_pte_drop");
	ASSERT_EQ(0, walk_start(&w, MADV_NOHUGEPAGE, false));
	for (end = time(NULL) + WALK_SECONDS; time(NULL) < end; rounds++) {
		int go[2];
		pid_t pid;
		char c;

		ASSERT_EQ(0, pipe(go));
		pid = fork();
		ASSERT_LE(0, pid);
		if (!pid) {
			close(go[1]);
			if (read(go[0], &c, 1) != 1)
				_exit(3);
			/* the last holder of all 8 tables: zeros from now on */
			if (madvise(w.p, AREA, MADV_DONTNEED))
				_exit(2);
			for (unsigned long i = 0; i < PAGES; i++)
				if (load_word(first_word(w.p + i * PAGE_SIZE)))
					_exit(1);
			_exit(0);
		}
		close(go[0]);
		/* a break (copy) of each table the child still holds */
		for (unsigned long t = 0; t < TABLES; t++)
			write_tag(w.p + t * SZ_2M, tag(1, t * PER_TABLE));
		ASSERT_EQ(1, write(go[1], "", 1));
		close(go[1]);
		failed += walk_child_failed(pid);
	}
	walk_stop(&w);
	drops = vmstat("cow_pte_drop") - before;
	TH_LOG("%lu rounds, %lu drops, pgmigrate_success %ld", rounds, drops,
	       vmstat("pgmigrate_success"));
	EXPECT_EQ(0, failed) TH_LOG("children whose drop failed or that read a non-zero page");
	EXPECT_EQ(0, walk_bad(w.p, 1));
	EXPECT_LE(rounds * TABLES, drops);
	ASSERT_EQ(0, walk_end(&w));
}

/*
 * VMA splits and merges in the holders of shared tables against the rmap
 * walkers that change those tables in place.  A split links its new VMA
 * into the anon_vmas before it shrinks the old one; a merge unlinks the VMA
 * it removes after it widened the other one: in between, a walk of the
 * anon_vma finds two VMAs of one mm over the same address.  Migration,
 * which flushes each holder of an entry it clears, and reclaim, which
 * charges each holder the swap entry it writes, must count that mm once:
 * the walk found more holders than the table has (the warning in
 * cow_pte_for_each_holder(): 2 found, 1 counted, in the soak of
 * 2026-11-27), or charged the mm twice ("Bad rss-counter state" at its
 * exit).  madvise(MADV_DONTDUMP) and MADV_DODUMP split and merge a VMA
 * without breaking its shared tables; parent and child toggle a page in
 * each table, by turns, while the threads migrate and reclaim every page.
 */
TEST_F_TIMEOUT(race, splits_meet_walkers, 300)
{
	struct walk_race w = { };
	unsigned long rounds = 0, before, shares, breaks;
	const char *skip = walk_skip();
	pid_t pid, parent = getpid();
	int status;
	time_t end;

	if (skip)
		SKIP(return, "%s", skip);
	before = vmstat("cow_pte_share");
	ASSERT_EQ(0, walk_start(&w, MADV_NOHUGEPAGE, true));
	breaks = vmstat("cow_pte_break");
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		/* the child holds every table, splits and merges until killed */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		for (unsigned long n = 0;; n++)
			for (unsigned long t = 0; t < TABLES; t++)
				madvise(w.p + t * SZ_2M + SZ_1M + PAGE_SIZE, PAGE_SIZE,
					n % 2 ? MADV_DODUMP : MADV_DONTDUMP);
	}
	for (end = time(NULL) + WALK_SECONDS; time(NULL) < end; rounds++)
		for (unsigned long t = 0; t < TABLES; t++)
			ASSERT_EQ(0, madvise(w.p + t * SZ_2M + SZ_1M, PAGE_SIZE,
					     rounds % 2 ? MADV_DODUMP : MADV_DONTDUMP));
	/*
	 * The splits happened in shared tables: a madvise() that broke them
	 * would have broken all 8, once each, in the parent or the child.
	 * Fewer: the parent's own writes (its stack, the harness) may break
	 * one it shared besides.  The count is the machine's: under
	 * `ptlab soak` others break too.
	 */
	breaks = vmstat("cow_pte_break") - breaks;
	ASSERT_EQ(0, kill(pid, SIGKILL));
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	walk_stop(&w);
	shares = vmstat("cow_pte_share") - before;
	TH_LOG("%lu rounds, %lu shares, %lu breaks; since boot: pgmigrate_success %ld, pswpout %ld",
	       rounds, shares, breaks, vmstat("pgmigrate_success"), vmstat("pswpout"));
	EXPECT_LE(TABLES, shares);
	if (!in_soak())
		EXPECT_GT(TABLES, breaks);
	EXPECT_EQ(0, walk_bad(w.p, 1));
	ASSERT_EQ(0, walk_end(&w));
}

/*
 * Fork's shares against rmap walkers that change PMDs: fork shares the
 * run of tables of a VMA under the parent's PMD-table lock, and each table
 * under its own lock, and stops at a PMD that maps no table, which it
 * copies.  The mmap_lock fork holds does not keep out what walks the rmap:
 * migrate_pages() unmaps and restores without it (move_pages() takes it
 * only to look the pages up), memcg reclaim too, and both change the PMD
 * of a THP under the PMD lock: a PMD migration entry set and restored, a
 * THP split into a new PTE table (which the fork may then share).  Each
 * round the parent writes the first page of each table (each is private
 * again, reused now that the last child is gone, so the fork shares it
 * anew: holders 0 -> 2, the parent's PMD made read-only), collapses the
 * fourth 2 MiB into a THP (MADV_COLLAPSE) if a walker split it, and forks
 * a child that checks the area and exits, while the parent's threads
 * migrate every page between the nodes and reclaim its memcg.  The run must
 * share each table once and copy whatever the THP's PMD is when read;
 * migration entries set in a table before its share are restored once,
 * through whichever holder the restore walk visits first (0003's count
 * must stay exact).  The kernel's checks splat; the data is checked on
 * both sides.
 */
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE	25
#endif
#define COLLAPSE_ROUNDS	6	/* rounds at most while none collapsed */
#define COLLAPSE_TRIES	8	/* MADV_COLLAPSE calls in a round at most */

TEST_F_TIMEOUT(race, forks_meet_walkers, 300)
{
	struct walk_race w = { };
	unsigned long rounds = 0, failed = 0, collapsed = 0, before, shares;
	const char *skip = walk_skip();
	int collapse_errno = 0;
	char *thp;
	time_t end;

	if (skip)
		SKIP(return, "%s", skip);
	before = vmstat("cow_pte_share");
	/* one VMA of small pages, and a THP made in it each round */
	ASSERT_EQ(0, walk_start(&w, MADV_NORMAL, true));
	thp = w.p + 3 * SZ_2M;
	/*
	 * Until a round has collapsed the THP, up to COLLAPSE_ROUNDS rounds
	 * however long they take: under KASAN, in a soak, a round has taken
	 * over 30 s (a KASAN soak made 1 round in three times the test's
	 * time, its one collapse failed).  A collapse fails while the walkers
	 * hold a page isolated (EAGAIN) or have just unmapped or swapped one
	 * out (EINVAL, ENOMEM): it is tried again at once, a few times, on
	 * any error.
	 */
	for (end = time(NULL) + WALK_SECONDS;
	     time(NULL) < end || (!collapsed && rounds < COLLAPSE_ROUNDS);
	     rounds++) {
		pid_t pid;

		for (unsigned long t = 0; t < TABLES; t++)
			write_tag(w.p + t * SZ_2M, tag(1, t * PER_TABLE));
		for (int try = 0; try < COLLAPSE_TRIES; try++) {
			if (!madvise(thp, SZ_2M, MADV_COLLAPSE)) {
				collapsed++;
				break;
			}
			collapse_errno = errno;
		}
		pid = fork();
		ASSERT_LE(0, pid);
		if (!pid)
			_exit(walk_bad(w.p, 1) ? 1 : 0);
		failed += walk_child_failed(pid);
	}
	walk_stop(&w);
	shares = vmstat("cow_pte_share") - before;
	TH_LOG("%lu rounds, %lu with a THP collapsed, %lu shares; since boot: "
	       "pgmigrate_success %ld, thp_migration_success %ld, "
	       "thp_split_pmd %ld", rounds, collapsed, shares,
	       vmstat("pgmigrate_success"), vmstat("thp_migration_success"),
	       vmstat("thp_split_pmd"));
	EXPECT_EQ(0, failed) TH_LOG("children that read a wrong page");
	EXPECT_EQ(0, walk_bad(w.p, 1));
	EXPECT_LT(0, collapsed) TH_LOG("MADV_COLLAPSE: errno %d", collapse_errno);
	/* the 7 tables that are never a THP, at each fork */
	EXPECT_LE(rounds * (TABLES - 1), shares);
	ASSERT_EQ(0, walk_end(&w));
}

TEST_HARNESS_MAIN
