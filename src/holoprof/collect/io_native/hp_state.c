/* hp_state.c -- the process-wide state the modules share (declared in hp_common.h). The big tables
 * are zero-initialised .bss: the kernel backs only the pages in use. */
#include "hp_common.h"

HIDDEN struct rec g_recs[REC_CAP];
HIDDEN _Atomic uint32_t g_nrec;
HIDDEN uint32_t g_max_recs = REC_CAP;
HIDDEN char g_arena[ARENA_SIZE];
HIDDEN pthread_mutex_t g_insert_mu = PTHREAD_MUTEX_INITIALIZER;
HIDDEN struct lockslot g_locks[NLOCKS] __attribute__((aligned(64)));
HIDDEN struct fdslot g_fd[FD_CAP];

HIDDEN _Atomic long g_dropped;
HIDDEN _Atomic uint64_t g_epoch = 1;
HIDDEN uint32_t g_gen = 1;
HIDDEN _Atomic int g_ready;
HIDDEN pid_t g_pid;
HIDDEN _Atomic pid_t g_owner_pid;
HIDDEN int64_t g_wall_off;
HIDDEN int64_t g_start_ns;
HIDDEN _Atomic int g_dumping;

HIDDEN __thread int tl_in __attribute__((tls_model("initial-exec")));
