// SPDX-License-Identifier: GPL-2.0
/*
 * cow_pte_diff: the differential test of COW page tables.  Each seed is a
 * random sequence of operations over a few processes (fork, exit, writes,
 * reads, madvise, mprotect, mremap, munmap + MAP_FIXED) on an area of a
 * few PTE tables, and after each operation a line of what the process can
 * observe (the syscall's result and errno, a checksum of the area, pagemap's
 * present and swap bits, RssAnon and VmSwap).  The same sequence runs with
 * vm.cow_pte=0 (fork copies every table, as vanilla) and with vm.cow_pte=2
 * (every fork shares): the two transcripts must be equal.  A difference
 * prints the seed, the step and both lines.
 *
 * The sequence is deterministic: one process runs at a time (a token passed
 * through pipes; the next actor is drawn from the seed), every process runs
 * on CPU 0 (so that the LRU batches MADV_PAGEOUT drains are this CPU's),
 * and the transcript holds nothing that differs run to run on one kernel.
 *
 * What may differ, and why (the short list of issue 27):
 *  - PageTables, VmPTE, the cow_pte_* counters: not read here.
 *  - VmRSS: it adds the file and shmem pages of the process, among them
 *    those of the transcript's MAP_SHARED buffer, which fault-around maps
 *    by the dozen once an earlier run put them in the page cache.  RssAnon
 *    and VmSwap are compared, as deltas from what the sequence's first
 *    process inherits from this runner (which varies); they are read from
 *    per-CPU counters with up to a batch per CPU not folded in, exact here
 *    because both runs update them in the same order, on one CPU.
 *
 * With -x the sequences also move pages between the two NUMA nodes
 * (move_pages(MPOL_MF_MOVE), which vanilla refuses, -EACCES, for a page
 * another process maps) and bind ranges to a node (mbind(MPOL_BIND,
 * MPOL_MF_MOVE), which splits VMAs and skips such pages), and each line
 * also says how many present pages sit on node 1.  NUMA balancing is off
 * for the run: it moves pages on its own.
 *
 * With -e the sequences also make a table of one THP mapped by PTEs
 * (fresh memory, MADV_HUGEPAGE, written whole, one page write-protected
 * and back, which splits the PMD, then MADV_NOHUGEPAGE, which keeps
 * khugepaged from collapsing it at a time of its own; the line says if the
 * THP came), move ranges out with UFFDIO_MOVE into a scratch area each
 * process registers (the area itself is never registered: an armed VMA is
 * never shared), and run one step in four (not forks and exits) on a
 * second thread of the process.
 * A THP allocation may fail now and then on any kernel: a seed whose runs
 * differ first in whether a THP came runs again, up to THP_RUNS times
 * (seen once in 400 seeds: a THP that did not come with vm.cow_pte=0,
 * and came in each of three runs of the seed after).
 * Without -x and -e a seed is the same sequence it always was (seeds
 * 1-3500 compared equal on the series).
 *
 * Usage: cow_pte_diff [-n SEEDS] [-s FIRST_SEED] [-S STEPS] [-a MODE]
 *		       [-b MODE] [-x] [-e] [-v]
 * (-a/-b: the two values of vm.cow_pte, 0 and 2 by default; -x: the NUMA
 * operations too; -e: THP, UFFDIO_MOVE and threads too; -v: print each
 * transcript.)
 * KTAP: one case; exit 0 if every seed matched.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <numaif.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "guest_util.h"

#define TABLES		4
#define AREA		(TABLES * SZ_2M)
#define PAGES		(AREA / PAGE_SIZE)
#define MAXP		4		/* processes alive at once */
#define LOG_SIZE	(4 * SZ_1M)	/* one sequence's transcript */
#define PER_TABLE	512
#define SEQUENCE_MS	60000
#define ARRAY_SIZE(a)	(sizeof(a) / sizeof((a)[0]))

/* What every process of a sequence shares: MAP_SHARED, set up before fork */
struct ctl {
	unsigned long rng;		/* the sequence's random state */
	int step, steps;
	bool alive[MAXP];
	pid_t exiting;			/* passed the token, then exits */
	bool done;
	long base[2];			/* RssAnon, VmSwap of p0 at start */
	size_t len;			/* of log[] */
	char log[];
};

static struct ctl *ctl;
static int tok[MAXP][2];		/* a process waits on tok[slot][0] */
static int slot;			/* this process's */
static char *area, *scratch;
static char *uscratch;			/* -e: UFFDIO_MOVE's destination */
static int uffd = -1;			/* this process's, registered there */
static pid_t uffd_pid;			/* whose uffd is open */
static bool numa_ops;			/* -x */
static bool extra_ops;			/* -e */
static void *pages_of[PAGES];		/* move_pages()' arguments */
static int nodes_of[PAGES], status_of[PAGES];
/* Each process its own copy: what it may do with each page of the area */
enum { UNMAPPED, WRITABLE, READ_ONLY };
static unsigned char prot[PAGES];

/*
 * prot[] from /proc/self/maps: after a fork (MADV_DONTFORK holes), and
 * after an mprotect() or mremap() that failed halfway (mprotect() changes
 * the VMAs up to a hole, then fails with ENOMEM).
 */
static void sync_prot(void)
{
	unsigned long a = (unsigned long)area, start, end;
	char line[256], r, w;
	FILE *f = fopen("/proc/self/maps", "r");

	memset(prot, UNMAPPED, sizeof(prot));
	while (f && fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%lx-%lx %c%c", &start, &end, &r, &w) != 4)
			continue;
		if (end <= a || start >= a + AREA || r != 'r')
			continue;
		start = start > a ? start : a;
		end = end < a + AREA ? end : a + AREA;
		memset(prot + (start - a) / PAGE_SIZE,
		       w == 'w' ? WRITABLE : READ_ONLY,
		       (end - start) / PAGE_SIZE);
	}
	if (f)
		fclose(f);
}

static unsigned long rnd(unsigned long n)
{
	ctl->rng ^= ctl->rng << 13;
	ctl->rng ^= ctl->rng >> 7;
	ctl->rng ^= ctl->rng << 17;
	return ctl->rng % n;
}

static void say(const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(ctl->log + ctl->len, LOG_SIZE - ctl->len, fmt, ap);
	va_end(ap);
	if (n > 0 && ctl->len + n < LOG_SIZE)
		ctl->len += n;
}

/* move_pages() of [first, first + n) to @node (-1: only ask where they are) */
static long move(unsigned long first, unsigned long n, int node)
{
	for (unsigned long i = 0; i < n; i++) {
		pages_of[i] = area + (first + i) * PAGE_SIZE;
		nodes_of[i] = node;
		status_of[i] = INT_MIN;		/* not reached by the call */
	}
	return syscall(SYS_move_pages, 0, n, pages_of, node < 0 ? NULL : nodes_of,
		       status_of, MPOL_MF_MOVE);
}

/* Present pages of the area on node 1 (move_pages() asks without faulting) */
static unsigned long on_node1(void)
{
	unsigned long count = 0;

	if (move(0, PAGES, -1))
		return -1UL;
	for (unsigned long i = 0; i < PAGES; i++)
		count += prot[i] != UNMAPPED && status_of[i] == 1;
	return count;
}

/*
 * What this process can observe of the area without changing it: pagemap's
 * present and swap bits, and a checksum (FNV-1a) of the first and last word
 * of each page pagemap says is present.  Reading a page that is not present
 * would fault, and a fault under a shared table breaks it: only OP_READ
 * reads every page of its range.
 */
static void observe(void)
{
	unsigned long h = 14695981039346656037UL, present = 0, swapped = 0;
	int fd = open("/proc/self/pagemap", O_RDONLY);
	uint64_t e[PER_TABLE];

	for (unsigned long i = 0; fd >= 0 && i < PAGES; i += PER_TABLE) {
		off_t off = ((unsigned long)area / PAGE_SIZE + i) * 8;

		if (pread(fd, e, sizeof(e), off) != sizeof(e))
			break;
		for (unsigned long j = 0; j < PER_TABLE; j++) {
			unsigned long *w = (unsigned long *)(area + (i + j) * PAGE_SIZE);

			swapped += !!(e[j] & PM_SWAP);
			if (!(e[j] & PM_PRESENT) || prot[i + j] == UNMAPPED)
				continue;
			present++;
			h = (h ^ load_word(w)) * 1099511628211UL;
			h = (h ^ load_word(w + 511)) * 1099511628211UL;
		}
	}
	if (fd >= 0)
		close(fd);
	say(" sum=%016lx present=%lu swapped=%lu", h, present, swapped);
	if (numa_ops)
		say(" node1=%lu", on_node1());
	say(" anon=%ld swap=%ld", status_kb("RssAnon:") - ctl->base[0],
		    status_kb("VmSwap:") - ctl->base[1]);
	say("\n");
}

static void result(long ret)
{
	say(" ret=%ld errno=%d", ret, ret < 0 ? errno : 0);
}

/* A random page range [*first, *first + *n) of the area */
static void range(unsigned long *first, unsigned long *n)
{
	static const unsigned long sizes[] = { 1, 7, 64, 511, 512, 1024 };

	*n = sizes[rnd(ARRAY_SIZE(sizes))];
	/* whole tables half the time: shares dropped rather than broken */
	if (*n >= PER_TABLE && rnd(2))
		*first = rnd(TABLES - *n / PER_TABLE + 1) * PER_TABLE;
	else
		*first = rnd(PAGES - *n + 1);
}

enum op {
	OP_WRITE, OP_READ, OP_FORK, OP_EXIT, OP_DONTNEED, OP_FREE, OP_COLD,
	OP_PAGEOUT, OP_DONTFORK, OP_DOFORK, OP_NOHUGEPAGE, OP_PROTECT,
	OP_UNPROTECT, OP_MREMAP, OP_MAP_FIXED, OP_MOVE_PAGES, OP_MBIND, OP_THP,
	OP_UFFD_MOVE, NR_OPS
};

static const char * const op_names[NR_OPS] = {
	"write", "read", "fork", "exit", "dontneed", "free", "cold", "pageout",
	"dontfork", "dofork", "nohugepage", "mprotect-ro", "mprotect-rw",
	"mremap", "map-fixed", "move-pages", "mbind", "thp", "uffd-move",
};

static const int advice[NR_OPS] = {
	[OP_DONTNEED] = MADV_DONTNEED, [OP_FREE] = MADV_FREE,
	[OP_COLD] = MADV_COLD, [OP_PAGEOUT] = MADV_PAGEOUT,
	[OP_DONTFORK] = MADV_DONTFORK, [OP_DOFORK] = MADV_DOFORK,
	[OP_NOHUGEPAGE] = MADV_NOHUGEPAGE,
};

static int free_slot(void)
{
	for (int i = 0; i < MAXP; i++)
		if (!ctl->alive[i])
			return i;
	return -1;
}

static void pass_token(void);

/* What a process may be drawn to do: forks and writes weigh three times */
static const unsigned char base_ops[] = {
	OP_WRITE, OP_WRITE, OP_WRITE, OP_FORK, OP_FORK, OP_FORK,
	OP_READ, OP_EXIT, OP_DONTNEED, OP_FREE, OP_COLD, OP_PAGEOUT,
	OP_DONTFORK, OP_DOFORK, OP_NOHUGEPAGE, OP_PROTECT, OP_UNPROTECT,
	OP_MREMAP, OP_MAP_FIXED,
};
static const unsigned char numa_only_ops[] = { OP_MOVE_PAGES, OP_MOVE_PAGES, OP_MBIND };
static const unsigned char extra_only_ops[] = { OP_THP, OP_UFFD_MOVE, OP_UFFD_MOVE };

static enum op pick_op(void)
{
	unsigned char ops[sizeof(base_ops) + sizeof(numa_only_ops) +
			  sizeof(extra_only_ops)];
	size_t nr = sizeof(base_ops);

	memcpy(ops, base_ops, nr);
	if (numa_ops) {
		memcpy(ops + nr, numa_only_ops, sizeof(numa_only_ops));
		nr += sizeof(numa_only_ops);
	}
	if (extra_ops) {
		memcpy(ops + nr, extra_only_ops, sizeof(extra_only_ops));
		nr += sizeof(extra_only_ops);
	}
	return ops[rnd(nr)];
}

#define USCRATCH	(2 * SZ_2M)	/* the longest range() */

/*
 * This process's userfaultfd, registered over uscratch: a child's VMAs
 * lose the parent's registration at fork (no UFFD_FEATURE_EVENT_FORK), so
 * each process opens its own on its first move.  -errno if it cannot.
 */
static int own_uffd(void)
{
	int ret;

	if (uffd_pid == getpid())
		return uffd;
	if (uffd >= 0)
		close(uffd);	/* the parent's */
	uffd_pid = getpid();
	uffd = uffd_open(UFFD_FEATURE_MOVE);
	if (uffd < 0)
		return uffd;
	ret = uffd_register(uffd, uscratch, USCRATCH,
			    UFFDIO_REGISTER_MODE_MISSING);
	if (ret) {
		close(uffd);
		uffd = ret;
	}
	return uffd;
}

/*
 * UFFDIO_MOVE of @n pages at @p (holes allowed) to uscratch, where what
 * came over is dropped at once: the next move needs holes there.  The
 * ioctl's result (errno kept), and in *@moved what it says it moved.
 */
static long uffd_move_out(char *p, unsigned long n, long *moved)
{
	struct uffdio_move mv = {
		.dst = (unsigned long)uscratch, .src = (unsigned long)p,
		.len = n * PAGE_SIZE, .mode = UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES,
	};
	int fd = own_uffd(), err;
	long ret;

	*moved = 0;
	if (fd < 0) {
		errno = -fd;
		return -1;
	}
	ret = ioctl(fd, UFFDIO_MOVE, &mv);
	err = errno;
	*moved = mv.move;
	madvise(uscratch, USCRATCH, MADV_DONTNEED);
	errno = err;
	return ret;
}

/*
 * A table of one THP mapped by PTEs at @p: fresh memory with MADV_HUGEPAGE
 * written whole (a THP if one can be had), then one page write-protected
 * and back, which splits the PMD.  The line says if the THP came.
 */
static long thp_table(char *p)
{
	unsigned long first = (p - area) / PAGE_SIZE;
	long ret, thp;

	if (mmap(p, SZ_2M, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
		return -1;
	ret = madvise(p, SZ_2M, MADV_HUGEPAGE);
	if (ret)
		return ret;
	for (unsigned long i = first; i < first + PER_TABLE; i++)
		write_tag(area + i * PAGE_SIZE, (unsigned long)ctl->step << 32 | i);
	thp = smaps_kb(p, "AnonHugePages:");
	say(" thp=%d", thp == SZ_2M >> 10);
	ret = mprotect(p + SZ_1M, PAGE_SIZE, PROT_READ);
	ret = ret ?: mprotect(p + SZ_1M, PAGE_SIZE, PROT_READ | PROT_WRITE);
	/*
	 * Out of khugepaged's way: it would collapse the table into a THP
	 * again at a time of its own, and a sequence must not depend on when
	 * (seed 1181 of -x -e once moved the collapsed THP's page, exclusive,
	 * where the other run's was still shared).
	 */
	return ret ?: madvise(p, SZ_2M, MADV_NOHUGEPAGE);
}

struct step {
	enum op op;
	unsigned long first, n;
};

/* A step other than a fork or an exit, then what the process observes */
static void perform(struct step *st)
{
	unsigned long first = st->first, n = st->n;
	unsigned long mask, refused = 0, moved = 0;
	char *p = area + first * PAGE_SIZE;
	long ret, count;
	int node;

	switch (st->op) {
	case OP_WRITE:
		for (unsigned long i = first; i < first + n; i++)
			if (prot[i] == WRITABLE)
				write_tag(area + i * PAGE_SIZE,
					  (unsigned long)ctl->step << 32 | i);
		break;
	case OP_READ:
		for (unsigned long i = first; i < first + n; i++)
			if (prot[i] != UNMAPPED)
				load_word((unsigned long *)(area + i * PAGE_SIZE));
		break;
	case OP_PROTECT:
	case OP_UNPROTECT:
		ret = mprotect(p, n * PAGE_SIZE, st->op == OP_PROTECT ? PROT_READ :
				PROT_READ | PROT_WRITE);
		result(ret);
		sync_prot();
		break;
	case OP_MREMAP:
		/* a whole table out to the scratch area and back */
		first &= ~(PER_TABLE - 1);
		p = area + first * PAGE_SIZE;
		ret = (long)mremap(p, SZ_2M, SZ_2M, MREMAP_MAYMOVE | MREMAP_FIXED,
				   scratch);
		if (ret != -1)
			ret = (long)mremap(scratch, SZ_2M, SZ_2M,
					   MREMAP_MAYMOVE | MREMAP_FIXED, p);
		result(ret == -1 ? -1 : 0);
		sync_prot();
		break;
	case OP_MAP_FIXED:
		ret = (long)mmap(p, n * PAGE_SIZE, PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
		result(ret == -1 ? -1 : 0);
		sync_prot();
		break;
	case OP_MOVE_PAGES:
		node = rnd(2);
		ret = move(first, n, node);
		result(ret);
		for (unsigned long i = 0; i < n; i++) {
			refused += status_of[i] == -EACCES;
			moved += status_of[i] == node;
		}
		say(" to=%d on=%lu eacces=%lu", node, moved, refused);
		break;
	case OP_MBIND:
		node = rnd(2);
		mask = 1UL << node;
		result(mbind(p, n * PAGE_SIZE, MPOL_BIND, &mask, sizeof(mask) * 8,
			     MPOL_MF_MOVE));
		say(" to=%d", node);
		break;
	case OP_THP:
		ret = thp_table(area + (first & ~(PER_TABLE - 1)) * PAGE_SIZE);
		result(ret);
		sync_prot();
		break;
	case OP_UFFD_MOVE:
		result(uffd_move_out(p, n, &count));
		say(" moved=%ld", count);
		break;
	default:
		result(madvise(p, n * PAGE_SIZE, advice[st->op]));
		break;
	}
	observe();
}

static void *perform_thread(void *st)
{
	perform(st);
	return NULL;
}

/* One step by this process; false: a child just forked, whose turn it isn't */
static bool do_step(void)
{
	struct step st = { .op = pick_op() };
	pthread_t thread;
	bool threaded;
	long ret;
	int s;

	range(&st.first, &st.n);
	threaded = extra_ops && st.op != OP_FORK && st.op != OP_EXIT && !rnd(4);
	say("%d p%d %s %lu+%lu%s", ctl->step, slot, op_names[st.op], st.first,
	    st.n, threaded ? " (thread)" : "");
	switch (st.op) {
	case OP_FORK:
		s = free_slot();
		if (s >= 0) {
			ctl->alive[s] = true;
			say(" -> p%d", s);
			ret = fork();
			if (ret < 0) {
				ctl->alive[s] = false;
				result(ret);
			} else if (!ret) {
				slot = s;	/* the child waits for its turn */
				sync_prot();
				return false;
			}
		}
		observe();
		return true;
	case OP_EXIT:
		if (slot) {
			observe();
			ctl->alive[slot] = false;
			ctl->exiting = getpid();	/* the next actor waits for it */
			pass_token();
			_exit(0);
		}
		observe();	/* p0 stays: it reaps the others */
		return true;
	default:
		break;
	}
	if (threaded && !pthread_create(&thread, NULL, perform_thread, &st))
		pthread_join(thread, NULL);
	else
		perform(&st);
	return true;
}

static void pass_token(void)
{
	int alive[MAXP], nr = 0;

	if (++ctl->step == ctl->steps)
		ctl->done = true;
	for (int i = 0; i < MAXP; i++)
		if (ctl->alive[i])
			alive[nr++] = i;
	if (ctl->done) {
		for (int i = 0; i < nr; i++)
			if (write(tok[alive[i]][1], "x", 1) != 1)
				_exit(3);
		return;
	}
	if (write(tok[alive[rnd(nr)]][1], "x", 1) != 1)
		_exit(3);
}

/*
 * A process that exits passes the token first: the next actor waits until
 * it is gone, mm and all (exit_mm() comes before the pidfd is woken), or
 * its own step would race the exit's teardown of the area (MADV_PAGEOUT
 * skips a page the exiting process still maps).
 */
static void wait_for_exit(void)
{
	struct pollfd pfd = { .events = POLLIN };

	if (!ctl->exiting)
		return;
	pfd.fd = syscall(SYS_pidfd_open, ctl->exiting, 0);
	ctl->exiting = 0;
	if (pfd.fd < 0)
		return;		/* gone and reaped already */
	poll(&pfd, 1, -1);
	close(pfd.fd);
}

/* Every process of a sequence: its turns until the sequence is done */
static void run(void)
{
	char c;

	for (;;) {
		if (read(tok[slot][0], &c, 1) != 1)
			_exit(4);
		wait_for_exit();
		if (ctl->done)
			break;
		if (do_step())
			pass_token();
	}
	if (slot)
		_exit(0);
}

/*
 * One sequence with vm.cow_pte at @mode ("2\n"; NULL: left as it is); the
 * transcript in ctl->log
 */
static int sequence(unsigned long seed, int steps, const char *mode)
{
	int status, ret = 0;
	pid_t pid;

	if (mode && write_knob(COW_PTE_SYSCTL, mode))
		return -1;
	memset(ctl, 0, sizeof(*ctl));
	ctl->rng = seed * 2654435761UL + 1;
	ctl->steps = steps;
	pid = fork();
	if (pid < 0)
		return -1;
	if (!pid) {
		cpu_set_t cpus;

		/* what p0 inherits from this runner varies: not the area's */
		ctl->base[0] = status_kb("RssAnon:");
		ctl->base[1] = status_kb("VmSwap:");
		setpgid(0, 0);
		CPU_ZERO(&cpus);
		CPU_SET(0, &cpus);
		sched_setaffinity(0, sizeof(cpus), &cpus);
		prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
		for (int i = 0; i < MAXP; i++)
			if (pipe(tok[i]))
				_exit(5);
		area = map_aligned(AREA, SZ_2M, PROT_READ | PROT_WRITE);
		scratch = map_aligned(SZ_2M, SZ_2M, PROT_READ | PROT_WRITE);
		if (extra_ops)
			uscratch = map_aligned(USCRATCH, SZ_2M,
					       PROT_READ | PROT_WRITE);
		if (!area || !scratch || (extra_ops && !uscratch) ||
		    madvise(area, AREA, MADV_NOHUGEPAGE))
			_exit(6);
		sync_prot();
		for (unsigned long i = 0; i < PAGES; i += 1 + i % 3)
			write_tag(area + i * PAGE_SIZE, seed << 32 | i);
		slot = 0;
		ctl->alive[0] = true;
		if (write(tok[0][1], "x", 1) != 1)
			_exit(7);
		run();
		while (wait(NULL) > 0)
			;
		_exit(0);
	}
	/* a process of the sequence killed by a signal never passes the token */
	for (int ms = 0; waitpid(pid, &status, WNOHANG) == 0; ms += 10) {
		if (ms > SEQUENCE_MS) {
			kill(-pid, SIGKILL);
			waitpid(pid, &status, 0);
			printf("# seed %lu with vm.cow_pte=%s: did not finish in %d ms (a process of it died?)\n",
			       seed, mode ? mode : "as is", SEQUENCE_MS);
			return -1;
		}
		usleep(10 * 1000);
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		ret = -1;
	return ret;
}

static const char *mode_a = "0", *mode_b = "2";

#define THP_RUNS	3	/* runs of a seed whose THPs came in one run only */

/*
 * Do lines @a and @b (@len bytes each) differ only in whether a THP came
 * (" thp=0" against " thp=1")?  A THP allocation may fail now and then on
 * any kernel, vanilla too: not a difference of the two modes.
 */
static bool only_thp_differs(const char *a, const char *b, long len)
{
	for (long i = 0; i < len; i++) {
		if (a[i] == b[i])
			continue;
		if (i < 5 || memcmp(a + i - 5, " thp=", 5) ||
		    memcmp(b + i - 5, " thp=", 5))
			return false;
	}
	return true;
}

/*
 * The first line where @a and @b differ, printed: 1, or 2 if it differs
 * only in a THP allocation; 0 if none
 */
static int compare(unsigned long seed, const char *a, const char *b)
{
	for (int line = 1; *a || *b; line++) {
		const char *ea = strchrnul(a, '\n'), *eb = strchrnul(b, '\n');

		if (ea - a != eb - b || memcmp(a, b, ea - a)) {
			printf("# seed %lu differs at line %d:\n#  cow_pte=%s: %.*s\n#  cow_pte=%s: %.*s\n",
			       seed, line, mode_a, (int)(ea - a), a, mode_b,
			       (int)(eb - b), b);
			return ea - a == eb - b && only_thp_differs(a, b, ea - a) ?
			       2 : 1;
		}
		a = *ea ? ea + 1 : ea;
		b = *eb ? eb + 1 : eb;
	}
	return 0;
}

int main(int argc, char **argv)
{
	unsigned long first = 1, seeds = 200, failed = 0, errors = 0;
	int steps = 40, opt;
	struct knob knobs[] = {
		{ COW_PTE_SYSCTL }, { "/proc/sys/kernel/numa_balancing" },
	};
	char val_a[16], val_b[16], *knob_a = val_a, *knob_b = val_b;
	bool verbose = false;
	char *off;

	while ((opt = getopt(argc, argv, "n:s:S:a:b:xev")) != -1) {
		switch (opt) {
		case 'a': mode_a = optarg; break;
		case 'b': mode_b = optarg; break;
		case 'n': seeds = strtoul(optarg, NULL, 0); break;
		case 's': first = strtoul(optarg, NULL, 0); break;
		case 'S': steps = atoi(optarg); break;
		case 'v': verbose = true; break;
		case 'x': numa_ops = true; break;
		case 'e': extra_ops = true; break;
		default:
			fprintf(stderr, "usage: %s [-n SEEDS] [-s FIRST] [-S STEPS] [-a MODE] [-b MODE] [-x] [-e] [-v]\n",
				argv[0]);
			return 2;
		}
	}
	printf("TAP version 13\n1..1\n");
	/* without the switch, -a X -b X still checks the test's determinism */
	if (!switch_present(COW_PTE_SYSCTL)) {
		if (strcmp(mode_a, mode_b)) {
			printf("ok 1 # SKIP no %s (vanilla kernel?)\n",
			       COW_PTE_SYSCTL);
			return 0;
		}
		knob_a = knob_b = NULL;
	}
	snprintf(val_a, sizeof(val_a), "%s\n", mode_a);
	snprintf(val_b, sizeof(val_b), "%s\n", mode_b);
	ctl = mmap(NULL, sizeof(*ctl) + LOG_SIZE, PROT_READ | PROT_WRITE,
		   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	off = malloc(LOG_SIZE);
	if (ctl == MAP_FAILED || !off) {
		printf("not ok 1 sequences_match # no memory\n");
		return 1;
	}
	save_knob_list(knobs, ARRAY_SIZE(knobs));
	if (numa_ops) {
		if (access("/sys/devices/system/node/node1", F_OK)) {
			printf("ok 1 # SKIP -x: one NUMA node\n");
			return 0;
		}
		/* it moves pages on its own; absent without CONFIG_NUMA_BALANCING */
		write_knob(knobs[1].path, "0\n");
	}
	for (unsigned long seed = first; seed < first + seeds; seed++) {
		int diff = 0;

		/* a THP that came in one run only: the seed runs again */
		for (int run = 0; run < THP_RUNS && (!run || diff == 2); run++) {
			if (run)
				printf("# seed %lu: a THP came in one run only, run %d of %d\n",
				       seed, run + 1, THP_RUNS);
			if (sequence(seed, steps, knob_a)) {
				diff = -1;
				break;
			}
			memcpy(off, ctl->log, ctl->len);
			off[ctl->len] = 0;
			if (sequence(seed, steps, knob_b)) {
				diff = -1;
				break;
			}
			ctl->log[ctl->len] = 0;
			diff = compare(seed, off, ctl->log);
		}
		errors += diff < 0;
		failed += diff > 0;
		if (verbose && diff >= 0)
			printf("# seed %lu:\n%s", seed, ctl->log);
	}
	restore_knob_list(knobs, ARRAY_SIZE(knobs));
	printf("# %lu sequences of %d steps from seed %lu%s%s: %lu differ, %lu did not run\n",
	       seeds, steps, first, numa_ops ? " (-x)" : "",
	       extra_ops ? " (-e)" : "", failed, errors);
	printf("%s 1 sequences_match\n", failed || errors ? "not ok" : "ok");
	printf("# Totals: pass:%d fail:%d xfail:0 xpass:0 skip:0 error:0\n",
	       !(failed || errors), !!(failed || errors));
	return failed || errors;
}
