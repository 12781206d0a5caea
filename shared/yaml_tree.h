/* A small YAML loader (libyaml) that builds a tree with line numbers, for
 * manifests. One document only; scalars are typed by the YAML 1.2 core schema
 * (plain `64` is an integer, `"64"` a string, `true` a boolean, `~` or an empty
 * value null). Duplicate keys, aliases, non-scalar keys, unknown tags and
 * multiple documents are errors. Since JSON is YAML, JSON text loads too. */
#ifndef PLIANT_YAML_TREE_H
#define PLIANT_YAML_TREE_H

#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

typedef enum {
    PL_Y_NULL,
    PL_Y_BOOL,
    PL_Y_INT,
    PL_Y_FLOAT,
    PL_Y_STR,
    PL_Y_SEQ,
    PL_Y_MAP,
} pl_ytype;

typedef struct pl_ynode {
    pl_ytype type;
    int line, col;          /* 1-based position of the node's start */
    char *str;              /* scalars: the text, NUL-terminated (may hold NULs) */
    size_t len;             /* scalars: the text's length */
    int boolean;            /* PL_Y_BOOL: 0 or 1 */
    size_t n;               /* SEQ: items; MAP: pairs */
    size_t cap;
    struct pl_ynode **kids; /* SEQ items, MAP values */
    char **keys;            /* MAP keys, in document order */
    int *key_lines;         /* MAP key lines */
} pl_ynode;

/* Loads one YAML document from text[0..len). NULL and an error in err
 * ("line L, column C: problem", or "a.b: duplicate key ...") on failure. */
pl_ynode *pl_yaml_load(const char *text, size_t len, char *err, size_t errlen);
void pl_yaml_free(pl_ynode *n);

/* The value of key in a mapping, or NULL (also when map is not a mapping). */
const pl_ynode *pl_yaml_get(const pl_ynode *map, const char *key);

/* "a string", "an integer", "a mapping", ... for error messages. */
const char *pl_yaml_type_name(pl_ytype t);

/* Integer scalars (decimal, 0x hex, 0o octal): magnitude and sign; -1 if the
 * magnitude does not fit in 64 bits or the node is not an integer. */
int pl_yaml_int(const pl_ynode *n, int *negative, uint64_t *magnitude);

/* Integer or float scalars as a double (may be ±inf or nan: .inf, .nan, or
 * out of range); -1 if the node is not a number. */
int pl_yaml_number(const pl_ynode *n, double *out);

/* Converts a subtree to cJSON (maps → objects, seqs → arrays, typed scalars).
 * Non-finite numbers cannot be JSON: NULL with "path: ..." in err. */
cJSON *pl_yaml_to_cjson(const pl_ynode *n, const char *path, char *err, size_t errlen);

#endif
