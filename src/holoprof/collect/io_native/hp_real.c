/* hp_real.c -- the C library's functions behind the interposed ones, found with dlsym(RTLD_NEXT). */
#include "hp_common.h"
#include "hp_real.h"

#define DEFINE_REAL(name, ret, args) HIDDEN ret(*real_##name) args;
REAL_FUNCS(DEFINE_REAL)
REAL_COMPAT_FUNCS(DEFINE_REAL)
#undef DEFINE_REAL

void resolve_all(void)
{
    if (tl_in)
        return; /* re-entered from dlsym: callers fall back to raw system calls */
    tl_in = 1;
#define RESOLVE(name, ret, args) \
    if (!real_##name) \
        __atomic_store_n(&real_##name, (ret(*) args)dlsym(RTLD_NEXT, #name), __ATOMIC_RELEASE);
#define RESOLVE_COMPAT(name, ret, args) \
    if (!real_##name) { \
        void *p__ = dlsym(RTLD_NEXT, #name); \
        if (!p__) \
            p__ = dlvsym(RTLD_NEXT, #name, "GLIBC_2.2.5"); \
        if (!p__) \
            p__ = dlvsym(RTLD_NEXT, #name, "GLIBC_2.4"); \
        __atomic_store_n(&real_##name, (ret(*) args)p__, __ATOMIC_RELEASE); \
    }
    REAL_FUNCS(RESOLVE)
    REAL_COMPAT_FUNCS(RESOLVE_COMPAT)
    tl_in = 0;
}
