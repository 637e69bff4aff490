// SPDX-License-Identifier: GPL-2.0
/*
 * bench_purge: what PTE- and PMD-table reclaim costs a multi-threaded
 * allocator that purges with MADV_DONTNEED.
 *
 * --tlb: one thread per vCPU spins over memory of its own (their CPUs run
 * the mm), as many threads again sleep (lazy-TLB CPUs at times); one more
 * thread touches 64 MiB of 4 KiB pages (32 PTE tables) and purges them with
 * one MADV_DONTNEED, over and over.  Metrics: the purge's latency and the
 * TLB shootdown interrupts per purge (/proc/interrupts, "TLB" line), which
 * grow with every flush the purge broadcasts.
 *
 * --faults: N threads (one per vCPU but one) fault the pages of their part
 * of the first GiB of one large reservation VMA, in a scattered order, and
 * drop the part after each whole pass; one
 * thread touches 2 MiB in an otherwise empty GiB of the same VMA and purges
 * it, over and over.  Each purge empties that GiB: with PMD-table reclaim,
 * its PMD table goes each time, and whatever that takes from the faulting
 * threads shows in their fault throughput.  Metrics: faults per second of
 * the N threads, purges per second.
 *
 * Verify: every page a thread wrote holds its pattern until dropped.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench.h"

#define USAGE	"usage: %s [--quick|--full] --tlb|--faults\n"
#define TLB_PURGE	(64 * MiB)
#define FAULT_PART	(256 * MiB)	/* each faulting thread's part of GiB 0 */
#define FAULT_STRIDE	40503		/* odd: visits every page of a part once */
#define MAX_THREADS	64

enum mode { MODE_NONE, MODE_TLB, MODE_FAULTS };

struct opts {
	enum mode mode;
	unsigned long rounds;	/* --tlb: purges */
	unsigned int secs;	/* --faults: seconds measured */
	int cpus;
};

static struct shared {
	char *area;		/* --faults: the reservation; --tlb: unused */
	int stop;		/* __atomic */
	unsigned long bad;	/* __atomic: pages that lost their pattern */
} sh;

static void parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		SIZE_OPTIONS,
		{ "tlb", no_argument, NULL, 't' },
		{ "faults", no_argument, NULL, 'F' },
		{ NULL, 0, NULL, 0 },
	};
	enum bench_size sz = SIZE_DEFAULT;
	int c;

	memset(o, 0, sizeof(*o));
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		if (size_option(c, &sz))
			continue;
		if (c == 't')
			o->mode = MODE_TLB;
		else if (c == 'F')
			o->mode = MODE_FAULTS;
		else
			usage_exit(USAGE, argv[0]);
	}
	if (o->mode == MODE_NONE)
		usage_exit(USAGE, argv[0]);
	o->rounds = sz == SIZE_QUICK ? 8 : sz == SIZE_FULL ? 200 : 20;
	o->secs = sz == SIZE_QUICK ? 3 : sz == SIZE_FULL ? 60 : 15;
	o->cpus = sysconf(_SC_NPROCESSORS_ONLN);
	if (o->cpus < 2 || o->cpus > MAX_THREADS / 2)
		skip("needs 2 to %d CPUs, has %d", MAX_THREADS / 2, o->cpus);
}

static int stopped(void)
{
	return __atomic_load_n(&sh.stop, __ATOMIC_RELAXED);
}

/* Write a page's pattern in its first word; check it; 1 if it was wrong */
static int touch_check(char *page, uint64_t seed, uint64_t idx)
{
	volatile uint64_t *w = (uint64_t *)page;

	*w = pattern(seed, idx);
	return *w != pattern(seed, idx);
}

/* ---- --tlb ----------------------------------------------------------- */

/* A thread that keeps its CPU in the mm: writes its own 64 KiB */
static void *spinner(void *arg)
{
	char *own = map_anon(64 * KiB, 0);
	uint64_t n = 0;

	(void)arg;
	while (!stopped())
		for (size_t off = 0; off < 64 * KiB; off += PAGE_SZ)
			*(volatile uint64_t *)(own + off) = n++;
	munmap(own, 64 * KiB);
	return NULL;
}

/* A thread of the mm that mostly sleeps */
static void *sleeper(void *arg)
{
	(void)arg;
	while (!stopped())
		usleep(1000);
	return NULL;
}

static void run_tlb(const struct opts *o)
{
	int nr = 2 * o->cpus;
	pthread_t t[MAX_THREADS];
	char *p = map_aligned(TLB_PURGE, PMD_SZ, 0);
	uint64_t ns = 0;
	long long irq0, irq;
	unsigned long bad = 0;

	comment("sizes: %lu purges of %s, %d spinning + %d sleeping threads",
		o->rounds, size_str(TLB_PURGE), o->cpus, o->cpus);
	do_madvise(p, TLB_PURGE, MADV_NOHUGEPAGE, "MADV_NOHUGEPAGE");
	for (int i = 0; i < nr; i++)
		if (pthread_create(&t[i], NULL, i < o->cpus ? spinner : sleeper, NULL))
			die_errno("pthread_create");
	irq0 = irq_sum("TLB:");
	for (unsigned long r = 0; r < o->rounds; r++) {
		uint64_t t0;

		for (size_t off = 0; off < TLB_PURGE; off += PAGE_SZ)
			bad += touch_check(p + off, r + 1, off / PAGE_SZ);
		t0 = now_ns();
		do_madvise(p, TLB_PURGE, MADV_DONTNEED, "MADV_DONTNEED");
		ns += now_ns() - t0;
	}
	irq = irq_sum("TLB:");
	__atomic_store_n(&sh.stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < nr; i++)
		pthread_join(t[i], NULL);
	if (bad)
		verify_failed("%lu pages held the wrong data", bad);
	metric("purge_latency", ns / 1e3 / o->rounds, "us", "lower");
	if (irq0 >= 0 && irq >= 0)
		metric("tlb_irqs_per_purge", (double)(irq - irq0) / o->rounds, "irqs", "lower");
	else
		comment("no TLB line in /proc/interrupts");
	munmap(p, TLB_PURGE);
}

/* ---- --faults -------------------------------------------------------- */

struct faulter {
	pthread_t t;
	int idx;
	unsigned long faults;
};

/*
 * Write every page of this thread's part once, in a scattered order (a
 * stride coprime with the page count), each write a fault; after a whole
 * pass, check a few pages and drop the part, rarely enough that faults, not
 * this thread's own purges, are what it spends its time on.
 */
static void *faulter(void *arg)
{
	struct faulter *f = arg;
	const uint64_t n = FAULT_PART / PAGE_SZ;
	char *part = sh.area + PAGE_SZ + f->idx * FAULT_PART;
	uint64_t gen = 1, k = 0;

	while (!stopped()) {
		uint64_t idx = k * FAULT_STRIDE % n;

		*(volatile uint64_t *)(part + idx * PAGE_SZ) = pattern(gen, idx);
		f->faults++;
		if (++k % n)
			continue;
		for (idx = 0; idx < n; idx += 4099)
			if (*(volatile uint64_t *)(part + idx * PAGE_SZ) != pattern(gen, idx))
				__atomic_add_fetch(&sh.bad, 1, __ATOMIC_RELAXED);
		madvise(part, FAULT_PART, MADV_DONTNEED);
		gen++;
	}
	return NULL;
}

static void run_faults(const struct opts *o)
{
	int nr = o->cpus - 1;
	struct faulter f[MAX_THREADS];
	unsigned long purges = 0, faults = 0, bad = 0;
	/* GiB 0: the faulting threads; GiB 1: nothing; GiB 2: the purger */
	size_t len = 3 * GiB;
	char *purge;
	uint64_t t0, secs;

	comment("sizes: %u s, %d faulting threads of %s each, purges of %s in an empty GiB",
		o->secs, nr, size_str(FAULT_PART), size_str(PMD_SZ));
	sh.area = map_aligned(len, GiB, MAP_NORESERVE);
	do_madvise(sh.area, len, MADV_NOHUGEPAGE, "MADV_NOHUGEPAGE");
	/* one page that stays: GiB 0 keeps its PMD table */
	*(volatile uint64_t *)sh.area = 1;
	purge = sh.area + 2 * GiB;
	for (int i = 0; i < nr; i++) {
		f[i].idx = i;
		f[i].faults = 0;
		if (pthread_create(&f[i].t, NULL, faulter, &f[i]))
			die_errno("pthread_create");
	}
	t0 = now_ns();
	while ((now_ns() - t0) / 1000000000ULL < o->secs) {
		for (size_t off = 0; off < PMD_SZ; off += PAGE_SZ)
			bad += touch_check(purge + off, purges + 1, off / PAGE_SZ);
		do_madvise(purge, PMD_SZ, MADV_DONTNEED, "MADV_DONTNEED");
		purges++;
	}
	secs = now_ns() - t0;
	__atomic_store_n(&sh.stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < nr; i++) {
		pthread_join(f[i].t, NULL);
		faults += f[i].faults;
	}
	bad += __atomic_load_n(&sh.bad, __ATOMIC_RELAXED);
	if (*(volatile uint64_t *)sh.area != 1)
		bad++;
	if (bad)
		verify_failed("%lu pages held the wrong data", bad);
	metric("faults_per_sec", faults / (secs / 1e9), "faults/s", "higher");
	metric("purges_per_sec", purges / (secs / 1e9), "purges/s", "higher");
	munmap(sh.area, len);
}

int main(int argc, char **argv)
{
	struct opts o;

	bench_init();
	parse(argc, argv, &o);
	if (o.mode == MODE_TLB)
		run_tlb(&o);
	else
		run_faults(&o);
	verify_ok();
	return 0;
}
