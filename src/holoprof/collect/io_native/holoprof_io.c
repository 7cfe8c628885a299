/*
 * holoprof_io.c -- Darshan-style per-file I/O counters, captured by LD_PRELOAD.
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
 *   - in process, through the exported holoprof_io_* functions (ctypes from the Python agent);
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
 */
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
    X(POSIX_BYTES_MAPPED) X(POSIX_MAX_BYTE_MAPPED) X(POSIX_MMAPS_MEASURED) X(POSIX_BYTES_MAPPED_RESIDENT)

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

static const char posix_int_names[] = POSIX_INT_COUNTERS(NAME_X);
static const char posix_f_names[] = POSIX_F_COUNTERS(NAME_X);
static const char stdio_int_names[] = STDIO_INT_COUNTERS(NAME_X);
static const char stdio_f_names[] = STDIO_F_COUNTERS(NAME_X);

enum { MOD_POSIX = 0, MOD_STDIO = 1 };
enum { IO_NONE = 0, IO_READ = 1, IO_WRITE = 2 };
enum { OP_OPEN = 1, OP_CLOSE, OP_READ, OP_WRITE, OP_SEEK, OP_STAT, OP_SYNC, OP_MMAP, OP_FLUSH };

/* ------------------------------------------------------------------------------------------------
 * State
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

static struct rec g_recs[REC_CAP];
static _Atomic uint32_t g_ht[HT_SIZE];
static _Atomic uint32_t g_nrec;
static uint32_t g_max_recs = REC_CAP;
static char g_arena[ARENA_SIZE];
static uint32_t g_arena_used;
static pthread_mutex_t g_insert_mu = PTHREAD_MUTEX_INITIALIZER;
static struct lockslot g_locks[NLOCKS] __attribute__((aligned(64)));
static struct fdslot g_fd[FD_CAP];

static _Atomic long g_dropped;          /* file records not created: table or name arena full */
static _Atomic uint64_t g_epoch = 1;
static uint32_t g_gen = 1;
static _Atomic int g_ready;             /* 1 once initialised and enabled */
static pid_t g_pid;
static _Atomic pid_t g_owner_pid;       /* a Python agent reads this process: no dump at exit */
static int64_t g_wall_off;              /* CLOCK_REALTIME - CLOCK_MONOTONIC at start, ns */
static int64_t g_start_ns;

static char g_run_dir[PATH_MAX];
static size_t g_run_dir_len;
static char g_excl_buf[4096];
static const char *g_excl[MAX_EXCLUDES];
static size_t g_excl_len[MAX_EXCLUDES];
static int g_nexcl;
static char g_incl_buf[4096];
static const char *g_incl[MAX_EXCLUDES];
static size_t g_incl_len[MAX_EXCLUDES];
static int g_nincl;

/* live mappings of tracked files: measured when they go (munmap, or the final dump) */
struct mapping {
    uintptr_t addr;
    size_t len;
    int32_t rec;
    int32_t unmeasured;     /* a part of it went without being measured */
};
static struct mapping g_maps[MAP_CAP];
static uint32_t g_nmaps;                /* entries 0 .. g_nmaps-1, guarded by g_map_lock */
static _Atomic uint32_t g_maps_live;    /* == g_nmaps, read without the lock by munmap */
static _Atomic int g_map_lock;
static _Atomic int64_t g_measure_ns;    /* time spent reading page tables, against its budget */
static long g_page = 4096;

static _Atomic int g_dumping;

static __thread int tl_in __attribute__((tls_model("initial-exec")));

/* trace ring (multi-producer, single consumer; drops when full) */
struct trec {
    uint32_t rec;
    uint8_t module;
    uint8_t op;
    uint16_t pad;
    int64_t offset;
    int64_t size;
    int64_t start_ns;
    int64_t end_ns;
};
struct tslot {
    _Atomic uint64_t seq;
    struct trec r;
};
struct ring {
    uint64_t cap;
    size_t map_len;
    _Atomic uint64_t head;
    char pad1[48];
    uint64_t tail;
    struct tslot slots[];
};
static _Atomic int g_trace_on;
static _Atomic(struct ring *) g_ring;  /* producers write here */
static struct ring *g_drain_ring;      /* consumer reads here (same ring, kept after stop) */
static _Atomic long g_trace_inflight;
static _Atomic long g_trace_dropped;
static pthread_mutex_t g_trace_mu = PTHREAD_MUTEX_INITIALIZER;

/* ------------------------------------------------------------------------------------------------
 * Real functions
 * ---------------------------------------------------------------------------------------------- */
#define REAL_FUNCS(X) \
    X(open, int, (const char *, int, ...)) \
    X(open64, int, (const char *, int, ...)) \
    X(__open_2, int, (const char *, int)) \
    X(__open64_2, int, (const char *, int)) \
    X(openat, int, (int, const char *, int, ...)) \
    X(openat64, int, (int, const char *, int, ...)) \
    X(__openat_2, int, (int, const char *, int)) \
    X(__openat64_2, int, (int, const char *, int)) \
    X(creat, int, (const char *, mode_t)) \
    X(creat64, int, (const char *, mode_t)) \
    X(read, ssize_t, (int, void *, size_t)) \
    X(__read_chk, ssize_t, (int, void *, size_t, size_t)) \
    X(pread, ssize_t, (int, void *, size_t, off_t)) \
    X(pread64, ssize_t, (int, void *, size_t, off64_t)) \
    X(__pread_chk, ssize_t, (int, void *, size_t, off_t, size_t)) \
    X(__pread64_chk, ssize_t, (int, void *, size_t, off64_t, size_t)) \
    X(readv, ssize_t, (int, const struct iovec *, int)) \
    X(preadv, ssize_t, (int, const struct iovec *, int, off_t)) \
    X(preadv64, ssize_t, (int, const struct iovec *, int, off64_t)) \
    X(preadv2, ssize_t, (int, const struct iovec *, int, off_t, int)) \
    X(preadv64v2, ssize_t, (int, const struct iovec *, int, off64_t, int)) \
    X(write, ssize_t, (int, const void *, size_t)) \
    X(pwrite, ssize_t, (int, const void *, size_t, off_t)) \
    X(pwrite64, ssize_t, (int, const void *, size_t, off64_t)) \
    X(writev, ssize_t, (int, const struct iovec *, int)) \
    X(pwritev, ssize_t, (int, const struct iovec *, int, off_t)) \
    X(pwritev64, ssize_t, (int, const struct iovec *, int, off64_t)) \
    X(pwritev2, ssize_t, (int, const struct iovec *, int, off_t, int)) \
    X(pwritev64v2, ssize_t, (int, const struct iovec *, int, off64_t, int)) \
    X(copy_file_range, ssize_t, (int, off64_t *, int, off64_t *, size_t, unsigned int)) \
    X(sendfile, ssize_t, (int, int, off_t *, size_t)) \
    X(sendfile64, ssize_t, (int, int, off64_t *, size_t)) \
    X(lseek, off_t, (int, off_t, int)) \
    X(lseek64, off64_t, (int, off64_t, int)) \
    X(close, int, (int)) \
    X(close_range, int, (unsigned int, unsigned int, int)) \
    X(closefrom, void, (int)) \
    X(dup, int, (int)) \
    X(dup2, int, (int, int)) \
    X(dup3, int, (int, int, int)) \
    X(stat, int, (const char *, struct stat *)) \
    X(stat64, int, (const char *, struct stat64 *)) \
    X(lstat, int, (const char *, struct stat *)) \
    X(lstat64, int, (const char *, struct stat64 *)) \
    X(fstat, int, (int, struct stat *)) \
    X(fstat64, int, (int, struct stat64 *)) \
    X(fstatat, int, (int, const char *, struct stat *, int)) \
    X(fstatat64, int, (int, const char *, struct stat64 *, int)) \
    X(statx, int, (int, const char *, int, unsigned int, struct statx *)) \
    X(fsync, int, (int)) \
    X(fdatasync, int, (int)) \
    X(rename, int, (const char *, const char *)) \
    X(renameat, int, (int, const char *, int, const char *)) \
    X(renameat2, int, (int, const char *, int, const char *, unsigned int)) \
    X(mmap, void *, (void *, size_t, int, int, int, off_t)) \
    X(mmap64, void *, (void *, size_t, int, int, int, off64_t)) \
    X(munmap, int, (void *, size_t)) \
    X(_exit, void, (int)) \
    X(_Exit, void, (int)) \
    X(fopen, FILE *, (const char *, const char *)) \
    X(fopen64, FILE *, (const char *, const char *)) \
    X(fdopen, FILE *, (int, const char *)) \
    X(freopen, FILE *, (const char *, const char *, FILE *)) \
    X(freopen64, FILE *, (const char *, const char *, FILE *)) \
    X(fclose, int, (FILE *)) \
    X(fflush, int, (FILE *)) \
    X(fread, size_t, (void *, size_t, size_t, FILE *)) \
    X(fread_unlocked, size_t, (void *, size_t, size_t, FILE *)) \
    X(__fread_chk, size_t, (void *, size_t, size_t, size_t, FILE *)) \
    X(__fread_unlocked_chk, size_t, (void *, size_t, size_t, size_t, FILE *)) \
    X(fwrite, size_t, (const void *, size_t, size_t, FILE *)) \
    X(fwrite_unlocked, size_t, (const void *, size_t, size_t, FILE *)) \
    X(fgets, char *, (char *, int, FILE *)) \
    X(fgets_unlocked, char *, (char *, int, FILE *)) \
    X(__fgets_chk, char *, (char *, size_t, int, FILE *)) \
    X(__fgets_unlocked_chk, char *, (char *, size_t, int, FILE *)) \
    X(fgetc, int, (FILE *)) \
    X(getc, int, (FILE *)) \
    X(_IO_getc, int, (FILE *)) \
    X(fputc, int, (int, FILE *)) \
    X(putc, int, (int, FILE *)) \
    X(_IO_putc, int, (int, FILE *)) \
    X(fputs, int, (const char *, FILE *)) \
    X(fputs_unlocked, int, (const char *, FILE *)) \
    X(vfprintf, int, (FILE *, const char *, va_list)) \
    X(__vfprintf_chk, int, (FILE *, int, const char *, va_list)) \
    X(fseek, int, (FILE *, long, int)) \
    X(fseeko, int, (FILE *, off_t, int)) \
    X(fseeko64, int, (FILE *, off64_t, int)) \
    X(fsetpos, int, (FILE *, const fpos_t *)) \
    X(fsetpos64, int, (FILE *, const fpos64_t *)) \
    X(rewind, void, (FILE *)) \
    X(ftello, off_t, (FILE *))

/* compat-only symbols of older glibc (the *stat family before 2.33) */
#define REAL_COMPAT_FUNCS(X) \
    X(__xstat, int, (int, const char *, struct stat *)) \
    X(__xstat64, int, (int, const char *, struct stat64 *)) \
    X(__lxstat, int, (int, const char *, struct stat *)) \
    X(__lxstat64, int, (int, const char *, struct stat64 *)) \
    X(__fxstat, int, (int, int, struct stat *)) \
    X(__fxstat64, int, (int, int, struct stat64 *)) \
    X(__fxstatat, int, (int, int, const char *, struct stat *, int)) \
    X(__fxstatat64, int, (int, int, const char *, struct stat64 *, int))

#define DECL_REAL(name, ret, args) static ret(*real_##name) args;
REAL_FUNCS(DECL_REAL)
REAL_COMPAT_FUNCS(DECL_REAL)

static void resolve_all(void)
{
    if (tl_in)
        return; /* re-entered from dlsym: callers fall back to raw system calls */
    tl_in = 1;
#define RESOLVE(name, ret, args) \
    if (!real_##name) \
        __atomic_store_n(&real_##name, (ret(*) args)dlsym(RTLD_NEXT, #name), __ATOMIC_RELEASE);
#define RESOLVE_COMPAT(name, ret, args) \
    if (!real_##name) { \
        void *p__ = dlsym(RTLD_NEXT, #name); \
        if (!p__) \
            p__ = dlvsym(RTLD_NEXT, #name, "GLIBC_2.2.5"); \
        if (!p__) \
            p__ = dlvsym(RTLD_NEXT, #name, "GLIBC_2.4"); \
        __atomic_store_n(&real_##name, (ret(*) args)p__, __ATOMIC_RELEASE); \
    }
    REAL_FUNCS(RESOLVE)
    REAL_COMPAT_FUNCS(RESOLVE_COMPAT)
    tl_in = 0;
}

#define ENSURE(name) \
    do { \
        if (UNLIKELY(!real_##name)) \
            resolve_all(); \
    } while (0)

/* for calls with no system-call fallback: fail cleanly if libc's function cannot be found (only
 * possible when called from inside dlsym while we resolve) */
#define ENSURE_RET(name, fail) \
    do { \
        if (UNLIKELY(!real_##name)) { \
            resolve_all(); \
            if (!real_##name) { \
                errno = ENOSYS; \
                return fail; \
            } \
        } \
    } while (0)

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

static inline void add_time(int64_t *acc, int64_t t0, int64_t t1, int64_t *last_end)
{
    /* Darshan's DARSHAN_TIMER_INC_NO_OVERLAP, without counting time already covered. */
    int64_t start = t0 > *last_end ? t0 : *last_end;
    if (t1 > start)
        *acc += t1 - start;
    if (t1 > *last_end)
        *last_end = t1;
}

static inline void ts_first(int64_t *slot, int64_t wall)
{
    if (*slot == 0 || *slot > wall)
        *slot = wall;
}

static inline int bucket_of(int64_t n)
{
    if (n < 101) return 0;
    if (n < 1025) return 1;
    if (n < 10241) return 2;
    if (n < 102401) return 3;
    if (n < 1048577) return 4;
    if (n < 4194305) return 5;
    if (n < 10485761) return 6;
    if (n < 104857601) return 7;
    if (n < 1073741825) return 8;
    return 9;
}

static size_t fmt_int(char *out, long v)
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

/* ------------------------------------------------------------------------------------------------
 * Paths
 * ---------------------------------------------------------------------------------------------- */
/* Lexical normalisation of an absolute path in place: "//", "/./" and "/../" (like os.path.abspath). */
static size_t normalize(char *p, size_t n)
{
    size_t out = 0, i = 0;
    while (i < n) {
        while (i < n && p[i] == '/')
            i++;
        if (i >= n)
            break;
        size_t s = i;
        while (i < n && p[i] != '/')
            i++;
        size_t len = i - s;
        if (len == 1 && p[s] == '.')
            continue;
        if (len == 2 && p[s] == '.' && p[s + 1] == '.') {
            while (out > 0 && p[out - 1] != '/')
                out--;
            if (out > 0)
                out--;
            continue;
        }
        p[out++] = '/';
        memmove(p + out, p + s, len);
        out += len;
    }
    if (out == 0)
        p[out++] = '/';
    p[out] = 0;
    return out;
}

static ssize_t fd_link(int fd, char *buf, size_t cap)
{
    char link[32] = "/proc/self/fd/";
    fmt_int(link + 14, fd);
    ssize_t n = readlink(link, buf, cap - 1);
    if (n <= 0 || buf[0] != '/')
        return -1;
    buf[n] = 0;
    return n;
}

static const char *rec_path(const struct rec *r) { return g_arena + r->path_off; }

/* Absolute, normalised form of (dirfd, path) into buf[PATH_MAX]; returns its length or -1. */
static ssize_t abs_path(int dirfd, const char *path, char *buf)
{
    size_t plen, blen = 0;
    if (!path || !path[0])
        return -1;
    plen = strlen(path);
    if (path[0] != '/') {
        if (dirfd == AT_FDCWD) {
            if (!getcwd(buf, PATH_MAX))
                return -1;
            blen = strlen(buf);
        } else {
            int32_t v = ((unsigned)dirfd < FD_CAP) ? atomic_load(&g_fd[dirfd].rec) : 0;
            if (v > 0) {
                const struct rec *d = &g_recs[v - 1];
                if (d->path_len >= PATH_MAX)
                    return -1;
                memcpy(buf, rec_path(d), d->path_len);
                blen = d->path_len;
            } else {
                ssize_t n = fd_link(dirfd, buf, PATH_MAX);
                if (n < 0)
                    return -1;
                blen = (size_t)n;
            }
        }
        if (blen + 1 + plen + 1 > PATH_MAX)
            return -1;
        buf[blen++] = '/';
    } else if (plen + 1 > PATH_MAX) {
        return -1;
    }
    memcpy(buf + blen, path, plen);
    return (ssize_t)normalize(buf, blen + plen);
}

static int under_prefix(const char *p, size_t n, const char *q, size_t l)
{
    return n >= l && memcmp(p, q, l) == 0 && (n == l || p[l] == '/' || l == 1);
}

static int ends_with(const char *p, size_t n, const char *suffix)
{
    size_t l = strlen(suffix);
    return n >= l && memcmp(p + n - l, suffix, l) == 0;
}

/* A file of a Python installation, whichever interpreter it belongs to: a component
 * site-packages, dist-packages, __pycache__, *.dist-info or *.egg-info; the standard library
 * (lib/pythonX.Y, lib64/pythonX.Y); a pyvenv.cfg; Python sources and bytecode (.py .pyc .pyi .pth).
 * The same rules as holoprof.collect.io_paths.python_env_path. */
static int python_env_path(const char *p, size_t n)
{
    if (ends_with(p, n, ".py") || ends_with(p, n, ".pyc") || ends_with(p, n, ".pyi") ||
        ends_with(p, n, ".pth") || ends_with(p, n, "/pyvenv.cfg"))
        return 1;
    const char *prev = NULL;
    size_t prev_len = 0;
    size_t i = 0;
    while (i < n) {
        while (i < n && p[i] == '/')
            i++;
        size_t j = i;
        while (j < n && p[j] != '/')
            j++;
        const char *c = p + i;
        size_t l = j - i;
        if (j < n) { /* a directory component */
            if ((l == 13 && memcmp(c, "site-packages", 13) == 0) ||
                (l == 13 && memcmp(c, "dist-packages", 13) == 0) ||
                (l == 11 && memcmp(c, "__pycache__", 11) == 0) || ends_with(c, l, ".dist-info") ||
                ends_with(c, l, ".egg-info"))
                return 1;
            if (prev && l > 6 && memcmp(c, "python", 6) == 0 && c[6] >= '0' && c[6] <= '9' &&
                ((prev_len == 3 && memcmp(prev, "lib", 3) == 0) ||
                 (prev_len == 5 && memcmp(prev, "lib64", 5) == 0)))
                return 1;
        }
        prev = c;
        prev_len = l;
        i = j;
    }
    return 0;
}

static int excluded(const char *p, size_t n)
{
    if (g_run_dir_len && under_prefix(p, n, g_run_dir, g_run_dir_len))
        return 1;
    for (int i = 0; i < g_nexcl; i++)
        if (under_prefix(p, n, g_excl[i], g_excl_len[i]))
            return 1;
    if (python_env_path(p, n)) {
        for (int i = 0; i < g_nincl; i++)
            if (under_prefix(p, n, g_incl[i], g_incl_len[i]))
                return 0;
        return 1;
    }
    return 0;
}

static int32_t follow_rename(int fd, int32_t ri);

/* ------------------------------------------------------------------------------------------------
 * File records
 * ---------------------------------------------------------------------------------------------- */
static inline uint64_t path_hash(int module, const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)(module + 1) * 0x9E3779B97F4A7C15ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ULL;
    }
    return h ? h : 1;
}

static inline int rec_matches(const struct rec *r, uint64_t h, int module, const char *p, size_t n)
{
    return r->hash == h && r->module == module && r->path_len == n &&
           memcmp(g_arena + r->path_off, p, n) == 0;
}

/* The record of (module, path) if there is one, else -1 (never creates one). */
static int32_t find_rec(int module, const char *p, size_t n)
{
    uint64_t h = path_hash(module, p, n);
    for (uint32_t i = (uint32_t)h & (HT_SIZE - 1);; i = (i + 1) & (HT_SIZE - 1)) {
        uint32_t v = atomic_load_explicit(&g_ht[i], memory_order_acquire);
        if (v == 0)
            return -1;
        if (rec_matches(&g_recs[v - 1], h, module, p, n))
            return (int32_t)(v - 1);
    }
}

/* Find or create the record of (module, path); returns its index or -1 (table full). tl_in is set. */
static int32_t get_rec(int module, const char *p, size_t n)
{
    uint64_t h = path_hash(module, p, n);
    uint32_t i = (uint32_t)h & (HT_SIZE - 1);
    for (;;) {
        uint32_t v = atomic_load_explicit(&g_ht[i], memory_order_acquire);
        if (v == 0)
            break;
        if (rec_matches(&g_recs[v - 1], h, module, p, n))
            return (int32_t)(v - 1);
        i = (i + 1) & (HT_SIZE - 1);
    }
    pthread_mutex_lock(&g_insert_mu);
    i = (uint32_t)h & (HT_SIZE - 1);
    for (;;) {
        uint32_t v = atomic_load_explicit(&g_ht[i], memory_order_acquire);
        if (v == 0)
            break;
        if (rec_matches(&g_recs[v - 1], h, module, p, n)) {
            pthread_mutex_unlock(&g_insert_mu);
            return (int32_t)(v - 1);
        }
        i = (i + 1) & (HT_SIZE - 1);
    }
    uint32_t idx = atomic_load_explicit(&g_nrec, memory_order_relaxed);
    if (idx >= g_max_recs || n > 65535 || g_arena_used + n + 1 > ARENA_SIZE) {
        pthread_mutex_unlock(&g_insert_mu);
        atomic_fetch_add(&g_dropped, 1);
        return -1;
    }
    struct rec *r = &g_recs[idx];
    memset(r, 0, sizeof *r);
    r->hash = h;
    r->module = (uint8_t)module;
    r->path_off = g_arena_used;
    r->path_len = (uint16_t)n;
    r->gen = g_gen;
    memcpy(g_arena + g_arena_used, p, n);
    g_arena[g_arena_used + n] = 0;
    g_arena_used += (uint32_t)n + 1;
    atomic_store_explicit(&g_ht[i], idx + 1, memory_order_release);
    atomic_store_explicit(&g_nrec, idx + 1, memory_order_release);
    pthread_mutex_unlock(&g_insert_mu);
    return (int32_t)idx;
}

/* ------------------------------------------------------------------------------------------------
 * Trace ring
 * ---------------------------------------------------------------------------------------------- */
static void trace_push(int module, uint32_t rec, int op, int64_t off, int64_t size, int64_t t0, int64_t t1)
{
    atomic_fetch_add(&g_trace_inflight, 1);
    struct ring *r = atomic_load(&g_ring);
    if (r) {
        uint64_t pos = atomic_load_explicit(&r->head, memory_order_relaxed);
        struct tslot *s;
        for (;;) {
            s = &r->slots[pos % r->cap];
            uint64_t seq = atomic_load_explicit(&s->seq, memory_order_acquire);
            int64_t dif = (int64_t)(seq - pos);
            if (dif == 0) {
                if (atomic_compare_exchange_weak_explicit(&r->head, &pos, pos + 1, memory_order_relaxed,
                                                          memory_order_relaxed))
                    break;
            } else if (dif < 0) {
                atomic_fetch_add_explicit(&g_trace_dropped, 1, memory_order_relaxed);
                s = NULL;
                break;
            } else {
                pos = atomic_load_explicit(&r->head, memory_order_relaxed);
            }
        }
        if (s) {
            s->r.rec = rec;
            s->r.module = (uint8_t)module;
            s->r.op = (uint8_t)op;
            s->r.pad = 0;
            s->r.offset = off;
            s->r.size = size;
            s->r.start_ns = wall_of(t0);
            s->r.end_ns = wall_of(t1);
            atomic_store_explicit(&s->seq, pos + 1, memory_order_release);
        }
    }
    atomic_fetch_sub(&g_trace_inflight, 1);
}

#define TRACE(module, rec, op, off, size, t0, t1) \
    do { \
        if (UNLIKELY(atomic_load_explicit(&g_trace_on, memory_order_relaxed))) \
            trace_push(module, rec, op, off, size, t0, t1); \
    } while (0)

/* detach the producing ring and wait until no producer still writes to it; g_trace_mu held */
static void trace_detach(void)
{
    atomic_store(&g_trace_on, 0);
    atomic_exchange(&g_ring, NULL);
    while (atomic_load(&g_trace_inflight) > 0)
        sched_yield();
}

/* ------------------------------------------------------------------------------------------------
 * Recording (called after the real call, with tl_in set)
 * ---------------------------------------------------------------------------------------------- */
static void posix_io(uint32_t ri, int is_write, int64_t off, int64_t n, int64_t t0, int64_t t1)
{
    struct rec *r = &g_recs[ri];
    int64_t w0 = wall_of(t0), w1 = wall_of(t1), el = t1 - t0;
    lock_rec(ri);
    touch(r);
    int64_t *c = r->c, *f = r->f;
    if (!is_write) {
        if (off > r->last_byte_read)
            c[POSIX_SEQ_READS]++;
        if (off == r->last_byte_read + 1)
            c[POSIX_CONSEC_READS]++;
        r->last_byte_read = off + n - 1;
        if (c[POSIX_MAX_BYTE_READ] < off + n - 1)
            c[POSIX_MAX_BYTE_READ] = off + n - 1;
        c[POSIX_BYTES_READ] += n;
        c[POSIX_READS]++;
        c[POSIX_SIZE_READ_0_100 + bucket_of(n)]++;
        if (r->last_io == IO_WRITE)
            c[POSIX_RW_SWITCHES]++;
        r->last_io = IO_READ;
        ts_first(&f[POSIX_F_READ_START_TIMESTAMP], w0);
        f[POSIX_F_READ_END_TIMESTAMP] = w1;
        if (f[POSIX_F_MAX_READ_TIME] < el) {
            f[POSIX_F_MAX_READ_TIME] = el;
            c[POSIX_MAX_READ_TIME_SIZE] = n;
        }
        add_time(&f[POSIX_F_READ_TIME], t0, t1, &r->last_read_end);
    } else {
        if (off > r->last_byte_written)
            c[POSIX_SEQ_WRITES]++;
        if (off == r->last_byte_written + 1)
            c[POSIX_CONSEC_WRITES]++;
        r->last_byte_written = off + n - 1;
        if (c[POSIX_MAX_BYTE_WRITTEN] < off + n - 1)
            c[POSIX_MAX_BYTE_WRITTEN] = off + n - 1;
        c[POSIX_BYTES_WRITTEN] += n;
        c[POSIX_WRITES]++;
        c[POSIX_SIZE_WRITE_0_100 + bucket_of(n)]++;
        if (r->last_io == IO_READ)
            c[POSIX_RW_SWITCHES]++;
        r->last_io = IO_WRITE;
        ts_first(&f[POSIX_F_WRITE_START_TIMESTAMP], w0);
        f[POSIX_F_WRITE_END_TIMESTAMP] = w1;
        if (f[POSIX_F_MAX_WRITE_TIME] < el) {
            f[POSIX_F_MAX_WRITE_TIME] = el;
            c[POSIX_MAX_WRITE_TIME_SIZE] = n;
        }
        add_time(&f[POSIX_F_WRITE_TIME], t0, t1, &r->last_write_end);
    }
    unlock_rec(ri);
    TRACE(MOD_POSIX, ri, is_write ? OP_WRITE : OP_READ, off, n, t0, t1);
}

enum { META_OPEN, META_DUP, META_CLOSE, META_SEEK, META_STAT, META_FSYNC, META_FDSYNC };

static void posix_meta(uint32_t ri, int kind, int64_t off, int64_t t0, int64_t t1)
{
    struct rec *r = &g_recs[ri];
    int64_t *c = r->c, *f = r->f;
    int op = OP_OPEN;
    lock_rec(ri);
    touch(r);
    switch (kind) {
    case META_OPEN:
    case META_DUP:
        if (kind == META_OPEN) {
            r->last_byte_read = 0;
            r->last_byte_written = 0;
        } else {
            c[POSIX_DUPS]++;
        }
        c[POSIX_OPENS]++;
        ts_first(&f[POSIX_F_OPEN_START_TIMESTAMP], wall_of(t0));
        f[POSIX_F_OPEN_END_TIMESTAMP] = wall_of(t1);
        add_time(&f[POSIX_F_META_TIME], t0, t1, &r->last_meta_end);
        break;
    case META_CLOSE:
        op = OP_CLOSE;
        r->last_byte_read = 0;
        r->last_byte_written = 0;
        ts_first(&f[POSIX_F_CLOSE_START_TIMESTAMP], wall_of(t0));
        f[POSIX_F_CLOSE_END_TIMESTAMP] = wall_of(t1);
        add_time(&f[POSIX_F_META_TIME], t0, t1, &r->last_meta_end);
        break;
    case META_SEEK:
        op = OP_SEEK;
        c[POSIX_SEEKS]++;
        add_time(&f[POSIX_F_META_TIME], t0, t1, &r->last_meta_end);
        break;
    case META_STAT:
        op = OP_STAT;
        c[POSIX_STATS]++;
        add_time(&f[POSIX_F_META_TIME], t0, t1, &r->last_meta_end);
        break;
    case META_FSYNC:
    case META_FDSYNC:
        op = OP_SYNC;
        c[kind == META_FSYNC ? POSIX_FSYNCS : POSIX_FDSYNCS]++;
        add_time(&f[POSIX_F_WRITE_TIME], t0, t1, &r->last_write_end);
        break;
    }
    unlock_rec(ri);
    TRACE(MOD_POSIX, ri, op, off, 0, t0, t1);
}

static void stdio_io(uint32_t ri, int is_write, int64_t off, int64_t n, int64_t t0, int64_t t1)
{
    struct rec *r = &g_recs[ri];
    int64_t *c = r->c, *f = r->f;
    lock_rec(ri);
    touch(r);
    if (!is_write) {
        if (c[STDIO_MAX_BYTE_READ] < off + n - 1)
            c[STDIO_MAX_BYTE_READ] = off + n - 1;
        c[STDIO_BYTES_READ] += n;
        c[STDIO_READS]++;
        ts_first(&f[STDIO_F_READ_START_TIMESTAMP], wall_of(t0));
        f[STDIO_F_READ_END_TIMESTAMP] = wall_of(t1);
        add_time(&f[STDIO_F_READ_TIME], t0, t1, &r->last_read_end);
    } else {
        if (c[STDIO_MAX_BYTE_WRITTEN] < off + n - 1)
            c[STDIO_MAX_BYTE_WRITTEN] = off + n - 1;
        c[STDIO_BYTES_WRITTEN] += n;
        c[STDIO_WRITES]++;
        ts_first(&f[STDIO_F_WRITE_START_TIMESTAMP], wall_of(t0));
        f[STDIO_F_WRITE_END_TIMESTAMP] = wall_of(t1);
        add_time(&f[STDIO_F_WRITE_TIME], t0, t1, &r->last_write_end);
    }
    unlock_rec(ri);
    TRACE(MOD_STDIO, ri, is_write ? OP_WRITE : OP_READ, off, n, t0, t1);
}

enum { SMETA_OPEN, SMETA_FDOPEN, SMETA_CLOSE, SMETA_SEEK, SMETA_FLUSH };

static void stdio_meta(uint32_t ri, int kind, int64_t off, int64_t t0, int64_t t1)
{
    struct rec *r = &g_recs[ri];
    int64_t *c = r->c, *f = r->f;
    int op = OP_OPEN;
    lock_rec(ri);
    touch(r);
    switch (kind) {
    case SMETA_OPEN:
    case SMETA_FDOPEN:
        c[STDIO_OPENS]++;
        if (kind == SMETA_FDOPEN)
            c[STDIO_FDOPENS]++;
        ts_first(&f[STDIO_F_OPEN_START_TIMESTAMP], wall_of(t0));
        f[STDIO_F_OPEN_END_TIMESTAMP] = wall_of(t1);
        add_time(&f[STDIO_F_META_TIME], t0, t1, &r->last_meta_end);
        break;
    case SMETA_CLOSE:
        op = OP_CLOSE;
        ts_first(&f[STDIO_F_CLOSE_START_TIMESTAMP], wall_of(t0));
        f[STDIO_F_CLOSE_END_TIMESTAMP] = wall_of(t1);
        add_time(&f[STDIO_F_META_TIME], t0, t1, &r->last_meta_end);
        break;
    case SMETA_SEEK:
        op = OP_SEEK;
        c[STDIO_SEEKS]++;
        add_time(&f[STDIO_F_META_TIME], t0, t1, &r->last_meta_end);
        break;
    case SMETA_FLUSH:
        op = OP_FLUSH;
        c[STDIO_FLUSHES]++;
        add_time(&f[STDIO_F_WRITE_TIME], t0, t1, &r->last_write_end);
        break;
    }
    unlock_rec(ri);
    TRACE(MOD_STDIO, ri, op, off, 0, t0, t1);
}

/* ------------------------------------------------------------------------------------------------
 * Descriptor tracking
 * ---------------------------------------------------------------------------------------------- */
/* First use of a descriptor we never saw opened (inherited across exec, redirected, or opened by a
 * call we do not interpose): attribute it if it is a regular file. */
static int32_t probe_fd(int fd)
{
    struct fdslot *s = &g_fd[fd];
    int32_t v = -1;
    int e = errno;
    tl_in = 1;
    if (foreign_process())
        goto out_nostore;
    struct stat st;
    ENSURE(fstat);
    if (!real_fstat || real_fstat(fd, &st) != 0) {
        goto out_nostore; /* closed or invalid: decide again at the next use */
    }
    if (S_ISREG(st.st_mode)) {
        char buf[PATH_MAX];
        ssize_t n = fd_link(fd, buf, sizeof buf);
        if (n > 0) {
            n = (ssize_t)normalize(buf, (size_t)n);
            if (!excluded(buf, (size_t)n)) {
                int32_t ri = get_rec(MOD_POSIX, buf, (size_t)n);
                if (ri >= 0) {
                    off64_t o = real_lseek64 ? real_lseek64(fd, 0, SEEK_CUR) : 0;
                    atomic_store(&s->off, o < 0 ? 0 : (int64_t)o);
                    v = ri + 1;
                }
            }
        }
    }
    {
        int32_t expect = 0;
        if (!atomic_compare_exchange_strong(&s->rec, &expect, v))
            v = expect;
    }
    tl_in = 0;
    errno = e;
    return v;
out_nostore:
    tl_in = 0;
    errno = e;
    return -1;
}

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

static void posix_opened(int fd, int dirfd, const char *path, int flags, int64_t t0, int64_t t1)
{
    if ((unsigned)fd >= FD_CAP)
        return;
    struct fdslot *s = &g_fd[fd];
    int e = errno;
    tl_in = 1;
    int32_t v = -1;
    atomic_store(&s->srec, 0);
    atomic_store(&s->fp, NULL);
    if (!(flags & (O_DIRECTORY | O_PATH))) {
        char buf[PATH_MAX];
        ssize_t n = abs_path(dirfd, path, buf);
        if (n > 0 && !excluded(buf, (size_t)n)) {
            int32_t ri = get_rec(MOD_POSIX, buf, (size_t)n);
            if (ri >= 0) {
                int64_t off = 0;
                if ((flags & O_APPEND) && real_lseek64) {
                    off64_t o = real_lseek64(fd, 0, SEEK_END);
                    off = o < 0 ? 0 : (int64_t)o;
                }
                atomic_store(&s->off, off);
                posix_meta((uint32_t)ri, META_OPEN, 0, t0, t1);
                v = ri + 1;
            }
        }
    }
    atomic_store(&s->rec, v);
    tl_in = 0;
    errno = e;
}

/* ------------------------------------------------------------------------------------------------
 * POSIX wrappers
 * ---------------------------------------------------------------------------------------------- */
#define NEEDS_MODE(flags) (((flags) & O_CREAT) || (((flags) & O_TMPFILE) == O_TMPFILE))

#define OPEN_TRACKED(REALCALL, DIRFD) \
    if (!active()) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    int fd = REALCALL; \
    int64_t t1 = mono_ns(); \
    if (fd >= 0) \
        posix_opened(fd, DIRFD, path, flags, t0, t1); \
    return fd;

#define GET_MODE() \
    mode_t mode = 0; \
    if (NEEDS_MODE(flags)) { \
        va_list ap; \
        va_start(ap, flags); \
        mode = (mode_t)va_arg(ap, int); \
        va_end(ap); \
    }

EXPORT int open(const char *path, int flags, ...)
{
    GET_MODE();
    ENSURE(open);
    if (UNLIKELY(!real_open))
        return (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);
    OPEN_TRACKED(real_open(path, flags, mode), AT_FDCWD)
}

EXPORT int open64(const char *path, int flags, ...)
{
    GET_MODE();
    ENSURE(open64);
    if (UNLIKELY(!real_open64))
        return (int)syscall(SYS_openat, AT_FDCWD, path, flags | O_LARGEFILE, mode);
    OPEN_TRACKED(real_open64(path, flags, mode), AT_FDCWD)
}

EXPORT int __open_2(const char *path, int flags)
{
    ENSURE(__open_2);
    if (UNLIKELY(!real___open_2))
        return open(path, flags);
    OPEN_TRACKED(real___open_2(path, flags), AT_FDCWD)
}

EXPORT int __open64_2(const char *path, int flags)
{
    ENSURE(__open64_2);
    if (UNLIKELY(!real___open64_2))
        return open64(path, flags);
    OPEN_TRACKED(real___open64_2(path, flags), AT_FDCWD)
}

EXPORT int openat(int dirfd, const char *path, int flags, ...)
{
    GET_MODE();
    ENSURE(openat);
    if (UNLIKELY(!real_openat))
        return (int)syscall(SYS_openat, dirfd, path, flags, mode);
    OPEN_TRACKED(real_openat(dirfd, path, flags, mode), dirfd)
}

EXPORT int openat64(int dirfd, const char *path, int flags, ...)
{
    GET_MODE();
    ENSURE(openat64);
    if (UNLIKELY(!real_openat64))
        return (int)syscall(SYS_openat, dirfd, path, flags | O_LARGEFILE, mode);
    OPEN_TRACKED(real_openat64(dirfd, path, flags, mode), dirfd)
}

EXPORT int __openat_2(int dirfd, const char *path, int flags)
{
    ENSURE(__openat_2);
    if (UNLIKELY(!real___openat_2))
        return openat(dirfd, path, flags);
    OPEN_TRACKED(real___openat_2(dirfd, path, flags), dirfd)
}

EXPORT int __openat64_2(int dirfd, const char *path, int flags)
{
    ENSURE(__openat64_2);
    if (UNLIKELY(!real___openat64_2))
        return openat64(dirfd, path, flags);
    OPEN_TRACKED(real___openat64_2(dirfd, path, flags), dirfd)
}

EXPORT int creat(const char *path, mode_t mode)
{
    int flags = O_CREAT | O_WRONLY | O_TRUNC;
    ENSURE(creat);
    if (UNLIKELY(!real_creat))
        return open(path, flags, mode);
    OPEN_TRACKED(real_creat(path, mode), AT_FDCWD)
}

EXPORT int creat64(const char *path, mode_t mode)
{
    int flags = O_CREAT | O_WRONLY | O_TRUNC;
    ENSURE(creat64);
    if (UNLIKELY(!real_creat64))
        return open64(path, flags, mode);
    OPEN_TRACKED(real_creat64(path, mode), AT_FDCWD)
}

/* read-like calls: `off` < 0 means "at the descriptor's offset, which then advances" */
#define IO_BODY(IS_WRITE, REALCALL, OFFEXPR) \
    int32_t ri = fd_rec(fd); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t off__ = (OFFEXPR); \
    int64_t t0 = mono_ns(); \
    ssize_t r = REALCALL; \
    int64_t t1 = mono_ns(); \
    if (r >= 0) { \
        int e = errno; \
        tl_in = 1; \
        if (off__ < 0) \
            off__ = atomic_fetch_add(&g_fd[fd].off, (int64_t)r); \
        posix_io((uint32_t)ri, IS_WRITE, off__, (int64_t)r, t0, t1); \
        tl_in = 0; \
        errno = e; \
    } \
    return r;

EXPORT ssize_t read(int fd, void *buf, size_t n)
{
    ENSURE(read);
    if (UNLIKELY(!real_read))
        return syscall(SYS_read, fd, buf, n);
    IO_BODY(0, real_read(fd, buf, n), -1)
}

EXPORT ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen)
{
    ENSURE(__read_chk);
    if (UNLIKELY(!real___read_chk))
        return read(fd, buf, n);
    IO_BODY(0, real___read_chk(fd, buf, n, buflen), -1)
}

EXPORT ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
    ENSURE(pread);
    if (UNLIKELY(!real_pread))
        return syscall(SYS_pread64, fd, buf, n, off);
    IO_BODY(0, real_pread(fd, buf, n, off), off)
}

EXPORT ssize_t pread64(int fd, void *buf, size_t n, off64_t off)
{
    ENSURE(pread64);
    if (UNLIKELY(!real_pread64))
        return syscall(SYS_pread64, fd, buf, n, off);
    IO_BODY(0, real_pread64(fd, buf, n, off), off)
}

EXPORT ssize_t __pread_chk(int fd, void *buf, size_t n, off_t off, size_t buflen)
{
    ENSURE(__pread_chk);
    if (UNLIKELY(!real___pread_chk))
        return pread(fd, buf, n, off);
    IO_BODY(0, real___pread_chk(fd, buf, n, off, buflen), off)
}

EXPORT ssize_t __pread64_chk(int fd, void *buf, size_t n, off64_t off, size_t buflen)
{
    ENSURE(__pread64_chk);
    if (UNLIKELY(!real___pread64_chk))
        return pread64(fd, buf, n, off);
    IO_BODY(0, real___pread64_chk(fd, buf, n, off, buflen), off)
}

EXPORT ssize_t readv(int fd, const struct iovec *iov, int cnt)
{
    ENSURE(readv);
    if (UNLIKELY(!real_readv))
        return syscall(SYS_readv, fd, iov, cnt);
    IO_BODY(0, real_readv(fd, iov, cnt), -1)
}

EXPORT ssize_t preadv(int fd, const struct iovec *iov, int cnt, off_t off)
{
    ENSURE(preadv);
    if (UNLIKELY(!real_preadv))
        return syscall(SYS_preadv, fd, iov, cnt, off, 0);
    IO_BODY(0, real_preadv(fd, iov, cnt, off), off)
}

EXPORT ssize_t preadv64(int fd, const struct iovec *iov, int cnt, off64_t off)
{
    ENSURE(preadv64);
    if (UNLIKELY(!real_preadv64))
        return syscall(SYS_preadv, fd, iov, cnt, off, 0);
    IO_BODY(0, real_preadv64(fd, iov, cnt, off), off)
}

EXPORT ssize_t preadv2(int fd, const struct iovec *iov, int cnt, off_t off, int fl)
{
    ENSURE(preadv2);
    if (UNLIKELY(!real_preadv2)) {
        errno = ENOSYS;
        return -1;
    }
    IO_BODY(0, real_preadv2(fd, iov, cnt, off, fl), off)
}

EXPORT ssize_t preadv64v2(int fd, const struct iovec *iov, int cnt, off64_t off, int fl)
{
    ENSURE(preadv64v2);
    if (UNLIKELY(!real_preadv64v2)) {
        errno = ENOSYS;
        return -1;
    }
    IO_BODY(0, real_preadv64v2(fd, iov, cnt, off, fl), off)
}

EXPORT ssize_t write(int fd, const void *buf, size_t n)
{
    ENSURE(write);
    if (UNLIKELY(!real_write))
        return syscall(SYS_write, fd, buf, n);
    IO_BODY(1, real_write(fd, buf, n), -1)
}

EXPORT ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
    ENSURE(pwrite);
    if (UNLIKELY(!real_pwrite))
        return syscall(SYS_pwrite64, fd, buf, n, off);
    IO_BODY(1, real_pwrite(fd, buf, n, off), off)
}

EXPORT ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t off)
{
    ENSURE(pwrite64);
    if (UNLIKELY(!real_pwrite64))
        return syscall(SYS_pwrite64, fd, buf, n, off);
    IO_BODY(1, real_pwrite64(fd, buf, n, off), off)
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
    ENSURE(writev);
    if (UNLIKELY(!real_writev))
        return syscall(SYS_writev, fd, iov, cnt);
    IO_BODY(1, real_writev(fd, iov, cnt), -1)
}

EXPORT ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off)
{
    ENSURE(pwritev);
    if (UNLIKELY(!real_pwritev))
        return syscall(SYS_pwritev, fd, iov, cnt, off, 0);
    IO_BODY(1, real_pwritev(fd, iov, cnt, off), off)
}

EXPORT ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off64_t off)
{
    ENSURE(pwritev64);
    if (UNLIKELY(!real_pwritev64))
        return syscall(SYS_pwritev, fd, iov, cnt, off, 0);
    IO_BODY(1, real_pwritev64(fd, iov, cnt, off), off)
}

EXPORT ssize_t pwritev2(int fd, const struct iovec *iov, int cnt, off_t off, int fl)
{
    ENSURE(pwritev2);
    if (UNLIKELY(!real_pwritev2)) {
        errno = ENOSYS;
        return -1;
    }
    IO_BODY(1, real_pwritev2(fd, iov, cnt, off, fl), off)
}

EXPORT ssize_t pwritev64v2(int fd, const struct iovec *iov, int cnt, off64_t off, int fl)
{
    ENSURE(pwritev64v2);
    if (UNLIKELY(!real_pwritev64v2)) {
        errno = ENOSYS;
        return -1;
    }
    IO_BODY(1, real_pwritev64v2(fd, iov, cnt, off, fl), off)
}

/* In-kernel copies: a read of the source and a write of the destination. */
static void copy_done(int in_fd, int32_t rin, int64_t in_off, int out_fd, int32_t rout, int64_t out_off,
                      ssize_t r, int64_t t0, int64_t t1)
{
    int e = errno;
    tl_in = 1;
    if (rin >= 0) {
        if (in_off < 0)
            in_off = atomic_fetch_add(&g_fd[in_fd].off, (int64_t)r);
        posix_io((uint32_t)rin, 0, in_off, (int64_t)r, t0, t1);
    }
    if (rout >= 0) {
        if (out_off < 0)
            out_off = atomic_fetch_add(&g_fd[out_fd].off, (int64_t)r);
        posix_io((uint32_t)rout, 1, out_off, (int64_t)r, t0, t1);
    }
    tl_in = 0;
    errno = e;
}

EXPORT ssize_t copy_file_range(int in_fd, off64_t *in_off, int out_fd, off64_t *out_off, size_t len,
                               unsigned int fl)
{
    ENSURE(copy_file_range);
    if (UNLIKELY(!real_copy_file_range))
        return syscall(SYS_copy_file_range, in_fd, in_off, out_fd, out_off, len, fl);
    int32_t rin = fd_rec(in_fd), rout = fd_rec(out_fd);
    if (LIKELY(rin < 0 && rout < 0))
        return real_copy_file_range(in_fd, in_off, out_fd, out_off, len, fl);
    int64_t io = in_off ? (int64_t)*in_off : -1, oo = out_off ? (int64_t)*out_off : -1;
    int64_t t0 = mono_ns();
    ssize_t r = real_copy_file_range(in_fd, in_off, out_fd, out_off, len, fl);
    int64_t t1 = mono_ns();
    if (r >= 0)
        copy_done(in_fd, rin, io, out_fd, rout, oo, r, t0, t1);
    return r;
}

EXPORT ssize_t sendfile(int out_fd, int in_fd, off_t *off, size_t count)
{
    ENSURE(sendfile);
    if (UNLIKELY(!real_sendfile))
        return syscall(SYS_sendfile, out_fd, in_fd, off, count);
    int32_t rin = fd_rec(in_fd), rout = fd_rec(out_fd);
    if (LIKELY(rin < 0 && rout < 0))
        return real_sendfile(out_fd, in_fd, off, count);
    int64_t io = off ? (int64_t)*off : -1;
    int64_t t0 = mono_ns();
    ssize_t r = real_sendfile(out_fd, in_fd, off, count);
    int64_t t1 = mono_ns();
    if (r >= 0)
        copy_done(in_fd, rin, io, out_fd, rout, -1, r, t0, t1);
    return r;
}

EXPORT ssize_t sendfile64(int out_fd, int in_fd, off64_t *off, size_t count)
{
    ENSURE(sendfile64);
    if (UNLIKELY(!real_sendfile64))
        return syscall(SYS_sendfile, out_fd, in_fd, off, count);
    int32_t rin = fd_rec(in_fd), rout = fd_rec(out_fd);
    if (LIKELY(rin < 0 && rout < 0))
        return real_sendfile64(out_fd, in_fd, off, count);
    int64_t io = off ? (int64_t)*off : -1;
    int64_t t0 = mono_ns();
    ssize_t r = real_sendfile64(out_fd, in_fd, off, count);
    int64_t t1 = mono_ns();
    if (r >= 0)
        copy_done(in_fd, rin, io, out_fd, rout, -1, r, t0, t1);
    return r;
}

#define SEEK_BODY(REALCALL) \
    int32_t ri = fd_rec(fd); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    off64_t r = REALCALL; \
    int64_t t1 = mono_ns(); \
    if (r >= 0) { \
        int e = errno; \
        tl_in = 1; \
        atomic_store(&g_fd[fd].off, (int64_t)r); \
        posix_meta((uint32_t)ri, META_SEEK, (int64_t)r, t0, t1); \
        tl_in = 0; \
        errno = e; \
    } \
    return r;

EXPORT off_t lseek(int fd, off_t off, int whence)
{
    ENSURE(lseek);
    if (UNLIKELY(!real_lseek))
        return syscall(SYS_lseek, fd, off, whence);
    SEEK_BODY(real_lseek(fd, off, whence))
}

EXPORT off64_t lseek64(int fd, off64_t off, int whence)
{
    ENSURE(lseek64);
    if (UNLIKELY(!real_lseek64))
        return syscall(SYS_lseek, fd, off, whence);
    SEEK_BODY(real_lseek64(fd, off, whence))
}

EXPORT int close(int fd)
{
    ENSURE(close);
    if (UNLIKELY(!real_close))
        return (int)syscall(SYS_close, fd);
    if (!active() || (unsigned)fd >= FD_CAP)
        return real_close(fd);
    struct fdslot *s = &g_fd[fd];
    int32_t v = atomic_load_explicit(&s->rec, memory_order_relaxed);
    int32_t sv = atomic_load_explicit(&s->srec, memory_order_relaxed);
    if (v <= 0 && sv == 0)
        return real_close(fd); /* untracked, or never used: nothing to forget */
    if (foreign_process())
        return real_close(fd);
    if (v > 0) {
        int e = errno;
        tl_in = 1;
        v = follow_rename(fd, v - 1) + 1;
        tl_in = 0;
        errno = e;
    }
    /* forget the descriptor before the kernel can hand its number to another thread's open();
     * a number reused by a call we do not see (fcntl(F_DUPFD), socket, opendir) is probed anew */
    atomic_store(&s->rec, 0);
    atomic_store(&s->srec, 0);
    atomic_store(&s->fp, NULL);
    int64_t t0 = mono_ns();
    int r = real_close(fd);
    int64_t t1 = mono_ns();
    if (v > 0) {
        int e = errno;
        tl_in = 1;
        posix_meta((uint32_t)(v - 1), META_CLOSE, 0, t0, t1);
        tl_in = 0;
        errno = e;
    }
    return r;
}

static void forget_range(unsigned int first, unsigned int last)
{
    if (first >= FD_CAP)
        return;
    if (last >= FD_CAP)
        last = FD_CAP - 1;
    for (unsigned int i = first; i <= last; i++) {
        struct fdslot *s = &g_fd[i];
        if (atomic_load_explicit(&s->rec, memory_order_relaxed) != -1)
            atomic_store(&s->rec, 0); /* decide again at the next use */
        atomic_store(&s->srec, 0);
        atomic_store(&s->fp, NULL);
    }
}

EXPORT int close_range(unsigned int first, unsigned int last, int flags)
{
    ENSURE(close_range);
    if (UNLIKELY(!real_close_range)) {
#ifdef SYS_close_range
        return (int)syscall(SYS_close_range, first, last, flags);
#else
        errno = ENOSYS;
        return -1;
#endif
    }
    if (active() && !(flags & CLOSE_RANGE_CLOEXEC) && first <= last && !foreign_process())
        forget_range(first, last);
    return real_close_range(first, last, flags);
}

EXPORT void closefrom(int lowfd)
{
    ENSURE(closefrom);
    if (active() && lowfd >= 0 && !foreign_process())
        forget_range((unsigned int)lowfd, ~0u);
    if (real_closefrom)
        real_closefrom(lowfd);
#ifdef SYS_close_range
    else
        syscall(SYS_close_range, (unsigned int)lowfd, ~0u, 0);
#endif
}

static void dup_done(int oldfd, int newfd, int64_t t0, int64_t t1)
{
    if ((unsigned)newfd >= FD_CAP || foreign_process())
        return;
    int e = errno;
    struct fdslot *d = &g_fd[newfd];
    int32_t v = -1;
    if ((unsigned)oldfd < FD_CAP) {
        v = atomic_load(&g_fd[oldfd].rec);
        if (v > 0)
            atomic_store(&d->off, atomic_load(&g_fd[oldfd].off));
    }
    atomic_store(&d->srec, 0);
    atomic_store(&d->fp, NULL);
    atomic_store(&d->rec, v == 0 ? 0 : v);
    if (v > 0) {
        tl_in = 1;
        posix_meta((uint32_t)(v - 1), META_DUP, 0, t0, t1);
        tl_in = 0;
    }
    errno = e;
}

EXPORT int dup(int oldfd)
{
    ENSURE(dup);
    if (UNLIKELY(!real_dup))
        return (int)syscall(SYS_dup, oldfd);
    if (!active())
        return real_dup(oldfd);
    int64_t t0 = mono_ns();
    int r = real_dup(oldfd);
    int64_t t1 = mono_ns();
    if (r >= 0)
        dup_done(oldfd, r, t0, t1);
    return r;
}

EXPORT int dup2(int oldfd, int newfd)
{
    ENSURE(dup2);
    if (UNLIKELY(!real_dup2)) {
#ifdef SYS_dup2
        return (int)syscall(SYS_dup2, oldfd, newfd);
#else
        return (int)syscall(SYS_dup3, oldfd, newfd, 0);
#endif
    }
    if (!active())
        return real_dup2(oldfd, newfd);
    int64_t t0 = mono_ns();
    int r = real_dup2(oldfd, newfd);
    int64_t t1 = mono_ns();
    if (r >= 0 && oldfd != newfd)
        dup_done(oldfd, r, t0, t1);
    return r;
}

EXPORT int dup3(int oldfd, int newfd, int flags)
{
    ENSURE(dup3);
    if (UNLIKELY(!real_dup3))
        return (int)syscall(SYS_dup3, oldfd, newfd, flags);
    if (!active())
        return real_dup3(oldfd, newfd, flags);
    int64_t t0 = mono_ns();
    int r = real_dup3(oldfd, newfd, flags);
    int64_t t1 = mono_ns();
    if (r >= 0)
        dup_done(oldfd, r, t0, t1);
    return r;
}

/* --- stat family: Darshan counts successful stats of regular files, by path or descriptor --- */
static void stat_path_done(int dirfd, const char *path, int64_t t0, int64_t t1)
{
    int e = errno;
    tl_in = 1;
    char buf[PATH_MAX];
    ssize_t n = abs_path(dirfd, path, buf);
    if (n > 0 && !excluded(buf, (size_t)n)) {
        int32_t ri = get_rec(MOD_POSIX, buf, (size_t)n);
        if (ri >= 0)
            posix_meta((uint32_t)ri, META_STAT, 0, t0, t1);
    }
    tl_in = 0;
    errno = e;
}

static void stat_fd_done(int32_t ri, int64_t t0, int64_t t1)
{
    int e = errno;
    tl_in = 1;
    posix_meta((uint32_t)ri, META_STAT, 0, t0, t1);
    tl_in = 0;
    errno = e;
}

#define STAT_PATH_BODY(REALCALL, DIRFD, PATH, MODE) \
    if (!active()) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    int r = REALCALL; \
    int64_t t1 = mono_ns(); \
    if (r == 0 && S_ISREG(MODE)) \
        stat_path_done(DIRFD, PATH, t0, t1); \
    return r;

#define STAT_FD_BODY(REALCALL, FD, MODE) \
    int32_t ri = fd_rec(FD); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    int r = REALCALL; \
    int64_t t1 = mono_ns(); \
    if (r == 0 && S_ISREG(MODE)) \
        stat_fd_done(ri, t0, t1); \
    return r;

static int empty_path(const char *p) { return p && !p[0]; }

/* fstatat with an empty path and AT_EMPTY_PATH is an fstat of dirfd */
#define STATAT_BODY(REALCALL, MODE) \
    if (empty_path(path) && (flags & AT_EMPTY_PATH)) { \
        STAT_FD_BODY(REALCALL, dirfd, MODE) \
    } \
    STAT_PATH_BODY(REALCALL, dirfd, path, MODE)

EXPORT int stat(const char *path, struct stat *st)
{
    ENSURE(stat);
    if (UNLIKELY(!real_stat))
        return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, 0);
    STAT_PATH_BODY(real_stat(path, st), AT_FDCWD, path, st->st_mode)
}

EXPORT int stat64(const char *path, struct stat64 *st)
{
    ENSURE(stat64);
    if (UNLIKELY(!real_stat64))
        return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, 0);
    STAT_PATH_BODY(real_stat64(path, st), AT_FDCWD, path, st->st_mode)
}

EXPORT int lstat(const char *path, struct stat *st)
{
    ENSURE(lstat);
    if (UNLIKELY(!real_lstat))
        return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW);
    STAT_PATH_BODY(real_lstat(path, st), AT_FDCWD, path, st->st_mode)
}

EXPORT int lstat64(const char *path, struct stat64 *st)
{
    ENSURE(lstat64);
    if (UNLIKELY(!real_lstat64))
        return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW);
    STAT_PATH_BODY(real_lstat64(path, st), AT_FDCWD, path, st->st_mode)
}

EXPORT int fstat(int fd, struct stat *st)
{
    ENSURE(fstat);
    if (UNLIKELY(!real_fstat))
        return (int)syscall(SYS_fstat, fd, st);
    STAT_FD_BODY(real_fstat(fd, st), fd, st->st_mode)
}

EXPORT int fstat64(int fd, struct stat64 *st)
{
    ENSURE(fstat64);
    if (UNLIKELY(!real_fstat64))
        return (int)syscall(SYS_fstat, fd, st);
    STAT_FD_BODY(real_fstat64(fd, st), fd, st->st_mode)
}

EXPORT int fstatat(int dirfd, const char *path, struct stat *st, int flags)
{
    ENSURE(fstatat);
    if (UNLIKELY(!real_fstatat))
        return (int)syscall(SYS_newfstatat, dirfd, path, st, flags);
    STATAT_BODY(real_fstatat(dirfd, path, st, flags), st->st_mode)
}

EXPORT int fstatat64(int dirfd, const char *path, struct stat64 *st, int flags)
{
    ENSURE(fstatat64);
    if (UNLIKELY(!real_fstatat64))
        return (int)syscall(SYS_newfstatat, dirfd, path, st, flags);
    STATAT_BODY(real_fstatat64(dirfd, path, st, flags), st->st_mode)
}

EXPORT int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *st)
{
    ENSURE(statx);
    if (UNLIKELY(!real_statx))
        return (int)syscall(SYS_statx, dirfd, path, flags, mask, st);
#define STX_REG ((st->stx_mask & STATX_TYPE) && S_ISREG(st->stx_mode))
    if (empty_path(path) && (flags & AT_EMPTY_PATH)) {
        int32_t ri = fd_rec(dirfd);
        if (LIKELY(ri < 0))
            return real_statx(dirfd, path, flags, mask, st);
        int64_t t0 = mono_ns();
        int r = real_statx(dirfd, path, flags, mask, st);
        int64_t t1 = mono_ns();
        if (r == 0 && STX_REG)
            stat_fd_done(ri, t0, t1);
        return r;
    }
    if (!active())
        return real_statx(dirfd, path, flags, mask, st);
    int64_t t0 = mono_ns();
    int r = real_statx(dirfd, path, flags, mask, st);
    int64_t t1 = mono_ns();
    if (r == 0 && STX_REG)
        stat_path_done(dirfd, path, t0, t1);
    return r;
#undef STX_REG
}

/* glibc < 2.33 binaries call the versioned __xstat family */
EXPORT int __xstat(int ver, const char *path, struct stat *st)
{
    ENSURE(__xstat);
    if (UNLIKELY(!real___xstat))
        return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, 0);
    STAT_PATH_BODY(real___xstat(ver, path, st), AT_FDCWD, path, st->st_mode)
}

EXPORT int __xstat64(int ver, const char *path, struct stat64 *st)
{
    ENSURE(__xstat64);
    if (UNLIKELY(!real___xstat64))
        return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, 0);
    STAT_PATH_BODY(real___xstat64(ver, path, st), AT_FDCWD, path, st->st_mode)
}

EXPORT int __lxstat(int ver, const char *path, struct stat *st)
{
    ENSURE(__lxstat);
    if (UNLIKELY(!real___lxstat))
        return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW);
    STAT_PATH_BODY(real___lxstat(ver, path, st), AT_FDCWD, path, st->st_mode)
}

EXPORT int __lxstat64(int ver, const char *path, struct stat64 *st)
{
    ENSURE(__lxstat64);
    if (UNLIKELY(!real___lxstat64))
        return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW);
    STAT_PATH_BODY(real___lxstat64(ver, path, st), AT_FDCWD, path, st->st_mode)
}

EXPORT int __fxstat(int ver, int fd, struct stat *st)
{
    ENSURE(__fxstat);
    if (UNLIKELY(!real___fxstat))
        return (int)syscall(SYS_fstat, fd, st);
    STAT_FD_BODY(real___fxstat(ver, fd, st), fd, st->st_mode)
}

EXPORT int __fxstat64(int ver, int fd, struct stat64 *st)
{
    ENSURE(__fxstat64);
    if (UNLIKELY(!real___fxstat64))
        return (int)syscall(SYS_fstat, fd, st);
    STAT_FD_BODY(real___fxstat64(ver, fd, st), fd, st->st_mode)
}

EXPORT int __fxstatat(int ver, int dirfd, const char *path, struct stat *st, int flags)
{
    ENSURE(__fxstatat);
    if (UNLIKELY(!real___fxstatat))
        return (int)syscall(SYS_newfstatat, dirfd, path, st, flags);
    STATAT_BODY(real___fxstatat(ver, dirfd, path, st, flags), st->st_mode)
}

EXPORT int __fxstatat64(int ver, int dirfd, const char *path, struct stat64 *st, int flags)
{
    ENSURE(__fxstatat64);
    if (UNLIKELY(!real___fxstatat64))
        return (int)syscall(SYS_newfstatat, dirfd, path, st, flags);
    STATAT_BODY(real___fxstatat64(ver, dirfd, path, st, flags), st->st_mode)
}

#define SYNC_BODY(REALCALL, KIND) \
    int32_t ri = fd_rec(fd); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    int r = REALCALL; \
    int64_t t1 = mono_ns(); \
    if (r == 0) { \
        int e = errno; \
        tl_in = 1; \
        posix_meta((uint32_t)ri, KIND, 0, t0, t1); \
        tl_in = 0; \
        errno = e; \
    } \
    return r;

/* --- rename: a file written under a temporary name and renamed into place (safetensors, fsspec,
 * atomic saves) is counted under its final name. The old name's counters move to the new name's
 * record (summed; highest bytes and last times kept) and the old record is left with zeros, so that
 * its last snapshot counts nothing; descriptors still open on it follow. --- */
static int merge_kind(const char *names, int idx)
{
    /* 0: sum, 1: maximum, 2: minimum of the non-zero values (first timestamps) */
    const char *p = names;
    for (int i = 0; i < idx && p; i++) {
        p = strchr(p, ',');
        if (p)
            p++;
    }
    if (!p)
        return 0;
    const char *e = strchr(p, ',');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    char name[64];
    if (n >= sizeof name)
        return 0;
    memcpy(name, p, n);
    name[n] = 0;
    if (strstr(name, "START_TIMESTAMP"))
        return 2;
    if (strstr(name, "MAX_") || strstr(name, "END_TIMESTAMP"))
        return 1;
    return 0;
}

static void merge_into(int module, uint32_t dst, uint32_t src)
{
    struct rec *d = &g_recs[dst], *s = &g_recs[src];
    const char *in = module == MOD_POSIX ? posix_int_names : stdio_int_names;
    const char *fn = module == MOD_POSIX ? posix_f_names : stdio_f_names;
    int ni = module == MOD_POSIX ? POSIX_NI : STDIO_NI, nf = module == MOD_POSIX ? POSIX_NF : STDIO_NF;
    /* two stripes, always taken in the same order */
    uint32_t sd = dst & (NLOCKS - 1), ss = src & (NLOCKS - 1);
    uint32_t a = sd < ss ? sd : ss, b = sd < ss ? ss : sd;
    lock_rec(a);
    if (a != b)
        lock_rec(b);
    touch(d);
    touch(s);
    for (int i = 0; i < ni; i++) {
        int k = merge_kind(in, i);
        d->c[i] = k == 1 ? (d->c[i] > s->c[i] ? d->c[i] : s->c[i]) : d->c[i] + s->c[i];
    }
    for (int i = 0; i < nf; i++) {
        int k = merge_kind(fn, i);
        if (k == 2)
            d->f[i] = !d->f[i] || (s->f[i] && s->f[i] < d->f[i]) ? s->f[i] : d->f[i];
        else if (k == 1)
            d->f[i] = d->f[i] > s->f[i] ? d->f[i] : s->f[i];
        else
            d->f[i] += s->f[i];
    }
    memset(s->c, 0, sizeof s->c);
    memset(s->f, 0, sizeof s->f);
    if (a != b)
        unlock_rec(b);
    unlock_rec(a);
}

/* the counters of src go to dst, and so do the descriptors open on src */
static void move_record(int module, uint32_t src, uint32_t dst)
{
    merge_into(module, dst, src);
    for (int fd = 0; fd < FD_CAP; fd++) {
        int32_t want = (int32_t)src + 1;
        if (module == MOD_POSIX)
            atomic_compare_exchange_strong(&g_fd[fd].rec, &want, (int32_t)dst + 1);
        else
            atomic_compare_exchange_strong(&g_fd[fd].srec, &want, (int32_t)dst + 1);
    }
}

static void renamed(int olddirfd, const char *oldp, int newdirfd, const char *newp)
{
    if (foreign_process())
        return;
    int e = errno;
    tl_in = 1;
    char a[PATH_MAX], b[PATH_MAX];
    ssize_t na = abs_path(olddirfd, oldp, a);
    ssize_t nb = na > 0 ? abs_path(newdirfd, newp, b) : -1;
    if (nb > 0 && !excluded(b, (size_t)nb)) {
        for (int module = MOD_POSIX; module <= MOD_STDIO; module++) {
            int32_t src = find_rec(module, a, (size_t)na);
            if (src < 0)
                continue;
            int32_t dst = get_rec(module, b, (size_t)nb);
            if (dst >= 0 && dst != src)
                move_record(module, (uint32_t)src, (uint32_t)dst);
        }
    }
    tl_in = 0;
    errno = e;
}

/* At the close of a descriptor that wrote: a file renamed by a call we do not see (a raw system
 * call, as Rust's rustix makes for safetensors' temporary files) is found by its path no longer
 * naming it; the descriptor's link names where it is now. Returns the record to count the close on. */
static int32_t follow_rename(int fd, int32_t ri)
{
    struct rec *r = &g_recs[ri];
    if (r->gen != g_gen || r->module != MOD_POSIX || r->c[POSIX_WRITES] <= 0 || !real_fstat || !real_stat)
        return ri;
    struct stat now, then;
    if (real_fstat(fd, &now) != 0 || !S_ISREG(now.st_mode))
        return ri;
    if (real_stat(rec_path(r), &then) == 0 && then.st_dev == now.st_dev && then.st_ino == now.st_ino)
        return ri; /* still there under its name (the usual case) */
    char buf[PATH_MAX];
    ssize_t n = fd_link(fd, buf, sizeof buf);
    if (n <= 0)
        return ri;
    n = (ssize_t)normalize(buf, (size_t)n);
    if (n > 10 && memcmp(buf + n - 10, " (deleted)", 10) == 0)
        return ri;
    if (excluded(buf, (size_t)n))
        return ri;
    int32_t dst = get_rec(MOD_POSIX, buf, (size_t)n);
    if (dst < 0 || dst == ri)
        return ri;
    move_record(MOD_POSIX, (uint32_t)ri, (uint32_t)dst);
    return dst;
}

EXPORT int rename(const char *oldp, const char *newp)
{
    ENSURE_RET(rename, -1);
    int r = real_rename(oldp, newp);
    if (r == 0 && active() && oldp && newp)
        renamed(AT_FDCWD, oldp, AT_FDCWD, newp);
    return r;
}

EXPORT int renameat(int olddirfd, const char *oldp, int newdirfd, const char *newp)
{
    ENSURE_RET(renameat, -1);
    int r = real_renameat(olddirfd, oldp, newdirfd, newp);
    if (r == 0 && active() && oldp && newp)
        renamed(olddirfd, oldp, newdirfd, newp);
    return r;
}

EXPORT int renameat2(int olddirfd, const char *oldp, int newdirfd, const char *newp, unsigned int flags)
{
    ENSURE_RET(renameat2, -1);
    int r = real_renameat2(olddirfd, oldp, newdirfd, newp, flags);
    if (r == 0 && active() && oldp && newp && !(flags & 2u /* RENAME_EXCHANGE */))
        renamed(olddirfd, oldp, newdirfd, newp);
    return r;
}

EXPORT int fsync(int fd)
{
    ENSURE(fsync);
    if (UNLIKELY(!real_fsync))
        return (int)syscall(SYS_fsync, fd);
    SYNC_BODY(real_fsync(fd), META_FSYNC)
}

EXPORT int fdatasync(int fd)
{
    ENSURE(fdatasync);
    if (UNLIKELY(!real_fdatasync))
        return (int)syscall(SYS_fdatasync, fd);
    SYNC_BODY(real_fdatasync(fd), META_FDSYNC)
}

/* --- memory-mapped files: mappings, bytes mapped, and the pages the process brought in --- */
static inline void map_lock(void)
{
    while (atomic_exchange_explicit(&g_map_lock, 1, memory_order_acquire))
        cpu_relax();
}

static inline void map_unlock(void) { atomic_store_explicit(&g_map_lock, 0, memory_order_release); }

/* Bytes of [a, a+len) present in this process's page tables (/proc/self/pagemap, bit 63): the pages
 * the process touched, plus those the kernel mapped around each fault. -1 when it cannot be read. */
static int64_t resident_bytes(uintptr_t a, size_t len)
{
    ENSURE(open);
    ENSURE(pread64);
    ENSURE(close);
    if (!real_open || !real_pread64 || !real_close)
        return -1;
    int fd = real_open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    uint64_t buf[512];
    uint64_t first = a / (uint64_t)g_page, end = (a + len + (uint64_t)g_page - 1) / (uint64_t)g_page;
    int64_t pages = 0;
    for (uint64_t pg = first; pg < end;) {
        uint64_t k = end - pg < 512 ? end - pg : 512;
        ssize_t r = real_pread64(fd, buf, k * 8, (off64_t)(pg * 8));
        if (r < 8) {
            pages = -1;
            break;
        }
        uint64_t got = (uint64_t)r / 8;
        for (uint64_t i = 0; i < got; i++)
            pages += (int64_t)(buf[i] >> 63);
        pg += got;
    }
    real_close(fd);
    return pages < 0 ? -1 : pages * g_page;
}

/* Reading page tables costs about 40 ns a page: at most 1% of the process's time (plus 20 ms). */
static int measure_allowed(size_t len)
{
    if (len > MAP_MEASURE_MAX)
        return 0;
    int64_t elapsed = wall_of(mono_ns()) - g_start_ns;
    return atomic_load_explicit(&g_measure_ns, memory_order_relaxed) <= elapsed / 100 + 20000000LL;
}

/* [a, a+len) of a mapping of record ri goes: add its resident bytes; `whole`: the mapping is gone */
static void map_account(int32_t ri, uintptr_t a, size_t len, int whole, int unmeasured)
{
    int64_t b = -1;
    if (measure_allowed(len)) {
        int64_t t0 = mono_ns();
        b = resident_bytes(a, len);
        atomic_fetch_add_explicit(&g_measure_ns, mono_ns() - t0, memory_order_relaxed);
    }
    struct rec *r = &g_recs[ri];
    lock_rec((uint32_t)ri);
    touch(r);
    if (b >= 0)
        r->c[POSIX_BYTES_MAPPED_RESIDENT] += b;
    if (whole && b >= 0 && !unmeasured)
        r->c[POSIX_MMAPS_MEASURED]++;
    unlock_rec((uint32_t)ri);
}

static void map_add(int32_t ri, uintptr_t a, size_t len)
{
    map_lock();
    if (g_nmaps < MAP_CAP) {
        g_maps[g_nmaps] = (struct mapping){a, len, ri, 0};
        g_nmaps++;
        atomic_store_explicit(&g_maps_live, g_nmaps, memory_order_release);
    }
    map_unlock();
}

/* munmap(a, len): measure the parts of tracked mappings that go, before they go (tl_in set) */
static void map_release(uintptr_t a, size_t len)
{
    struct work {
        struct mapping m;
        uintptr_t lo, hi;
        int whole;
    } w[64];
    int nw = 0;
    uintptr_t e = a + len;
    map_lock();
    for (uint32_t i = 0; i < g_nmaps && nw < 64;) {
        struct mapping *x = &g_maps[i];
        uintptr_t xe = x->addr + x->len;
        if (x->addr >= e || xe <= a) {
            i++;
            continue;
        }
        struct work *k = &w[nw++];
        k->m = *x;
        k->lo = x->addr > a ? x->addr : a;
        k->hi = xe < e ? xe : e;
        k->whole = k->lo == x->addr && k->hi == xe;
        if (k->whole) { /* all of it goes: the last entry takes its place */
            g_maps[i] = g_maps[--g_nmaps];
            continue;
        }
        if (k->lo == x->addr) { /* its head goes */
            x->addr = k->hi;
            x->len = xe - k->hi;
        } else if (k->hi == xe) { /* its tail goes */
            x->len = k->lo - x->addr;
        } /* else a hole in the middle: the entry stays whole (the hole reads as not present) */
        if (!measure_allowed(k->hi - k->lo))
            x->unmeasured = 1;
        i++;
    }
    atomic_store_explicit(&g_maps_live, g_nmaps, memory_order_release);
    map_unlock();
    for (int i = 0; i < nw; i++)
        map_account(w[i].m.rec, w[i].lo, w[i].hi - w[i].lo, w[i].whole, w[i].m.unmeasured);
}

/* the final dump: every mapping still there counts now (and no more at a later munmap) */
static void map_release_all(void)
{
    for (;;) {
        map_lock();
        if (!g_nmaps) {
            map_unlock();
            return;
        }
        struct mapping m = g_maps[--g_nmaps];
        atomic_store_explicit(&g_maps_live, g_nmaps, memory_order_release);
        map_unlock();
        if (m.rec >= 0)
            map_account(m.rec, m.addr, m.len, 1, m.unmeasured);
    }
}

static void posix_mapped(uint32_t ri, int64_t off, void *addr, size_t len, int64_t t0, int64_t t1)
{
    struct rec *r = &g_recs[ri];
    lock_rec(ri);
    touch(r);
    r->c[POSIX_MMAPS]++;
    r->c[POSIX_BYTES_MAPPED] += (int64_t)len;
    if (r->c[POSIX_MAX_BYTE_MAPPED] < off + (int64_t)len - 1)
        r->c[POSIX_MAX_BYTE_MAPPED] = off + (int64_t)len - 1;
    unlock_rec(ri);
    TRACE(MOD_POSIX, ri, OP_MMAP, off, (int64_t)len, t0, t1);
    if (!foreign_process())
        map_add((int32_t)ri, (uintptr_t)addr, len);
}

#define MMAP_BODY(REALCALL) \
    if (fd < 0 || (flags & MAP_ANONYMOUS)) \
        return REALCALL; \
    int32_t ri = fd_rec(fd); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    void *r = REALCALL; \
    int64_t t1 = mono_ns(); \
    if (r != MAP_FAILED) { \
        int e = errno; \
        tl_in = 1; \
        posix_mapped((uint32_t)ri, (int64_t)off, r, len, t0, t1); \
        tl_in = 0; \
        errno = e; \
    } \
    return r;

EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    ENSURE(mmap);
    if (UNLIKELY(!real_mmap))
        return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
    MMAP_BODY(real_mmap(addr, len, prot, flags, fd, off))
}

EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off64_t off)
{
    ENSURE(mmap64);
    if (UNLIKELY(!real_mmap64))
        return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
    MMAP_BODY(real_mmap64(addr, len, prot, flags, fd, off))
}

EXPORT int munmap(void *addr, size_t len)
{
    ENSURE(munmap);
    if (LIKELY(!atomic_load_explicit(&g_maps_live, memory_order_relaxed)) || tl_in || !active() ||
        foreign_process()) {
        if (UNLIKELY(!real_munmap))
            return (int)syscall(SYS_munmap, addr, len);
        return real_munmap(addr, len);
    }
    int e = errno;
    tl_in = 1;
    map_release((uintptr_t)addr, len);
    tl_in = 0;
    errno = e;
    if (UNLIKELY(!real_munmap))
        return (int)syscall(SYS_munmap, addr, len);
    return real_munmap(addr, len);
}

/* ------------------------------------------------------------------------------------------------
 * STDIO wrappers (glibc's stdio calls read/write internally, not through the PLT: no double count)
 * ---------------------------------------------------------------------------------------------- */
static inline int32_t stream_rec(FILE *fp, int *fdp)
{
    if (!active() || !fp)
        return -1;
    int fd = fp->_fileno; /* glibc's FILE; -1 for memory streams */
    if ((unsigned)fd >= FD_CAP)
        return -1;
    struct fdslot *s = &g_fd[fd];
    if (atomic_load_explicit(&s->fp, memory_order_relaxed) != fp)
        return -1;
    int32_t v = atomic_load_explicit(&s->srec, memory_order_relaxed);
    if (v <= 0)
        return -1;
    *fdp = fd;
    return v - 1;
}

/* register a new stream; path == NULL: take the descriptor's path (fdopen) */
static void stream_opened(FILE *fp, const char *path, int kind, int64_t t0, int64_t t1)
{
    int fd = fp->_fileno;
    if ((unsigned)fd >= FD_CAP)
        return;
    int e = errno;
    tl_in = 1;
    struct fdslot *s = &g_fd[fd];
    char buf[PATH_MAX];
    ssize_t n = -1;
    if (path) {
        n = abs_path(AT_FDCWD, path, buf);
        /* the descriptor was opened inside libc: let direct POSIX use of it be probed */
        atomic_store(&s->rec, 0);
    } else {
        int32_t v = atomic_load(&s->rec);
        if (v > 0) {
            const struct rec *pr = &g_recs[v - 1];
            memcpy(buf, rec_path(pr), pr->path_len);
            n = pr->path_len;
        } else {
            n = fd_link(fd, buf, sizeof buf);
            if (n > 0)
                n = (ssize_t)normalize(buf, (size_t)n);
        }
    }
    atomic_store(&s->srec, 0);
    atomic_store(&s->fp, NULL);
    if (n > 0 && !excluded(buf, (size_t)n)) {
        int32_t ri = get_rec(MOD_STDIO, buf, (size_t)n);
        if (ri >= 0) {
            atomic_store(&s->soff, 0);
            atomic_store(&s->srec, ri + 1);
            atomic_store(&s->fp, fp);
            stdio_meta((uint32_t)ri, kind, 0, t0, t1);
        }
    }
    tl_in = 0;
    errno = e;
}

#define FOPEN_BODY(REALCALL) \
    if (!active() || !path) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    FILE *fp = REALCALL; \
    int64_t t1 = mono_ns(); \
    if (fp) \
        stream_opened(fp, path, SMETA_OPEN, t0, t1); \
    return fp;

EXPORT FILE *fopen(const char *path, const char *mode)
{
    ENSURE_RET(fopen, NULL);
    FOPEN_BODY(real_fopen(path, mode))
}

EXPORT FILE *fopen64(const char *path, const char *mode)
{
    ENSURE_RET(fopen64, NULL);
    FOPEN_BODY(real_fopen64(path, mode))
}

EXPORT FILE *fdopen(int fd, const char *mode)
{
    ENSURE_RET(fdopen, NULL);
    if (!active())
        return real_fdopen(fd, mode);
    int64_t t0 = mono_ns();
    FILE *fp = real_fdopen(fd, mode);
    int64_t t1 = mono_ns();
    if (fp)
        stream_opened(fp, NULL, SMETA_FDOPEN, t0, t1);
    return fp;
}

/* the descriptor of a stream is about to be closed: forget it first */
static int32_t stream_forget(FILE *fp)
{
    int fd = fp ? fp->_fileno : -1;
    if ((unsigned)fd >= FD_CAP || foreign_process())
        return -1;
    struct fdslot *s = &g_fd[fd];
    int32_t v = -1;
    if (atomic_load(&s->fp) == fp)
        v = atomic_load(&s->srec) - 1;
    atomic_store(&s->srec, 0);
    atomic_store(&s->fp, NULL);
    atomic_store(&s->rec, 0);
    return v;
}

#define FREOPEN_BODY(REALCALL) \
    if (!active()) \
        return REALCALL; \
    int32_t old = stream_forget(fp); \
    int64_t t0 = mono_ns(); \
    FILE *nfp = REALCALL; \
    int64_t t1 = mono_ns(); \
    if (old >= 0) { \
        int e = errno; \
        tl_in = 1; \
        stdio_meta((uint32_t)old, SMETA_CLOSE, 0, t0, t1); \
        tl_in = 0; \
        errno = e; \
    } \
    if (nfp && path) \
        stream_opened(nfp, path, SMETA_OPEN, t0, t1); \
    return nfp;

EXPORT FILE *freopen(const char *path, const char *mode, FILE *fp)
{
    ENSURE_RET(freopen, NULL);
    FREOPEN_BODY(real_freopen(path, mode, fp))
}

EXPORT FILE *freopen64(const char *path, const char *mode, FILE *fp)
{
    ENSURE_RET(freopen64, NULL);
    FREOPEN_BODY(real_freopen64(path, mode, fp))
}

EXPORT int fclose(FILE *fp)
{
    ENSURE_RET(fclose, EOF);
    if (!active() || !fp)
        return real_fclose(fp);
    int32_t ri = stream_forget(fp);
    int64_t t0 = mono_ns();
    int r = real_fclose(fp);
    int64_t t1 = mono_ns();
    if (ri >= 0) {
        int e = errno;
        tl_in = 1;
        stdio_meta((uint32_t)ri, SMETA_CLOSE, 0, t0, t1);
        tl_in = 0;
        errno = e;
    }
    return r;
}

EXPORT int fflush(FILE *fp)
{
    ENSURE_RET(fflush, EOF);
    int fd;
    int32_t ri = stream_rec(fp, &fd);
    if (LIKELY(ri < 0))
        return real_fflush(fp);
    int64_t t0 = mono_ns();
    int r = real_fflush(fp);
    int64_t t1 = mono_ns();
    if (r == 0) {
        int e = errno;
        tl_in = 1;
        stdio_meta((uint32_t)ri, SMETA_FLUSH, atomic_load(&g_fd[fd].soff), t0, t1);
        tl_in = 0;
        errno = e;
    }
    return r;
}

static inline void stream_io(int fd, int32_t ri, int is_write, int64_t n, int64_t t0, int64_t t1)
{
    int e = errno;
    tl_in = 1;
    int64_t off = atomic_fetch_add(&g_fd[fd].soff, n);
    stdio_io((uint32_t)ri, is_write, off, n, t0, t1);
    tl_in = 0;
    errno = e;
}

/* fread/fwrite: bytes = items * size */
#define FRW_BODY(IS_WRITE, REALCALL) \
    int fd; \
    int32_t ri = stream_rec(fp, &fd); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    size_t r = REALCALL; \
    int64_t t1 = mono_ns(); \
    stream_io(fd, ri, IS_WRITE, (int64_t)(r * size), t0, t1); \
    return r;

EXPORT size_t fread(void *ptr, size_t size, size_t n, FILE *fp)
{
    ENSURE_RET(fread, 0);
    FRW_BODY(0, real_fread(ptr, size, n, fp))
}

EXPORT size_t fread_unlocked(void *ptr, size_t size, size_t n, FILE *fp)
{
    ENSURE_RET(fread_unlocked, 0);
    FRW_BODY(0, real_fread_unlocked(ptr, size, n, fp))
}

EXPORT size_t __fread_chk(void *ptr, size_t ptrlen, size_t size, size_t n, FILE *fp)
{
    ENSURE_RET(__fread_chk, 0);
    FRW_BODY(0, real___fread_chk(ptr, ptrlen, size, n, fp))
}

EXPORT size_t __fread_unlocked_chk(void *ptr, size_t ptrlen, size_t size, size_t n, FILE *fp)
{
    ENSURE_RET(__fread_unlocked_chk, 0);
    FRW_BODY(0, real___fread_unlocked_chk(ptr, ptrlen, size, n, fp))
}

EXPORT size_t fwrite(const void *ptr, size_t size, size_t n, FILE *fp)
{
    ENSURE_RET(fwrite, 0);
    FRW_BODY(1, real_fwrite(ptr, size, n, fp))
}

EXPORT size_t fwrite_unlocked(const void *ptr, size_t size, size_t n, FILE *fp)
{
    ENSURE_RET(fwrite_unlocked, 0);
    FRW_BODY(1, real_fwrite_unlocked(ptr, size, n, fp))
}

#define FGETS_BODY(REALCALL) \
    int fd; \
    int32_t ri = stream_rec(fp, &fd); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    char *r = REALCALL; \
    int64_t t1 = mono_ns(); \
    stream_io(fd, ri, 0, r ? (int64_t)strlen(r) : 0, t0, t1); \
    return r;

EXPORT char *fgets(char *s, int n, FILE *fp)
{
    ENSURE_RET(fgets, NULL);
    FGETS_BODY(real_fgets(s, n, fp))
}

EXPORT char *fgets_unlocked(char *s, int n, FILE *fp)
{
    ENSURE_RET(fgets_unlocked, NULL);
    FGETS_BODY(real_fgets_unlocked(s, n, fp))
}

EXPORT char *__fgets_chk(char *s, size_t size, int n, FILE *fp)
{
    ENSURE_RET(__fgets_chk, NULL);
    FGETS_BODY(real___fgets_chk(s, size, n, fp))
}

EXPORT char *__fgets_unlocked_chk(char *s, size_t size, int n, FILE *fp)
{
    ENSURE_RET(__fgets_unlocked_chk, NULL);
    FGETS_BODY(real___fgets_unlocked_chk(s, size, n, fp))
}

#define GETC_BODY(REALCALL) \
    int fd; \
    int32_t ri = stream_rec(fp, &fd); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    int r = REALCALL; \
    int64_t t1 = mono_ns(); \
    stream_io(fd, ri, 0, r == EOF ? 0 : 1, t0, t1); \
    return r;

EXPORT int fgetc(FILE *fp)
{
    ENSURE_RET(fgetc, EOF);
    GETC_BODY(real_fgetc(fp))
}

EXPORT int getc(FILE *fp)
{
    ENSURE_RET(getc, EOF);
    GETC_BODY(real_getc(fp))
}

EXPORT int _IO_getc(FILE *fp)
{
    ENSURE(_IO_getc);
    if (!real__IO_getc)
        return getc(fp);
    GETC_BODY(real__IO_getc(fp))
}

#define PUTC_BODY(REALCALL) \
    int fd; \
    int32_t ri = stream_rec(fp, &fd); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    int r = REALCALL; \
    int64_t t1 = mono_ns(); \
    stream_io(fd, ri, 1, r == EOF ? 0 : 1, t0, t1); \
    return r;

EXPORT int fputc(int ch, FILE *fp)
{
    ENSURE_RET(fputc, EOF);
    PUTC_BODY(real_fputc(ch, fp))
}

EXPORT int putc(int ch, FILE *fp)
{
    ENSURE_RET(putc, EOF);
    PUTC_BODY(real_putc(ch, fp))
}

EXPORT int _IO_putc(int ch, FILE *fp)
{
    ENSURE(_IO_putc);
    if (!real__IO_putc)
        return putc(ch, fp);
    PUTC_BODY(real__IO_putc(ch, fp))
}

#define FPUTS_BODY(REALCALL) \
    int fd; \
    int32_t ri = stream_rec(fp, &fd); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    int r = REALCALL; \
    int64_t t1 = mono_ns(); \
    stream_io(fd, ri, 1, r == EOF ? 0 : (int64_t)strlen(s), t0, t1); \
    return r;

EXPORT int fputs(const char *s, FILE *fp)
{
    ENSURE_RET(fputs, EOF);
    FPUTS_BODY(real_fputs(s, fp))
}

EXPORT int fputs_unlocked(const char *s, FILE *fp)
{
    ENSURE_RET(fputs_unlocked, EOF);
    FPUTS_BODY(real_fputs_unlocked(s, fp))
}

#define VFPRINTF_BODY(REALCALL) \
    int fd; \
    int32_t ri = stream_rec(fp, &fd); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    int r = REALCALL; \
    int64_t t1 = mono_ns(); \
    stream_io(fd, ri, 1, r < 0 ? 0 : r, t0, t1); \
    return r;

EXPORT int vfprintf(FILE *fp, const char *fmt, va_list ap)
{
    ENSURE_RET(vfprintf, -1);
    VFPRINTF_BODY(real_vfprintf(fp, fmt, ap))
}

EXPORT int fprintf(FILE *fp, const char *fmt, ...)
{
    va_list ap;
    int r;
    ENSURE_RET(vfprintf, -1);
    va_start(ap, fmt);
    r = vfprintf(fp, fmt, ap);
    va_end(ap);
    return r;
}

EXPORT int __vfprintf_chk(FILE *fp, int flag, const char *fmt, va_list ap)
{
    ENSURE(__vfprintf_chk);
    if (!real___vfprintf_chk)
        return vfprintf(fp, fmt, ap);
    VFPRINTF_BODY(real___vfprintf_chk(fp, flag, fmt, ap))
}

EXPORT int __fprintf_chk(FILE *fp, int flag, const char *fmt, ...)
{
    va_list ap;
    int r;
    va_start(ap, fmt);
    r = __vfprintf_chk(fp, flag, fmt, ap);
    va_end(ap);
    return r;
}

static void stream_seeked(int fd, int32_t ri, FILE *fp, int64_t t0, int64_t t1)
{
    int e = errno;
    tl_in = 1;
    off_t pos = real_ftello ? real_ftello(fp) : -1;
    if (pos >= 0)
        atomic_store(&g_fd[fd].soff, (int64_t)pos);
    stdio_meta((uint32_t)ri, SMETA_SEEK, (int64_t)pos, t0, t1);
    tl_in = 0;
    errno = e;
}

#define FSEEK_BODY(REALCALL) \
    int fd; \
    int32_t ri = stream_rec(fp, &fd); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    int r = REALCALL; \
    int64_t t1 = mono_ns(); \
    if (r == 0) \
        stream_seeked(fd, ri, fp, t0, t1); \
    return r;

EXPORT int fseek(FILE *fp, long off, int whence)
{
    ENSURE_RET(fseek, -1);
    FSEEK_BODY(real_fseek(fp, off, whence))
}

EXPORT int fseeko(FILE *fp, off_t off, int whence)
{
    ENSURE_RET(fseeko, -1);
    FSEEK_BODY(real_fseeko(fp, off, whence))
}

EXPORT int fseeko64(FILE *fp, off64_t off, int whence)
{
    ENSURE_RET(fseeko64, -1);
    FSEEK_BODY(real_fseeko64(fp, off, whence))
}

EXPORT int fsetpos(FILE *fp, const fpos_t *pos)
{
    ENSURE_RET(fsetpos, -1);
    FSEEK_BODY(real_fsetpos(fp, pos))
}

EXPORT int fsetpos64(FILE *fp, const fpos64_t *pos)
{
    ENSURE_RET(fsetpos64, -1);
    FSEEK_BODY(real_fsetpos64(fp, pos))
}

EXPORT void rewind(FILE *fp)
{
    ENSURE(rewind);
    if (UNLIKELY(!real_rewind))
        return;
    int fd;
    int32_t ri = stream_rec(fp, &fd);
    if (LIKELY(ri < 0)) {
        real_rewind(fp);
        return;
    }
    int64_t t0 = mono_ns();
    real_rewind(fp);
    int64_t t1 = mono_ns();
    stream_seeked(fd, ri, fp, t0, t1);
}

/* ------------------------------------------------------------------------------------------------
 * Dump (JSON lines) for processes no agent reads
 * ---------------------------------------------------------------------------------------------- */
struct jw {
    int fd;
    int err;
    size_t len;
    char buf[1 << 16];
};

static void jw_flush(struct jw *w)
{
    size_t done = 0;
    while (done < w->len && !w->err) {
        ssize_t n = real_write ? real_write(w->fd, w->buf + done, w->len - done)
                               : syscall(SYS_write, w->fd, w->buf + done, w->len - done);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            w->err = 1;
            break;
        }
        done += (size_t)n;
    }
    w->len = 0;
}

static void jw_put(struct jw *w, const char *s, size_t n)
{
    while (n) {
        size_t room = sizeof w->buf - w->len;
        if (room == 0) {
            jw_flush(w);
            room = sizeof w->buf;
        }
        size_t k = n < room ? n : room;
        memcpy(w->buf + w->len, s, k);
        w->len += k;
        s += k;
        n -= k;
    }
}

static void jw_str(struct jw *w, const char *s) { jw_put(w, s, strlen(s)); }

/* room for n more bytes in the buffer, written in place */
static inline char *jw_reserve(struct jw *w, size_t n)
{
    if (sizeof w->buf - w->len < n)
        jw_flush(w);
    return w->buf + w->len;
}

static void jw_int(struct jw *w, long v)
{
    char t[24];
    jw_put(w, t, fmt_int(t, v));
}

/* nanoseconds as seconds with nine decimals, exactly, into t (48 bytes); returns the length */
static size_t fmt_secs(char *t, int64_t ns)
{
    size_t n = 0;
    if (ns < 0) {
        t[n++] = '-';
        ns = -ns;
    }
    n += fmt_int(t + n, (long)(ns / 1000000000LL));
    t[n++] = '.';
    long frac = (long)(ns % 1000000000LL);
    for (int i = 8; i >= 0; i--) {
        t[n + (size_t)i] = (char)('0' + frac % 10);
        frac /= 10;
    }
    return n + 9;
}

/* length of the well-formed UTF-8 sequence at s (strict, as Python decodes), 0 if ill-formed */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if (n < len)
        return 0;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return len;
}

/* JSON string of a byte path: bytes that are not UTF-8 become \udcXX (Python's surrogateescape) */
static void jw_path(struct jw *w, const char *p, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)p;
    size_t i = 0;
    while (i < n && s[i] >= 0x20 && s[i] < 0x7f && s[i] != '"' && s[i] != '\\')
        i++;
    if (i == n && n < 4096) { /* the usual path: printable ASCII, nothing to escape */
        char *o = jw_reserve(w, n + 2);
        o[0] = '"';
        memcpy(o + 1, p, n);
        o[n + 1] = '"';
        w->len += n + 2;
        return;
    }
    jw_put(w, "\"", 1);
    i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            jw_put(w, e, 2);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            jw_put(w, e, 6);
            i++;
        } else if (c < 0x80) {
            jw_put(w, (const char *)s + i, 1);
            i++;
        } else {
            size_t k = utf8_seq(s + i, n - i);
            if (k) {
                jw_put(w, (const char *)s + i, k);
                i += k;
            } else {
                char e[6] = {'\\', 'u', 'd', 'c', hex[c >> 4], hex[c & 15]};
                jw_put(w, e, 6);
                i++;
            }
        }
    }
    jw_put(w, "\"", 1);
}

/* "NAME": of every counter, ready to copy (a dump writes thousands of records at exit, which a
 * DataLoader's main loop waits for) */
struct jname {
    const char *s;
    size_t n;
};
#define JNAME_X(n) {"\"" #n "\":", sizeof("\"" #n "\":") - 1},
static const struct jname posix_int_jnames[] = {POSIX_INT_COUNTERS(JNAME_X)};
static const struct jname posix_f_jnames[] = {POSIX_F_COUNTERS(JNAME_X)};
static const struct jname stdio_int_jnames[] = {STDIO_INT_COUNTERS(JNAME_X)};
static const struct jname stdio_f_jnames[] = {STDIO_F_COUNTERS(JNAME_X)};

/* "name":value for the non-zero counters (the header lists every name; absent means 0) */
static void jw_names(struct jw *w, const struct jname *names, const int64_t *vals, int count, int secs, int *first)
{
    for (int i = 0; i < count; i++) {
        if (vals[i] == 0)
            continue;
        /* ',' + name (< 64) + a number (< 48) + NUL */
        char *o = jw_reserve(w, 128);
        size_t k = 0;
        if (!*first)
            o[k++] = ',';
        *first = 0;
        memcpy(o + k, names[i].s, names[i].n);
        k += names[i].n;
        k += secs ? fmt_secs(o + k, vals[i]) : fmt_int(o + k, (long)vals[i]);
        w->len += k;
    }
}

/* JSON list of the names in two comma-terminated lists */
static void jw_name_list(struct jw *w, const char *a, const char *b)
{
    int first = 1;
    jw_put(w, "[", 1);
    for (const char *lst = a; lst; lst = (lst == a ? b : NULL)) {
        const char *p = lst;
        const char *q;
        while ((q = strchr(p, ',')) != NULL) {
            if (!first)
                jw_put(w, ",", 1);
            first = 0;
            jw_put(w, "\"", 1);
            jw_put(w, p, (size_t)(q - p));
            jw_put(w, "\"", 1);
            p = q + 1;
        }
    }
    jw_put(w, "]", 1);
}

static int any_activity(void)
{
    uint32_t n = atomic_load_explicit(&g_nrec, memory_order_acquire);
    for (uint32_t i = 0; i < n; i++)
        if (g_recs[i].gen == g_gen && g_recs[i].mod_epoch)
            return 1;
    return 0;
}

static struct jw g_jw;

static int write_dump(const char *target, const char *reason)
{
    char tmp[PATH_MAX + 32];
    size_t tl = strlen(target);
    if (tl + 16 > sizeof tmp)
        return -1;
    memcpy(tmp, target, tl);
    memcpy(tmp + tl, ".tmp", 5);
    int fd = real_open ? real_open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)
                       : (int)syscall(SYS_openat, AT_FDCWD, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    struct jw *w = &g_jw;
    w->fd = fd;
    w->err = 0;
    w->len = 0;

    struct utsname u;
    char exe[PATH_MAX];
    ssize_t en = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (en < 0)
        en = 0;
    exe[en] = 0;
    if (uname(&u) != 0)
        strcpy(u.nodename, "localhost");
    pid_t pid = raw_getpid();
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);

    jw_str(w, "{\"format\":\"holoprof.io_native/1\",\"host\":");
    jw_path(w, u.nodename, strlen(u.nodename));
    jw_str(w, ",\"pid\":");
    jw_int(w, pid);
    jw_str(w, ",\"ppid\":");
    jw_int(w, getppid());
    jw_str(w, ",\"exe\":");
    jw_path(w, exe, (size_t)en);
    jw_str(w, ",\"reason\":\"");
    jw_str(w, reason);
    jw_str(w, "\",\"start_ns\":");
    jw_int(w, (long)g_start_ns);
    jw_str(w, ",\"ts_ns\":");
    jw_int(w, (long)((int64_t)now.tv_sec * 1000000000LL + now.tv_nsec));
    jw_str(w, ",\"dropped\":");
    jw_int(w, atomic_load(&g_dropped));
    jw_str(w, ",\"trace_dropped\":");
    jw_int(w, atomic_load(&g_trace_dropped));
    jw_str(w, ",\"counter_names\":{\"POSIX\":");
    jw_name_list(w, posix_int_names, posix_f_names);
    jw_str(w, ",\"STDIO\":");
    jw_name_list(w, stdio_int_names, stdio_f_names);
    jw_str(w, "}}\n");

    uint32_t n = atomic_load_explicit(&g_nrec, memory_order_acquire);
    static struct rec copy;
    for (uint32_t i = 0; i < n; i++) {
        struct rec *r = &g_recs[i];
        lock_rec(i);
        int live = r->gen == g_gen && r->mod_epoch;
        if (live)
            memcpy(&copy, r, sizeof copy);
        unlock_rec(i);
        if (!live)
            continue;
        int first = 1;
        jw_str(w, copy.module == MOD_POSIX ? "{\"module\":\"POSIX\",\"path\":" : "{\"module\":\"STDIO\",\"path\":");
        jw_path(w, rec_path(&copy), copy.path_len);
        jw_str(w, ",\"counters\":{");
        if (copy.module == MOD_POSIX) {
            jw_names(w, posix_int_jnames, copy.c, POSIX_NI, 0, &first);
            jw_names(w, posix_f_jnames, copy.f, POSIX_NF, 1, &first);
        } else {
            jw_names(w, stdio_int_jnames, copy.c, STDIO_NI, 0, &first);
            jw_names(w, stdio_f_jnames, copy.f, STDIO_NF, 1, &first);
        }
        jw_str(w, "}}\n");
    }
    jw_flush(w);
    int err = w->err;
    if (real_close)
        real_close(fd);
    else
        syscall(SYS_close, fd);
    if (err || rename(tmp, target) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* $HOLOPROF_RUN_DIR/<host>-<pid>/io_native-<pid>.jsonl */
static int default_dump_path(char *out, size_t cap)
{
    struct utsname u;
    if (!g_run_dir_len)
        return -1;
    if (uname(&u) != 0)
        strcpy(u.nodename, "localhost");
    char pid[24];
    fmt_int(pid, raw_getpid());
    size_t need = g_run_dir_len + 1 + strlen(u.nodename) + 1 + strlen(pid) + 1 + 10 + strlen(pid) + 7 + 1;
    if (need > cap)
        return -1;
    char *p = out;
    memcpy(p, g_run_dir, g_run_dir_len);
    p += g_run_dir_len;
    *p++ = '/';
    p = stpcpy(p, u.nodename);
    *p++ = '-';
    p = stpcpy(p, pid);
    *p = 0;
    if (mkdir(out, 0700) != 0 && errno != EEXIST)
        return -1;
    *p++ = '/';
    p = stpcpy(p, "io_native-");
    p = stpcpy(p, pid);
    stpcpy(p, ".jsonl");
    return 0;
}

static void dump_at_exit(const char *reason)
{
    if (!atomic_load(&g_ready) || !g_run_dir_len || tl_in)
        return; /* tl_in: _exit from a signal handler that interrupted us while we hold a lock */
    pid_t pid = raw_getpid();
    if (pid != g_pid || atomic_load(&g_owner_pid) == pid)
        return; /* a vfork child, or a process whose agent reads the counters itself */
    if (atomic_exchange(&g_dumping, 1))
        return;
    int saved = tl_in;
    int e = errno;
    tl_in = 1;
    map_release_all();
    if (any_activity()) {
        char path[PATH_MAX];
        if (default_dump_path(path, sizeof path) == 0)
            write_dump(path, reason);
    }
    tl_in = saved;
    errno = e;
    atomic_store(&g_dumping, 0);
}

EXPORT void _exit(int status)
{
    ENSURE(_exit);
    dump_at_exit("_exit");
    if (real__exit)
        real__exit(status);
    syscall(SYS_exit_group, status);
    __builtin_unreachable();
}

EXPORT void _Exit(int status)
{
    ENSURE(_Exit);
    dump_at_exit("_exit");
    if (real__Exit)
        real__Exit(status);
    syscall(SYS_exit_group, status);
    __builtin_unreachable();
}

/* ------------------------------------------------------------------------------------------------
 * fork
 * ---------------------------------------------------------------------------------------------- */
static __thread int tl_fork_saved __attribute__((tls_model("initial-exec")));
static __thread int tl_fork_locked __attribute__((tls_model("initial-exec")));

static void atfork_prepare(void)
{
    tl_fork_saved = tl_in;
    tl_fork_locked = 0;
    if (!tl_in) {
        /* not inside our own critical section (e.g. fork from a signal handler that interrupted us) */
        tl_in = 1;
        pthread_mutex_lock(&g_trace_mu);
        pthread_mutex_lock(&g_insert_mu);
        tl_fork_locked = 1;
    }
}

static void atfork_parent(void)
{
    if (tl_fork_locked) {
        pthread_mutex_unlock(&g_insert_mu);
        pthread_mutex_unlock(&g_trace_mu);
    }
    tl_fork_locked = 0;
    tl_in = tl_fork_saved;
}

static void atfork_child(void)
{
    pthread_mutex_init(&g_insert_mu, NULL);
    pthread_mutex_init(&g_trace_mu, NULL);
    for (unsigned i = 0; i < NLOCKS; i++)
        atomic_store_explicit(&g_locks[i].v, 0, memory_order_relaxed);
    atomic_store(&g_map_lock, 0);
    /* counters start at zero in the child; records (and descriptor mapping) are kept */
    g_gen++;
    atomic_store(&g_dropped, 0);
    g_pid = raw_getpid();
    /* the trace belongs to the parent */
    atomic_store(&g_trace_on, 0);
    struct ring *r = atomic_exchange(&g_ring, NULL);
    if (g_drain_ring && g_drain_ring != r)
        munmap(g_drain_ring, g_drain_ring->map_len);
    if (r)
        munmap(r, r->map_len);
    g_drain_ring = NULL;
    atomic_store(&g_trace_inflight, 0);
    atomic_store(&g_trace_dropped, 0);
    atomic_store(&g_dumping, 0);
    tl_fork_locked = 0;
    tl_in = tl_fork_saved;
}

/* ------------------------------------------------------------------------------------------------
 * Initialisation
 * ---------------------------------------------------------------------------------------------- */
static void add_exclude(const char *p, size_t n, size_t *used)
{
    while (n > 1 && p[n - 1] == '/')
        n--;
    if (n == 0 || p[0] != '/' || g_nexcl >= MAX_EXCLUDES || *used + n + 1 > sizeof g_excl_buf)
        return;
    memcpy(g_excl_buf + *used, p, n);
    g_excl_buf[*used + n] = 0;
    g_excl[g_nexcl] = g_excl_buf + *used;
    g_excl_len[g_nexcl] = n;
    g_nexcl++;
    *used += n + 1;
}

/* prefixes under which files of Python installations are counted after all (--io-include) */
static void add_include(const char *p, size_t n, size_t *used)
{
    while (n > 1 && p[n - 1] == '/')
        n--;
    if (n == 0 || p[0] != '/' || g_nincl >= MAX_EXCLUDES || *used + n + 1 > sizeof g_incl_buf)
        return;
    memcpy(g_incl_buf + *used, p, n);
    g_incl_buf[*used + n] = 0;
    g_incl[g_nincl] = g_incl_buf + *used;
    g_incl_len[g_nincl] = n;
    g_nincl++;
    *used += n + 1;
}

static void each_prefix(const char *list, void (*add)(const char *, size_t, size_t *))
{
    size_t used = 0;
    while (*list) {
        const char *c = strchr(list, ':');
        size_t n = c ? (size_t)(c - list) : strlen(list);
        add(list, n, &used);
        list += n;
        if (*list == ':')
            list++;
    }
}

static const char default_excludes[] = "/proc:/sys:/dev:/etc:/usr:/bin:/sbin:/lib:/lib32:/lib64:/boot:/run";

__attribute__((constructor)) static void holoprof_io_init(void)
{
    resolve_all();
    tl_in = 1;
    struct timespec rt, mt;
    clock_gettime(CLOCK_REALTIME, &rt);
    clock_gettime(CLOCK_MONOTONIC, &mt);
    g_start_ns = (int64_t)rt.tv_sec * 1000000000LL + rt.tv_nsec;
    g_wall_off = g_start_ns - ((int64_t)mt.tv_sec * 1000000000LL + mt.tv_nsec);
    g_pid = raw_getpid();

    const char *dis = getenv("HOLOPROF_IO_DISABLE");
    if (dis && dis[0] && strcmp(dis, "0") != 0) {
        tl_in = 0;
        return;
    }
    const char *mx = getenv("HOLOPROF_IO_MAX_FILES");
    if (mx && *mx) {
        long v = strtol(mx, NULL, 10);
        if (v > 0 && v < (long)REC_CAP)
            g_max_recs = (uint32_t)v;
    }
    const char *rd = getenv("HOLOPROF_RUN_DIR");
    if (rd && rd[0]) {
        char buf[PATH_MAX];
        ssize_t n = abs_path(AT_FDCWD, rd, buf);
        if (n > 0) {
            memcpy(g_run_dir, buf, (size_t)n + 1);
            g_run_dir_len = (size_t)n;
        }
    }
    const char *ex = getenv("HOLOPROF_IO_EXCLUDE");
    each_prefix(ex ? ex : default_excludes, add_exclude);
    const char *in = getenv("HOLOPROF_IO_INCLUDE");
    if (in)
        each_prefix(in, add_include);
    long ps = sysconf(_SC_PAGESIZE);
    if (ps > 0)
        g_page = ps;
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    tl_in = 0;
    atomic_store(&g_ready, 1);
}

__attribute__((destructor)) static void holoprof_io_fini(void) { dump_at_exit("exit"); }

/* ------------------------------------------------------------------------------------------------
 * API for the in-process reader (ctypes)
 * ---------------------------------------------------------------------------------------------- */
EXPORT int holoprof_io_version(void) { return HOLOPROF_IO_VERSION; }

EXPORT int holoprof_io_active(void) { return atomic_load(&g_ready); }

/* on != 0: this process's counters are read by an agent, so no dump is written at exit. The claim
 * names this pid: a forked child is not owned until its own agent claims it again. */
EXPORT void holoprof_io_set_owner(int on) { atomic_store(&g_owner_pid, on ? raw_getpid() : 0); }

EXPORT int holoprof_io_is_owner(void) { return atomic_load(&g_owner_pid) == raw_getpid(); }

EXPORT long holoprof_io_dropped(void) { return atomic_load(&g_dropped); }

EXPORT long holoprof_io_nfiles(void) { return (long)atomic_load(&g_nrec); }

/* snapshot record layout: u32 reclen, u32 index, u16 module, u16 path_len, u32 reserved,
 * i64 counters[NI_MAX], i64 fcounters_ns[NF_MAX], path bytes, zero padding to 8 bytes */
#define SNAP_HDR 16

EXPORT int holoprof_io_layout(int *ni_max, int *nf_max, int *hdr)
{
    if (ni_max)
        *ni_max = NI_MAX;
    if (nf_max)
        *nf_max = NF_MAX;
    if (hdr)
        *hdr = SNAP_HDR;
    return HOLOPROF_IO_VERSION;
}

/* comma-separated names; kind 0: integer counters, 1: float counters (seconds) */
EXPORT const char *holoprof_io_counter_names(int module, int kind)
{
    if (module == MOD_POSIX)
        return kind ? posix_f_names : posix_int_names;
    return kind ? stdio_f_names : stdio_int_names;
}

/* Serialise the records updated at or after epoch `since` (0: all) into buf. Returns the bytes
 * written, or minus the bytes needed when len is too small (nothing usable is written then).
 * *next_since receives the epoch to pass next time to get only what changed in between. */
EXPORT int64_t holoprof_io_snapshot(void *buf, size_t len, uint64_t since, uint64_t *next_since)
{
    int saved = tl_in;
    tl_in = 1;
    uint64_t cur = atomic_fetch_add(&g_epoch, 1);
    if (next_since)
        *next_since = cur + 1;
    uint32_t n = atomic_load_explicit(&g_nrec, memory_order_acquire);
    char *out = (char *)buf;
    size_t used = 0;
    int too_small = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct rec *r = &g_recs[i];
        size_t rl = (SNAP_HDR + 8 * (NI_MAX + NF_MAX) + r->path_len + 7) & ~(size_t)7;
        lock_rec(i);
        int live = r->gen == g_gen && r->mod_epoch && r->mod_epoch >= since;
        if (live && !too_small && used + rl <= len) {
            char *p = out + used;
            uint32_t rl32 = (uint32_t)rl, idx = i, zero = 0;
            uint16_t mod = r->module, pl = r->path_len;
            memcpy(p, &rl32, 4);
            memcpy(p + 4, &idx, 4);
            memcpy(p + 8, &mod, 2);
            memcpy(p + 10, &pl, 2);
            memcpy(p + 12, &zero, 4);
            memcpy(p + SNAP_HDR, r->c, 8 * NI_MAX);
            memcpy(p + SNAP_HDR + 8 * NI_MAX, r->f, 8 * NF_MAX);
            char *q = p + SNAP_HDR + 8 * (NI_MAX + NF_MAX);
            memcpy(q, rec_path(r), pl);
            memset(q + pl, 0, rl - (SNAP_HDR + 8 * (NI_MAX + NF_MAX) + pl));
        } else if (live) {
            too_small = 1;
        }
        unlock_rec(i);
        if (live)
            used += rl;
    }
    tl_in = saved;
    return too_small ? -(int64_t)used : (int64_t)used;
}

/* the path of record idx (as bytes, not terminated); returns its length, or -1 */
EXPORT int holoprof_io_path(uint32_t idx, char *buf, size_t len)
{
    if (idx >= atomic_load_explicit(&g_nrec, memory_order_acquire))
        return -1;
    const struct rec *r = &g_recs[idx];
    if (r->path_len > len)
        return -(int)r->path_len;
    memcpy(buf, rec_path(r), r->path_len);
    return r->path_len;
}

EXPORT int holoprof_io_module(uint32_t idx)
{
    if (idx >= atomic_load_explicit(&g_nrec, memory_order_acquire))
        return -1;
    return g_recs[idx].module;
}

/* write a dump now; path NULL: the default location under $HOLOPROF_RUN_DIR. 0 on success. */
EXPORT int holoprof_io_dump(const char *path)
{
    int saved = tl_in;
    int e = errno;
    int rc = -1;
    tl_in = 1;
    if (!atomic_exchange(&g_dumping, 1)) {
        char def[PATH_MAX];
        if (!path && default_dump_path(def, sizeof def) == 0)
            path = def;
        map_release_all(); /* the final counters: mappings still there count now */
        if (path)
            rc = write_dump(path, "request");
        atomic_store(&g_dumping, 0);
    }
    tl_in = saved;
    errno = e;
    return rc;
}

/* Start recording every access into a ring of max_records entries (records beyond are dropped
 * and counted). A running trace is stopped and its unread records are discarded. 0 on success. */
EXPORT int holoprof_io_trace_start(uint64_t max_records)
{
    if (max_records == 0)
        return -1;
    if (max_records > TRACE_MAX_RECORDS)
        max_records = TRACE_MAX_RECORDS;
    int saved = tl_in;
    tl_in = 1;
    pthread_mutex_lock(&g_trace_mu);
    trace_detach();
    if (g_drain_ring) {
        munmap(g_drain_ring, g_drain_ring->map_len);
        g_drain_ring = NULL;
    }
    size_t bytes = sizeof(struct ring) + max_records * sizeof(struct tslot);
    struct ring *r = real_mmap ? real_mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                               : MAP_FAILED;
    if (r == MAP_FAILED) {
        pthread_mutex_unlock(&g_trace_mu);
        tl_in = saved;
        return -1;
    }
    r->cap = max_records;
    r->map_len = bytes;
    atomic_store(&r->head, 0);
    r->tail = 0;
    for (uint64_t i = 0; i < max_records; i++)
        atomic_store_explicit(&r->slots[i].seq, i, memory_order_relaxed);
    atomic_store(&g_trace_dropped, 0);
    g_drain_ring = r;
    atomic_store(&g_ring, r);
    atomic_store(&g_trace_on, 1);
    pthread_mutex_unlock(&g_trace_mu);
    tl_in = saved;
    return 0;
}

/* stop recording; records not drained yet stay readable until the next start */
EXPORT void holoprof_io_trace_stop(void)
{
    int saved = tl_in;
    tl_in = 1;
    pthread_mutex_lock(&g_trace_mu);
    trace_detach();
    pthread_mutex_unlock(&g_trace_mu);
    tl_in = saved;
}

EXPORT int holoprof_io_trace_active(void) { return atomic_load(&g_trace_on); }

EXPORT long holoprof_io_trace_dropped(void) { return atomic_load(&g_trace_dropped); }

/* Move up to max_records trace records (40 bytes each: u32 record index, u8 module, u8 op, u16 0,
 * i64 offset, i64 size, i64 start_ns, i64 end_ns; wall-clock ns) into buf; returns the count. */
EXPORT int64_t holoprof_io_trace_drain(void *buf, uint64_t max_records)
{
    int saved = tl_in;
    tl_in = 1;
    int64_t got = 0;
    pthread_mutex_lock(&g_trace_mu);
    struct ring *r = g_drain_ring;
    if (r) {
        struct trec *out = (struct trec *)buf;
        while ((uint64_t)got < max_records) {
            uint64_t pos = r->tail;
            struct tslot *s = &r->slots[pos % r->cap];
            uint64_t seq = atomic_load_explicit(&s->seq, memory_order_acquire);
            if (seq != pos + 1)
                break;
            out[got++] = s->r;
            atomic_store_explicit(&s->seq, pos + r->cap, memory_order_release);
            r->tail = pos + 1;
        }
    }
    pthread_mutex_unlock(&g_trace_mu);
    tl_in = saved;
    return got;
}

_Static_assert(sizeof(struct trec) == 40, "trace record layout");
