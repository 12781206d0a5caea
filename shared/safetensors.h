/* The safetensors format (what Hugging Face / PyTorch load): an 8-byte
 * little-endian header length N, N bytes of JSON
 *   {"__metadata__": {"k": "v", ...},
 *    "name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...}
 * padded with spaces to a multiple of 8, then the data section. Offsets are
 * relative to the data section; tensors are packed with no gaps or overlaps
 * and cover the data section exactly.
 *
 * Writing collects tensors (borrowed pointers, read at write time) and
 * metadata, then writes PATH.tmp.XXXXXX, fsyncs and renames it over PATH, so a
 * reader never sees a partial file under the final name. The data section is
 * laid out by decreasing element size (stable otherwise), so every tensor of
 * a file written here is aligned to its element size in a mapping.
 *
 * Reading maps the file read-only and validates it strictly (header length
 * bounds, JSON syntax, known dtypes, shapes, offsets in range, contiguous and
 * non-overlapping, element count × dtype size == byte length, string-valued
 * metadata, no duplicate names); errors name the file and the tensor. */
#ifndef PLIANT_SAFETENSORS_H
#define PLIANT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define PL_ST_MAX_DIMS 8
#define PL_ST_MAX_HEADER 100000000 /* bytes, as the reference implementation */

typedef enum {
    PL_ST_BOOL, PL_ST_U8, PL_ST_I8, PL_ST_F8_E4M3, PL_ST_F8_E5M2,
    PL_ST_I16, PL_ST_U16, PL_ST_F16, PL_ST_BF16,
    PL_ST_I32, PL_ST_U32, PL_ST_F32,
    PL_ST_I64, PL_ST_U64, PL_ST_F64,
    PL_ST_NDTYPES
} pl_st_dtype;

/* "F32" etc. and bytes per element; NULL / 0 for an invalid dtype. */
const char *pl_st_dtype_name(pl_st_dtype d);
size_t pl_st_dtype_size(pl_st_dtype d);
/* −1 if the name is not a supported dtype. */
int pl_st_dtype_parse(const char *name);

/* ---- writing ---- */

typedef struct pl_st_writer pl_st_writer;

pl_st_writer *pl_st_writer_new(void);
void pl_st_writer_free(pl_st_writer *w);

/* Adds a tensor; data (nelem × dtype size bytes, nelem = product of shape,
 * 1 for ndim 0) must stay valid until pl_st_write. Names must be non-empty,
 * unique and not "__metadata__". Returns 0 or −1 with err. */
int pl_st_writer_add(pl_st_writer *w, const char *name, pl_st_dtype dtype, int ndim,
                     const int64_t *shape, const void *data, char *err, size_t errlen);
/* Adds a metadata string (copied); keys unique. Returns 0 or −1 with err. */
int pl_st_writer_meta(pl_st_writer *w, const char *key, const char *value, char *err,
                      size_t errlen);
/* Writes the file atomically (pl_write_atomic_mode: `mode` less the umask); the writer
 * can be written again or freed. */
int pl_st_write_mode(const pl_st_writer *w, const char *path, mode_t mode, char *err,
                     size_t errlen);
/* pl_st_write_mode with 0666. */
int pl_st_write(const pl_st_writer *w, const char *path, char *err, size_t errlen);

/* ---- reading ---- */

typedef struct {
    char *name;
    pl_st_dtype dtype;
    int ndim;
    int64_t shape[PL_ST_MAX_DIMS];
    int64_t nelem;
    size_t nbytes;
    const void *data; /* inside the read-only mapping; aligned to the element
                         size in files written by pl_st_write (use memcpy for
                         others) */
} pl_st_tensor;

typedef struct {
    char *path;
    void *map;
    size_t map_len;
    int ntensors;
    pl_st_tensor *tensors; /* in header order */
    int nmeta;
    char **meta_keys, **meta_values;
    int borrowed_;         /* map is the caller's memory (pl_st_parse), not a mapping */
} pl_st_file;

int pl_st_open(const char *path, pl_st_file *f, char *err, size_t errlen);
/* The same checks on a file image in memory, which is not copied (it must outlive
 * f); name stands for the path in f->path and in errors. */
int pl_st_parse(const void *bytes, size_t len, const char *name, pl_st_file *f, char *err,
                size_t errlen);
void pl_st_close(pl_st_file *f);

/* NULL if absent. */
const pl_st_tensor *pl_st_find(const pl_st_file *f, const char *name);
/* The tensor if present with exactly this dtype and shape; else NULL and
 * "FILE: tensor "NAME": ..." (missing / dtype / shape mismatch) in err. */
const pl_st_tensor *pl_st_expect(const pl_st_file *f, const char *name, pl_st_dtype dtype,
                                 int ndim, const int64_t *shape, char *err, size_t errlen);
/* Metadata value, NULL if absent. */
const char *pl_st_meta(const pl_st_file *f, const char *key);

#endif
