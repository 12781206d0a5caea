/* `pliant plan`: templates, the coverage table and, with --current, a
 * re-instantiation plan, as JSON on stdout. Bad input exits with status 2. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_args.h"
#include "commands.h"
#include "coverage.h"
#include "plan_json.h"
#include "profile.h"
#include "rc_plan.h"
#include "reinstantiate.h"
#include "templates.h"
#include "util.h"

static void plan_usage(FILE *f)
{
    fprintf(f, "usage: pliant plan --profile PROFILE.json --nodes N --tolerate F --global-batch B\n"
               "                   [--redundant eager|lazy]\n"
               "                   [--current CURRENT.json [--remove n1,n2,...] [--add n3,...]]\n");
}

static int fail(const char *msg)
{
    fprintf(stderr, "pliant plan: %s\n", msg);
    return 2;
}

typedef struct {
    const char *profile, *current, *remove, *add;
    int redundant; /* 0: templates; 1: redundant with eager FRC; 2: lazy (rc_plan.h) */
    long long nodes, tolerate, global_batch;
} plan_args;

/* Takes one option getopt_long returned: 0, 1 for --help, or -1 with err. */
static int plan_option(int c, char **argv, plan_args *a, char *err, size_t errlen)
{
    switch (c) {
    case 'p': a->profile = optarg; return 0;
    case 'c': a->current = optarg; return 0;
    case 'r': a->remove = optarg; return 0;
    case 'a': a->add = optarg; return 0;
    case 'n': return cli_parse_int("--nodes", optarg, 1, 1000000, &a->nodes, err, errlen);
    case 'f': return cli_parse_int("--tolerate", optarg, 0, 1000, &a->tolerate, err, errlen);
    case 'b':
        return cli_parse_int("--global-batch", optarg, 1, LLONG_MAX / 2, &a->global_batch, err,
                             errlen);
    case 'R':
        a->redundant = !strcmp(optarg, "eager") ? 1 : !strcmp(optarg, "lazy") ? 2 : 0;
        if (!a->redundant) {
            snprintf(err, errlen, "--redundant: must be eager or lazy (got '%s')", optarg);
            return -1;
        }
        return 0;
    case 'h': return 1;
    case ':':
        snprintf(err, errlen, "%s: needs a value", argv[optind - 1]);
        return -1;
    default:
        snprintf(err, errlen, "unknown option '%s'", argv[optind - 1]);
        return -1;
    }
}

/* The flags every plan needs, and --remove/--add only with --current. */
static int check_plan_args(const plan_args *a, char *err, size_t errlen)
{
    const char *missing = !a->profile ? "--profile" : a->nodes < 0 ? "--nodes"
                        : a->tolerate < 0 ? "--tolerate" : a->global_batch < 0 ? "--global-batch"
                        : NULL;
    if (missing) {
        snprintf(err, errlen, "%s is required", missing);
        return -1;
    }
    if ((a->remove || a->add) && !a->current) {
        snprintf(err, errlen, "%s needs --current", a->remove ? "--remove" : "--add");
        return -1;
    }
    return 0;
}

static int parse_args(int argc, char **argv, plan_args *a, char *err, size_t errlen)
{
    static const struct option opts[] = {
        {"profile", required_argument, 0, 'p'},   {"nodes", required_argument, 0, 'n'},
        {"tolerate", required_argument, 0, 'f'},  {"global-batch", required_argument, 0, 'b'},
        {"current", required_argument, 0, 'c'},   {"remove", required_argument, 0, 'r'},
        {"add", required_argument, 0, 'a'},       {"help", no_argument, 0, 'h'},
        {"redundant", required_argument, 0, 'R'},
        {0, 0, 0, 0}};
    memset(a, 0, sizeof *a);
    a->nodes = a->tolerate = a->global_batch = -1;
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int rc = plan_option(c, argv, a, err, errlen);
        if (rc) return rc;
    }
    if (optind < argc) {
        snprintf(err, errlen, "unexpected argument '%s'", argv[optind]);
        return -1;
    }
    return check_plan_args(a, err, errlen);
}

/* Splits a comma-separated node list in place; empty names are an error. */
static int split_names(const char *flag, char *list, char ***out, int *n, char *err, size_t errlen)
{
    *out = NULL;
    *n = 0;
    if (!list) return 0;
    int cap = 1;
    for (const char *c = list; *c; c++) cap += *c == ',';
    *out = pl_calloc((size_t)cap, sizeof **out);
    if (!*out) return pl_errf(err, errlen, "out of memory");
    for (char *tok = list, *next; tok; tok = next) {
        next = strchr(tok, ',');
        if (next) *next++ = '\0';
        if (!*tok) return pl_errf(err, errlen, "%s: empty node name in the list", flag);
        (*out)[(*n)++] = tok;
    }
    return 0;
}

/* The "reinstantiation" part of the output: --current after --remove/--add. */
static cJSON *reinstantiate_json(const plan_args *a, const pl_profile *prof,
                                 const pl_template_set *ts, const pl_coverage *cov, char *err,
                                 size_t errlen)
{
    char *text = pl_read_file(a->current, err, errlen);
    if (!text) return NULL;
    pl_current_plan cur;
    int rc = pl_current_parse(text, &cur, err, errlen);
    free(text);
    if (rc) {
        char msg[512];
        pl_errf(msg, sizeof msg, "%s", err);
        pl_errf(err, errlen, "--current %.100s: %s", a->current, msg);
        return NULL;
    }
    char *rm = a->remove ? strdup(a->remove) : NULL, *ad = a->add ? strdup(a->add) : NULL;
    char **removed = NULL, **added = NULL;
    int nremoved = 0, nadded = 0;
    cJSON *out = NULL;
    pl_reinstantiation r;
    if (!split_names("--remove", rm, &removed, &nremoved, err, errlen) &&
        !split_names("--add", ad, &added, &nadded, err, errlen) &&
        !pl_reinstantiate(prof, ts, cov, (int)a->tolerate, a->global_batch, &cur,
                          (const char *const *)removed, nremoved, (const char *const *)added,
                          nadded, &r, err, errlen)) {
        out = pl_reinstantiation_to_json(&r);
        if (!out) snprintf(err, errlen, "out of memory");
        pl_reinstantiation_free(&r);
    }
    free(removed);
    free(added);
    free(rm);
    free(ad);
    pl_current_plan_free(&cur);
    return out;
}

/* "redundant": per template, the memory and step time it is expected to take with RC
 * (rc_plan.h), with nb = 4S microbatches as the templates' iteration_ms. */
static void add_rc_json(cJSON *out, const pl_profile *prof, const pl_template_set *ts, int eager)
{
    cJSON *o = cJSON_AddObjectToObject(out, "redundant");
    if (!o) return;
    cJSON_AddStringToObject(o, "forward", eager ? "eager" : "lazy");
    cJSON *arr = cJSON_AddArrayToObject(o, "templates");
    for (int i = 0; arr && i < ts->count; i++) {
        const pl_template *t = &ts->templates[i];
        pl_rc_cost c;
        if (!t->feasible || pl_rc_evaluate(prof, t, eager, 4 * (int64_t)t->nstages, &c)) continue;
        cJSON *e = cJSON_CreateObject();
        if (!e) return;
        cJSON_AddNumberToObject(e, "nodes", t->nodes);
        cJSON_AddNumberToObject(e, "stages", t->nstages);
        cJSON_AddNumberToObject(e, "memory_bytes", (double)c.memory_bytes);
        cJSON_AddNumberToObject(e, "iteration_ms", pl_ns_to_ms(c.iteration_ns));
        cJSON_AddNumberToObject(e, "templates_iteration_ms", pl_ns_to_ms(t->iteration_ns));
        cJSON_AddNumberToObject(e, "frc_ms", pl_ns_to_ms(c.frc_ns));
        cJSON_AddNumberToObject(e, "exposed_frc_ms", pl_ns_to_ms(c.exposed_frc_ns));
        cJSON_AddNumberToObject(e, "shadow_sync_ms", pl_ns_to_ms(c.shadow_sync_ns));
        cJSON_AddItemToArray(arr, e);
    }
}

/* Prints the plan (and with --current its reinstantiation) as JSON: the exit status. */
static int print_plan(const plan_args *a, const pl_profile *prof, const pl_template_set *ts,
                      const pl_coverage *cov, char *err, size_t errlen)
{
    int status = 0;
    cJSON *out = pl_plan_to_json(ts, cov);
    if (out && a->redundant) add_rc_json(out, prof, ts, a->redundant == 1);
    cJSON *re = out && a->current ? reinstantiate_json(a, prof, ts, cov, err, errlen) : NULL;
    if (re) cJSON_AddItemToObject(out, "reinstantiation", re);
    char *text = out && (re || !a->current) ? cJSON_Print(out) : NULL;
    if (a->current && !re) {
        status = fail(err);
    } else if (text) {
        fputs(text, stdout);
        fputc('\n', stdout);
    } else {
        status = fail("out of memory");
    }
    free(text);
    cJSON_Delete(out);
    return status;
}

int cmd_plan(int argc, char **argv)
{
    char err[512];
    plan_args a;
    int rc = parse_args(argc, argv, &a, err, sizeof err);
    if (rc) return cli_usage_exit(rc, "plan", err, plan_usage);
    pl_profile prof;
    if (pl_profile_load(a.profile, &prof, err, sizeof err)) return fail(err);
    if (pl_batch_check(a.global_batch, prof.microbatch_size, (int)a.tolerate, err, sizeof err)) {
        pl_profile_free(&prof);
        return fail(err);
    }
    pl_template_set ts;
    if (a.redundant ? pl_templates_plan_rc(&prof, (int)a.nodes, (int)a.tolerate, a.redundant == 1,
                                           &ts, err, sizeof err)
                    : pl_templates_plan(&prof, (int)a.nodes, (int)a.tolerate, &ts, err, sizeof err)) {
        pl_profile_free(&prof);
        return fail(err);
    }
    pl_coverage cov;
    int status;
    if (pl_coverage_compute(&ts, (int)a.nodes, (int)a.tolerate, a.global_batch,
                            prof.microbatch_size, &cov, err, sizeof err)) {
        status = fail(err);
    } else {
        status = print_plan(&a, &prof, &ts, &cov, err, sizeof err);
        pl_coverage_free(&cov);
    }
    pl_template_set_free(&ts);
    pl_profile_free(&prof);
    return status;
}
