/* `pliant sample CKPT [--tokens N] [--prompt TEXT] [--seed S] [--temperature X]`:
 * generates from the newest checkpoint under CKPT. Byte-level models
 * (vocabulary ≤ 256) print text, others token ids. */
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "cli_args.h"
#include "commands.h"

typedef struct {
    long long tokens, seed;
    double temperature;
    const char *prompt;
} sample_args;

static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Draws from softmax(logits/temperature) given the model's probabilities. */
static int draw(const float *probs, int V, double temperature, uint64_t *rng)
{
    double total = 0;
    for (int i = 0; i < V; i++) total += pow(probs[i], 1.0 / temperature);
    double coin = (double)(next_u64(rng) >> 11) / 9007199254740992.0 * total, cdf = 0;
    for (int i = 0; i < V; i++) {
        cdf += pow(probs[i], 1.0 / temperature);
        if (coin < cdf) return i;
    }
    return V - 1;
}

static void emit(int token, int V)
{
    if (V <= 256)
        putchar(token);
    else
        printf("%d ", token);
}

static int generate(pl_engine *e, const sample_args *a)
{
    const int T = e->T, V = e->cfg.V;
    int32_t *ctx = calloc((size_t)T, sizeof *ctx), *targets = malloc((size_t)T * sizeof *targets);
    if (!ctx || !targets) return -1;
    for (int t = 0; t < T; t++) targets[t] = -1;
    int n = 0;
    for (const char *p = a->prompt; p && *p && n < T - 1 && V <= 256; p++) {
        ctx[n++] = (unsigned char)*p;
        emit((unsigned char)*p, V);
    }
    if (n == 0) ctx[n++] = V <= 256 ? '\n' : 0;
    uint64_t rng = (uint64_t)a->seed;
    for (long long i = 0; i < a->tokens; i++) {
        if (n == T) { /* slide the window */
            memmove(ctx, ctx + T / 2, (size_t)(T - T / 2) * sizeof *ctx);
            n = T - T / 2;
        }
        pl_engine_forward(e, 0, ctx, NULL, targets);
        const float *probs = pl_engine_probs(e, 0) + (size_t)(n - 1) * e->cfg.Vp;
        int tok = draw(probs, V, a->temperature, &rng);
        ctx[n++] = tok;
        emit(tok, V);
    }
    putchar('\n');
    free(ctx);
    free(targets);
    return 0;
}

int cmd_sample(int argc, char **argv)
{
    static const struct option opts[] = {{"tokens", required_argument, 0, 'n'},
                                         {"prompt", required_argument, 0, 'p'},
                                         {"seed", required_argument, 0, 's'},
                                         {"temperature", required_argument, 0, 't'},
                                         {0, 0, 0, 0}};
    sample_args a = {.tokens = 256, .seed = 1337, .temperature = 1.0};
    char err[1024] = "";
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int rc = 0;
        if (c == 'n') rc = cli_parse_int("--tokens", optarg, 1, 1000000, &a.tokens, err, sizeof err);
        else if (c == 's') rc = cli_parse_int("--seed", optarg, 0, INT64_MAX, &a.seed, err, sizeof err);
        else if (c == 't')
            rc = cli_parse_double("--temperature", optarg, 0.01, 100, &a.temperature, err, sizeof err);
        else if (c == 'p') a.prompt = optarg;
        else {
            snprintf(err, sizeof err, "unknown option or missing value: '%s'", argv[optind - 1]);
            rc = -1;
        }
        if (rc) {
            fprintf(stderr, "pliant sample: %s\n", err);
            return 2;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "pliant sample: usage: pliant sample CKPT [--tokens N] [--prompt TEXT] "
                        "[--seed S] [--temperature X]\n");
        return 2;
    }
    kn_ctx *k = kn_create("cpu", 0, err, sizeof err);
    pl_engine e;
    int rc = 1;
    if (k && pl_engine_from_checkpoint(&e, k, argv[optind], 1, 0, err, sizeof err) == 0) {
        pl_engine_keep_probs(&e, 1); /* generate() draws from pl_engine_probs */
        rc = generate(&e, &a) ? 1 : 0;
        if (rc) snprintf(err, sizeof err, "out of memory");
        pl_engine_destroy(&e);
    }
    if (rc) fprintf(stderr, "pliant sample: %s\n", err);
    kn_destroy(k);
    return rc;
}
