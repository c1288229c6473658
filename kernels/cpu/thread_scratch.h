/*
 * A scratch buffer kept by the calling thread, for the kernels of both CPU libraries.
 */
#ifndef PREFIXCACHE_THREAD_SCRATCH_H
#define PREFIXCACHE_THREAD_SCRATCH_H

#include <stdint.h>
#include <stdlib.h>

/* Grows a buffer kept by the calling thread (*buf, *have bytes) to at least `bytes`, with a
 * quarter of headroom, 64-byte aligned, never shrunk; returns it, or NULL out of memory. */
static inline void *grow_buffer(void **buf, int64_t *have, int64_t bytes) {
    if (bytes > *have) {
        free(*buf);
        bytes += bytes / 4;
        *buf = aligned_alloc(64, (size_t)((bytes + 63) / 64 * 64));
        *have = *buf ? bytes : 0;
    }
    return *buf;
}

#endif
