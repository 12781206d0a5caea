/* The sweep's grid and its recommendation (sim_sweep.h). */
#include "sim_sweep.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

int pl_sweep_parse(pl_sweep *s, const char *dim, char *err, size_t errlen)
{
    const char *eq = strchr(dim, '=');
    int *vals = NULL, *count = NULL, lo = 0;
    if (eq && eq - dim == 8 && !strncmp(dim, "tolerate", 8)) vals = s->tolerate, count = &s->ntolerate;
    else if (eq && eq - dim == 5 && !strncmp(dim, "nodes", 5)) vals = s->nodes, count = &s->nnodes, lo = 1;
    if (!vals)
        return pl_errf(err, errlen, "--sweep: expected tolerate=F,... or nodes=N,... (got %s)", dim);
    *count = 0;
    for (const char *p = eq + 1;;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < lo || v > 1000000 || (*end && *end != ','))
            return pl_errf(err, errlen, "--sweep: %.*s: not a whole number ≥ %d in %s",
                           (int)(eq - dim), dim, lo, dim);
        if (*count == PL_SWEEP_MAX)
            return pl_errf(err, errlen, "--sweep: at most %d values of %.*s", PL_SWEEP_MAX,
                           (int)(eq - dim), dim);
        vals[(*count)++] = (int)v;
        if (!*end) return 0;
        p = end + 1;
    }
}

int pl_sweep_best(const pl_sweep_row *rows, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (!rows[i].ok) continue;
        if (best < 0 || rows[i].samples_per_usd > rows[best].samples_per_usd ||
            (rows[i].samples_per_usd == rows[best].samples_per_usd &&
             rows[i].samples_per_s > rows[best].samples_per_s))
            best = i;
    }
    return best;
}
