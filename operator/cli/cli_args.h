/* Small helpers shared by the `pliant` subcommands' argument parsing. */
#ifndef PLIANT_CLI_ARGS_H
#define PLIANT_CLI_ARGS_H

#include <stddef.h>
#include <stdio.h>

/* Strict integer parsing of a flag's value: the whole string, within [lo, hi].
 * Returns 0, or −1 with "FLAG: reason" in err. */
int cli_parse_int(const char *flag, const char *s, long long lo, long long hi, long long *out,
                  char *err, size_t errlen);
/* The same for a finite double. */
int cli_parse_double(const char *flag, const char *s, double lo, double hi, double *out,
                     char *err, size_t errlen);
/* The compute threads `pliant run` gives each of n local workers without --threads: an
 * equal share of the cores, at least one. */
int cli_worker_threads(long long n);
/* This program's path (to start `pliant` children: workers, a timed run) into exe[n].
 * 0, or −1 with err. */
int cli_self_exe(char *exe, size_t n, char *err, size_t errlen);
/* A kernel backend choice: auto (CUDA where there is one), cpu or cuda. */
int cli_check_backend(const char *flag, const char *s, char *err, size_t errlen);
/* The exit status of `pliant CMD` whose argument parsing did not go on (rc ≠ 0): 0 after
 * the usage on stdout for --help (rc > 0), 2 after "pliant CMD: err" and the usage on
 * stderr (rc < 0). */
int cli_usage_exit(int rc, const char *cmd, const char *err, void (*usage)(FILE *));

#endif
