/* The operator's levelled log on stderr (oplog.h). */
#include "oplog.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static const char *const NAMES[] = {"error", "warn", "info", "debug"};
static atomic_int level_ = PL_LOG_INFO;

int pl_log_parse_level(const char *name, pl_log_level *out)
{
    for (int i = 0; name && i < (int)(sizeof NAMES / sizeof NAMES[0]); i++)
        if (!strcmp(name, NAMES[i])) {
            *out = (pl_log_level)i;
            return 0;
        }
    return -1;
}

void pl_log_set_level(pl_log_level level)
{
    atomic_store(&level_, (int)level);
}

pl_log_level pl_log_get_level(void)
{
    return (pl_log_level)atomic_load(&level_);
}

int pl_log_enabled(pl_log_level level)
{
    return (int)level <= atomic_load(&level_);
}

void pl_log(pl_log_level level, const char *fmt, ...)
{
    if (!pl_log_enabled(level)) return;
    char line[2048];
    int n = snprintf(line, sizeof line, "pliant-operator: %s: ", NAMES[level]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}
