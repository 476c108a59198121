/*
 * cli.h — the `corral` command-line tool: shared declarations of its subcommands.
 *
 * Each subcommand is a function taking the arguments after its name (argv[0] is the subcommand)
 * and returning the process exit status: 0 success, 1 failure of the operation, 2 bad usage.
 * Results go to stdout; statistics, logs and errors to stderr.
 */
#ifndef CORRAL_CLI_H
#define CORRAL_CLI_H

typedef int (*cli_command_fn)(int argc, char **argv);

int cmd_inspect(int argc, char **argv);
int cmd_run_local(int argc, char **argv);
int cmd_tokenize_local(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);

/* Print "corral <cmd>: <message>" to stderr; returns 1 (for `return cli_fail(...)`). */
int cli_fail(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parse a whole decimal number in [min, max] from text into *out; 0 on success, -1 otherwise. */
int cli_parse_long(const char *text, long min, long max, long *out);
int cli_parse_double(const char *text, double min, double max, double *out);

#endif /* CORRAL_CLI_H */
