// SPDX-License-Identifier: GPL-2.0
/*
 * bench_teardown: the cost of tearing down anonymous memory, by munmap()
 * and by exit, for a given folio size.
 *
 * The parent faults in N bytes with 4 KiB pages, 64 KiB mTHP folios or
 * 2 MiB THPs, checks the folio size, and times munmap() of the whole area.
 * Then a child does the same fault-in and check, writes a CLOCK_MONOTONIC
 * timestamp to a pipe and calls _exit(0); the parent takes the time when
 * waitpid() returns. Both are reported per 4 KiB page.
 *
 * Folio size check, on a sample of aligned runs of the area, through
 * /proc/self/pagemap and /proc/kpageflags (root): the run's PFNs are
 * contiguous and aligned, the first is a compound head, the others tails,
 * and the page after the run is no tail (the folio is not larger). 4k runs
 * must be neither head nor tail, and AnonHugePages must stay 0; 2m also
 * needs AnonHugePages to grow. Every sampled 4k run must pass, and at least
 * 90% of the large-folio runs (an occasional fallback is no reason to drop
 * the run, a kernel that ignores the setting is).
 */
#include <getopt.h>
#include <linux/kernel-page-flags.h>
#include <sys/wait.h>

#include "bench.h"

#define SEED		0x3c
#define MAX_SAMPLES	256

struct opts {
	size_t size;
	size_t folio;
};

struct folio_check {
	unsigned long runs, good;
	long ahp_kb;		/* AnonHugePages growth */
};

struct child_report {
	struct folio_check fc;
	uint64_t ts;
};

static int pagemap_fd = -1, kpf_fd = -1;

static void parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		SIZE_OPTIONS,
		{ "folio", required_argument, NULL, 'F' },
		{ "size", required_argument, NULL, 's' },
		{ NULL, 0, NULL, 0 },
	};
	enum bench_size sz = SIZE_DEFAULT;
	size_t size = 0;
	int c;

	o->folio = PAGE_SZ;
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		if (size_option(c, &sz))
			continue;
		switch (c) {
		case 'F':
			o->folio = parse_size(optarg);
			break;
		case 's':
			size = parse_size(optarg) & ~(PMD_SZ - 1);
			if (!size)
				o->folio = 0;
			break;
		default:
			o->folio = 0;
			break;
		}
	}
	if (o->folio != PAGE_SZ && o->folio != 64 * KiB && o->folio != PMD_SZ) {
		fprintf(stderr, "usage: %s [--quick|--full] [--folio 4k|64k|2m] [--size BYTES]\n",
			argv[0]);
		exit(2);
	}
	o->size = sz == SIZE_QUICK ? 64 * MiB :
		  sz == SIZE_FULL ? 1 * GiB : 256 * MiB;
	if (size)
		o->size = size;
}

static void setup(const struct opts *o)
{
	pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	kpf_fd = open("/proc/kpageflags", O_RDONLY | O_CLOEXEC);
	if (pagemap_fd < 0 || kpf_fd < 0)
		skip("needs /proc/self/pagemap and /proc/kpageflags (root)");
	if (o->folio == 64 * KiB)
		mthp64_only("madvise");
	if (o->folio == PMD_SZ && !file_exists(THP_SYSFS "/enabled"))
		skip("kernel without THP");
}

static long long mthp64_allocs(void)
{
	char buf[64];

	if (read_file(MTHP64 "/stats/anon_fault_alloc", buf, sizeof(buf)))
		return -1;
	return atoll(buf);
}

static char *fault_in(const struct opts *o)
{
	char *p = map_aligned(o->size, PMD_SZ, 0);
	unsigned long i, n = o->size / PAGE_SZ;

	if (o->folio == PAGE_SZ)
		do_madvise(p, o->size, MADV_NOHUGEPAGE, "MADV_NOHUGEPAGE");
	else
		do_madvise(p, o->size, MADV_HUGEPAGE, "MADV_HUGEPAGE");
	for (i = 0; i < n; i++)
		*(uint64_t *)(p + i * PAGE_SZ) = pattern(SEED, i);
	return p;
}

/* is the run of nr pages at p exactly one naturally aligned folio? */
static int run_is_folio(char *p, unsigned long nr)
{
	static uint64_t flags[PMD_SZ / PAGE_SZ + 1];
	uint64_t pfn0 = pagemap_pfn(pagemap_fd, p);
	unsigned long j;

	if (!pfn0 || pfn0 % nr)
		return 0;
	for (j = 1; j < nr; j++)
		if (pagemap_pfn(pagemap_fd, p + j * PAGE_SZ) != pfn0 + j)
			return 0;
	if (pread(kpf_fd, flags, (nr + 1) * 8, pfn0 * 8) != (ssize_t)(nr + 1) * 8)
		return 0;
	if (flags[nr] & (1ULL << KPF_COMPOUND_TAIL))
		return 0;
	if (nr == 1)
		return !(flags[0] & (1ULL << KPF_COMPOUND_HEAD |
				     1ULL << KPF_COMPOUND_TAIL));
	if (!(flags[0] & (1ULL << KPF_COMPOUND_HEAD)))
		return 0;
	for (j = 1; j < nr; j++)
		if (!(flags[j] & (1ULL << KPF_COMPOUND_TAIL)))
			return 0;
	return 1;
}

static void check_folios(const struct opts *o, char *p, long ahp0,
			 struct folio_check *fc)
{
	unsigned long nr = o->folio / PAGE_SZ, runs = o->size / o->folio;
	unsigned long i, step = runs > MAX_SAMPLES ? runs / MAX_SAMPLES : 1;

	if (!pagemap_pfn(pagemap_fd, p))
		die("pagemap shows no PFN (not root?)");
	fc->runs = fc->good = 0;
	for (i = 0; i < runs; i += step) {
		fc->runs++;
		fc->good += run_is_folio(p + i * o->folio, nr);
	}
	fc->ahp_kb = smaps_rollup_kb("AnonHugePages") - ahp0;
}

/* NULL if the check passed, else why not */
static const char *folio_verdict(const struct opts *o,
				 const struct folio_check *fc)
{
	if (o->folio == PAGE_SZ && fc->ahp_kb)
		return "AnonHugePages grew with MADV_NOHUGEPAGE";
	if (o->folio == PMD_SZ && fc->ahp_kb <= 0)
		return "AnonHugePages did not grow";
	if (o->folio == PAGE_SZ && fc->good != fc->runs)
		return "sampled 4K pages belong to large folios";
	if (fc->good * 10 < fc->runs * 9)
		return "fewer than 90% of the sampled runs are folios of the requested size";
	return NULL;
}

static void report_check(const char *who, const struct opts *o,
			 const struct folio_check *fc)
{
	const char *why = folio_verdict(o, fc);

	comment("%s: %lu of %lu sampled runs are %s folios, AnonHugePages +%ld kB",
		who, fc->good, fc->runs, size_str(o->folio), fc->ahp_kb);
	if (why)
		verify_failed("%s: %s", who, why);
}

static double time_munmap(const struct opts *o)
{
	long ahp0 = smaps_rollup_kb("AnonHugePages");
	long long a0 = mthp64_allocs();
	struct folio_check fc;
	uint64_t t0;
	char *p;

	t0 = now_ns();
	p = fault_in(o);
	comment("fault-in: %.1f ns per 4K page",
		(double)(now_ns() - t0) / (o->size / PAGE_SZ));
	check_folios(o, p, ahp0, &fc);
	if (o->folio == 64 * KiB && a0 >= 0)
		comment("64k folios allocated: %lld", mthp64_allocs() - a0);
	report_check("parent", o, &fc);
	t0 = now_ns();
	if (munmap(p, o->size))
		die_errno("munmap");
	return (double)(now_ns() - t0) / (o->size / PAGE_SZ);
}

static void __noreturn child(const struct opts *o, int wfd)
{
	long ahp0 = smaps_rollup_kb("AnonHugePages");
	struct child_report r;
	char *p;

	bench_child = 1;
	/* an open pagemap is bound to the opener's mm: reopen ours */
	close(pagemap_fd);
	pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (pagemap_fd < 0)
		_exit(3);
	p = fault_in(o);
	check_folios(o, p, ahp0, &r.fc);
	r.ts = now_ns();
	if (write(wfd, &r, sizeof(r)) != sizeof(r))
		_exit(3);
	_exit(0);
}

static double time_exit(const struct opts *o)
{
	struct child_report r;
	int fd[2], status;
	uint64_t t1;
	pid_t pid;

	if (pipe(fd))
		die_errno("pipe");
	pid = fork();
	if (pid < 0)
		die_errno("fork");
	if (!pid) {
		close(fd[0]);
		child(o, fd[1]);
	}
	close(fd[1]);
	if (read(fd[0], &r, sizeof(r)) != sizeof(r))
		r.ts = 0;
	if (waitpid(pid, &status, 0) != pid)
		die_errno("waitpid");
	t1 = now_ns();
	close(fd[0]);
	if (!r.ts || !WIFEXITED(status) || WEXITSTATUS(status))
		verify_failed("child failed (status 0x%x)", status);
	report_check("child", o, &r.fc);
	return (double)(t1 - r.ts) / (o->size / PAGE_SZ);
}

int main(int argc, char **argv)
{
	double unmap_ns, exit_ns;
	struct opts o;

	bench_init();
	parse(argc, argv, &o);
	printf("# sizes: area %s, folio %s\n", size_str(o.size),
	       size_str(o.folio));
	setup(&o);
	unmap_ns = time_munmap(&o);
	exit_ns = time_exit(&o);
	metric("munmap_ns_per_page", unmap_ns, "ns", "lower");
	metric("exit_ns_per_page", exit_ns, "ns", "lower");
	verify_ok();
	return 0;
}
