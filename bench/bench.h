/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Helpers shared by the ptlab guest benchmarks (one header, no library:
 * every benchmark is a single static binary).
 *
 * Output protocol, on stdout, one line each:
 *	metric <name> <value> <unit> <lower|higher>
 *	verify ok			(last line, exit 0)
 *	verify FAILED <reason>		(exit 1, and no metric after it)
 *	# <anything else>
 * A run that cannot run here prints "# skip: <why>" and exits 4 (KSFT_SKIP).
 *
 * Children of a benchmark set bench_child: their die() prints a comment and
 * _exit(1)s, so that only the parent speaks the protocol and only the parent
 * runs the atexit() handlers (sysfs knobs, cgroups, killing children).
 */
#ifndef PTLAB_BENCH_H
#define PTLAB_BENCH_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <numa.h>
#include <sched.h>
#include <numaif.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>

#define KiB		1024UL
#define MiB		(1024 * KiB)
#define GiB		(1024 * MiB)
#define PAGE_SZ		4096UL
#define PMD_SZ		(2 * MiB)
#define KSFT_SKIP	4

#define THP_SYSFS	"/sys/kernel/mm/transparent_hugepage"

#define __printf(a, b)	__attribute__((format(printf, a, b)))
#define __noreturn	__attribute__((noreturn))

enum bench_size { SIZE_QUICK, SIZE_DEFAULT, SIZE_FULL };

/* the --quick and --full options every benchmark takes (struct option entries) */
#define SIZE_OPTIONS \
	{ "quick", no_argument, NULL, 'q' }, \
	{ "full", no_argument, NULL, 'f' }

/* getopt_long() returned c: if it is a SIZE_OPTIONS option, note it in *sz */
static inline int size_option(int c, enum bench_size *sz)
{
	if (c != 'q' && c != 'f')
		return 0;
	*sz = c == 'q' ? SIZE_QUICK : SIZE_FULL;
	return 1;
}

static int bench_child;		/* set in forked children: see above */

/* A bad command line: the program's usage line on stderr, exit 2 */
static inline void __noreturn usage_exit(const char *usage, const char *prog)
{
	fprintf(stderr, usage, prog);
	exit(2);
}

/* ---- reporting ---------------------------------------------------- */

static inline void bench_init(void)
{
	/* line buffered: nothing pending in stdio when we fork */
	setvbuf(stdout, NULL, _IOLBF, 0);
}

static inline void vcomment(const char *fmt, va_list ap)
{
	char buf[512];

	vsnprintf(buf, sizeof(buf), fmt, ap);
	if (bench_child)
		printf("# child %d: %s\n", getpid(), buf);
	else
		printf("# %s\n", buf);
	fflush(stdout);
}

static inline void __printf(1, 2) comment(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vcomment(fmt, ap);
	va_end(ap);
}

static inline void __noreturn __printf(1, 2) verify_failed(const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (bench_child) {
		printf("# child %d: verify: %s\n", getpid(), buf);
		fflush(stdout);
		_exit(1);
	}
	printf("verify FAILED %s\n", buf);
	fflush(stdout);
	exit(1);
}

/* an error that is not the kernel's answer to the check: same protocol */
#define die(fmt, ...)	verify_failed("error: " fmt, ##__VA_ARGS__)
#define die_errno(what)	die("%s: %s", what, strerror(errno))

static inline void __noreturn __printf(1, 2) skip(const char *fmt, ...)
{
	va_list ap;
	char buf[512];

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	printf("# skip: %s\n", buf);
	fflush(stdout);
	exit(KSFT_SKIP);
}

static inline void verify_ok(void)
{
	printf("verify ok\n");
	fflush(stdout);
}

static inline void metric(const char *name, double val, const char *unit,
			  const char *better)
{
	if (val == (double)(long long)val)
		printf("metric %s %lld %s %s\n", name, (long long)val, unit,
		       better);
	else
		printf("metric %s %.3f %s %s\n", name, val, unit, better);
}

/* ---- time ---------------------------------------------------------- */

static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

/* ---- statistics ---------------------------------------------------- */

static inline int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* the @q quantile (0..1) of @v, sorted here; 0 if empty */
static inline double quantile(double *v, size_t n, double q)
{
	if (!n)
		return 0;
	qsort(v, n, sizeof(*v), cmp_double);
	return v[(size_t)(q * (n - 1) + 0.5)];
}

/* ---- files --------------------------------------------------------- */

/* read a small file into buf (NUL terminated); -errno on failure */
static inline int read_file(const char *path, char *buf, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = read(fd, buf, len - 1);
	if (n < 0) {
		n = -errno;
		close(fd);
		return n;
	}
	buf[n] = 0;
	close(fd);
	return 0;
}

/* write a string with a single write(); -errno on failure */
static inline int write_file(const char *path, const char *val)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	int ret = 0;

	if (fd < 0)
		return -errno;
	if (write(fd, val, strlen(val)) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

static inline int file_exists(const char *path)
{
	return access(path, F_OK) == 0;
}

/* "Field:   1234 kB" from a /proc file of such lines; -1 if absent */
static inline long proc_field_kb(const char *path, const char *field)
{
	size_t len = strlen(field);
	char line[256];
	long val = -1;
	FILE *f = fopen(path, "re");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, field, len) && line[len] == ':') {
			val = strtol(line + len + 1, NULL, 10);
			break;
		}
	fclose(f);
	return val;
}

/* a field of /proc/<pid>/status (pid 0: self) */
static inline long status_kb(pid_t pid, const char *field)
{
	char path[64];

	if (pid)
		snprintf(path, sizeof(path), "/proc/%d/status", pid);
	else
		snprintf(path, sizeof(path), "/proc/self/status");
	return proc_field_kb(path, field);
}

/* a field of /proc/self/smaps_rollup */
static inline long smaps_rollup_kb(const char *field)
{
	return proc_field_kb("/proc/self/smaps_rollup", field);
}

/* sum of the /proc/vmstat counters whose name starts with prefix */
static inline long long vmstat_sum(const char *prefix)
{
	size_t len = strlen(prefix);
	long long sum = 0, v;
	char name[128];
	FILE *f = fopen("/proc/vmstat", "re");

	if (!f)
		return -1;
	while (fscanf(f, "%127s %lld", name, &v) == 2)
		if (!strncmp(name, prefix, len))
			sum += v;
	fclose(f);
	return sum;
}

/* one /proc/vmstat counter; -1 if absent */
static inline long long vmstat_get(const char *name)
{
	long long v, ret = -1;
	char key[128];
	FILE *f = fopen("/proc/vmstat", "re");

	if (!f)
		return -1;
	while (fscanf(f, "%127s %lld", key, &v) == 2)
		if (!strcmp(key, name)) {
			ret = v;
			break;
		}
	fclose(f);
	return ret;
}

/* ---- sysfs knobs, restored at exit ---------------------------------- */

#define MAX_KNOBS 16

struct knob {
	char path[160];
	char old[64];
};

static struct knob knobs[MAX_KNOBS];
static int nr_knobs;

/* the selected word of "always [madvise] never", or the whole value */
static inline void knob_current(const char *raw, char *out, size_t len)
{
	const char *l = strchr(raw, '['), *r = l ? strchr(l, ']') : NULL;

	if (l && r) {
		snprintf(out, len, "%.*s", (int)(r - l - 1), l + 1);
		return;
	}
	snprintf(out, len, "%.*s", (int)strcspn(raw, "\n"), raw);
}

static inline void knobs_restore(void)
{
	if (bench_child)
		return;
	while (nr_knobs > 0) {
		struct knob *k = &knobs[--nr_knobs];

		if (write_file(k->path, k->old))
			printf("# could not restore %s to %s\n", k->path, k->old);
	}
}

/* save the old value once, then write val; -errno on failure */
static inline int knob_set(const char *path, const char *val)
{
	char raw[256];
	struct knob *k;
	int i, ret;

	for (i = 0; i < nr_knobs; i++)
		if (!strcmp(knobs[i].path, path))
			return write_file(path, val);
	if (nr_knobs == MAX_KNOBS)
		return -ENOSPC;
	ret = read_file(path, raw, sizeof(raw));
	if (ret)
		return ret;
	k = &knobs[nr_knobs];
	snprintf(k->path, sizeof(k->path), "%s", path);
	knob_current(raw, k->old, sizeof(k->old));
	if (!nr_knobs++)
		atexit(knobs_restore);
	return write_file(path, val);
}

/* ---- interrupts and NUMA ---------------------------------------------- */

/*
 * The sum over the CPUs of the /proc/interrupts line named @name ("TLB:",
 * "CAL:"): the whole machine's, not this process's; -1 if there is none
 */
static inline long long irq_sum(const char *name)
{
	FILE *f = fopen("/proc/interrupts", "re");
	size_t len = strlen(name);
	long long sum = -1;
	char line[4096];

	while (f && fgets(line, sizeof(line), f)) {
		char *s = line, *end;

		while (*s == ' ')
			s++;
		if (strncmp(s, name, len))
			continue;
		sum = 0;
		for (s += len;; s = end) {
			long long v = strtoll(s, &end, 10);

			if (end == s)
				break;
			sum += v;
		}
		break;
	}
	if (f)
		fclose(f);
	return sum;
}

/*
 * Whole-address-space TLB flushes, counted with the tlb:tlb_flush tracepoint
 * (x86): the flushes a CPU does for a shootdown, its own (reason 3) or
 * another CPU's (reason 1), of every entry (pages == TLB_FLUSH_ALL).  A
 * ranged flush of more than tlb_single_page_flush_ceiling pages is one too.
 * The event's filter keeps only those, so the buffer holds few; a count
 * with lost events is no count (-1).  The event must be enabled already
 * (`ptlab bench` boots with trace_event=tlb:tlb_flush): enabling it here
 * would patch kernel text, which QEMU TCG may then run stale ("Oops: int3",
 * 2026-11-28); only the filter and tracing_on are written.
 * tlb_trace_start(): 0 or -errno (no tracefs, event not enabled);
 * tlb_trace_stop(): the count, or -1.
 */
#define TRACEFS		"/sys/kernel/tracing"
#define TLB_EVENT	TRACEFS "/events/tlb/tlb_flush"
#define TLB_FULL_FILTER	"pages == 0xffffffffffffffff && (reason == 1 || reason == 3)"

static inline int tlb_trace_start(void)
{
	char on[8];
	int fd, ret;

	if (!file_exists(TRACEFS "/trace") &&
	    mount("tracefs", TRACEFS, "tracefs", 0, NULL))
		return -errno;
	ret = read_file(TLB_EVENT "/enable", on, sizeof(on));
	if (ret)
		return ret;
	if (on[0] != '1')
		return -ENOENT;
	ret = write_file(TRACEFS "/tracing_on", "0");
	if (!ret)
		ret = write_file(TLB_EVENT "/filter", TLB_FULL_FILTER);
	if (ret)
		return ret;
	fd = open(TRACEFS "/trace", O_WRONLY | O_TRUNC | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	close(fd);
	return write_file(TRACEFS "/tracing_on", "1");
}

static inline long tlb_trace_stop(void)
{
	FILE *f;
	char line[512];
	long n = 0, lost = 0;

	write_file(TRACEFS "/tracing_on", "0");
	f = fopen(TRACEFS "/trace", "re");
	while (f && fgets(line, sizeof(line), f)) {
		if (line[0] == '#') {
			/* "# entries-in-buffer/entries-written: 5/5   #P:4" */
			unsigned long in, written;
			char *s = strstr(line, "entries-written:");

			if (s && sscanf(s, "entries-written: %lu/%lu", &in, &written) == 2)
				lost += written - in;
			continue;
		}
		n += strstr(line, "tlb_flush:") != NULL;
	}
	if (f)
		fclose(f);
	return f && !lost ? n : -1;
}

/*
 * What a section cost the other CPUs: TLB shootdown and function-call
 * interrupts (the whole guest's) and whole-mm flushes (-1: not counted),
 * from flush_counts_start() to flush_counts_stop().
 */
struct flush_counts {
	long long tlb, call;
	long full;
};

static inline void flush_counts_start(struct flush_counts *f)
{
	int err = tlb_trace_start();

	if (err)
		comment("tlb:tlb_flush not traced (%s): full flushes not counted",
			strerror(-err));
	f->full = err ? -1 : 0;
	f->tlb = irq_sum("TLB:");
	f->call = irq_sum("CAL:");
}

static inline void flush_counts_stop(struct flush_counts *f)
{
	f->tlb = irq_sum("TLB:") - f->tlb;
	f->call = irq_sum("CAL:") - f->call;
	if (!f->full)
		f->full = tlb_trace_stop();
}

/* Metrics @prefix"tlb_ipis", ..."call_ipis", ..."full_flushes", each / @per */
static inline void flush_counts_report(const struct flush_counts *f,
				       const char *prefix, const char *suffix,
				       double per)
{
	char name[64];

	snprintf(name, sizeof(name), "%stlb_ipis%s", prefix, suffix);
	metric(name, f->tlb / per, "count", "lower");
	snprintf(name, sizeof(name), "%scall_ipis%s", prefix, suffix);
	metric(name, f->call / per, "count", "lower");
	snprintf(name, sizeof(name), "%sfull_flushes%s", prefix, suffix);
	if (f->full >= 0)
		metric(name, f->full / per, "count", "lower");
	else
		comment("%s not counted (no tracepoint, or events lost)", name);
}

/* Wait for child @pid, which must exit 0 (else the run fails: @what) */
static inline void reap_ok(pid_t pid, const char *what)
{
	int status;

	if (waitpid(pid, &status, 0) != pid)
		die_errno("waitpid");
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		verify_failed("%s: child exit status 0x%x", what, status);
}

/* Run on @cpu only */
static inline void on_cpu(int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set))
		die_errno("sched_setaffinity");
}

/* Skip (exit 4) unless nodes 0 and 1 both have memory */
static inline void need_two_nodes(void)
{
	if (numa_available() < 0)
		skip("NUMA not available");
	if (numa_max_node() < 1 || numa_node_size64(1, NULL) <= 0)
		skip("needs 2 NUMA nodes with memory");
}

/* The pages of [@p, @p + @n pages) not on @node (a move_pages() query) */
static inline long pages_off_node(char *p, unsigned long n, int node)
{
	void **pages = calloc(n, sizeof(*pages));
	int *status = calloc(n, sizeof(*status));
	unsigned long i, first = 0;
	long off = 0;

	if (!pages || !status)
		die_errno("calloc");
	for (i = 0; i < n; i++)
		pages[i] = p + i * PAGE_SZ;
	if (move_pages(0, n, pages, NULL, status, 0))
		die("move_pages query: %s", strerror(errno));
	for (i = n; i-- > 0; )
		if (status[i] != node) {
			off++;
			first = i;
		}
	if (off)
		comment("first page off node %d: index %lu, status %d", node,
			first, status[first]);
	free(pages);
	free(status);
	return off;
}

/* ---- COW page tables ------------------------------------------------- */

#ifndef PR_SET_COW_PTE
#define PR_SET_COW_PTE	0x43505445	/* the series' prctl (0026) */
#endif
#define COW_PTE_SYSCTL	"/proc/sys/vm/cow_pte"

/*
 * Ask for COW page tables at this process's forks: 1 if the kernel has
 * them, 0 (said in a comment) if it does not (EINVAL: vanilla).
 */
static inline int cow_pte_opt_in(void)
{
	if (!prctl(PR_SET_COW_PTE, 1, 0, 0, 0))
		return 1;
	if (errno != EINVAL)
		die("prctl(PR_SET_COW_PTE): %s", strerror(errno));
	comment("no COW page tables on this kernel: forks copy the tables");
	return 0;
}

/* ---- mTHP ------------------------------------------------------------ */

#define MTHP64		THP_SYSFS "/hugepages-64kB"

/*
 * 64 KiB mTHPs only, for the run: hugepages-64kB set to @mode ("madvise",
 * "always"), every other hugepages-* size "never"
 */
static inline void mthp64_only(const char *mode)
{
	char path[300], buf[128], cur[32];
	struct dirent *d;
	DIR *dir;
	int ret;

	if (!file_exists(MTHP64 "/enabled"))
		skip("no " MTHP64 "/enabled (kernel without mTHP)");
	ret = knob_set(MTHP64 "/enabled", mode);
	if (ret)
		die("set %s/enabled: %s", MTHP64, strerror(-ret));
	dir = opendir(THP_SYSFS);
	if (!dir)
		die_errno("opendir " THP_SYSFS);
	while ((d = readdir(dir))) {
		if (strncmp(d->d_name, "hugepages-", 10) ||
		    !strcmp(d->d_name, "hugepages-64kB"))
			continue;
		snprintf(path, sizeof(path), THP_SYSFS "/%s/enabled", d->d_name);
		if (read_file(path, buf, sizeof(buf)))
			continue;
		knob_current(buf, cur, sizeof(cur));
		if (!strcmp(cur, "never"))
			continue;
		ret = knob_set(path, "never");
		if (ret)
			die("set %s: %s", path, strerror(-ret));
	}
	closedir(dir);
}

/* ---- memory ---------------------------------------------------------- */

static inline char *map_anon(size_t len, int flags)
{
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);

	if (p == MAP_FAILED)
		die("mmap %zu bytes: %s", len, strerror(errno));
	return p;
}

/* anonymous mapping of len bytes starting at a multiple of align */
static inline char *map_aligned(size_t len, size_t align, int flags)
{
	char *p = map_anon(len + align, flags);
	uintptr_t start = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
	size_t head = start - (uintptr_t)p;

	if (head)
		munmap(p, head);
	if (align - head)
		munmap((char *)start + len, align - head);
	return (char *)start;
}

static inline void do_madvise(void *p, size_t len, int advice,
			      const char *name)
{
	if (madvise(p, len, advice))
		die("madvise(%s): %s", name, strerror(errno));
}

/* 64-bit word that names page idx of a buffer filled with seed */
static inline uint64_t pattern(uint64_t seed, uint64_t idx)
{
	return (seed << 40) ^ (idx * 0x9e3779b97f4a7c15ULL >> 24) ^ idx ^ 1;
}

static inline uint64_t xorshift64(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

/* "4k", "64K", "2m", "1G" or bytes; 0 on a bad string */
static inline size_t parse_size(const char *s)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 0);

	switch (*end | 0x20) {	/* lower case */
	case 'g':
		v *= 1024;
		/* fall through */
	case 'm':
		v *= 1024;
		/* fall through */
	case 'k':
		v *= 1024;
		end++;
		break;
	}
	if (*end == 'B' || *end == 'b')
		end++;
	return *end ? 0 : v;
}

/* "64M" etc. for "# sizes:" lines; four calls may share one printf */
static inline const char *size_str(size_t v)
{
	static char bufs[4][32];
	static int n;
	char *buf = bufs[n++ & 3];

	if (v >= GiB && !(v % GiB))
		snprintf(buf, 32, "%zuG", v / GiB);
	else if (v >= MiB && !(v % MiB))
		snprintf(buf, 32, "%zuM", v / MiB);
	else if (v >= KiB && !(v % KiB))
		snprintf(buf, 32, "%zuK", v / KiB);
	else
		snprintf(buf, 32, "%zu", v);
	return buf;
}

/* ---- pagemap / kpageflags (root) -------------------------------------- */

#define PM_PRESENT	(1ULL << 63)
#define PM_PFN_MASK	((1ULL << 55) - 1)

/* the PFN behind addr, 0 if not present or hidden (not root) */
static inline uint64_t pagemap_pfn(int fd, const void *addr)
{
	uint64_t ent;
	off_t off = (uintptr_t)addr / PAGE_SZ * sizeof(ent);

	if (pread(fd, &ent, sizeof(ent), off) != sizeof(ent))
		return 0;
	return ent & PM_PRESENT ? ent & PM_PFN_MASK : 0;
}

/* /proc/kpageflags word of pfn; 0 when unreadable */
static inline uint64_t kpageflags(int fd, uint64_t pfn)
{
	uint64_t flags;

	if (pread(fd, &flags, sizeof(flags), pfn * sizeof(flags)) !=
	    sizeof(flags))
		return 0;
	return flags;
}

#endif /* PTLAB_BENCH_H */
