/* Subcommands of `pliant`. Each takes argv with argv[0] = the subcommand's
 * name and returns the process exit status (2 for bad input). */
#ifndef PLIANT_COMMANDS_H
#define PLIANT_COMMANDS_H

int cmd_plan(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_sample(int argc, char **argv);
int cmd_profile(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_worker(int argc, char **argv);
int cmd_simulate(int argc, char **argv);

#endif
