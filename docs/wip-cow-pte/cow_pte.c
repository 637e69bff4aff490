// SPDX-License-Identifier: GPL-2.0
/*
 * COW page tables at fork (CONFIG_COW_PTE): the switches.  WIP: moves to
 * tests/guest/ with the series' stage 2, and grows the 17 scenarios of
 * ../shared/design/cow-pte.md there.
 *
 * vm.cow_pte takes 0, 1 (default) and 2, nothing else; PR_SET_COW_PTE takes
 * 0 or 1 with zero arguments after it, PR_GET_COW_PTE only zeros; fork
 * inherits the flag, exec drops it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kselftest_harness.h"
#include "guest_util.h"

#ifndef PR_SET_COW_PTE
#define PR_SET_COW_PTE	0x43505445
#define PR_GET_COW_PTE	0x43505446
#endif

#define COW_PTE_SYSCTL	"/proc/sys/vm/cow_pte"

static int get_flag(void)
{
	return prctl(PR_GET_COW_PTE, 0, 0, 0, 0);
}

TEST(sysctl_takes_0_1_2)
{
	static const char * const bad[] = { "3\n", "-1\n", "abc\n" };
	char before[32], val[32];

	if (!switch_present(COW_PTE_SYSCTL))
		SKIP(return, "no %s (vanilla kernel?)", COW_PTE_SYSCTL);
	ASSERT_EQ(0, read_knob(COW_PTE_SYSCTL, before, sizeof(before)));
	EXPECT_STREQ("1", before) TH_LOG("opt-in by default");
	for (int v = 0; v <= 2; v++) {
		char line[8], want[8];

		snprintf(line, sizeof(line), "%d\n", v);
		snprintf(want, sizeof(want), "%d", v);
		EXPECT_EQ(0, write_knob(COW_PTE_SYSCTL, line));
		ASSERT_EQ(0, read_knob(COW_PTE_SYSCTL, val, sizeof(val)));
		EXPECT_STREQ(want, val);
	}
	EXPECT_EQ(0, write_knob(COW_PTE_SYSCTL, before));
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		EXPECT_EQ(-EINVAL, write_knob(COW_PTE_SYSCTL, bad[i]))
			TH_LOG("writing %.*s", (int)strlen(bad[i]) - 1, bad[i]);
		ASSERT_EQ(0, read_knob(COW_PTE_SYSCTL, val, sizeof(val)));
		EXPECT_STREQ(before, val) TH_LOG("a rejected write changed it");
	}
}

TEST(prctl_rejects_bad_arguments)
{
	if (!switch_present(COW_PTE_SYSCTL))
		SKIP(return, "no %s (vanilla kernel?)", COW_PTE_SYSCTL);
	EXPECT_EQ(0, get_flag()) TH_LOG("off until asked for");
	EXPECT_EQ(-1, prctl(PR_SET_COW_PTE, 2, 0, 0, 0));
	EXPECT_EQ(EINVAL, errno);
	for (int arg = 3; arg <= 5; arg++) {
		unsigned long a[6] = { 0, 1, 0, 0, 0, 0 };

		a[arg - 1] = 1;
		EXPECT_EQ(-1, prctl(PR_SET_COW_PTE, a[1], a[2], a[3], a[4]))
			TH_LOG("SET with arg%d non-zero", arg);
		EXPECT_EQ(EINVAL, errno);
	}
	EXPECT_EQ(-1, prctl(PR_GET_COW_PTE, 1, 0, 0, 0));
	EXPECT_EQ(EINVAL, errno);
	EXPECT_EQ(0, get_flag()) TH_LOG("a rejected SET changed the flag");
	ASSERT_EQ(0, prctl(PR_SET_COW_PTE, 1, 0, 0, 0));
	EXPECT_EQ(1, get_flag());
	ASSERT_EQ(0, prctl(PR_SET_COW_PTE, 1, 0, 0, 0)) TH_LOG("idempotent");
	ASSERT_EQ(0, prctl(PR_SET_COW_PTE, 0, 0, 0, 0));
	EXPECT_EQ(0, get_flag());
}

/* The flag in a child after fork, and after the child execs itself */
TEST(fork_inherits_exec_drops)
{
	int status;
	pid_t pid;

	if (!switch_present(COW_PTE_SYSCTL))
		SKIP(return, "no %s (vanilla kernel?)", COW_PTE_SYSCTL);
	ASSERT_EQ(0, prctl(PR_SET_COW_PTE, 1, 0, 0, 0));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		if (get_flag() != 1)
			_exit(10);
		execl("/proc/self/exe", "cow_pte", "--print-flag", NULL);
		_exit(11);
	}
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	ASSERT_TRUE(WIFEXITED(status));
	EXPECT_NE(10, WEXITSTATUS(status)) TH_LOG("fork did not inherit the flag");
	EXPECT_NE(11, WEXITSTATUS(status)) TH_LOG("exec failed");
	EXPECT_EQ(0, WEXITSTATUS(status)) TH_LOG("exec kept the flag");
	ASSERT_EQ(0, prctl(PR_SET_COW_PTE, 0, 0, 0, 0));
}

int main(int argc, char **argv)
{
	/* the exec'd child of fork_inherits_exec_drops: exit with the flag */
	if (argc == 2 && !strcmp(argv[1], "--print-flag"))
		return get_flag() == 0 ? 0 : 12;
	return test_harness_run(argc, argv);
}
