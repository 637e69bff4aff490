// SPDX-License-Identifier: GPL-2.0
/*
 * prof_fork: fork a touched anonymous area N times and print the fork()
 * times (the first eight, then least, median, most).  A debugging aid for
 * docs/cow-pte.md ("Profiling fork"), not a benchmark: ./ptlab bench fork
 * measures the same with A/B boots (fork_loop_min, fork_loop_median).
 *
 * usage: prof_fork MiB N [cow] [mode]
 *   cow   1 (default): prctl(PR_SET_COW_PTE, 1) before the forks
 *   mode  bits: 1 write vm/stat_refresh before each fork (as bench_fork);
 *         2 the child waits for a byte on a pipe (as bench_fork);
 *         4 perf record -g -p <self> around the forks, into /tmp/p.data;
 *         8 pin to CPU 0
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#define PR_SET_COW_PTE	0x43505445
#define PMD_SZ		(2UL << 20)

static double now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	size_t mib, sz;
	int n, cow, mode, i;
	char cmd[256], *p;
	double *t, t0;

	if (argc < 3) {
		fprintf(stderr, "usage: %s MiB N [cow] [mode]\n", argv[0]);
		return 2;
	}
	mib = atol(argv[1]);
	n = atoi(argv[2]);
	cow = argc > 3 ? atoi(argv[3]) : 1;
	mode = argc > 4 ? atoi(argv[4]) : 0;
	sz = mib << 20;
	p = mmap(NULL, sz + PMD_SZ, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	t = calloc(n, sizeof(*t));
	if (p == MAP_FAILED || !t || n < 1)
		return 1;
	p = (char *)(((unsigned long)p + PMD_SZ - 1) & ~(PMD_SZ - 1));
	madvise(p, sz, MADV_NOHUGEPAGE);
	memset(p, 1, sz);
	if (cow && prctl(PR_SET_COW_PTE, 1, 0, 0, 0))
		perror("prctl(PR_SET_COW_PTE)");
	if (mode & 8) {
		cpu_set_t s;

		CPU_ZERO(&s);
		CPU_SET(0, &s);
		sched_setaffinity(0, sizeof(s), &s);
	}
	if (mode & 4) {
		snprintf(cmd, sizeof(cmd),
			 "perf record -q -e cpu-clock -F 25000 -g -o /tmp/p.data -p %d &",
			 getpid());
		if (system(cmd))
			return 1;
		sleep(3);
	}
	for (i = 0; i < n; i++) {
		int fd[2];
		pid_t pid;
		char c;

		if (pipe(fd))
			return 1;
		if (mode & 1) {
			int f = open("/proc/sys/vm/stat_refresh", O_WRONLY);

			if (f < 0 || write(f, "1", 1) < 0)
				return 1;
			close(f);
		}
		t0 = now_ms();
		pid = fork();
		if (!pid) {
			if (mode & 2) {
				close(fd[1]);
				if (read(fd[0], &c, 1) < 0)
					_exit(1);
			}
			_exit(0);
		}
		t[i] = now_ms() - t0;
		close(fd[0]);
		if ((mode & 2) && write(fd[1], "x", 1) < 0)
			return 1;
		close(fd[1]);
		waitpid(pid, NULL, 0);
	}
	if (mode & 4) {
		if (system("killall -INT perf"))
			return 1;
		sleep(3);
	}
	printf("# fork %zu MiB cow=%d mode=%d n=%d:", mib, cow, mode, n);
	for (i = 0; i < n && i < 8; i++)
		printf(" %.3f", t[i]);
	qsort(t, n, sizeof(*t), cmp);
	printf(" | min %.3f med %.3f max %.3f ms\n", t[0], t[n / 2], t[n - 1]);
	return 0;
}
