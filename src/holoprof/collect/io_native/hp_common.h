/*
 * hp_common.h -- what the modules of libholoprof_io.so share: limits, counters, file records,
 * descriptor slots, process-wide state, small inline helpers and the internal API.
 *
 * libholoprof_io.so: Darshan-style per-file I/O counters, captured by LD_PRELOAD.
 *
 * Loaded into every process of a traced job (Python or not), this library interposes the POSIX
 * and STDIO calls of glibc (open/read/write/pread/lseek/stat/fsync/mmap/close ... and
 * fopen/fread/fwrite/fseek/fclose ...) and keeps, per file and per module (POSIX, STDIO), the
 * counters of Darshan's POSIX and STDIO modules: operation counts, bytes, access-size histogram,
 * sequential/consecutive accesses, read/write switches, read/write/metadata time and first/last
 * timestamps. An optional per-operation trace (like Darshan's DXT) records every access into a
 * bounded ring buffer while it is switched on.
 *
 * Readers:
 *   - in process, through the exported holoprof_io_* functions (the Python agent's
 *     holoprof.collect._io_api, or ctypes);
 *   - for processes no agent owns, a JSON-lines dump written at exit to
 *     $HOLOPROF_RUN_DIR/<host>-<pid>/io_native-<pid>.jsonl.
 *
 * Design notes
 *   - Hot path: one thread-local load, one array load per call; untracked descriptors (sockets,
 *     pipes, terminals, excluded paths) go straight to libc. Tracked calls add two vDSO clock reads
 *     and a short critical section on a striped spinlock; no lock is held during the real call.
 *   - Re-entrancy: a thread-local flag is set while the library runs its own code; any I/O call made
 *     in that state (by us, by dlsym, by a signal handler that interrupted us) goes straight to libc.
 *   - Memory is bounded: fixed tables of files, descriptors and path bytes (lazily backed .bss).
 *   - fork: the child keeps the descriptor->file mapping (its descriptors are still open) and starts
 *     with zeroed counters; locks are re-initialised in the child so it cannot deadlock.
 *   - vfork children (posix_spawn, Python's _posixsubprocess) share our memory with the parent:
 *     state-changing wrappers detect them (getpid differs) and leave the tables alone.
 *
 * Modules (one object each, linked into the one library; only EXPORT symbols are visible outside):
 *   hp_state.c     the process-wide state shared by the modules
 *   hp_real.c      libc's functions behind the interposed ones (hp_real.h)
 *   hp_paths.c     absolute, normalised paths and the policy of which paths are counted
 *   hp_table.c     the table of file records (module, path)
 *   hp_counters.c  counter updates per access (Darshan's rules), merging records
 *   hp_trace.c     the per-operation trace ring and its exported API
 *   hp_fd.c        descriptor tracking: first-use probe, opens, close, dup
 *   hp_posix.c     open, read/write, in-kernel copies, lseek wrappers
 *   hp_stat.c      stat family, fsync/fdatasync wrappers
 *   hp_rename.c    rename wrappers: counters follow a file to its new name
 *   hp_mmap.c      memory-mapped files: mmap, munmap and resident pages
 *   hp_pages.c     the distinct pages of each mapped file brought in (union over mappings)
 *   hp_stdio.c     fopen/fread/fwrite/... wrappers
 *   hp_dump.c      the JSON-lines dump at exit (and _exit/_Exit), the exit time
 *   hp_init.c      constructor, destructor and fork handlers
 *   hp_api.c       the exported API read from Python through ctypes
 *
 * Every .c file includes this header first: it sets the feature macros before any system header.
 */
#ifndef HP_COMMON_H
#define HP_COMMON_H

#undef _FORTIFY_SOURCE
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define _LARGEFILE64_SOURCE 1

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

/* stdio.h may define some of the functions we interpose as macros */
#undef fread_unlocked
#undef fwrite_unlocked
#undef fgets_unlocked
#undef fputs_unlocked
#undef getc
#undef putc
#undef fgetc
#undef fputc

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

#define EXPORT __attribute__((visibility("default")))
/* shared between the modules of the library, invisible outside it */
#define HIDDEN __attribute__((visibility("hidden")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

#define HOLOPROF_IO_VERSION 1

/* ------------------------------------------------------------------------------------------------
 * Limits
 * ---------------------------------------------------------------------------------------------- */
#define REC_CAP 65536u            /* file records (module, path) */
#define HT_SIZE (2u * REC_CAP)     /* open-addressing hash table of records, power of two */
#define ARENA_SIZE (16u << 20)     /* bytes of path names */
#define FD_CAP 65536               /* descriptors tracked: 0 .. FD_CAP-1 */
#define NLOCKS 4096u               /* striped record locks */
#define MAX_EXCLUDES 32
#define MAP_CAP 4096u             /* live file mappings whose resident pages are measured at munmap */
#define MAP_MEASURE_MAX (1ull << 30) /* larger mappings are not measured (the page-table walk) */
#define PAGES_MAX (1ull << 26)     /* pages of a file whose set is kept (256 GiB of 4 KiB pages) */
#define TRACE_MAX_RECORDS (1u << 24)

/* ------------------------------------------------------------------------------------------------
 * Counters (names and order follow Darshan's POSIX and STDIO modules)
 * ---------------------------------------------------------------------------------------------- */
#define SIZE_BUCKETS(X, P) \
    X(P##_0_100) X(P##_100_1K) X(P##_1K_10K) X(P##_10K_100K) X(P##_100K_1M) X(P##_1M_4M) \
    X(P##_4M_10M) X(P##_10M_100M) X(P##_100M_1G) X(P##_1G_PLUS)

#define POSIX_INT_COUNTERS(X) \
    X(POSIX_OPENS) X(POSIX_DUPS) X(POSIX_READS) X(POSIX_WRITES) X(POSIX_SEEKS) X(POSIX_STATS) \
    X(POSIX_MMAPS) X(POSIX_FSYNCS) X(POSIX_FDSYNCS) X(POSIX_BYTES_READ) X(POSIX_BYTES_WRITTEN) \
    X(POSIX_MAX_BYTE_READ) X(POSIX_MAX_BYTE_WRITTEN) X(POSIX_CONSEC_READS) X(POSIX_CONSEC_WRITES) \
    X(POSIX_SEQ_READS) X(POSIX_SEQ_WRITES) X(POSIX_RW_SWITCHES) X(POSIX_MAX_READ_TIME_SIZE) \
    X(POSIX_MAX_WRITE_TIME_SIZE) SIZE_BUCKETS(X, POSIX_SIZE_READ) SIZE_BUCKETS(X, POSIX_SIZE_WRITE) \
    X(POSIX_BYTES_MAPPED) X(POSIX_MAX_BYTE_MAPPED) X(POSIX_MMAPS_MEASURED) X(POSIX_BYTES_MAPPED_RESIDENT) \
    X(POSIX_BYTES_MAPPED_DISTINCT)

#define POSIX_F_COUNTERS(X) \
    X(POSIX_F_OPEN_START_TIMESTAMP) X(POSIX_F_READ_START_TIMESTAMP) \
    X(POSIX_F_WRITE_START_TIMESTAMP) X(POSIX_F_CLOSE_START_TIMESTAMP) \
    X(POSIX_F_OPEN_END_TIMESTAMP) X(POSIX_F_READ_END_TIMESTAMP) X(POSIX_F_WRITE_END_TIMESTAMP) \
    X(POSIX_F_CLOSE_END_TIMESTAMP) X(POSIX_F_READ_TIME) X(POSIX_F_WRITE_TIME) X(POSIX_F_META_TIME) \
    X(POSIX_F_MAX_READ_TIME) X(POSIX_F_MAX_WRITE_TIME)

#define STDIO_INT_COUNTERS(X) \
    X(STDIO_OPENS) X(STDIO_FDOPENS) X(STDIO_READS) X(STDIO_WRITES) X(STDIO_SEEKS) \
    X(STDIO_FLUSHES) X(STDIO_BYTES_WRITTEN) X(STDIO_BYTES_READ) X(STDIO_MAX_BYTE_READ) \
    X(STDIO_MAX_BYTE_WRITTEN)

#define STDIO_F_COUNTERS(X) \
    X(STDIO_F_META_TIME) X(STDIO_F_WRITE_TIME) X(STDIO_F_READ_TIME) \
    X(STDIO_F_OPEN_START_TIMESTAMP) X(STDIO_F_CLOSE_START_TIMESTAMP) \
    X(STDIO_F_WRITE_START_TIMESTAMP) X(STDIO_F_READ_START_TIMESTAMP) \
    X(STDIO_F_OPEN_END_TIMESTAMP) X(STDIO_F_CLOSE_END_TIMESTAMP) X(STDIO_F_WRITE_END_TIMESTAMP) \
    X(STDIO_F_READ_END_TIMESTAMP)

#define ENUM_X(n) n,
#define NAME_X(n) #n ","
enum { POSIX_INT_COUNTERS(ENUM_X) POSIX_NI };
enum { POSIX_F_COUNTERS(ENUM_X) POSIX_NF };
enum { STDIO_INT_COUNTERS(ENUM_X) STDIO_NI };
enum { STDIO_F_COUNTERS(ENUM_X) STDIO_NF };

#define NI_MAX 48
#define NF_MAX 16
_Static_assert(POSIX_NI <= NI_MAX && STDIO_NI <= NI_MAX, "NI_MAX too small");
_Static_assert(POSIX_NF <= NF_MAX && STDIO_NF <= NF_MAX, "NF_MAX too small");

/* comma-terminated counter names, in counter order (hp_counters.c) */
extern HIDDEN const char posix_int_names[];
extern HIDDEN const char posix_f_names[];
extern HIDDEN const char stdio_int_names[];
extern HIDDEN const char stdio_f_names[];

enum { MOD_POSIX = 0, MOD_STDIO = 1 };
enum { IO_NONE = 0, IO_READ = 1, IO_WRITE = 2 };
enum { OP_OPEN = 1, OP_CLOSE, OP_READ, OP_WRITE, OP_SEEK, OP_STAT, OP_SYNC, OP_MMAP, OP_FLUSH };
enum { META_OPEN, META_DUP, META_CLOSE, META_SEEK, META_STAT, META_FSYNC, META_FDSYNC };
enum { SMETA_OPEN, SMETA_FDOPEN, SMETA_CLOSE, SMETA_SEEK, SMETA_FLUSH };

/* ------------------------------------------------------------------------------------------------
 * State (defined in hp_state.c)
 * ---------------------------------------------------------------------------------------------- */
struct rec {
    uint64_t hash;
    uint32_t path_off;
    uint16_t path_len;
    uint8_t module;
    uint8_t last_io;
    uint32_t gen;           /* counters are valid only when gen == g_gen (lazy reset after fork) */
    uint32_t pad;
    uint64_t mod_epoch;     /* snapshot epoch of the last update, 0 = untouched */
    int64_t last_byte_read;
    int64_t last_byte_written;
    int64_t last_read_end;  /* monotonic ns, for non-overlapping time sums */
    int64_t last_write_end;
    int64_t last_meta_end;
    int64_t c[NI_MAX];
    int64_t f[NF_MAX];      /* nanoseconds: durations, or wall-clock timestamps since the epoch */
};

struct fdslot {
    _Atomic int32_t rec;    /* POSIX: 0 = never seen (probe on use), -1 = untracked, k = record k-1 */
    _Atomic int32_t srec;   /* STDIO: 0 = none, k = record k-1 (valid only while fp matches) */
    _Atomic int64_t off;    /* file offset as seen through this descriptor */
    _Atomic int64_t soff;   /* STDIO logical offset */
    _Atomic(FILE *) fp;     /* the stream that owns srec */
};

struct lockslot {
    _Atomic int v;
    char pad[60];
};

extern HIDDEN struct rec g_recs[REC_CAP];
extern HIDDEN _Atomic uint32_t g_nrec;
extern HIDDEN uint32_t g_max_recs;
extern HIDDEN char g_arena[ARENA_SIZE];
extern HIDDEN pthread_mutex_t g_insert_mu;
extern HIDDEN struct lockslot g_locks[NLOCKS];
extern HIDDEN struct fdslot g_fd[FD_CAP];

extern HIDDEN _Atomic long g_dropped;      /* file records not created: table or name arena full */
extern HIDDEN _Atomic uint64_t g_epoch;
extern HIDDEN uint32_t g_gen;
extern HIDDEN _Atomic int g_ready;         /* 1 once initialised and enabled */
extern HIDDEN pid_t g_pid;
extern HIDDEN _Atomic pid_t g_owner_pid;   /* a Python agent reads this process: no dump at exit */
extern HIDDEN int64_t g_wall_off;          /* CLOCK_REALTIME - CLOCK_MONOTONIC at start, ns */
extern HIDDEN int64_t g_start_ns;
extern HIDDEN _Atomic int g_dumping;       /* a dump is being written */

extern HIDDEN char g_run_dir[PATH_MAX];    /* $HOLOPROF_RUN_DIR, absolute (hp_paths.c) */
extern HIDDEN size_t g_run_dir_len;

extern HIDDEN _Atomic int g_trace_on;      /* the trace ring records (hp_trace.c) */
extern HIDDEN _Atomic long g_trace_dropped;
extern HIDDEN pthread_mutex_t g_trace_mu;

extern HIDDEN long g_page;                 /* page size (hp_mmap.c) */

extern HIDDEN __thread int tl_in __attribute__((tls_model("initial-exec")));

/* ------------------------------------------------------------------------------------------------
 * Small helpers
 * ---------------------------------------------------------------------------------------------- */
static inline int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline int64_t wall_of(int64_t mono) { return mono + g_wall_off; }

static inline int active(void)
{
    return LIKELY(atomic_load_explicit(&g_ready, memory_order_relaxed)) && !tl_in;
}

static inline pid_t raw_getpid(void) { return (pid_t)syscall(SYS_getpid); }

/* In a vfork child (shared memory with the parent) the pid differs from the one we know. */
static inline int foreign_process(void) { return raw_getpid() != g_pid; }

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
    __asm__ __volatile__("yield");
#endif
}

static inline void lock_rec(uint32_t idx)
{
    _Atomic int *l = &g_locks[idx & (NLOCKS - 1)].v;
    unsigned spins = 0;
    while (atomic_exchange_explicit(l, 1, memory_order_acquire)) {
        while (atomic_load_explicit(l, memory_order_relaxed)) {
            if (++spins > 64) {
                sched_yield();
                spins = 0;
            } else {
                cpu_relax();
            }
        }
    }
}

static inline void unlock_rec(uint32_t idx)
{
    atomic_store_explicit(&g_locks[idx & (NLOCKS - 1)].v, 0, memory_order_release);
}

/* Call with the record locked: bring a record created before fork() to this generation. */
static inline void touch(struct rec *r)
{
    if (UNLIKELY(r->gen != g_gen)) {
        memset(r->c, 0, sizeof r->c);
        memset(r->f, 0, sizeof r->f);
        r->last_byte_read = r->last_byte_written = 0;
        r->last_read_end = r->last_write_end = r->last_meta_end = 0;
        r->last_io = IO_NONE;
        r->gen = g_gen;
    }
    r->mod_epoch = atomic_load_explicit(&g_epoch, memory_order_relaxed);
}

/* decimal digits of v into out (at least 21 bytes), NUL-terminated; returns the length */
static inline size_t fmt_int(char *out, long v)
{
    char tmp[24];
    size_t n = 0, i = 0;
    unsigned long u = v < 0 ? (unsigned long)(-(v + 1)) + 1 : (unsigned long)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        out[i++] = '-';
    while (n)
        out[i++] = tmp[--n];
    out[i] = 0;
    return i;
}

static inline const char *rec_path(const struct rec *r) { return g_arena + r->path_off; }

/* ------------------------------------------------------------------------------------------------
 * Internal API
 * ---------------------------------------------------------------------------------------------- */
/* hp_paths.c */
HIDDEN size_t normalize(char *p, size_t n);
HIDDEN ssize_t fd_link(int fd, char *buf, size_t cap);
HIDDEN ssize_t abs_path(int dirfd, const char *path, char *buf);
HIDDEN int excluded(const char *p, size_t n);
HIDDEN void path_policy_init(void);

/* hp_table.c */
HIDDEN int32_t find_rec(int module, const char *p, size_t n);
HIDDEN int32_t get_rec(int module, const char *p, size_t n);

/* hp_counters.c (called after the real call, with tl_in set) */
HIDDEN void posix_io(uint32_t ri, int is_write, int64_t off, int64_t n, int64_t t0, int64_t t1);
HIDDEN void posix_meta(uint32_t ri, int kind, int64_t off, int64_t t0, int64_t t1);
HIDDEN void stdio_io(uint32_t ri, int is_write, int64_t off, int64_t n, int64_t t0, int64_t t1);
HIDDEN void stdio_meta(uint32_t ri, int kind, int64_t off, int64_t t0, int64_t t1);
HIDDEN void merge_into(int module, uint32_t dst, uint32_t src);

/* hp_trace.c */
HIDDEN void trace_push(int module, uint32_t rec, int op, int64_t off, int64_t size, int64_t t0, int64_t t1);
HIDDEN void trace_reset_after_fork(void);

#define TRACE(module, rec, op, off, size, t0, t1) \
    do { \
        if (UNLIKELY(atomic_load_explicit(&g_trace_on, memory_order_relaxed))) \
            trace_push(module, rec, op, off, size, t0, t1); \
    } while (0)

/* hp_fd.c */
HIDDEN int32_t probe_fd(int fd);
HIDDEN void posix_opened(int fd, int dirfd, const char *path, int flags, int64_t t0, int64_t t1);

/* The record index of a descriptor if it is tracked, else -1. Cheap for untracked descriptors. */
static inline int32_t fd_rec(int fd)
{
    if (!active() || (unsigned)fd >= FD_CAP)
        return -1;
    int32_t v = atomic_load_explicit(&g_fd[fd].rec, memory_order_relaxed);
    if (LIKELY(v < 0))
        return -1;
    if (v == 0) {
        v = probe_fd(fd);
        if (v <= 0)
            return -1;
    }
    return v - 1;
}

/* hp_rename.c */
HIDDEN int32_t follow_rename(int fd, int32_t ri);

/* hp_mmap.c */
HIDDEN void map_release_all(void);
HIDDEN void map_reset_after_fork(void);

/* hp_pages.c */
HIDDEN int64_t pages_add(uint32_t ri, uint64_t first, const uint64_t *pagemap, uint64_t n);
HIDDEN long pages_runs(uint32_t ri, void (*emit)(void *ctx, uint64_t first, uint64_t count), void *ctx);
HIDDEN void pages_reset_after_fork(void);

/* hp_dump.c */
HIDDEN int default_dump_path(char *out, size_t cap);
HIDDEN int write_dump(const char *target, const char *reason);
HIDDEN void dump_at_exit(const char *reason, int status);
HIDDEN void exit_status_handler(int status, void *arg);

#endif /* HP_COMMON_H */
