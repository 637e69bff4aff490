// SPDX-License-Identifier: GPL-2.0
/*
 * pt_fork: what fork() must keep true for anonymous memory, whatever the
 * series does to page tables: the child sees the parent's data, writes on
 * either side stay private, and page-table memory (VmPTE) is accounted to
 * each mm and given back on munmap. The baseline for the COW page table
 * and PTE reclaim features, which change exactly these paths.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kselftest_harness.h"
#include "guest_util.h"

#define AREA		(64 * SZ_1M)	/* 32 PTE tables */
#define PTE_TABLE_KB	4

static char *map_area(void)
{
	char *p = mmap(NULL, AREA, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	madvise(p, AREA, MADV_NOHUGEPAGE);
	return p;
}

static void fill(char *p, unsigned char seed)
{
	for (unsigned long i = 0; i < AREA; i += 4096)
		p[i] = (unsigned char)(seed + i / 4096);
}

static unsigned long count_bad(const char *p, unsigned char seed)
{
	unsigned long bad = 0;

	for (unsigned long i = 0; i < AREA; i += 4096)
		bad += p[i] != (char)(unsigned char)(seed + i / 4096);
	return bad;
}

TEST(child_sees_parent_data)
{
	char *p = map_area();
	pid_t pid;
	int status;

	ASSERT_NE(NULL, p);
	fill(p, 1);
	pid = fork();
	ASSERT_GE(pid, 0);
	if (!pid)
		_exit(count_bad(p, 1) ? 1 : 0);
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	ASSERT_TRUE(WIFEXITED(status));
	EXPECT_EQ(0, WEXITSTATUS(status));
	munmap(p, AREA);
}

TEST(writes_stay_private)
{
	char *p = map_area();
	int ready[2], done[2];
	pid_t pid;
	int status;
	char c;

	ASSERT_NE(NULL, p);
	ASSERT_EQ(0, pipe(ready));
	ASSERT_EQ(0, pipe(done));
	fill(p, 1);
	pid = fork();
	ASSERT_GE(pid, 0);
	if (!pid) {
		fill(p, 2);		/* child writes first ... */
		write(ready[1], "x", 1);
		read(done[0], &c, 1);	/* ... then checks the parent's writes */
		_exit(count_bad(p, 2) ? 1 : 0);
	}
	ASSERT_EQ(1, read(ready[0], &c, 1));
	EXPECT_EQ(0, count_bad(p, 1));	/* parent unaffected by the child */
	fill(p, 3);
	ASSERT_EQ(1, write(done[1], "x", 1));
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	ASSERT_TRUE(WIFEXITED(status));
	EXPECT_EQ(0, WEXITSTATUS(status));	/* child unaffected by the parent */
	EXPECT_EQ(0, count_bad(p, 3));
	munmap(p, AREA);
}

TEST(vmpte_accounted_and_freed)
{
	long before, touched, after;
	char *p;

	before = vmpte_kb();
	ASSERT_GE(before, 0) TH_LOG("no VmPTE in /proc/self/status");
	p = map_area();
	ASSERT_NE(NULL, p);
	fill(p, 1);
	touched = vmpte_kb();
	/* 64 MiB of 4 KiB pages needs 32 PTE tables of 4 KiB */
	EXPECT_GE(touched - before, (long)(AREA / (512 * 4096)) * PTE_TABLE_KB);
	ASSERT_EQ(0, munmap(p, AREA));
	after = vmpte_kb();
	EXPECT_LE(after, before + PTE_TABLE_KB) TH_LOG("VmPTE %ld kB before, %ld after munmap",
						    before, after);
}

TEST(child_vmpte_matches_parent)
{
	int fds[2];
	long parent, child = -1;
	pid_t pid;
	char *p = map_area();

	ASSERT_NE(NULL, p);
	ASSERT_EQ(0, pipe(fds));
	fill(p, 1);
	parent = vmpte_kb();
	pid = fork();
	ASSERT_GE(pid, 0);
	if (!pid) {
		long v;

		fill(p, 2);	/* the child's tables are its own once it writes */
		v = vmpte_kb();
		write(fds[1], &v, sizeof(v));
		_exit(0);
	}
	ASSERT_EQ(sizeof(child), read(fds[0], &child, sizeof(child)));
	waitpid(pid, NULL, 0);
	EXPECT_GE(child, (long)(AREA / (512 * 4096)) * PTE_TABLE_KB);
	EXPECT_LE(child, parent + 64) TH_LOG("parent %ld kB, child %ld kB", parent, child);
	munmap(p, AREA);
}

TEST_HARNESS_MAIN
