/* Checkpoint files as outside input and as output: checkpoint.json's numbers checked
 * (1e300, 2^32 + 2 and fractions refused naming the field), file and directory modes
 * (0640 / 0750 less the umask), a failed directory fsync reported, and temporary files
 * left by a crashed writer removed (pl_checkpoint_sweep, pl_job_prune_checkpoints). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "check.h"
#include "tmpfiles.h"
#include "checkpoint.h"
#include "safetensors.h"
#include "trainer.h"
#include "util.h"

static char err[1024];

/* A checkpoint.json with the given step and layers texts. */
static const char *meta_json(const char *step, const char *layers)
{
    static char buf[512];
    snprintf(buf, sizeof buf,
             "{\"format\": \"pliant-checkpoint-v1\", \"step\": %s, \"model\": {\"layers\": %s, "
             "\"channels\": 32, \"heads\": 4, \"vocab_size\": 256, \"max_seq_len\": 64}, "
             "\"data\": {\"seq_len\": 32}}",
             step, layers);
    return buf;
}

static int parse(const char *text, pl_checkpoint_meta *m)
{
    err[0] = '\0';
    return pl_checkpoint_meta_parse(text, "ckpt/checkpoint.json", m, err, sizeof err);
}

static void meta_valid(void)
{
    pl_checkpoint_meta m;
    CHECK(parse(meta_json("120", "2"), &m) == 0);
    CHECK(m.step == 120 && m.cfg.L == 2 && m.cfg.C == 32 && m.seq_len == 32);
}

static void meta_step_out_of_range(void)
{
    pl_checkpoint_meta m;
    const char *bad[] = {"1e300", "-1", "2.5", "2147483648", "\"7\"", "null", "true"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK(parse(meta_json(bad[i], "2"), &m) == -1);
        CHECK_STR_CONTAINS(err, "ckpt/checkpoint.json: step: must be an integer in [0, ");
    }
    CHECK(parse("{\"model\": {}}", &m) == -1);
    CHECK_STR_CONTAINS(err, "step: missing");
}

static void meta_layers_out_of_range(void)
{
    pl_checkpoint_meta m;
    CHECK(parse(meta_json("1", "4294967298"), &m) == -1);
    CHECK_STR_CONTAINS(err, "model.layers: must be an integer in [1, 2147483647] (got 4294967298)");
    CHECK(parse(meta_json("1", "0"), &m) == -1);
    CHECK_STR_CONTAINS(err, "model.layers");
    CHECK(parse(meta_json("1", "1.5"), &m) == -1);
    CHECK_STR_CONTAINS(err, "model.layers");
    const char *seq = "{\"step\": 1, \"model\": {\"layers\": 2, \"channels\": 32, \"heads\": 4, "
                      "\"vocab_size\": 256, \"max_seq_len\": 64}, \"data\": {\"seq_len\": 1e9}}";
    CHECK(parse(seq, &m) == -1);
    CHECK_STR_CONTAINS(err, "data.seq_len: must be an integer in [1, 64]");
}

static mode_t mode_of(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 ? st.st_mode & 07777 : (mode_t)-1;
}

/* Writes a checkpoint.json for step under dir with the given umask. */
static int complete_with_umask(mode_t mask, int64_t step)
{
    mode_t old = umask(mask);
    int rc = pl_checkpoint_complete(dir, step, meta_json("1", "2"), err, sizeof err);
    umask(old);
    return rc;
}

static void modes_follow_umask(void)
{
    CHECK(mkdtemp(strcpy(dir, "/tmp/pliant-ckpt-XXXXXX")) != NULL);
    CHECK(mkdir(path_in("step-00000001"), 0755) == 0 && mkdir(path_in("step-00000002"), 0755) == 0);
    CHECK(complete_with_umask(022, 1) == 0);
    CHECK_EQ_INT((int)mode_of(path_in("step-00000001/checkpoint.json")), 0640);
    CHECK(complete_with_umask(077, 2) == 0);
    CHECK_EQ_INT((int)mode_of(path_in("step-00000002/checkpoint.json")), 0600);
    /* a safetensors file of a checkpoint, and a plain atomic write (0666 less the umask) */
    pl_st_writer *w = pl_st_writer_new();
    float x = 1;
    CHECK(pl_st_writer_add(w, "x", PL_ST_F32, 0, NULL, &x, err, sizeof err) == 0);
    mode_t old = umask(027);
    CHECK(pl_st_write_mode(w, path_in("a.safetensors"), PL_CHECKPOINT_FILE_MODE, err, sizeof err) == 0);
    CHECK(pl_write_atomic(path_in("plain"), &(pl_piece){"x", 1}, 1, err, sizeof err) == 0);
    umask(old);
    pl_st_writer_free(w);
    CHECK_EQ_INT((int)mode_of(path_in("a.safetensors")), 0640);
    CHECK_EQ_INT((int)mode_of(path_in("plain")), 0640);
    CHECK_EQ_INT(count_entries(dir, ".tmp."), 0);
    rm_rf(dir);
}

/* fsync, interposed: fails with EIO on directories while fail_dir_fsync is set. */
static int fail_dir_fsync;

int fsync(int fd)
{
    struct stat st;
    if (fail_dir_fsync && fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
        errno = EIO;
        return -1;
    }
    return (int)syscall(SYS_fsync, fd);
}

static void directory_fsync_error_reported(void)
{
    CHECK(mkdtemp(strcpy(dir, "/tmp/pliant-ckpt-XXXXXX")) != NULL);
    CHECK(mkdir(path_in("step-00000003"), 0755) == 0);
    fail_dir_fsync = 1;
    err[0] = '\0';
    int rc = pl_checkpoint_complete(dir, 3, meta_json("3", "2"), err, sizeof err);
    fail_dir_fsync = 0;
    CHECK(rc == -1);
    CHECK_STR_CONTAINS(err, "checkpoint.json: directory fsync failed");
    CHECK_STR_CONTAINS(err, "Input/output error");
    CHECK(pl_checkpoint_complete(dir, 3, meta_json("3", "2"), err, sizeof err) == 0);
    rm_rf(dir);
}

static void tmp_names(void)
{
    CHECK(pl_is_tmp_name("checkpoint.json.tmp.a1B2c3"));
    CHECK(pl_is_tmp_name("layers-0-3.safetensors.tmp.XXXXXX"));
    CHECK(!pl_is_tmp_name("checkpoint.json"));
    CHECK(!pl_is_tmp_name("notes.tmp.txt"));
    CHECK(!pl_is_tmp_name(".tmp.abcdef"));
    CHECK(!pl_is_tmp_name("a.tmp.abcdefg"));
    CHECK(!pl_is_tmp_name("a.tmp.abc-ef"));
}

static void touch(const char *name) { CHECK(write_raw(path_in(name), "x", 1) == 0); }

/* Leftovers in step-1 (complete), step-2 (incomplete, older) and step-9 (newer, maybe
 * being written), and in dir itself. */
static void make_leftovers(void)
{
    CHECK(mkdtemp(strcpy(dir, "/tmp/pliant-ckpt-XXXXXX")) != NULL);
    const char *sub[] = {"step-00000001", "step-00000002", "step-00000009"};
    for (int i = 0; i < 3; i++) CHECK(mkdir(path_in(sub[i]), 0755) == 0);
    CHECK(pl_checkpoint_complete(dir, 2, meta_json("2", "2"), err, sizeof err) == 0);
    touch("step-00000001/layers-0-1.safetensors.tmp.abcdef");
    touch("step-00000002/checkpoint.json.tmp.ABC123");
    touch("step-00000002/layers-2-4.safetensors.tmp.zzzzzz");
    touch("step-00000009/layers-0-1.safetensors.tmp.qwerty");
    touch("stray.tmp.000000");
    touch("step-00000002/notes.tmp.txt");
}

static void sweep_up_to_a_step(void)
{
    make_leftovers();
    CHECK_EQ_INT(pl_checkpoint_sweep(dir, 2, err, sizeof err), 4);
    CHECK_EQ_INT(count_entries(path_in("step-00000002"), ".tmp."), 1); /* notes.tmp.txt */
    CHECK_EQ_INT(count_entries(path_in("step-00000009"), ".tmp."), 1);
    CHECK_EQ_INT(count_entries(dir, ".tmp."), 0);
    CHECK(access(path_in("step-00000002/checkpoint.json"), F_OK) == 0);
    CHECK_EQ_INT(pl_checkpoint_sweep(dir, INT64_MAX, err, sizeof err), 1);
    CHECK_EQ_INT(pl_checkpoint_sweep(path_in("missing"), INT64_MAX, err, sizeof err), 0);
    rm_rf(dir);
}

/* What a worker runs after it completed a checkpoint: the sweep up to the newest one. */
static void prune_sweeps(void)
{
    make_leftovers();
    pl_job job;
    memset(&job, 0, sizeof job);
    snprintf(job.checkpoint.dir, sizeof job.checkpoint.dir, "%s", dir);
    CHECK_EQ_INT(pl_job_prune_checkpoints(&job, err, sizeof err), 0);
    CHECK_EQ_INT(count_entries(path_in("step-00000001"), ".tmp."), 0);
    CHECK_EQ_INT(count_entries(path_in("step-00000002"), ".tmp."), 1);
    CHECK_EQ_INT(count_entries(path_in("step-00000009"), ".tmp."), 1);
    rm_rf(dir);
}

TEST_MAIN_BEGIN
RUN(meta_valid);
RUN(meta_step_out_of_range);
RUN(meta_layers_out_of_range);
RUN(modes_follow_umask);
RUN(directory_fsync_error_reported);
RUN(tmp_names);
RUN(sweep_up_to_a_step);
RUN(prune_sweeps);
TEST_MAIN_END
