/* The operator's levelled log (oplog.h): the four level names, filtering at and above
 * the level set, the line format. */
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "oplog.h"

static void test_levels(void)
{
    pl_log_level l;
    const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(pl_log_parse_level(names[i], &l), 0);
        CHECK_EQ_INT(l, i);
    }
    CHECK_EQ_INT(pl_log_parse_level("warning", &l), -1);
    CHECK_EQ_INT(pl_log_parse_level("", &l), -1);
    CHECK_EQ_INT(pl_log_parse_level(NULL, &l), -1);
    CHECK_EQ_INT(pl_log_get_level(), PL_LOG_INFO); /* the default */
    pl_log_set_level(PL_LOG_WARN);
    CHECK(pl_log_enabled(PL_LOG_ERROR) && pl_log_enabled(PL_LOG_WARN));
    CHECK(!pl_log_enabled(PL_LOG_INFO) && !pl_log_enabled(PL_LOG_DEBUG));
    pl_log_set_level(PL_LOG_DEBUG);
    CHECK(pl_log_enabled(PL_LOG_DEBUG));
    pl_log_set_level(PL_LOG_INFO);
}

/* What reaches stderr at level warn: the error and the warning, as lines. */
static void test_filtered_lines(void)
{
    char path[] = "/tmp/pliant-oplog-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    pl_log_set_level(PL_LOG_WARN);
    pl_log(PL_LOG_DEBUG, "request %d", 1);
    pl_log(PL_LOG_INFO, "created pod %s", "a-w0");
    pl_log(PL_LOG_WARN, "status: %s", "conflict");
    pl_log(PL_LOG_ERROR, "lost the lease");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    pl_log_set_level(PL_LOG_INFO);
    char buf[512] = "";
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    close(fd);
    unlink(path);
    CHECK(n > 0);
    CHECK(strcmp(buf, "pliant-operator: warn: status: conflict\n"
                      "pliant-operator: error: lost the lease\n") == 0);
}

TEST_MAIN_BEGIN
RUN(test_levels);
RUN(test_filtered_lines);
TEST_MAIN_END
