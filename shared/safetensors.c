/* safetensors files: the atomic writer and the strict, mmap-backed reader (format and
 * checks in safetensors.h). */
#include "safetensors.h"

#include "json_num.h"
#include "util.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this code maps it directly"
#endif

static const struct {
    const char *name;
    size_t size;
} dtypes[PL_ST_NDTYPES] = {
    [PL_ST_BOOL] = {"BOOL", 1},     [PL_ST_U8] = {"U8", 1},
    [PL_ST_I8] = {"I8", 1},         [PL_ST_F8_E4M3] = {"F8_E4M3", 1},
    [PL_ST_F8_E5M2] = {"F8_E5M2", 1}, [PL_ST_I16] = {"I16", 2},
    [PL_ST_U16] = {"U16", 2},       [PL_ST_F16] = {"F16", 2},
    [PL_ST_BF16] = {"BF16", 2},     [PL_ST_I32] = {"I32", 4},
    [PL_ST_U32] = {"U32", 4},       [PL_ST_F32] = {"F32", 4},
    [PL_ST_I64] = {"I64", 8},       [PL_ST_U64] = {"U64", 8},
    [PL_ST_F64] = {"F64", 8},
};

const char *pl_st_dtype_name(pl_st_dtype d)
{
    return ((int)d >= 0 && d < PL_ST_NDTYPES) ? dtypes[d].name : NULL;
}

size_t pl_st_dtype_size(pl_st_dtype d)
{
    return ((int)d >= 0 && d < PL_ST_NDTYPES) ? dtypes[d].size : 0;
}

int pl_st_dtype_parse(const char *name)
{
    for (int i = 0; name && i < PL_ST_NDTYPES; i++)
        if (strcmp(name, dtypes[i].name) == 0) return i;
    return -1;
}

/* "[2, 3]" into buf. */
static const char *shape_str(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t used = 0;
    used += (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (used < len) snprintf(buf + used, len - used, "]");
    return buf;
}


/* ---- writer --------------------------------------------------------------- */

typedef struct {
    char *name;
    pl_st_dtype dtype;
    int ndim;
    int64_t shape[PL_ST_MAX_DIMS];
    size_t nbytes;
    const void *data;
} wtensor;

struct pl_st_writer {
    wtensor *t;
    int n, cap;
    char **keys, **values;
    int nmeta, capmeta;
};

pl_st_writer *pl_st_writer_new(void)
{
    return pl_calloc(1, sizeof(pl_st_writer));
}

void pl_st_writer_free(pl_st_writer *w)
{
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->t[i].name);
    for (int i = 0; i < w->nmeta; i++) {
        free(w->keys[i]);
        free(w->values[i]);
    }
    free(w->t);
    free(w->keys);
    free(w->values);
    free(w);
}

int pl_st_writer_add(pl_st_writer *w, const char *name, pl_st_dtype dtype, int ndim,
                     const int64_t *shape, const void *data, char *err, size_t errlen)
{
    if (!name || !*name) return pl_errf(err, errlen, "safetensors: empty tensor name");
    if (strcmp(name, "__metadata__") == 0)
        return pl_errf(err, errlen, "tensor \"%s\": reserved name", name);
    size_t esize = pl_st_dtype_size(dtype);
    if (!esize) return pl_errf(err, errlen, "tensor \"%s\": invalid dtype %d", name, (int)dtype);
    if (ndim < 0 || ndim > PL_ST_MAX_DIMS)
        return pl_errf(err, errlen, "tensor \"%s\": %d dimensions (at most %d)", name, ndim,
                       PL_ST_MAX_DIMS);
    size_t nbytes = esize;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return pl_errf(err, errlen, "tensor \"%s\": negative dimension %" PRId64, name,
                           shape[i]);
        if (shape[i] && nbytes > SIZE_MAX / (uint64_t)shape[i])
            return pl_errf(err, errlen, "tensor \"%s\": too large", name);
        nbytes *= (size_t)shape[i];
    }
    if (nbytes && !data) return pl_errf(err, errlen, "tensor \"%s\": no data", name);
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return pl_errf(err, errlen, "tensor \"%s\": added twice", name);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 16;
        wtensor *grown = realloc(w->t, (size_t)cap * sizeof *grown);
        if (!grown) return pl_errf(err, errlen, "tensor \"%s\": out of memory", name);
        w->t = grown;
        w->cap = cap;
    }
    wtensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name) return pl_errf(err, errlen, "tensor \"%s\": out of memory", name);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->nbytes = nbytes;
    t->data = data;
    w->n++;
    return 0;
}

int pl_st_writer_meta(pl_st_writer *w, const char *key, const char *value, char *err,
                      size_t errlen)
{
    if (!key || !value) return pl_errf(err, errlen, "safetensors metadata: NULL key or value");
    for (int i = 0; i < w->nmeta; i++)
        if (strcmp(w->keys[i], key) == 0)
            return pl_errf(err, errlen, "metadata \"%s\": added twice", key);
    if (w->nmeta == w->capmeta) {
        int cap = w->capmeta ? 2 * w->capmeta : 8;
        char **k = realloc(w->keys, (size_t)cap * sizeof *k);
        if (!k) return pl_errf(err, errlen, "metadata \"%s\": out of memory", key);
        w->keys = k;
        char **v = realloc(w->values, (size_t)cap * sizeof *v);
        if (!v) return pl_errf(err, errlen, "metadata \"%s\": out of memory", key);
        w->values = v;
        w->capmeta = cap;
    }
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return pl_errf(err, errlen, "metadata \"%s\": out of memory", key);
    }
    w->keys[w->nmeta] = k;
    w->values[w->nmeta] = v;
    w->nmeta++;
    return 0;
}

static cJSON *raw_uint(uint64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    return cJSON_CreateRaw(buf);
}

int pl_st_write(const pl_st_writer *w, const char *path, char *err, size_t errlen)
{
    return pl_st_write_mode(w, path, 0666, err, errlen);
}

int pl_st_write_mode(const pl_st_writer *w, const char *path, mode_t mode, char *err,
                     size_t errlen)
{
    int rc = -1;
    int *order = pl_calloc((size_t)w->n, sizeof *order);
    pl_piece *pieces = pl_calloc((size_t)w->n + 1, sizeof *pieces);
    cJSON *root = cJSON_CreateObject();
    char *json = NULL, *header = NULL;
    if (!order || !pieces || !root) goto oom;

    /* Layout: decreasing element size, insertion order within a size. */
    int k = 0;
    for (size_t size = 8; size >= 1; size /= 2)
        for (int i = 0; i < w->n; i++)
            if (pl_st_dtype_size(w->t[i].dtype) == size) order[k++] = i;

    if (w->nmeta) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        if (!meta) goto oom;
        for (int i = 0; i < w->nmeta; i++)
            if (!cJSON_AddStringToObject(meta, w->keys[i], w->values[i])) goto oom;
    }
    uint64_t offset = 0;
    for (int o = 0; o < w->n; o++) {
        const wtensor *t = &w->t[order[o]];
        cJSON *obj = cJSON_CreateObject();
        if (!obj) goto oom;
        cJSON_AddItemToObject(root, t->name, obj);
        if (!cJSON_AddStringToObject(obj, "dtype", pl_st_dtype_name(t->dtype))) goto oom;
        cJSON *shape = cJSON_AddArrayToObject(obj, "shape");
        cJSON *offs = cJSON_AddArrayToObject(obj, "data_offsets");
        if (!shape || !offs) goto oom;
        for (int d = 0; d < t->ndim; d++) {
            cJSON *v = raw_uint((uint64_t)t->shape[d]);
            if (!v) goto oom;
            cJSON_AddItemToArray(shape, v);
        }
        cJSON *b = raw_uint(offset), *e = raw_uint(offset + t->nbytes);
        if (!b || !e) {
            cJSON_Delete(b);
            cJSON_Delete(e);
            goto oom;
        }
        cJSON_AddItemToArray(offs, b);
        cJSON_AddItemToArray(offs, e);
        pieces[1 + o].data = t->data;
        pieces[1 + o].len = t->nbytes;
        offset += t->nbytes;
    }
    json = cJSON_PrintUnformatted(root);
    if (!json) goto oom;
    size_t jlen = strlen(json);
    size_t hlen = (jlen + 7) / 8 * 8;
    if (hlen > PL_ST_MAX_HEADER) {
        pl_errf(err, errlen, "%s: header of %zu bytes exceeds the %d-byte limit", path, hlen,
                PL_ST_MAX_HEADER);
        goto done;
    }
    header = malloc(hlen + 8);
    if (!header) goto oom;
    for (int i = 0; i < 8; i++) header[i] = (char)(((uint64_t)hlen >> (8 * i)) & 0xff);
    memcpy(header + 8, json, jlen);
    memset(header + 8 + jlen, ' ', hlen - jlen);
    pieces[0].data = header;
    pieces[0].len = hlen + 8;
    rc = pl_write_atomic_mode(path, pieces, w->n + 1, mode, err, errlen);
    goto done;
oom:
    pl_errf(err, errlen, "%s: out of memory", path);
done:
    free(order);
    free(pieces);
    cJSON_Delete(root);
    free(json);
    free(header);
    return rc;
}

/* ---- reader --------------------------------------------------------------- */

void pl_st_close(pl_st_file *f)
{
    if (!f) return;
    if (f->map && f->map != MAP_FAILED && !f->borrowed_) munmap(f->map, f->map_len);
    for (int i = 0; i < f->ntensors; i++) free(f->tensors[i].name);
    for (int i = 0; i < f->nmeta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->tensors);
    free(f->meta_keys);
    free(f->meta_values);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* A non-negative integer JSON number (exact in a double); the caller names the field. */
static int json_uint(const cJSON *v, uint64_t *out)
{
    int64_t x;
    if (pl_json_int(v, "", 0, PL_JSON_INT_MAX, &x, NULL, 0)) return -1;
    *out = (uint64_t)x;
    return 0;
}

typedef struct {
    uint64_t begin, end;
    int index;
} span;

static int span_cmp(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->index - y->index;
}

static int str_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Returns the first duplicate among n strings, or NULL. */
static const char *find_duplicate(char **s, int n)
{
    if (n < 2) return NULL;
    char **sorted = malloc((size_t)n * sizeof *sorted);
    if (!sorted) return NULL;
    memcpy(sorted, s, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, str_cmp);
    const char *dup = NULL;
    for (int i = 1; i < n && !dup; i++)
        if (strcmp(sorted[i - 1], sorted[i]) == 0) dup = sorted[i];
    free(sorted);
    return dup;
}

static int parse_tensor(const char *path, const cJSON *item, uint64_t data_len, pl_st_tensor *t,
                        uint64_t *begin, uint64_t *end, char *err, size_t errlen)
{
    const char *name = item->string;
    if (!cJSON_IsObject(item))
        return pl_errf(err, errlen, "%s: tensor \"%s\": entry is not an object", path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dt))
        return pl_errf(err, errlen, "%s: tensor \"%s\": missing or non-string \"dtype\"", path,
                       name);
    int d = pl_st_dtype_parse(dt->valuestring);
    if (d < 0)
        return pl_errf(err, errlen, "%s: tensor \"%s\": unsupported dtype \"%s\"", path, name,
                       dt->valuestring);
    t->dtype = (pl_st_dtype)d;
    if (!cJSON_IsArray(shape))
        return pl_errf(err, errlen, "%s: tensor \"%s\": missing or non-array \"shape\"", path,
                       name);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > PL_ST_MAX_DIMS)
        return pl_errf(err, errlen, "%s: tensor \"%s\": %d dimensions (at most %d supported)",
                       path, name, ndim, PL_ST_MAX_DIMS);
    t->ndim = ndim;
    uint64_t nelem = 1;
    int overflow = 0;
    for (int i = 0; i < ndim; i++) {
        uint64_t v;
        if (json_uint(cJSON_GetArrayItem(shape, i), &v) != 0)
            return pl_errf(err, errlen,
                           "%s: tensor \"%s\": shape[%d] is not a non-negative integer", path,
                           name, i);
        t->shape[i] = (int64_t)v;
        if (v && nelem > UINT64_MAX / 16 / v) overflow = 1;
        else nelem *= v;
    }
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        json_uint(cJSON_GetArrayItem(offs, 0), begin) != 0 ||
        json_uint(cJSON_GetArrayItem(offs, 1), end) != 0)
        return pl_errf(err, errlen,
                       "%s: tensor \"%s\": \"data_offsets\" must be [begin, end] with "
                       "non-negative integers",
                       path, name);
    if (*begin > *end)
        return pl_errf(err, errlen, "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
                       "] has begin after end", path, name, *begin, *end);
    if (*end > data_len)
        return pl_errf(err, errlen,
                       "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
                       "] run past the end of the data section (%" PRIu64 " bytes)",
                       path, name, *begin, *end, data_len);
    char sb[256];
    uint64_t esize = pl_st_dtype_size(t->dtype);
    if (overflow || nelem * esize != *end - *begin)
        return pl_errf(err, errlen,
                       "%s: tensor \"%s\": shape %s of %s needs %s%" PRIu64
                       " bytes but data_offsets [%" PRIu64 ", %" PRIu64 "] span %" PRIu64,
                       path, name, shape_str(sb, sizeof sb, ndim, t->shape), dt->valuestring,
                       overflow ? "more than " : "", overflow ? UINT64_MAX / 16 : nelem * esize,
                       *begin, *end, *end - *begin);
    t->nelem = (int64_t)nelem;
    t->nbytes = (size_t)(nelem * esize);
    return 0;
}

/* Maps the file read-only into f (map, map_len, path). On failure f may hold
 * the mapping; the caller releases it with pl_st_close. */
static int map_file(const char *path, pl_st_file *f, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return pl_errf(err, errlen, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return pl_errf(err, errlen, "%s: not a readable regular file", path);
    }
    if (st.st_size < 8) {
        close(fd);
        return pl_errf(err, errlen,
                       "%s: file is %lld bytes, too short for the 8-byte header length", path,
                       (long long)st.st_size);
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return pl_errf(err, errlen, "%s: mmap: %s", path, strerror(e));
    f->map = map;
    f->map_len = size;
    f->path = strdup(path);
    if (!f->path) return pl_errf(err, errlen, "%s: out of memory", path);
    return 0;
}

/* The little-endian header length, checked against the file; then the JSON
 * object it frames (only whitespace may pad it). */
static cJSON *parse_header(const char *path, const pl_st_file *f, uint64_t *hlen_out,
                           char *err, size_t errlen)
{
    const unsigned char *bytes = f->map;
    size_t size = f->map_len;
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)bytes[i] << (8 * i);
    if (hlen < 2) {
        pl_errf(err, errlen, "%s: header length %" PRIu64 " is too small for a JSON object",
                path, hlen);
        return NULL;
    }
    if (hlen > PL_ST_MAX_HEADER) {
        pl_errf(err, errlen, "%s: header length %" PRIu64 " exceeds the %d-byte limit", path,
                hlen, PL_ST_MAX_HEADER);
        return NULL;
    }
    if (hlen > size - 8) {
        pl_errf(err, errlen,
                "%s: header length %" PRIu64 " runs past the end of the file (%zu bytes)", path,
                hlen, size);
        return NULL;
    }
    const char *hdr = (const char *)bytes + 8;
    if (hdr[0] != '{') {
        pl_errf(err, errlen, "%s: header does not start with '{'", path);
        return NULL;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &end, 0);
    if (!root) {
        long at = (end && end >= hdr && end <= hdr + hlen) ? (long)(end - hdr) : -1;
        pl_errf(err, errlen, "%s: header is not valid JSON (error near byte %ld of %" PRIu64 ")",
                path, at, hlen);
        return NULL;
    }
    for (const char *p = end; p < hdr + hlen; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            pl_errf(err, errlen, "%s: header has trailing bytes after the JSON object (byte %ld)",
                    path, (long)(p - hdr));
            cJSON_Delete(root);
            return NULL;
        }
    }
    if (!cJSON_IsObject(root)) {
        pl_errf(err, errlen, "%s: header is not a JSON object", path);
        cJSON_Delete(root);
        return NULL;
    }
    *hlen_out = hlen;
    return root;
}

/* Copies the "__metadata__" object's string pairs into f. */
static int read_metadata(const char *path, const cJSON *meta, pl_st_file *f, char *err,
                         size_t errlen)
{
    if (!cJSON_IsObject(meta))
        return pl_errf(err, errlen, "%s: \"__metadata__\" is not an object", path);
    int nm = cJSON_GetArraySize(meta);
    f->meta_keys = pl_calloc((size_t)nm, sizeof(char *));
    f->meta_values = pl_calloc((size_t)nm, sizeof(char *));
    if (!f->meta_keys || !f->meta_values) return pl_errf(err, errlen, "%s: out of memory", path);
    for (const cJSON *it = meta->child; it; it = it->next) {
        if (!cJSON_IsString(it))
            return pl_errf(err, errlen, "%s: metadata \"%s\": value is not a string", path,
                           it->string);
        int i = f->nmeta;
        f->meta_keys[i] = strdup(it->string);
        f->meta_values[i] = strdup(it->valuestring);
        f->nmeta++;
        if (!f->meta_keys[i] || !f->meta_values[i])
            return pl_errf(err, errlen, "%s: out of memory", path);
    }
    const char *dup = find_duplicate(f->meta_keys, f->nmeta);
    if (dup) return pl_errf(err, errlen, "%s: metadata \"%s\" appears twice", path, dup);
    return 0;
}

/* Parses every entry but meta into f->tensors (nt of them) and spans[i], the
 * byte range of tensor i within the data section. */
static int read_tensors(const char *path, const cJSON *root, const cJSON *meta, int nt,
                        uint64_t hlen, pl_st_file *f, span *spans, char *err, size_t errlen)
{
    uint64_t data_len = f->map_len - 8 - hlen;
    const unsigned char *data = (const unsigned char *)f->map + 8 + hlen;
    f->tensors = pl_calloc((size_t)nt, sizeof *f->tensors);
    if (!f->tensors) return pl_errf(err, errlen, "%s: out of memory", path);
    for (const cJSON *it = root->child; it; it = it->next) {
        if (it == meta) continue;
        int i = f->ntensors;
        pl_st_tensor *t = &f->tensors[i];
        t->name = strdup(it->string);
        f->ntensors++;
        if (!t->name) return pl_errf(err, errlen, "%s: out of memory", path);
        if (parse_tensor(path, it, data_len, t, &spans[i].begin, &spans[i].end, err, errlen) !=
            0)
            return -1;
        spans[i].index = i;
        t->data = data + spans[i].begin;
    }
    char **names = pl_calloc((size_t)nt, sizeof *names);
    if (!names) return pl_errf(err, errlen, "%s: out of memory", path);
    for (int i = 0; i < nt; i++) names[i] = f->tensors[i].name;
    const char *dup = find_duplicate(names, nt);
    if (dup) pl_errf(err, errlen, "%s: tensor \"%s\" appears twice", path, dup);
    free(names);
    return dup ? -1 : 0;
}

/* The tensors' byte ranges must tile the data section exactly: no overlap, no
 * gap, nothing after the last. Sorts spans. */
static int check_tiling(const char *path, const pl_st_file *f, span *spans, int nt,
                        uint64_t data_len, char *err, size_t errlen)
{
    qsort(spans, (size_t)nt, sizeof *spans, span_cmp);
    uint64_t pos = 0;
    for (int i = 0; i < nt; i++) {
        const span *s = &spans[i];
        const char *name = f->tensors[s->index].name;
        if (s->begin < pos)
            return pl_errf(err, errlen,
                           "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
                           "] overlap tensor \"%s\" (ends at %" PRIu64 ")",
                           path, name, s->begin, s->end, f->tensors[spans[i - 1].index].name,
                           pos);
        if (s->begin > pos)
            return pl_errf(err, errlen,
                           "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
                           "] leave a gap of %" PRIu64 " bytes before it",
                           path, name, s->begin, s->end, s->begin - pos);
        pos = s->end;
    }
    if (pos != data_len)
        return pl_errf(err, errlen,
                       "%s: tensors cover %" PRIu64 " bytes but the data section has %" PRIu64
                       " (truncated or trailing data)",
                       path, pos, data_len);
    return 0;
}

/* Parses the header's entries: metadata, then tensors, then their layout. */
static int read_entries(const char *path, const cJSON *root, uint64_t hlen, pl_st_file *f,
                        char *err, size_t errlen)
{
    int nt = 0, nmeta_obj = 0;
    const cJSON *meta = NULL;
    for (const cJSON *it = root->child; it; it = it->next) {
        if (strcmp(it->string, "__metadata__") == 0) {
            meta = it;
            nmeta_obj++;
        } else {
            nt++;
        }
    }
    if (nmeta_obj > 1) return pl_errf(err, errlen, "%s: \"__metadata__\" appears twice", path);
    if (meta && read_metadata(path, meta, f, err, errlen) != 0) return -1;
    span *spans = pl_calloc((size_t)nt, sizeof *spans);
    if (!spans) return pl_errf(err, errlen, "%s: out of memory", path);
    int rc = read_tensors(path, root, meta, nt, hlen, f, spans, err, errlen);
    if (rc == 0) rc = check_tiling(path, f, spans, nt, f->map_len - 8 - hlen, err, errlen);
    free(spans);
    return rc;
}

/* The header and entries of the image in f->map. */
static int parse_image(const char *path, pl_st_file *f, char *err, size_t errlen)
{
    uint64_t hlen = 0;
    cJSON *root = parse_header(path, f, &hlen, err, errlen);
    if (!root || read_entries(path, root, hlen, f, err, errlen) != 0) {
        cJSON_Delete(root);
        pl_st_close(f);
        return -1;
    }
    cJSON_Delete(root);
    return 0;
}

int pl_st_open(const char *path, pl_st_file *f, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    if (map_file(path, f, err, errlen) != 0) {
        pl_st_close(f);
        return -1;
    }
    return parse_image(path, f, err, errlen);
}

int pl_st_parse(const void *bytes, size_t len, const char *name, pl_st_file *f, char *err,
                size_t errlen)
{
    memset(f, 0, sizeof *f);
    if (len < 8)
        return pl_errf(err, errlen, "%s: file is %zu bytes, too short for the 8-byte header "
                       "length", name, len);
    f->map = (void *)(uintptr_t)bytes;
    f->map_len = len;
    f->borrowed_ = 1;
    if (!(f->path = strdup(name))) {
        pl_st_close(f);
        return pl_errf(err, errlen, "%s: out of memory", name);
    }
    return parse_image(name, f, err, errlen);
}

const pl_st_tensor *pl_st_find(const pl_st_file *f, const char *name)
{
    for (int i = 0; i < f->ntensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const pl_st_tensor *pl_st_expect(const pl_st_file *f, const char *name, pl_st_dtype dtype,
                                 int ndim, const int64_t *shape, char *err, size_t errlen)
{
    const pl_st_tensor *t = pl_st_find(f, name);
    if (!t) {
        pl_errf(err, errlen, "%s: tensor \"%s\" missing", f->path, name);
        return NULL;
    }
    if (t->dtype != dtype) {
        pl_errf(err, errlen, "%s: tensor \"%s\" has dtype %s, expected %s", f->path, name,
                pl_st_dtype_name(t->dtype), pl_st_dtype_name(dtype) ? pl_st_dtype_name(dtype) : "?");
        return NULL;
    }
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char a[256], b[256];
        pl_errf(err, errlen, "%s: tensor \"%s\" has shape %s, expected %s", f->path, name,
                shape_str(a, sizeof a, t->ndim, t->shape),
                shape_str(b, sizeof b, ndim < 0 ? 0 : (ndim > PL_ST_MAX_DIMS ? PL_ST_MAX_DIMS : ndim), shape));
        return NULL;
    }
    return t;
}

const char *pl_st_meta(const pl_st_file *f, const char *key)
{
    for (int i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}
