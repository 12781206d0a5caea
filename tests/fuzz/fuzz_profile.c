/* Fuzz target: planner profiles (shared/profile.c), as `pliant plan --profile`
 * and the coordinator read them; an accepted small profile is also planned
 * (templates and coverage for up to 4 nodes), since its numbers feed the cost model. */
#include "coverage.h"
#include "fuzz.h"
#include "profile.h"
#include "templates.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_cstr(data, size);
    pl_profile p;
    char err[512] = "";
    if (pl_profile_parse(text, &p, err, sizeof err) == 0) {
        FUZZ_CHECK(p.nkeys >= 1 && p.keys[0] == 1 && p.nlayers >= 1);
        pl_template_set ts;
        if (p.nlayers <= 16 && pl_templates_plan(&p, 4, 1, &ts, err, sizeof err) == 0) {
            pl_coverage cov;
            if (pl_coverage_compute(&ts, 4, 1, 8LL * p.microbatch_size, p.microbatch_size, &cov,
                                    err, sizeof err) == 0)
                pl_coverage_free(&cov);
            pl_template_set_free(&ts);
        }
        pl_profile_free(&p);
    } else {
        FUZZ_CHECK(err[0]);
    }
    free(text);
    return 0;
}
