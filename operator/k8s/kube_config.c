/* Finding the Kubernetes API and its credentials: kubeconfig files and the
 * in-cluster service account (kube_config.h). */
#include "kube_config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"
#include "yaml_tree.h"

#define FIELD_CAP 256

/* One kubeconfig being read: where it is (for messages and relative paths). */
typedef struct {
    const char *file;
    char dir[PATH_MAX];
    char *err;
    size_t errlen;
} loader;

/* "kubeconfig FILE: FIELD: reason" — every kubeconfig error names its field. */
__attribute__((format(printf, 3, 4))) static int fail(loader *L, const char *field,
                                                      const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return pl_errf(L->err, L->errlen, "kubeconfig %s: %s: %s", L->file, field, why);
}

static int oom(char *err, size_t errlen)
{
    return pl_errf(err, errlen, "out of memory");
}

static void set_field(char *out, const char *base, const char *key)
{
    if (snprintf(out, FIELD_CAP, "%s%s%s", base, *base ? "." : "", key) >= FIELD_CAP)
        memcpy(out + FIELD_CAP - 4, "...", 4); /* a truncated field still reads as one */
}

/* A string field: 1 and *out (borrowed) when present, 0 when absent or null,
 * −1 when it is not a scalar. Numbers count as their text (`namespace: 123`). */
static int get_str(loader *L, const pl_ynode *map, const char *base, const char *key,
                   const char **out)
{
    const pl_ynode *n = pl_yaml_get(map, key);
    *out = NULL;
    if (!n || n->type == PL_Y_NULL) return 0;
    char field[FIELD_CAP];
    set_field(field, base, key);
    if (n->type == PL_Y_SEQ || n->type == PL_Y_MAP || n->type == PL_Y_BOOL)
        return fail(L, field, "must be a string, not %s", pl_yaml_type_name(n->type));
    if (n->len == 0) return 0;
    *out = n->str;
    return 1;
}

static int dup_str(loader *L, const char *s, char **out)
{
    *out = s ? strdup(s) : NULL;
    return s && !*out ? oom(L->err, L->errlen) : 0;
}

/* A file path field, made absolute against the kubeconfig's directory. */
static int get_path(loader *L, const pl_ynode *map, const char *base, const char *key,
                    char **out)
{
    const char *s;
    *out = NULL;
    int got = get_str(L, map, base, key, &s);
    if (got <= 0) return got;
    if (s[0] == '/') return dup_str(L, s, out);
    char abs[PATH_MAX];
    char field[FIELD_CAP];
    set_field(field, base, key);
    if (snprintf(abs, sizeof abs, "%s/%s", L->dir, s) >= (int)sizeof abs)
        return fail(L, field, "path too long");
    return dup_str(L, abs, out);
}

static void trim_end(char *s)
{
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
}

static int b64_value(int ch)
{
    if (ch >= 'A' && ch <= 'Z') return ch - 'A';
    if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9') return ch - '0' + 52;
    if (ch == '+') return 62;
    if (ch == '/') return 63;
    return -1;
}

/* Standard base64 with optional padding; white space (YAML folding) is skipped. */
static int b64_decode(const char *s, pl_kube_blob *out)
{
    size_t n = strlen(s);
    char *buf = malloc(n / 4 * 3 + 4);
    if (!buf) return -1;
    size_t len = 0, pad = 0;
    unsigned acc = 0, bits = 0;
    for (const char *p = s; *p; p++) {
        if (isspace((unsigned char)*p)) continue;
        if (*p == '=') {
            pad++;
            continue;
        }
        int v = b64_value((unsigned char)*p);
        if (v < 0 || pad) goto bad; /* no data after padding */
        acc = ((acc << 6) | (unsigned)v) & 0xffffffu;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            buf[len++] = (char)((acc >> bits) & 0xff);
        }
    }
    /* leftover bits must be zero padding of a 2- or 3-character final group */
    if (bits >= 6 || (acc & ((1u << bits) - 1)) || pad > 2 || len == 0) goto bad;
    buf[len] = '\0';
    out->data = buf;
    out->len = len;
    return 0;
bad:
    free(buf);
    return 1;
}

/* A *-data field: decoded into *out when present. */
static int get_data(loader *L, const pl_ynode *map, const char *base, const char *key,
                    pl_kube_blob *out)
{
    const char *s;
    int got = get_str(L, map, base, key, &s);
    if (got <= 0) return got;
    int rc = b64_decode(s, out);
    if (rc < 0) return oom(L->err, L->errlen);
    char field[FIELD_CAP];
    set_field(field, base, key);
    return rc ? fail(L, field, "invalid base64") : 0;
}

/* The `key` mapping of the entry named name in the list `list` (clusters,
 * contexts, users: [{name, KEY: {...}}]); its field path goes to path. */
static const pl_ynode *find_named(loader *L, const pl_ynode *root, const char *list,
                                  const char *key, const char *name, const char *wanted_by,
                                  char *path)
{
    const pl_ynode *seq = pl_yaml_get(root, list);
    if (seq && seq->type != PL_Y_SEQ && seq->type != PL_Y_NULL) {
        fail(L, list, "must be a list, not %s", pl_yaml_type_name(seq->type));
        return NULL;
    }
    for (size_t i = 0; seq && i < seq->n; i++) {
        const pl_ynode *item = seq->kids[i];
        snprintf(path, FIELD_CAP, "%s[%zu]", list, i);
        const char *item_name;
        if (get_str(L, item, path, "name", &item_name) < 0) return NULL;
        if (!item_name || strcmp(item_name, name) != 0) continue;
        const pl_ynode *body = pl_yaml_get(item, key);
        snprintf(path, FIELD_CAP, "%s[%zu].%s", list, i, key);
        if (!body || body->type != PL_Y_MAP) {
            fail(L, path, "must be a mapping");
            return NULL;
        }
        return body;
    }
    fail(L, wanted_by, "no entry named \"%s\" in %s", name, list);
    return NULL;
}

/* A file field and its -data twin: at most one may be given. */
static int one_of(loader *L, const char *path, const char *key, int file, int data)
{
    char field[FIELD_CAP];
    set_field(field, path, key);
    return file && data ? fail(L, field, "both it and %s-data are given", key) : 0;
}

static int load_cluster(loader *L, pl_kube_config *c, const pl_ynode *cl, const char *path)
{
    const char *server;
    char field[FIELD_CAP];
    if (get_str(L, cl, path, "server", &server) < 0) return -1;
    set_field(field, path, "server");
    if (!server) return fail(L, field, "missing");
    size_t scheme = !strncmp(server, "https://", 8) ? 8 : !strncmp(server, "http://", 7) ? 7 : 0;
    if (!scheme)
        return fail(L, field, "\"%s\" must start with https:// or http://", server);
    if (server[scheme] == '\0' || server[scheme] == '/')
        return fail(L, field, "\"%s\" names no host", server);
    if (dup_str(L, server, &c->server)) return -1;
    size_t n = strlen(c->server);
    while (n && c->server[n - 1] == '/') c->server[--n] = '\0';

    const pl_ynode *ins = pl_yaml_get(cl, "insecure-skip-tls-verify");
    set_field(field, path, "insecure-skip-tls-verify");
    if (ins && ins->type != PL_Y_BOOL && ins->type != PL_Y_NULL)
        return fail(L, field, "must be a boolean, not %s", pl_yaml_type_name(ins->type));
    c->insecure = ins && ins->type == PL_Y_BOOL && ins->boolean;

    if (get_path(L, cl, path, "certificate-authority", &c->ca_file) < 0 ||
        get_data(L, cl, path, "certificate-authority-data", &c->ca) < 0)
        return -1;
    if (one_of(L, path, "certificate-authority", c->ca_file != NULL, c->ca.data != NULL))
        return -1;
    set_field(field, path, "certificate-authority");
    if (c->insecure && (c->ca_file || c->ca.data))
        return fail(L, field, "a CA together with insecure-skip-tls-verify is not allowed");
    return 0;
}

static int load_user(loader *L, pl_kube_config *c, const pl_ynode *u, const char *path)
{
    static const char *const unsupported[] = {"exec", "auth-provider", "username", "password"};
    char field[FIELD_CAP];
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++)
        if (pl_yaml_get(u, unsupported[i])) {
            set_field(field, path, unsupported[i]);
            return fail(L, field, "not supported (use a token or a client certificate)");
        }
    const char *token;
    if (get_str(L, u, path, "token", &token) < 0 || dup_str(L, token, &c->token_) ||
        (!token && get_path(L, u, path, "tokenFile", &c->token_file) < 0) ||
        get_path(L, u, path, "client-certificate", &c->cert_file) < 0 ||
        get_data(L, u, path, "client-certificate-data", &c->cert) < 0 ||
        get_path(L, u, path, "client-key", &c->key_file) < 0 ||
        get_data(L, u, path, "client-key-data", &c->key) < 0)
        return -1;
    int has_cert = c->cert_file || c->cert.data, has_key = c->key_file || c->key.data;
    set_field(field, path, has_cert ? "client-key" : "client-certificate");
    if (has_cert != has_key) return fail(L, field, "missing (a client certificate needs its key)");
    if (one_of(L, path, "client-certificate", c->cert_file != NULL, c->cert.data != NULL) ||
        one_of(L, path, "client-key", c->key_file != NULL, c->key.data != NULL))
        return -1;
    return 0;
}

/* Reads the token file into token_ if it changed since the last read. */
static int refresh_token(pl_kube_config *c, char *err, size_t errlen)
{
    struct stat st;
    if (stat(c->token_file, &st) != 0)
        return pl_errf(err, errlen, "%s: %s", c->token_file, strerror(errno));
    if (!S_ISREG(st.st_mode)) /* a FIFO or a device would block or never end */
        return pl_errf(err, errlen, "%s: not a regular file", c->token_file);
    const struct stat *old = &c->token_stat_;
    if (c->token_ && st.st_dev == old->st_dev && st.st_ino == old->st_ino &&
        st.st_size == old->st_size && st.st_mtim.tv_sec == old->st_mtim.tv_sec &&
        st.st_mtim.tv_nsec == old->st_mtim.tv_nsec)
        return 0;
    char *text = pl_read_file(c->token_file, err, errlen);
    if (!text) return -1;
    trim_end(text);
    if (!*text) {
        free(text);
        return pl_errf(err, errlen, "%s: empty token", c->token_file);
    }
    free(c->token_);
    c->token_ = text;
    c->token_stat_ = st; /* stat before the read: a change during it is seen next time */
    return 0;
}

int pl_kube_config_token(pl_kube_config *c, char **token, char *err, size_t errlen)
{
    int rc = 0;
    *token = NULL;
    pthread_mutex_lock(&c->lock_);
    /* A rotation caught mid-swap keeps the previous token: the next call retries. */
    if (c->token_file && refresh_token(c, err, errlen) && !c->token_) rc = -1;
    if (rc == 0 && c->token_ && !(*token = strdup(c->token_))) rc = oom(err, errlen);
    pthread_mutex_unlock(&c->lock_);
    return rc;
}

static int init_config(pl_kube_config *c, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    if (pthread_mutex_init(&c->lock_, NULL) != 0)
        return pl_errf(err, errlen, "cannot create a mutex");
    c->has_lock_ = 1;
    return 0;
}

/* Checks that a token file given by the configuration can be read now, so a
 * wrong path is reported at start-up and not at the first request. */
static int first_token(pl_kube_config *c, const char *what, char *err, size_t errlen)
{
    char why[512];
    char *tok;
    if (pl_kube_config_token(c, &tok, why, sizeof why))
        return pl_errf(err, errlen, "%s: %s", what, why);
    free(tok);
    return 0;
}

static int load_tree(loader *L, pl_kube_config *c, const pl_ynode *root, const char *context)
{
    char path[FIELD_CAP];
    if (root->type != PL_Y_MAP) return fail(L, "(top level)", "must be a mapping");
    const char *ctx_name = context;
    if (!ctx_name) {
        if (get_str(L, root, "", "current-context", &ctx_name) < 0) return -1;
        if (!ctx_name) return fail(L, "current-context", "missing (and no context was given)");
    }
    const pl_ynode *ctx = find_named(L, root, "contexts", "context", ctx_name,
                                     context ? "context" : "current-context", path);
    if (!ctx) return -1;
    char ctx_path[FIELD_CAP];
    memcpy(ctx_path, path, sizeof ctx_path);
    const char *cluster_name, *user_name, *ns;
    char field[FIELD_CAP];
    if (get_str(L, ctx, ctx_path, "cluster", &cluster_name) < 0 ||
        get_str(L, ctx, ctx_path, "user", &user_name) < 0 ||
        get_str(L, ctx, ctx_path, "namespace", &ns) < 0)
        return -1;
    set_field(field, ctx_path, "cluster");
    if (!cluster_name) return fail(L, field, "missing");
    const pl_ynode *cl = find_named(L, root, "clusters", "cluster", cluster_name, field, path);
    if (!cl || load_cluster(L, c, cl, path)) return -1;
    if (user_name) {
        set_field(field, ctx_path, "user");
        const pl_ynode *u = find_named(L, root, "users", "user", user_name, field, path);
        if (!u || load_user(L, c, u, path)) return -1;
        set_field(field, path, "tokenFile");
        char what[FIELD_CAP + PATH_MAX];
        snprintf(what, sizeof what, "kubeconfig %s: %s", L->file, field);
        if (c->token_file && first_token(c, what, L->err, L->errlen)) return -1;
    }
    return dup_str(L, ns ? ns : "default", &c->namespace_);
}

int pl_kube_config_load_file(pl_kube_config *c, const char *path, const char *context,
                             char *err, size_t errlen)
{
    if (init_config(c, err, errlen)) return -1;
    loader L = {.file = path, .err = err, .errlen = errlen};
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(L.dir, sizeof L.dir, ".");
    else if (snprintf(L.dir, sizeof L.dir, "%.*s", (int)(slash - path), path) >=
             (int)sizeof L.dir) {
        pl_kube_config_free(c);
        return pl_errf(err, errlen, "kubeconfig %s: path too long", path);
    }
    if (slash == path) snprintf(L.dir, sizeof L.dir, "/");

    char why[512];
    char *text = pl_read_file(path, why, sizeof why);
    if (!text) {
        pl_kube_config_free(c);
        return pl_errf(err, errlen, "kubeconfig %s", why);
    }
    pl_ynode *root = pl_yaml_load(text, strlen(text), why, sizeof why);
    free(text);
    int rc = root ? load_tree(&L, c, root, context)
                  : pl_errf(err, errlen, "kubeconfig %s: %s", path, why);
    pl_yaml_free(root);
    if (rc) pl_kube_config_free(c);
    return rc;
}

static int in_cluster(pl_kube_config *c, const char *dir, char *err, size_t errlen)
{
    const char *host = getenv("KUBERNETES_SERVICE_HOST");
    const char *port = getenv("KUBERNETES_SERVICE_PORT");
    if (!host || !*host || !port || !*port)
        return pl_errf(err, errlen, "in-cluster config: KUBERNETES_SERVICE_HOST and "
                                    "KUBERNETES_SERVICE_PORT must be set");
    int v6 = strchr(host, ':') != NULL;
    size_t n = strlen(host) + strlen(port) + 16;
    if (!(c->server = malloc(n))) return oom(err, errlen);
    snprintf(c->server, n, "https://%s%s%s:%s", v6 ? "[" : "", host, v6 ? "]" : "", port);

    char path[PATH_MAX];
    if (pl_pathf(path, sizeof path, err, errlen, "%s/ca.crt", dir)) return -1;
    if (access(path, R_OK) != 0)
        return pl_errf(err, errlen, "in-cluster config: %s: %s", path, strerror(errno));
    if (!(c->ca_file = strdup(path))) return oom(err, errlen);
    if (pl_pathf(path, sizeof path, err, errlen, "%s/token", dir)) return -1;
    if (!(c->token_file = strdup(path))) return oom(err, errlen);
    if (first_token(c, "in-cluster config", err, errlen)) return -1;

    /* no namespace file: "default", as client-go does */
    if (pl_pathf(path, sizeof path, err, errlen, "%s/namespace", dir)) return -1;
    c->namespace_ = pl_read_file(path, NULL, 0);
    if (c->namespace_) trim_end(c->namespace_);
    if (!c->namespace_ || !*c->namespace_) {
        free(c->namespace_);
        c->namespace_ = strdup("default");
    }
    return c->namespace_ ? 0 : oom(err, errlen);
}

int pl_kube_config_in_cluster(pl_kube_config *c, const char *sa_dir, char *err, size_t errlen)
{
    if (init_config(c, err, errlen)) return -1;
    int rc = in_cluster(c, sa_dir ? sa_dir : PL_KUBE_SA_DIR, err, errlen);
    if (rc) pl_kube_config_free(c);
    return rc;
}

int pl_kube_config_load_default(pl_kube_config *c, const char *path, char *err, size_t errlen)
{
    if (path && *path) return pl_kube_config_load_file(c, path, NULL, err, errlen);
    const char *env = getenv("KUBECONFIG");
    if (env && *env) {
        char first[PATH_MAX];
        size_t n = strcspn(env, ":");
        if (n >= sizeof first) return pl_errf(err, errlen, "KUBECONFIG: path too long");
        memcpy(first, env, n);
        first[n] = '\0';
        return pl_kube_config_load_file(c, first, NULL, err, errlen);
    }
    const char *host = getenv("KUBERNETES_SERVICE_HOST");
    if (host && *host) return pl_kube_config_in_cluster(c, NULL, err, errlen);
    const char *home = getenv("HOME");
    char file[PATH_MAX];
    if (!home || !*home)
        return pl_errf(err, errlen, "no kubeconfig: none given, KUBECONFIG, "
                                    "KUBERNETES_SERVICE_HOST and HOME are all unset");
    if (pl_pathf(file, sizeof file, err, errlen, "%s/.kube/config", home)) return -1;
    return pl_kube_config_load_file(c, file, NULL, err, errlen);
}

void pl_kube_config_free(pl_kube_config *c)
{
    free(c->server);
    free(c->ca_file);
    free(c->ca.data);
    free(c->cert_file);
    free(c->cert.data);
    free(c->key_file);
    free(c->key.data);
    free(c->namespace_);
    free(c->token_file);
    free(c->token_);
    if (c->has_lock_) pthread_mutex_destroy(&c->lock_);
    memset(c, 0, sizeof *c);
}
