/*
 * Contiguous runs of work items with stealing from their ends, for loops whose items stream
 * memory in order (GEMM strips, KV blocks to pack) on threads that do not all run at the same
 * speed (a shared machine, one core's cache holding more of the data).
 *
 * Items [0, n) are cut into one contiguous run per thread before the parallel region. A thread
 * takes the items of its own run from the front, in order, so it knows what it reads next and
 * can prefetch it; once its run is empty it takes items from the back of the other runs, one at
 * a time, until every run is empty. Each item is taken exactly once, whatever the team size
 * the region actually gets (a run whose thread never starts is emptied by the others).
 *
 * A run is one 64-bit word, (front, back) as two 32-bit halves, changed by compare-and-swap,
 * alone on its cache line.
 */
#ifndef PREFIXCACHE_WORK_RUNS_H
#define PREFIXCACHE_WORK_RUNS_H

#include <stdint.h>

typedef struct {
    uint64_t span; /* front | back << 32: the items [front, back) not yet taken */
    char pad[56];
} __attribute__((aligned(64))) work_run;

/* Cuts items [0, n) into `runs` contiguous runs (n < 2^31). */
static inline void work_runs_init(work_run *run, int runs, int64_t n) {
    for (int r = 0; r < runs; r++) {
        const uint64_t front = (uint64_t)(n * r / runs), back = (uint64_t)(n * (r + 1) / runs);
        __atomic_store_n(&run[r].span, front | back << 32, __ATOMIC_RELAXED);
    }
}

/* Takes the front item of a run (from_back == 0) or its back item; -1 when it is empty. */
static inline int64_t work_run_take(work_run *run, int from_back) {
    uint64_t span = __atomic_load_n(&run->span, __ATOMIC_RELAXED);
    for (;;) {
        const uint64_t front = span & 0xFFFFFFFFu, back = span >> 32;
        if (front >= back) return -1;
        const uint64_t taken = from_back ? front | (back - 1) << 32 : (front + 1) | back << 32;
        if (__atomic_compare_exchange_n(&run->span, &span, taken, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            return (int64_t)(from_back ? back - 1 : front);
    }
}

/* The item a run's owner takes next, or -1 when the run is empty. */
static inline int64_t work_run_peek(const work_run *run) {
    const uint64_t span = __atomic_load_n(&run->span, __ATOMIC_RELAXED);
    const uint64_t front = span & 0xFFFFFFFFu, back = span >> 32;
    return front < back ? (int64_t)front : -1;
}

/* The next item for thread `tid` of `runs`: its own run's front, else the back of the next
 * non-empty run after it; -1 when every run is empty. *after is the item the thread takes
 * after this one from its own run, or -1 (none, or this one was stolen): a hint for
 * prefetching, as a thread that steals may take it first. */
static inline int64_t work_runs_next(work_run *run, int runs, int tid, int64_t *after) {
    int64_t item = work_run_take(&run[tid], 0);
    *after = item >= 0 ? work_run_peek(&run[tid]) : -1;
    for (int r = 1; item < 0 && r < runs; r++) item = work_run_take(&run[(tid + r) % runs], 1);
    return item;
}

#endif
