/* A small YAML loader on libyaml that builds a typed tree with line numbers, for
 * manifests (yaml_tree.h). */
#include "yaml_tree.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#include "util.h"

#define MAX_DEPTH 64
#define PATH_CAP 512

#define TAG_PREFIX "tag:yaml.org,2002:"

typedef struct {
    yaml_parser_t parser;
    char *err;
    size_t errlen;
    char path[PATH_CAP]; /* dotted path of the node being loaded */
} loader;

static int oom(loader *L)
{
    return pl_errf(L->err, L->errlen, "out of memory while loading YAML");
}

static int parser_error(loader *L)
{
    const yaml_parser_t *p = &L->parser;
    const char *problem = p->problem ? p->problem : "invalid YAML";
    if (p->error == YAML_MEMORY_ERROR) return oom(L);
    if (p->error == YAML_READER_ERROR)
        return pl_errf(L->err, L->errlen, "byte offset %zu: %s", p->problem_offset, problem);
    if (p->context)
        return pl_errf(L->err, L->errlen, "line %zu, column %zu: %s (%s at line %zu, column %zu)",
                       p->problem_mark.line + 1, p->problem_mark.column + 1, problem, p->context,
                       p->context_mark.line + 1, p->context_mark.column + 1);
    return pl_errf(L->err, L->errlen, "line %zu, column %zu: %s", p->problem_mark.line + 1,
                   p->problem_mark.column + 1, problem);
}

static int next_event(loader *L, yaml_event_t *ev)
{
    if (!yaml_parser_parse(&L->parser, ev)) return parser_error(L);
    return 0;
}

static int at(const yaml_event_t *ev, int *line, int *col)
{
    *line = (int)ev->start_mark.line + 1;
    *col = (int)ev->start_mark.column + 1;
    return 0;
}

static int text_is(const char *s, size_t n, const char *lit)
{
    return strlen(lit) == n && memcmp(s, lit, n) == 0;
}

static int is_digit_in(char c, int base)
{
    if (base == 16) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    if (base == 8) return c >= '0' && c <= '7';
    return c >= '0' && c <= '9';
}

/* YAML 1.2 core schema integer: [-+]?[0-9]+ | 0o[0-7]+ | 0x[0-9a-fA-F]+ */
static int looks_int(const char *s, size_t n)
{
    size_t i = 0;
    int base = 10;
    if (n >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'o')) {
        base = s[1] == 'x' ? 16 : 8;
        i = 2;
    } else if (n && (s[0] == '-' || s[0] == '+')) {
        i = 1;
    }
    if (i == n) return 0;
    for (; i < n; i++)
        if (!is_digit_in(s[i], base)) return 0;
    return 1;
}

/* [-+]? ( \. [0-9]+ | [0-9]+ ( \. [0-9]* )? ) ( [eE] [-+]? [0-9]+ )?  and .inf/.nan */
static int looks_float(const char *s, size_t n)
{
    size_t i = 0;
    if (n && (s[0] == '-' || s[0] == '+')) i = 1;
    const char *r = s + i;
    size_t rn = n - i;
    if (text_is(r, rn, ".inf") || text_is(r, rn, ".Inf") || text_is(r, rn, ".INF")) return 1;
    if (i == 0 && (text_is(s, n, ".nan") || text_is(s, n, ".NaN") || text_is(s, n, ".NAN")))
        return 1;
    size_t digits = 0;
    while (i < n && is_digit_in(s[i], 10)) i++, digits++;
    if (i < n && s[i] == '.') {
        i++;
        while (i < n && is_digit_in(s[i], 10)) i++, digits++;
    }
    if (!digits) return 0;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '-' || s[i] == '+')) i++;
        size_t exp = 0;
        while (i < n && is_digit_in(s[i], 10)) i++, exp++;
        if (!exp) return 0;
    }
    return i == n;
}

static pl_ytype resolve_plain(const char *s, size_t n, int *boolean)
{
    if (n == 0 || text_is(s, n, "~") || text_is(s, n, "null") || text_is(s, n, "Null") ||
        text_is(s, n, "NULL"))
        return PL_Y_NULL;
    if (text_is(s, n, "true") || text_is(s, n, "True") || text_is(s, n, "TRUE")) {
        *boolean = 1;
        return PL_Y_BOOL;
    }
    if (text_is(s, n, "false") || text_is(s, n, "False") || text_is(s, n, "FALSE")) {
        *boolean = 0;
        return PL_Y_BOOL;
    }
    if (looks_int(s, n)) return PL_Y_INT;
    if (looks_float(s, n)) return PL_Y_FLOAT;
    return PL_Y_STR;
}

/* Types a scalar from its style and tag; -1 with an error for a tag we do not
 * know or a value that does not match its tag. */
static int resolve_scalar(loader *L, const yaml_event_t *ev, pl_ynode *n)
{
    const char *tag = (const char *)ev->data.scalar.tag;
    int plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
    if (!tag) {
        n->type = plain ? resolve_plain(n->str, n->len, &n->boolean) : PL_Y_STR;
        return 0;
    }
    if (strcmp(tag, "!") == 0 || strcmp(tag, TAG_PREFIX "str") == 0) {
        n->type = PL_Y_STR;
        return 0;
    }
    int b = 0;
    pl_ytype got = resolve_plain(n->str, n->len, &b);
    const char *name = strncmp(tag, TAG_PREFIX, strlen(TAG_PREFIX)) == 0 ? tag + strlen(TAG_PREFIX) : NULL;
    if (name && strcmp(name, "int") == 0 && got == PL_Y_INT) {
        n->type = PL_Y_INT;
    } else if (name && strcmp(name, "float") == 0 && (got == PL_Y_INT || got == PL_Y_FLOAT)) {
        n->type = got;
    } else if (name && strcmp(name, "bool") == 0 && got == PL_Y_BOOL) {
        n->type = PL_Y_BOOL;
        n->boolean = b;
    } else if (name && strcmp(name, "null") == 0 && got == PL_Y_NULL) {
        n->type = PL_Y_NULL;
    } else if (name && (strcmp(name, "int") == 0 || strcmp(name, "float") == 0 ||
                        strcmp(name, "bool") == 0 || strcmp(name, "null") == 0)) {
        return pl_errf(L->err, L->errlen, "line %d, column %d: \"%.40s\" is not a valid !!%s", n->line,
                       n->col, n->str, name);
    } else {
        return pl_errf(L->err, L->errlen, "line %d, column %d: unsupported tag %.60s", n->line, n->col,
                       tag);
    }
    return 0;
}

static int check_collection_tag(loader *L, const yaml_event_t *ev, const char *tag, const char *want)
{
    if (!tag || strcmp(tag, "!") == 0 || strcmp(tag, want) == 0) return 0;
    int line, col;
    at(ev, &line, &col);
    return pl_errf(L->err, L->errlen, "line %d, column %d: unsupported tag %.60s", line, col, tag);
}

void pl_yaml_free(pl_ynode *n)
{
    if (!n) return;
    for (size_t i = 0; i < n->n; i++) {
        pl_yaml_free(n->kids[i]);
        if (n->keys) free(n->keys[i]);
    }
    free(n->kids);
    free(n->keys);
    free(n->key_lines);
    free(n->str);
    free(n);
}

static int push_kid(pl_ynode *parent, pl_ynode *kid, char *key, int key_line)
{
    if (parent->n == parent->cap) {
        size_t cap = parent->cap ? parent->cap * 2 : 8;
        pl_ynode **kids = realloc(parent->kids, cap * sizeof *kids);
        if (!kids) return -1;
        parent->kids = kids;
        if (parent->type == PL_Y_MAP) {
            char **keys = realloc(parent->keys, cap * sizeof *keys);
            if (!keys) return -1;
            parent->keys = keys;
            int *lines = realloc(parent->key_lines, cap * sizeof *lines);
            if (!lines) return -1;
            parent->key_lines = lines;
        }
        parent->cap = cap;
    }
    parent->kids[parent->n] = kid;
    if (parent->type == PL_Y_MAP) {
        parent->keys[parent->n] = key;
        parent->key_lines[parent->n] = key_line;
    }
    parent->n++;
    return 0;
}

/* Appends ".key" or "[i]" to L->path; returns the old length to restore. */
static size_t path_push(loader *L, const char *fmt_key, size_t index, int is_index)
{
    size_t old = strlen(L->path);
    if (old < PATH_CAP - 1) {
        if (is_index)
            snprintf(L->path + old, PATH_CAP - old, "[%zu]", index);
        else
            snprintf(L->path + old, PATH_CAP - old, "%s%s", old ? "." : "", fmt_key);
    }
    return old;
}

static pl_ynode *load_node(loader *L, yaml_event_t *ev, int depth);

/* Reads a mapping's next key into *key (malloc'd, *klen bytes) at line *kline: 0, 1 at the
 * mapping's end, or -1 with an error. */
static int next_key(loader *L, char **key, size_t *klen, int *kline)
{
    yaml_event_t kev;
    if (next_event(L, &kev)) return -1;
    if (kev.type == YAML_MAPPING_END_EVENT) {
        yaml_event_delete(&kev);
        return 1;
    }
    int kcol;
    at(&kev, kline, &kcol);
    if (kev.type == YAML_ALIAS_EVENT) {
        yaml_event_delete(&kev);
        return pl_errf(L->err, L->errlen, "line %d, column %d: YAML aliases are not supported", *kline,
                       kcol);
    }
    if (kev.type != YAML_SCALAR_EVENT) {
        yaml_event_delete(&kev);
        return pl_errf(L->err, L->errlen, "line %d, column %d: mapping keys must be scalars", *kline,
                       kcol);
    }
    *klen = kev.data.scalar.length;
    *key = malloc(*klen + 1);
    if (!*key) {
        yaml_event_delete(&kev);
        return oom(L);
    }
    memcpy(*key, kev.data.scalar.value, *klen);
    (*key)[*klen] = '\0';
    yaml_event_delete(&kev);
    return 0;
}

/* A key may appear once per mapping; the error names its path and both lines. */
static int check_unique_key(loader *L, const pl_ynode *map, const char *key, size_t klen,
                            int kline)
{
    for (size_t i = 0; i < map->n; i++) {
        if (strlen(map->keys[i]) == klen && memcmp(map->keys[i], key, klen) == 0) {
            size_t old = path_push(L, key, 0, 0);
            pl_errf(L->err, L->errlen, "%s: duplicate key (line %d; first at line %d)", L->path, kline,
                    map->key_lines[i]);
            L->path[old] = '\0';
            return -1;
        }
    }
    return 0;
}

/* Loads the rest of a mapping after its MAPPING_START. */
static int load_mapping(loader *L, pl_ynode *map, int depth)
{
    for (;;) {
        char *key = NULL;
        size_t klen = 0;
        int kline = 0;
        int r = next_key(L, &key, &klen, &kline);
        if (r) return r > 0 ? 0 : -1;
        if (check_unique_key(L, map, key, klen, kline)) {
            free(key);
            return -1;
        }
        size_t old = path_push(L, key, 0, 0);
        yaml_event_t vev;
        if (next_event(L, &vev)) {
            free(key);
            return -1;
        }
        pl_ynode *val = load_node(L, &vev, depth + 1);
        L->path[old] = '\0';
        if (!val) {
            free(key);
            return -1;
        }
        if (push_kid(map, val, key, kline)) {
            pl_yaml_free(val);
            free(key);
            return oom(L);
        }
    }
}

static int load_sequence(loader *L, pl_ynode *seq, int depth)
{
    for (;;) {
        yaml_event_t ev;
        if (next_event(L, &ev)) return -1;
        if (ev.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&ev);
            return 0;
        }
        size_t old = path_push(L, NULL, seq->n, 1);
        pl_ynode *item = load_node(L, &ev, depth + 1);
        L->path[old] = '\0';
        if (!item) return -1;
        if (push_kid(seq, item, NULL, 0)) {
            pl_yaml_free(item);
            return oom(L);
        }
    }
}

/* A new node at *ev's position, or NULL (with *ev consumed and an error) when it nests too
 * deep or is an alias. */
static pl_ynode *new_node(loader *L, yaml_event_t *ev, int depth)
{
    int line, col;
    at(ev, &line, &col);
    if (depth > MAX_DEPTH) {
        yaml_event_delete(ev);
        pl_errf(L->err, L->errlen, "line %d, column %d: nested deeper than %d levels", line, col, MAX_DEPTH);
        return NULL;
    }
    if (ev->type == YAML_ALIAS_EVENT) {
        yaml_event_delete(ev);
        pl_errf(L->err, L->errlen, "line %d, column %d: YAML aliases are not supported", line, col);
        return NULL;
    }
    pl_ynode *n = pl_calloc(1, sizeof *n);
    if (!n) {
        yaml_event_delete(ev);
        oom(L);
        return NULL;
    }
    n->line = line;
    n->col = col;
    return n;
}

/* Copies a scalar's text into n and resolves its type; consumes *ev. */
static int load_scalar(loader *L, yaml_event_t *ev, pl_ynode *n)
{
    n->len = ev->data.scalar.length;
    n->str = malloc(n->len + 1);
    if (!n->str) {
        yaml_event_delete(ev);
        return oom(L);
    }
    memcpy(n->str, ev->data.scalar.value, n->len);
    n->str[n->len] = '\0';
    int rc = resolve_scalar(L, ev, n);
    yaml_event_delete(ev);
    return rc;
}

/* Loads the node that starts with *ev (consumed). */
static pl_ynode *load_node(loader *L, yaml_event_t *ev, int depth)
{
    pl_ynode *n = new_node(L, ev, depth);
    if (!n) return NULL;
    int rc = 0;
    switch (ev->type) {
    case YAML_SCALAR_EVENT:
        rc = load_scalar(L, ev, n);
        break;
    case YAML_SEQUENCE_START_EVENT:
        n->type = PL_Y_SEQ;
        rc = check_collection_tag(L, ev, (const char *)ev->data.sequence_start.tag, TAG_PREFIX "seq");
        yaml_event_delete(ev);
        if (!rc) rc = load_sequence(L, n, depth);
        break;
    case YAML_MAPPING_START_EVENT:
        n->type = PL_Y_MAP;
        rc = check_collection_tag(L, ev, (const char *)ev->data.mapping_start.tag, TAG_PREFIX "map");
        yaml_event_delete(ev);
        if (!rc) rc = load_mapping(L, n, depth);
        break;
    default:
        yaml_event_delete(ev);
        rc = pl_errf(L->err, L->errlen, "line %d, column %d: unexpected YAML event", n->line, n->col);
        break;
    }
    if (rc) {
        pl_yaml_free(n);
        return NULL;
    }
    return n;
}

/* Expects an event of type want; -1 with an error otherwise. */
static int expect(loader *L, yaml_event_type_t want, const char *what)
{
    yaml_event_t ev;
    if (next_event(L, &ev)) return -1;
    yaml_event_type_t got = ev.type;
    int line, col;
    at(&ev, &line, &col);
    yaml_event_delete(&ev);
    if (got == want) return 0;
    if (got == YAML_DOCUMENT_START_EVENT)
        return pl_errf(L->err, L->errlen, "line %d: only one YAML document is allowed", line);
    return pl_errf(L->err, L->errlen, "line %d, column %d: expected %s", line, col, what);
}

pl_ynode *pl_yaml_load(const char *text, size_t len, char *err, size_t errlen)
{
    loader L;
    memset(&L, 0, sizeof L);
    L.err = err;
    L.errlen = errlen;
    if (!yaml_parser_initialize(&L.parser)) {
        oom(&L);
        return NULL;
    }
    yaml_parser_set_input_string(&L.parser, (const unsigned char *)text, len);
    yaml_parser_set_encoding(&L.parser, YAML_UTF8_ENCODING);

    pl_ynode *root = NULL;
    yaml_event_t ev;
    if (expect(&L, YAML_STREAM_START_EVENT, "the start of the stream")) goto done;
    if (next_event(&L, &ev)) goto done;
    if (ev.type == YAML_STREAM_END_EVENT) {
        yaml_event_delete(&ev);
        pl_errf(err, errlen, "the manifest is empty");
        goto done;
    }
    if (ev.type != YAML_DOCUMENT_START_EVENT) {
        yaml_event_delete(&ev);
        pl_errf(err, errlen, "expected a YAML document");
        goto done;
    }
    yaml_event_delete(&ev);
    if (next_event(&L, &ev)) goto done;
    root = load_node(&L, &ev, 0);
    if (!root) goto done;
    if (expect(&L, YAML_DOCUMENT_END_EVENT, "the end of the document") ||
        expect(&L, YAML_STREAM_END_EVENT, "the end of the stream")) {
        pl_yaml_free(root);
        root = NULL;
    }
done:
    yaml_parser_delete(&L.parser);
    return root;
}

const pl_ynode *pl_yaml_get(const pl_ynode *map, const char *key)
{
    if (!map || map->type != PL_Y_MAP) return NULL;
    for (size_t i = 0; i < map->n; i++)
        if (strcmp(map->keys[i], key) == 0) return map->kids[i];
    return NULL;
}

const char *pl_yaml_type_name(pl_ytype t)
{
    switch (t) {
    case PL_Y_NULL: return "null";
    case PL_Y_BOOL: return "a boolean";
    case PL_Y_INT: return "an integer";
    case PL_Y_FLOAT: return "a number";
    case PL_Y_STR: return "a string";
    case PL_Y_SEQ: return "a list";
    case PL_Y_MAP: return "a mapping";
    }
    return "?";
}

int pl_yaml_int(const pl_ynode *n, int *negative, uint64_t *magnitude)
{
    if (!n || n->type != PL_Y_INT) return -1;
    const char *s = n->str;
    int base = 10, neg = 0;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'o')) {
        base = s[1] == 'x' ? 16 : 8;
        s += 2;
    } else if (s[0] == '-' || s[0] == '+') {
        neg = s[0] == '-';
        s++;
    }
    uint64_t v = 0;
    for (; *s; s++) {
        unsigned d = (*s >= '0' && *s <= '9') ? (unsigned)(*s - '0')
                     : (*s >= 'a' && *s <= 'f') ? (unsigned)(*s - 'a' + 10)
                                                : (unsigned)(*s - 'A' + 10);
        if (v > (UINT64_MAX - d) / (uint64_t)base) return -1;
        v = v * (uint64_t)base + d;
    }
    *negative = neg && v != 0;
    *magnitude = v;
    return 0;
}

int pl_yaml_number(const pl_ynode *n, double *out)
{
    if (!n) return -1;
    if (n->type == PL_Y_INT) {
        int neg;
        uint64_t mag;
        if (pl_yaml_int(n, &neg, &mag)) { /* beyond 64 bits */
            int hex_or_octal = n->str[0] == '0' && (n->str[1] == 'x' || n->str[1] == 'o');
            *out = hex_or_octal ? HUGE_VAL : strtod(n->str, NULL);
            return 0;
        }
        *out = neg ? -(double)mag : (double)mag;
        return 0;
    }
    if (n->type != PL_Y_FLOAT) return -1;
    const char *s = n->str;
    double sign = 1.0;
    if (s[0] == '-' || s[0] == '+') {
        sign = s[0] == '-' ? -1.0 : 1.0;
        s++;
    }
    if (s[0] == '.' && (s[1] == 'i' || s[1] == 'I')) {
        *out = sign * HUGE_VAL;
        return 0;
    }
    if (s[0] == '.' && (s[1] == 'n' || s[1] == 'N')) {
        *out = NAN;
        return 0;
    }
    *out = sign * strtod(s, NULL);
    return 0;
}

cJSON *pl_yaml_to_cjson(const pl_ynode *n, const char *path, char *err, size_t errlen)
{
    cJSON *out = NULL;
    switch (n->type) {
    case PL_Y_NULL: out = cJSON_CreateNull(); break;
    case PL_Y_BOOL: out = cJSON_CreateBool(n->boolean); break;
    case PL_Y_STR: out = cJSON_CreateString(n->str); break;
    case PL_Y_INT:
    case PL_Y_FLOAT: {
        double v = 0;
        pl_yaml_number(n, &v);
        if (!isfinite(v)) {
            pl_errf(err, errlen, "%s: %.40s is not a finite number", path, n->str);
            return NULL;
        }
        out = cJSON_CreateNumber(v);
        break;
    }
    case PL_Y_SEQ:
    case PL_Y_MAP: {
        out = n->type == PL_Y_SEQ ? cJSON_CreateArray() : cJSON_CreateObject();
        if (!out) break;
        for (size_t i = 0; i < n->n; i++) {
            char sub[PATH_CAP];
            if (n->type == PL_Y_SEQ)
                snprintf(sub, sizeof sub, "%s[%zu]", path, i);
            else
                snprintf(sub, sizeof sub, "%s.%s", path, n->keys[i]);
            cJSON *kid = pl_yaml_to_cjson(n->kids[i], sub, err, errlen);
            if (!kid) {
                cJSON_Delete(out);
                return NULL;
            }
            cJSON_bool added = n->type == PL_Y_SEQ ? cJSON_AddItemToArray(out, kid)
                                                   : cJSON_AddItemToObject(out, n->keys[i], kid);
            if (!added) {
                cJSON_Delete(kid);
                cJSON_Delete(out);
                out = NULL;
                break;
            }
        }
        break;
    }
    }
    if (!out) pl_errf(err, errlen, "%s: out of memory", path);
    return out;
}
