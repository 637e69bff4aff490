// SPDX-License-Identifier: GPL-2.0
/*
 * bench_fork: the cost of fork() of a large anonymous area, of the exit of
 * a child that wrote nothing, and of the first writes after fork on either
 * side.
 *
 * The parent maps and touches N bytes (4 KiB pages, or THP with --thp):
 * 1 GiB by default, 4 GiB with --full, 32 MiB with --quick.
 * Forks follow, each child checking what it sees:
 *  1. fork (timed), then, with the child waiting: the system's PageTables
 *     growth (/proc/meminfo after vm/stat_refresh) and the child's
 *     VmPTE/VmRSS; the child then exits without writing, timed from the
 *     parent's "go" to waitpid() (exit_nowrite).  Five times: the times
 *     reported are the medians, the memory figures the first fork's.
 *  2. the child writes sequentially to the start of the area (up to
 *     256 MiB, half of it at most: cow_seq) and to random pages of the
 *     rest (cow_rand), each page once, so every write is a first write
 *     after fork; before each write it checks the parent's pattern, at
 *     the end every page.
 *  3. the parent does the same writes while the child waits, then the
 *     child checks it still sees the old data everywhere (parent_cow_*).
 *  4. FORK_LOOP forks on one CPU, each child exiting at once: the least and
 *     the median fork() of the loop (fork_loop_min/_median).
 * The parent checks its own data after each phase.
 *
 * --cow-pte asks for COW page tables (PR_SET_COW_PTE, patches 0022-0026);
 * a kernel without them answers EINVAL, and the run goes on without.
 */
#include <getopt.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include "bench.h"

#define PARENT_SEED		0x5a
#define CHILD_SEED		0xc3
#define PARENT2_SEED		0x96
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
		  sz == SIZE_FULL ? 4 * GiB : 1 * GiB;
	o->rand = sz == SIZE_QUICK ? 2048 : sz == SIZE_FULL ? 65536 : 16384;
	if (size)
		o->size = size & ~(PMD_SZ - 1);
	if (o->size < 2 * PMD_SZ)
		die("--size must be at least 4M");
	/* first writes: a sample of the area, per page, not all of it */
	o->seq = o->size / 2 < 256 * MiB ? o->size / 2 : 256 * MiB;
	if (o->rand > (o->size - o->seq) / PAGE_SZ)
		o->rand = (o->size - o->seq) / PAGE_SZ;
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

/* random order of the pages after the sequential part: the first o->rand used */
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

/* first write to each page: check the parent's pattern, then write @seed's */
static unsigned long cow_write(char *p, unsigned long i, uint64_t seed)
{
	uint64_t *w = word(p, i);
	unsigned long bad = *w != pattern(PARENT_SEED, i);

	*w = pattern(seed, i);
	return bad;
}

/* the writes of phase 2 (child) or 3 (parent), timed per page */
static unsigned long first_writes(const struct opts *o, char *p,
				  const unsigned long *idx, uint64_t seed,
				  double *seq_ns, double *rand_ns)
{
	unsigned long i, nseq = o->seq / PAGE_SZ, bad = 0;
	uint64_t t0;

	t0 = now_ns();
	for (i = 0; i < nseq; i++)
		bad += cow_write(p, i, seed);
	*seq_ns = (double)(now_ns() - t0) / nseq;
	t0 = now_ns();
	for (i = 0; i < o->rand; i++)
		bad += cow_write(p, idx[i], seed);
	*rand_ns = o->rand ? (double)(now_ns() - t0) / o->rand : 0;
	return bad;
}

/* every page: @seed where the writes of a phase went, the parent's elsewhere */
static unsigned long check_area(const struct opts *o, char *p,
				const unsigned long *idx, uint64_t seed)
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
		bad += *word(p, i) != pattern(mine[i] ? seed : PARENT_SEED, i);
	free(mine);
	return bad;
}

static void child(const struct opts *o, char *p, const unsigned long *idx,
		  int wfd)
{
	struct child_report r = { 0 };

	r.vmpte = status_kb(0, "VmPTE");
	r.vmrss = status_kb(0, "VmRSS");
	r.bad_before = first_writes(o, p, idx, CHILD_SEED, &r.seq_ns,
				    &r.rand_ns);
	r.bad_after = check_area(o, p, idx, CHILD_SEED);
	if (write(wfd, &r, sizeof(r)) != sizeof(r))
		_exit(3);
	_exit(r.bad_before || r.bad_after);
}

/*
 * A child that waits for a byte on @rfd, then exits: 1 if @idx is given and
 * a page does not hold the parent's data of before the fork.
 */
static pid_t waiting_child(const struct opts *o, char *p, int rfd[2],
			   const unsigned long *idx)
{
	pid_t pid = fork();
	char c;

	if (pid < 0)
		die_errno("fork");
	if (pid)
		return pid;
	bench_child = 1;
	close(rfd[1]);
	if (read(rfd[0], &c, 1) != 1)
		_exit(3);
	_exit(idx && check_area(o, p, idx, PARENT_SEED) ? 1 : 0);
}

/* PageTables of /proc/meminfo with the per-CPU deltas folded in */
static long pagetables_kb(void)
{
	if (write_file("/proc/sys/vm/stat_refresh", "1"))
		comment("vm/stat_refresh: %s (PageTables approximate)",
			strerror(errno));
	return proc_field_kb("/proc/meminfo", "PageTables");
}

static unsigned long parent_bad(const struct opts *o, char *p)
{
	unsigned long i, n = o->size / PAGE_SZ, bad = 0;

	for (i = 0; i < n; i++)
		bad += *word(p, i) != pattern(PARENT_SEED, i);
	return bad;
}

struct parent_report {
	double fork_ms, exit_ms;
	double loop_min_ms, loop_med_ms;
	long pt_added, child_vmpte, child_vmrss, vmpte, vmrss;
	double seq_ns, rand_ns;
};

static void report(const struct child_report *r,
		   const struct parent_report *pr, int cow_pte)
{
	metric("cow_pte_enabled", cow_pte, "count", "higher");
	metric("fork_latency", pr->fork_ms, "ms", "lower");
	metric("fork_loop_min", pr->loop_min_ms, "ms", "lower");
	metric("fork_loop_median", pr->loop_med_ms, "ms", "lower");
	metric("pagetables_added", pr->pt_added, "kB", "lower");
	metric("exit_nowrite", pr->exit_ms, "ms", "lower");
	metric("parent_vmpte", pr->vmpte, "kB", "lower");
	metric("child_vmpte", pr->child_vmpte, "kB", "lower");
	metric("parent_vmrss", pr->vmrss, "kB", "lower");
	metric("child_vmrss", pr->child_vmrss, "kB", "lower");
	metric("cow_seq_ns_per_page", r->seq_ns, "ns", "lower");
	metric("cow_rand_ns_per_page", r->rand_ns, "ns", "lower");
	metric("parent_cow_seq_ns_per_page", pr->seq_ns, "ns", "lower");
	metric("parent_cow_rand_ns_per_page", pr->rand_ns, "ns", "lower");
}

/*
 * Phase 1: fork, what it added, and the exit of a child that wrote nothing;
 * FORK_REPS times, the median of each time (one fork is one sample of a
 * few milliseconds: a timer tick or a TCG translation flush moves it).
 */
#define FORK_REPS	5

static void phase_fork_exit(const struct opts *o, char *p,
			    struct parent_report *pr)
{
	double fork_ms[FORK_REPS], exit_ms[FORK_REPS];
	uint64_t t0, t1;
	int go[2], i;
	pid_t pid;
	long pt0;

	for (i = 0; i < FORK_REPS; i++) {
		if (pipe(go))
			die_errno("pipe");
		pt0 = pagetables_kb();
		t0 = now_ns();
		pid = waiting_child(o, p, go, NULL);
		t1 = now_ns();
		close(go[0]);
		fork_ms[i] = (t1 - t0) / 1e6;
		if (!i) {
			pr->pt_added = pagetables_kb() - pt0;
			pr->child_vmpte = status_kb(pid, "VmPTE");
			pr->child_vmrss = status_kb(pid, "VmRSS");
			pr->vmpte = status_kb(0, "VmPTE");
			pr->vmrss = status_kb(0, "VmRSS");
		}
		t0 = now_ns();
		if (write(go[1], "x", 1) != 1)
			die_errno("write");
		reap_ok(pid, "exit without writing");
		exit_ms[i] = (now_ns() - t0) / 1e6;
		close(go[1]);
	}
	pr->fork_ms = quantile(fork_ms, FORK_REPS, 0.5);
	pr->exit_ms = quantile(exit_ms, FORK_REPS, 0.5);
}

/* Phase 2: the child's first writes */
static void phase_child_writes(const struct opts *o, char *p,
			       const unsigned long *idx,
			       struct child_report *r)
{
	int fd[2], status;
	pid_t pid;

	if (pipe(fd))
		die_errno("pipe");
	pid = fork();
	if (pid < 0)
		die_errno("fork");
	if (!pid) {
		bench_child = 1;
		close(fd[0]);
		child(o, p, idx, fd[1]);
	}
	close(fd[1]);
	if (read(fd[0], r, sizeof(*r)) != sizeof(*r))
		r->bad_before = r->bad_after = ~0UL;
	close(fd[0]);
	if (waitpid(pid, &status, 0) != pid)
		die_errno("waitpid");
	if (r->bad_before == ~0UL)
		verify_failed("child sent no report (status 0x%x)", status);
	if (r->bad_before)
		verify_failed("child: %lu pages lacked the parent's data before its write",
			      r->bad_before);
	if (r->bad_after)
		verify_failed("child: %lu pages wrong after its writes",
			      r->bad_after);
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		verify_failed("child exit status 0x%x", status);
}

/* Phase 3: the parent's first writes while a child still maps the pages */
static void phase_parent_writes(const struct opts *o, char *p,
				const unsigned long *idx,
				struct parent_report *pr)
{
	unsigned long bad;
	int go[2];
	pid_t pid;

	if (pipe(go))
		die_errno("pipe");
	pid = waiting_child(o, p, go, idx);
	close(go[0]);
	bad = first_writes(o, p, idx, PARENT2_SEED, &pr->seq_ns, &pr->rand_ns);
	if (write(go[1], "x", 1) != 1)
		die_errno("write");
	close(go[1]);
	reap_ok(pid, "child after the parent's writes (it saw them: exit 1)");
	if (bad)
		verify_failed("parent: %lu pages changed before its first write",
			      bad);
	bad = check_area(o, p, idx, PARENT2_SEED);
	if (bad)
		verify_failed("parent: %lu pages wrong after its writes", bad);
}

/*
 * Phase 4: FORK_LOOP forks whose children exit at once, on the CPU the
 * parent is on.  Under TCG one fork's time moves by a millisecond
 * with the host's scheduling of the vCPU threads (a child woken on another
 * vCPU, a timer): fork_latency of vanilla against itself was 1.14 on a
 * 2-core host.  The least fork of many is fork's own work, the share or
 * copy of the area on top of what a fork of anything costs; the median says
 * how far the rest sits from it.  It comes last, so that phases 2 and 3
 * measure what they did before it was added; the parent's writes of phase
 * 3 made most of its tables its own again, so the loop's first fork shares
 * them anew, and the later ones add a holder.
 */
#define FORK_LOOP	50

static void phase_fork_loop(struct parent_report *pr)
{
	double ms[FORK_LOOP];
	cpu_set_t all, one;
	uint64_t t0;
	pid_t pid;
	int i;

	if (sched_getaffinity(0, sizeof(all), &all))
		die_errno("sched_getaffinity");
	CPU_ZERO(&one);
	CPU_SET(sched_getcpu(), &one);
	if (sched_setaffinity(0, sizeof(one), &one))
		die_errno("sched_setaffinity");
	for (i = 0; i < FORK_LOOP; i++) {
		t0 = now_ns();
		pid = fork();
		if (pid < 0)
			die_errno("fork");
		if (!pid)
			_exit(0);
		ms[i] = (now_ns() - t0) / 1e6;
		reap_ok(pid, "fork loop");
	}
	if (sched_setaffinity(0, sizeof(all), &all))
		die_errno("sched_setaffinity");
	pr->loop_min_ms = quantile(ms, FORK_LOOP, 0);
	pr->loop_med_ms = quantile(ms, FORK_LOOP, 0.5);
}

int main(int argc, char **argv)
{
	struct parent_report pr = { 0 };
	struct child_report r;
	unsigned long *idx;
	int cow_pte = 0;
	struct opts o;
	char *p;

	bench_init();
	parse(argc, argv, &o);
	printf("# sizes: area %s (%s), child seq %s, child rand %lu pages%s\n",
	       size_str(o.size), o.thp ? "THP" : "4K",
	       size_str(o.seq), o.rand,
	       o.cow_pte ? ", cow-pte requested" : "");
	if (o.cow_pte)
		cow_pte = cow_pte_opt_in();
	p = setup_area(&o);
	idx = rand_pages(&o);
	phase_fork_exit(&o, p, &pr);
	if (parent_bad(&o, p))
		verify_failed("parent: %lu pages changed after the first child",
			      parent_bad(&o, p));
	phase_child_writes(&o, p, idx, &r);
	if (parent_bad(&o, p))
		verify_failed("parent: %lu pages changed by the child's writes",
			      parent_bad(&o, p));
	phase_parent_writes(&o, p, idx, &pr);
	phase_fork_loop(&pr);
	report(&r, &pr, cow_pte);
	verify_ok();
	return 0;
}
