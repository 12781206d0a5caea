/* --chaos specs and spot-instance traces (shared/chaos.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chaos.h"
#include "check.h"

static char err[512];

static void test_step_and_time_events(void)
{
    pl_chaos c;
    CHECK(pl_chaos_parse("kill:2@step=5,term:0@t=1.5,add:3@step=7,kill:1@t=0.25", &c, err,
                         sizeof err) == 0);
    CHECK_EQ_INT(c.n, 4);
    /* step events first in spec order, then time events by time */
    CHECK(c.events[0].action == PL_CHAOS_KILL && c.events[0].when == PL_CHAOS_AT_STEP);
    CHECK_EQ_INT(c.events[0].worker, 2);
    CHECK_EQ_INT(c.events[0].step, 5);
    CHECK(c.events[1].action == PL_CHAOS_ADD && c.events[1].count == 3 && c.events[1].step == 7);
    CHECK(c.events[2].action == PL_CHAOS_KILL && c.events[2].t_ms == 250 && c.events[2].worker == 1);
    CHECK(c.events[3].action == PL_CHAOS_TERM && c.events[3].t_ms == 1500);
    CHECK_EQ_INT(c.initial_workers, 0);
    pl_chaos_free(&c);
    CHECK(pl_chaos_parse("", &c, err, sizeof err) == 0 && c.n == 0);
    pl_chaos_free(&c);
    CHECK(pl_chaos_parse("kill:1@checkpoint=3", &c, err, sizeof err) == 0);
    CHECK(c.n == 1 && c.events[0].when == PL_CHAOS_AT_CHECKPOINT && c.events[0].step == 3 &&
          c.events[0].worker == 1);
    pl_chaos_free(&c);
    /* by place: pipeline 1, stage 2 of the plan then running */
    CHECK(pl_chaos_parse("kill:p1.2@step=4,term:p0.0@t=1", &c, err, sizeof err) == 0);
    CHECK(c.n == 2 && c.events[0].worker == -1 && c.events[0].pipe == 1 &&
          c.events[0].stage == 2 && c.events[0].step == 4);
    CHECK(c.events[1].action == PL_CHAOS_TERM && c.events[1].worker == -1 &&
          c.events[1].pipe == 0 && c.events[1].stage == 0 && c.events[1].t_ms == 1000);
    pl_chaos_free(&c);
}

static void test_bad_specs_name_the_event(void)
{
    static const struct {
        const char *spec, *want;
    } bad[] = {
        {"kill:x@step=3", "event 1 (kill:x@step=3): worker must be a number"},
        {"kill:p1@step=3", "worker must be a number or pQ.J"},
        {"kill:p1.x@step=3", "worker must be a number or pQ.J"},
        {"kill:1@step=3,boom:1@step=2", "event 2 (boom:1@step=2): unknown action"},
        {"kill:1", "expected @step=S, @t=SECONDS, @waiting or @checkpoint=S"},
        {"kill:1@when=3", "expected @step=S, @t=SECONDS, @waiting or @checkpoint=S"},
        {"kill:1@checkpoint=0", "checkpoint must be a step"},
        {"add:0@step=3", "count of workers to add"},
        {"term:1@t=-2", "t must be a non-negative number"},
        {"kill:1@step=", "step must be a non-negative integer"},
        {"kill:1@step=2,,add:1@step=3", "event 2 (): empty"},
        {"trace:/nonexistent.csv:10", "/nonexistent.csv"},
        {"nocolon", "expected ACTION:ARG"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pl_chaos c;
        err[0] = '\0';
        CHECK(pl_chaos_parse(bad[i].spec, &c, err, sizeof err) == -1);
        CHECK_STR_CONTAINS(err, bad[i].want);
    }
}

static const char *write_tmp(const char *text)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/pliant-chaos-XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) abort();
    close(fd);
    return path;
}

static void test_trace_maps_nodes_to_workers(void)
{
    /* CRLF like the Bamboo files; nodes 1..3 start, node2 leaves, node4 joins, node1 leaves */
    const char *path = write_tmp("0,add,node1\r\n0,add,node2\r\n0,add,node3\r\n60000,remove,node2\r\n"
                                 "120000,add,node4\r\n180000,remove,node1\r\n180000,remove,node4\r\n");
    char spec[128];
    snprintf(spec, sizeof spec, "trace:%s:60", path);
    pl_chaos c;
    CHECK(pl_chaos_parse(spec, &c, err, sizeof err) == 0);
    unlink(path);
    CHECK_EQ_INT(c.initial_workers, 3);
    CHECK_EQ_INT(c.n, 4);
    CHECK(c.events[0].action == PL_CHAOS_KILL && c.events[0].worker == 1 && c.events[0].t_ms == 1000);
    CHECK(c.events[1].action == PL_CHAOS_ADD && c.events[1].count == 1 && c.events[1].t_ms == 2000);
    CHECK(c.events[2].action == PL_CHAOS_KILL && c.events[2].worker == 0 && c.events[2].t_ms == 3000);
    CHECK(c.events[3].action == PL_CHAOS_KILL && c.events[3].worker == 3); /* node4 = worker 3 */
    pl_chaos_free(&c);
}

static void test_trace_count_format(void)
{
    /* 3 nodes, one preempted (the newest: worker 2), two new ones, then 2 preempted (newest first) */
    const char *path = write_tmp("2021-12-11, 11:00:00, 3\n2021-12-11, 11:01:00, 2\n"
                                 "2021-12-11, 11:02:00, 4\n2021-12-11, 11:03:00, 2\n");
    char spec[128];
    snprintf(spec, sizeof spec, "trace:%s:60", path);
    pl_chaos c;
    CHECK(pl_chaos_parse(spec, &c, err, sizeof err) == 0);
    unlink(path);
    CHECK_EQ_INT(c.initial_workers, 3);
    CHECK_EQ_INT(c.n, 5);
    CHECK(c.events[0].action == PL_CHAOS_KILL && c.events[0].worker == 2 && c.events[0].t_ms == 1000);
    CHECK(c.events[1].action == PL_CHAOS_ADD && c.events[1].t_ms == 2000);
    CHECK(c.events[2].action == PL_CHAOS_ADD && c.events[2].t_ms == 2000);
    CHECK(c.events[3].action == PL_CHAOS_KILL && c.events[3].t_ms == 3000);
    CHECK(c.events[4].action == PL_CHAOS_KILL && c.events[4].t_ms == 3000);
    CHECK(c.events[3].worker + c.events[4].worker == 3 + 4); /* the two added ones */
    pl_chaos_free(&c);
}

static void test_bad_traces(void)
{
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"0,add,node1\n10,remove,node2\n", ":2: node2 removed but not alive"},
        {"0,add,node1\n10,add,node1\n", ":2: node1 added twice"},
        {"10,add,node1\n5,add,node2\n", ":2: time 5 goes backwards"},
        {"0,join,node1\n", "neither add nor remove"},
        {"0,add,n1\n", "expected t_ms,add|remove,nodeN"},
        {"zero,add,node1\n", "expected t_ms,add|remove,nodeN"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *path = write_tmp(bad[i].text);
        pl_trace_event *tr;
        int n;
        err[0] = '\0';
        int rc = pl_trace_read(path, &tr, &n, err, sizeof err);
        unlink(path);
        CHECK(rc == -1);
        CHECK_STR_CONTAINS(err, bad[i].want);
    }
}

/* The real traces (when ../shared/traces is beside the checkout): the figures of its README. */
static void test_shared_traces(void)
{
    pl_trace_event *tr;
    int n;
    if (access("../shared/traces/p3-trace.csv", R_OK)) SKIP("../shared/traces not found");
    CHECK(pl_trace_read("../shared/traces/p3-trace.csv", &tr, &n, err, sizeof err) == 0);
    int adds = 0, removes = 0, alive = 0, peak = 0;
    for (int i = 0; i < n; i++) {
        tr[i].add ? adds++ : removes++;
        alive += tr[i].add ? 1 : -1;
        if (alive > peak) peak = alive;
    }
    free(tr);
    CHECK_EQ_INT(adds, 177);
    CHECK_EQ_INT(removes, 167);
    CHECK_EQ_INT(peak, 32);
    CHECK(pl_trace_read("../shared/traces/oobleck-synthetic/1h.csv", &tr, &n, err, sizeof err) == 0);
    free(tr);
    pl_chaos c;
    CHECK(pl_chaos_parse("trace:../shared/traces/g4dn-trace.csv:600", &c, err, sizeof err) == 0);
    CHECK(c.initial_workers > 0 && c.n > 0);
    pl_chaos_free(&c);
}

TEST_MAIN_BEGIN
RUN(test_step_and_time_events);
RUN(test_bad_specs_name_the_event);
RUN(test_trace_maps_nodes_to_workers);
RUN(test_trace_count_format);
RUN(test_bad_traces);
RUN(test_shared_traces);
TEST_MAIN_END
