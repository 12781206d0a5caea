/* Subcommands of `pliant`. Each takes argv with argv[0] = the subcommand's
 * name and returns the process exit status (2 for bad input). */
#ifndef PLIANT_COMMANDS_H
#define PLIANT_COMMANDS_H

int cmd_plan(int argc, char **argv);

#endif
