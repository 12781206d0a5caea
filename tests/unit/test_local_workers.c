/* Local workers (operator/runtime/local_workers.c): real child processes, real
 * signals, ends seen through pidfds. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "local_workers.h"
#include "check.h"

static char err[512];

static int start(pl_local_workers *b, const char *name, const char *script, char *const *env,
                 const char *log)
{
    char *argv[] = {"/bin/sh", "-c", (char *)script, NULL};
    pl_worker_spec w = {.argv = argv, .env = env, .log_path = log};
    snprintf(w.name, sizeof w.name, "%s", name);
    return pl_local_workers_start(b, &w, err, sizeof err);
}

static void test_exit_status_and_signals(void)
{
    pl_local_workers *b = pl_local_workers_new(err, sizeof err);
    CHECK(b != NULL);
    CHECK(start(b, "exits", "exit 3", NULL, NULL) == 0);
    CHECK(start(b, "sleeper", "sleep 30", NULL, NULL) == 0);
    /* the shell turns SIGTERM into a clean exit 0: a worker leaving on notice */
    CHECK(start(b, "polite", "trap 'exit 0' TERM; while :; do sleep 0.05; done", NULL, NULL) == 0);
    CHECK_EQ_INT(pl_local_workers_count(b), 3);

    pl_worker_event ev;
    CHECK(pl_local_workers_wait(b, &ev, 5000) == 1);
    CHECK(!strcmp(ev.name, "exits") && ev.end == PL_WORKER_EXITED && ev.status == 3);

    CHECK(pl_local_workers_signal(b, "sleeper", SIGKILL, err, sizeof err) == 0);
    CHECK(pl_local_workers_wait(b, &ev, 5000) == 1);
    CHECK(!strcmp(ev.name, "sleeper") && ev.end == PL_WORKER_KILLED && ev.signal == SIGKILL);

    usleep(200000); /* let the shell install its trap */
    CHECK(pl_local_workers_signal(b, "polite", SIGTERM, err, sizeof err) == 0);
    CHECK(pl_local_workers_wait(b, &ev, 5000) == 1);
    CHECK(!strcmp(ev.name, "polite") && ev.end == PL_WORKER_EXITED && ev.status == 0);
    CHECK_EQ_INT(pl_local_workers_count(b), 0);
    pl_local_workers_free(b);
}

static void test_timeout_and_errors(void)
{
    pl_local_workers *b = pl_local_workers_new(err, sizeof err);
    CHECK(start(b, "w", "sleep 30", NULL, NULL) == 0);
    pl_worker_event ev;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK(pl_local_workers_wait(b, &ev, 100) == 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    CHECK(ms >= 90 && ms < 2000);
    CHECK(start(b, "w", "true", NULL, NULL) == -1);
    CHECK_STR_CONTAINS(err, "already running");
    CHECK(pl_local_workers_signal(b, "nobody", SIGKILL, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "nobody");
    char *argv[] = {"/nonexistent/pliant-worker", NULL};
    pl_worker_spec w = {.name = "missing", .argv = argv};
    CHECK(pl_local_workers_start(b, &w, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "No such file");
    CHECK_EQ_INT(pl_local_workers_count(b), 1);
    pl_local_workers_free(b); /* kills and reaps the sleeper */
}

static void test_environment_and_log(void)
{
    char log[] = "/tmp/pliant-workers-XXXXXX";
    int fd = mkstemp(log);
    CHECK(fd >= 0);
    close(fd);
    pl_local_workers *b = pl_local_workers_new(err, sizeof err);
    char *env[] = {"PLIANT_WORKER_NAME=w7", "PLIANT_COORDINATOR=127.0.0.1:1234", NULL};
    CHECK(start(b, "w7", "echo \"$PLIANT_WORKER_NAME $PLIANT_COORDINATOR\"; echo oops >&2", env, log) == 0);
    pl_worker_event ev;
    CHECK(pl_local_workers_wait(b, &ev, 5000) == 1 && ev.status == 0);
    pl_local_workers_free(b);
    FILE *f = fopen(log, "r");
    char buf[256] = "";
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = '\0';
    unlink(log);
    CHECK_STR_CONTAINS(buf, "w7 127.0.0.1:1234\n");
    CHECK_STR_CONTAINS(buf, "oops");
}

TEST_MAIN_BEGIN
RUN(test_exit_status_and_signals);
RUN(test_timeout_and_errors);
RUN(test_environment_and_log);
TEST_MAIN_END
