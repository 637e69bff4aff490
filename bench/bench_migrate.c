// SPDX-License-Identifier: GPL-2.0
/*
 * bench_migrate: the cost of migrating a small anonymous buffer whose
 * anon_vma is shared with many forked children (the rmap walk of every
 * page visits every child's VMA).
 *
 * The parent binds a 5 MiB buffer to node 0 and fills it, then forks C
 * children. Each child resets its range to MPOL_DEFAULT (C COW copies of
 * 5 MiB must not all land on node 0), overwrites the whole buffer with its
 * own pattern, says it is ready and waits. The parent then times
 * mbind(MPOL_BIND node 1, MPOL_MF_MOVE) of its buffer.
 *
 * Verify: before the move every parent page is on node 0, after it every
 * page is on node 1 (move_pages() query) and holds the parent's data; each
 * child then checks its own copy and exits 0 or 1.
 *
 * --mthp64 backs the buffer with 64 KiB mTHP folios (hugepages-64kB set to
 * "always" for the run: "madvise" would need MADV_HUGEPAGE, which would
 * also give PMD THPs in a 5 MiB range).
 */
#include <getopt.h>
#include <numa.h>
#include <numaif.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "bench.h"

#define BUF_SIZE	(5 * MiB)
#define NPAGES		(BUF_SIZE / PAGE_SZ)
#define PARENT_SEED	0x11
#define USAGE		"usage: %s [--quick|--full] [--children N] [--mthp64]\n"

struct opts {
	int children;
	int mthp64;
};

static pid_t *kids;
static int nr_kids;

static void parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		SIZE_OPTIONS,
		{ "children", required_argument, NULL, 'c' },
		{ "mthp64", no_argument, NULL, 'm' },
		{ NULL, 0, NULL, 0 },
	};
	enum bench_size sz = SIZE_DEFAULT;
	int c, n = -1;

	memset(o, 0, sizeof(*o));
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		if (size_option(c, &sz))
			continue;
		switch (c) {
		case 'c':
			n = atoi(optarg);
			break;
		case 'm':
			o->mthp64 = 1;
			break;
		default:
			fprintf(stderr, USAGE, argv[0]);
			exit(2);
		}
	}
	o->children = n >= 0 ? n : sz == SIZE_QUICK ? 50 : 1000;
}

/* SIGKILL and reap every child still around: on any exit of the parent */
static void kill_kids(void)
{
	int i;

	if (bench_child)
		return;
	for (i = 0; i < nr_kids; i++)
		if (kids[i] > 0)
			kill(kids[i], SIGKILL);
	for (i = 0; i < nr_kids; i++)
		if (kids[i] > 0)
			waitpid(kids[i], NULL, 0);
	nr_kids = 0;
}

static void set_mthp64(void)
{
	int ret;

	if (!file_exists(MTHP64 "/enabled"))
		skip("no " MTHP64 "/enabled");
	ret = knob_set(MTHP64 "/enabled", "always");
	if (ret)
		die("set %s/enabled: %s", MTHP64, strerror(-ret));
}

static long long mthp64_allocs(void)
{
	char buf[64];

	if (read_file(MTHP64 "/stats/anon_fault_alloc", buf, sizeof(buf)))
		return -1;
	return atoll(buf);
}

static void bind_to(char *p, int node, unsigned int flags)
{
	unsigned long mask = 1UL << node;

	if (mbind(p, BUF_SIZE, MPOL_BIND, &mask, sizeof(mask) * 8, flags))
		die("mbind node %d: %s", node, strerror(errno));
}

/*
 * memset every page with a byte of the seed and name it by its first and
 * last words: a page moved wrongly or lost shows in either word
 */
static void fill(char *p, uint64_t seed)
{
	unsigned long i;

	for (i = 0; i < NPAGES; i++) {
		uint64_t *w = (uint64_t *)(p + i * PAGE_SZ);

		memset(w, (int)(seed & 0xff) | 1, PAGE_SZ);
		w[0] = pattern(seed, i);
		w[PAGE_SZ / sizeof(*w) - 1] = ~pattern(seed, i);
	}
}

static unsigned long count_bad(const char *p, uint64_t seed)
{
	unsigned long i, bad = 0;

	for (i = 0; i < NPAGES; i++) {
		const uint64_t *w = (const uint64_t *)(p + i * PAGE_SZ);

		bad += w[0] != pattern(seed, i) ||
		       w[PAGE_SZ / sizeof(*w) - 1] != ~pattern(seed, i) ||
		       p[i * PAGE_SZ + PAGE_SZ / 2] != (char)((seed & 0xff) | 1);
	}
	return bad;
}

static void __noreturn
child(char *p, int id, int ready, int go, pid_t parent)
{
	uint64_t seed = 0x100 + id;
	char c = 1;

	bench_child = 1;
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(3);
	if (mbind(p, BUF_SIZE, MPOL_DEFAULT, NULL, 0, 0))
		_exit(2);
	fill(p, seed);
	if (write(ready, &c, 1) != 1)
		_exit(3);
	close(ready);
	if (read(go, &c, 1) < 0)
		_exit(3);
	_exit(count_bad(p, seed) ? 1 : 0);
}

static void raise_limits(int n)
{
	struct rlimit rl;

	if (!getrlimit(RLIMIT_NPROC, &rl) && rl.rlim_cur != RLIM_INFINITY &&
	    rl.rlim_cur < (rlim_t)n + 64) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NPROC, &rl);
	}
}

/* fork the children and wait until all are ready; returns seconds */
static double spawn(const struct opts *o, char *p, int *go_w)
{
	int ready[2], go[2], i, got = 0;
	pid_t parent = getpid();
	uint64_t t0 = now_ns();
	char c;

	if (pipe(ready) || pipe(go))
		die_errno("pipe");
	for (i = 0; i < o->children; i++) {
		pid_t pid = fork();

		if (pid < 0)
			die("fork of child %d: %s", i, strerror(errno));
		if (!pid) {
			close(ready[0]);
			close(go[1]);
			child(p, i, ready[1], go[0], parent);
		}
		kids[nr_kids++] = pid;
	}
	close(ready[1]);
	close(go[0]);
	while (got < o->children && read(ready[0], &c, 1) == 1)
		got++;
	close(ready[0]);
	if (got < o->children)
		die("only %d of %d children got ready", got, o->children);
	*go_w = go[1];
	return (now_ns() - t0) / 1e9;
}

/* tell the children to check their data (EOF on go), reap them */
static int reap(int go_w)
{
	int i, status, failed = 0;

	close(go_w);
	for (i = 0; i < nr_kids; i++) {
		if (waitpid(kids[i], &status, 0) != kids[i])
			die_errno("waitpid");
		kids[i] = 0;
		if (!WIFEXITED(status) || WEXITSTATUS(status)) {
			if (!failed)
				comment("child %d: status 0x%x", i, status);
			failed++;
		}
	}
	nr_kids = 0;
	return failed;
}

static char *setup_buffer(const struct opts *o)
{
	char *p = map_aligned(BUF_SIZE, 64 * KiB, 0);
	long long a0 = mthp64_allocs(), a1;

	if (!o->mthp64)
		do_madvise(p, BUF_SIZE, MADV_NOHUGEPAGE, "MADV_NOHUGEPAGE");
	bind_to(p, 0, 0);
	fill(p, PARENT_SEED);
	if (!o->mthp64)
		return p;
	a1 = mthp64_allocs();
	if (a0 < 0) {
		comment("no hugepages-64kB/stats: 64k folios not counted");
		return p;
	}
	comment("64k folios allocated: %lld", a1 - a0);
	if (a1 - a0 <= 0)
		verify_failed("no 64k mTHP folio was allocated for the buffer");
	return p;
}

int main(int argc, char **argv)
{
	double setup_s, ms;
	struct opts o;
	int go_w, failed;
	uint64_t t0;
	long off;
	char *p;

	bench_init();
	parse(argc, argv, &o);
	printf("# sizes: buffer %s (%s), %d children\n", size_str(BUF_SIZE),
	       o.mthp64 ? "64K mTHP" : "4K", o.children);
	need_two_nodes();
	if (o.mthp64)
		set_mthp64();
	kids = calloc(o.children + 1, sizeof(*kids));
	if (!kids)
		die("calloc");
	raise_limits(o.children);
	atexit(kill_kids);
	p = setup_buffer(&o);
	off = pages_off_node(p, NPAGES, 0);
	if (off)
		verify_failed("%ld of %lu pages not on node 0 before the move",
			      off, NPAGES);
	setup_s = spawn(&o, p, &go_w);
	t0 = now_ns();
	bind_to(p, 1, MPOL_MF_MOVE);
	ms = (now_ns() - t0) / 1e6;
	off = pages_off_node(p, NPAGES, 1);
	failed = reap(go_w);
	if (off)
		verify_failed("%ld of %lu pages not on node 1 after mbind",
			      off, NPAGES);
	if (count_bad(p, PARENT_SEED))
		verify_failed("parent data changed by the move");
	if (failed)
		verify_failed("%d children found their data changed", failed);
	metric("mbind_ms", ms, "ms", "lower");
	metric("setup_s", setup_s, "s", "lower");
	verify_ok();
	return 0;
}
