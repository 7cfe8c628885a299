/* hp_rename.c -- rename: a file written under a temporary name and renamed into place (safetensors,
 * fsspec, atomic saves) is counted under its final name. The old name's counters move to the new
 * name's record (summed; highest bytes and last times kept) and the old record is left with zeros, so
 * that its last snapshot counts nothing; descriptors still open on it follow. */
#include "hp_common.h"
#include "hp_real.h"

/* the counters of src go to dst, and so do the descriptors open on src */
static void move_record(int module, uint32_t src, uint32_t dst)
{
    merge_into(module, dst, src);
    for (int fd = 0; fd < FD_CAP; fd++) {
        int32_t want = (int32_t)src + 1;
        if (module == MOD_POSIX)
            atomic_compare_exchange_strong(&g_fd[fd].rec, &want, (int32_t)dst + 1);
        else
            atomic_compare_exchange_strong(&g_fd[fd].srec, &want, (int32_t)dst + 1);
    }
}

static void renamed(int olddirfd, const char *oldp, int newdirfd, const char *newp)
{
    if (foreign_process())
        return;
    int e = errno;
    tl_in = 1;
    char a[PATH_MAX], b[PATH_MAX];
    ssize_t na = abs_path(olddirfd, oldp, a);
    ssize_t nb = na > 0 ? abs_path(newdirfd, newp, b) : -1;
    if (nb > 0 && !excluded(b, (size_t)nb)) {
        for (int module = MOD_POSIX; module <= MOD_STDIO; module++) {
            int32_t src = find_rec(module, a, (size_t)na);
            if (src < 0)
                continue;
            int32_t dst = get_rec(module, b, (size_t)nb);
            if (dst >= 0 && dst != src)
                move_record(module, (uint32_t)src, (uint32_t)dst);
        }
    }
    tl_in = 0;
    errno = e;
}

/* At the close of a descriptor that wrote: a file renamed by a call we do not see (a raw system
 * call, as Rust's rustix makes for safetensors' temporary files) is found by its path no longer
 * naming it; the descriptor's link names where it is now. Returns the record to count the close on. */
int32_t follow_rename(int fd, int32_t ri)
{
    struct rec *r = &g_recs[ri];
    if (r->gen != g_gen || r->module != MOD_POSIX || r->c[POSIX_WRITES] <= 0 || !real_fstat || !real_stat)
        return ri;
    struct stat now, then;
    if (real_fstat(fd, &now) != 0 || !S_ISREG(now.st_mode))
        return ri;
    if (real_stat(rec_path(r), &then) == 0 && then.st_dev == now.st_dev && then.st_ino == now.st_ino)
        return ri; /* still there under its name (the usual case) */
    char buf[PATH_MAX];
    ssize_t n = fd_link(fd, buf, sizeof buf);
    if (n <= 0)
        return ri;
    n = (ssize_t)normalize(buf, (size_t)n);
    if (n > 10 && memcmp(buf + n - 10, " (deleted)", 10) == 0)
        return ri;
    if (excluded(buf, (size_t)n))
        return ri;
    int32_t dst = get_rec(MOD_POSIX, buf, (size_t)n);
    if (dst < 0 || dst == ri)
        return ri;
    move_record(MOD_POSIX, (uint32_t)ri, (uint32_t)dst);
    return dst;
}

EXPORT int rename(const char *oldp, const char *newp)
{
    ENSURE_RET(rename, -1);
    int r = real_rename(oldp, newp);
    if (r == 0 && active() && oldp && newp)
        renamed(AT_FDCWD, oldp, AT_FDCWD, newp);
    return r;
}

EXPORT int renameat(int olddirfd, const char *oldp, int newdirfd, const char *newp)
{
    ENSURE_RET(renameat, -1);
    int r = real_renameat(olddirfd, oldp, newdirfd, newp);
    if (r == 0 && active() && oldp && newp)
        renamed(olddirfd, oldp, newdirfd, newp);
    return r;
}

EXPORT int renameat2(int olddirfd, const char *oldp, int newdirfd, const char *newp, unsigned int flags)
{
    ENSURE_RET(renameat2, -1);
    int r = real_renameat2(olddirfd, oldp, newdirfd, newp, flags);
    if (r == 0 && active() && oldp && newp && !(flags & 2u /* RENAME_EXCHANGE */))
        renamed(olddirfd, oldp, newdirfd, newp);
    return r;
}

