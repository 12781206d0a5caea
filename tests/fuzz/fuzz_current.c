/* Fuzz target: the `--current` JSON of `pliant plan` (shared/reinstantiate.c
 * pl_current_parse); an accepted plan is then re-instantiated against the tiny
 * profile of examples/profiles/ (8 nodes, F = 1, its first node removed and one
 * added), as `pliant plan --current --remove --add` does. */
#include "coverage.h"
#include "fuzz.h"
#include "profile.h"
#include "reinstantiate.h"
#include "templates.h"

/* The repository's root, which the Makefile passes. */
#ifndef FUZZ_REPO
#define FUZZ_REPO "."
#endif

enum { NODES = 8, TOLERATE = 1, GLOBAL_BATCH = 32 };

static pl_profile prof;
static pl_template_set ts;
static pl_coverage cov;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char err[512];
    if (pl_profile_load(FUZZ_REPO "/examples/profiles/tiny.json", &prof, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        abort();
    }
    FUZZ_CHECK(pl_templates_plan(&prof, NODES, TOLERATE, &ts, err, sizeof err) == 0);
    FUZZ_CHECK(pl_coverage_compute(&ts, NODES, TOLERATE, GLOBAL_BATCH, prof.microbatch_size,
                                   &cov, err, sizeof err) == 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_cstr(data, size);
    pl_current_plan cur;
    char err[512] = "";
    if (pl_current_parse(text, &cur, err, sizeof err) == 0) {
        const char *removed[1], *added[1] = {"fuzz-added"};
        int nremoved = 0;
        if (cur.npipelines > 0 && cur.pipelines[0].nnodes > 0)
            removed[nremoved++] = cur.pipelines[0].nodes[0];
        pl_reinstantiation r;
        if (pl_reinstantiate(&prof, &ts, &cov, TOLERATE, GLOBAL_BATCH, &cur, removed, nremoved,
                             added, 1, &r, err, sizeof err) == 0) {
            cJSON *json = pl_reinstantiation_to_json(&r);
            FUZZ_CHECK(json);
            cJSON_Delete(json);
            pl_reinstantiation_free(&r);
        } else {
            FUZZ_CHECK(err[0]);
        }
        pl_current_plan_free(&cur);
    } else {
        FUZZ_CHECK(err[0]);
    }
    free(text);
    return 0;
}
