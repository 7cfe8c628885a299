/* hp_mmap.c -- memory-mapped files: mappings, bytes mapped, and the pages the process brought in
 * (measured from its page tables when a mapping goes: munmap, or the final dump), per mapping and as
 * the distinct pages of the file (hp_pages.c). A forked child keeps the mappings of its parent: what
 * it touches through them is measured at its own final dump. */
#include "hp_common.h"
#include "hp_real.h"

/* live mappings of tracked files: measured when they go (munmap, or the final dump) */
struct mapping {
    uintptr_t addr;
    size_t len;
    int64_t off;            /* offset in the file of addr */
    int32_t rec;
    uint16_t unmeasured;    /* a part of it went without being measured */
    uint16_t inherited;     /* made by the parent before fork: not one of this process's mmaps */
};
static struct mapping g_maps[MAP_CAP];
static uint32_t g_nmaps;                /* entries 0 .. g_nmaps-1, guarded by g_map_lock */
static _Atomic uint32_t g_maps_live;    /* == g_nmaps, read without the lock by munmap */
static _Atomic int g_map_lock;
static _Atomic int64_t g_measure_ns;    /* time spent reading page tables, against its budget */
HIDDEN long g_page = 4096;             /* set at start-up */

static inline void map_lock(void)
{
    while (atomic_exchange_explicit(&g_map_lock, 1, memory_order_acquire))
        cpu_relax();
}

static inline void map_unlock(void) { atomic_store_explicit(&g_map_lock, 0, memory_order_release); }

/* Bytes of [a, a+len) present in this process's page tables (/proc/self/pagemap, bit 63): the pages
 * the process touched, plus those the kernel mapped around each fault. -1 when it cannot be read.
 * The pages are added to the set of record ri (file offset `off` at a); *distinct: the bytes of them
 * that were not in it yet. */
static int64_t resident_bytes(int32_t ri, uintptr_t a, size_t len, int64_t off, int64_t *distinct)
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
    uint64_t file_first = (uint64_t)off / (uint64_t)g_page;
    int64_t pages = 0, added = 0;
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
        int64_t k_added = pages_add((uint32_t)ri, file_first + (pg - first), buf, got);
        if (k_added > 0)
            added += k_added;
        pg += got;
    }
    real_close(fd);
    *distinct = added * g_page;
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

/* [a, a+len) of a mapping m goes: add its resident bytes; `whole`: the mapping is gone */
static void map_account(const struct mapping *m, uintptr_t a, size_t len, int whole)
{
    int32_t ri = m->rec;
    int64_t b = -1, distinct = 0;
    if (measure_allowed(len)) {
        int64_t t0 = mono_ns();
        b = resident_bytes(ri, a, len, m->off + (int64_t)(a - m->addr), &distinct);
        atomic_fetch_add_explicit(&g_measure_ns, mono_ns() - t0, memory_order_relaxed);
    }
    struct rec *r = &g_recs[ri];
    lock_rec((uint32_t)ri);
    touch(r);
    if (b >= 0)
        r->c[POSIX_BYTES_MAPPED_RESIDENT] += b;
    r->c[POSIX_BYTES_MAPPED_DISTINCT] += distinct;
    if (whole && b >= 0 && !m->unmeasured && !m->inherited)
        r->c[POSIX_MMAPS_MEASURED]++;
    unlock_rec((uint32_t)ri);
}

static void map_add(int32_t ri, uintptr_t a, size_t len, int64_t off)
{
    map_lock();
    if (g_nmaps < MAP_CAP) {
        g_maps[g_nmaps] = (struct mapping){a, len, off, ri, 0, 0};
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
            x->off += (int64_t)(k->hi - x->addr);
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
        map_account(&w[i].m, w[i].lo, w[i].hi - w[i].lo, w[i].whole);
}

/* the final dump: every mapping still there counts now (and no more at a later munmap) */
void map_release_all(void)
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
            map_account(&m, m.addr, m.len, 1);
    }
}

/* in a forked child: the lock may have been held by a thread that is not there; the mappings are the
 * parent's, still there in the child (measured at its final dump, not counted as its own mmaps) */
void map_reset_after_fork(void)
{
    atomic_store(&g_map_lock, 0);
    for (uint32_t i = 0; i < g_nmaps; i++)
        g_maps[i].inherited = 1;
    pages_reset_after_fork();
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
        map_add((int32_t)ri, (uintptr_t)addr, len, off);
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
