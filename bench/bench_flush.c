// SPDX-License-Identifier: GPL-2.0
/*
 * bench_flush: the TLB flushes that moving pages costs the other CPUs, when
 * a child forked after they were written still maps them (its page tables
 * shared with --cow-pte where the kernel can, else copied by fork).
 *
 * The parent binds N bytes (MADV_NOHUGEPAGE) to node 0 and fills them on
 * CPU 0, and forks a child that spins in user space on CPU 1 until the
 * move is done (running, never blocked on a page under migration, so that
 * its CPU is not in lazy TLB mode, which flushes skip: each flush of the
 * child's mm must reach it), then checks its data.  The parent
 * moves every page to node 1 with move_pages(MPOL_MF_MOVE_ALL) (the pages
 * are the child's too).  The interrupt counts of /proc/interrupts are
 * read, summed over the CPUs, just before and after the call:
 * function-call IPIs ("CAL", which flush_tlb_all() sends to every CPU)
 * and TLB shootdowns ("TLB").
 *
 * Metrics: `call_ipis_per_page`, `tlb_ipis_per_page` (the counts' growth
 * over the pages moved), `move_ms` (the call's time).  The counts are the
 * whole guest's (other IPIs in that time are in them), not times: under
 * TCG they move little between runs.
 *
 * Verify: every page on node 0 before and on node 1 after the move (a
 * move_pages() query), the parent's data intact, and the child finds the
 * same data (exit status).
 *
 * Options: --cow-pte (PR_SET_COW_PTE before the fork; ignored where the
 * kernel has no COW page tables).  Sizes: 8M / 64M / 256M.
 */
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include "bench.h"

#define SEED	0x77
#define USAGE	"usage: %s [--quick|--full] [--cow-pte]\n"

struct opts {
	size_t size;
	int cow_pte;
};

static void parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		SIZE_OPTIONS,
		{ "cow-pte", no_argument, NULL, 'c' },
		{ NULL, 0, NULL, 0 },
	};
	enum bench_size sz = SIZE_DEFAULT;
	int c;

	memset(o, 0, sizeof(*o));
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		if (size_option(c, &sz))
			continue;
		if (c != 'c')
			usage_exit(USAGE, argv[0]);
		o->cow_pte = 1;
	}
	o->size = sz == SIZE_QUICK ? 8 * MiB : sz == SIZE_DEFAULT ? 64 * MiB : 256 * MiB;
}

static long long irq_count(const char *name)
{
	long long n = irq_sum(name);

	if (n < 0)
		die("no %s line in /proc/interrupts", name);
	return n;
}

static unsigned long bad_pages(char *p, unsigned long n)
{
	unsigned long bad = 0;

	for (unsigned long i = 0; i < n; i++)
		bad += *(uint64_t *)(p + i * PAGE_SZ) != pattern(SEED, i);
	return bad;
}

int main(int argc, char **argv)
{
	unsigned long n, mask = 1, bad;
	long off;
	long long cal0, cal1, tlb0, tlb1;
	int status, *nodes, *st;
	volatile int *stop;
	void **pages;
	uint64_t t0, t1;
	struct opts o;
	char *p;
	pid_t pid;

	bench_init();
	parse(argc, argv, &o);
	n = o.size / PAGE_SZ;
	comment("sizes: %zu MiB%s", o.size / MiB, o.cow_pte ? ", cow-pte requested" : "");
	need_two_nodes();
	if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
		skip("needs two CPUs");
	on_cpu(0);

	p = map_aligned(o.size, PMD_SZ, 0);
	do_madvise(p, o.size, MADV_NOHUGEPAGE, "MADV_NOHUGEPAGE");
	if (mbind(p, o.size, MPOL_BIND, &mask, sizeof(mask) * 8, 0))
		die_errno("mbind node 0");
	for (unsigned long i = 0; i < n; i++)
		*(uint64_t *)(p + i * PAGE_SZ) = pattern(SEED, i);
	if (pages_off_node(p, n, 0))
		verify_failed("pages not on node 0 before the move");
	if (o.cow_pte)
		metric("cow_pte_enabled", cow_pte_opt_in(), "count", "higher");

	stop = mmap(NULL, PAGE_SZ, PROT_READ | PROT_WRITE,
		    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (stop == MAP_FAILED)
		die_errno("mmap");
	*stop = 0;
	pid = fork();
	if (pid < 0)
		die_errno("fork");
	if (!pid) {
		uint64_t sum = 0;

		bench_child = 1;
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		on_cpu(1);
		*stop = 1;		/* running */
		while (*stop == 1)	/* in user space, never blocked */
			sum++;
		_exit(bad_pages(p, n) || !sum ? 1 : 0);
	}

	pages = calloc(n, sizeof(*pages));
	nodes = calloc(n, sizeof(*nodes));
	st = calloc(n, sizeof(*st));
	if (!pages || !nodes || !st)
		die_errno("calloc");
	for (unsigned long i = 0; i < n; i++) {
		pages[i] = p + i * PAGE_SZ;
		nodes[i] = 1;
	}
	while (*stop != 1)		/* the child reads on CPU 1 */
		usleep(1000);
	cal0 = irq_count("CAL:");
	tlb0 = irq_count("TLB:");
	t0 = now_ns();
	if (move_pages(0, n, pages, nodes, st, MPOL_MF_MOVE_ALL) < 0)
		die("move_pages: %s", strerror(errno));
	t1 = now_ns();
	cal1 = irq_count("CAL:");
	tlb1 = irq_count("TLB:");

	*stop = 2;
	if (waitpid(pid, &status, 0) != pid)
		die_errno("waitpid");
	bad = bad_pages(p, n);
	comment("CAL %lld -> %lld, TLB %lld -> %lld over %lu pages", cal0, cal1,
		tlb0, tlb1, n);
	off = pages_off_node(p, n, 1);
	if (off)
		verify_failed("%ld of %lu pages not on node 1 after the move", off, n);
	if (bad)
		verify_failed("%lu pages of the parent changed", bad);
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		verify_failed("the child found its data changed (status %#x)", status);
	metric("call_ipis_per_page", (double)(cal1 - cal0) / n, "count", "lower");
	metric("tlb_ipis_per_page", (double)(tlb1 - tlb0) / n, "count", "lower");
	metric("move_ms", (t1 - t0) / 1e6, "ms", "lower");
	verify_ok();
	return 0;
}
