// SPDX-License-Identifier: GPL-2.0
/*
 * bench_break: what the first write to a PTE table after fork costs the
 * other CPUs (with COW page tables: the break, a copy of the table, then
 * the COW of the page; without: the COW of the page), and what the exit of
 * a child that holds every table costs them.
 *
 * The parent maps N bytes in one GiB (MADV_NOHUGEPAGE), fills them, asks
 * for COW page tables with --cow-pte, and forks:
 *  1. writes: the child starts T threads (--threads, default 2), thread i
 *     pinned to CPU i.  Together they write the first page of every 2 MiB
 *     table, thread i the tables i, i + T, ...: one first write per table,
 *     T at a time in one GiB (one PMD table, one PMD lock).  Each thread
 *     spins in user space until the last is done, so that no CPU of the
 *     mm goes lazy (flushes skip lazy CPUs, or reach them only once).
 *     The child then checks every page.
 *  2. exit: a second child that writes nothing, holding every table the
 *     parent shares with it, starts T - 1 threads spinning on CPUs 1..,
 *     and calls exit_group() from CPU 0: its exit drops every table.
 * Counted from the start of the writes to their end, and from the exit's
 * "go" to waitpid(): TLB shootdown and function-call interrupts
 * (/proc/interrupts, the whole guest's) and the whole-mm flushes of the
 * tlb:tlb_flush tracepoint (bench.h).  Per table written for the writes.
 *
 * Metrics: tlb_ipis_per_table, call_ipis_per_table, full_flushes_per_table,
 * write_ms (the writes' time), exit_tlb_ipis, exit_call_ipis, exit_ms;
 * breaks (the cow_pte_break counter's growth, where the kernel has it).
 *
 * Verify: the child reads its own writes and the parent's data elsewhere,
 * the parent still reads its data everywhere.
 *
 * Sizes: 8M / 64M / 1G (4 / 32 / 512 tables).
 */
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include "bench.h"

#define SEED		0x4b
#define CHILD_SEED	0xb4
#define MAX_THREADS	8
#define USAGE		"usage: %s [--quick|--full] [--cow-pte] [--threads T]\n"

struct opts {
	size_t size;
	int cow_pte;
	int threads;
};

static struct {
	struct opts o;
	char *p;
	unsigned long tables;
	int ready, go, done;	/* atomics */
} g;

static void parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		SIZE_OPTIONS,
		{ "cow-pte", no_argument, NULL, 'c' },
		{ "threads", required_argument, NULL, 't' },
		{ NULL, 0, NULL, 0 },
	};
	enum bench_size sz = SIZE_DEFAULT;
	int c;

	memset(o, 0, sizeof(*o));
	o->threads = 2;
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		if (size_option(c, &sz))
			continue;
		if (c == 'c')
			o->cow_pte = 1;
		else if (c == 't')
			o->threads = atoi(optarg);
		else
			usage_exit(USAGE, argv[0]);
	}
	if (o->threads < 1 || o->threads > MAX_THREADS)
		usage_exit(USAGE, argv[0]);
	o->size = sz == SIZE_QUICK ? 8 * MiB : sz == SIZE_DEFAULT ? 64 * MiB : GiB;
}

static uint64_t *word(unsigned long page)
{
	return (uint64_t *)(g.p + page * PAGE_SZ);
}

/* The first page of each of this thread's tables, then spin until all are */
static void *writer(void *arg)
{
	long id = (long)arg;
	unsigned long t;

	on_cpu(id);
	__atomic_fetch_add(&g.ready, 1, __ATOMIC_ACQ_REL);
	while (!__atomic_load_n(&g.go, __ATOMIC_ACQUIRE))
		;
	for (t = id; t < g.tables; t += g.o.threads) {
		unsigned long page = t * (PMD_SZ / PAGE_SZ);

		*word(page) = pattern(CHILD_SEED, page);
	}
	__atomic_fetch_add(&g.done, 1, __ATOMIC_ACQ_REL);
	while (__atomic_load_n(&g.done, __ATOMIC_ACQUIRE) < g.o.threads)
		;
	return NULL;
}

static void *spinner(void *arg)
{
	on_cpu((long)arg);
	__atomic_fetch_add(&g.ready, 1, __ATOMIC_ACQ_REL);
	for (;;)
		;
	return NULL;
}

/* What a section cost the other CPUs, and its time */
struct counts {
	struct flush_counts f;
	uint64_t t0;
	double ms;
};

static void counts_start(struct counts *c)
{
	flush_counts_start(&c->f);
	c->t0 = now_ns();
}

static void counts_stop(struct counts *c)
{
	c->ms = (now_ns() - c->t0) / 1e6;
	flush_counts_stop(&c->f);
}

/* Child 1: the writes, counted; exit status 0 if it read what it should */
static int write_child(int report_fd)
{
	pthread_t tid[MAX_THREADS];
	unsigned long i, bad = 0;
	struct counts c;
	long t;

	for (t = 1; t < g.o.threads; t++)
		if (pthread_create(&tid[t], NULL, writer, (void *)t))
			die("pthread_create");
	while (__atomic_load_n(&g.ready, __ATOMIC_ACQUIRE) < g.o.threads - 1)
		;
	counts_start(&c);
	__atomic_store_n(&g.go, 1, __ATOMIC_RELEASE);
	writer((void *)0);
	counts_stop(&c);
	for (t = 1; t < g.o.threads; t++)
		pthread_join(tid[t], NULL);
	for (i = 0; i < g.o.size / PAGE_SZ; i++)
		bad += *word(i) != pattern(i % (PMD_SZ / PAGE_SZ) ? SEED : CHILD_SEED, i);
	if (write(report_fd, &c, sizeof(c)) != sizeof(c))
		die_errno("write report");
	return bad != 0;
}

/* Child 2: T - 1 threads spinning on other CPUs, then exit_group() */
static void exit_child(int go_fd)
{
	pthread_t tid;
	long i;
	char b;

	for (i = 1; i < g.o.threads; i++)
		if (pthread_create(&tid, NULL, spinner, (void *)i))
			die("pthread_create");
	while (__atomic_load_n(&g.ready, __ATOMIC_ACQUIRE) < g.o.threads - 1)
		;
	if (read(go_fd, &b, 1) != 1)
		die_errno("read go");
	_exit(0);
}

static pid_t fork_child(void)
{
	pid_t pid = fork();

	if (pid < 0)
		die_errno("fork");
	if (!pid) {
		bench_child = 1;
		prctl(PR_SET_PDEATHSIG, SIGKILL);
	}
	return pid;
}

int main(int argc, char **argv)
{
	long long breaks0 = vmstat_get("cow_pte_break");
	struct counts w, e;
	int pfd[2], gfd[2];
	unsigned long i, bad = 0;
	pid_t pid;

	bench_init();
	parse(argc, argv, &g.o);
	if (sysconf(_SC_NPROCESSORS_ONLN) < g.o.threads)
		skip("needs %d CPUs", g.o.threads);
	g.tables = g.o.size / PMD_SZ;
	comment("sizes: %zu MiB, %lu tables, %d threads%s", g.o.size / MiB,
		g.tables, g.o.threads, g.o.cow_pte ? ", cow-pte requested" : "");
	on_cpu(0);
	g.p = map_aligned(g.o.size, GiB, 0);
	do_madvise(g.p, g.o.size, MADV_NOHUGEPAGE, "MADV_NOHUGEPAGE");
	for (i = 0; i < g.o.size / PAGE_SZ; i++)
		*word(i) = pattern(SEED, i);
	if (g.o.cow_pte)
		metric("cow_pte_enabled", cow_pte_opt_in(), "count", "higher");

	if (pipe(pfd) || pipe(gfd))
		die_errno("pipe");
	pid = fork_child();
	if (!pid)
		_exit(write_child(pfd[1]));
	if (read(pfd[0], &w, sizeof(w)) != sizeof(w))
		die("no report from the writing child");
	reap_ok(pid, "the writing child (its data)");
	if (breaks0 >= 0)
		metric("breaks", vmstat_get("cow_pte_break") - breaks0, "count", "lower");

	pid = fork_child();
	if (!pid)
		exit_child(gfd[0]);
	/* its threads spin: give them their CPUs */
	usleep(100 * 1000);
	counts_start(&e);
	if (write(gfd[1], "g", 1) != 1)
		die_errno("write go");
	reap_ok(pid, "the exiting child");
	counts_stop(&e);

	for (i = 0; i < g.o.size / PAGE_SZ; i++)
		bad += *word(i) != pattern(SEED, i);
	if (bad)
		verify_failed("%lu pages of the parent lost their data", bad);

	flush_counts_report(&w.f, "", "_per_table", g.tables);
	metric("write_ms", w.ms, "ms", "lower");
	flush_counts_report(&e.f, "exit_", "", 1);
	metric("exit_ms", e.ms, "ms", "lower");
	verify_ok();
	return 0;
}
