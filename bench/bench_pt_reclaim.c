// SPDX-License-Identifier: GPL-2.0
/*
 * bench_pt_reclaim: what happens to page tables that only map freed memory.
 *
 * Default: walk a large MAP_NORESERVE area in 2 MiB steps, touch every
 * 4 KiB page of the step, then MADV_DONTNEED it. Once the walk is done all
 * data is gone; the PTE tables stay unless the kernel reclaims empty ones,
 * which is what VmPTE shows. Verify: a sample page of every step reads 0.
 *
 * --free: the same walk with MADV_FREE, inside a fresh cgroup v2 child, and
 * then memory.reclaim on that cgroup so that the lazily freed pages really
 * go. Verify: every sampled page reads either its old contents or zeroes,
 * and VmRSS after reclaim is below 10% of what was touched.  During the
 * reclaim a second thread of the process spins on another CPU, so that
 * each TLB flush of the mm must reach it: the TLB shootdown and
 * function-call interrupts (/proc/interrupts) and the whole-mm flushes
 * (tlb:tlb_flush, bench.h) of the reclaim are counted, with its time.
 *
 * --fault [--procs N]: page-fault throughput instead: N processes each map
 * 128 MiB, write a byte to every 4 KiB page, check the bytes, munmap, for a
 * number of iterations. Only mmap + faults + munmap are timed.
 */
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>

#include "bench.h"

#define STEP		PMD_SZ
#define CGROUP_ROOT	"/sys/fs/cgroup"
#define CGROUP2_MAGIC	0x63677270
#define FAULT_AREA	(128 * MiB)
#define SEED		0x77
#define USAGE		\
	"usage: %s [--quick|--full] [--free | --fault [--procs N] [--iters N]] [--steps N]\n"

enum mode { MODE_DONTNEED, MODE_FREE, MODE_FAULT };

struct opts {
	enum mode mode;
	size_t size;		/* the MAP_NORESERVE area */
	unsigned long steps;	/* 2 MiB steps walked */
	unsigned long iters;	/* --fault: mmap/touch/munmap rounds */
	int procs;		/* --fault: parallel processes */
};

static void sizes(struct opts *o, enum bench_size sz)
{
	o->size = sz == SIZE_QUICK ? 512 * MiB :
		  sz == SIZE_FULL ? 50 * GiB : 2 * GiB;
	if (!o->steps)
		o->steps = o->size / STEP;
	if (!o->iters)
		o->iters = sz == SIZE_QUICK ? 2 : sz == SIZE_FULL ? 32 : 8;
	if (o->steps > o->size / STEP)
		o->size = o->steps * STEP;
}

static void parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		SIZE_OPTIONS,
		{ "free", no_argument, NULL, 'F' },
		{ "fault", no_argument, NULL, 'P' },
		{ "procs", required_argument, NULL, 'n' },
		{ "iters", required_argument, NULL, 'i' },
		{ "steps", required_argument, NULL, 's' },
		{ NULL, 0, NULL, 0 },
	};
	enum bench_size sz = SIZE_DEFAULT;
	int c;

	memset(o, 0, sizeof(*o));
	o->procs = 1;
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		if (size_option(c, &sz))
			continue;
		switch (c) {
		case 'F':
			o->mode = MODE_FREE;
			break;
		case 'P':
			o->mode = MODE_FAULT;
			break;
		case 'n':
			o->procs = atoi(optarg);
			break;
		case 'i':
			o->iters = strtoul(optarg, NULL, 0);
			break;
		case 's':
			o->steps = strtoul(optarg, NULL, 0);
			break;
		default:
			usage_exit(USAGE, argv[0]);
		}
	}
	if (o->procs < 1 || o->procs > 64)
		usage_exit(USAGE, argv[0]);
	sizes(o, sz);
}

/* ---- cgroup for --free ------------------------------------------------ */

static char cg_dir[128];		/* our cgroup, empty if none */
static char cg_home[256];		/* where we came from */
static int cg_enabled_memory;		/* we added +memory to the root */

static void cgroup_cleanup(void)
{
	char path[300];

	if (bench_child || !cg_dir[0])
		return;
	snprintf(path, sizeof(path), "%s/cgroup.procs", cg_home);
	if (write_file(path, "0"))
		printf("# could not move back to %s\n", cg_home);
	if (rmdir(cg_dir))
		printf("# rmdir %s: %s\n", cg_dir, strerror(errno));
	if (cg_enabled_memory)
		write_file(CGROUP_ROOT "/cgroup.subtree_control", "-memory");
	cg_dir[0] = 0;
}

/* our current cgroup directory, from "0::/path" in /proc/self/cgroup */
static void cgroup_home(void)
{
	char buf[512], *p;

	if (read_file("/proc/self/cgroup", buf, sizeof(buf)))
		die_errno("read /proc/self/cgroup");
	p = strstr(buf, "0::");
	if (!p)
		skip("not in a cgroup v2 hierarchy");
	p += 3;
	p[strcspn(p, "\n")] = 0;
	snprintf(cg_home, sizeof(cg_home), "%s%s", CGROUP_ROOT,
		 strcmp(p, "/") ? p : "");
}

static void cgroup_enter(void)
{
	char buf[256], path[160];
	struct statfs sfs;
	int ret;

	if (statfs(CGROUP_ROOT, &sfs) || sfs.f_type != CGROUP2_MAGIC)
		skip("no cgroup2 at " CGROUP_ROOT);
	if (read_file(CGROUP_ROOT "/cgroup.controllers", buf, sizeof(buf)) ||
	    !strstr(buf, "memory"))
		skip("memory controller not available in cgroup2");
	cgroup_home();
	read_file(CGROUP_ROOT "/cgroup.subtree_control", buf, sizeof(buf));
	if (!strstr(buf, "memory")) {
		ret = write_file(CGROUP_ROOT "/cgroup.subtree_control", "+memory");
		if (ret)
			die("enable +memory: %s", strerror(-ret));
		cg_enabled_memory = 1;
	}
	snprintf(cg_dir, sizeof(cg_dir), CGROUP_ROOT "/ptlab-bench-%d",
		 getpid());
	if (mkdir(cg_dir, 0755)) {
		cg_dir[0] = 0;
		die_errno("mkdir cgroup");
	}
	atexit(cgroup_cleanup);
	snprintf(path, sizeof(path), "%s/cgroup.procs", cg_dir);
	ret = write_file(path, "0");
	if (ret)
		die("join %s: %s", cg_dir, strerror(-ret));
}

static void cgroup_reclaim(void)
{
	char path[160];
	int ret;

	snprintf(path, sizeof(path), "%s/memory.reclaim", cg_dir);
	ret = write_file(path, "8G");
	if (ret == -EAGAIN)
		comment("memory.reclaim: EAGAIN (reclaimed less than asked)");
	else if (ret)
		die("memory.reclaim: %s", strerror(-ret));
}

static int spin_stop;	/* atomic */

static void *spinner(void *arg)
{
	on_cpu(1);
	while (!__atomic_load_n(&spin_stop, __ATOMIC_ACQUIRE))
		;
	return NULL;
}

/* memory.reclaim with a thread of the mm on CPU 1: its flushes, counted */
static void reclaim_counted(void)
{
	struct flush_counts f;
	pthread_t tid;
	uint64_t t0;

	if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
		skip("needs two CPUs");
	on_cpu(0);
	if (pthread_create(&tid, NULL, spinner, NULL))
		die("pthread_create");
	usleep(100 * 1000);	/* the spinner on its CPU */
	flush_counts_start(&f);
	t0 = now_ns();
	cgroup_reclaim();
	metric("reclaim_ms", (now_ns() - t0) / 1e6, "ms", "lower");
	flush_counts_stop(&f);
	flush_counts_report(&f, "reclaim_", "", 1);
	__atomic_store_n(&spin_stop, 1, __ATOMIC_RELEASE);
	pthread_join(tid, NULL);
}

/* ---- the walk --------------------------------------------------------- */

static void touch_step(char *p, unsigned long step)
{
	unsigned long i, first = step * (STEP / PAGE_SZ);

	for (i = 0; i < STEP / PAGE_SZ; i++)
		*(uint64_t *)(p + i * PAGE_SZ) = pattern(SEED, first + i);
}

static double walk(const struct opts *o, char *area)
{
	int advice = o->mode == MODE_FREE ? MADV_FREE : MADV_DONTNEED;
	uint64_t t0 = now_ns();
	unsigned long s;

	for (s = 0; s < o->steps; s++) {
		char *p = area + s * STEP;

		touch_step(p, s);
		if (madvise(p, STEP, advice))
			die("madvise step %lu: %s", s, strerror(errno));
	}
	return (now_ns() - t0) / 1e9;
}

/*
 * One sample page per step (read after the metrics are taken: reading maps
 * the zero page and may allocate page tables again). A page must be all
 * zero, or, after MADV_FREE, hold exactly what the walk wrote.
 */
static unsigned long check_samples(const struct opts *o, char *area)
{
	unsigned long s, i, bad = 0, kept = 0;
	uint64_t rnd = 12345;

	for (s = 0; s < o->steps; s++) {
		unsigned long pg = xorshift64(&rnd) % (STEP / PAGE_SZ);
		unsigned long idx = s * (STEP / PAGE_SZ) + pg;
		uint64_t *w = (uint64_t *)(area + idx * PAGE_SZ);
		int old = o->mode == MODE_FREE && w[0] == pattern(SEED, idx);

		kept += old;
		if (w[0] && !old)
			bad++;
		for (i = 1; i < PAGE_SZ / sizeof(*w); i++)
			if (w[i]) {
				bad++;
				break;
			}
	}
	if (o->mode == MODE_FREE)
		comment("%lu of %lu sampled pages still held their data", kept,
			o->steps);
	return bad;
}

static int run_walk(const struct opts *o)
{
	long rss_before = 0, pte, rss, vsz, touched_kb;
	unsigned long bad;
	char *area;
	double secs;

	if (o->mode == MODE_FREE)
		cgroup_enter();
	area = map_aligned(o->size, PMD_SZ, MAP_NORESERVE);
	do_madvise(area, o->size, MADV_NOHUGEPAGE, "MADV_NOHUGEPAGE");
	secs = walk(o, area);
	if (o->mode == MODE_FREE) {
		rss_before = status_kb(0, "VmRSS");
		reclaim_counted();
	}
	pte = status_kb(0, "VmPTE");
	rss = status_kb(0, "VmRSS");
	vsz = status_kb(0, "VmSize");
	bad = check_samples(o, area);
	if (bad)
		verify_failed("%lu sampled pages hold neither zeroes nor their data", bad);
	touched_kb = o->steps * (STEP / KiB);
	if (o->mode == MODE_FREE && rss >= touched_kb / 10)
		verify_failed("VmRSS %ld kB after memory.reclaim, >= 10%% of the %ld kB touched",
			      rss, touched_kb);
	metric("vmpte", pte, "kB", "lower");
	metric("vmrss", rss, "kB", "lower");
	metric("vmsize", vsz, "kB", "lower");
	if (o->mode == MODE_FREE)
		metric("vmrss_before_reclaim", rss_before, "kB", "lower");
	metric("elapsed", secs, "s", "lower");
	return 0;
}

/* ---- --fault ---------------------------------------------------------- */

struct fault_report {
	unsigned long pages, bad;
	uint64_t ns;
};

static unsigned long fault_round(unsigned long iter, uint64_t *ns)
{
	unsigned long i, n = FAULT_AREA / PAGE_SZ, bad = 0;
	uint64_t t0 = now_ns(), t1;
	char *p = map_anon(FAULT_AREA, 0);

	do_madvise(p, FAULT_AREA, MADV_NOHUGEPAGE, "MADV_NOHUGEPAGE");
	for (i = 0; i < n; i++)
		p[i * PAGE_SZ] = (char)(i + iter + 1);
	t1 = now_ns();
	for (i = 0; i < n; i++)
		bad += p[i * PAGE_SZ] != (char)(i + iter + 1);
	*ns += t1 - t0;
	t0 = now_ns();
	if (munmap(p, FAULT_AREA))
		die_errno("munmap");
	*ns += now_ns() - t0;
	return bad;
}

static void fault_child(const struct opts *o, int go, int wfd)
{
	struct fault_report r = { 0 };
	unsigned long it;
	char c;

	if (read(go, &c, 1) < 0)
		_exit(3);
	for (it = 0; it < o->iters; it++) {
		r.bad += fault_round(it, &r.ns);
		r.pages += FAULT_AREA / PAGE_SZ;
	}
	if (write(wfd, &r, sizeof(r)) != sizeof(r))
		_exit(3);
	_exit(r.bad ? 1 : 0);
}

static pid_t fault_pids[64];

static void kill_fault_children(void)
{
	int i;

	for (i = 0; i < 64; i++)
		if (fault_pids[i] > 0) {
			kill(fault_pids[i], SIGKILL);
			waitpid(fault_pids[i], NULL, 0);
		}
}

/* reports from all children; returns the summed per-process rate */
static double fault_collect(const struct opts *o, int rfd)
{
	struct fault_report r;
	double rate = 0;
	unsigned long bad = 0;
	int i, got = 0, status;

	for (i = 0; i < o->procs; i++) {
		if (read(rfd, &r, sizeof(r)) != sizeof(r))
			break;
		got++;
		bad += r.bad;
		rate += r.pages / (r.ns / 1e9);
	}
	for (i = 0; i < o->procs; i++) {
		if (waitpid(fault_pids[i], &status, 0) != fault_pids[i])
			die_errno("waitpid");
		fault_pids[i] = 0;
		if (!WIFEXITED(status) || WEXITSTATUS(status))
			comment("child %d: status 0x%x", i, status);
	}
	if (got != o->procs)
		verify_failed("%d of %d children reported", got, o->procs);
	if (bad)
		verify_failed("%lu pages did not read back their byte", bad);
	return rate;
}

static int run_fault(const struct opts *o)
{
	int go[2], res[2], i;
	double rate;

	if (pipe(go) || pipe(res))
		die_errno("pipe");
	atexit(kill_fault_children);
	for (i = 0; i < o->procs; i++) {
		fault_pids[i] = fork();
		if (fault_pids[i] < 0)
			die_errno("fork");
		if (!fault_pids[i]) {
			bench_child = 1;
			close(go[1]);
			close(res[0]);
			fault_child(o, go[0], res[1]);
		}
	}
	close(go[0]);
	close(res[1]);
	close(go[1]);		/* EOF: all children start at once */
	rate = fault_collect(o, res[0]);
	metric("faults_per_sec", rate, "faults/s", "higher");
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o;

	bench_init();
	parse(argc, argv, &o);
	if (o.mode == MODE_FAULT) {
		printf("# sizes: fault %s x %lu iterations, %d procs\n",
		       size_str(FAULT_AREA), o.iters, o.procs);
		run_fault(&o);
	} else {
		printf("# sizes: area %s, %lu steps of %s, %s\n",
		       size_str(o.size), o.steps, size_str(STEP),
		       o.mode == MODE_FREE ? "MADV_FREE + memory.reclaim" : "MADV_DONTNEED");
		run_walk(&o);
	}
	verify_ok();
	return 0;
}
