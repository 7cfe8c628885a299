/* hp_table.c -- the table of file records: one per (module, path), found through an open-addressing
 * hash table, their path names in one arena. Records are never removed; lookups take no lock. */
#include "hp_common.h"

static _Atomic uint32_t g_ht[HT_SIZE];
static uint32_t g_arena_used;

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
int32_t find_rec(int module, const char *p, size_t n)
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
int32_t get_rec(int module, const char *p, size_t n)
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
