/* hp_trace.c -- the per-operation trace (like Darshan's DXT): a bounded ring of access records,
 * written by every thread while it is switched on and drained by the in-process reader through the
 * exported holoprof_io_trace_* functions. */
#include "hp_common.h"
#include "hp_real.h"

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
HIDDEN _Atomic int g_trace_on;
static _Atomic(struct ring *) g_ring;  /* producers write here */
static struct ring *g_drain_ring;      /* consumer reads here (same ring, kept after stop) */
static _Atomic long g_trace_inflight;
HIDDEN _Atomic long g_trace_dropped;
HIDDEN pthread_mutex_t g_trace_mu = PTHREAD_MUTEX_INITIALIZER;

_Static_assert(sizeof(struct trec) == 40, "trace record layout");

/* record one access into the ring; when it is full the record is dropped and counted */
void trace_push(int module, uint32_t rec, int op, int64_t off, int64_t size, int64_t t0, int64_t t1)
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

/* detach the producing ring and wait until no producer still writes to it; g_trace_mu held */
static void trace_detach(void)
{
    atomic_store(&g_trace_on, 0);
    atomic_exchange(&g_ring, NULL);
    while (atomic_load(&g_trace_inflight) > 0)
        sched_yield();
}

/* in a forked child: the trace belongs to the parent */
void trace_reset_after_fork(void)
{
    atomic_store(&g_trace_on, 0);
    struct ring *r = atomic_exchange(&g_ring, NULL);
    if (g_drain_ring && g_drain_ring != r)
        munmap(g_drain_ring, g_drain_ring->map_len);
    if (r)
        munmap(r, r->map_len);
    g_drain_ring = NULL;
    atomic_store(&g_trace_inflight, 0);
    atomic_store(&g_trace_dropped, 0);
}

/* ------------------------------------------------------------------------------------------------
 * API for the in-process reader (ctypes)
 * ---------------------------------------------------------------------------------------------- */
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

