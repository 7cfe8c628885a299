/* hp_fd.c -- descriptor tracking: which file record each descriptor counts on, from its open (or its
 * first use, for descriptors we never saw opened) to its close, across dup and close_range. */
#include "hp_common.h"
#include "hp_real.h"

/* First use of a descriptor we never saw opened (inherited across exec, redirected, or opened by a
 * call we do not interpose): attribute it if it is a regular file. */
int32_t probe_fd(int fd)
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

/* a successful open of (dirfd, path): the descriptor counts on the path's record, or on none */
void posix_opened(int fd, int dirfd, const char *path, int flags, int64_t t0, int64_t t1)
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
 * close, close_range, closefrom, dup
 * ---------------------------------------------------------------------------------------------- */
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

