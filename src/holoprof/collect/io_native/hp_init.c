/* hp_init.c -- start-up (the library's constructor reads the environment), the dump at exit (its
 * destructor), and fork: the child starts with zeroed counters and fresh locks. */
#include "hp_common.h"
#include "hp_real.h"

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
    map_reset_after_fork();
    /* counters start at zero in the child; records (and descriptor mapping) are kept */
    g_gen++;
    atomic_store(&g_dropped, 0);
    g_pid = raw_getpid();
    trace_reset_after_fork();
    atomic_store(&g_dumping, 0);
    tl_fork_locked = 0;
    tl_in = tl_fork_saved;
}

/* ------------------------------------------------------------------------------------------------
 * Initialisation
 * ---------------------------------------------------------------------------------------------- */
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
    path_policy_init();
    long ps = sysconf(_SC_PAGESIZE);
    if (ps > 0)
        g_page = ps;
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
#ifdef __GLIBC__
    on_exit(exit_status_handler, NULL); /* the status exit() is given, for the exit file */
#endif
    tl_in = 0;
    atomic_store(&g_ready, 1);
}

/* runs after the interpreter's finalization (a preloaded library's destructor runs after every other
 * library's; only exit_status_handler comes later): the dump of a process no agent reads, or the exit
 * time of one an agent reads */
__attribute__((destructor)) static void holoprof_io_fini(void) { dump_at_exit("exit", -1); }

