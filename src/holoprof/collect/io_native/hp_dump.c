/* hp_dump.c -- the files a process leaves in its folder of the run, $HOLOPROF_RUN_DIR/<host>-<pid>/:
 *   io_native-<pid>.jsonl  the dump of its counters (JSON lines, with the distinct pages of each
 *                          mapped file it brought in), written at exit (and at _exit/_Exit, which skip
 *                          destructors) for processes no agent reads, or on request (an agent's final
 *                          counters);
 *   exit-<pid>.json        when it exited (the wall clock, after the interpreter's finalization), for
 *                          processes an agent reads (the agent's own end is taken earlier), and the
 *                          status it gave exit() or _exit() (its low 8 bits: what wait() sees). */
#include "hp_common.h"
#include "hp_real.h"

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

/* the first line: the process, and the names of every counter */
static void jw_header(struct jw *w, const char *reason)
{
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
    jw_str(w, ",\"page_size\":");
    jw_int(w, g_page);
    jw_str(w, ",\"counter_names\":{\"POSIX\":");
    jw_name_list(w, posix_int_names, posix_f_names);
    jw_str(w, ",\"STDIO\":");
    jw_name_list(w, stdio_int_names, stdio_f_names);
    jw_str(w, "}}\n");
}

struct runs_ctx {
    struct jw *w;
    int first;
};

static void emit_run(void *ctx, uint64_t first, uint64_t count)
{
    struct runs_ctx *c = ctx;
    struct jw *w = c->w;
    char *o = jw_reserve(w, 48);
    size_t k = 0;
    if (!c->first)
        o[k++] = ',';
    c->first = 0;
    o[k++] = '[';
    k += fmt_int(o + k, (long)first);
    o[k++] = ',';
    k += fmt_int(o + k, (long)count);
    o[k++] = ']';
    w->len += k;
}

/* one line per file touched in this process, with its non-zero counters (and the distinct pages of
 * a mapped file it brought in: "mapped_pages", runs of [first page, count] from offset 0) */
static void jw_records(struct jw *w)
{
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
        jw_str(w, "}");
        if (copy.module == MOD_POSIX && copy.c[POSIX_BYTES_MAPPED_DISTINCT]) {
            struct runs_ctx c = {w, 1};
            jw_str(w, ",\"mapped_pages\":[");
            pages_runs(i, emit_run, &c);
            jw_str(w, "]");
        }
        jw_str(w, "}\n");
    }
}

/* the dump into target, written under target.tmp and renamed into place; 0 on success */
int write_dump(const char *target, const char *reason)
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
    jw_header(w, reason);
    jw_records(w);
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

/* $HOLOPROF_RUN_DIR/<host>-<pid>/<prefix><pid><suffix>; the folder is made when `make` is set, else
 * it must be there already (-1 otherwise) */
static int proc_file_path(char *out, size_t cap, const char *prefix, const char *suffix, int make)
{
    struct utsname u;
    if (!g_run_dir_len)
        return -1;
    if (uname(&u) != 0)
        strcpy(u.nodename, "localhost");
    char pid[24];
    fmt_int(pid, raw_getpid());
    size_t need = g_run_dir_len + 1 + strlen(u.nodename) + 1 + strlen(pid) + 1 + strlen(prefix) + strlen(pid) +
                  strlen(suffix) + 1;
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
    if (make ? mkdir(out, 0700) != 0 && errno != EEXIST : access(out, F_OK) != 0)
        return -1;
    *p++ = '/';
    p = stpcpy(p, prefix);
    p = stpcpy(p, pid);
    stpcpy(p, suffix);
    return 0;
}

/* $HOLOPROF_RUN_DIR/<host>-<pid>/io_native-<pid>.jsonl */
int default_dump_path(char *out, size_t cap) { return proc_file_path(out, cap, "io_native-", ".jsonl", 1); }

/* The status this process gave exit() (glibc's on_exit handlers get it) or _exit(), its low 8 bits;
 * -1 until then. Python gives exit() 0 at a normal end, 1 after an uncaught exception, n for
 * sys.exit(n). */
static volatile int g_exit_status = -1;
/* the exit file was written (by the destructor) before the status was known */
static volatile int g_exit_written;

/* {"format": ..., "pid": ..., "exit_ns": ..., "reason": ..., "status": ...} into the process's folder
 * (when the agent made it): when this process ended, after everything it ran in user space, and the
 * status it exited with, when known. */
static void write_exit_time(const char *reason)
{
    char target[PATH_MAX];
    if (!g_run_dir_len || proc_file_path(target, sizeof target, "exit-", ".json", 0) != 0)
        return;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    char buf[160], *p = buf;
    p = stpcpy(p, "{\"format\":\"holoprof.exit/1\",\"pid\":");
    p += fmt_int(p, raw_getpid());
    p = stpcpy(p, ",\"exit_ns\":");
    p += fmt_int(p, (long)((int64_t)now.tv_sec * 1000000000LL + now.tv_nsec));
    p = stpcpy(p, ",\"reason\":\"");
    p = stpcpy(p, reason);
    p = stpcpy(p, "\"");
    if (g_exit_status >= 0) {
        p = stpcpy(p, ",\"status\":");
        p += fmt_int(p, g_exit_status);
    }
    p = stpcpy(p, "}\n");
    int fd = real_open ? real_open(target, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600) : -1;
    if (fd < 0)
        return;
    size_t len = (size_t)(p - buf), done = 0;
    while (done < len) {
        ssize_t k = real_write ? real_write(fd, buf + done, len - done) : -1;
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        done += (size_t)k;
    }
    real_close(fd);
}

void dump_at_exit(const char *reason, int status)
{
    if (!atomic_load(&g_ready) || !g_run_dir_len || tl_in)
        return; /* tl_in: _exit from a signal handler that interrupted us while we hold a lock */
    pid_t pid = raw_getpid();
    if (pid != g_pid)
        return; /* a vfork child, which shares this process's memory: nothing of it is ours */
    if (status >= 0)
        g_exit_status = status & 0xff; /* what the parent's wait() sees */
    if (atomic_load(&g_owner_pid) == pid) {
        /* its agent read the counters (and took its final dump); the end is ours to tell */
        int e = errno;
        tl_in = 1;
        write_exit_time(reason);
        g_exit_written = 1;
        tl_in = 0;
        errno = e;
        return;
    }
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

/* glibc's exit() runs its handlers in the reverse order of their registration: the destructors
 * (the loader's clean-up, which __libc_start_main registers after this library's constructor
 * registered this) first. So the exit file is written without the status and written again here,
 * with it; in the other order the status is known when the destructor writes it. */
void exit_status_handler(int status, void *arg)
{
    (void)arg;
    if (raw_getpid() != g_pid)
        return;
    g_exit_status = status & 0xff;
    if (g_exit_written) {
        g_exit_written = 0;
        dump_at_exit("exit", status);
    }
}

EXPORT void _exit(int status)
{
    ENSURE(_exit);
    dump_at_exit("_exit", status);
    if (real__exit)
        real__exit(status);
    syscall(SYS_exit_group, status);
    __builtin_unreachable();
}

EXPORT void _Exit(int status)
{
    ENSURE(_Exit);
    dump_at_exit("_exit", status);
    if (real__Exit)
        real__Exit(status);
    syscall(SYS_exit_group, status);
    __builtin_unreachable();
}
