/*
 * The floor of the fusefs floor benchmark: a minimal FUSE server on libfuse's low-level API
 * that answers from memory at once, with the mount options fusefs promises (zero entry,
 * attribute and negative lifetimes, direct I/O, default_permissions), served by libfuse's
 * multi-threaded loop. What any FUSE filesystem pays on this kernel for a request, at least.
 *
 * The tree: the root (1) holds the directory `d` (2), which holds the files
 * `f0` .. `f999` (1000 + N), each 4 KiB of zeros.
 *
 * Usage: ll_floor <mountpoint> <counter file>. It counts the requests it answers in the first
 * 8 bytes of the counter file (shared memory, so the benchmark reads requests per operation
 * while it runs). SIGTERM or SIGINT unmounts and exits.
 *
 * For experiments on where the scheduler places the server's thread (the fusefs README, "Where
 * the scheduler puts a FUSE server"), the environment can change the loop:
 * - LL_FLOOR_LOOP=mt (the default): libfuse's multi-threaded loop;
 * - LL_FLOOR_LOOP=single: libfuse's single-threaded loop (one thread, blocking reads);
 * - LL_FLOOR_LOOP=epoll: one thread that reads without blocking and waits in epoll_wait(2)
 *   while the queue is empty, as fusefs's session does;
 * - LL_FLOOR_BUSY_BEFORE_NS, LL_FLOOR_BUSY_AFTER_NS (epoll loop only): that many nanoseconds of
 *   busy work before each request is answered, and after its reply is written.
 */
#define FUSE_USE_VERSION FUSE_MAKE_VERSION(3, 12)

#include <fuse_lowlevel.h>

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DIR_INO 2
#define FIRST_FILE 1000
#define FILES 1000
#define FILE_SIZE 4096

static atomic_ulong *requests;
static const char zeros[FILE_SIZE];

static int fill(fuse_ino_t ino, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_uid = 0;
	st->st_gid = 0;
	st->st_blksize = 4096;
	if (ino == FUSE_ROOT_ID || ino == DIR_INO) {
		st->st_mode = S_IFDIR | 0755;
		st->st_nlink = 2;
		return 0;
	}
	if (ino >= FIRST_FILE && ino < FIRST_FILE + FILES) {
		st->st_mode = S_IFREG | 0644;
		st->st_nlink = 1;
		st->st_size = FILE_SIZE;
		st->st_blocks = FILE_SIZE / 512;
		return 0;
	}
	return -1;
}

static void floor_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	atomic_fetch_add_explicit(requests, 1, memory_order_relaxed);
	fuse_ino_t ino = 0;
	if (parent == FUSE_ROOT_ID && strcmp(name, "d") == 0) {
		ino = DIR_INO;
	} else if (parent == DIR_INO && name[0] == 'f') {
		char *end;
		long n = strtol(name + 1, &end, 10);
		if (*end == '\0' && end != name + 1 && n >= 0 && n < FILES)
			ino = FIRST_FILE + n;
	}
	struct fuse_entry_param e;
	memset(&e, 0, sizeof(e));
	if (ino == 0) {
		/* A negative entry with a zero lifetime, as fusefs answers. */
		fuse_reply_entry(req, &e);
		return;
	}
	e.ino = ino;
	e.generation = 1;
	fill(ino, &e.attr);
	fuse_reply_entry(req, &e);
}

static void floor_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)fi;
	atomic_fetch_add_explicit(requests, 1, memory_order_relaxed);
	struct stat st;
	if (fill(ino, &st) != 0) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	fuse_reply_attr(req, &st, 0.0);
}

static void floor_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	atomic_fetch_add_explicit(requests, 1, memory_order_relaxed);
	if (ino < FIRST_FILE) {
		fuse_reply_err(req, EISDIR);
		return;
	}
	fi->direct_io = 1;
	fuse_reply_open(req, fi);
}

static void floor_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	atomic_fetch_add_explicit(requests, 1, memory_order_relaxed);
	size_t left = off >= FILE_SIZE ? 0 : (size_t)(FILE_SIZE - off);
	fuse_reply_buf(req, zeros, size < left ? size : left);
}

static void floor_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	atomic_fetch_add_explicit(requests, 1, memory_order_relaxed);
	fuse_reply_err(req, 0);
}

static const struct fuse_lowlevel_ops ops = {
	.lookup = floor_lookup,
	.getattr = floor_getattr,
	.open = floor_open,
	.read = floor_read,
	.release = floor_release,
};

/* The nanoseconds named by the environment variable `name`: 0 when unset, -1 when not a
 * non-negative whole number. */
static long env_ns(const char *name)
{
	const char *value = getenv(name);
	if (value == NULL)
		return 0;
	char *end;
	errno = 0;
	long ns = strtol(value, &end, 10);
	return errno != 0 || end == value || *end != '\0' || ns < 0 ? -1 : ns;
}

/* Runs on the CPU for `ns` nanoseconds. */
static void busy(long ns)
{
	struct timespec start, now;
	clock_gettime(CLOCK_MONOTONIC, &start);
	do
		clock_gettime(CLOCK_MONOTONIC, &now);
	while ((now.tv_sec - start.tv_sec) * 1000000000L + (now.tv_nsec - start.tv_nsec) < ns);
}

/* One thread: non-blocking reads, epoll_wait(2) while the queue is empty. */
static int epoll_loop(struct fuse_session *se)
{
	long before = env_ns("LL_FLOOR_BUSY_BEFORE_NS");
	long after = env_ns("LL_FLOOR_BUSY_AFTER_NS");
	int fd = fuse_session_fd(se);
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event event = { .events = EPOLLIN };
	if (ep < 0 || fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0 ||
	    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &event) != 0) {
		perror("epoll");
		return 1;
	}
	struct fuse_buf buf = { .mem = NULL };
	int status = 0;
	while (!fuse_session_exited(se)) {
		int res = fuse_session_receive_buf(se, &buf);
		if (res == -EAGAIN) {
			if (epoll_wait(ep, &event, 1, -1) < 0 && errno != EINTR) {
				perror("epoll_wait");
				status = 1;
				break;
			}
			continue;
		}
		if (res == -EINTR)
			continue;
		if (res <= 0)
			break;
		if (before > 0)
			busy(before);
		fuse_session_process_buf(se, &buf);
		if (after > 0)
			busy(after);
	}
	free(buf.mem);
	close(ep);
	return status;
}

int main(int argc, char *argv[])
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s <mountpoint> <counter file>\n", argv[0]);
		return 2;
	}
	const char *loop = getenv("LL_FLOOR_LOOP");
	if (loop != NULL && strcmp(loop, "mt") != 0 && strcmp(loop, "single") != 0 &&
	    strcmp(loop, "epoll") != 0) {
		fprintf(stderr, "LL_FLOOR_LOOP is %s; it must be mt, single or epoll\n", loop);
		return 2;
	}
	const char *busy_names[] = { "LL_FLOOR_BUSY_BEFORE_NS", "LL_FLOOR_BUSY_AFTER_NS" };
	for (size_t i = 0; i < sizeof(busy_names) / sizeof(busy_names[0]); i++) {
		if (env_ns(busy_names[i]) < 0) {
			fprintf(stderr, "%s is %s; it must be a whole number of nanoseconds\n",
				busy_names[i], getenv(busy_names[i]));
			return 2;
		}
	}
	int counter = open(argv[2], O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (counter < 0 || ftruncate(counter, sizeof(atomic_ulong)) != 0) {
		perror(argv[2]);
		return 1;
	}
	requests = mmap(NULL, sizeof(atomic_ulong), PROT_READ | PROT_WRITE, MAP_SHARED, counter, 0);
	if (requests == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	char *fuse_argv[] = { argv[0], "-o", "default_permissions,fsname=ll-floor,subtype=ll-floor",
			      NULL };
	struct fuse_args args = FUSE_ARGS_INIT(3, fuse_argv);
	struct fuse_session *se = fuse_session_new(&args, &ops, sizeof(ops), NULL);
	if (se == NULL)
		return 1;
	int status = 1;
	if (fuse_set_signal_handlers(se) != 0)
		goto destroy;
	if (fuse_session_mount(se, argv[1]) != 0)
		goto handlers;
	if (loop != NULL && strcmp(loop, "single") == 0) {
		status = fuse_session_loop(se) != 0;
	} else if (loop != NULL && strcmp(loop, "epoll") == 0) {
		status = epoll_loop(se);
	} else {
		struct fuse_loop_config *config = fuse_loop_cfg_create();
		fuse_loop_cfg_set_clone_fd(config, 0);
		status = fuse_session_loop_mt(se, config) != 0;
		fuse_loop_cfg_destroy(config);
	}
	fuse_session_unmount(se);
handlers:
	fuse_remove_signal_handlers(se);
destroy:
	fuse_session_destroy(se);
	return status;
}
