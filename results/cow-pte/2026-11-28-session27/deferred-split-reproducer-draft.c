// Draft reproducer: migrate_folio_move() requeues a THP's destination on the
// deferred split queue after remove_migration_ptes(); a zap of one page in
// between (the first VMA restored, the second not yet) marks it partially
// mapped first, and the requeue with "not partially mapped" warns.
#define _GNU_SOURCE
#include <numaif.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <stdlib.h>

#define SZ_2M (2UL << 20)
#define NP 512
static char *p;
static int target;
static volatile int go, done;

static void *zapper(void *arg)
{
	void *a = p;
	int st;
	long spins = 0;

	while (!go)
		;
	while (spins++ < 2000000) {
		if (move_pages(0, 1, &a, NULL, &st, 0) == 0 && st == target) {
			madvise(p, 4096, MADV_DONTNEED);
			return (void *)1;
		}
		if (done)
			break;
	}
	return NULL;
}

int main(int argc, char **argv)
{
	int secs = argc > 1 ? atoi(argv[1]) : 20;
	time_t end = time(NULL) + secs;
	static void *addrs[NP];
	static int nodes[NP], status[NP];
	long rounds = 0, zapped = 0;

	while (time(NULL) < end) {
		char *m = mmap(NULL, 2 * SZ_2M, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		pthread_t t;
		void *ret;

		p = (char *)(((unsigned long)m + SZ_2M - 1) & ~(SZ_2M - 1));
		madvise(p, SZ_2M, MADV_HUGEPAGE);
		memset(p, 1, SZ_2M);
		for (int i = 0; i < NP / 2; i++)
			mprotect(p + (2 * i + 1) * 4096UL, 4096, PROT_READ);
		int st;
		void *a = p;
		move_pages(0, 1, &a, NULL, &st, 0);
		target = !st;
		for (int i = 0; i < NP; i++) {
			addrs[i] = p + i * 4096UL;
			nodes[i] = target;
		}
		go = 0; done = 0;
		pthread_create(&t, NULL, zapper, NULL);
		go = 1;
		move_pages(0, NP, addrs, nodes, status, MPOL_MF_MOVE);
		done = 1;
		pthread_join(t, &ret);
		zapped += ret != NULL;
		munmap(m, 2 * SZ_2M);
		rounds++;
	}
	printf("ds_race: %ld rounds, %ld zaps after the first restore\n", rounds, zapped);
	system("grep -E 'thp_migration|thp_split_page|thp_fault_alloc|thp_deferred' /proc/vmstat");
	return 0;
}
