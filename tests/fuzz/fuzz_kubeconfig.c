/* Fuzz target: kubeconfig files (operator/k8s/kube_config.c, YAML through
 * shared/yaml_tree.c), loaded with their current-context as pliant-operator
 * --kubeconfig does; relative file paths resolve to nothing readable. */
#include "fuzz.h"
#include "kube_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file(data, size);
    pl_kube_config c;
    char err[1024] = "";
    if (pl_kube_config_load_file(&c, path, NULL, err, sizeof err) == 0) {
        FUZZ_CHECK(c.server && c.namespace_);
        FUZZ_CHECK(!strncmp(c.server, "https://", 8) || !strncmp(c.server, "http://", 7));
        char *token = NULL;
        if (pl_kube_config_token(&c, &token, err, sizeof err) == 0) free(token);
        pl_kube_config_free(&c);
    } else {
        FUZZ_CHECK(err[0]);
    }
    return 0;
}
