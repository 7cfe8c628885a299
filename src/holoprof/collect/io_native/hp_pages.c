/* hp_pages.c -- the pages of each mapped file that this process brought in, as a set of file pages:
 * the union over all its mappings of the file (a file mapped anew for every batch counts each page
 * once), and over the mappings it inherited from its parent at fork. The sets go into the dump of the
 * final counters (hp_dump.c); the analysis takes their union over the processes. */
#include "hp_common.h"

/* one bit per page of the file, from offset 0; grown on demand (anonymous memory, lazily backed) */
struct pset {
    uint64_t *bits;
    uint64_t nwords;
    uint32_t gen; /* valid only when gen == g_gen: a forked child starts with empty sets */
};
static struct pset g_psets[REC_CAP];
static _Atomic int g_pset_lock;

static inline void pset_lock(void)
{
    while (atomic_exchange_explicit(&g_pset_lock, 1, memory_order_acquire))
        cpu_relax();
}

static inline void pset_unlock(void) { atomic_store_explicit(&g_pset_lock, 0, memory_order_release); }

static void *anon_map(size_t bytes)
{
    void *p = (void *)syscall(SYS_mmap, NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED || (uintptr_t)p > (uintptr_t)-4096 ? NULL : p;
}

/* Call with the lock held: the set of record ri, emptied when it was made before fork() and grown to
 * hold page `last`; NULL when it cannot (no memory, or `last` beyond PAGES_MAX). */
static struct pset *pset_for(uint32_t ri, uint64_t last)
{
    struct pset *s = &g_psets[ri];
    if (s->gen != g_gen) {
        if (s->bits)
            syscall(SYS_munmap, s->bits, s->nwords * 8);
        s->bits = NULL;
        s->nwords = 0;
        s->gen = g_gen;
    }
    if (last >= PAGES_MAX)
        return NULL;
    uint64_t need = last / 64 + 1;
    if (need > s->nwords) {
        uint64_t n = s->nwords ? s->nwords : 64;
        while (n < need)
            n *= 2;
        uint64_t *bits = anon_map(n * 8);
        if (!bits)
            return NULL;
        if (s->bits) {
            memcpy(bits, s->bits, s->nwords * 8);
            syscall(SYS_munmap, s->bits, s->nwords * 8);
        }
        s->bits = bits;
        s->nwords = n;
    }
    return s;
}

/* n entries of /proc/self/pagemap for the file pages first .. first+n-1 of record ri: add the present
 * ones to its set. Returns the pages that were not in the set yet (-1: the set cannot hold them). */
int64_t pages_add(uint32_t ri, uint64_t first, const uint64_t *pagemap, uint64_t n)
{
    if (!n)
        return 0;
    int64_t added = 0;
    pset_lock();
    struct pset *s = pset_for(ri, first + n - 1);
    if (s) {
        for (uint64_t i = 0; i < n; i++) {
            if (!(pagemap[i] >> 63))
                continue;
            uint64_t pg = first + i, m = 1ull << (pg & 63);
            uint64_t *w = &s->bits[pg / 64];
            if (!(*w & m)) {
                *w |= m;
                added++;
            }
        }
    }
    pset_unlock();
    return s ? added : -1;
}

/* Call `emit` with every run of consecutive pages in the set of record ri (first page, count), in
 * order, with the set locked: emit must not call back into this module. Returns the runs emitted. */
long pages_runs(uint32_t ri, void (*emit)(void *ctx, uint64_t first, uint64_t count), void *ctx)
{
    long runs = 0;
    pset_lock();
    struct pset *s = &g_psets[ri];
    if (s->gen == g_gen && s->bits) {
        uint64_t start = 0, len = 0;
        for (uint64_t w = 0; w < s->nwords; w++) {
            uint64_t v = s->bits[w];
            if (!v && !len)
                continue;
            if (v == ~0ull && len) {
                len += 64;
                continue;
            }
            for (unsigned b = 0; b < 64; b++) {
                if (v >> b & 1) {
                    if (!len)
                        start = w * 64 + b;
                    len++;
                } else if (len) {
                    emit(ctx, start, len);
                    runs++;
                    len = 0;
                }
            }
        }
        if (len) {
            emit(ctx, start, len);
            runs++;
        }
    }
    pset_unlock();
    return runs;
}

/* in a forked child: the lock may have been held by a thread that is not there (the sets themselves
 * are emptied at their next use: their gen is the parent's) */
void pages_reset_after_fork(void) { atomic_store(&g_pset_lock, 0); }
