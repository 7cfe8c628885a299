/* hp_stat.c -- the stat family (Darshan counts successful stats of regular files, by path or
 * descriptor; glibc < 2.33 binaries call the versioned __xstat family) and fsync/fdatasync. */
#include "hp_common.h"
#include "hp_real.h"

/* a successful stat of a regular file by path: counted on the path's record */
static void stat_path_done(int dirfd, const char *path, int64_t t0, int64_t t1)
{
    int e = errno;
    tl_in = 1;
    char buf[PATH_MAX];
    ssize_t n = abs_path(dirfd, path, buf);
    if (n > 0 && !excluded(buf, (size_t)n)) {
        int32_t ri = get_rec(MOD_POSIX, buf, (size_t)n);
        if (ri >= 0)
            posix_meta((uint32_t)ri, META_STAT, 0, t0, t1);
    }
    tl_in = 0;
    errno = e;
}

/* a successful stat of a regular file by a tracked descriptor */
static void stat_fd_done(int32_t ri, int64_t t0, int64_t t1)
{
    int e = errno;
    tl_in = 1;
    posix_meta((uint32_t)ri, META_STAT, 0, t0, t1);
    tl_in = 0;
    errno = e;
}

#define STAT_PATH_BODY(REALCALL, DIRFD, PATH, MODE) \
    if (!active()) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    int r = REALCALL; \
    int64_t t1 = mono_ns(); \
    if (r == 0 && S_ISREG(MODE)) \
        stat_path_done(DIRFD, PATH, t0, t1); \
    return r;

#define STAT_FD_BODY(REALCALL, FD, MODE) \
    int32_t ri = fd_rec(FD); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    int r = REALCALL; \
    int64_t t1 = mono_ns(); \
    if (r == 0 && S_ISREG(MODE)) \
        stat_fd_done(ri, t0, t1); \
    return r;

static int empty_path(const char *p) { return p && !p[0]; }

/* fstatat with an empty path and AT_EMPTY_PATH is an fstat of dirfd */
#define STATAT_BODY(REALCALL, MODE) \
    if (empty_path(path) && (flags & AT_EMPTY_PATH)) { \
        STAT_FD_BODY(REALCALL, dirfd, MODE) \
    } \
    STAT_PATH_BODY(REALCALL, dirfd, path, MODE)

EXPORT int stat(const char *path, struct stat *st)
{
    ENSURE(stat);
    if (UNLIKELY(!real_stat))
        return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, 0);
    STAT_PATH_BODY(real_stat(path, st), AT_FDCWD, path, st->st_mode)
}

EXPORT int stat64(const char *path, struct stat64 *st)
{
    ENSURE(stat64);
    if (UNLIKELY(!real_stat64))
        return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, 0);
    STAT_PATH_BODY(real_stat64(path, st), AT_FDCWD, path, st->st_mode)
}

EXPORT int lstat(const char *path, struct stat *st)
{
    ENSURE(lstat);
    if (UNLIKELY(!real_lstat))
        return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW);
    STAT_PATH_BODY(real_lstat(path, st), AT_FDCWD, path, st->st_mode)
}

EXPORT int lstat64(const char *path, struct stat64 *st)
{
    ENSURE(lstat64);
    if (UNLIKELY(!real_lstat64))
        return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW);
    STAT_PATH_BODY(real_lstat64(path, st), AT_FDCWD, path, st->st_mode)
}

EXPORT int fstat(int fd, struct stat *st)
{
    ENSURE(fstat);
    if (UNLIKELY(!real_fstat))
        return (int)syscall(SYS_fstat, fd, st);
    STAT_FD_BODY(real_fstat(fd, st), fd, st->st_mode)
}

EXPORT int fstat64(int fd, struct stat64 *st)
{
    ENSURE(fstat64);
    if (UNLIKELY(!real_fstat64))
        return (int)syscall(SYS_fstat, fd, st);
    STAT_FD_BODY(real_fstat64(fd, st), fd, st->st_mode)
}

EXPORT int fstatat(int dirfd, const char *path, struct stat *st, int flags)
{
    ENSURE(fstatat);
    if (UNLIKELY(!real_fstatat))
        return (int)syscall(SYS_newfstatat, dirfd, path, st, flags);
    STATAT_BODY(real_fstatat(dirfd, path, st, flags), st->st_mode)
}

EXPORT int fstatat64(int dirfd, const char *path, struct stat64 *st, int flags)
{
    ENSURE(fstatat64);
    if (UNLIKELY(!real_fstatat64))
        return (int)syscall(SYS_newfstatat, dirfd, path, st, flags);
    STATAT_BODY(real_fstatat64(dirfd, path, st, flags), st->st_mode)
}

EXPORT int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *st)
{
    ENSURE(statx);
    if (UNLIKELY(!real_statx))
        return (int)syscall(SYS_statx, dirfd, path, flags, mask, st);
#define STX_REG ((st->stx_mask & STATX_TYPE) && S_ISREG(st->stx_mode))
    if (empty_path(path) && (flags & AT_EMPTY_PATH)) {
        int32_t ri = fd_rec(dirfd);
        if (LIKELY(ri < 0))
            return real_statx(dirfd, path, flags, mask, st);
        int64_t t0 = mono_ns();
        int r = real_statx(dirfd, path, flags, mask, st);
        int64_t t1 = mono_ns();
        if (r == 0 && STX_REG)
            stat_fd_done(ri, t0, t1);
        return r;
    }
    if (!active())
        return real_statx(dirfd, path, flags, mask, st);
    int64_t t0 = mono_ns();
    int r = real_statx(dirfd, path, flags, mask, st);
    int64_t t1 = mono_ns();
    if (r == 0 && STX_REG)
        stat_path_done(dirfd, path, t0, t1);
    return r;
#undef STX_REG
}

/* glibc < 2.33 binaries call the versioned __xstat family */
EXPORT int __xstat(int ver, const char *path, struct stat *st)
{
    ENSURE(__xstat);
    if (UNLIKELY(!real___xstat))
        return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, 0);
    STAT_PATH_BODY(real___xstat(ver, path, st), AT_FDCWD, path, st->st_mode)
}

EXPORT int __xstat64(int ver, const char *path, struct stat64 *st)
{
    ENSURE(__xstat64);
    if (UNLIKELY(!real___xstat64))
        return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, 0);
    STAT_PATH_BODY(real___xstat64(ver, path, st), AT_FDCWD, path, st->st_mode)
}

EXPORT int __lxstat(int ver, const char *path, struct stat *st)
{
    ENSURE(__lxstat);
    if (UNLIKELY(!real___lxstat))
        return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW);
    STAT_PATH_BODY(real___lxstat(ver, path, st), AT_FDCWD, path, st->st_mode)
}

EXPORT int __lxstat64(int ver, const char *path, struct stat64 *st)
{
    ENSURE(__lxstat64);
    if (UNLIKELY(!real___lxstat64))
        return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW);
    STAT_PATH_BODY(real___lxstat64(ver, path, st), AT_FDCWD, path, st->st_mode)
}

EXPORT int __fxstat(int ver, int fd, struct stat *st)
{
    ENSURE(__fxstat);
    if (UNLIKELY(!real___fxstat))
        return (int)syscall(SYS_fstat, fd, st);
    STAT_FD_BODY(real___fxstat(ver, fd, st), fd, st->st_mode)
}

EXPORT int __fxstat64(int ver, int fd, struct stat64 *st)
{
    ENSURE(__fxstat64);
    if (UNLIKELY(!real___fxstat64))
        return (int)syscall(SYS_fstat, fd, st);
    STAT_FD_BODY(real___fxstat64(ver, fd, st), fd, st->st_mode)
}

EXPORT int __fxstatat(int ver, int dirfd, const char *path, struct stat *st, int flags)
{
    ENSURE(__fxstatat);
    if (UNLIKELY(!real___fxstatat))
        return (int)syscall(SYS_newfstatat, dirfd, path, st, flags);
    STATAT_BODY(real___fxstatat(ver, dirfd, path, st, flags), st->st_mode)
}

EXPORT int __fxstatat64(int ver, int dirfd, const char *path, struct stat64 *st, int flags)
{
    ENSURE(__fxstatat64);
    if (UNLIKELY(!real___fxstatat64))
        return (int)syscall(SYS_newfstatat, dirfd, path, st, flags);
    STATAT_BODY(real___fxstatat64(ver, dirfd, path, st, flags), st->st_mode)
}

/* --- fsync, fdatasync: counted as write time --- */
#define SYNC_BODY(REALCALL, KIND) \
    int32_t ri = fd_rec(fd); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    int r = REALCALL; \
    int64_t t1 = mono_ns(); \
    if (r == 0) { \
        int e = errno; \
        tl_in = 1; \
        posix_meta((uint32_t)ri, KIND, 0, t0, t1); \
        tl_in = 0; \
        errno = e; \
    } \
    return r;

EXPORT int fsync(int fd)
{
    ENSURE(fsync);
    if (UNLIKELY(!real_fsync))
        return (int)syscall(SYS_fsync, fd);
    SYNC_BODY(real_fsync(fd), META_FSYNC)
}

EXPORT int fdatasync(int fd)
{
    ENSURE(fdatasync);
    if (UNLIKELY(!real_fdatasync))
        return (int)syscall(SYS_fdatasync, fd);
    SYNC_BODY(real_fdatasync(fd), META_FDSYNC)
}

