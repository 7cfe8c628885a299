/* hp_paths.c -- absolute, normalised paths of files, and the policy of which paths are counted:
 * everything under $HOLOPROF_RUN_DIR and the excluded prefixes ($HOLOPROF_IO_EXCLUDE) is not;
 * files of Python installations are not, unless under a prefix of $HOLOPROF_IO_INCLUDE. */
#include "hp_common.h"

HIDDEN char g_run_dir[PATH_MAX];
HIDDEN size_t g_run_dir_len;
static char g_excl_buf[4096];
static const char *g_excl[MAX_EXCLUDES];
static size_t g_excl_len[MAX_EXCLUDES];
static int g_nexcl;
static char g_incl_buf[4096];
static const char *g_incl[MAX_EXCLUDES];
static size_t g_incl_len[MAX_EXCLUDES];
static int g_nincl;

/* Whether the absolute path p[0..n) is in normal form already: no empty, "." or ".." component and
 * no trailing slash. Most paths a program opens are, and this scan is a few memchr calls. */
static int is_normal(const char *p, size_t n)
{
    if (n == 0 || p[0] != '/' || (n > 1 && p[n - 1] == '/'))
        return 0;
    const char *end = p + n;
    for (const char *s = p; (s = memchr(s, '/', (size_t)(end - s))) != NULL;) {
        const char *c = ++s; /* the component after this slash */
        if (c == end)
            break; /* the root, "/" */
        if (*c == '/')
            return 0;
        if (*c == '.' && (c + 1 == end || c[1] == '/' || (c[1] == '.' && (c + 2 == end || c[2] == '/'))))
            return 0;
    }
    return 1;
}

/* Lexical normalisation of an absolute path in place: "//", "/./" and "/../" (like os.path.abspath). */
size_t normalize(char *p, size_t n)
{
    if (is_normal(p, n)) {
        p[n] = 0;
        return n;
    }
    size_t out = 0, i = 0;
    while (i < n) {
        while (i < n && p[i] == '/')
            i++;
        if (i >= n)
            break;
        size_t s = i;
        while (i < n && p[i] != '/')
            i++;
        size_t len = i - s;
        if (len == 1 && p[s] == '.')
            continue;
        if (len == 2 && p[s] == '.' && p[s + 1] == '.') {
            while (out > 0 && p[out - 1] != '/')
                out--;
            if (out > 0)
                out--;
            continue;
        }
        p[out++] = '/';
        memmove(p + out, p + s, len);
        out += len;
    }
    if (out == 0)
        p[out++] = '/';
    p[out] = 0;
    return out;
}

ssize_t fd_link(int fd, char *buf, size_t cap)
{
    char link[32] = "/proc/self/fd/";
    fmt_int(link + 14, fd);
    ssize_t n = readlink(link, buf, cap - 1);
    if (n <= 0 || buf[0] != '/')
        return -1;
    buf[n] = 0;
    return n;
}

/* Absolute, normalised form of (dirfd, path) into buf[PATH_MAX]; returns its length or -1. */
ssize_t abs_path(int dirfd, const char *path, char *buf)
{
    size_t plen, blen = 0;
    if (!path || !path[0])
        return -1;
    plen = strlen(path);
    if (path[0] != '/') {
        if (dirfd == AT_FDCWD) {
            if (!getcwd(buf, PATH_MAX))
                return -1;
            blen = strlen(buf);
        } else {
            int32_t v = ((unsigned)dirfd < FD_CAP) ? atomic_load(&g_fd[dirfd].rec) : 0;
            if (v > 0) {
                const struct rec *d = &g_recs[v - 1];
                if (d->path_len >= PATH_MAX)
                    return -1;
                memcpy(buf, rec_path(d), d->path_len);
                blen = d->path_len;
            } else {
                ssize_t n = fd_link(dirfd, buf, PATH_MAX);
                if (n < 0)
                    return -1;
                blen = (size_t)n;
            }
        }
        if (blen + 1 + plen + 1 > PATH_MAX)
            return -1;
        buf[blen++] = '/';
    } else if (plen + 1 > PATH_MAX) {
        return -1;
    }
    memcpy(buf + blen, path, plen);
    return (ssize_t)normalize(buf, blen + plen);
}

static int under_prefix(const char *p, size_t n, const char *q, size_t l)
{
    /* the prefix's last byte first: most prefixes a path is not under differ there, and the
     * memcmp call is left out (a path is compared with some twenty prefixes) */
    return n >= l && p[l - 1] == q[l - 1] && memcmp(p, q, l) == 0 && (n == l || p[l] == '/' || l == 1);
}

/* whether p[0..n) ends with the string literal LIT (its length known here: the compare is inlined) */
#define ENDS_WITH(p, n, LIT) \
    ((n) >= sizeof(LIT) - 1 && memcmp((p) + (n) - (sizeof(LIT) - 1), LIT, sizeof(LIT) - 1) == 0)

/* A file of a Python installation, whichever interpreter it belongs to: a component
 * site-packages, dist-packages, __pycache__, *.dist-info or *.egg-info; the standard library
 * (lib/pythonX.Y, lib64/pythonX.Y); a pyvenv.cfg; Python sources and bytecode (.py .pyc .pyi .pth).
 * The same rules as holoprof.collect.io_paths.python_env_path. */
static int python_env_path(const char *p, size_t n)
{
    if (ENDS_WITH(p, n, ".py") || ENDS_WITH(p, n, ".pyc") || ENDS_WITH(p, n, ".pyi") ||
        ENDS_WITH(p, n, ".pth") || ENDS_WITH(p, n, "/pyvenv.cfg"))
        return 1;
    const char *prev = NULL;
    size_t prev_len = 0;
    size_t i = 0;
    while (i < n) {
        while (i < n && p[i] == '/')
            i++;
        size_t j = i;
        while (j < n && p[j] != '/')
            j++;
        const char *c = p + i;
        size_t l = j - i;
        if (j < n) { /* a directory component */
            if ((l == 13 && memcmp(c, "site-packages", 13) == 0) ||
                (l == 13 && memcmp(c, "dist-packages", 13) == 0) ||
                (l == 11 && memcmp(c, "__pycache__", 11) == 0) || ENDS_WITH(c, l, ".dist-info") ||
                ENDS_WITH(c, l, ".egg-info"))
                return 1;
            if (prev && l > 6 && memcmp(c, "python", 6) == 0 && c[6] >= '0' && c[6] <= '9' &&
                ((prev_len == 3 && memcmp(prev, "lib", 3) == 0) ||
                 (prev_len == 5 && memcmp(prev, "lib64", 5) == 0)))
                return 1;
        }
        prev = c;
        prev_len = l;
        i = j;
    }
    return 0;
}

int excluded(const char *p, size_t n)
{
    if (g_run_dir_len && under_prefix(p, n, g_run_dir, g_run_dir_len))
        return 1;
    for (int i = 0; i < g_nexcl; i++)
        if (under_prefix(p, n, g_excl[i], g_excl_len[i]))
            return 1;
    if (python_env_path(p, n)) {
        for (int i = 0; i < g_nincl; i++)
            if (under_prefix(p, n, g_incl[i], g_incl_len[i]))
                return 0;
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------
 * Configuration from the environment (at start-up)
 * ---------------------------------------------------------------------------------------------- */
static void add_exclude(const char *p, size_t n, size_t *used)
{
    while (n > 1 && p[n - 1] == '/')
        n--;
    if (n == 0 || p[0] != '/' || g_nexcl >= MAX_EXCLUDES || *used + n + 1 > sizeof g_excl_buf)
        return;
    memcpy(g_excl_buf + *used, p, n);
    g_excl_buf[*used + n] = 0;
    g_excl[g_nexcl] = g_excl_buf + *used;
    g_excl_len[g_nexcl] = n;
    g_nexcl++;
    *used += n + 1;
}

/* prefixes under which files of Python installations are counted after all (--io-include) */
static void add_include(const char *p, size_t n, size_t *used)
{
    while (n > 1 && p[n - 1] == '/')
        n--;
    if (n == 0 || p[0] != '/' || g_nincl >= MAX_EXCLUDES || *used + n + 1 > sizeof g_incl_buf)
        return;
    memcpy(g_incl_buf + *used, p, n);
    g_incl_buf[*used + n] = 0;
    g_incl[g_nincl] = g_incl_buf + *used;
    g_incl_len[g_nincl] = n;
    g_nincl++;
    *used += n + 1;
}

static void each_prefix(const char *list, void (*add)(const char *, size_t, size_t *))
{
    size_t used = 0;
    while (*list) {
        const char *c = strchr(list, ':');
        size_t n = c ? (size_t)(c - list) : strlen(list);
        add(list, n, &used);
        list += n;
        if (*list == ':')
            list++;
    }
}

static const char default_excludes[] = "/proc:/sys:/dev:/etc:/usr:/bin:/sbin:/lib:/lib32:/lib64:/boot:/run";

/* $HOLOPROF_RUN_DIR (always ignored; where dumps go), $HOLOPROF_IO_EXCLUDE, $HOLOPROF_IO_INCLUDE */
void path_policy_init(void)
{
    const char *rd = getenv("HOLOPROF_RUN_DIR");
    if (rd && rd[0]) {
        char buf[PATH_MAX];
        ssize_t n = abs_path(AT_FDCWD, rd, buf);
        if (n > 0) {
            memcpy(g_run_dir, buf, (size_t)n + 1);
            g_run_dir_len = (size_t)n;
        }
    }
    const char *ex = getenv("HOLOPROF_IO_EXCLUDE");
    each_prefix(ex ? ex : default_excludes, add_exclude);
    const char *in = getenv("HOLOPROF_IO_INCLUDE");
    if (in)
        each_prefix(in, add_include);
}
