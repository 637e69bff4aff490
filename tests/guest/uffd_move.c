// SPDX-License-Identifier: GPL-2.0
/*
 * uffd_move: UFFDIO_MOVE, what it promises and the bugs it had.
 *
 * The scenarios of docs/uffd-move.md, data checked page by
 * page: each page carries a tag (its index and a seed) in its first and
 * last word, and the destination must hold exactly the tags the source
 * held, the source nothing.  pagemap tells the rest: present, swapped,
 * soft-dirty, uffd-wp.
 *
 * The audit of 6.12.117 against the bugs fixed upstream since UFFDIO_MOVE
 * landed (commits "Fixes: adef440691ba") has a case here for each one a
 * test can reach; a case named after a bug failed before our fix of it.
 * The table is in docs/uffd-move.md ("the audit").
 */
#include <errno.h>
#include <numaif.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/uio.h>
#include <sys/wait.h>

#include "kselftest_harness.h"
#include "guest_util.h"


#define THP_ENABLED	"/sys/kernel/mm/transparent_hugepage/enabled"
#define THP_ZERO	"/sys/kernel/mm/transparent_hugepage/use_zero_page"
#define MTHP_64K	"/sys/kernel/mm/transparent_hugepage/hugepages-64kB/enabled"
#define MTHP_2M		"/sys/kernel/mm/transparent_hugepage/hugepages-2048kB/enabled"

static struct knob knobs[] = {
	{ .path = THP_ENABLED },
	{ .path = THP_ZERO },
	{ .path = MTHP_64K },
	{ .path = MTHP_2M },
	{ .path = MOVE_BATCH },
	{ .path = "/sys/kernel/mm/ksm/run" },
	{ .path = "/sys/kernel/mm/ksm/sleep_millisecs" },
	{ .path = "/sys/kernel/mm/ksm/pages_to_scan" },
};

static void __attribute__((constructor)) save_knobs(void)
{
	save_knob_list(knobs, ARRAY_SIZE(knobs));
}

static void __attribute__((destructor)) restore_knobs(void)
{
	restore_knob_list(knobs, ARRAY_SIZE(knobs));
}

#define NPAGES		64

/* --- the areas: a source, and a destination registered with a uffd ---- */

struct area {
	int uffd;
	char *src, *dst;
	unsigned long len;
};

/*
 * @len bytes of source and of destination, each aligned to 2 MiB, the
 * destination registered MISSING (| WP with @wp) with a new uffd that has
 * @features besides MOVE; @thp: MADV_HUGEPAGE on both, else NOHUGEPAGE.
 * 0, or -errno (a uffd feature this kernel lacks: the caller skips).
 */
static int area_init_advice(struct area *a, unsigned long len, int advice,
			    __u64 features, bool wp)
{
	__u64 mode = UFFDIO_REGISTER_MODE_MISSING;

	a->len = len;
	a->uffd = uffd_open(UFFD_FEATURE_MOVE | features);
	if (a->uffd < 0)
		return a->uffd;
	a->src = map_aligned(len, SZ_2M, PROT_READ | PROT_WRITE);
	a->dst = map_aligned(len, SZ_2M, PROT_READ | PROT_WRITE);
	if (!a->src || !a->dst)
		return -ENOMEM;
	if (advice >= 0 && (madvise(a->src, len, advice) ||
			    madvise(a->dst, len, advice)))
		return -errno;
	if (wp)
		mode |= UFFDIO_REGISTER_MODE_WP;
	return uffd_register(a->uffd, a->dst, len, mode);
}

static int area_init(struct area *a, unsigned long len, bool thp,
		     __u64 features, bool wp)
{
	return area_init_advice(a, len, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE,
				features, wp);
}

static void area_fini(struct area *a)
{
	munmap(a->src, a->len);
	munmap(a->dst, a->len);
	close(a->uffd);
}

/*
 * UFFDIO_MOVE of @len bytes at @off of both areas: 0 or -errno of the
 * ioctl; *@moved gets the "move" field, which the test first sets to a
 * value no kernel writes (it must always be written).
 */
static int do_move(struct area *a, unsigned long dst_off, unsigned long src_off,
		   unsigned long len, __u64 mode, __s64 *moved)
{
	struct uffdio_move mv = {
		.dst = (unsigned long)a->dst + dst_off,
		.src = (unsigned long)a->src + src_off,
		.len = len,
		.mode = mode,
		.move = 0x5a5a5a5a,
	};
	int ret = ioctl(a->uffd, UFFDIO_MOVE, &mv) ? -errno : 0;

	if (moved)
		*moved = mv.move;
	return ret;
}

/* UFFDIO_MOVE of @len bytes from @src to @dst with @uffd: 0 or -errno */
static int raw_move(int uffd, char *dst, char *src, unsigned long len)
{
	struct uffdio_move mv = {
		.dst = (unsigned long)dst,
		.src = (unsigned long)src,
		.len = len,
	};

	return ioctl(uffd, UFFDIO_MOVE, &mv) ? -errno : 0;
}

static unsigned long tag(unsigned long i, unsigned long seed)
{
	return (seed << 32) | (i + 1);
}

static void fill(char *p, unsigned long first, unsigned long n,
		 unsigned long seed)
{
	for (unsigned long i = first; i < first + n; i++)
		write_tag(p + i * PAGE_SIZE, tag(i, seed));
}

/* Pages of [first, first + n) of @p whose tag is not @seed's (0: zeros) */
static unsigned long count_bad(char *p, unsigned long first, unsigned long n,
			       unsigned long seed)
{
	unsigned long bad = 0;

	for (unsigned long i = first; i < first + n; i++) {
		unsigned long want = seed ? tag(i, seed) : 0;
		char *page = p + i * PAGE_SIZE;

		if (load_word(first_word(page)) != want ||
		    load_word(last_word(page)) != want)
			bad++;
	}
	return bad;
}

/* THP "madvise" or "always", so that MADV_HUGEPAGE areas get THPs */
static bool thp_usable(void)
{
	char val[32];

	/* the THP knobs as the test found them (an mTHP test changes them) */
	restore_knob_list(knobs, ARRAY_SIZE(knobs));

	if (read_knob(THP_ENABLED, val, sizeof(val)))
		return false;
	if (!strcmp(val, "never"))
		write_knob(THP_ENABLED, "madvise");
	return !read_knob(THP_ENABLED, val, sizeof(val)) &&
	       strcmp(val, "never");
}

static int clear_soft_dirty(void)
{
	int fd = open("/proc/self/clear_refs", O_WRONLY);
	int ret;

	if (fd < 0)
		return -errno;
	ret = write(fd, "4", 1) == 1 ? 0 : -errno;
	close(fd);
	return ret;
}

static int writeprotect(int uffd, char *p, unsigned long len, bool wp)
{
	struct uffdio_writeprotect w = {
		.range = { .start = (unsigned long)p, .len = len },
		.mode = wp ? UFFDIO_WRITEPROTECT_MODE_WP : 0,
	};

	return ioctl(uffd, UFFDIO_WRITEPROTECT, &w) ? -errno : 0;
}

/* --- the basic moves ---------------------------------------------------- */

/* 4 KiB pages move whole: the data arrives, the source is left empty */
TEST(moves_4k_pages)
{
	struct area a;
	__s64 moved;

	ASSERT_EQ(0, area_init(&a, SZ_2M, false, 0, false));
	fill(a.src, 0, NPAGES, 1);
	ASSERT_EQ(0, do_move(&a, 0, 0, NPAGES * PAGE_SIZE, 0, &moved));
	EXPECT_EQ(NPAGES * PAGE_SIZE, moved);
	EXPECT_EQ(0, count_bad(a.dst, 0, NPAGES, 1));
	EXPECT_EQ(0, count_pagemap(a.src, NPAGES, PM_PRESENT));
	EXPECT_EQ(0, count_bad(a.src, 0, NPAGES, 0));
	/* a moved page is the destination's own: writes stay there */
	fill(a.dst, 0, NPAGES, 2);
	EXPECT_EQ(0, count_bad(a.src, 0, NPAGES, 0));
	EXPECT_EQ(0, count_bad(a.dst, 0, NPAGES, 2));
	area_fini(&a);
}

/* An aligned 2 MiB THP moves whole and stays a THP */
TEST(moves_a_whole_thp)
{
	struct area a;
	__s64 moved;

	if (!thp_usable())
		SKIP(return, "THP is not usable here");
	ASSERT_EQ(0, area_init(&a, SZ_2M, true, 0, false));
	fill(a.src, 0, SZ_2M / PAGE_SIZE, 3);
	if (smaps_kb(a.src, "AnonHugePages:") != 2048)
		SKIP(area_fini(&a); return, "no THP for the source");
	ASSERT_EQ(0, do_move(&a, 0, 0, SZ_2M, 0, &moved));
	EXPECT_EQ(SZ_2M, moved);
	EXPECT_EQ(2048, smaps_kb(a.dst, "AnonHugePages:"));
	EXPECT_EQ(0, count_bad(a.dst, 0, SZ_2M / PAGE_SIZE, 3));
	EXPECT_EQ(0, count_pagemap(a.src, SZ_2M / PAGE_SIZE, PM_PRESENT));
	area_fini(&a);
}

/* Part of a THP: the PMD is split, the pages move one by one */
TEST(moves_part_of_a_thp)
{
	const unsigned long half = SZ_1M / PAGE_SIZE;
	struct area a;
	__s64 moved;

	if (!thp_usable())
		SKIP(return, "THP is not usable here");
	ASSERT_EQ(0, area_init(&a, SZ_2M, true, 0, false));
	fill(a.src, 0, SZ_2M / PAGE_SIZE, 4);
	if (smaps_kb(a.src, "AnonHugePages:") != 2048)
		SKIP(area_fini(&a); return, "no THP for the source");
	ASSERT_EQ(0, do_move(&a, SZ_1M, SZ_1M, SZ_1M, 0, &moved));
	EXPECT_EQ(SZ_1M, moved);
	EXPECT_EQ(0, count_bad(a.dst, half, half, 4));
	EXPECT_EQ(0, count_bad(a.src, 0, half, 4));
	EXPECT_EQ(0, count_pagemap(a.src + SZ_1M, half, PM_PRESENT));
	EXPECT_EQ(0, count_pagemap(a.dst, half, PM_PRESENT));
	area_fini(&a);
}

/* --- the errors --------------------------------------------------------- */

/*
 * A hole in the source: without ALLOW_SRC_HOLES a short move (EAGAIN,
 * "move" = the bytes before the hole), and resuming at the hole ENOENT;
 * with it, the whole range, the hole left a hole at the destination.
 */
TEST(source_hole)
{
	const unsigned long hole = 10;
	struct area a;
	__s64 moved;

	ASSERT_EQ(0, area_init(&a, SZ_2M, false, 0, false));
	fill(a.src, 0, NPAGES, 5);
	ASSERT_EQ(0, madvise(a.src + hole * PAGE_SIZE, PAGE_SIZE, MADV_DONTNEED));
	EXPECT_EQ(-EAGAIN, do_move(&a, 0, 0, NPAGES * PAGE_SIZE, 0, &moved));
	EXPECT_EQ(hole * PAGE_SIZE, moved);
	EXPECT_EQ(-ENOENT, do_move(&a, moved, moved, NPAGES * PAGE_SIZE - moved,
				   0, &moved));
	EXPECT_EQ(-ENOENT, moved);
	ASSERT_EQ(0, do_move(&a, hole * PAGE_SIZE, hole * PAGE_SIZE,
			     (NPAGES - hole) * PAGE_SIZE,
			     UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES, &moved));
	EXPECT_EQ((NPAGES - hole) * PAGE_SIZE, moved);
	EXPECT_EQ(0, count_bad(a.dst, 0, hole, 5));
	EXPECT_EQ(0, count_bad(a.dst, hole + 1, NPAGES - hole - 1, 5));
	EXPECT_EQ(0, count_pagemap(a.dst + hole * PAGE_SIZE, 1, PM_PRESENT));
	area_fini(&a);

	/* a source range with no page table at all (upstream: "THP hole") */
	ASSERT_EQ(0, area_init(&a, 2 * SZ_2M, true, 0, false));
	EXPECT_EQ(-ENOENT, do_move(&a, 0, 0, SZ_2M, 0, NULL));
	EXPECT_EQ(0, do_move(&a, 0, 0, 2 * SZ_2M,
			     UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES, &moved));
	EXPECT_EQ(2 * SZ_2M, moved);
	EXPECT_EQ(0, count_pagemap(a.dst, 2 * SZ_2M / PAGE_SIZE, PM_PRESENT));
	area_fini(&a);
}

/* A mapped destination page or THP: EEXIST, nothing moved */
TEST(destination_mapped)
{
	struct uffdio_zeropage z = { 0 };
	struct area a;
	__s64 moved;

	ASSERT_EQ(0, area_init(&a, SZ_2M, false, 0, false));
	fill(a.src, 0, NPAGES, 6);
	/* UFFDIO_ZEROPAGE fills a registered page without a fault */
	z.range = (struct uffdio_range){ (unsigned long)a.dst + 3 * PAGE_SIZE,
					 PAGE_SIZE };
	ASSERT_EQ(0, ioctl(a.uffd, UFFDIO_ZEROPAGE, &z));
	EXPECT_EQ(-EAGAIN, do_move(&a, 0, 0, NPAGES * PAGE_SIZE, 0, &moved));
	EXPECT_EQ(3 * PAGE_SIZE, moved);
	EXPECT_EQ(-EEXIST, do_move(&a, 3 * PAGE_SIZE, 3 * PAGE_SIZE, PAGE_SIZE,
				   0, &moved));
	EXPECT_EQ(-EEXIST, moved);
	EXPECT_EQ(0, count_bad(a.src, 3, NPAGES - 3, 6));
	area_fini(&a);

	if (!thp_usable())
		return;
	ASSERT_EQ(0, area_init(&a, SZ_2M, true, 0, false));
	ASSERT_EQ(0, uffd_unregister(a.uffd, a.dst, SZ_2M));
	fill(a.dst, 0, SZ_2M / PAGE_SIZE, 7);
	ASSERT_EQ(0, uffd_register(a.uffd, a.dst, SZ_2M,
				   UFFDIO_REGISTER_MODE_MISSING));
	fill(a.src, 0, SZ_2M / PAGE_SIZE, 8);
	if (smaps_kb(a.dst, "AnonHugePages:") == 2048)
		EXPECT_EQ(-EEXIST, do_move(&a, 0, 0, SZ_2M, 0, NULL));
	EXPECT_EQ(-EEXIST, do_move(&a, PAGE_SIZE, PAGE_SIZE, PAGE_SIZE, 0, NULL));
	EXPECT_EQ(0, count_bad(a.dst, 0, SZ_2M / PAGE_SIZE, 7));
	EXPECT_EQ(0, count_bad(a.src, 0, SZ_2M / PAGE_SIZE, 8));
	area_fini(&a);
}

/* Parameters and VMAs it must refuse with EINVAL */
TEST(einval)
{
	struct area a, b;
	char *shared;
	int status;
	pid_t pid;

	ASSERT_EQ(0, area_init(&a, SZ_2M, false, 0, false));
	fill(a.src, 0, NPAGES, 9);
	EXPECT_EQ(-EINVAL, do_move(&a, 0, 0, PAGE_SIZE, 1ULL << 2, NULL));
	EXPECT_EQ(-EINVAL, do_move(&a, 0, 1, PAGE_SIZE, 0, NULL));
	EXPECT_EQ(-EINVAL, do_move(&a, 0, 0, 100, 0, NULL));
	EXPECT_EQ(-EINVAL, do_move(&a, 0, 0, 0, 0, NULL));
	/* the destination outside the registered range */
	EXPECT_EQ(-EINVAL, do_move(&a, SZ_2M - PAGE_SIZE, 0, 2 * PAGE_SIZE,
				   0, NULL));
	/* a destination registered with another uffd */
	ASSERT_EQ(0, area_init(&b, SZ_2M, false, 0, false));
	EXPECT_EQ(-EINVAL, raw_move(a.uffd, b.dst, a.src, PAGE_SIZE));
	area_fini(&b);
	/* protections differ */
	ASSERT_EQ(0, mprotect(a.src, PAGE_SIZE, PROT_READ));
	EXPECT_EQ(-EINVAL, do_move(&a, 0, 0, PAGE_SIZE, 0, NULL));
	ASSERT_EQ(0, mprotect(a.src, PAGE_SIZE, PROT_READ | PROT_WRITE));
	/* one side mlocked */
	if (!mlock(a.src, PAGE_SIZE)) {
		EXPECT_EQ(-EINVAL, do_move(&a, 0, 0, PAGE_SIZE, 0, NULL));
		munlock(a.src, PAGE_SIZE);
	}
	/* a shared source */
	shared = mmap(NULL, PAGE_SIZE, PROT_READ | PROT_WRITE,
		      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, shared);
	shared[0] = 1;
	EXPECT_EQ(-EINVAL, raw_move(a.uffd, a.dst, shared, PAGE_SIZE));
	munmap(shared, PAGE_SIZE);
	/* a hugetlb source (the lab reserves 2 MiB pages) */
	shared = mmap(NULL, SZ_2M, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
	if (shared != MAP_FAILED) {
		shared[0] = 1;
		EXPECT_EQ(-EINVAL, raw_move(a.uffd, a.dst, shared, PAGE_SIZE));
		munmap(shared, SZ_2M);
	}
	/* both sides read-only: only writable VMAs move */
	ASSERT_EQ(0, mprotect(a.src, PAGE_SIZE, PROT_READ));
	ASSERT_EQ(0, mprotect(a.dst, PAGE_SIZE, PROT_READ));
	EXPECT_EQ(-EINVAL, do_move(&a, 0, 0, PAGE_SIZE, 0, NULL));
	ASSERT_EQ(0, mprotect(a.src, PAGE_SIZE, PROT_READ | PROT_WRITE));
	ASSERT_EQ(0, mprotect(a.dst, PAGE_SIZE, PROT_READ | PROT_WRITE));
	/* another process with the same uffd: no cross-mm moves */
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid)
		_exit(do_move(&a, 0, 0, PAGE_SIZE, 0, NULL) == -EINVAL ? 0 : 1);
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	EXPECT_EQ(0, WEXITSTATUS(status)) TH_LOG("a child moved with its parent's uffd");
	EXPECT_EQ(0, count_bad(a.src, 0, NPAGES, 9));
	EXPECT_EQ(0, count_pagemap(a.dst, NPAGES, PM_PRESENT));
	area_fini(&a);
}

/* A page a child still maps after fork is not exclusive: EBUSY */
TEST(ebusy_after_fork)
{
	int go[2], ready[2], status;
	struct area a;
	char c = 0;
	pid_t pid;

	ASSERT_EQ(0, area_init(&a, SZ_2M, false, 0, false));
	fill(a.src, 0, NPAGES, 10);
	ASSERT_EQ(0, pipe(go));
	ASSERT_EQ(0, pipe(ready));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		unsigned long bad = count_bad(a.src, 0, NPAGES, 10);

		if (write(ready[1], "r", 1) != 1 || read(go[0], &c, 1) != 1)
			_exit(2);
		_exit(bad || count_bad(a.src, 0, NPAGES, 10) ? 1 : 0);
	}
	ASSERT_EQ(1, read(ready[0], &c, 1));
	EXPECT_EQ(-EBUSY, do_move(&a, 0, 0, PAGE_SIZE, 0, NULL));
	ASSERT_EQ(1, write(go[1], "g", 1));
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	EXPECT_EQ(0, WEXITSTATUS(status)) TH_LOG("the child saw bad data");
	/* the parent's write makes the page its own again: it moves */
	fill(a.src, 0, 1, 11);
	EXPECT_EQ(0, do_move(&a, 0, 0, PAGE_SIZE, 0, NULL));
	EXPECT_EQ(0, count_bad(a.dst, 0, 1, 11));
	close(go[0]);
	close(go[1]);
	close(ready[0]);
	close(ready[1]);
	area_fini(&a);
}

/* A page that looks pinned (a thousand vmsplice() references): EBUSY */
TEST(ebusy_pinned)
{
	struct vmsplice_pin pin;
	struct area a;

	ASSERT_EQ(0, area_init(&a, SZ_2M, false, 0, false));
	fill(a.src, 0, NPAGES, 12);
	ASSERT_LE(GUP_PIN_COUNTING_BIAS + 64, vmsplice_pin(&pin, a.src));
	EXPECT_EQ(-EBUSY, do_move(&a, 0, 0, PAGE_SIZE, 0, NULL));
	EXPECT_EQ(0, do_move(&a, PAGE_SIZE, PAGE_SIZE, PAGE_SIZE, 0, NULL));
	vmsplice_unpin(&pin);
	EXPECT_EQ(0, do_move(&a, 0, 0, PAGE_SIZE, 0, NULL));
	EXPECT_EQ(0, count_bad(a.dst, 0, 2, 12));
	area_fini(&a);
}

#define KSM		"/sys/kernel/mm/ksm/"
/* A page KSM merged is shared: EBUSY, and it stays where it was */
TEST(ebusy_ksm)
{
	long end = now_ms() + 20000;
	struct area a;

	if (access(KSM "run", W_OK))
		SKIP(return, "no KSM here");
	ASSERT_EQ(0, area_init(&a, SZ_2M, false, 0, false));
	for (unsigned long i = 0; i < 8; i++)
		memset(a.src + i * PAGE_SIZE, 0x6b, PAGE_SIZE);
	ASSERT_EQ(0, madvise(a.src, 8 * PAGE_SIZE, MADV_MERGEABLE));
	write_knob(KSM "sleep_millisecs", "0");
	write_knob(KSM "pages_to_scan", "1000");
	ASSERT_EQ(0, write_knob(KSM "run", "1"));
	while (count_merged(a.src, 8) < 8 && now_ms() < end)
		usleep(100 * 1000);
	if (count_merged(a.src, 8) < 8) {
		write_knob(KSM "run", "2");
		SKIP(area_fini(&a); return, "KSM did not merge the pages in 20 s");
	}
	EXPECT_EQ(-EBUSY, do_move(&a, 0, 0, PAGE_SIZE, 0, NULL));
	EXPECT_EQ(0x6b6b6b6b6b6b6b6bUL, load_word(first_word(a.src)));
	EXPECT_EQ(0, count_pagemap(a.dst, 1, PM_PRESENT));
	/* unmerged (the write copies it), the page is exclusive and moves */
	ASSERT_EQ(0, write_knob(KSM "run", "2"));
	fill(a.src, 0, 1, 70);
	EXPECT_EQ(0, do_move(&a, 0, 0, PAGE_SIZE, 0, NULL));
	EXPECT_EQ(0, count_bad(a.dst, 0, 1, 70));
	area_fini(&a);
}

/* --- what moves: swap entries, zero pages -------------------------------- */

/* Swapped-out pages move as swap entries and swap in at the destination */
TEST(moves_swap_entries)
{
	struct area a;

	ASSERT_EQ(0, area_init(&a, SZ_2M, false, 0, false));
	fill(a.src, 0, NPAGES, 13);
	ASSERT_EQ(0, madvise(a.src, NPAGES * PAGE_SIZE, MADV_PAGEOUT));
	if (count_pagemap(a.src, NPAGES, PM_SWAP) < NPAGES / 2)
		SKIP(area_fini(&a); return, "no swap here");
	ASSERT_EQ(0, do_move(&a, 0, 0, NPAGES * PAGE_SIZE, 0, NULL));
	EXPECT_EQ(0, count_pagemap(a.src, NPAGES, PM_PRESENT));
	EXPECT_EQ(0, count_pagemap(a.src, NPAGES, PM_SWAP));
	EXPECT_EQ(0, count_bad(a.dst, 0, NPAGES, 13));
	EXPECT_EQ(0, count_bad(a.src, 0, NPAGES, 0));
	area_fini(&a);
}

/*
 * A swap entry whose page another thread is swapping in: the move must
 * take the swap cache into account (upstream's swap-cache race: the
 * swapped-in page was left mapped at the source while the entry moved).
 * Each round swaps a page out and races a read of it against its move:
 * the data must end in one place, whole.
 */
struct swapin_race {
	char *page;
	atomic_int go;
	unsigned long seen;
};

static void *swapin_reader(void *arg)
{
	struct swapin_race *r = arg;

	while (!atomic_load(&r->go))
		;
	r->seen = load_word(first_word(r->page));
	return NULL;
}

TEST(swap_in_races_the_move)
{
	unsigned long lost = 0, rounds = 0;
	long end = now_ms() + 10000;
	struct area a;

	ASSERT_EQ(0, area_init(&a, SZ_2M, false, 0, false));
	while (rounds < 200 && now_ms() < end) {
		unsigned long i = rounds % NPAGES, want;
		struct swapin_race r = { .page = a.src + i * PAGE_SIZE };
		pthread_t t;
		int ret;

		fill(a.src, i, 1, 14 + rounds);
		want = tag(i, 14 + rounds);
		madvise(r.page, PAGE_SIZE, MADV_PAGEOUT);
		ASSERT_EQ(0, pthread_create(&t, NULL, swapin_reader, &r));
		atomic_store(&r.go, 1);
		do {
			ret = do_move(&a, i * PAGE_SIZE, i * PAGE_SIZE,
				      PAGE_SIZE, 0, NULL);
		} while (ret == -EAGAIN);
		pthread_join(t, NULL);
		/* the reader may have faulted a zero page in after the move */
		if (ret == -EEXIST || (ret && ret != -ENOENT))
			lost++;
		if (r.seen != want && r.seen != 0)
			lost++;
		if (count_bad(a.dst, i, 1, 14 + rounds))
			lost++;
		if (count_pagemap(a.src + i * PAGE_SIZE, 1, PM_PRESENT) &&
		    load_word(first_word(r.page)))
			lost++;
		madvise(a.src + i * PAGE_SIZE, PAGE_SIZE, MADV_DONTNEED);
		madvise(a.dst + i * PAGE_SIZE, PAGE_SIZE, MADV_DONTNEED);
		rounds++;
	}
	TH_LOG("%lu rounds", rounds);
	EXPECT_EQ(0, lost);
	area_fini(&a);
}

/* The zero page (a read fault) moves as the zero page */
TEST(moves_the_zero_page)
{
	struct area a;
	unsigned long sum = 0;

	ASSERT_EQ(0, area_init(&a, SZ_2M, false, 0, false));
	for (unsigned long i = 0; i < NPAGES; i++)
		sum += load_word(first_word(a.src + i * PAGE_SIZE));
	ASSERT_EQ(0, sum);
	ASSERT_EQ(NPAGES, count_pagemap(a.src, NPAGES, PM_PRESENT));
	ASSERT_EQ(0, do_move(&a, 0, 0, NPAGES * PAGE_SIZE, 0, NULL));
	EXPECT_EQ(NPAGES, count_pagemap(a.dst, NPAGES, PM_PRESENT));
	EXPECT_EQ(0, count_pagemap(a.src, NPAGES, PM_PRESENT));
	EXPECT_EQ(0, count_bad(a.dst, 0, NPAGES, 0));
	fill(a.dst, 0, NPAGES, 15);
	EXPECT_EQ(0, count_bad(a.dst, 0, NPAGES, 15));
	area_fini(&a);
}

/* The huge zero page moves whole (aligned) or is split (a part) */
TEST(moves_the_huge_zero_page)
{
	struct area a;
	unsigned long sum = 0;

	if (!thp_usable() || write_knob(THP_ZERO, "1"))
		SKIP(return, "no huge zero page here");
	ASSERT_EQ(0, area_init(&a, 2 * SZ_2M, true, 0, false));
	for (unsigned long i = 0; i < 2 * SZ_2M / PAGE_SIZE; i++)
		sum += load_word(first_word(a.src + i * PAGE_SIZE));
	ASSERT_EQ(0, sum);
	ASSERT_EQ(0, do_move(&a, 0, 0, SZ_2M, 0, NULL));
	ASSERT_EQ(0, do_move(&a, SZ_2M + SZ_1M, SZ_2M + SZ_1M, SZ_1M, 0, NULL));
	EXPECT_EQ(0, count_bad(a.dst, 0, SZ_2M / PAGE_SIZE, 0));
	EXPECT_EQ(0, count_bad(a.dst, (SZ_2M + SZ_1M) / PAGE_SIZE,
			       SZ_1M / PAGE_SIZE, 0));
	EXPECT_EQ(0, count_pagemap(a.src, SZ_2M / PAGE_SIZE, PM_PRESENT));
	/* writes to each side go there only (dst [2M, 3M) is a hole) */
	fill(a.dst, 0, SZ_2M / PAGE_SIZE, 16);
	fill(a.dst, (SZ_2M + SZ_1M) / PAGE_SIZE, SZ_1M / PAGE_SIZE, 16);
	fill(a.src, 0, 2 * SZ_2M / PAGE_SIZE, 17);
	EXPECT_EQ(0, count_bad(a.dst, 0, SZ_2M / PAGE_SIZE, 16));
	EXPECT_EQ(0, count_bad(a.dst, (SZ_2M + SZ_1M) / PAGE_SIZE,
			       SZ_1M / PAGE_SIZE, 16));
	EXPECT_EQ(0, count_bad(a.src, 0, 2 * SZ_2M / PAGE_SIZE, 17));
	area_fini(&a);
}

/* --- what a moved page keeps: soft-dirty, uffd-wp ------------------------ */

/*
 * "Set soft dirty bit so userspace can notice the pte was moved": a tracker
 * that cleared soft-dirty must see each moved page as written, whether it
 * moved as a page, a swap entry or a whole THP (6.12.117 passes: on x86,
 * making an entry dirty makes it soft-dirty too; our fix of the uffd-wp
 * state must keep it so).
 */
TEST(moved_pages_are_soft_dirty)
{
	const unsigned long n = SZ_2M / PAGE_SIZE;
	struct area a;

	if (access("/proc/self/clear_refs", W_OK))
		SKIP(return, "no clear_refs");
	ASSERT_EQ(0, area_init(&a, 2 * SZ_2M, false, 0, false));
	fill(a.src, 0, NPAGES, 18);
	ASSERT_EQ(0, madvise(a.src + NPAGES / 2 * PAGE_SIZE,
			     NPAGES / 2 * PAGE_SIZE, MADV_PAGEOUT));
	ASSERT_EQ(0, clear_soft_dirty());
	if (count_pagemap(a.src, NPAGES, PM_SOFT_DIRTY))
		SKIP(area_fini(&a); return, "soft-dirty is not tracked here");
	ASSERT_EQ(0, do_move(&a, 0, 0, NPAGES * PAGE_SIZE, 0, NULL));
	EXPECT_EQ(NPAGES, count_pagemap(a.dst, NPAGES, PM_SOFT_DIRTY));
	EXPECT_EQ(0, count_bad(a.dst, 0, NPAGES, 18));
	area_fini(&a);

	if (!thp_usable())
		return;
	ASSERT_EQ(0, area_init(&a, SZ_2M, true, 0, false));
	fill(a.src, 0, n, 19);
	if (smaps_kb(a.src, "AnonHugePages:") != 2048)
		SKIP(area_fini(&a); return, "no THP for the source");
	ASSERT_EQ(0, clear_soft_dirty());
	ASSERT_EQ(0, count_pagemap(a.src, n, PM_SOFT_DIRTY));
	ASSERT_EQ(0, do_move(&a, 0, 0, SZ_2M, 0, NULL));
	EXPECT_EQ(2048, smaps_kb(a.dst, "AnonHugePages:"));
	EXPECT_EQ(n, count_pagemap(a.dst, n, PM_SOFT_DIRTY))
		TH_LOG("a THP moved whole lost its soft-dirty bit");
	area_fini(&a);
}

/* A thread that writes one word, and whether it finished */
struct writer {
	unsigned long *word;
	unsigned long val;
	atomic_int done;
};

static void *write_word(void *arg)
{
	struct writer *w = arg;

	store_word(w->word, w->val);
	atomic_store(&w->done, 1);
	return NULL;
}

/* Wait up to @ms for a fault message on @uffd: 0 and *@msg, or -errno */
static int read_fault(int uffd, struct uffd_msg *msg, int ms)
{
	struct pollfd pfd = { .fd = uffd, .events = POLLIN };

	if (poll(&pfd, 1, ms) != 1)
		return -ETIMEDOUT;
	if (read(uffd, msg, sizeof(*msg)) != sizeof(*msg))
		return -errno;
	return msg->event == UFFD_EVENT_PAGEFAULT ? 0 : -EPROTO;
}

/*
 * uffd-wp write-protected pages of the source arrive write-protected: the
 * first write at the destination is a WP fault the monitor sees, and the
 * data is the source's.  @how: 0 present pages, 1 swap entries, 2 a THP.
 * Upstream: "userfaultfd: preserve write protection across UFFDIO_MOVE"
 * (2026, not merged), for present pages; here for all three.
 */
static void wp_kept(struct __test_metadata *_metadata, int how)
{
	unsigned long n = how == 2 ? SZ_2M / PAGE_SIZE : NPAGES;
	struct uffd_msg msg;
	struct writer w;
	struct area a;
	pthread_t t;
	int ret;

	ret = area_init(&a, SZ_2M, how == 2, UFFD_FEATURE_PAGEFAULT_FLAG_WP,
			true);
	if (ret == -EINVAL)
		SKIP(return, "no uffd-wp for anonymous memory here");
	ASSERT_EQ(0, ret);
	if (how == 2 && !thp_usable())
		SKIP(area_fini(&a); return, "THP is not usable here");
	fill(a.src, 0, n, 20);
	if (how == 2 && smaps_kb(a.src, "AnonHugePages:") != 2048)
		SKIP(area_fini(&a); return, "no THP for the source");
	ASSERT_EQ(0, uffd_register(a.uffd, a.src, SZ_2M,
				   UFFDIO_REGISTER_MODE_WP));
	ASSERT_EQ(0, writeprotect(a.uffd, a.src, n * PAGE_SIZE, true));
	if (how == 1) {
		ASSERT_EQ(0, madvise(a.src, n * PAGE_SIZE, MADV_PAGEOUT));
		if (count_pagemap(a.src, n, PM_SWAP) < n / 2)
			SKIP(area_fini(&a); return, "no swap here");
	}
	ASSERT_EQ(n, count_pagemap(a.src, n, PM_UFFD_WP));
	ASSERT_EQ(0, do_move(&a, 0, 0, n * PAGE_SIZE, 0, NULL));
	EXPECT_EQ(n, count_pagemap(a.dst, n, PM_UFFD_WP))
		TH_LOG("the moved pages lost their uffd-wp bit");
	EXPECT_EQ(0, count_bad(a.dst, 0, n, 20));

	/* a write to the destination faults to the monitor */
	w = (struct writer){ .word = first_word(a.dst + PAGE_SIZE), .val = 21 };
	ASSERT_EQ(0, pthread_create(&t, NULL, write_word, &w));
	ret = read_fault(a.uffd, &msg, 5000);
	EXPECT_EQ(0, ret) TH_LOG("a write to a moved write-protected page did not fault");
	if (!ret) {
		EXPECT_TRUE(msg.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP);
		EXPECT_EQ((unsigned long)a.dst + PAGE_SIZE,
			  msg.arg.pagefault.address & ~(PAGE_SIZE - 1));
		EXPECT_EQ(0, atomic_load(&w.done));
	}
	ASSERT_EQ(0, writeprotect(a.uffd, a.dst, n * PAGE_SIZE, false));
	pthread_join(t, NULL);
	EXPECT_EQ(21, load_word(first_word(a.dst + PAGE_SIZE)));
	area_fini(&a);
}

TEST(uffd_wp_kept_present)
{
	wp_kept(_metadata, 0);
}

TEST(uffd_wp_kept_swapped)
{
	wp_kept(_metadata, 1);
}

TEST(uffd_wp_kept_thp)
{
	wp_kept(_metadata, 2);
}

/*
 * Holes that uffd-wp protects (PTE markers, UFFD_FEATURE_WP_UNPOPULATED)
 * are holes: in the source, ENOENT without ALLOW_SRC_HOLES, and with it
 * they arrive as protected holes; in the destination, a page moves in as
 * UFFDIO_COPY would fill it.  6.12.117: EFAULT and EEXIST.
 */
TEST(uffd_wp_markers_are_holes)
{
	const unsigned long hole = 8, nhole = 8;
	struct area a;
	__s64 moved;
	int ret;

	ret = area_init(&a, SZ_2M, false, UFFD_FEATURE_PAGEFAULT_FLAG_WP |
			UFFD_FEATURE_WP_UNPOPULATED, true);
	if (ret == -EINVAL)
		SKIP(return, "no uffd-wp markers for anonymous memory here");
	ASSERT_EQ(0, ret);
	ASSERT_EQ(0, uffd_register(a.uffd, a.src, SZ_2M,
				   UFFDIO_REGISTER_MODE_WP));
	fill(a.src, 0, NPAGES, 28);
	ASSERT_EQ(0, madvise(a.src + hole * PAGE_SIZE, nhole * PAGE_SIZE,
			     MADV_DONTNEED));
	ASSERT_EQ(0, writeprotect(a.uffd, a.src, NPAGES * PAGE_SIZE, true));
	ASSERT_EQ(NPAGES, count_pagemap(a.src, NPAGES, PM_UFFD_WP));
	ASSERT_EQ(0, writeprotect(a.uffd, a.dst + NPAGES * PAGE_SIZE,
				  NPAGES * PAGE_SIZE, true));
	ASSERT_EQ(NPAGES, count_pagemap(a.dst + NPAGES * PAGE_SIZE, NPAGES,
					PM_UFFD_WP));

	EXPECT_EQ(-EAGAIN, do_move(&a, 0, 0, NPAGES * PAGE_SIZE, 0, &moved));
	EXPECT_EQ(hole * PAGE_SIZE, moved);
	EXPECT_EQ(-ENOENT, do_move(&a, hole * PAGE_SIZE, hole * PAGE_SIZE,
				   PAGE_SIZE, 0, NULL));
	EXPECT_EQ(0, do_move(&a, hole * PAGE_SIZE, hole * PAGE_SIZE,
			     (NPAGES - hole) * PAGE_SIZE,
			     UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES, NULL));
	EXPECT_EQ(NPAGES, count_pagemap(a.dst, NPAGES, PM_UFFD_WP));
	EXPECT_EQ(0, count_pagemap(a.dst + hole * PAGE_SIZE, nhole, PM_PRESENT));
	EXPECT_EQ(0, count_pagemap(a.src, NPAGES, PM_UFFD_WP));
	EXPECT_EQ(0, count_bad(a.dst, 0, hole, 28));
	EXPECT_EQ(0, count_bad(a.dst, hole + nhole, NPAGES - hole - nhole, 28));

	/* into protected holes of the destination */
	ASSERT_EQ(0, uffd_unregister(a.uffd, a.src, SZ_2M));
	fill(a.src, 0, 4, 29);
	/* (failed, the destination would be read through its holes) */
	ASSERT_EQ(0, do_move(&a, NPAGES * PAGE_SIZE, 0, 4 * PAGE_SIZE, 0, NULL));
	EXPECT_EQ(0, count_bad(a.dst + NPAGES * PAGE_SIZE, 0, 4, 29));
	EXPECT_EQ(4, count_pagemap(a.dst + NPAGES * PAGE_SIZE, 4, PM_PRESENT));
	area_fini(&a);
}

/* A page that was not write-protected arrives writable: no fault */
TEST(unprotected_pages_stay_writable)
{
	struct area a;
	int ret;

	ret = area_init(&a, SZ_2M, false, UFFD_FEATURE_PAGEFAULT_FLAG_WP, true);
	if (ret == -EINVAL)
		SKIP(return, "no uffd-wp for anonymous memory here");
	ASSERT_EQ(0, ret);
	fill(a.src, 0, NPAGES, 22);
	ASSERT_EQ(0, do_move(&a, 0, 0, NPAGES * PAGE_SIZE, 0, NULL));
	EXPECT_EQ(0, count_pagemap(a.dst, NPAGES, PM_UFFD_WP));
	/* the main thread writes: a fault would hang it, so check first */
	fill(a.dst, 0, NPAGES, 23);
	EXPECT_EQ(0, count_bad(a.dst, 0, NPAGES, 23));
	area_fini(&a);
}

/* --- the protocol: mmap_changing, DONTWAKE ------------------------------- */

struct dontneed {
	char *p;
	unsigned long len;
};

static void *do_dontneed(void *arg)
{
	struct dontneed *d = arg;

	madvise(d->p, d->len, MADV_DONTNEED);
	return NULL;
}

/*
 * While a non-cooperative event is pending (a MADV_DONTNEED of the
 * registered range waits for the monitor to read UFFD_EVENT_REMOVE),
 * UFFDIO_MOVE fails with EAGAIN and says so in "move" (upstream: "fix
 * uninitialized output field for -EAGAIN race").
 */
TEST(eagain_while_mmap_changes)
{
	struct uffd_msg msg;
	struct dontneed d;
	struct pollfd pfd;
	struct area a;
	__s64 moved;
	pthread_t t;
	int ret;

	ASSERT_EQ(0, area_init(&a, SZ_2M, false, UFFD_FEATURE_EVENT_REMOVE,
			       false));
	fill(a.src, 0, NPAGES, 24);
	d = (struct dontneed){ .p = a.dst + SZ_1M, .len = PAGE_SIZE };
	ASSERT_EQ(0, pthread_create(&t, NULL, do_dontneed, &d));
	pfd = (struct pollfd){ .fd = a.uffd, .events = POLLIN };
	ASSERT_EQ(1, poll(&pfd, 1, 10000));
	ret = do_move(&a, 0, 0, PAGE_SIZE, 0, &moved);
	EXPECT_EQ(-EAGAIN, ret);
	EXPECT_EQ(-EAGAIN, moved);
	ASSERT_EQ(sizeof(msg), read(a.uffd, &msg, sizeof(msg)));
	EXPECT_EQ(UFFD_EVENT_REMOVE, msg.event);
	pthread_join(t, NULL);
	EXPECT_EQ(0, do_move(&a, 0, 0, PAGE_SIZE, 0, &moved));
	EXPECT_EQ(PAGE_SIZE, moved);
	EXPECT_EQ(0, count_bad(a.dst, 0, 1, 24));
	area_fini(&a);
}

struct reader {
	char *page;
	unsigned long seen;
	atomic_int done;
};

static void *read_page(void *arg)
{
	struct reader *r = arg;

	r->seen = load_word(first_word(r->page));
	atomic_store(&r->done, 1);
	return NULL;
}

/* DONTWAKE leaves the faulting thread asleep until UFFDIO_WAKE */
TEST(dontwake)
{
	struct uffdio_range range;
	struct uffd_msg msg;
	struct reader r;
	struct area a;
	pthread_t t;

	ASSERT_EQ(0, area_init(&a, SZ_2M, false, 0, false));
	fill(a.src, 0, NPAGES, 25);
	r = (struct reader){ .page = a.dst + 5 * PAGE_SIZE };
	ASSERT_EQ(0, pthread_create(&t, NULL, read_page, &r));
	ASSERT_EQ(0, read_fault(a.uffd, &msg, 10000));
	EXPECT_EQ((unsigned long)r.page, msg.arg.pagefault.address);
	ASSERT_EQ(0, do_move(&a, 5 * PAGE_SIZE, 5 * PAGE_SIZE, PAGE_SIZE,
			     UFFDIO_MOVE_MODE_DONTWAKE, NULL));
	usleep(300 * 1000);
	EXPECT_EQ(0, atomic_load(&r.done)) TH_LOG("woken despite DONTWAKE");
	range = (struct uffdio_range){ (unsigned long)r.page, PAGE_SIZE };
	ASSERT_EQ(0, ioctl(a.uffd, UFFDIO_WAKE, &range));
	pthread_join(t, NULL);
	EXPECT_EQ(tag(5, 25), r.seen);
	area_fini(&a);
}

/* --- rmap after a move, and moves against migration ---------------------- */

/* The node of the page at @p (a move_pages() query), -errno, -1 */
static int node_of(char *p)
{
	void *addr = p;
	int status = -1;

	if (move_pages(0, 1, &addr, NULL, &status, 0))
		return -1;
	return status;
}

static long migrate(char *p, unsigned long n, int node)
{
	void *addrs[NPAGES];
	int nodes[NPAGES], status[NPAGES];

	for (unsigned long i = 0; i < n; i++) {
		addrs[i] = p + i * PAGE_SIZE;
		nodes[i] = node;
	}
	return move_pages(0, n, addrs, nodes, status, MPOL_MF_MOVE);
}

/*
 * A moved page is found by rmap at its new place: migration moves it to
 * the other node and reclaim swaps it out (folio->index and anon_vma were
 * moved with it), and the data survives both.
 */
TEST(rmap_finds_moved_pages)
{
	struct area a;
	int node;

	if (access("/sys/devices/system/node/node1", F_OK))
		SKIP(return, "one NUMA node");
	ASSERT_EQ(0, area_init(&a, SZ_2M, false, 0, false));
	fill(a.src, 0, NPAGES, 26);
	ASSERT_EQ(0, do_move(&a, 0, 0, NPAGES * PAGE_SIZE, 0, NULL));
	node = node_of(a.dst);
	ASSERT_LE(0, node);
	EXPECT_EQ(0, migrate(a.dst, NPAGES, !node));
	for (unsigned long i = 0; i < NPAGES; i++)
		if (node_of(a.dst + i * PAGE_SIZE) != !node) {
			EXPECT_EQ(!node, node_of(a.dst + i * PAGE_SIZE))
				TH_LOG("page %lu was not migrated", i);
			break;
		}
	EXPECT_EQ(0, count_bad(a.dst, 0, NPAGES, 26));
	ASSERT_EQ(0, madvise(a.dst, NPAGES * PAGE_SIZE, MADV_PAGEOUT));
	EXPECT_LE(NPAGES / 2, count_pagemap(a.dst, NPAGES, PM_SWAP));
	EXPECT_EQ(0, count_bad(a.dst, 0, NPAGES, 26));
	area_fini(&a);
}

struct migrator {
	char *p;
	atomic_int stop;
	unsigned long rounds;
};

static void *migrate_loop(void *arg)
{
	struct migrator *m = arg;

	while (!atomic_load(&m->stop)) {
		migrate(m->p, NPAGES, m->rounds & 1);
		m->rounds++;
	}
	return NULL;
}

/*
 * Moves against migration of the same pages: a migration entry at the
 * source (a PTE, or with @thp a PMD: 6.12.117 failed the move with ENOENT,
 * see whole_thp_moves_during_migration) makes the move wait and retry,
 * never fail or lose a page.  @thp: the source is a THP, moved in halves (split) and
 * whole by turns.
 */
static void against_migration(struct __test_metadata *_metadata, bool thp)
{
	unsigned long n = thp ? SZ_2M / PAGE_SIZE : NPAGES;
	unsigned long rounds = 0, bad = 0;
	struct migrator m;
	long end;
	struct area a;
	pthread_t t;

	if (access("/sys/devices/system/node/node1", F_OK))
		SKIP(return, "one NUMA node");
	if (thp && !thp_usable())
		SKIP(return, "THP is not usable here");
	ASSERT_EQ(0, area_init(&a, SZ_2M, thp, 0, false));
	m = (struct migrator){ .p = a.src };
	ASSERT_EQ(0, pthread_create(&t, NULL, migrate_loop, &m));
	/*
	 * 8 s of moves from here, and one at least: under KASAN in a soak the
	 * setup above once took longer than the 8 s counted from the start.
	 */
	end = now_ms() + 8000;
	while (now_ms() < end || !rounds) {
		unsigned long len = thp && (rounds & 1) ? SZ_1M : n * PAGE_SIZE;
		int ret;

		fill(a.src, 0, n, 27 + rounds);
		ret = do_move(&a, 0, 0, len, 0, NULL);
		if (!ret && len < n * PAGE_SIZE)
			ret = do_move(&a, len, len, n * PAGE_SIZE - len, 0, NULL);
		if (ret) {
			EXPECT_EQ(0, ret);
			break;
		}
		bad += count_bad(a.dst, 0, n, 27 + rounds);
		ASSERT_EQ(0, madvise(a.dst, SZ_2M, MADV_DONTNEED));
		rounds++;
	}
	atomic_store(&m.stop, 1);
	pthread_join(t, NULL);
	TH_LOG("%lu moves of %lu pages against %lu migrations", rounds, n,
	       m.rounds);
	EXPECT_EQ(0, bad);
	EXPECT_LE(1, rounds);
	area_fini(&a);
}

TEST(moves_against_migration)
{
	against_migration(_metadata, false);
}

TEST(moves_a_thp_against_migration)
{
	against_migration(_metadata, true);
}

/* Migrate the page at each of @n pointers to the other node, by turns */
struct thp_migrator {
	char *p[2];
	atomic_int stop;
	unsigned long rounds;
};

static void *migrate_thps(void *arg)
{
	struct thp_migrator *m = arg;

	while (!atomic_load(&m->stop)) {
		/* one address per THP: move_pages() migrates the whole folio */
		migrate(m->p[m->rounds & 1], 1, (m->rounds >> 1) & 1);
		m->rounds++;
	}
	return NULL;
}

/*
 * A THP moved whole back and forth between two registered areas while
 * another thread migrates it between the nodes: the whole-PMD move meets
 * PMD migration entries, waits for them (pmd_migration_entry_wait()) and
 * retries.  Every move must complete, the data intact.  6.12.117: ENOENT
 * (pmd_devmap() of a migration entry), and with that fixed alone an oops
 * (the wait took the lock of a stack copy of the PMD).
 */
TEST(whole_thp_moves_during_migration)
{
	const unsigned long n = SZ_2M / PAGE_SIZE;
	unsigned long rounds = 0;
	long end = now_ms() + 8000;
	struct thp_migrator m;
	struct area a;
	pthread_t t;
	char *from, *to;

	if (access("/sys/devices/system/node/node1", F_OK))
		SKIP(return, "one NUMA node");
	if (!thp_usable())
		SKIP(return, "THP is not usable here");
	ASSERT_EQ(0, area_init(&a, SZ_2M, true, 0, false));
	fill(a.src, 0, n, 80);
	if (smaps_kb(a.src, "AnonHugePages:") != 2048)
		SKIP(area_fini(&a); return, "no THP for the source");
	/* both areas registered: the THP moves there and back */
	ASSERT_EQ(0, uffd_register(a.uffd, a.src, SZ_2M,
				   UFFDIO_REGISTER_MODE_MISSING));
	m = (struct thp_migrator){ .p = { a.src, a.dst } };
	ASSERT_EQ(0, pthread_create(&t, NULL, migrate_thps, &m));
	from = a.src;
	to = a.dst;
	while (now_ms() < end) {
		struct uffdio_move mv = {
			.dst = (unsigned long)to, .src = (unsigned long)from,
			.len = SZ_2M,
		};
		char *tmp;

		if (ioctl(a.uffd, UFFDIO_MOVE, &mv)) {
			EXPECT_EQ(0, -errno) TH_LOG("round %lu: moved %lld",
						     rounds, (long long)mv.move);
			break;
		}
		tmp = from;
		from = to;
		to = tmp;
		rounds++;
	}
	atomic_store(&m.stop, 1);
	pthread_join(t, NULL);
	TH_LOG("%lu whole-THP moves against %lu migrations", rounds, m.rounds);
	EXPECT_EQ(0, count_bad(from, 0, n, 80));
	area_fini(&a);
}

/* Two movers of the same pages: each page moves once, to one place */
struct mover {
	struct area *a;
	unsigned long moved;
	int err;
};

static void *move_all(void *arg)
{
	struct mover *m = arg;

	for (unsigned long i = 0; i < NPAGES; i++) {
		int ret = do_move(m->a, i * PAGE_SIZE, i * PAGE_SIZE,
				  PAGE_SIZE, 0, NULL);

		if (!ret)
			m->moved++;
		else if (ret != -EEXIST && ret != -ENOENT && ret != -EAGAIN)
			m->err = ret;
	}
	return NULL;
}

/*
 * @thp: the source is a THP that both split (upstream: a mover blocked on
 * the lock of a large folio it holds a reference to deadlocked the other's
 * split_folio()).
 */
static void race_two_movers(struct __test_metadata *_metadata, bool thp)
{
	unsigned long rounds = 0, bad = 0;
	long end = now_ms() + 5000;
	struct area a;

	if (thp && !thp_usable())
		SKIP(return, "THP is not usable here");
	ASSERT_EQ(0, area_init(&a, SZ_2M, thp, 0, false));
	while (now_ms() < end) {
		struct mover m1 = { .a = &a }, m2 = { .a = &a };
		pthread_t t1, t2;

		fill(a.src, 0, thp ? SZ_2M / PAGE_SIZE : NPAGES, 40 + rounds);
		ASSERT_EQ(0, pthread_create(&t1, NULL, move_all, &m1));
		ASSERT_EQ(0, pthread_create(&t2, NULL, move_all, &m2));
		pthread_join(t1, NULL);
		pthread_join(t2, NULL);
		EXPECT_EQ(0, m1.err);
		EXPECT_EQ(0, m2.err);
		EXPECT_EQ(NPAGES, m1.moved + m2.moved);
		bad += count_bad(a.dst, 0, NPAGES, 40 + rounds);
		ASSERT_EQ(0, madvise(a.dst, SZ_2M, MADV_DONTNEED));
		ASSERT_EQ(0, madvise(a.src, SZ_2M, MADV_DONTNEED));
		rounds++;
	}
	TH_LOG("%lu rounds", rounds);
	EXPECT_EQ(0, bad);
	area_fini(&a);
}

TEST(two_movers)
{
	race_two_movers(_metadata, false);
}

TEST(two_movers_split_a_thp)
{
	race_two_movers(_metadata, true);
}

/* --- batches and large folios ------------------------------------------- */

/* vm.uffd_move_batch to @on where the kernel has it: true if it does */
static bool set_batch(int on)
{
	if (!switch_present(MOVE_BATCH))
		return false;
	return !write_knob(MOVE_BATCH, on ? "1" : "0");
}

/*
 * What a batch must stop at, in one move over two page tables, with the
 * destination at another offset in its tables than the source (so each
 * side's table end cuts a batch): holes (ALLOW_SRC_HOLES), zero pages, swap
 * entries, a page shared with a child (EBUSY ends the move, short), and
 * present pages around them.  Every page arrives, with batching and
 * without.
 */
#define MIXED_PAGES	(2 * SZ_2M / PAGE_SIZE - 64)

static void mixed(struct __test_metadata *_metadata, int batch)
{
	const unsigned long shift = 37;	/* pages: the destination's offset */
	unsigned long first_bad = MIXED_PAGES - 100;
	int go[2], ready[2], status;
	unsigned long zero = 0;
	struct area a;
	__s64 moved;
	char c = 0;
	pid_t pid;

	if (!set_batch(batch) && batch)
		SKIP(return, "no vm.uffd_move_batch (vanilla kernel?)");
	ASSERT_EQ(0, area_init(&a, 3 * SZ_2M, false, 0, false));
	fill(a.src, 0, MIXED_PAGES, 50 + batch);
	for (unsigned long i = 0; i < MIXED_PAGES; i += 97)
		madvise(a.src + i * PAGE_SIZE, PAGE_SIZE, MADV_DONTNEED);
	for (unsigned long i = 5; i < MIXED_PAGES; i += 89) {
		if (!(i % 97))
			continue;
		madvise(a.src + i * PAGE_SIZE, PAGE_SIZE, MADV_DONTNEED);
		zero += load_word(first_word(a.src + i * PAGE_SIZE));
	}
	ASSERT_EQ(0, zero);
	for (unsigned long i = 11; i < MIXED_PAGES; i += 61)
		madvise(a.src + i * PAGE_SIZE, 3 * PAGE_SIZE, MADV_PAGEOUT);

	/* a page a child maps too: not exclusive, the move stops there */
	ASSERT_EQ(0, pipe(go));
	ASSERT_EQ(0, pipe(ready));
	ASSERT_EQ(0, madvise(a.src, first_bad * PAGE_SIZE, MADV_DONTFORK));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		if (write(ready[1], "r", 1) != 1 || read(go[0], &c, 1) != 1)
			_exit(2);
		_exit(0);
	}
	ASSERT_EQ(1, read(ready[0], &c, 1));
	/* DONTFORK split the VMA: move up to its end, then from there */
	EXPECT_EQ(0, do_move(&a, shift * PAGE_SIZE, 0, first_bad * PAGE_SIZE,
			     UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES, &moved));
	EXPECT_EQ(first_bad * PAGE_SIZE, moved);
	EXPECT_EQ(-EBUSY, do_move(&a, (shift + first_bad) * PAGE_SIZE,
				  first_bad * PAGE_SIZE, PAGE_SIZE,
				  UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES, NULL));
	ASSERT_EQ(1, write(go[1], "g", 1));
	ASSERT_EQ(pid, waitpid(pid, &status, 0));

	for (unsigned long i = 0; i < first_bad; i++) {
		char *d = a.dst + (shift + i) * PAGE_SIZE;
		unsigned long want = tag(i, 50 + batch);

		/* a hole stays one (reading it would wait for a handler) */
		if (!(i % 97)) {
			EXPECT_EQ(0, count_pagemap(d, 1, PM_PRESENT));
			continue;
		}
		if (i >= 5 && !((i - 5) % 89))
			want = 0;
		if (load_word(first_word(d)) != want ||
		    load_word(last_word(d)) != want) {
			EXPECT_EQ(want, load_word(first_word(d)))
				TH_LOG("page %lu", i);
			break;
		}
	}
	EXPECT_EQ(0, count_pagemap(a.src, first_bad, PM_PRESENT | PM_SWAP));
	EXPECT_EQ(0, count_bad(a.src, first_bad, 1, 50 + batch));
	close(go[0]);
	close(go[1]);
	close(ready[0]);
	close(ready[1]);
	area_fini(&a);
	restore_knob_list(knobs, ARRAY_SIZE(knobs));
}

TEST(mixed_pages_with_batches)
{
	mixed(_metadata, 1);
}

TEST(mixed_pages_without_batches)
{
	mixed(_metadata, 0);
}

/* The number of @n pages at @p whose folio is large (kpageflags THP) */
#define KPF_THP		22

static unsigned long count_large(char *p, unsigned long n)
{
	int pm = open("/proc/self/pagemap", O_RDONLY);
	int kf = open("/proc/kpageflags", O_RDONLY);
	unsigned long count = 0;

	if (pm < 0 || kf < 0)
		goto out;
	for (unsigned long i = 0; i < n; i++) {
		uint64_t ent = pagemap_entry(pm, p + i * PAGE_SIZE), flags = 0;

		if (!(ent & PM_PRESENT) || !(ent & PM_PFN))
			continue;
		if (pread(kf, &flags, 8, (ent & PM_PFN) * 8) == 8 &&
		    (flags & (1ULL << KPF_THP)))
			count++;
	}
out:
	if (pm >= 0)
		close(pm);
	if (kf >= 0)
		close(kf);
	return count;
}

/*
 * 64 KiB mTHPs of the source: a move that covers each from its first
 * page, aligned on both sides, keeps them whole (with batching); one
 * that starts inside them or lands misaligned splits them, as 6.12 does.
 * The data arrives either way.
 */
TEST(moves_mthp_whole)
{
	const unsigned long n = 32 * 16;	/* 32 mTHPs of 16 pages */
	unsigned long large;
	struct area a;
	bool batch;

	if (write_knob(MTHP_64K, "always") || write_knob(MTHP_2M, "never"))
		SKIP(return, "no 64 KiB mTHP here");
	batch = set_batch(1);
	ASSERT_EQ(0, area_init_advice(&a, SZ_2M * 2, -1, 0, false));
	fill(a.src, 0, n, 60);
	large = count_large(a.src, n);
	if (large < n / 2)
		SKIP(area_fini(&a); return, "%lu of %lu pages in mTHPs", large, n);
	ASSERT_EQ(0, do_move(&a, 0, 0, n * PAGE_SIZE, 0, NULL));
	EXPECT_EQ(0, count_bad(a.dst, 0, n, 60));
	if (batch) {
		EXPECT_EQ(large, count_large(a.dst, n))
			TH_LOG("mTHPs were split by the move");
	} else {
		TH_LOG("vanilla: %lu of %lu pages large after the move",
		       count_large(a.dst, n), large);
	}

	/* misaligned destination: split, the data intact */
	ASSERT_EQ(0, madvise(a.dst, SZ_2M * 2, MADV_DONTNEED));
	fill(a.src, 0, n, 61);
	ASSERT_EQ(0, do_move(&a, SZ_1M + PAGE_SIZE, 0, n * PAGE_SIZE, 0, NULL));
	EXPECT_EQ(0, count_bad(a.dst + SZ_1M + PAGE_SIZE, 0, n, 61));
	EXPECT_EQ(0, count_large(a.dst + SZ_1M + PAGE_SIZE, n));

	/* a move that starts inside an mTHP: split, the data intact */
	ASSERT_EQ(0, madvise(a.dst, SZ_2M * 2, MADV_DONTNEED));
	fill(a.src, 0, n, 62);
	ASSERT_EQ(0, do_move(&a, 3 * PAGE_SIZE, 3 * PAGE_SIZE,
			     (n - 3) * PAGE_SIZE, 0, NULL));
	EXPECT_EQ(0, count_bad(a.dst, 3, n - 3, 62));
	EXPECT_EQ(0, count_bad(a.src, 0, 3, 62));
	area_fini(&a);
	restore_knob_list(knobs, ARRAY_SIZE(knobs));
}

/* A THP split to PTEs at the source moves whole into an empty table */
TEST(moves_pte_mapped_thp_whole)
{
	const unsigned long n = SZ_2M / PAGE_SIZE;
	struct uffdio_zeropage z = { 0 };
	struct area a;

	if (!thp_usable())
		SKIP(return, "THP is not usable here");
	if (!set_batch(1))
		SKIP(return, "no vm.uffd_move_batch (vanilla kernel?)");
	ASSERT_EQ(0, area_init(&a, SZ_2M, true, 0, false));
	fill(a.src, 0, n, 63);
	if (smaps_kb(a.src, "AnonHugePages:") != 2048)
		SKIP(area_fini(&a); return, "no THP for the source");
	/*
	 * An empty page table at the destination (a registered range keeps
	 * its tables): the PMD cannot move whole, the THP is split to PTEs
	 */
	z.range = (struct uffdio_range){ (unsigned long)a.dst, PAGE_SIZE };
	ASSERT_EQ(0, ioctl(a.uffd, UFFDIO_ZEROPAGE, &z));
	ASSERT_EQ(0, madvise(a.dst, PAGE_SIZE, MADV_DONTNEED));
	EXPECT_EQ(0, do_move(&a, 0, 0, SZ_2M, 0, NULL));
	EXPECT_EQ(0, count_bad(a.dst, 0, n, 63));
	EXPECT_EQ(0, smaps_kb(a.dst, "AnonHugePages:"));
	EXPECT_EQ(n, count_large(a.dst, n))
		TH_LOG("the THP was split into small folios");
	area_fini(&a);
}

TEST_HARNESS_MAIN
