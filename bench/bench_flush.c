// SPDX-License-Identifier: GPL-2.0
/*
 * bench_flush: the TLB flushes that moving pages costs the other CPUs, when
 * a child forked after they were written still maps them (its page tables
 * shared with --cow-pte where the kernel can, else copied by fork).
 *
 * The parent binds N bytes (MADV_NOHUGEPAGE) to node 0 and fills them,
 * forks a child that waits on another CPU, and moves every page to node 1
 * with move_pages(MPOL_MF_MOVE_ALL) (the pages are the child's too).  The
 * interrupt counts of /proc/interrupts are read, summed over the CPUs,
 * just before and after the call: function-call IPIs ("CAL", which
 * flush_tlb_all() sends to every CPU) and TLB shootdowns ("TLB").
 *
 * Metrics: `call_ipis_per_page`, `tlb_ipis_per_page` (the counts' growth
 * over the pages moved), `move_ms` (the call's time).  Counts are exact
 * under TCG, times are not.
 *
 * Verify: every page on node 0 before and on node 1 after the move (a
 * move_pages() query), the parent's data intact, and the child finds the
 * same data (exit status).
 *
 * Options: --cow-pte (PR_SET_COW_PTE before the fork; ignored where the
 * kernel has no COW page tables).  Sizes: 8M / 64M / 256M.
 */
#include <getopt.h>
#include <numa.h>
#include <numaif.h>
#include <sched.h>
#include <signal.h>
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

/* The sum over the CPUs of the /proc/interrupts line named @name ("CAL:") */
static long long irq_count(const char *name)
{
	FILE *f = fopen("/proc/interrupts", "re");
	size_t len = strlen(name);
	long long sum = -1;
	char line[4096];

	if (!f)
		die_errno("/proc/interrupts");
	while (fgets(line, sizeof(line), f)) {
		char *p = line, *end;

		while (*p == ' ')
			p++;
		if (strncmp(p, name, len))
			continue;
		sum = 0;
		for (p += len;; p = end) {
			long long v = strtoll(p, &end, 10);

			if (end == p)
				break;
			sum += v;
		}
		break;
	}
	fclose(f);
	if (sum < 0)
		die("no %s line in /proc/interrupts", name);
	return sum;
}

/* Pages of @p (@n) not on @node; every page is asked about */
static unsigned long off_node(char *p, unsigned long n, int node)
{
	void **pages = calloc(n, sizeof(*pages));
	int *status = calloc(n, sizeof(*status));
	unsigned long off = 0;

	if (!pages || !status)
		die_errno("calloc");
	for (unsigned long i = 0; i < n; i++)
		pages[i] = p + i * PAGE_SZ;
	if (move_pages(0, n, pages, NULL, status, 0))
		die("move_pages query: %s", strerror(errno));
	for (unsigned long i = 0; i < n; i++)
		off += status[i] != node;
	free(pages);
	free(status);
	return off;
}

static unsigned long bad_pages(char *p, unsigned long n)
{
	unsigned long bad = 0;

	for (unsigned long i = 0; i < n; i++)
		bad += *(uint64_t *)(p + i * PAGE_SZ) != pattern(SEED, i);
	return bad;
}

static void on_cpu(int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set))
		die_errno("sched_setaffinity");
}

int main(int argc, char **argv)
{
	unsigned long n, mask = 1, bad;
	long long cal0, cal1, tlb0, tlb1;
	int go[2], status, *nodes, *st;
	void **pages;
	uint64_t t0, t1;
	struct opts o;
	char *p;
	pid_t pid;

	bench_init();
	parse(argc, argv, &o);
	n = o.size / PAGE_SZ;
	comment("sizes: %zu MiB%s", o.size / MiB, o.cow_pte ? ", cow-pte requested" : "");
	if (numa_available() < 0 || numa_max_node() < 1 || numa_node_size64(1, NULL) <= 0)
		skip("needs two NUMA nodes with memory");
	if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
		skip("needs two CPUs");
	on_cpu(0);

	p = map_aligned(o.size, PMD_SZ, 0);
	do_madvise(p, o.size, MADV_NOHUGEPAGE, "MADV_NOHUGEPAGE");
	if (mbind(p, o.size, MPOL_BIND, &mask, sizeof(mask) * 8, 0))
		die_errno("mbind node 0");
	for (unsigned long i = 0; i < n; i++)
		*(uint64_t *)(p + i * PAGE_SZ) = pattern(SEED, i);
	if (off_node(p, n, 0))
		verify_failed("pages not on node 0 before the move");
	if (o.cow_pte)
		metric("cow_pte_enabled", cow_pte_opt_in(), "count", "higher");

	if (pipe(go))
		die_errno("pipe");
	pid = fork();
	if (pid < 0)
		die_errno("fork");
	if (!pid) {
		char c;

		bench_child = 1;
		on_cpu(1);
		if (read(go[0], &c, 1) != 1)
			_exit(2);
		_exit(bad_pages(p, n) ? 1 : 0);
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
	usleep(100 * 1000);		/* the child is asleep on CPU 1 */
	cal0 = irq_count("CAL:");
	tlb0 = irq_count("TLB:");
	t0 = now_ns();
	if (move_pages(0, n, pages, nodes, st, MPOL_MF_MOVE_ALL) < 0)
		die("move_pages: %s", strerror(errno));
	t1 = now_ns();
	cal1 = irq_count("CAL:");
	tlb1 = irq_count("TLB:");

	if (write(go[1], "x", 1) != 1)
		die_errno("write");
	if (waitpid(pid, &status, 0) != pid)
		die_errno("waitpid");
	bad = bad_pages(p, n);
	comment("CAL %lld -> %lld, TLB %lld -> %lld over %lu pages", cal0, cal1,
		tlb0, tlb1, n);
	if (off_node(p, n, 1))
		verify_failed("%lu of %lu pages not on node 1 after the move",
			      off_node(p, n, 1), n);
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
