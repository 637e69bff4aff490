// SPDX-License-Identifier: GPL-2.0
/*
 * bench_uffd_compact: heap compaction as a garbage collector would do it
 * with userfaultfd, moving (UFFDIO_MOVE) or copying (UFFDIO_COPY) every
 * page of a source area to a destination area while mutators keep reading
 * the destination.
 *
 * Threads:
 *  - the compactor moves the chunks (--move-size 4k|64k|2m) in address
 *    order; with --movers N, N compactor threads (the main thread and N-1
 *    more) each start at their own N-th of the area and go on round it, as
 *    the threads of a parallel GC would;
 *  - M mutators read random destination pages for the duration of the
 *    compaction and check each page's pattern (it names the page index);
 *  - the handler reads the userfaultfd (the destination is registered
 *    MISSING) and serves each fault by moving/copying just the faulting
 *    chunk.
 * A chunk is moved once: whoever sets its bit in the "claimed" bitmap moves
 * it and then sets its bit in "done". The handler leaves a fault on a chunk
 * the compactor claimed to the compactor's ioctl, which wakes it (see
 * serve()). EEXIST would mean a chunk was moved twice: counted, tolerated
 * page by page, and caught by the final check.
 *
 * fault latency: measured in the mutators, the same way for both modes. A
 * mutator notes whether the page's chunk was "done" before it reads it; a
 * read of a chunk that was not done blocks in the kernel until the chunk is
 * moved (by the handler, or by the compactor if it had claimed it), so its
 * read time, from before the load to the value in hand, is one fault
 * latency sample. (A read can race with the end of a move and be counted
 * with a tiny latency; random reads make that rare.) The "faults" metric is
 * the number of page-fault events the handler read from the userfaultfd.
 *
 * Copy mode: UFFDIO_COPY from the source, then MADV_DONTNEED of the source
 * chunk. Move mode: UFFDIO_MOVE (mode 0, or ALLOW_SRC_HOLES with
 * --src-holes). The areas are 2 MiB aligned; --backing says what folios
 * the source is made of: 4k (MADV_NOHUGEPAGE), 64k (64 KiB mTHPs only,
 * MADV_HUGEPAGE) or 2m (THPs, MADV_HUGEPAGE, so a whole-PMD move moves the
 * THP); by default 2m for 2m chunks, else 4k. "dst_large_pct" is the share
 * of destination pages in large folios after the compaction (kpageflags):
 * what a move kept of the source's large folios.
 *
 * --mutators 0: the compactor alone, without the cross-CPU TLB flushes
 * that mutator threads on other CPUs make expensive under TCG.
 *
 * Flushes: "full_flushes" counts the whole-address-space TLB flushes that
 * the CPUs did during the compaction (tlb:tlb_flush, see bench.h), and
 * "tlb_ipis"/"call_ipis" the TLB shootdown and function-call interrupts
 * (/proc/interrupts), all three the whole guest's.  Two movers batching in
 * one mm must not turn each other's ranged flushes into full ones.
 * "chunks_per_s_per_mover": the chunks moved by the compactor threads
 * over their number and the time.
 *
 * Verify: every destination page holds its pattern, every source page
 * reads zero, every chunk was moved, no mutator read a wrong value.
 */
#include <getopt.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <linux/kernel-page-flags.h>
#include <linux/userfaultfd.h>

#include "bench.h"

#define SEED		0x2b
#define MAX_MUTATORS	16
#define MAX_MOVERS	8
#define USAGE		"usage: %s [--quick|--full] [--mode move|copy] " \
			"[--move-size 4k|64k|2m] [--backing 4k|64k|2m] " \
			"[--mutators M] [--movers N] [--src-holes] [--size BYTES]\n"

enum mode { MODE_MOVE, MODE_COPY };

struct opts {
	size_t size, chunk, backing;
	enum mode mode;
	int mutators;
	int movers;
	int src_holes;
};

struct mutator {
	pthread_t tid;
	int id;
	uint32_t *lat;		/* ns, one per read of a chunk not done */
	unsigned long nlat, cap, dropped, reads, bad;
};

static struct {
	struct opts o;
	char *src, *dst;
	unsigned long nchunks, npages;
	int uffd, stop_fd;
	uint64_t *claimed, *done;
	int go, stop, ready;			/* atomics */
	unsigned long events, by_handler, by_movers, eexist;	/* atomics */
	struct mutator mut[MAX_MUTATORS];
} g;

/* ---- options ----------------------------------------------------------- */

static void parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		SIZE_OPTIONS,
		{ "mode", required_argument, NULL, 'm' },
		{ "move-size", required_argument, NULL, 's' },
		{ "backing", required_argument, NULL, 'b' },
		{ "mutators", required_argument, NULL, 'M' },
		{ "movers", required_argument, NULL, 'N' },
		{ "src-holes", no_argument, NULL, 'H' },
		{ "size", required_argument, NULL, 'S' },
		{ NULL, 0, NULL, 0 },
	};
	enum bench_size sz = SIZE_DEFAULT;
	size_t size = 0;
	int c;

	memset(o, 0, sizeof(*o));
	o->chunk = PAGE_SZ;
	o->mutators = 2;
	o->movers = 1;
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		if (size_option(c, &sz))
			continue;
		switch (c) {
		case 'm':
			if (!strcmp(optarg, "move"))
				o->mode = MODE_MOVE;
			else if (!strcmp(optarg, "copy"))
				o->mode = MODE_COPY;
			else
				usage_exit(USAGE, argv[0]);
			break;
		case 's':
			o->chunk = parse_size(optarg);
			break;
		case 'b':
			o->backing = parse_size(optarg);
			break;
		case 'M':
			o->mutators = atoi(optarg);
			break;
		case 'N':
			o->movers = atoi(optarg);
			break;
		case 'H':
			o->src_holes = 1;
			break;
		case 'S':
			size = parse_size(optarg) & ~(PMD_SZ - 1);
			if (!size)
				usage_exit(USAGE, argv[0]);
			break;
		default:
			usage_exit(USAGE, argv[0]);
		}
	}
	if (o->chunk != PAGE_SZ && o->chunk != 64 * KiB && o->chunk != PMD_SZ)
		usage_exit(USAGE, argv[0]);
	if (!o->backing)
		o->backing = o->chunk == PMD_SZ ? PMD_SZ : PAGE_SZ;
	if (o->backing != PAGE_SZ && o->backing != 64 * KiB &&
	    o->backing != PMD_SZ)
		usage_exit(USAGE, argv[0]);
	if (o->mutators < 0 || o->mutators > MAX_MUTATORS ||
	    o->movers < 1 || o->movers > MAX_MOVERS)
		usage_exit(USAGE, argv[0]);
	o->size = sz == SIZE_QUICK ? 4 * MiB :
		  sz == SIZE_FULL ? 512 * MiB : 16 * MiB;
	if (size)
		o->size = size;
}

/* ---- bitmaps ------------------------------------------------------------ */

static int test_and_set(uint64_t *map, unsigned long bit)
{
	uint64_t mask = 1ULL << (bit % 64);

	return !!(__atomic_fetch_or(&map[bit / 64], mask, __ATOMIC_ACQ_REL) &
		  mask);
}

static int test_bit(uint64_t *map, unsigned long bit)
{
	return !!(__atomic_load_n(&map[bit / 64], __ATOMIC_ACQUIRE) &
		  (1ULL << (bit % 64)));
}

static void set_bit(uint64_t *map, unsigned long bit)
{
	__atomic_fetch_or(&map[bit / 64], 1ULL << (bit % 64), __ATOMIC_RELEASE);
}

static void count(unsigned long *ctr)
{
	__atomic_fetch_add(ctr, 1, __ATOMIC_RELAXED);
}

/* ---- userfaultfd --------------------------------------------------------- */

static int uffd_new(void)
{
	int fd = syscall(__NR_userfaultfd, O_CLOEXEC | O_NONBLOCK), dev;

	if (fd >= 0)
		return fd;
	if (errno == ENOSYS)
		skip("kernel without userfaultfd");
	if (errno != EPERM)
		die_errno("userfaultfd");
	dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	if (dev < 0)
		skip("userfaultfd: EPERM and no /dev/userfaultfd");
	fd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
	close(dev);
	if (fd < 0)
		die_errno("USERFAULTFD_IOC_NEW");
	return fd;
}

/* a userfaultfd with its API handshake done; features 0 asks what exists */
static int uffd_open(uint64_t features, uint64_t *supported)
{
	struct uffdio_api api = { .api = UFFD_API, .features = features };
	int fd = uffd_new();

	if (ioctl(fd, UFFDIO_API, &api))
		die_errno("UFFDIO_API");
	if (supported)
		*supported = api.features;
	return fd;
}

static void uffd_setup(void)
{
	struct uffdio_register reg = {
		.range = { .start = (uintptr_t)g.dst, .len = g.o.size },
		.mode = UFFDIO_REGISTER_MODE_MISSING,
	};
	uint64_t feat, need = g.o.mode == MODE_MOVE ? UFFD_FEATURE_MOVE : 0;
	uint64_t ioc = g.o.mode == MODE_MOVE ? 1ULL << _UFFDIO_MOVE :
					       1ULL << _UFFDIO_COPY;
	int probe = uffd_open(0, &feat);

	close(probe);
	if ((feat & need) != need)
		skip("UFFDIO_API: no UFFD_FEATURE_MOVE (no UFFDIO_MOVE)");
	g.uffd = uffd_open(need, NULL);
	if (ioctl(g.uffd, UFFDIO_REGISTER, &reg))
		die_errno("UFFDIO_REGISTER");
	if ((reg.ioctls & ioc) != ioc)
		skip("destination range does not offer UFFDIO_%s",
		     g.o.mode == MODE_MOVE ? "MOVE" : "COPY");
}

/*
 * one ioctl over [off, off + len) of the chunk's range; returns the bytes
 * handled (0: retry), dies on unexpected errors
 */
static unsigned long move_some(unsigned long off, unsigned long len)
{
	struct uffdio_move mv = {
		.dst = (uintptr_t)g.dst + off, .src = (uintptr_t)g.src + off,
		.len = len,
		.mode = g.o.src_holes ? UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES : 0,
	};
	struct uffdio_copy cp = {
		.dst = (uintptr_t)g.dst + off, .src = (uintptr_t)g.src + off,
		.len = len,
	};
	int ret, err;
	int64_t did;

	if (g.o.mode == MODE_MOVE)
		ret = ioctl(g.uffd, UFFDIO_MOVE, &mv);
	else
		ret = ioctl(g.uffd, UFFDIO_COPY, &cp);
	if (!ret)
		return len;
	err = errno;
	did = g.o.mode == MODE_MOVE ? mv.move : cp.copy;
	if (err == EAGAIN)
		return did > 0 ? (unsigned long)did : 0;
	if (err == EEXIST) {
		count(&g.eexist);
		return did > 0 ? (unsigned long)did : PAGE_SZ;
	}
	die("UFFDIO_%s at offset %#lx: %s",
	    g.o.mode == MODE_MOVE ? "MOVE" : "COPY", off, strerror(err));
}

static void move_chunk(unsigned long c)
{
	unsigned long off = c * g.o.chunk, done = 0;

	while (done < g.o.chunk)
		done += move_some(off + done, g.o.chunk - done);
	if (g.o.mode == MODE_COPY &&
	    madvise(g.src + off, g.o.chunk, MADV_DONTNEED))
		die_errno("madvise(MADV_DONTNEED) source chunk");
	set_bit(g.done, c);
}

/* ---- handler --------------------------------------------------------------- */

/*
 * A fault on a chunk someone else claimed needs nothing from us: the
 * claimer's ioctl (without DONTWAKE) wakes every fault waiting in its range
 * once the PTEs are in, and a fault queued after that sees them present and
 * does not wait. Waking a chunk already done covers a stale event.
 */
static void serve(uintptr_t addr)
{
	unsigned long c = (addr - (uintptr_t)g.dst) / g.o.chunk;
	struct uffdio_range r = {
		.start = (uintptr_t)g.dst + c * g.o.chunk, .len = g.o.chunk,
	};

	if (c >= g.nchunks)
		die("fault at %#lx outside the destination", (unsigned long)addr);
	if (!test_and_set(g.claimed, c)) {
		count(&g.by_handler);
		move_chunk(c);
		return;
	}
	if (test_bit(g.done, c) && ioctl(g.uffd, UFFDIO_WAKE, &r))
		die_errno("UFFDIO_WAKE");
}

static void *handler(void *arg)
{
	struct pollfd pfd[2] = {
		{ .fd = g.uffd, .events = POLLIN },
		{ .fd = g.stop_fd, .events = POLLIN },
	};
	struct uffd_msg msg[16];
	ssize_t n, i;

	for (;;) {
		if (poll(pfd, 2, -1) < 0 && errno != EINTR)
			die_errno("poll");
		if (pfd[1].revents)
			return NULL;
		n = read(g.uffd, msg, sizeof(msg));
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (n < 0)
			die_errno("read userfaultfd");
		for (i = 0; i < n / (ssize_t)sizeof(msg[0]); i++) {
			if (msg[i].event != UFFD_EVENT_PAGEFAULT)
				die("unexpected uffd event %u", msg[i].event);
			count(&g.events);
			serve(msg[i].arg.pagefault.address);
		}
	}
}

/* ---- mutators ---------------------------------------------------------------- */

static void mutator_read(struct mutator *m, unsigned long pg)
{
	unsigned long c = pg * PAGE_SZ / g.o.chunk;
	int was_done = test_bit(g.done, c);
	uint64_t t0, t1, v;

	t0 = now_ns();
	v = __atomic_load_n((uint64_t *)(g.dst + pg * PAGE_SZ), __ATOMIC_RELAXED);
	t1 = now_ns();
	m->reads++;
	if (v != pattern(SEED, pg))
		m->bad++;
	if (was_done)
		return;
	if (m->nlat < m->cap)
		m->lat[m->nlat++] = t1 - t0 > UINT32_MAX ? UINT32_MAX : t1 - t0;
	else
		m->dropped++;
}

static void *mutator(void *arg)
{
	struct mutator *m = arg;
	uint64_t rnd = 0x1234567ULL * (m->id + 1);

	__atomic_fetch_add(&g.ready, 1, __ATOMIC_ACQ_REL);
	while (!__atomic_load_n(&g.go, __ATOMIC_ACQUIRE))
		;
	while (!__atomic_load_n(&g.stop, __ATOMIC_ACQUIRE))
		mutator_read(m, xorshift64(&rnd) % g.npages);
	return NULL;
}

static void start_threads(pthread_t *htid)
{
	int i;

	for (i = 0; i < g.o.mutators; i++) {
		struct mutator *m = &g.mut[i];

		m->id = i;
		m->cap = (g.npages < (1UL << 20) ? g.npages : 1UL << 20) + 4096;
		m->lat = malloc(m->cap * sizeof(*m->lat));
		if (!m->lat)
			die("malloc");
		memset(m->lat, 0, m->cap * sizeof(*m->lat));	/* no faults later */
		if (pthread_create(&m->tid, NULL, mutator, m))
			die("pthread_create");
	}
	if (pthread_create(htid, NULL, handler, NULL))
		die("pthread_create");
	while (__atomic_load_n(&g.ready, __ATOMIC_ACQUIRE) < g.o.mutators)
		usleep(1000);
}

static void stop_threads(pthread_t htid)
{
	uint64_t one = 1;
	int i;

	__atomic_store_n(&g.stop, 1, __ATOMIC_RELEASE);
	for (i = 0; i < g.o.mutators; i++)
		pthread_join(g.mut[i].tid, NULL);
	if (write(g.stop_fd, &one, sizeof(one)) != sizeof(one))
		die_errno("eventfd write");
	pthread_join(htid, NULL);
}

/* ---- setup, run, check ---------------------------------------------------------- */

static void setup_areas(void)
{
	int adv = g.o.backing == PAGE_SZ ? MADV_NOHUGEPAGE : MADV_HUGEPAGE;
	unsigned long i, words = (g.nchunks + 63) / 64;

	if (g.o.backing == 64 * KiB)
		mthp64_only("madvise");

	g.src = map_aligned(g.o.size, PMD_SZ, 0);
	g.dst = map_aligned(g.o.size, PMD_SZ, 0);
	do_madvise(g.src, g.o.size, adv, "src");
	do_madvise(g.dst, g.o.size, adv, "dst");
	for (i = 0; i < g.npages; i++)
		*(uint64_t *)(g.src + i * PAGE_SZ) = pattern(SEED, i);
	g.claimed = calloc(words, sizeof(uint64_t));
	g.done = calloc(words, sizeof(uint64_t));
	if (!g.claimed || !g.done)
		die("calloc");
	g.stop_fd = eventfd(0, EFD_CLOEXEC);
	if (g.stop_fd < 0)
		die_errno("eventfd");
	comment("source filled: VmRSS %ld kB, AnonHugePages %ld kB",
		status_kb(0, "VmRSS"), smaps_rollup_kb("AnonHugePages"));
}

/* Compactor thread @arg: from its own N-th of the area round to it */
static void *mover(void *arg)
{
	unsigned long start = (uintptr_t)arg * g.nchunks / g.o.movers, i;

	for (i = 0; i < g.nchunks; i++) {
		unsigned long c = (start + i) % g.nchunks;

		if (!test_and_set(g.claimed, c)) {
			count(&g.by_movers);
			move_chunk(c);
		}
	}
	return NULL;
}

static double compact(void)
{
	pthread_t tid[MAX_MOVERS];
	uint64_t t0 = now_ns();
	int i;

	__atomic_store_n(&g.go, 1, __ATOMIC_RELEASE);
	for (i = 1; i < g.o.movers; i++)
		if (pthread_create(&tid[i], NULL, mover, (void *)(uintptr_t)i))
			die("pthread_create");
	mover(0);
	for (i = 1; i < g.o.movers; i++)
		pthread_join(tid[i], NULL);
	return (now_ns() - t0) / 1e6;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* median and p99 of all mutators' samples, in us */
static unsigned long latencies(double *p50, double *p99)
{
	unsigned long n = 0, i, k = 0;
	uint32_t *all;
	int t;

	for (t = 0; t < g.o.mutators; t++)
		n += g.mut[t].nlat;
	if (!n)
		return 0;
	all = malloc(n * sizeof(*all));
	if (!all)
		die("malloc");
	for (t = 0; t < g.o.mutators; t++)
		for (i = 0; i < g.mut[t].nlat; i++)
			all[k++] = g.mut[t].lat[i];
	qsort(all, n, sizeof(*all), cmp_u32);
	*p50 = all[n / 2] / 1e3;
	*p99 = all[n * 99 / 100] / 1e3;
	free(all);
	return n;
}

static void check(void)
{
	unsigned long i, dst_bad = 0, src_bad = 0, undone = 0, bad = 0;
	int t;

	for (t = 0; t < g.o.mutators; t++)
		bad += g.mut[t].bad;
	for (i = 0; i < g.nchunks; i++)
		undone += !test_bit(g.done, i);
	for (i = 0; i < g.npages; i++) {
		dst_bad += *(uint64_t *)(g.dst + i * PAGE_SZ) !=
			   pattern(SEED, i);
		src_bad += *(uint64_t *)(g.src + i * PAGE_SZ) != 0;
	}
	if (g.eexist)
		comment("EEXIST from %lu ioctls", g.eexist);
	if (bad)
		verify_failed("mutators read %lu wrong values", bad);
	if (undone)
		verify_failed("%lu chunks never moved", undone);
	if (dst_bad)
		verify_failed("%lu destination pages lack their data", dst_bad);
	if (src_bad)
		verify_failed("%lu source pages not empty after the %s",
			      src_bad, g.o.mode == MODE_MOVE ? "move" : "copy");
}

/* % of the destination's pages in large folios (kpageflags THP) */
static double dst_large_pct(void)
{
	int pm = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	int kf = open("/proc/kpageflags", O_RDONLY | O_CLOEXEC);
	unsigned long i, large = 0;
	uint64_t pfn;

	if (pm < 0 || kf < 0)
		die_errno("open pagemap/kpageflags (root)");
	for (i = 0; i < g.npages; i++) {
		pfn = pagemap_pfn(pm, g.dst + i * PAGE_SZ);
		large += pfn && (kpageflags(kf, pfn) & (1ULL << KPF_THP));
	}
	close(pm);
	close(kf);
	return 100.0 * large / g.npages;
}

static void report(double ms, long long pgalloc, const struct flush_counts *f)
{
	unsigned long reads = 0, dropped = 0, n;
	double p50, p99;
	int t;

	for (t = 0; t < g.o.mutators; t++) {
		reads += g.mut[t].reads;
		dropped += g.mut[t].dropped;
	}
	n = latencies(&p50, &p99);
	comment("mutators: %lu reads, %lu latency samples (%lu dropped)",
		reads, n, dropped);
	comment("handler moved %lu of %lu chunks", g.by_handler, g.nchunks);
	metric("compactor_ms", ms, "ms", "lower");
	metric("chunks_per_s_per_mover", g.by_movers / (ms / 1e3) / g.o.movers,
	       "chunks/s", "higher");
	/* no sample is no number: a 0 would enter the median as a measurement */
	if (n) {
		metric("fault_latency_median_us", p50, "us", "lower");
		metric("fault_latency_p99_us", p99, "us", "lower");
	} else {
		comment("no mutator read hit a chunk not yet moved: no latency this run");
	}
	metric("faults", g.events, "count", "lower");
	flush_counts_report(f, "", "", 1);
	metric("pgalloc", pgalloc, "pages", "lower");
	if (g.o.backing != PAGE_SZ)
		metric("dst_large_pct", dst_large_pct(), "%", "higher");
}

int main(int argc, char **argv)
{
	struct flush_counts flushes;
	long long pg0, pg1;
	pthread_t htid;
	double ms;

	bench_init();
	parse(argc, argv, &g.o);
	g.npages = g.o.size / PAGE_SZ;
	g.nchunks = g.o.size / g.o.chunk;
	printf("# sizes: area %s, chunk %s, %s folios, mode %s%s, %d mutators, %d movers\n",
	       size_str(g.o.size), size_str(g.o.chunk), size_str(g.o.backing),
	       g.o.mode == MODE_MOVE ? "move" : "copy",
	       g.o.src_holes ? " (ALLOW_SRC_HOLES)" : "", g.o.mutators, g.o.movers);
	setup_areas();
	uffd_setup();
	start_threads(&htid);
	flush_counts_start(&flushes);
	pg0 = vmstat_sum("pgalloc_");
	ms = compact();
	pg1 = vmstat_sum("pgalloc_");
	flush_counts_stop(&flushes);
	stop_threads(htid);
	comment("after compaction: VmRSS %ld kB, AnonHugePages %ld kB",
		status_kb(0, "VmRSS"), smaps_rollup_kb("AnonHugePages"));
	check();
	report(ms, pg1 - pg0, &flushes);
	verify_ok();
	return 0;
}
