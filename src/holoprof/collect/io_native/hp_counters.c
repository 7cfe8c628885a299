/* hp_counters.c -- the counters of one file record, updated per access by Darshan's rules (called
 * after the real call, with tl_in set), and merged when a file is renamed. */
#include "hp_common.h"

HIDDEN const char posix_int_names[] = POSIX_INT_COUNTERS(NAME_X);
HIDDEN const char posix_f_names[] = POSIX_F_COUNTERS(NAME_X);
HIDDEN const char stdio_int_names[] = STDIO_INT_COUNTERS(NAME_X);
HIDDEN const char stdio_f_names[] = STDIO_F_COUNTERS(NAME_X);

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

void posix_io(uint32_t ri, int is_write, int64_t off, int64_t n, int64_t t0, int64_t t1)
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

void posix_meta(uint32_t ri, int kind, int64_t off, int64_t t0, int64_t t1)
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

void stdio_io(uint32_t ri, int is_write, int64_t off, int64_t n, int64_t t0, int64_t t1)
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

void stdio_meta(uint32_t ri, int kind, int64_t off, int64_t t0, int64_t t1)
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
 * Merging (rename): the old name's counters move to the new name's record, summed; highest bytes and
 * last times kept, first times the earliest. The old record is left with zeros.
 * ---------------------------------------------------------------------------------------------- */
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

void merge_into(int module, uint32_t dst, uint32_t src)
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
