// Subcommands. Each takes the arguments after its name and the KILN_* knobs (run/knobs.h), which
// kiln_cmd_main reads from the environment once, before any command runs, and returns the process exit
// status (0 ok, 1 runtime error, 2 usage error). Only cmd/ prints errors and decides exit codes.
#ifndef KILN_CMD_CMD_H
#define KILN_CMD_CMD_H

#include <stddef.h>

struct kiln_knobs;
struct kiln_error;

int kiln_cmd_main(int argc, char **argv);

int cmd_train(int argc, char **argv, const struct kiln_knobs *knobs);
int cmd_sample(int argc, char **argv, const struct kiln_knobs *knobs);
int cmd_info(int argc, char **argv, const struct kiln_knobs *knobs);
int cmd_help(int argc, char **argv, const struct kiln_knobs *knobs);
int cmd_tokenize(int argc, char **argv, const struct kiln_knobs *knobs);
int cmd_encode(int argc, char **argv, const struct kiln_knobs *knobs);
int cmd_decode(int argc, char **argv, const struct kiln_knobs *knobs);
int cmd_export(int argc, char **argv, const struct kiln_knobs *knobs);
int cmd_import(int argc, char **argv, const struct kiln_knobs *knobs);
int cmd_launch(int argc, char **argv, const struct kiln_knobs *knobs);
int cmd_logits(int argc, char **argv, const struct kiln_knobs *knobs);
int cmd_doctor(int argc, char **argv, const struct kiln_knobs *knobs); // cmd/doctor.c
int cmd_plot(int argc, char **argv, const struct kiln_knobs *knobs);   // cmd/plot.c

// "Did you mean": the closest of cands (NULL-terminated) to word[0..n), or NULL when none is close.
const char *cmd_suggest(const char *word, size_t n, const char *const *cands);
// Fills err with a usage error for an unknown option arg ("--name=value" or "--name") of kiln cmd: the
// closest of names (without "--", NULL-terminated) as "did you mean", then allowed (their list, as text).
// Returns the usage exit code.
int cmd_unknown_option(struct kiln_error *err, const char *cmd, const char *arg, const char *const *names,
                       const char *allowed);

#endif
