/* The npulm commands that live in their own files; tools/main.c dispatches to them. Each takes
 * the whole command line (argv[1] is the command's name) and returns the exit status. */
#ifndef NPULM_TOOLS_COMMANDS_H
#define NPULM_TOOLS_COMMANDS_H

/* npulm bench: llama-bench-style prefill/decode speeds, with --roofline the host's ceilings and
 * the NPU cost model's predictions (tools/bench.c). */
int npulm_cmd_bench(int argc, char **argv);

/* Its usage text (for npulm bench --help). */
extern const char npulm_usage_bench[];

/* npulm serve: an OpenAI-compatible HTTP server (tools/serve.c), and its usage text. */
int npulm_cmd_serve(int argc, char **argv);
extern const char npulm_usage_serve[];

/* npulm export: a specialization as ONNX with QDQ and AIMET-style encodings (tools/export.c), and
 * its usage text. */
int npulm_cmd_export(int argc, char **argv);
extern const char npulm_usage_export[];

#endif /* NPULM_TOOLS_COMMANDS_H */
