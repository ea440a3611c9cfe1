/* Helpers the npulm CLI commands share: option parsing that fails with one line on stderr and
 * exit status 1, the model path, the compile options of a GGUF model, and a clock. Used by the
 * commands (main.c, bench.c). */
#ifndef NPULM_TOOLS_CLI_UTIL_H
#define NPULM_TOOLS_CLI_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "npulm.h"

#define CLI_DEFAULT_MODEL_PATH "../shared/models/stories260K.gguf"

/* The compile options' help lines (as `npulm compile --help` words them). */
#define CLI_COMPILE_OPTIONS_HELP                                                                   \
  "  --quant MODE       how the NPU computes: PRECISION-OUTLIERS, or f32. PRECISION: w8a8,\n"      \
  "                     w8a16, w4a16, w4a16-block (int4 in blocks of 32 with integer block\n"      \
  "                     scales), w4a8 (weights w, activations a; the classifier keeps int8\n"      \
  "                     weights). OUTLIERS: smooth (SmoothQuant), shadow (outlier channels in\n"   \
  "                     float on the CPU) or naive; a precision alone is naive (default\n"         \
  "                     w8a8-smooth)\n"                                                            \
  "  --float-ops LIST   ops kept in float on the CPU, from softmax,qk,pv,rmsnorm (default\n"       \
  "                     softmax,qk,pv; 'none' for none; w8a8-shadow adds rmsnorm)\n"               \
  "  --calib FILE       calibration text (default: a built-in English text)\n"                     \
  "  --calib-tokens N   calibrate on at most N tokens of it (default 1024)\n"                      \
  "  --smooth-alpha A   SmoothQuant migration strength in (0, 1) (default 0.5), or auto: chosen\n" \
  "                     per layer and matmul input by the least predicted int8 error\n"            \
  "  --shadow-threshold T  outlier channel: calibrated max above T x the median (default 6)\n"     \
  "  --chunks LIST      prefill chunk sizes, ascending, comma-separated (default 16,64,128)\n"     \
  "  --batch N          also the chunk sizes 2, 4, 8, ... up to N (rounded up to a power of\n"     \
  "                     two), the steps of batched decode of up to N sessions (npulm serve\n"      \
  "                     --parallel); added to the --chunks given before it, or the defaults\n"     \
  "  --buckets LIST     context buckets, ascending (default: powers of two from 128 up to the\n"   \
  "                     model's context, which is always the last)\n"                              \
  "  --keep-float       the program file also holds the float copy of the NPU's matrices, so\n"    \
  "                     that --reference, diff and recompiling work from it (default: an\n"        \
  "                     integer program holds only their int8 form)\n"                             \
  "  --sparsity S       sparse decode: skip the share S in [0, 1) of what --sparse-form names,\n"  \
  "                     those of least magnitude on the calibration text; or auto: the largest\n"  \
  "                     level within 1% of dense decode perplexity (input: 0.5, 0.4, 0.25, 0.1;\n" \
  "                     neuron: 0.7, 0.5, 0.3, 0.15) (default: none)\n"                            \
  "  --sparse-form F    input (default): the input channels of every block matmul (q, k, v,\n"     \
  "                     o, gate, up, down), by a threshold on each one's integer input, any\n"     \
  "                     integer mode; neuron: FFN neurons by |SiLU(gate)|, picked each step by\n"  \
  "                     a low-rank predictor (w8a8-naive/-smooth; what --mem-budget's neuron\n"    \
  "                     cache reads)\n"                                                            \
  "  --sparse-rank R    neuron: the predictors' rank, in every layer (default: dim / 8, and\n"     \
  "                     none where a predictor reads more than the gate rows it spares)\n"         \
  "  --sparse-recall R  neuron: the share of the kept neurons' calibration |SiLU| mass the\n"      \
  "                     predictor's candidates must cover (default 0.998)\n"

#define CLI_OPEN_OPTIONS_HELP                                                                      \
  "  --mem-budget SIZE  hold at most SIZE bytes of weights in memory (K, M, G suffixes): the\n"    \
  "                     rest stays in the program file (compiled with --sparsity and\n"            \
  "                     --sparse-form neuron) and is read as needed; the FFN's neurons go\n"       \
  "                     through a cache of hot and recent ones\n"                                  \
  "                     (ppl then scores one window at a time: the budget is per session)\n"       \
  "  --cold             drop the program file from the page cache first: every read comes from\n"  \
  "                     storage\n"                                                                 \
  "  --buffered-io      with --mem-budget: read the neurons through the page cache (default:\n"    \
  "                     O_DIRECT where the file system allows, every byte from storage)\n"

/* The session options of run, ppl and bench. */
#define CLI_SESSION_OPTIONS_HELP                                                                    \
  "  --sparse MODE      decode of a program compiled with --sparsity: predict (default: sparse),\n" \
  "                     exact (neuron form: every neuron's exact gate against the thresholds,\n"    \
  "                     the bound a predictor is judged against) or off (dense)\n"                  \
  "  --sparse-audit     neuron form: also measure the predictor's recall every step (slower)\n"

/* A command's arguments: argv[1] is the command, 'i' the option being parsed. */
struct cli_args {
  int argc;
  char **argv;
  int i;
  const char *cmd;
  const char *usage;
};

/* Print "npulm CMD: " and the formatted message as one line on stderr; exit status 1. */
_Noreturn void cli_die(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

bool cli_is_opt(const char *arg, const char *short_name, const char *long_name);

/* The value of the option at argv[i] (advancing i); exits if it is missing. */
const char *cli_opt_value(struct cli_args *a);

/* The integer value of the option at argv[i] in [min, max]; exits otherwise. */
long long cli_opt_int(struct cli_args *a, long long min, long long max);

/* The byte count value of the option at argv[i]: a positive number with an optional K, M or G
 * (powers of 1024); exits if it is not one. */
uint64_t cli_opt_size(struct cli_args *a);

/* The number value of the option at argv[i]; exits if it is not a finite one. */
float cli_opt_float(struct cli_args *a);

/* The whole of file 'path' (malloc'd, '*len' bytes); exits on failure. */
char *cli_read_file(const char *cmd, const char *path, size_t *len);
/* The whole of stdin, the same way. */
char *cli_read_stdin(const char *cmd, size_t *len);

/* A comma-separated list of at most 'max' integers in [min, max_value] for the option at argv[i]
 * into 'out'; returns how many. Exits if malformed. */
int cli_opt_list(struct cli_args *a, int *out, int max, long min, long max_value);

/* Exit with "unknown option" naming argv[i]. */
_Noreturn void cli_unknown_option(struct cli_args *a);

/* If argv[i] is -h/--help, print the usage to stdout and return true. */
bool cli_wants_help(struct cli_args *a);

/* The model path: 'path', else $NPULM_MODEL, else the shared stories260K if present; exits if
 * none. */
const char *cli_resolve_model(const char *cmd, const char *path);

/* Parse a compile option at argv[i] into 'cp' (see CLI_COMPILE_OPTIONS_HELP); false if argv[i]
 * is none. --ctx also means --buckets where 'ctx_is_buckets' (compile, inspect, diff; run and ppl
 * use -c/--ctx for the context length). A --calib file is read into cp->calib_text: free it with
 * cli_free_compile_params. */
bool cli_compile_option(struct cli_args *a, npulm_compile_params *cp, bool ctx_is_buckets);
void cli_free_compile_params(npulm_compile_params *cp);

/* The largest --batch. */
#define CLI_MAX_BATCH 4096

/* Add the chunk sizes batched decode of up to 'batch' sessions steps through (--batch: the powers
 * of two from 2 up to 'batch' rounded up to one) to cp->chunks, or to the default chunk sizes if
 * none were given; ascending, without repeats. Exits if they come to more than NPULM_MAX_CHUNKS. */
void cli_compile_batch(struct cli_args *a, npulm_compile_params *cp, int batch);

/* Compile a GGUF model in memory (a program file carries its program) unless 'reference',
 * drawing progress on stderr; exits on failure. */
void cli_compile_if_needed(const char *cmd, npulm_model *model, npulm_compile_params *cp,
                           bool reference);

/* A session option at a->argv[a->i] (--sparse MODE, --sparse-audit) into 'sp': true if it was
 * one (and consumed), false otherwise. */
bool cli_session_option(struct cli_args *a, npulm_session_params *sp);

/* An option of how the model is opened (--mem-budget SIZE, --cold) into 'op': true if it was
 * one (and consumed). */
bool cli_open_option(struct cli_args *a, npulm_open_params *op);

/* Progress of long work by phase (npulm_phase_progress_fn; 'user' a zeroed struct cli_progress):
 * on a terminal, a bar with the phase's name, its count and the time left, drawn once the phase
 * has run half a second and then at most ten times a second, and a last line with its duration;
 * elsewhere, with 'lines', only that last line for each phase. */
struct cli_progress {
  bool lines;
  char phase[32];
  double start, last_draw;
  bool drawn;
};
void cli_progress(void *user, const char *phase, const char *unit, uint64_t done, uint64_t total);

/* Monotonic clock in seconds. */
double cli_now(void);

/* What a session under a memory budget got from memory, as run -v and bench print it: the share
 * of the neuron bytes decode used that came from memory, the hit rates of the gate rows' and of
 * the up/down pairs' lookups (percent, 0 without any), and the neurons' read rate (MiB/s). */
struct cli_memory_rates {
  double from_memory, gate_hits, pair_hits, read_mib_s;
};
struct cli_memory_rates cli_memory_rates(const npulm_memory_stats *m);

#endif /* NPULM_TOOLS_CLI_UTIL_H */
