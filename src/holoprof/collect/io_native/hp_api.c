/* hp_api.c -- the exported API read by the in-process agent (through the extension module
 * holoprof.collect._io_api, or ctypes): counters (snapshot), paths, ownership, and a dump on
 * request. The trace's API is in hp_trace.c. */
#include "hp_common.h"

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
