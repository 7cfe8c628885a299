/* hp_stdio.c -- the STDIO wrappers: fopen/fdopen/freopen/fclose/fflush, fread/fgets/getc,
 * fwrite/fputs/putc/fprintf, fseek/fsetpos/rewind. glibc's stdio calls read/write internally, not
 * through the PLT: no double count as POSIX. */
#include "hp_common.h"
#include "hp_real.h"

static inline int32_t stream_rec(FILE *fp, int *fdp)
{
    if (!active() || !fp)
        return -1;
    int fd = fp->_fileno; /* glibc's FILE; -1 for memory streams */
    if ((unsigned)fd >= FD_CAP)
        return -1;
    struct fdslot *s = &g_fd[fd];
    if (atomic_load_explicit(&s->fp, memory_order_relaxed) != fp)
        return -1;
    int32_t v = atomic_load_explicit(&s->srec, memory_order_relaxed);
    if (v <= 0)
        return -1;
    *fdp = fd;
    return v - 1;
}

/* register a new stream; path == NULL: take the descriptor's path (fdopen) */
static void stream_opened(FILE *fp, const char *path, int kind, int64_t t0, int64_t t1)
{
    int fd = fp->_fileno;
    if ((unsigned)fd >= FD_CAP)
        return;
    int e = errno;
    tl_in = 1;
    struct fdslot *s = &g_fd[fd];
    char buf[PATH_MAX];
    ssize_t n = -1;
    if (path) {
        n = abs_path(AT_FDCWD, path, buf);
        /* the descriptor was opened inside libc: let direct POSIX use of it be probed */
        atomic_store(&s->rec, 0);
    } else {
        int32_t v = atomic_load(&s->rec);
        if (v > 0) {
            const struct rec *pr = &g_recs[v - 1];
            memcpy(buf, rec_path(pr), pr->path_len);
            n = pr->path_len;
        } else {
            n = fd_link(fd, buf, sizeof buf);
            if (n > 0)
                n = (ssize_t)normalize(buf, (size_t)n);
        }
    }
    atomic_store(&s->srec, 0);
    atomic_store(&s->fp, NULL);
    if (n > 0 && !excluded(buf, (size_t)n)) {
        int32_t ri = get_rec(MOD_STDIO, buf, (size_t)n);
        if (ri >= 0) {
            atomic_store(&s->soff, 0);
            atomic_store(&s->srec, ri + 1);
            atomic_store(&s->fp, fp);
            stdio_meta((uint32_t)ri, kind, 0, t0, t1);
        }
    }
    tl_in = 0;
    errno = e;
}

#define FOPEN_BODY(REALCALL) \
    if (!active() || !path) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    FILE *fp = REALCALL; \
    int64_t t1 = mono_ns(); \
    if (fp) \
        stream_opened(fp, path, SMETA_OPEN, t0, t1); \
    return fp;

EXPORT FILE *fopen(const char *path, const char *mode)
{
    ENSURE_RET(fopen, NULL);
    FOPEN_BODY(real_fopen(path, mode))
}

EXPORT FILE *fopen64(const char *path, const char *mode)
{
    ENSURE_RET(fopen64, NULL);
    FOPEN_BODY(real_fopen64(path, mode))
}

EXPORT FILE *fdopen(int fd, const char *mode)
{
    ENSURE_RET(fdopen, NULL);
    if (!active())
        return real_fdopen(fd, mode);
    int64_t t0 = mono_ns();
    FILE *fp = real_fdopen(fd, mode);
    int64_t t1 = mono_ns();
    if (fp)
        stream_opened(fp, NULL, SMETA_FDOPEN, t0, t1);
    return fp;
}

/* the descriptor of a stream is about to be closed: forget it first */
static int32_t stream_forget(FILE *fp)
{
    int fd = fp ? fp->_fileno : -1;
    if ((unsigned)fd >= FD_CAP || foreign_process())
        return -1;
    struct fdslot *s = &g_fd[fd];
    int32_t v = -1;
    if (atomic_load(&s->fp) == fp)
        v = atomic_load(&s->srec) - 1;
    atomic_store(&s->srec, 0);
    atomic_store(&s->fp, NULL);
    atomic_store(&s->rec, 0);
    return v;
}

#define FREOPEN_BODY(REALCALL) \
    if (!active()) \
        return REALCALL; \
    int32_t old = stream_forget(fp); \
    int64_t t0 = mono_ns(); \
    FILE *nfp = REALCALL; \
    int64_t t1 = mono_ns(); \
    if (old >= 0) { \
        int e = errno; \
        tl_in = 1; \
        stdio_meta((uint32_t)old, SMETA_CLOSE, 0, t0, t1); \
        tl_in = 0; \
        errno = e; \
    } \
    if (nfp && path) \
        stream_opened(nfp, path, SMETA_OPEN, t0, t1); \
    return nfp;

EXPORT FILE *freopen(const char *path, const char *mode, FILE *fp)
{
    ENSURE_RET(freopen, NULL);
    FREOPEN_BODY(real_freopen(path, mode, fp))
}

EXPORT FILE *freopen64(const char *path, const char *mode, FILE *fp)
{
    ENSURE_RET(freopen64, NULL);
    FREOPEN_BODY(real_freopen64(path, mode, fp))
}

EXPORT int fclose(FILE *fp)
{
    ENSURE_RET(fclose, EOF);
    if (!active() || !fp)
        return real_fclose(fp);
    int32_t ri = stream_forget(fp);
    int64_t t0 = mono_ns();
    int r = real_fclose(fp);
    int64_t t1 = mono_ns();
    if (ri >= 0) {
        int e = errno;
        tl_in = 1;
        stdio_meta((uint32_t)ri, SMETA_CLOSE, 0, t0, t1);
        tl_in = 0;
        errno = e;
    }
    return r;
}

EXPORT int fflush(FILE *fp)
{
    ENSURE_RET(fflush, EOF);
    int fd;
    int32_t ri = stream_rec(fp, &fd);
    if (LIKELY(ri < 0))
        return real_fflush(fp);
    int64_t t0 = mono_ns();
    int r = real_fflush(fp);
    int64_t t1 = mono_ns();
    if (r == 0) {
        int e = errno;
        tl_in = 1;
        stdio_meta((uint32_t)ri, SMETA_FLUSH, atomic_load(&g_fd[fd].soff), t0, t1);
        tl_in = 0;
        errno = e;
    }
    return r;
}

static inline void stream_io(int fd, int32_t ri, int is_write, int64_t n, int64_t t0, int64_t t1)
{
    int e = errno;
    tl_in = 1;
    int64_t off = atomic_fetch_add(&g_fd[fd].soff, n);
    stdio_io((uint32_t)ri, is_write, off, n, t0, t1);
    tl_in = 0;
    errno = e;
}

/* fread/fwrite: bytes = items * size */
#define FRW_BODY(IS_WRITE, REALCALL) \
    int fd; \
    int32_t ri = stream_rec(fp, &fd); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    size_t r = REALCALL; \
    int64_t t1 = mono_ns(); \
    stream_io(fd, ri, IS_WRITE, (int64_t)(r * size), t0, t1); \
    return r;

EXPORT size_t fread(void *ptr, size_t size, size_t n, FILE *fp)
{
    ENSURE_RET(fread, 0);
    FRW_BODY(0, real_fread(ptr, size, n, fp))
}

EXPORT size_t fread_unlocked(void *ptr, size_t size, size_t n, FILE *fp)
{
    ENSURE_RET(fread_unlocked, 0);
    FRW_BODY(0, real_fread_unlocked(ptr, size, n, fp))
}

EXPORT size_t __fread_chk(void *ptr, size_t ptrlen, size_t size, size_t n, FILE *fp)
{
    ENSURE_RET(__fread_chk, 0);
    FRW_BODY(0, real___fread_chk(ptr, ptrlen, size, n, fp))
}

EXPORT size_t __fread_unlocked_chk(void *ptr, size_t ptrlen, size_t size, size_t n, FILE *fp)
{
    ENSURE_RET(__fread_unlocked_chk, 0);
    FRW_BODY(0, real___fread_unlocked_chk(ptr, ptrlen, size, n, fp))
}

EXPORT size_t fwrite(const void *ptr, size_t size, size_t n, FILE *fp)
{
    ENSURE_RET(fwrite, 0);
    FRW_BODY(1, real_fwrite(ptr, size, n, fp))
}

EXPORT size_t fwrite_unlocked(const void *ptr, size_t size, size_t n, FILE *fp)
{
    ENSURE_RET(fwrite_unlocked, 0);
    FRW_BODY(1, real_fwrite_unlocked(ptr, size, n, fp))
}

#define FGETS_BODY(REALCALL) \
    int fd; \
    int32_t ri = stream_rec(fp, &fd); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    char *r = REALCALL; \
    int64_t t1 = mono_ns(); \
    stream_io(fd, ri, 0, r ? (int64_t)strlen(r) : 0, t0, t1); \
    return r;

EXPORT char *fgets(char *s, int n, FILE *fp)
{
    ENSURE_RET(fgets, NULL);
    FGETS_BODY(real_fgets(s, n, fp))
}

EXPORT char *fgets_unlocked(char *s, int n, FILE *fp)
{
    ENSURE_RET(fgets_unlocked, NULL);
    FGETS_BODY(real_fgets_unlocked(s, n, fp))
}

EXPORT char *__fgets_chk(char *s, size_t size, int n, FILE *fp)
{
    ENSURE_RET(__fgets_chk, NULL);
    FGETS_BODY(real___fgets_chk(s, size, n, fp))
}

EXPORT char *__fgets_unlocked_chk(char *s, size_t size, int n, FILE *fp)
{
    ENSURE_RET(__fgets_unlocked_chk, NULL);
    FGETS_BODY(real___fgets_unlocked_chk(s, size, n, fp))
}

#define GETC_BODY(REALCALL) \
    int fd; \
    int32_t ri = stream_rec(fp, &fd); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    int r = REALCALL; \
    int64_t t1 = mono_ns(); \
    stream_io(fd, ri, 0, r == EOF ? 0 : 1, t0, t1); \
    return r;

EXPORT int fgetc(FILE *fp)
{
    ENSURE_RET(fgetc, EOF);
    GETC_BODY(real_fgetc(fp))
}

EXPORT int getc(FILE *fp)
{
    ENSURE_RET(getc, EOF);
    GETC_BODY(real_getc(fp))
}

EXPORT int _IO_getc(FILE *fp)
{
    ENSURE(_IO_getc);
    if (!real__IO_getc)
        return getc(fp);
    GETC_BODY(real__IO_getc(fp))
}

#define PUTC_BODY(REALCALL) \
    int fd; \
    int32_t ri = stream_rec(fp, &fd); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    int r = REALCALL; \
    int64_t t1 = mono_ns(); \
    stream_io(fd, ri, 1, r == EOF ? 0 : 1, t0, t1); \
    return r;

EXPORT int fputc(int ch, FILE *fp)
{
    ENSURE_RET(fputc, EOF);
    PUTC_BODY(real_fputc(ch, fp))
}

EXPORT int putc(int ch, FILE *fp)
{
    ENSURE_RET(putc, EOF);
    PUTC_BODY(real_putc(ch, fp))
}

EXPORT int _IO_putc(int ch, FILE *fp)
{
    ENSURE(_IO_putc);
    if (!real__IO_putc)
        return putc(ch, fp);
    PUTC_BODY(real__IO_putc(ch, fp))
}

#define FPUTS_BODY(REALCALL) \
    int fd; \
    int32_t ri = stream_rec(fp, &fd); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    int r = REALCALL; \
    int64_t t1 = mono_ns(); \
    stream_io(fd, ri, 1, r == EOF ? 0 : (int64_t)strlen(s), t0, t1); \
    return r;

EXPORT int fputs(const char *s, FILE *fp)
{
    ENSURE_RET(fputs, EOF);
    FPUTS_BODY(real_fputs(s, fp))
}

EXPORT int fputs_unlocked(const char *s, FILE *fp)
{
    ENSURE_RET(fputs_unlocked, EOF);
    FPUTS_BODY(real_fputs_unlocked(s, fp))
}

#define VFPRINTF_BODY(REALCALL) \
    int fd; \
    int32_t ri = stream_rec(fp, &fd); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    int r = REALCALL; \
    int64_t t1 = mono_ns(); \
    stream_io(fd, ri, 1, r < 0 ? 0 : r, t0, t1); \
    return r;

EXPORT int vfprintf(FILE *fp, const char *fmt, va_list ap)
{
    ENSURE_RET(vfprintf, -1);
    VFPRINTF_BODY(real_vfprintf(fp, fmt, ap))
}

EXPORT int fprintf(FILE *fp, const char *fmt, ...)
{
    va_list ap;
    int r;
    ENSURE_RET(vfprintf, -1);
    va_start(ap, fmt);
    r = vfprintf(fp, fmt, ap);
    va_end(ap);
    return r;
}

EXPORT int __vfprintf_chk(FILE *fp, int flag, const char *fmt, va_list ap)
{
    ENSURE(__vfprintf_chk);
    if (!real___vfprintf_chk)
        return vfprintf(fp, fmt, ap);
    VFPRINTF_BODY(real___vfprintf_chk(fp, flag, fmt, ap))
}

EXPORT int __fprintf_chk(FILE *fp, int flag, const char *fmt, ...)
{
    va_list ap;
    int r;
    va_start(ap, fmt);
    r = __vfprintf_chk(fp, flag, fmt, ap);
    va_end(ap);
    return r;
}

static void stream_seeked(int fd, int32_t ri, FILE *fp, int64_t t0, int64_t t1)
{
    int e = errno;
    tl_in = 1;
    off_t pos = real_ftello ? real_ftello(fp) : -1;
    if (pos >= 0)
        atomic_store(&g_fd[fd].soff, (int64_t)pos);
    stdio_meta((uint32_t)ri, SMETA_SEEK, (int64_t)pos, t0, t1);
    tl_in = 0;
    errno = e;
}

#define FSEEK_BODY(REALCALL) \
    int fd; \
    int32_t ri = stream_rec(fp, &fd); \
    if (LIKELY(ri < 0)) \
        return REALCALL; \
    int64_t t0 = mono_ns(); \
    int r = REALCALL; \
    int64_t t1 = mono_ns(); \
    if (r == 0) \
        stream_seeked(fd, ri, fp, t0, t1); \
    return r;

EXPORT int fseek(FILE *fp, long off, int whence)
{
    ENSURE_RET(fseek, -1);
    FSEEK_BODY(real_fseek(fp, off, whence))
}

EXPORT int fseeko(FILE *fp, off_t off, int whence)
{
    ENSURE_RET(fseeko, -1);
    FSEEK_BODY(real_fseeko(fp, off, whence))
}

EXPORT int fseeko64(FILE *fp, off64_t off, int whence)
{
    ENSURE_RET(fseeko64, -1);
    FSEEK_BODY(real_fseeko64(fp, off, whence))
}

EXPORT int fsetpos(FILE *fp, const fpos_t *pos)
{
    ENSURE_RET(fsetpos, -1);
    FSEEK_BODY(real_fsetpos(fp, pos))
}

EXPORT int fsetpos64(FILE *fp, const fpos64_t *pos)
{
    ENSURE_RET(fsetpos64, -1);
    FSEEK_BODY(real_fsetpos64(fp, pos))
}

EXPORT void rewind(FILE *fp)
{
    ENSURE(rewind);
    if (UNLIKELY(!real_rewind))
        return;
    int fd;
    int32_t ri = stream_rec(fp, &fd);
    if (LIKELY(ri < 0)) {
        real_rewind(fp);
        return;
    }
    int64_t t0 = mono_ns();
    real_rewind(fp);
    int64_t t1 = mono_ns();
    stream_seeked(fd, ri, fp, t0, t1);
}
