// SPDX-License-Identifier: GPL-2.0
/*
 * bench_redis: what a snapshot (BGSAVE) of a Redis server costs its
 * clients: the fork (Redis's own latest_fork_usec) and the latency of the
 * requests served while the child writes the snapshot.
 *
 * The guest runs Debian's redis-server (copied from the host with its
 * libraries), listening on a unix socket only, without persistence of its
 * own.  DEBUG POPULATE fills it with K keys of 1 KiB values (Redis turns
 * THP off for itself: 4 KiB pages).  A client thread then sends one request
 * at a time, half GETs and half SETs of random keys (a SET writes a page
 * of the server's heap: after a fork, a first write), and times each.
 * The main thread lets it run alone for a second (the baseline), then asks
 * for SAVES snapshots one after the other, each a BGSAVE followed by
 * INFO persistence polls until it is over.
 *
 * Sizes: K = 50000 / 800000 / 3000000 keys (--quick / default / --full):
 * ~70 MiB / ~1.1 GiB / ~4.1 GiB of server memory (the guest has 8 GiB).  The values of DEBUG
 * POPULATE are zero-padded, so the snapshot file (in /tmp, guest memory)
 * stays small.
 *
 * --cow-pte: Redis does not ask for COW page tables itself, and exec
 * drops the prctl, so the run sets vm.cow_pte to 2 (every fork) where the
 * kernel has it, and restores it at exit.  cow_pte_enabled says which.
 *
 * Metrics: fork_usec (the median of latest_fork_usec over the snapshots),
 * snapshot_p50_us, snapshot_p99_us, snapshot_max_us (requests sent while a
 * snapshot was running), snapshot_ops_per_s, baseline_p99_us, save_ms
 * (median, BGSAVE to its end as INFO reports it).
 *
 * Verify: every snapshot ends with rdb_last_bgsave_status:ok; every reply
 * is the expected one; at the end, a GET of every key the client wrote
 * returns what it wrote last, and of 1000 keys it did not, DEBUG
 * POPULATE's value.
 */
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>

#include "bench.h"

#define SOCK		"/tmp/ptlab-redis.sock"
#define RDB		"ptlab-bench.rdb"	/* in /tmp */
#define VALUE_SIZE	1024
#define SAVES		3
#define MAX_SAMPLES	(2UL << 20)
#define USAGE		"usage: %s [--quick|--full] [--keys N] [--cow-pte]\n"

struct opts {
	unsigned long keys;
	int cow_pte;
};

/* ---- a minimal RESP client: one request at a time ------------------ */

struct conn {
	int fd;
	int client;		/* the client thread's: a failure ends the thread */
	size_t off, len;
	char buf[1 << 20];
};

static struct conn *conn_open(int tries)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct conn *c = calloc(1, sizeof(*c));

	if (!c)
		die("calloc");
	strcpy(sa.sun_path, SOCK);
	for (; tries > 0; tries--) {
		c->fd = socket(AF_UNIX, SOCK_STREAM, 0);
		if (c->fd < 0)
			die_errno("socket");
		if (!connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)))
			return c;
		close(c->fd);
		usleep(100 * 1000);
	}
	free(c);
	return NULL;
}

static char client_error[160];

/* the connection broke: the main thread dies, the client thread stops */
static void __noreturn __printf(2, 3) conn_fail(struct conn *c, const char *fmt, ...)
{
	char buf[sizeof(client_error)];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (!c->client)
		die("%s", buf);
	memcpy(client_error, buf, sizeof(buf));
	pthread_exit(NULL);
}

static void conn_send(struct conn *c, int argc, const char **argv,
		      const size_t *lens)
{
	char hdr[64];
	struct iovec iov[3 * 8 + 1];
	int i, n = 0, hl[8 + 1];
	char h[8][32];
	ssize_t want = 0, done;

	if (argc > 8)
		die("too many arguments");
	hl[8] = snprintf(hdr, sizeof(hdr), "*%d\r\n", argc);
	iov[n++] = (struct iovec){ hdr, hl[8] };
	for (i = 0; i < argc; i++) {
		hl[i] = snprintf(h[i], sizeof(h[i]), "$%zu\r\n", lens[i]);
		iov[n++] = (struct iovec){ h[i], hl[i] };
		iov[n++] = (struct iovec){ (void *)argv[i], lens[i] };
		iov[n++] = (struct iovec){ "\r\n", 2 };
	}
	for (i = 0; i < n; i++)
		want += iov[i].iov_len;
	done = writev(c->fd, iov, n);
	if (done != want)
		conn_fail(c, "writev to redis: %zd of %zd bytes (%s)", done,
			  want, strerror(errno));
}

/* make @need bytes from c->off available in the buffer */
static void conn_fill(struct conn *c, size_t need)
{
	ssize_t r;

	if (need > sizeof(c->buf))
		conn_fail(c, "redis reply of %zu bytes", need);
	if (c->off + need > sizeof(c->buf)) {
		memmove(c->buf, c->buf + c->off, c->len - c->off);
		c->len -= c->off;
		c->off = 0;
	}
	while (c->len - c->off < need) {
		r = read(c->fd, c->buf + c->len, sizeof(c->buf) - c->len);
		if (r <= 0)
			conn_fail(c, "redis closed the connection (%s)",
				  r ? strerror(errno) : "EOF");
		c->len += r;
	}
}

/* the next line, without its CRLF, NUL-terminated in the buffer */
static char *conn_line(struct conn *c)
{
	char *p, *e;
	size_t have = 0;

	for (;;) {
		p = c->buf + c->off;
		e = memmem(p + (have ? have - 1 : 0), c->len - c->off -
			   (have ? have - 1 : 0), "\r\n", 2);
		if (e)
			break;
		have = c->len - c->off;
		conn_fill(c, have + 1);
	}
	*e = 0;
	c->off = e + 2 - c->buf;
	return p;
}

/*
 * One reply: its type ('+', '-', ':' or '$') and its text (a bulk
 * string's bytes, NUL-terminated; NULL for a nil bulk), valid until the
 * next call.
 */
static char conn_reply(struct conn *c, char **text, long *len)
{
	char *line = conn_line(c), type = line[0];
	long n;

	*text = line + 1;
	*len = strlen(line + 1);
	if (type != '$')
		return type;
	n = strtol(line + 1, NULL, 10);
	*len = n;
	if (n < 0) {
		*text = NULL;
		return type;
	}
	conn_fill(c, n + 2);
	*text = c->buf + c->off;
	(*text)[n] = 0;
	c->off += n + 2;
	return type;
}

/* a command whose reply is a status or bulk string; dies on an error */
static char *command(struct conn *c, const char *fmt, ...)
{
	const char *argv[8];
	size_t lens[8];
	char line[256], *save, *tok, *text;
	int argc = 0;
	va_list ap;
	long len;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	for (tok = strtok_r(line, " ", &save); tok && argc < 8;
	     tok = strtok_r(NULL, " ", &save)) {
		argv[argc] = tok;
		lens[argc++] = strlen(tok);
	}
	conn_send(c, argc, argv, lens);
	if (conn_reply(c, &text, &len) == '-')
		die("redis: %s: %s", argv[0], text);
	return text;
}

/* the value of a field of an INFO section, NUL-terminated in the buffer */
static char *info_value(struct conn *c, const char *section, const char *name)
{
	char *p = command(c, "INFO %s", section);
	size_t n = strlen(name);

	for (; p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
		if (!strncmp(p, name, n) && p[n] == ':') {
			p[n + 1 + strcspn(p + n + 1, "\r\n")] = 0;
			return p + n + 1;
		}
	}
	die("INFO %s has no %s", section, name);
}

static long info_field(struct conn *c, const char *section, const char *name)
{
	return strtol(info_value(c, section, name), NULL, 10);
}

/* ---- the server ------------------------------------------------------ */

static pid_t server_pid;

static void stop_server(void)
{
	int status;

	if (bench_child || server_pid <= 0)
		return;
	kill(server_pid, SIGKILL);
	waitpid(server_pid, &status, 0);
	server_pid = 0;
	unlink(SOCK);
	unlink("/tmp/" RDB);
}

static struct conn *start_server(void)
{
	struct conn *c;
	int status;

	/* a snapshot left by an earlier run would be loaded */
	unlink(SOCK);
	unlink("/tmp/" RDB);
	server_pid = fork();
	if (server_pid < 0)
		die_errno("fork");
	if (!server_pid) {
		execlp("redis-server", "redis-server", "--port", "0",
		       "--unixsocket", SOCK, "--save", "", "--appendonly", "no",
		       "--dir", "/tmp", "--dbfilename", RDB,
		       "--enable-debug-command", "yes", "--daemonize", "no",
		       "--logfile", "/tmp/ptlab-redis.log", NULL);
		_exit(127);
	}
	atexit(stop_server);
	c = conn_open(300);
	if (c)
		return c;
	if (waitpid(server_pid, &status, WNOHANG) == server_pid) {
		server_pid = 0;
		if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
			skip("no redis-server in the guest (the lab copies the host's: apt-get install redis-server)");
		die("redis-server exited (status 0x%x), see /tmp/ptlab-redis.log",
		    status);
	}
	die("redis-server does not answer on %s", SOCK);
}

/* ---- the client thread ---------------------------------------------- */

struct sample {
	uint64_t t;		/* when the request was sent */
	uint32_t ns;		/* its round trip, ns (saturated) */
};

static struct {
	const struct opts *o;
	struct conn *c;
	struct sample *s;
	unsigned long n;
	uint32_t *version;	/* per key: the last SET's version, 0: none */
	volatile int stop;
	unsigned long bad;
	char bad_what[160];
} load;

static void make_value(char *v, unsigned long key, uint32_t version)
{
	int n = snprintf(v, VALUE_SIZE, "ptlab:%lu:%u:", key, version);

	memset(v + n, 'a' + key % 26, VALUE_SIZE - n);
}

static void *client(void *arg)
{
	char key[32], value[VALUE_SIZE], *text;
	uint64_t s = 0x243f6a8885a308d3ULL, t0;
	const char *argv[3];
	size_t lens[3];
	unsigned long k;
	long len;
	char type;

	(void)arg;
	while (!load.stop && load.n < MAX_SAMPLES) {
		uint64_t r = xorshift64(&s);
		int set = r & 1;

		k = (r >> 1) % load.o->keys;
		lens[1] = snprintf(key, sizeof(key), "key:%lu", k);
		argv[1] = key;
		if (set) {
			make_value(value, k, load.version[k] + 1);
			argv[0] = "SET";
			lens[0] = 3;
			argv[2] = value;
			lens[2] = VALUE_SIZE;
		} else {
			argv[0] = "GET";
			lens[0] = 3;
		}
		t0 = now_ns();
		conn_send(load.c, set ? 3 : 2, argv, lens);
		type = conn_reply(load.c, &text, &len);
		load.s[load.n].t = t0;
		t0 = now_ns() - t0;
		load.s[load.n++].ns = t0 > UINT32_MAX ? UINT32_MAX : t0;
		if (set && (type != '+' || strcmp(text, "OK"))) {
			snprintf(load.bad_what, sizeof(load.bad_what),
				 "SET %s: %c%.60s", key, type, text ? text : "");
			load.bad++;
		} else if (set) {
			load.version[k]++;
		} else if (type != '$' || !text || len != VALUE_SIZE) {
			snprintf(load.bad_what, sizeof(load.bad_what),
				 "GET %s: %c, %ld bytes", key, type, len);
			load.bad++;
		}
	}
	return NULL;
}

/* round trips of the requests sent in [@from, @to), ns, sorted in @buf */
static size_t window(uint64_t from, uint64_t to, double *buf)
{
	size_t i, n = 0;

	for (i = 0; i < load.n; i++)
		if (load.s[i].t >= from && load.s[i].t < to)
			buf[n++] = load.s[i].ns;
	return n;
}

/* ---- verification --------------------------------------------------- */

static unsigned long check_keys(struct conn *c, const struct opts *o)
{
	char want[VALUE_SIZE + 1], *text;
	unsigned long k, bad = 0, untouched = 0;
	long len;

	for (k = 0; k < o->keys; k++) {
		if (!load.version[k] && untouched >= 1000)
			continue;
		text = command(c, "GET key:%lu", k);
		if (load.version[k]) {
			make_value(want, k, load.version[k]);
			len = VALUE_SIZE;
		} else {
			/* DEBUG POPULATE: "value:<k>", zero-padded */
			untouched++;
			len = snprintf(want, sizeof(want), "value:%lu", k);
		}
		if (!text || memcmp(text, want, len)) {
			if (!bad)
				comment("key:%lu holds \"%.40s\", wanted \"%.40s\"",
					k, text ? text : "(nil)", want);
			bad++;
		}
	}
	return bad;
}

/* ---- main ------------------------------------------------------------ */

static void parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		SIZE_OPTIONS,
		{ "keys", required_argument, NULL, 'k' },
		{ "cow-pte", no_argument, NULL, 'c' },
		{ NULL, 0, NULL, 0 },
	};
	enum bench_size sz = SIZE_DEFAULT;
	unsigned long keys = 0;
	int c;

	memset(o, 0, sizeof(*o));
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		if (size_option(c, &sz))
			continue;
		switch (c) {
		case 'k':
			keys = strtoul(optarg, NULL, 0);
			break;
		case 'c':
			o->cow_pte = 1;
			break;
		default:
			usage_exit(USAGE, argv[0]);
		}
	}
	o->keys = keys ? keys : sz == SIZE_QUICK ? 50000 :
		  sz == SIZE_FULL ? 3000000 : 800000;
}

int main(int argc, char **argv)
{
	double fork_us[SAVES], save_ms[SAVES], *lat;
	uint64_t t_base, t_from[SAVES], t_to[SAVES];
	size_t n, nsnap = 0, nbase;
	struct conn *ctl;
	pthread_t thr;
	int cow_pte = 0, i;
	struct opts o;
	double secs = 0;

	bench_init();
	parse(argc, argv, &o);
	printf("# sizes: %lu keys of %d bytes%s\n", o.keys, VALUE_SIZE,
	       o.cow_pte ? ", cow-pte requested" : "");
	if (knob_set("/proc/sys/vm/overcommit_memory", "1"))
		die("cannot set vm.overcommit_memory");
	if (o.cow_pte && file_exists(COW_PTE_SYSCTL)) {
		if (knob_set(COW_PTE_SYSCTL, "2"))
			die("cannot set vm.cow_pte");
		cow_pte = 1;
	}
	ctl = start_server();
	t_base = now_ns();
	command(ctl, "DEBUG POPULATE %lu key %d", o.keys, VALUE_SIZE);
	comment("populated %lu keys in %.1f s; server RSS %ld MiB", o.keys,
		(now_ns() - t_base) / 1e9,
		info_field(ctl, "memory", "used_memory_rss") >> 20);

	load.o = &o;
	load.c = conn_open(1);
	if (load.c)
		load.c->client = 1;
	load.s = malloc(MAX_SAMPLES * sizeof(*load.s));
	load.version = calloc(o.keys, sizeof(*load.version));
	lat = malloc(MAX_SAMPLES * sizeof(*lat));
	if (!load.c || !load.s || !load.version || !lat)
		die("client setup");
	if (pthread_create(&thr, NULL, client, NULL))
		die("pthread_create");

	t_base = now_ns();
	usleep(1000 * 1000);
	for (i = 0; i < SAVES; i++) {
		t_from[i] = now_ns();
		command(ctl, "BGSAVE");
		while (info_field(ctl, "persistence", "rdb_bgsave_in_progress"))
			usleep(20 * 1000);
		t_to[i] = now_ns();
		save_ms[i] = (t_to[i] - t_from[i]) / 1e6;
		fork_us[i] = info_field(ctl, "stats", "latest_fork_usec");
		if (strcmp(info_value(ctl, "persistence",
				      "rdb_last_bgsave_status"), "ok"))
			verify_failed("snapshot %d failed, see /tmp/ptlab-redis.log", i);
		comment("snapshot %d: fork %.0f us, %.0f ms", i, fork_us[i],
			save_ms[i]);
	}
	load.stop = 1;
	pthread_join(thr, NULL);
	if (client_error[0])
		verify_failed("client: %s", client_error);
	if (load.bad)
		verify_failed("%lu bad replies, the last: %s", load.bad,
			      load.bad_what);
	if (load.n == MAX_SAMPLES)
		comment("client stopped at %lu samples", MAX_SAMPLES);

	nbase = window(t_base, t_from[0], lat);
	metric("cow_pte_enabled", cow_pte, "count", "higher");
	metric("baseline_p99_us", quantile(lat, nbase, 0.99) / 1e3, "us",
	       "lower");
	for (i = 0; i < SAVES; i++) {
		n = window(t_from[i], t_to[i], lat + nsnap);
		nsnap += n;
		secs += (t_to[i] - t_from[i]) / 1e9;
	}
	metric("fork_usec", quantile(fork_us, SAVES, 0.5), "us", "lower");
	metric("save_ms", quantile(save_ms, SAVES, 0.5), "ms", "lower");
	metric("snapshot_ops_per_s", nsnap / secs, "ops/s", "higher");
	metric("snapshot_p50_us", quantile(lat, nsnap, 0.5) / 1e3, "us", "lower");
	metric("snapshot_p99_us", quantile(lat, nsnap, 0.99) / 1e3, "us",
	       "lower");
	/* quantile() sorted them */
	metric("snapshot_max_us", nsnap ? lat[nsnap - 1] / 1e3 : 0, "us",
	       "lower");
	n = check_keys(ctl, &o);
	if (n)
		verify_failed("%lu keys do not hold what was written", n);
	verify_ok();
	return 0;
}
