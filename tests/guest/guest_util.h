/* SPDX-License-Identifier: GPL-2.0 */
/*
 * guest_util.h: helpers shared by the guest test programs in tests/guest/
 * (bench/bench.h keeps its own copies: the benchmarks stand alone).
 *
 * Knobs: each program keeps its own list, an array of struct knob with
 * .path set, saves it before the first test and restores it after each
 * test and at exit, through its own constructor and destructor:
 *
 *	static struct knob knobs[] = { { .path = "/proc/sys/..." }, };
 *
 *	static void __attribute__((constructor)) save_knobs(void)
 *	{
 *		save_knob_list(knobs, ARRAY_SIZE(knobs));
 *	}
 *
 *	static void __attribute__((destructor)) restore_knobs(void)
 *	{
 *		restore_knob_list(knobs, ARRAY_SIZE(knobs));
 *	}
 *
 * The helpers are static inline so that a program that uses only some of
 * them still builds with -Wall -Werror.
 */
#ifndef GUEST_UTIL_H
#define GUEST_UTIL_H

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/userfaultfd.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define PAGE_SIZE	4096UL
#define SZ_1M		(1UL << 20)
#define SZ_2M		(2UL << 20)
#define SZ_1G		(1UL << 30)

/* --- knobs: sysctls and sysfs files a program changes and puts back ---- */

struct knob {
	const char *path;
	char saved[32];		/* empty: absent */
};

/* The value of a sysctl, or the [selected] word of a THP sysfs file */
static inline int read_knob(const char *path, char *buf, size_t size)
{
	char raw[128], *start, *end;
	int fd = open(path, O_RDONLY);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = read(fd, raw, sizeof(raw) - 1);
	close(fd);
	if (n < 0)
		return -errno;
	raw[n] = '\0';
	start = strchr(raw, '[');
	if (start) {
		start++;
		end = strchr(start, ']');
	} else {
		start = raw;
		end = strchr(start, '\n');
	}
	if (end)
		*end = '\0';
	if (strlen(start) >= size)
		return -ENAMETOOLONG;
	strcpy(buf, start);
	return 0;
}

/* Write @val to the knob at @path: 0 or -errno */
static inline int write_knob(const char *path, const char *val)
{
	int fd = open(path, O_WRONLY);
	int ret = 0;

	if (fd < 0)
		return -errno;
	if (write(fd, val, strlen(val)) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

/* Remember the value of each of the @nr knobs; an absent one saves "" */
static inline void save_knob_list(struct knob *knobs, size_t nr)
{
	for (size_t i = 0; i < nr; i++)
		if (read_knob(knobs[i].path, knobs[i].saved, sizeof(knobs[i].saved)))
			knobs[i].saved[0] = '\0';
}

/* Put back each saved knob that no longer holds its saved value */
static inline void restore_knob_list(struct knob *knobs, size_t nr)
{
	char now[32];

	for (size_t i = 0; i < nr; i++) {
		if (!knobs[i].saved[0])
			continue;
		if (!read_knob(knobs[i].path, now, sizeof(now)) &&
		    !strcmp(now, knobs[i].saved))
			continue;
		write_knob(knobs[i].path, knobs[i].saved);
	}
}

/* --- what the kernel tells: /proc/self/status, pagemap, smaps ---------- */

/* The number after @field ("VmPTE:") in the /proc file @path; -1: none */
static inline long proc_field(const char *path, const char *field)
{
	char line[256];
	long val = -1;
	FILE *f = fopen(path, "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, field, strlen(field)))
			val = strtol(line + strlen(field), NULL, 10);
	fclose(f);
	return val;
}

/* The number after @field ("VmPTE:") in /proc/self/status; -1: none */
static inline long status_kb(const char *field)
{
	return proc_field("/proc/self/status", field);
}

/*
 * How far /proc's RSS fields (VmRSS, RssAnon, VmSwap) may lag the truth:
 * they read a per-CPU counter's sum without the CPUs' unfolded deltas, up
 * to a batch of 32 pages per CPU (4 CPUs: 512 kB); twice that.
 */
#define RSS_SLACK_KB	1024

/*
 * Under `ptlab soak` (lab/guest/soak sets PTLAB_SOAK), with stress-ng and the
 * other race tests beside this one: what is system-wide (PageTables, vmstat
 * counts) moves with every process, and the pace is the soak's.
 */
static inline bool in_soak(void)
{
	return getenv("PTLAB_SOAK");
}

/*
 * PageTables of /proc/meminfo, kB, exact: the per-CPU deltas of the
 * counter are folded first (up to 4 CPUs x their threshold of pages
 * otherwise, which made a freed table look leaked or a leak look freed).
 */
static inline long pagetables_kb(void)
{
	FILE *f = fopen("/proc/sys/vm/stat_refresh", "w");

	if (f) {
		fputs("1\n", f);
		fclose(f);
	}
	return proc_field("/proc/meminfo", "PageTables:");
}

/* A counter of /proc/vmstat, or -1 if this kernel has none of that name */
static inline long vmstat(const char *name)
{
	char line[128];
	size_t len = strlen(name);
	long val = -1;
	FILE *f = fopen("/proc/vmstat", "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, name, len) && line[len] == ' ')
			val = strtol(line + len + 1, NULL, 10);
	fclose(f);
	return val;
}

/* CLOCK_MONOTONIC in ms */
static inline long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* kB of page tables of this process */
static inline long vmpte_kb(void)
{
	return status_kb("VmPTE:");
}

/* Bits of a /proc/pid/pagemap entry */
#define PM_PRESENT	(1ULL << 63)
#define PM_SWAP		(1ULL << 62)
#define PM_MMAP_EXCLUSIVE (1ULL << 56)
#define PM_UFFD_WP	(1ULL << 57)
#define PM_SOFT_DIRTY	(1ULL << 55)
#define PM_PFN		((1ULL << 55) - 1)

/* The pagemap entry of @addr read from the open pagemap @fd; 0: failed */
static inline uint64_t pagemap_entry(int fd, char *addr)
{
	uint64_t ent = 0;

	if (pread(fd, &ent, sizeof(ent), (unsigned long)addr / PAGE_SIZE * 8) != 8)
		return 0;
	return ent;
}

/* The pagemap entries of @n pages at @p that have all bits of @bits */
static inline unsigned long count_pagemap(char *p, unsigned long n,
					  uint64_t bits)
{
	int fd = open("/proc/self/pagemap", O_RDONLY);
	unsigned long count = 0;

	if (fd < 0)
		return 0;
	for (unsigned long i = 0; i < n; i++)
		if ((pagemap_entry(fd, p + i * PAGE_SIZE) & bits) == bits)
			count++;
	close(fd);
	return count;
}

/*
 * How many of the @n pages at @p map a page that another of them maps too:
 * KSM merged them.  Not "the same page as the first": KSM merges a range in
 * no particular order, and a count of the first page's sharers read 1 in 20
 * s under TCG while 200 others were merged.  (Not /proc/kpageflags' KPF_KSM:
 * 6.12.117 reports it for every anonymous page, "mapping & PAGE_MAPPING_KSM"
 * being true whenever the PAGE_MAPPING_ANON bit is set.)
 */
static inline int pfn_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static inline unsigned long count_merged(char *p, unsigned long n)
{
	int pm = open("/proc/self/pagemap", O_RDONLY);
	uint64_t *pfn = calloc(n, sizeof(*pfn));
	unsigned long same = 0;

	for (unsigned long i = 0; pm >= 0 && pfn && i < n; i++)
		pfn[i] = pagemap_entry(pm, p + i * PAGE_SIZE) & PM_PFN;
	if (pfn) {
		qsort(pfn, n, sizeof(*pfn), pfn_cmp);
		for (unsigned long i = 0; i < n; i++)
			same += pfn[i] && ((i && pfn[i - 1] == pfn[i]) ||
					   (i + 1 < n && pfn[i + 1] == pfn[i]));
	}
	free(pfn);
	if (pm >= 0)
		close(pm);
	return same;
}

/* kB of a field ("AnonHugePages:") of the VMA over @p */
static inline long smaps_kb(char *p, const char *field)
{
	unsigned long start, end;
	char line[256];
	bool in_vma = false;
	long val = -1;
	FILE *f = fopen("/proc/self/smaps", "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (strchr(line, '-') && strchr(line, '-') < strchr(line, ' '))
			in_vma = sscanf(line, "%lx-%lx", &start, &end) == 2 &&
				 start <= (unsigned long)p &&
				 (unsigned long)p < end;
		else if (in_vma && !strncmp(line, field, strlen(field)))
			val = strtol(line + strlen(field), NULL, 10);
	}
	fclose(f);
	return val;
}

/* --- memory: aligned mappings, page tags ------------------------------- */

/* @len bytes of anonymous private memory with @prot at an @align boundary */
static inline char *map_aligned(unsigned long len, unsigned long align, int prot)
{
	char *raw = mmap(NULL, len + align, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *p;

	if (raw == MAP_FAILED)
		return NULL;
	p = (char *)(((unsigned long)raw + align - 1) & ~(align - 1));
	if (p > raw)
		munmap(raw, p - raw);
	munmap(p + len, raw + align - p);
	return p;
}

/* A page holds its tag in its first and last word */
static inline unsigned long *first_word(char *page)
{
	return (unsigned long *)page;
}

static inline unsigned long *last_word(char *page)
{
	return (unsigned long *)(page + PAGE_SIZE) - 1;
}

/* Each access to a checked word is one load or store the compiler keeps */
static inline unsigned long load_word(unsigned long *w)
{
	return __atomic_load_n(w, __ATOMIC_RELAXED);
}

static inline void store_word(unsigned long *w, unsigned long val)
{
	__atomic_store_n(w, val, __ATOMIC_RELAXED);
}

/* Store @val in the first and the last word of @page */
static inline void write_tag(char *page, unsigned long val)
{
	store_word(first_word(page), val);
	store_word(last_word(page), val);
}

/*
 * The run-time switches of our series, each with the Kconfig option that
 * builds its feature (the table is config/features.config).
 */
#define WALK_SYSCTL	"/proc/sys/vm/migration_walk_early_exit"
#define RECLAIM_SYSCTL	"/proc/sys/vm/pte_table_reclaim"
#define COW_PTE_SYSCTL	"/proc/sys/vm/cow_pte"
#define MOVE_BATCH	"/proc/sys/vm/uffd_move_batch"

static const struct {
	const char *sysctl, *option;
} feature_switches[] = {
	{ WALK_SYSCTL, "CONFIG_MIGRATION_WALK_EARLY_EXIT" },
	{ RECLAIM_SYSCTL, "CONFIG_PTE_TABLE_RECLAIM" },
	{ COW_PTE_SYSCTL, "CONFIG_COW_PTE" },
	{ MOVE_BATCH, "CONFIG_UFFD_MOVE_BATCH" },
};

/*
 * Whether the running kernel was built with @option=y, as its
 * /proc/config.gz says (false where it does not say: no IKCONFIG_PROC).
 */
static inline bool kernel_config_has(const char *option)
{
	size_t n = strlen(option);
	bool found = false;
	char line[256];
	FILE *f = popen("zcat /proc/config.gz 2>/dev/null", "r");

	if (!f)
		return false;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, option, n) && !strcmp(line + n, "=y\n"))
			found = true;
	pclose(f);
	return found;
}

/*
 * The kernel has the switch at @path (a sysctl of our series).  Its absence
 * means a kernel without the feature (vanilla), where the tests of the
 * feature skip or only log, unless the kernel's configuration says it was
 * built with the feature: then a missing switch fails the program.
 */
static inline bool switch_present(const char *path)
{
	if (!access(path, F_OK))
		return true;
	for (size_t i = 0; i < sizeof(feature_switches) / sizeof(feature_switches[0]); i++) {
		if (strcmp(path, feature_switches[i].sysctl) ||
		    !kernel_config_has(feature_switches[i].option))
			continue;
		printf("Bail out! %s is missing, but the kernel has %s=y\n",
		       path, feature_switches[i].option);
		fflush(stdout);
		exit(1);
	}
	return false;
}

/* Turn a 0/1 switch on or off where the kernel has it (vanilla: no-op) */
static inline int set_switch(const char *path, int on)
{
	if (!switch_present(path))
		return 0;
	return write_knob(path, on ? "1\n" : "0\n");
}

/* --- memory cgroups (cgroup2 at /sys/fs/cgroup, mounted by the guest) ---- */

#define CGROUP_ROOT	"/sys/fs/cgroup"

/* Write this process's pid into the cgroup.procs of @dir */
static inline int move_to_cgroup(const char *dir)
{
	char path[256], pid[32];

	snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
	snprintf(pid, sizeof(pid), "%d\n", getpid());
	return write_knob(path, pid);
}

/*
 * This process, and what it forks from now on, into the memcg @dir (made if
 * need be), whose memory.reclaim then reclaims its pages.  false: no memcg.
 */
static inline bool enter_memcg(const char *dir)
{
	char path[256];

	write_knob(CGROUP_ROOT "/cgroup.subtree_control", "+memory\n");
	if (mkdir(dir, 0755) && errno != EEXIST)
		return false;
	snprintf(path, sizeof(path), "%s/memory.reclaim", dir);
	return !access(path, W_OK) && !move_to_cgroup(dir);
}

/* Back to the root cgroup, and @dir removed (once nothing else is in it) */
static inline void leave_memcg(const char *dir)
{
	move_to_cgroup(CGROUP_ROOT);
	rmdir(dir);
}

/* Ask the memcg @dir to reclaim @amount ("2M"): 0, or -errno (EAGAIN: less) */
static inline int memcg_reclaim(const char *dir, const char *amount)
{
	char path[256], val[32];

	snprintf(path, sizeof(path), "%s/memory.reclaim", dir);
	snprintf(val, sizeof(val), "%s\n", amount);
	return write_knob(path, val);
}

/* --- pins ---------------------------------------------------------------- */

#define GUP_PIN_COUNTING_BIAS	1024
#define PIN_PIPES		8

struct vmsplice_pin {
	int pipes[PIN_PIPES][2];
	int npipes;
	unsigned long refs;
};

/*
 * Make the small folio of @page look pinned (folio_maybe_dma_pinned():
 * a refcount over GUP_PIN_COUNTING_BIAS) by vmsplice()-ing it into pipes
 * over a thousand times; the pipes hold the references until
 * vmsplice_unpin().  Returns the references taken (0 on failure).
 */
static inline unsigned long vmsplice_pin(struct vmsplice_pin *pin, char *page)
{
	struct iovec iov = { page, PAGE_SIZE };

	pin->npipes = 0;
	pin->refs = 0;
	while (pin->refs < GUP_PIN_COUNTING_BIAS + 64 && pin->npipes < PIN_PIPES) {
		int *fds = pin->pipes[pin->npipes];

		if (pipe(fds))
			break;
		pin->npipes++;
		fcntl(fds[1], F_SETPIPE_SZ, 1 << 20);
		while (vmsplice(fds[1], &iov, 1, SPLICE_F_NONBLOCK) == PAGE_SIZE)
			pin->refs++;
	}
	return pin->refs;
}

static inline void vmsplice_unpin(struct vmsplice_pin *pin)
{
	for (int i = 0; i < pin->npipes; i++) {
		close(pin->pipes[i][0]);
		close(pin->pipes[i][1]);
	}
	pin->npipes = 0;
}

/* --- userfaultfd -------------------------------------------------------- */

/* A userfaultfd with @features, or -errno */
static inline int uffd_open(__u64 features)
{
	struct uffdio_api api = { .api = UFFD_API, .features = features };
	int fd = syscall(__NR_userfaultfd, O_CLOEXEC | O_NONBLOCK);

	if (fd < 0)
		return -errno;
	if (ioctl(fd, UFFDIO_API, &api)) {
		int err = errno;

		close(fd);
		return -err;
	}
	return fd;
}

static inline int uffd_register(int fd, char *p, unsigned long len, __u64 mode)
{
	struct uffdio_register reg = {
		.range = { .start = (unsigned long)p, .len = len },
		.mode = mode,
	};

	return ioctl(fd, UFFDIO_REGISTER, &reg) ? -errno : 0;
}

static inline int uffd_unregister(int fd, char *p, unsigned long len)
{
	struct uffdio_range range = { .start = (unsigned long)p, .len = len };

	return ioctl(fd, UFFDIO_UNREGISTER, &range) ? -errno : 0;
}

/* The first CPU of @node, or -1 */
static inline int node_first_cpu(int node)
{
	char path[64], buf[64];

	snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", node);
	if (read_knob(path, buf, sizeof(buf)) || !buf[0])
		return -1;
	return atoi(buf);
}

/* Run only on CPU @cpu from now on: 0, or -1 with errno */
static inline int pin_to_cpu(int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	return sched_setaffinity(0, sizeof(set), &set);
}

/*
 * Spin until another process sets *@flag (shared memory), without
 * sleeping: no syscall (time() is the vDSO's), no context switch that
 * could flush this CPU's TLB.  false if it was not set within 60 s.
 */
static inline bool spin_until(volatile int *flag)
{
	time_t end = time(NULL) + 60;

	while (!__atomic_load_n(flag, __ATOMIC_ACQUIRE))
		if (time(NULL) > end)
			return false;
	return true;
}

#endif /* GUEST_UTIL_H */
