/*
 * Seconds the fused decoder layers spend in each of their phases, summed over calls while
 * profiling is on (off by default: then a phase costs one branch). Process-wide counters,
 * updated by the thread that calls the layers: meant for one forward at a time, as the
 * benchmarks run them.
 */
#include <omp.h>
#include <string.h>

#include "cpu_kernels.h"

static int enabled = 0;
static double seconds[PC_NUM_PHASES];

void pc_profile_enable(int on) { enabled = on != 0; }

void pc_profile_read(double *out, int reset) {
    memcpy(out, seconds, sizeof(seconds));
    if (reset) memset(seconds, 0, sizeof(seconds));
}

double pc_phase_start(void) { return enabled ? omp_get_wtime() : 0.0; }

void pc_phase_end(int phase, double *since) {
    if (!enabled) return;
    const double now = omp_get_wtime();
    seconds[phase] += now - *since;
    *since = now;
}
