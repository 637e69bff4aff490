// SPDX-License-Identifier: GPL-2.0
/*
 * bench_walk: what a syscall that walks a range costs when nothing in the
 * range is mapped: mprotect() and MADV_FREE over a huge PROT_NONE,
 * MAP_NORESERVE area (64 TiB), the shape of a sandbox's or a garbage
 * collector's reservation.  Vanilla's page walkers skip what an empty PGD
 * entry covers (512 GiB at a time); a walk that looks at every 2 MiB does
 * 32 M steps here.
 *
 * The area is mapped once; then R times mprotect(PROT_READ),
 * mprotect(PROT_NONE) and madvise(MADV_FREE) of all of it, each timed:
 * `mprotect_us` is the median of the 2R mprotect() calls, `madv_free_us`
 * of the R madvise() calls (both with min and max in comments).
 *
 * Verification: every call returns 0, and the walks allocate no page
 * table (VmPTE does not grow by more than 8 kB).
 *
 * Options:
 *   --no-cow-pte  writes 0 to vm.cow_pte (put back at exit) where the
 *                 kernel has it: the series with its feature off
 *   --shared      asks for COW page tables (PR_SET_COW_PTE) and forks a
 *                 child that shares the tables of 16 MiB and waits: the
 *                 walks in an mm that holds shared tables (on vanilla,
 *                 the same fork, copied)
 *
 * Sizes: 1 TiB / 64 TiB / 64 TiB (--quick / default / --full), R = 5 / 11 /
 * 21.
 */
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/wait.h>

#include "bench.h"

#define SHARED_SIZE	(16 * MiB)
#define VMPTE_SLACK_KB	8

struct opts {
	size_t size;
	int reps;
	bool no_cow_pte;
	bool shared;
};

static void parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		SIZE_OPTIONS,
		{ "no-cow-pte", no_argument, NULL, 'n' },
		{ "shared", no_argument, NULL, 's' },
		{ NULL, 0, NULL, 0 },
	};
	enum bench_size sz = SIZE_DEFAULT;
	int c;

	memset(o, 0, sizeof(*o));
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		if (size_option(c, &sz))
			continue;
		if (c == 'n')
			o->no_cow_pte = true;
		else if (c == 's')
			o->shared = true;
		else
			usage_exit("usage: %s [--quick|--full] [--no-cow-pte] [--shared]\n",
				   argv[0]);
	}
	o->size = sz == SIZE_QUICK ? 1024 * GiB : 64 * 1024 * GiB;
	o->reps = sz == SIZE_QUICK ? 5 : sz == SIZE_DEFAULT ? 11 : 21;
}

/* A child holding the tables of SHARED_SIZE, waiting to be killed: its pid */
static pid_t fork_sharer(void)
{
	char *p = map_aligned(SHARED_SIZE, PMD_SZ, 0);
	pid_t pid;

	do_madvise(p, SHARED_SIZE, MADV_NOHUGEPAGE, "MADV_NOHUGEPAGE");
	memset(p, 0x5a, SHARED_SIZE);
	cow_pte_opt_in();
	pid = fork();
	if (pid < 0)
		die_errno("fork");
	if (!pid) {
		bench_child = 1;
		for (;;)
			pause();
	}
	return pid;
}

static double timed(int (*fn)(void *, size_t, int), void *p, size_t len, int arg,
		    const char *what)
{
	uint64_t t0 = now_ns();

	if (fn(p, len, arg))
		die("%s: %s", what, strerror(errno));
	return (now_ns() - t0) / 1e3;
}

static void report(const char *name, double *v, int n)
{
	double median = quantile(v, n, 0.5);	/* sorts @v */

	comment("%s: min %.1f us, max %.1f us over %d calls", name, v[0], v[n - 1], n);
	metric(name, median, "us", "lower");
}

int main(int argc, char **argv)
{
	double *mprot, *mfree;
	long pte_before, pte_after;
	pid_t child = 0;
	struct opts o;
	char *area;

	bench_init();
	parse(argc, argv, &o);
	comment("sizes: %zu GiB PROT_NONE area, %d rounds%s%s", o.size / GiB, o.reps,
		o.no_cow_pte ? ", vm.cow_pte=0" : "", o.shared ? ", shared tables" : "");
	if (o.no_cow_pte) {
		if (file_exists(COW_PTE_SYSCTL)) {
			if (knob_set(COW_PTE_SYSCTL, "0"))
				die("cannot write 0 to " COW_PTE_SYSCTL);
		} else {
			comment("no " COW_PTE_SYSCTL " on this kernel");
		}
	}
	if (o.shared)
		child = fork_sharer();

	area = mmap(NULL, o.size, PROT_NONE,
		    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (area == MAP_FAILED)
		die_errno("mmap of the PROT_NONE area");
	mprot = calloc(2 * o.reps, sizeof(*mprot));
	mfree = calloc(o.reps, sizeof(*mfree));
	if (!mprot || !mfree)
		die_errno("calloc");

	pte_before = status_kb(0, "VmPTE");
	for (int i = 0; i < o.reps; i++) {
		mprot[2 * i] = timed(mprotect, area, o.size, PROT_READ, "mprotect");
		mprot[2 * i + 1] = timed(mprotect, area, o.size, PROT_NONE, "mprotect");
		mfree[i] = timed(madvise, area, o.size, MADV_FREE, "MADV_FREE");
	}
	pte_after = status_kb(0, "VmPTE");

	if (child) {
		kill(child, SIGKILL);
		waitpid(child, NULL, 0);
	}
	comment("VmPTE %ld kB before the walks, %ld kB after", pte_before, pte_after);
	if (pte_before < 0 || pte_after - pte_before > VMPTE_SLACK_KB)
		verify_failed("the walks allocated page tables: VmPTE %ld -> %ld kB",
			      pte_before, pte_after);
	report("mprotect_us", mprot, 2 * o.reps);
	report("madv_free_us", mfree, o.reps);
	verify_ok();
	return 0;
}
