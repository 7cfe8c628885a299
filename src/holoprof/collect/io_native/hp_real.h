/*
 * hp_real.h -- the C library's functions behind the ones we interpose (real_open, real_read, ...),
 * resolved with dlsym(RTLD_NEXT) by resolve_all() in hp_real.c.
 */
#ifndef HP_REAL_H
#define HP_REAL_H

#include "hp_common.h"

/* One line per interposed function: name, return type, parameters. A long table on purpose: the
 * pointers, their declarations and their resolution are all generated from it. */
#define REAL_FUNCS(X) \
    X(open, int, (const char *, int, ...)) \
    X(open64, int, (const char *, int, ...)) \
    X(__open_2, int, (const char *, int)) \
    X(__open64_2, int, (const char *, int)) \
    X(openat, int, (int, const char *, int, ...)) \
    X(openat64, int, (int, const char *, int, ...)) \
    X(__openat_2, int, (int, const char *, int)) \
    X(__openat64_2, int, (int, const char *, int)) \
    X(creat, int, (const char *, mode_t)) \
    X(creat64, int, (const char *, mode_t)) \
    X(read, ssize_t, (int, void *, size_t)) \
    X(__read_chk, ssize_t, (int, void *, size_t, size_t)) \
    X(pread, ssize_t, (int, void *, size_t, off_t)) \
    X(pread64, ssize_t, (int, void *, size_t, off64_t)) \
    X(__pread_chk, ssize_t, (int, void *, size_t, off_t, size_t)) \
    X(__pread64_chk, ssize_t, (int, void *, size_t, off64_t, size_t)) \
    X(readv, ssize_t, (int, const struct iovec *, int)) \
    X(preadv, ssize_t, (int, const struct iovec *, int, off_t)) \
    X(preadv64, ssize_t, (int, const struct iovec *, int, off64_t)) \
    X(preadv2, ssize_t, (int, const struct iovec *, int, off_t, int)) \
    X(preadv64v2, ssize_t, (int, const struct iovec *, int, off64_t, int)) \
    X(write, ssize_t, (int, const void *, size_t)) \
    X(pwrite, ssize_t, (int, const void *, size_t, off_t)) \
    X(pwrite64, ssize_t, (int, const void *, size_t, off64_t)) \
    X(writev, ssize_t, (int, const struct iovec *, int)) \
    X(pwritev, ssize_t, (int, const struct iovec *, int, off_t)) \
    X(pwritev64, ssize_t, (int, const struct iovec *, int, off64_t)) \
    X(pwritev2, ssize_t, (int, const struct iovec *, int, off_t, int)) \
    X(pwritev64v2, ssize_t, (int, const struct iovec *, int, off64_t, int)) \
    X(copy_file_range, ssize_t, (int, off64_t *, int, off64_t *, size_t, unsigned int)) \
    X(sendfile, ssize_t, (int, int, off_t *, size_t)) \
    X(sendfile64, ssize_t, (int, int, off64_t *, size_t)) \
    X(lseek, off_t, (int, off_t, int)) \
    X(lseek64, off64_t, (int, off64_t, int)) \
    X(close, int, (int)) \
    X(close_range, int, (unsigned int, unsigned int, int)) \
    X(closefrom, void, (int)) \
    X(dup, int, (int)) \
    X(dup2, int, (int, int)) \
    X(dup3, int, (int, int, int)) \
    X(stat, int, (const char *, struct stat *)) \
    X(stat64, int, (const char *, struct stat64 *)) \
    X(lstat, int, (const char *, struct stat *)) \
    X(lstat64, int, (const char *, struct stat64 *)) \
    X(fstat, int, (int, struct stat *)) \
    X(fstat64, int, (int, struct stat64 *)) \
    X(fstatat, int, (int, const char *, struct stat *, int)) \
    X(fstatat64, int, (int, const char *, struct stat64 *, int)) \
    X(statx, int, (int, const char *, int, unsigned int, struct statx *)) \
    X(fsync, int, (int)) \
    X(fdatasync, int, (int)) \
    X(rename, int, (const char *, const char *)) \
    X(renameat, int, (int, const char *, int, const char *)) \
    X(renameat2, int, (int, const char *, int, const char *, unsigned int)) \
    X(mmap, void *, (void *, size_t, int, int, int, off_t)) \
    X(mmap64, void *, (void *, size_t, int, int, int, off64_t)) \
    X(munmap, int, (void *, size_t)) \
    X(_exit, void, (int)) \
    X(_Exit, void, (int)) \
    X(fopen, FILE *, (const char *, const char *)) \
    X(fopen64, FILE *, (const char *, const char *)) \
    X(fdopen, FILE *, (int, const char *)) \
    X(freopen, FILE *, (const char *, const char *, FILE *)) \
    X(freopen64, FILE *, (const char *, const char *, FILE *)) \
    X(fclose, int, (FILE *)) \
    X(fflush, int, (FILE *)) \
    X(fread, size_t, (void *, size_t, size_t, FILE *)) \
    X(fread_unlocked, size_t, (void *, size_t, size_t, FILE *)) \
    X(__fread_chk, size_t, (void *, size_t, size_t, size_t, FILE *)) \
    X(__fread_unlocked_chk, size_t, (void *, size_t, size_t, size_t, FILE *)) \
    X(fwrite, size_t, (const void *, size_t, size_t, FILE *)) \
    X(fwrite_unlocked, size_t, (const void *, size_t, size_t, FILE *)) \
    X(fgets, char *, (char *, int, FILE *)) \
    X(fgets_unlocked, char *, (char *, int, FILE *)) \
    X(__fgets_chk, char *, (char *, size_t, int, FILE *)) \
    X(__fgets_unlocked_chk, char *, (char *, size_t, int, FILE *)) \
    X(fgetc, int, (FILE *)) \
    X(getc, int, (FILE *)) \
    X(_IO_getc, int, (FILE *)) \
    X(fputc, int, (int, FILE *)) \
    X(putc, int, (int, FILE *)) \
    X(_IO_putc, int, (int, FILE *)) \
    X(fputs, int, (const char *, FILE *)) \
    X(fputs_unlocked, int, (const char *, FILE *)) \
    X(vfprintf, int, (FILE *, const char *, va_list)) \
    X(__vfprintf_chk, int, (FILE *, int, const char *, va_list)) \
    X(fseek, int, (FILE *, long, int)) \
    X(fseeko, int, (FILE *, off_t, int)) \
    X(fseeko64, int, (FILE *, off64_t, int)) \
    X(fsetpos, int, (FILE *, const fpos_t *)) \
    X(fsetpos64, int, (FILE *, const fpos64_t *)) \
    X(rewind, void, (FILE *)) \
    X(ftello, off_t, (FILE *))

/* compat-only symbols of older glibc (the *stat family before 2.33) */
#define REAL_COMPAT_FUNCS(X) \
    X(__xstat, int, (int, const char *, struct stat *)) \
    X(__xstat64, int, (int, const char *, struct stat64 *)) \
    X(__lxstat, int, (int, const char *, struct stat *)) \
    X(__lxstat64, int, (int, const char *, struct stat64 *)) \
    X(__fxstat, int, (int, int, struct stat *)) \
    X(__fxstat64, int, (int, int, struct stat64 *)) \
    X(__fxstatat, int, (int, int, const char *, struct stat *, int)) \
    X(__fxstatat64, int, (int, int, const char *, struct stat64 *, int))

#define DECLARE_REAL(name, ret, args) extern HIDDEN ret(*real_##name) args;
REAL_FUNCS(DECLARE_REAL)
REAL_COMPAT_FUNCS(DECLARE_REAL)
#undef DECLARE_REAL

/* look up every real function not found yet (a no-op when re-entered from dlsym) */
HIDDEN void resolve_all(void);

#define ENSURE(name) \
    do { \
        if (UNLIKELY(!real_##name)) \
            resolve_all(); \
    } while (0)

/* for calls with no system-call fallback: fail cleanly if libc's function cannot be found (only
 * possible when called from inside dlsym while we resolve) */
#define ENSURE_RET(name, fail) \
    do { \
        if (UNLIKELY(!real_##name)) { \
            resolve_all(); \
            if (!real_##name) { \
                errno = ENOSYS; \
                return fail; \
            } \
        } \
    } while (0)

#endif /* HP_REAL_H */
