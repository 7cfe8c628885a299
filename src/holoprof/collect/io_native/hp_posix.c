/* hp_posix.c -- the POSIX wrappers of opens, reads and writes (plain, positioned, vectored,
 * fortified), in-kernel copies and lseek. */
#include "hp_common.h"
#include "hp_real.h"

#define NEEDS_MODE(flags) (((flags) & O_CREAT) || (((flags) & O_TMPFILE) == O_TMPFILE))

#define OPEN_TRACKED(REALCALL, DIRFD) \
    if (!active()) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    int fd = REALCALL; \
    int64_t t1 = mono_ns(); \
    if (fd >= 0) \
        posix_opened(fd, DIRFD, path, flags, t0, t1); \
    return fd;

#define GET_MODE() \
    mode_t mode = 0; \
    if (NEEDS_MODE(flags)) { \
        va_list ap; \
        va_start(ap, flags); \
        mode = (mode_t)va_arg(ap, int); \
        va_end(ap); \
    }

EXPORT int open(const char *path, int flags, ...)
{
    GET_MODE();
    ENSURE(open);
    if (UNLIKELY(!real_open))
        return (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);
    OPEN_TRACKED(real_open(path, flags, mode), AT_FDCWD)
}

EXPORT int open64(const char *path, int flags, ...)
{
    GET_MODE();
    ENSURE(open64);
    if (UNLIKELY(!real_open64))
        return (int)syscall(SYS_openat, AT_FDCWD, path, flags | O_LARGEFILE, mode);
    OPEN_TRACKED(real_open64(path, flags, mode), AT_FDCWD)
}

EXPORT int __open_2(const char *path, int flags)
{
    ENSURE(__open_2);
    if (UNLIKELY(!real___open_2))
        return open(path, flags);
    OPEN_TRACKED(real___open_2(path, flags), AT_FDCWD)
}

EXPORT int __open64_2(const char *path, int flags)
{
    ENSURE(__open64_2);
    if (UNLIKELY(!real___open64_2))
        return open64(path, flags);
    OPEN_TRACKED(real___open64_2(path, flags), AT_FDCWD)
}

EXPORT int openat(int dirfd, const char *path, int flags, ...)
{
    GET_MODE();
    ENSURE(openat);
    if (UNLIKELY(!real_openat))
        return (int)syscall(SYS_openat, dirfd, path, flags, mode);
    OPEN_TRACKED(real_openat(dirfd, path, flags, mode), dirfd)
}

EXPORT int openat64(int dirfd, const char *path, int flags, ...)
{
    GET_MODE();
    ENSURE(openat64);
    if (UNLIKELY(!real_openat64))
        return (int)syscall(SYS_openat, dirfd, path, flags | O_LARGEFILE, mode);
    OPEN_TRACKED(real_openat64(dirfd, path, flags, mode), dirfd)
}

EXPORT int __openat_2(int dirfd, const char *path, int flags)
{
    ENSURE(__openat_2);
    if (UNLIKELY(!real___openat_2))
        return openat(dirfd, path, flags);
    OPEN_TRACKED(real___openat_2(dirfd, path, flags), dirfd)
}

EXPORT int __openat64_2(int dirfd, const char *path, int flags)
{
    ENSURE(__openat64_2);
    if (UNLIKELY(!real___openat64_2))
        return openat64(dirfd, path, flags);
    OPEN_TRACKED(real___openat64_2(dirfd, path, flags), dirfd)
}

EXPORT int creat(const char *path, mode_t mode)
{
    int flags = O_CREAT | O_WRONLY | O_TRUNC;
    ENSURE(creat);
    if (UNLIKELY(!real_creat))
        return open(path, flags, mode);
    OPEN_TRACKED(real_creat(path, mode), AT_FDCWD)
}

EXPORT int creat64(const char *path, mode_t mode)
{
    int flags = O_CREAT | O_WRONLY | O_TRUNC;
    ENSURE(creat64);
    if (UNLIKELY(!real_creat64))
        return open64(path, flags, mode);
    OPEN_TRACKED(real_creat64(path, mode), AT_FDCWD)
}

/* read-like calls: `off` < 0 means "at the descriptor's offset, which then advances" */
#define IO_BODY(IS_WRITE, REALCALL, OFFEXPR) \
    int32_t ri = fd_rec(fd); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t off__ = (OFFEXPR); \
    int64_t t0 = mono_ns(); \
    ssize_t r = REALCALL; \
    int64_t t1 = mono_ns(); \
    if (r >= 0) { \
        int e = errno; \
        tl_in = 1; \
        if (off__ < 0) \
            off__ = atomic_fetch_add(&g_fd[fd].off, (int64_t)r); \
        posix_io((uint32_t)ri, IS_WRITE, off__, (int64_t)r, t0, t1); \
        tl_in = 0; \
        errno = e; \
    } \
    return r;

EXPORT ssize_t read(int fd, void *buf, size_t n)
{
    ENSURE(read);
    if (UNLIKELY(!real_read))
        return syscall(SYS_read, fd, buf, n);
    IO_BODY(0, real_read(fd, buf, n), -1)
}

EXPORT ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen)
{
    ENSURE(__read_chk);
    if (UNLIKELY(!real___read_chk))
        return read(fd, buf, n);
    IO_BODY(0, real___read_chk(fd, buf, n, buflen), -1)
}

EXPORT ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
    ENSURE(pread);
    if (UNLIKELY(!real_pread))
        return syscall(SYS_pread64, fd, buf, n, off);
    IO_BODY(0, real_pread(fd, buf, n, off), off)
}

EXPORT ssize_t pread64(int fd, void *buf, size_t n, off64_t off)
{
    ENSURE(pread64);
    if (UNLIKELY(!real_pread64))
        return syscall(SYS_pread64, fd, buf, n, off);
    IO_BODY(0, real_pread64(fd, buf, n, off), off)
}

EXPORT ssize_t __pread_chk(int fd, void *buf, size_t n, off_t off, size_t buflen)
{
    ENSURE(__pread_chk);
    if (UNLIKELY(!real___pread_chk))
        return pread(fd, buf, n, off);
    IO_BODY(0, real___pread_chk(fd, buf, n, off, buflen), off)
}

EXPORT ssize_t __pread64_chk(int fd, void *buf, size_t n, off64_t off, size_t buflen)
{
    ENSURE(__pread64_chk);
    if (UNLIKELY(!real___pread64_chk))
        return pread64(fd, buf, n, off);
    IO_BODY(0, real___pread64_chk(fd, buf, n, off, buflen), off)
}

EXPORT ssize_t readv(int fd, const struct iovec *iov, int cnt)
{
    ENSURE(readv);
    if (UNLIKELY(!real_readv))
        return syscall(SYS_readv, fd, iov, cnt);
    IO_BODY(0, real_readv(fd, iov, cnt), -1)
}

EXPORT ssize_t preadv(int fd, const struct iovec *iov, int cnt, off_t off)
{
    ENSURE(preadv);
    if (UNLIKELY(!real_preadv))
        return syscall(SYS_preadv, fd, iov, cnt, off, 0);
    IO_BODY(0, real_preadv(fd, iov, cnt, off), off)
}

EXPORT ssize_t preadv64(int fd, const struct iovec *iov, int cnt, off64_t off)
{
    ENSURE(preadv64);
    if (UNLIKELY(!real_preadv64))
        return syscall(SYS_preadv, fd, iov, cnt, off, 0);
    IO_BODY(0, real_preadv64(fd, iov, cnt, off), off)
}

EXPORT ssize_t preadv2(int fd, const struct iovec *iov, int cnt, off_t off, int fl)
{
    ENSURE(preadv2);
    if (UNLIKELY(!real_preadv2)) {
        errno = ENOSYS;
        return -1;
    }
    IO_BODY(0, real_preadv2(fd, iov, cnt, off, fl), off)
}

EXPORT ssize_t preadv64v2(int fd, const struct iovec *iov, int cnt, off64_t off, int fl)
{
    ENSURE(preadv64v2);
    if (UNLIKELY(!real_preadv64v2)) {
        errno = ENOSYS;
        return -1;
    }
    IO_BODY(0, real_preadv64v2(fd, iov, cnt, off, fl), off)
}

EXPORT ssize_t write(int fd, const void *buf, size_t n)
{
    ENSURE(write);
    if (UNLIKELY(!real_write))
        return syscall(SYS_write, fd, buf, n);
    IO_BODY(1, real_write(fd, buf, n), -1)
}

EXPORT ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
    ENSURE(pwrite);
    if (UNLIKELY(!real_pwrite))
        return syscall(SYS_pwrite64, fd, buf, n, off);
    IO_BODY(1, real_pwrite(fd, buf, n, off), off)
}

EXPORT ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t off)
{
    ENSURE(pwrite64);
    if (UNLIKELY(!real_pwrite64))
        return syscall(SYS_pwrite64, fd, buf, n, off);
    IO_BODY(1, real_pwrite64(fd, buf, n, off), off)
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
    ENSURE(writev);
    if (UNLIKELY(!real_writev))
        return syscall(SYS_writev, fd, iov, cnt);
    IO_BODY(1, real_writev(fd, iov, cnt), -1)
}

EXPORT ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off)
{
    ENSURE(pwritev);
    if (UNLIKELY(!real_pwritev))
        return syscall(SYS_pwritev, fd, iov, cnt, off, 0);
    IO_BODY(1, real_pwritev(fd, iov, cnt, off), off)
}

EXPORT ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off64_t off)
{
    ENSURE(pwritev64);
    if (UNLIKELY(!real_pwritev64))
        return syscall(SYS_pwritev, fd, iov, cnt, off, 0);
    IO_BODY(1, real_pwritev64(fd, iov, cnt, off), off)
}

EXPORT ssize_t pwritev2(int fd, const struct iovec *iov, int cnt, off_t off, int fl)
{
    ENSURE(pwritev2);
    if (UNLIKELY(!real_pwritev2)) {
        errno = ENOSYS;
        return -1;
    }
    IO_BODY(1, real_pwritev2(fd, iov, cnt, off, fl), off)
}

EXPORT ssize_t pwritev64v2(int fd, const struct iovec *iov, int cnt, off64_t off, int fl)
{
    ENSURE(pwritev64v2);
    if (UNLIKELY(!real_pwritev64v2)) {
        errno = ENOSYS;
        return -1;
    }
    IO_BODY(1, real_pwritev64v2(fd, iov, cnt, off, fl), off)
}

/* In-kernel copies: a read of the source and a write of the destination. */
static void copy_done(int in_fd, int32_t rin, int64_t in_off, int out_fd, int32_t rout, int64_t out_off,
                      ssize_t r, int64_t t0, int64_t t1)
{
    int e = errno;
    tl_in = 1;
    if (rin >= 0) {
        if (in_off < 0)
            in_off = atomic_fetch_add(&g_fd[in_fd].off, (int64_t)r);
        posix_io((uint32_t)rin, 0, in_off, (int64_t)r, t0, t1);
    }
    if (rout >= 0) {
        if (out_off < 0)
            out_off = atomic_fetch_add(&g_fd[out_fd].off, (int64_t)r);
        posix_io((uint32_t)rout, 1, out_off, (int64_t)r, t0, t1);
    }
    tl_in = 0;
    errno = e;
}

EXPORT ssize_t copy_file_range(int in_fd, off64_t *in_off, int out_fd, off64_t *out_off, size_t len,
                               unsigned int fl)
{
    ENSURE(copy_file_range);
    if (UNLIKELY(!real_copy_file_range))
        return syscall(SYS_copy_file_range, in_fd, in_off, out_fd, out_off, len, fl);
    int32_t rin = fd_rec(in_fd), rout = fd_rec(out_fd);
    if (LIKELY(rin < 0 && rout < 0))
        return real_copy_file_range(in_fd, in_off, out_fd, out_off, len, fl);
    int64_t io = in_off ? (int64_t)*in_off : -1, oo = out_off ? (int64_t)*out_off : -1;
    int64_t t0 = mono_ns();
    ssize_t r = real_copy_file_range(in_fd, in_off, out_fd, out_off, len, fl);
    int64_t t1 = mono_ns();
    if (r >= 0)
        copy_done(in_fd, rin, io, out_fd, rout, oo, r, t0, t1);
    return r;
}

EXPORT ssize_t sendfile(int out_fd, int in_fd, off_t *off, size_t count)
{
    ENSURE(sendfile);
    if (UNLIKELY(!real_sendfile))
        return syscall(SYS_sendfile, out_fd, in_fd, off, count);
    int32_t rin = fd_rec(in_fd), rout = fd_rec(out_fd);
    if (LIKELY(rin < 0 && rout < 0))
        return real_sendfile(out_fd, in_fd, off, count);
    int64_t io = off ? (int64_t)*off : -1;
    int64_t t0 = mono_ns();
    ssize_t r = real_sendfile(out_fd, in_fd, off, count);
    int64_t t1 = mono_ns();
    if (r >= 0)
        copy_done(in_fd, rin, io, out_fd, rout, -1, r, t0, t1);
    return r;
}

EXPORT ssize_t sendfile64(int out_fd, int in_fd, off64_t *off, size_t count)
{
    ENSURE(sendfile64);
    if (UNLIKELY(!real_sendfile64))
        return syscall(SYS_sendfile, out_fd, in_fd, off, count);
    int32_t rin = fd_rec(in_fd), rout = fd_rec(out_fd);
    if (LIKELY(rin < 0 && rout < 0))
        return real_sendfile64(out_fd, in_fd, off, count);
    int64_t io = off ? (int64_t)*off : -1;
    int64_t t0 = mono_ns();
    ssize_t r = real_sendfile64(out_fd, in_fd, off, count);
    int64_t t1 = mono_ns();
    if (r >= 0)
        copy_done(in_fd, rin, io, out_fd, rout, -1, r, t0, t1);
    return r;
}

#define SEEK_BODY(REALCALL) \
    int32_t ri = fd_rec(fd); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    off64_t r = REALCALL; \
    int64_t t1 = mono_ns(); \
    if (r >= 0) { \
        int e = errno; \
        tl_in = 1; \
        atomic_store(&g_fd[fd].off, (int64_t)r); \
        posix_meta((uint32_t)ri, META_SEEK, (int64_t)r, t0, t1); \
        tl_in = 0; \
        errno = e; \
    } \
    return r;

EXPORT off_t lseek(int fd, off_t off, int whence)
{
    ENSURE(lseek);
    if (UNLIKELY(!real_lseek))
        return syscall(SYS_lseek, fd, off, whence);
    SEEK_BODY(real_lseek(fd, off, whence))
}

EXPORT off64_t lseek64(int fd, off64_t off, int whence)
{
    ENSURE(lseek64);
    if (UNLIKELY(!real_lseek64))
        return syscall(SYS_lseek, fd, off, whence);
    SEEK_BODY(real_lseek64(fd, off, whence))
}

