/* Integer and number flag values of the `pliant` subcommands, range-checked with
 * messages that name the flag (cli_args.h). */
#include "cli_args.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

int cli_parse_int(const char *flag, const char *s, long long lo, long long hi, long long *out,
                  char *err, size_t errlen)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) return pl_errf(err, errlen, "%s: '%s' is not an integer", flag, s);
    if (v < lo || v > hi)
        return pl_errf(err, errlen, "%s: %lld is out of range [%lld, %lld]", flag, v, lo, hi);
    *out = v;
    return 0;
}

int cli_parse_double(const char *flag, const char *s, double lo, double hi, double *out,
                     char *err, size_t errlen)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return pl_errf(err, errlen, "%s: '%s' is not a number", flag, s);
    if (v < lo || v > hi) return pl_errf(err, errlen, "%s: %g is out of range [%g, %g]", flag, v, lo, hi);
    *out = v;
    return 0;
}

int cli_check_backend(const char *flag, const char *s, char *err, size_t errlen)
{
    if (!strcmp(s, "auto") || !strcmp(s, "cpu") || !strcmp(s, "cuda")) return 0;
    return pl_errf(err, errlen, "%s: must be auto, cpu or cuda, not '%s'", flag, s);
}

int cli_self_exe(char *exe, size_t n, char *err, size_t errlen)
{
    const ssize_t k = readlink("/proc/self/exe", exe, n - 1);
    if (k <= 0) return pl_errf(err, errlen, "cannot find this program (/proc/self/exe)");
    exe[k] = 0;
    return 0;
}

int cli_worker_threads(long long n)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores / n > 0 ? (int)(cores / n) : 1;
}

int cli_usage_exit(int rc, const char *cmd, const char *err, void (*usage)(FILE *))
{
    if (rc > 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "pliant %s: %s\n", cmd, err);
    usage(stderr);
    return 2;
}
