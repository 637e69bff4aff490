// SPDX-License-Identifier: GPL-2.0
/*
 * bench_fork: the cost of fork() of a large anonymous area and of the
 * copy-on-write faults that follow it in the child.
 *
 * The parent maps and touches N bytes (4 KiB pages, or THP with --thp),
 * forks, and times the fork() call. Both sides read their VmPTE/VmRSS
 * right after fork (the child before it writes anything). The child then
 * writes sequentially to the first half of the area (cow_seq) and to
 * random pages of the second half (cow_rand), each page written once, so
 * every write is a first write after fork. Before writing a page the child
 * checks it holds the parent's pattern; at the end it checks every page
 * holds its own pattern where written and the parent's elsewhere. The
 * parent checks its data is unchanged once the child is gone.
 *
 * --cow-pte asks for COW page tables with a placeholder prctl: no kernel
 * has that interface yet, so EINVAL means "run without".
 */
#include <getopt.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include "bench.h"

#define PTLAB_PR_COW_PTE	0x70746c01
#define PARENT_SEED		0x5a
#define CHILD_SEED		0xc3
#define USAGE "usage: %s [--quick|--full] [--thp] [--cow-pte] [--size BYTES]\n"

struct opts {
	size_t size;		/* bytes mapped and touched by the parent */
	size_t seq;		/* bytes written sequentially by the child */
	unsigned long rand;	/* pages written at random by the child */
	int thp;
	int cow_pte;
};

/* what the child sends back through the pipe */
struct child_report {
	long vmpte, vmrss;
	double seq_ns, rand_ns;
	unsigned long bad_before, bad_after;
};

static uint64_t *word(char *p, unsigned long idx)
{
	return (uint64_t *)(p + idx * PAGE_SZ);
}

static void parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		SIZE_OPTIONS,
		{ "thp", no_argument, NULL, 't' },
		{ "cow-pte", no_argument, NULL, 'c' },
		{ "size", required_argument, NULL, 's' },
		{ NULL, 0, NULL, 0 },
	};
	enum bench_size sz = SIZE_DEFAULT;
	size_t size = 0;
	int c;

	memset(o, 0, sizeof(*o));
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		if (size_option(c, &sz))
			continue;
		switch (c) {
		case 't':
			o->thp = 1;
			break;
		case 'c':
			o->cow_pte = 1;
			break;
		case 's':
			size = parse_size(optarg);
			break;
		default:
			fprintf(stderr, USAGE, argv[0]);
			exit(2);
		}
	}
	o->size = sz == SIZE_QUICK ? 32 * MiB :
		  sz == SIZE_FULL ? 1 * GiB : 256 * MiB;
	o->rand = sz == SIZE_QUICK ? 2048 : sz == SIZE_FULL ? 65536 : 16384;
	if (size)
		o->size = size & ~(PMD_SZ - 1);
	if (o->size < 2 * PMD_SZ)
		die("--size must be at least 4M");
	o->seq = o->size / 2;
	if (o->rand > (o->size - o->seq) / PAGE_SZ)
		o->rand = (o->size - o->seq) / PAGE_SZ;
}

static int enable_cow_pte(void)
{
	if (!prctl(PTLAB_PR_COW_PTE, 1, 0, 0, 0))
		return 1;
	if (errno != EINVAL)
		die("prctl(PTLAB_PR_COW_PTE): %s", strerror(errno));
	comment("cow-pte opt-in not supported by this kernel, running without");
	return 0;
}

static char *setup_area(const struct opts *o)
{
	char *p = map_aligned(o->size, PMD_SZ, 0);
	unsigned long i, n = o->size / PAGE_SZ;

	if (o->thp)
		do_madvise(p, o->size, MADV_HUGEPAGE, "MADV_HUGEPAGE");
	else
		do_madvise(p, o->size, MADV_NOHUGEPAGE, "MADV_NOHUGEPAGE");
	for (i = 0; i < n; i++)
		*word(p, i) = pattern(PARENT_SEED, i);
	comment("parent: AnonHugePages %ld kB after touching",
		smaps_rollup_kb("AnonHugePages"));
	return p;
}

/* random order of the pages of the second half: the first o->rand used */
static unsigned long *rand_pages(const struct opts *o)
{
	unsigned long first = o->seq / PAGE_SZ, n = o->size / PAGE_SZ - first;
	unsigned long *idx = malloc(n * sizeof(*idx)), i, j, t;
	uint64_t s = 0x9e3779b97f4a7c15ULL;

	if (!idx)
		die("malloc");
	for (i = 0; i < n; i++)
		idx[i] = first + i;
	for (i = 0; i < o->rand; i++) {
		j = i + xorshift64(&s) % (n - i);
		t = idx[i];
		idx[i] = idx[j];
		idx[j] = t;
	}
	return idx;
}

/* first write to each page: check the parent's pattern, then write ours */
static unsigned long cow_write(char *p, unsigned long i)
{
	uint64_t *w = word(p, i);
	unsigned long bad = *w != pattern(PARENT_SEED, i);

	*w = pattern(CHILD_SEED, i);
	return bad;
}

static unsigned long child_check(const struct opts *o, char *p,
				 const unsigned long *idx)
{
	unsigned long i, n = o->size / PAGE_SZ, bad = 0;
	unsigned char *mine = calloc(n, 1);

	if (!mine)
		die("calloc");
	for (i = 0; i < o->seq / PAGE_SZ; i++)
		mine[i] = 1;
	for (i = 0; i < o->rand; i++)
		mine[idx[i]] = 1;
	for (i = 0; i < n; i++)
		bad += *word(p, i) != pattern(mine[i] ? CHILD_SEED :
					      PARENT_SEED, i);
	free(mine);
	return bad;
}

static void child(const struct opts *o, char *p, int wfd)
{
	unsigned long *idx = rand_pages(o), i, nseq = o->seq / PAGE_SZ;
	struct child_report r = { 0 };
	uint64_t t0;

	r.vmpte = status_kb(0, "VmPTE");
	r.vmrss = status_kb(0, "VmRSS");
	t0 = now_ns();
	for (i = 0; i < nseq; i++)
		r.bad_before += cow_write(p, i);
	r.seq_ns = (double)(now_ns() - t0) / nseq;
	t0 = now_ns();
	for (i = 0; i < o->rand; i++)
		r.bad_before += cow_write(p, idx[i]);
	r.rand_ns = o->rand ? (double)(now_ns() - t0) / o->rand : 0;
	r.bad_after = child_check(o, p, idx);
	if (write(wfd, &r, sizeof(r)) != sizeof(r))
		_exit(3);
	_exit(r.bad_before || r.bad_after);
}

static unsigned long parent_bad(const struct opts *o, char *p)
{
	unsigned long i, n = o->size / PAGE_SZ, bad = 0;

	for (i = 0; i < n; i++)
		bad += *word(p, i) != pattern(PARENT_SEED, i);
	return bad;
}

static void report(const struct child_report *r, double fork_ms,
		   long pte, long rss, int cow_pte)
{
	metric("cow_pte_enabled", cow_pte, "count", "higher");
	metric("fork_latency", fork_ms, "ms", "lower");
	metric("parent_vmpte", pte, "kB", "lower");
	metric("child_vmpte", r->vmpte, "kB", "lower");
	metric("parent_vmrss", rss, "kB", "lower");
	metric("child_vmrss", r->vmrss, "kB", "lower");
	metric("cow_seq_ns_per_page", r->seq_ns, "ns", "lower");
	metric("cow_rand_ns_per_page", r->rand_ns, "ns", "lower");
}

int main(int argc, char **argv)
{
	struct child_report r;
	int fd[2], status, cow_pte = 0;
	long pte, rss;
	struct opts o;
	uint64_t t0, t1;
	char *p;
	pid_t pid;

	bench_init();
	parse(argc, argv, &o);
	printf("# sizes: area %s (%s), child seq %s, child rand %lu pages%s\n",
	       size_str(o.size), o.thp ? "THP" : "4K",
	       size_str(o.seq), o.rand,
	       o.cow_pte ? ", cow-pte requested" : "");
	if (o.cow_pte)
		cow_pte = enable_cow_pte();
	p = setup_area(&o);
	if (pipe(fd))
		die_errno("pipe");
	t0 = now_ns();
	pid = fork();
	t1 = now_ns();
	if (pid < 0)
		die_errno("fork");
	if (!pid) {
		bench_child = 1;
		close(fd[0]);
		child(&o, p, fd[1]);
	}
	pte = status_kb(0, "VmPTE");
	rss = status_kb(0, "VmRSS");
	close(fd[1]);
	if (read(fd[0], &r, sizeof(r)) != sizeof(r))
		r.bad_before = r.bad_after = ~0UL;
	if (waitpid(pid, &status, 0) != pid)
		die_errno("waitpid");
	if (r.bad_before == ~0UL)
		verify_failed("child sent no report (status 0x%x)", status);
	if (r.bad_before)
		verify_failed("child: %lu pages lacked the parent's data before its write",
			      r.bad_before);
	if (r.bad_after)
		verify_failed("child: %lu pages wrong after its writes",
			      r.bad_after);
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		verify_failed("child exit status 0x%x", status);
	if (parent_bad(&o, p))
		verify_failed("parent: %lu pages changed by the child's writes",
			      parent_bad(&o, p));
	report(&r, (t1 - t0) / 1e6, pte, rss, cow_pte);
	verify_ok();
	return 0;
}
