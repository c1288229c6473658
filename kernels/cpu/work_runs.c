/*
 * Checks of work_runs.h for the tests: the order in which one thread alone drains the runs,
 * and a count of how often each item is taken when `runs` threads drain them at once.
 */
#include <omp.h>
#include <stdint.h>

#include "cpu_kernels.h"
#include "work_runs.h"

/* The items thread `tid` takes, alone, from `runs` runs over [0, n): written to out[0 .. n);
 * returns how many (n, when every item is taken once). */
int64_t pc_work_runs_drain(int64_t n, int runs, int tid, int64_t *out) {
    work_run run[runs];
    work_runs_init(run, runs, n);
    int64_t count = 0, item, after;
    while ((item = work_runs_next(run, runs, tid, &after)) >= 0) out[count++] = item;
    return count;
}

/* `runs` threads drain `runs` runs over [0, n) at once, each item adding 1 to taken[item]
 * (zeroed by the caller); `repeats` times over. */
void pc_work_runs_stress(int64_t n, int runs, int repeats, int32_t *taken) {
    work_run run[runs];
    for (int r = 0; r < repeats; r++) {
        work_runs_init(run, runs, n);
#pragma omp parallel num_threads(runs)
        {
            const int tid = omp_get_thread_num();
            int64_t item, after;
            while ((item = work_runs_next(run, runs, tid, &after)) >= 0)
                __atomic_fetch_add(&taken[item], 1, __ATOMIC_RELAXED);
        }
    }
}
