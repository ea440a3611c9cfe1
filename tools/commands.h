/* The npulm commands that live in their own files; tools/main.c dispatches to them. Each takes
 * the whole command line (argv[1] is the command's name) and returns the exit status. */
#ifndef NPULM_TOOLS_COMMANDS_H
#define NPULM_TOOLS_COMMANDS_H

/* npulm bench: llama-bench-style prefill/decode speeds, with --roofline the host's ceilings and
 * the NPU cost model's predictions (tools/bench.c). */
int npulm_cmd_bench(int argc, char **argv);

/* Its usage text (for npulm bench --help). */
extern const char npulm_usage_bench[];

#endif /* NPULM_TOOLS_COMMANDS_H */
