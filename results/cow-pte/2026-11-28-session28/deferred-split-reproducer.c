#include <numaif.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

#define SZ_2M (2UL << 20)
static char *p;
static volatile int target, round_no, zround, moving;
static long inside;

static void wr(const char *path, const char *v)
{
	int fd = open(path, O_WRONLY);
	if (fd < 0 || write(fd, v, strlen(v)) < 0)
		perror(path);
	if (fd >= 0)
		close(fd);
}

static void *zapper(void *arg)
{
	int seen = 0;

	for (;;) {
		void *a = p;
		int st;

		while (round_no == seen)
			;
		seen = round_no;
		if (seen < 0)
			return NULL;
		for (;;) {
			if (move_pages(0, 1, &a, NULL, &st, 0) == 0 && st == target) {
				madvise(p + 4096, 4096, MADV_DONTNEED);
				if (moving)
					inside++;
				break;
			}
			if (!moving)
				break;
		}
		zround = seen;
	}
}

int main(int argc, char **argv)
{
	int secs = argc > 1 ? atoi(argv[1]) : 20;
	int kids = argc > 2 ? atoi(argv[2]) : 128;
	int pfd[2];
	time_t end = time(NULL) + secs;
	long rounds = 0, thp = 0;
	pthread_t t;
	char *m = mmap(NULL, 2 * SZ_2M, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (argc > 3)
		wr("/proc/sys/vm/migration_walk_early_exit", argv[3]);
	p = (char *)(((unsigned long)m + SZ_2M - 1) & ~(SZ_2M - 1));
	madvise(p, SZ_2M, MADV_HUGEPAGE);
	memset(p, 1, SZ_2M);
	pipe(pfd);
	for (int i = 0; i < kids; i++) {
		if (!fork()) {
			char b;
			close(pfd[1]);
			madvise(p, SZ_2M, MADV_DONTNEED);
			read(pfd[0], &b, 1);
			_exit(0);
		}
	}
	close(pfd[0]);
	sleep(1);
	pthread_create(&t, NULL, zapper, NULL);
	while (time(NULL) < end) {
		int st;
		void *a = p;

		madvise(p, SZ_2M, MADV_DONTNEED);
		memset(p, 2, SZ_2M);
		move_pages(0, 1, &a, NULL, &st, 0);
		target = !st;
		moving = 1;
		round_no++;
		int nodes = target, status;
		move_pages(0, 1, &a, &nodes, &status, MPOL_MF_MOVE);
		moving = 0;
		while (zround != round_no)
			;
		rounds++;
	}
	round_no = -1;
	pthread_join(t, NULL);
	close(pfd[1]);
	while (wait(NULL) > 0)
		;
	printf("ds2: %d kids, %ld rounds, %ld zaps inside move_pages\n", kids, rounds, inside);
	system("grep -E 'thp_migration|thp_fault_alloc|thp_deferred' /proc/vmstat");
	return 0;
}
