/* Fuzz target: TrainingJob manifests, YAML or JSON (shared/jobspec.c through
 * shared/yaml_tree.c), as `pliant train/run` and the operator read them. */
#include "fuzz.h"
#include "jobspec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_cstr(data, size);
    pl_job job;
    char err[512] = "";
    if (pl_job_parse(text, "/fuzz/base", &job, err, sizeof err) == 0) {
        FUZZ_CHECK(job.batch.micro >= 1 && job.batch.global % job.batch.micro == 0);
        pl_job_free(&job);
    } else {
        FUZZ_CHECK(err[0]);
    }
    free(text);
    return 0;
}
