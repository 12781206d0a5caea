/* status.plan written and read back (plan_status.h). */
#include "plan_status.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_num.h"
#include "util.h"

/* Pipeline q of the stable plan as status.plan.pipelines[q] (names, layers: scratch). */
static cJSON *pipe_json(const pl_coord *c, int q, const char **names, int *layers)
{
    int64_t mb = 0;
    const int n = pl_coord_plan_pipeline(c, q, names, PL_PROTO_MAX_NODES, &mb);
    cJSON *p = cJSON_CreateObject();
    int ok = p && cJSON_AddItemToObject(p, "nodes", cJSON_CreateStringArray(names, n)) &&
             cJSON_AddNumberToObject(p, "microbatches", (double)mb);
    const int t = pl_coord_plan_failover(c, q, layers, names, PL_PROTO_MAX_NODES);
    if (ok && t > 0) /* a failover's: what a new leader resumes without a copy */
        ok = cJSON_AddItemToObject(p, "layers", cJSON_CreateIntArray(layers, n + 1)) &&
             cJSON_AddItemToObject(p, "templateNodes", cJSON_CreateStringArray(names, t));
    if (!ok) {
        cJSON_Delete(p);
        return NULL;
    }
    return p;
}

cJSON *pl_plan_status_json(const pl_coord *c)
{
    const char *names[PL_PROTO_MAX_NODES];
    int layers[PL_PROTO_MAX_NODES + 1];
    if (pl_coord_plan_pipeline(c, 0, names, 1, NULL) < 0)
        return NULL;
    cJSON *plan = cJSON_CreateObject(), *pipes = cJSON_AddArrayToObject(plan, "pipelines");
    int ok = pipes && cJSON_AddNumberToObject(plan, "generation", (double)pl_coord_generation(c));
    for (int q = 0; ok && pl_coord_plan_pipeline(c, q, names, 1, NULL) >= 0; q++) {
        cJSON *p = pipe_json(c, q, names, layers);
        ok = p && cJSON_AddItemToArray(pipes, p);
    }
    if (!ok) {
        cJSON_Delete(plan);
        return NULL;
    }
    return plan;
}

/* field: an array of 1..PL_PROTO_MAX_NODES worker names into *out (pointers into a):
 * their count, or -1 and err. */
static int read_names(const cJSON *a, const char *field, const char ***out, char *err,
                      size_t errlen)
{
    const int n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : 0;
    if (n < 1 || n > PL_PROTO_MAX_NODES)
        return pl_errf(err, errlen, "%s: must be an array of 1..%d worker names", field,
                       PL_PROTO_MAX_NODES);
    const char **names = calloc((size_t)n, sizeof *names);
    if (!(*out = names))
        return pl_errf(err, errlen, "%s: out of memory", field);
    int i = 0;
    const cJSON *s;
    cJSON_ArrayForEach(s, a) {
        if (!cJSON_IsString(s) || !s->valuestring[0] ||
            strlen(s->valuestring) > PL_PROTO_NAME_MAX)
            return pl_errf(err, errlen, "%s[%d]: must be a worker name of 1..%d characters",
                           field, i, PL_PROTO_NAME_MAX);
        names[i++] = s->valuestring;
    }
    return n;
}

/* field: n + 1 stage bounds into *out: 0, or -1 and err. */
static int read_layers(const cJSON *a, const char *field, int n, int **out, char *err,
                       size_t errlen)
{
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n + 1)
        return pl_errf(err, errlen, "%s: must be an array of %d stage bounds (one more than "
                       "nodes)", field, n + 1);
    if (!(*out = malloc(((size_t)n + 1) * sizeof **out)))
        return pl_errf(err, errlen, "%s: out of memory", field);
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, a) {
        char f[128];
        snprintf(f, sizeof f, "%s[%d]", field, i);
        if (pl_json_i32(v, f, 0, INT_MAX, &(*out)[i++], err, errlen))
            return -1;
    }
    return 0;
}

/* A failover's layers and templateNodes of pipeline object pj at field into p. */
static int read_failover(const cJSON *pj, const char *field, pl_coord_pipe *p, char *err,
                         size_t errlen)
{
    const cJSON *layers = cJSON_GetObjectItem(pj, "layers");
    const cJSON *tn = cJSON_GetObjectItem(pj, "templateNodes");
    if (!layers != !tn)
        return pl_errf(err, errlen, "%s.%s: missing (layers and templateNodes go together)",
                       field, layers ? "templateNodes" : "layers");
    if (!layers)
        return 0;
    char f[96];
    int *bounds = NULL;
    const char **names = NULL;
    snprintf(f, sizeof f, "%s.layers", field);
    const int rc = read_layers(layers, f, p->nnodes, &bounds, err, errlen);
    p->layers = bounds;
    if (rc)
        return -1;
    snprintf(f, sizeof f, "%s.templateNodes", field);
    p->ntemplate = read_names(tn, f, &names, err, errlen);
    p->template_nodes = names;
    return p->ntemplate < 0 ? -1 : 0;
}

/* status.plan.pipelines[q] (pj, named field) into p: 0, or -1 and err. */
static int read_pipe(const cJSON *pj, const char *field, pl_coord_pipe *p, char *err,
                     size_t errlen)
{
    if (!cJSON_IsObject(pj))
        return pl_errf(err, errlen, "%s: must be an object", field);
    char f[96];
    const char **nodes = NULL;
    snprintf(f, sizeof f, "%s.nodes", field);
    p->nnodes = read_names(cJSON_GetObjectItem(pj, "nodes"), f, &nodes, err, errlen);
    p->nodes = nodes;
    if (p->nnodes < 0 || pl_json_get_int(pj, field, "microbatches", 1, PL_JSON_INT_MAX,
                                         &p->microbatches, err, errlen))
        return -1;
    return read_failover(pj, field, p, err, errlen);
}

int pl_plan_status_read(const cJSON *plan, pl_plan_status *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!cJSON_IsObject(plan))
        return pl_errf(err, errlen, "status.plan: must be an object");
    if (pl_json_get_int(plan, "status.plan", "generation", 1, PL_JSON_INT_MAX,
                        &out->generation, err, errlen))
        return -1;
    const cJSON *pipes = cJSON_GetObjectItem(plan, "pipelines"), *pj;
    const int n = cJSON_IsArray(pipes) ? cJSON_GetArraySize(pipes) : 0;
    if (n < 1 || n > PL_PROTO_MAX_NODES)
        return pl_errf(err, errlen, "status.plan.pipelines: must be an array of 1..%d "
                       "pipelines", PL_PROTO_MAX_NODES);
    if (!(out->pipes = calloc((size_t)n, sizeof *out->pipes)))
        return pl_errf(err, errlen, "status.plan: out of memory");
    out->npipes = n;
    int q = 0;
    cJSON_ArrayForEach(pj, pipes) {
        char f[64];
        snprintf(f, sizeof f, "status.plan.pipelines[%d]", q);
        if (read_pipe(pj, f, &out->pipes[q++], err, errlen)) {
            pl_plan_status_free(out);
            return -1;
        }
    }
    return 0;
}

void pl_plan_status_free(pl_plan_status *p)
{
    for (int q = 0; p->pipes && q < p->npipes; q++) {
        free((void *)p->pipes[q].nodes);
        free((void *)p->pipes[q].layers);
        free((void *)p->pipes[q].template_nodes);
    }
    free(p->pipes);
    memset(p, 0, sizeof *p);
}
