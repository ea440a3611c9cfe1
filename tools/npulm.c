/* The npulm command-line tool: run, compile, inspect, tokenize, ppl, synth. Uses only the public
 * API (npulm.h). */
#include <errno.h>
#include <math.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "commands.h"
#include "npulm.h"

#define DEFAULT_MODEL_PATH "../shared/models/stories260K.gguf"

static const char *const usage_main =
    "usage: npulm COMMAND [options]\n"
    "\n"
    "commands:\n"
    "  run        generate text from a prompt\n"
    "  compile    compile a model into a program file (.npu) of static NPU graphs\n"
    "  inspect    describe a program: graphs, NPU/CPU placement, fallbacks, memory\n"
    "  diff       compare the compiled model with the FP32 reference, op by op\n"
    "  tokenize   print the token ids of a text\n"
    "  ppl        measure perplexity on a text file (llama-perplexity's method)\n"
    "  synth      write a GGUF with the shapes of a real model and random weights\n"
    "  bench      measure prefill and decode speed (llama-bench's method), roofline, NPU model\n"
    "\n"
    "'npulm COMMAND --help' describes a command's options.\n";

/* The compile options, shared by compile and inspect, and by run and ppl on a GGUF model (which
 * they compile in memory). */
#define COMPILE_OPTIONS_HELP                                                                      \
  "  --quant MODE       how the NPU computes: w8a8-smooth (default: SmoothQuant), w8a8-shadow\n"  \
  "                     (outlier channels in float on the CPU), w8a8-naive, or f32\n"            \
  "  --float-ops LIST   ops kept in float on the CPU, from softmax,qk,pv (default all three;\n"  \
  "                     'none' for none)\n"                                                      \
  "  --calib FILE       calibration text (default: a built-in English text)\n"                  \
  "  --calib-tokens N   calibrate on at most N tokens of it (default 1024)\n"                   \
  "  --smooth-alpha A   SmoothQuant migration strength in (0, 1) (default 0.5)\n"               \
  "  --shadow-threshold T  outlier channel: calibrated max above T x the median (default 6)\n"  \
  "  --chunks LIST      prefill chunk sizes, ascending, comma-separated (default 32,128)\n"     \
  "  --buckets LIST     context buckets, ascending (default: powers of two from 128 up to the\n"\
  "                     model's context, which is always the last)\n"

static const char *const usage_run =
    "usage: npulm run [-m MODEL.gguf] [-p PROMPT] [options]\n"
    "\n"
    "Generate a continuation of PROMPT, streaming it to stdout; speeds go to stderr.\n"
    "\n"
    "  -m, --model FILE   model (default: $NPULM_MODEL, else " DEFAULT_MODEL_PATH ")\n"
    "  -p, --prompt TEXT  prompt (default: empty, generation starts from BOS)\n"
    "  -n, --n-predict N  tokens to generate (default 128; -1 = until end of text or context)\n"
    "  -c, --ctx N        context length (default: the model's, at most 4096)\n"
    "  --temp T           temperature; 0 = greedy (default 0.8)\n"
    "  --top-k K          keep the K most likely tokens; 0 = off (default 40)\n"
    "  --top-p P          nucleus sampling threshold; 1 = off (default 0.95)\n"
    "  --seed S           sampling seed (default: from the clock, printed to stderr)\n"
    "  -t, --threads N    threads (default: one per CPU)\n"
    "  --reference        run the FP32 reference forward instead of the compiled graphs\n"
    "\n"
    "A GGUF model is compiled in memory first (calibrated and quantized as compile would):\n"
    COMPILE_OPTIONS_HELP;

static const char *const usage_compile =
    "usage: npulm compile [-m MODEL.gguf] -o MODEL.npu [--chunks 32,128] [--ctx 128,256,512]\n"
    "\n"
    "Compile a model into static graphs, one per specialization (decode, and a prefill chunk of\n"
    "each size, for each context bucket), each partitioned between the NPU and the CPU and\n"
    "memory-planned, and write them with the configuration, tokenizer and weights as one\n"
    "program file, which run, ppl and inspect read with -m.\n"
    "\n"
    "  -m, --model FILE   model, GGUF or program file (default: $NPULM_MODEL, else\n"
    "                     " DEFAULT_MODEL_PATH ")\n"
    "  -o, --output FILE  program file to write\n"
    COMPILE_OPTIONS_HELP
    "  --ctx LIST         the same as --buckets\n";

static const char *const usage_inspect =
    "usage: npulm inspect [-m] MODEL.npu [--chunks LIST] [--ctx LIST]\n"
    "\n"
    "Describe a program: its specializations (rows, context, nodes, subgraphs, transfers, arena\n"
    "sizes), the placement of each op on the NPU or the CPU with counts, the ops that fall back\n"
    "to the CPU and why, and the sizes of the weights, the KV cache and the arenas. A GGUF model,\n"
    "or any model given --chunks or --ctx, is compiled in memory first (as compile would).\n"
    "\n"
    "  -m, --model FILE   program file or GGUF model (or give it as the only argument)\n"
    COMPILE_OPTIONS_HELP
    "  --ctx LIST         the same as --buckets\n";

static const char *const usage_diff =
    "usage: npulm diff [-m MODEL] -p TEXT [--json] [compile options]\n"
    "\n"
    "Run the FP32 reference and the compiled model side by side over TEXT, one token at a time,\n"
    "and print for every layer and op the SQNR (dB) and the largest absolute error of its output\n"
    "against the reference, then the KL divergence of the final next-token distributions: which\n"
    "op destroys accuracy. A GGUF model is compiled in memory first.\n"
    "\n"
    "  -m, --model FILE   program file or GGUF model\n"
    "  -p, --prompt TEXT  text to run (tokenized with BOS; at most the context)\n"
    "  --json             print the report as JSON\n"
    COMPILE_OPTIONS_HELP;

static const char *const usage_tokenize =
    "usage: npulm tokenize [-m MODEL.gguf] -p TEXT [--bos] [--text]\n"
    "\n"
    "Print the token ids of TEXT as [id, id, ...]. Special-token text (e.g. <s>) is parsed as\n"
    "the special token.\n"
    "\n"
    "  -m, --model FILE   model (default: $NPULM_MODEL, else " DEFAULT_MODEL_PATH ")\n"
    "  -p, --prompt TEXT  text to tokenize\n"
    "  --bos              prepend BOS\n"
    "  --text             also print each token's id, vocabulary string and decoded bytes\n";

static const char *const usage_ppl =
    "usage: npulm ppl [-m MODEL.gguf] -f TEXT_FILE [-c CTX] [-t THREADS]\n"
    "\n"
    "Perplexity by llama.cpp's llama-perplexity method: the tokenized file is split into\n"
    "non-overlapping windows of CTX tokens that start with BOS, and the second half of every\n"
    "window is scored. Figures compare one to one with llama-perplexity -c CTX.\n"
    "\n"
    "  -m, --model FILE   model (default: $NPULM_MODEL, else " DEFAULT_MODEL_PATH ")\n"
    "  -f, --file FILE    text to score\n"
    "  -c, --ctx N        window length (default 512)\n"
    "  -t, --threads N    windows scored in parallel (default: one per CPU)\n"
    "  --reference        score with the FP32 reference forward instead of the compiled graphs\n"
    "\n"
    "A GGUF model is compiled in memory first (calibrated and quantized as compile would):\n"
    COMPILE_OPTIONS_HELP;

static const char *const usage_synth =
    "usage: npulm synth --shape NAME [--seed S] [--type f32|f16|q8_0] -o FILE.gguf\n"
    "\n"
    "Write a GGUF with the exact tensor shapes and metadata of a real model, seeded random\n"
    "weights of realistic scale and a synthetic tokenizer: for speed work (llama.cpp loads it\n"
    "too). Random weights generate gibberish; accuracy is measured on trained models.\n"
    "\n"
    "  --shape NAME       one of the shapes listed below\n"
    "  --seed S           weight seed (default 1); the same seed writes the same file\n"
    "  --type T           f32 (default), f16 or q8_0 for the matrices; norms stay f32\n"
    "  -o, --output FILE  where to write\n";

/* ---- Argument parsing ----------------------------------------------------------------------- */

struct args {
  int argc;
  char **argv;
  int i;
  const char *cmd;
  const char *usage;
};

/* Fail with a one-line message and exit status 1. */
static _Noreturn void die(const char *cmd, const char *fmt, const char *detail) {
  fprintf(stderr, "npulm %s: ", cmd);
  fprintf(stderr, fmt, detail);
  fputc('\n', stderr);
  exit(1);
}

static bool is_opt(const char *arg, const char *short_name, const char *long_name) {
  return (short_name != NULL && strcmp(arg, short_name) == 0) || strcmp(arg, long_name) == 0;
}

/* The value of the option at argv[i]; exits if it is missing. */
static const char *opt_value(struct args *a) {
  if (a->i + 1 >= a->argc) die(a->cmd, "option %s needs a value", a->argv[a->i]);
  return a->argv[++a->i];
}

static long long opt_int(struct args *a, long long min, long long max) {
  const char *name = a->argv[a->i];
  const char *s = opt_value(a);
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno != 0 || *s == '\0' || *end != '\0' || v < min || v > max) {
    fprintf(stderr, "npulm %s: option %s: '%s' is not an integer in [%lld, %lld]\n", a->cmd, name,
            s, min, max);
    exit(1);
  }
  return v;
}

static float opt_float(struct args *a) {
  const char *name = a->argv[a->i];
  const char *s = opt_value(a);
  char *end;
  errno = 0;
  float v = strtof(s, &end);
  if (errno != 0 || *s == '\0' || *end != '\0') {
    fprintf(stderr, "npulm %s: option %s: '%s' is not a number\n", a->cmd, name, s);
    exit(1);
  }
  return v;
}

static _Noreturn void unknown_option(struct args *a) {
  fprintf(stderr, "npulm %s: unknown option '%s' (see 'npulm %s --help')\n", a->cmd,
          a->argv[a->i], a->cmd);
  exit(1);
}

static bool wants_help(struct args *a) {
  if (is_opt(a->argv[a->i], "-h", "--help")) {
    fputs(a->usage, stdout);
    return true;
  }
  return false;
}

/* The model path: -m, else $NPULM_MODEL, else the shared stories260K if present. */
static const char *resolve_model(const char *cmd, const char *path) {
  if (path != NULL) return path;
  const char *env = getenv("NPULM_MODEL");
  if (env != NULL && *env != '\0') return env;
  if (access(DEFAULT_MODEL_PATH, R_OK) == 0) return DEFAULT_MODEL_PATH;
  die(cmd, "%s", "no model given: pass -m MODEL.gguf or set NPULM_MODEL");
}

static npulm_model *open_model(const char *cmd, const char *path) {
  npulm_model *model;
  npulm_error err;
  if (npulm_model_open(path, &model, &err) != NPULM_OK) die(cmd, "%s", err.msg);
  return model;
}

/* Tokenize, growing the buffer as the text needs. Returns a malloc'd array of '*n' ids. */
static int32_t *tokenize_all(const char *cmd, const npulm_model *model, const char *text,
                             size_t len, bool add_bos, bool parse_special, size_t *n) {
  size_t cap = len + 8;
  int32_t *ids = malloc(cap * sizeof(int32_t));
  npulm_error err;
  if (ids == NULL) die(cmd, "%s", "out of memory");
  npulm_status st = npulm_tokenize(model, text, len, add_bos, parse_special, ids, cap, n, &err);
  if (st == NPULM_ERR_ARG && *n > cap) {
    int32_t *bigger = realloc(ids, *n * sizeof(int32_t));
    if (bigger == NULL) die(cmd, "%s", "out of memory");
    ids = bigger;
    st = npulm_tokenize(model, text, len, add_bos, parse_special, ids, *n, n, &err);
  }
  if (st != NPULM_OK) die(cmd, "%s", err.msg);
  return ids;
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A comma-separated list of positive integers for the option at argv[i]; exits if malformed. */
static int opt_list(struct args *a, int *out, int max) {
  const char *name = a->argv[a->i];
  const char *s = opt_value(a);
  int n = 0;
  const char *p = s;
  for (;;) {
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (errno != 0 || end == p || v < 1 || v > (1L << 24) || (*end != ',' && *end != '\0') ||
        n == max) {
      fprintf(stderr, "npulm %s: option %s: '%s' is not a list of at most %d positive integers\n",
              a->cmd, name, s, max);
      exit(1);
    }
    out[n++] = (int)v;
    if (*end == '\0') break;
    p = end + 1;
  }
  return n;
}

static char *read_file(const char *cmd, const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) die(cmd, "cannot open '%s'", path);
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  while (buf != NULL) {
    n += fread(buf + n, 1, cap - n, f);
    if (n < cap) break;
    char *bigger = realloc(buf, cap *= 2);
    if (bigger == NULL) free(buf);
    buf = bigger;
  }
  bool failed = ferror(f);
  fclose(f);
  if (buf == NULL) die(cmd, "%s", "out of memory");
  if (failed) die(cmd, "cannot read '%s'", path);
  *len = n;
  return buf;
}

/* Parse a compile option at argv[i] into 'cp'; false if argv[i] is none. --ctx means buckets
 * only where 'ctx_is_buckets' (compile, inspect; run and ppl use -c/--ctx for the context). A
 * --calib file is read into cp->calib_text (free it with free_compile_params). */
static bool compile_option(struct args *a, npulm_compile_params *cp, bool ctx_is_buckets) {
  const char *o = a->argv[a->i];
  if (is_opt(o, NULL, "--chunks")) cp->n_chunks = opt_list(a, cp->chunks, NPULM_MAX_CHUNKS);
  else if (is_opt(o, NULL, "--buckets") || (ctx_is_buckets && is_opt(o, NULL, "--ctx"))) {
    cp->n_buckets = opt_list(a, cp->buckets, NPULM_MAX_BUCKETS);
  } else if (is_opt(o, NULL, "--quant")) cp->quant = opt_value(a);
  else if (is_opt(o, NULL, "--float-ops")) cp->float_ops = opt_value(a);
  else if (is_opt(o, NULL, "--calib-tokens")) cp->calib_tokens = (int)opt_int(a, 1, 1 << 24);
  else if (is_opt(o, NULL, "--smooth-alpha")) cp->smooth_alpha = opt_float(a);
  else if (is_opt(o, NULL, "--shadow-threshold")) cp->shadow_threshold = opt_float(a);
  else if (is_opt(o, NULL, "--calib")) {
    free((char *)cp->calib_text);
    cp->calib_text = read_file(a->cmd, opt_value(a), &cp->calib_len);
  } else {
    return false;
  }
  return true;
}

static void free_compile_params(npulm_compile_params *cp) { free((char *)cp->calib_text); }

/* Calibration progress: a bar on a terminal. */
static void calib_progress(void *user, uint64_t done, uint64_t total) {
  (void)user;
  if (!isatty(STDERR_FILENO)) return;
  enum { WIDTH = 30 };
  int filled = total ? (int)(WIDTH * done / total) : WIDTH;
  char bar[WIDTH + 1];
  for (int i = 0; i < WIDTH; i++) bar[i] = i < filled ? '#' : '.';
  bar[WIDTH] = '\0';
  fprintf(stderr, "\rcalibrating [%s] %" PRIu64 "/%" PRIu64 " tokens", bar, done, total);
  if (done == total) fputc('\n', stderr);
}

/* Compile a GGUF model in memory (a program file carries its program) unless 'reference'. */
static void compile_if_needed(const char *cmd, npulm_model *model, npulm_compile_params *cp,
                              bool reference) {
  npulm_error err;
  if (reference || npulm_model_has_program(model)) return;
  cp->progress = calib_progress;
  if (npulm_model_compile(model, cp, &err) != NPULM_OK) die(cmd, "%s", err.msg);
}

/* Where the compiled engine's time went (nothing for the reference engine). */
static void print_engine_stats(const npulm_session *session) {
  npulm_session_stats st;
  npulm_session_get_stats(session, &st);
  if (st.n_steps == 0) return;
  double shorter = st.npu_busy_s < st.cpu_busy_s ? st.npu_busy_s : st.cpu_busy_s;
  fprintf(stderr,
          "engine: %" PRIu64 " graph steps | NPU busy %.3f s, CPU busy %.3f s, both at once %.3f s "
          "(%.0f%% of the shorter) | %" PRIu64 " transfers\n",
          st.n_steps, st.npu_busy_s, st.cpu_busy_s, st.overlap_s,
          shorter > 0 ? 100.0 * st.overlap_s / shorter : 0.0, st.n_transfers);
}

/* ---- run ------------------------------------------------------------------------------------ */

static void print_piece(const npulm_model *model, int32_t prev, int32_t id) {
  char buf[256];
  size_t n = npulm_token_to_piece(model, prev, id, buf, sizeof(buf));
  fwrite(buf, 1, n < sizeof(buf) ? n : sizeof(buf), stdout);
  fflush(stdout);
}

static int cmd_run(struct args *a) {
  const char *model_path = NULL, *prompt = "";
  long long n_predict = 128, seed = -1;
  npulm_session_params sp = npulm_session_default_params();
  npulm_sampler_params samp = npulm_sampler_default_params();
  npulm_compile_params cp = npulm_compile_default_params();
  for (a->i = 2; a->i < a->argc; a->i++) {
    const char *o = a->argv[a->i];
    if (wants_help(a)) return 0;
    else if (is_opt(o, "-m", "--model")) model_path = opt_value(a);
    else if (is_opt(o, "-p", "--prompt")) prompt = opt_value(a);
    else if (is_opt(o, "-n", "--n-predict")) n_predict = opt_int(a, -1, 1 << 30);
    else if (is_opt(o, "-c", "--ctx")) sp.n_ctx = (int)opt_int(a, 0, 1 << 30);
    else if (is_opt(o, "-t", "--threads")) sp.n_threads = (int)opt_int(a, 0, 1024);
    else if (is_opt(o, NULL, "--temp")) samp.temp = opt_float(a);
    else if (is_opt(o, NULL, "--top-k")) samp.top_k = (int)opt_int(a, 0, 1 << 30);
    else if (is_opt(o, NULL, "--top-p")) samp.top_p = opt_float(a);
    else if (is_opt(o, NULL, "--seed")) seed = opt_int(a, -1, INT64_MAX);
    else if (is_opt(o, NULL, "--reference")) sp.reference = true;
    else if (compile_option(a, &cp, false)) continue;
    else unknown_option(a);
  }
  model_path = resolve_model(a->cmd, model_path);
  npulm_model *model = open_model(a->cmd, model_path);
  compile_if_needed(a->cmd, model, &cp, sp.reference);
  free_compile_params(&cp);
  npulm_model_info info;
  npulm_model_get_info(model, &info);
  npulm_error err;
  npulm_session *session;
  if (npulm_session_create(model, &sp, &session, &err) != NPULM_OK) die(a->cmd, "%s", err.msg);
  samp.seed = seed >= 0 ? (uint64_t)seed : (uint64_t)time(NULL);
  npulm_sampler *sampler;
  if (npulm_sampler_create(&samp, info.n_vocab, &sampler, &err) != NPULM_OK) {
    die(a->cmd, "%s", err.msg);
  }

  size_t n_prompt;
  int32_t *tokens = tokenize_all(a->cmd, model, prompt, strlen(prompt), info.add_bos, false,
                                 &n_prompt);
  int n_ctx = npulm_session_ctx(session);
  if (n_prompt == 0) die(a->cmd, "%s", "the prompt is empty and the model adds no BOS token");
  if (n_prompt >= (size_t)n_ctx) {
    fprintf(stderr, "npulm run: the prompt has %zu tokens, more than the context of %d allows "
                    "(use -c to enlarge it, up to the model's %d)\n",
            n_prompt, n_ctx, info.n_ctx_train);
    exit(1);
  }

  /* prompt: echo it, then evaluate it in one go */
  fputs(prompt, stdout);
  fflush(stdout);
  double t0 = now_seconds();
  if (npulm_session_eval(session, tokens, n_prompt, NULL, &err) != NPULM_OK) {
    die(a->cmd, "%s", err.msg);
  }
  double t1 = now_seconds();

  /* generation: sample, print, feed back */
  int32_t prev = tokens[n_prompt - 1];
  long long n_gen = 0;
  const char *stop = "length limit";
  for (;;) {
    if (n_predict >= 0 && n_gen >= n_predict) break;
    if (npulm_session_pos(session) >= n_ctx) {
      stop = "context full";
      break;
    }
    int32_t next = npulm_sampler_sample(sampler, npulm_session_logits(session));
    if (npulm_token_is_eog(model, next)) {
      stop = "end of text";
      break;
    }
    print_piece(model, prev, next);
    n_gen++;
    prev = next;
    if (npulm_session_eval(session, &next, 1, NULL, &err) != NPULM_OK) die(a->cmd, "%s", err.msg);
  }
  double t2 = now_seconds();
  printf("\n");
  fprintf(stderr,
          "\nprompt: %zu tokens in %.3f s (%.1f tok/s) | generation: %lld tokens in %.3f s "
          "(%.1f tok/s) | stopped: %s | seed %" PRIu64 "\n",
          n_prompt, t1 - t0, (double)n_prompt / (t1 - t0 > 0 ? t1 - t0 : 1e-9), n_gen, t2 - t1,
          n_gen > 0 ? (double)n_gen / (t2 - t1 > 0 ? t2 - t1 : 1e-9) : 0.0, stop, samp.seed);
  print_engine_stats(session);
  free(tokens);
  npulm_sampler_free(sampler);
  npulm_session_free(session);
  npulm_model_close(model);
  return 0;
}

/* ---- compile and inspect -------------------------------------------------------------------- */



/* The write progress of compile: a bar on a terminal, once writing has taken half a second (so
 * that small models, done in well under a second, print none). */
struct compile_progress {
  double start, last_draw;
  bool shown;
};

static void draw_bar(uint64_t done, uint64_t total) {
  enum { WIDTH = 30 };
  int filled = total ? (int)(WIDTH * done / total) : WIDTH;
  char bar[WIDTH + 1];
  for (int i = 0; i < WIDTH; i++) bar[i] = i < filled ? '#' : '.';
  bar[WIDTH] = '\0';
  fprintf(stderr, "\rwriting weights [%s] %3d%% (%.1f / %.1f MB)", bar,
          total ? (int)(100 * done / total) : 100, (double)done / 1e6, (double)total / 1e6);
}

static void compile_progress(void *user, uint64_t done, uint64_t total) {
  struct compile_progress *cp = user;
  double now = now_seconds();
  if (!isatty(STDERR_FILENO)) return;
  if (done < total) {
    if (now - cp->start < 0.5 || now - cp->last_draw < 0.1) return;
    draw_bar(done, total);
    cp->shown = true;
    cp->last_draw = now;
  } else if (cp->shown) {
    draw_bar(done, total);
    fputc('\n', stderr);
  }
}

static int cmd_compile(struct args *a) {
  const char *model_path = NULL, *out = NULL;
  npulm_compile_params cp = npulm_compile_default_params();
  for (a->i = 2; a->i < a->argc; a->i++) {
    const char *o = a->argv[a->i];
    if (wants_help(a)) return 0;
    else if (is_opt(o, "-m", "--model")) model_path = opt_value(a);
    else if (is_opt(o, "-o", "--output")) out = opt_value(a);
    else if (compile_option(a, &cp, true)) continue;
    else unknown_option(a);
  }
  if (out == NULL) die(a->cmd, "%s", "no output file: pass -o MODEL.npu");
  double t0 = now_seconds();
  npulm_model *model = open_model(a->cmd, resolve_model(a->cmd, model_path));
  npulm_error err;
  cp.progress = calib_progress;
  if (npulm_model_compile(model, &cp, &err) != NPULM_OK) die(a->cmd, "%s", err.msg);
  free_compile_params(&cp);
  double t1 = now_seconds();
  struct compile_progress progress = {.start = t1, .last_draw = 0, .shown = false};
  if (npulm_model_save_program(model, out, compile_progress, &progress, &err) != NPULM_OK) {
    die(a->cmd, "%s", err.msg);
  }
  double t2 = now_seconds();
  FILE *f = fopen(out, "rb");
  long size = -1;
  if (f != NULL && fseek(f, 0, SEEK_END) == 0) size = ftell(f);
  if (f != NULL) fclose(f);
  fprintf(stderr, "wrote %s (%.1f MB): loaded and compiled in %.2f s, written in %.2f s; "
                  "'npulm inspect %s' describes it\n",
          out, (double)size / 1e6, t1 - t0, t2 - t1, out);
  npulm_model_close(model);
  return 0;
}

static int cmd_inspect(struct args *a) {
  const char *model_path = NULL;
  npulm_compile_params cp = npulm_compile_default_params();
  for (a->i = 2; a->i < a->argc; a->i++) {
    const char *o = a->argv[a->i];
    if (wants_help(a)) return 0;
    else if (is_opt(o, "-m", "--model")) model_path = opt_value(a);
    else if (compile_option(a, &cp, true)) continue;
    else if (o[0] != '-' && model_path == NULL) model_path = o;
    else unknown_option(a);
  }
  if (model_path == NULL) die(a->cmd, "%s", "no program: pass MODEL.npu (or -m MODEL)");
  npulm_model *model = open_model(a->cmd, model_path);
  npulm_error err;
  if (!npulm_model_has_program(model) || cp.n_chunks > 0 || cp.n_buckets > 0 || cp.quant ||
      cp.float_ops || cp.calib_text) {
    cp.progress = calib_progress;
    if (npulm_model_compile(model, &cp, &err) != NPULM_OK) die(a->cmd, "%s", err.msg);
    printf("(%s compiled in memory)\n", model_path);
  }
  free_compile_params(&cp);
  if (npulm_model_print_program(model, stdout, &err) != NPULM_OK) die(a->cmd, "%s", err.msg);
  npulm_model_close(model);
  return 0;
}

/* ---- tokenize ------------------------------------------------------------------------------- */

static int cmd_tokenize(struct args *a) {
  const char *model_path = NULL, *text = NULL;
  bool bos = false, show_text = false;
  for (a->i = 2; a->i < a->argc; a->i++) {
    const char *o = a->argv[a->i];
    if (wants_help(a)) return 0;
    else if (is_opt(o, "-m", "--model")) model_path = opt_value(a);
    else if (is_opt(o, "-p", "--prompt")) text = opt_value(a);
    else if (is_opt(o, NULL, "--bos")) bos = true;
    else if (is_opt(o, NULL, "--text")) show_text = true;
    else unknown_option(a);
  }
  if (text == NULL) die(a->cmd, "%s", "no text: pass -p TEXT");
  npulm_model *model = open_model(a->cmd, resolve_model(a->cmd, model_path));
  size_t n;
  int32_t *ids = tokenize_all(a->cmd, model, text, strlen(text), bos, true, &n);
  printf("[");
  for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
  printf("]\n");
  if (show_text) {
    for (size_t i = 0; i < n; i++) {
      char buf[256];
      size_t len = npulm_token_to_piece(model, i ? ids[i - 1] : -1, ids[i], buf, sizeof(buf));
      printf("%6d -> '%s' '%.*s'\n", ids[i], npulm_token_text(model, ids[i]),
             (int)(len < sizeof(buf) ? len : sizeof(buf)), buf);
    }
  }
  free(ids);
  npulm_model_close(model);
  return 0;
}

/* ---- ppl ------------------------------------------------------------------------------------ */

struct ppl_header {
  const char *model, *file;
  int n_ctx, n_threads;
  bool announced;
};

static void ppl_progress(void *user, int done, int total, double running) {
  struct ppl_header *h = user;
  /* announced once work is under way, so that a failure before it stays a one-line error */
  if (!h->announced) {
    fprintf(stderr, "perplexity of %s on %s: %d windows of %d tokens, %d threads\n", h->model,
            h->file, total, h->n_ctx, h->n_threads);
    h->announced = true;
  }
  fprintf(stderr, "[%d/%d] running PPL %.4f\n", done, total, running);
}


static int cmd_ppl(struct args *a) {
  const char *model_path = NULL, *file = NULL;
  int n_ctx = 512, n_threads = 0;
  bool reference = false;
  npulm_compile_params cp = npulm_compile_default_params();
  for (a->i = 2; a->i < a->argc; a->i++) {
    const char *o = a->argv[a->i];
    if (wants_help(a)) return 0;
    else if (is_opt(o, "-m", "--model")) model_path = opt_value(a);
    else if (is_opt(o, "-f", "--file")) file = opt_value(a);
    else if (is_opt(o, "-c", "--ctx")) n_ctx = (int)opt_int(a, 1, 1 << 24);
    else if (is_opt(o, "-t", "--threads")) n_threads = (int)opt_int(a, 0, 64);
    else if (is_opt(o, NULL, "--reference")) reference = true;
    else if (compile_option(a, &cp, false)) continue;
    else unknown_option(a);
  }
  if (file == NULL) die(a->cmd, "%s", "no text file: pass -f FILE");
  if (n_threads == 0) n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
  const char *path = resolve_model(a->cmd, model_path);
  npulm_model *model = open_model(a->cmd, path);
  size_t len;
  char *text = read_file(a->cmd, file, &len);
  compile_if_needed(a->cmd, model, &cp, reference);
  free_compile_params(&cp);
  struct ppl_header header = {path, file, n_ctx, n_threads, false};
  npulm_ppl_result r;
  npulm_error err;
  npulm_status st =
      reference ? npulm_perplexity_reference(model, text, len, n_ctx, n_threads, ppl_progress,
                                             &header, &r, &err)
                : npulm_perplexity(model, text, len, n_ctx, n_threads, ppl_progress, &header, &r,
                                   &err);
  if (st != NPULM_OK) die(a->cmd, "%s", err.msg);
  printf("Final estimate: PPL = %.4f +/- %.5f (%d chunks of %d tokens, %" PRIu64
         " tokens scored, %.2f s)\n",
         r.ppl, r.ppl_stderr, r.n_chunks, r.n_ctx, r.n_scored, r.seconds);
  free(text);
  npulm_model_close(model);
  return 0;
}

/* ---- synth ---------------------------------------------------------------------------------- */

static void synth_progress(void *user, uint64_t done, uint64_t total) {
  (void)user;
  if (isatty(STDERR_FILENO) || done == total) {
    fprintf(stderr, "\rwriting: %3d%% (%.1f / %.1f MB)", total ? (int)(100 * done / total) : 100,
            (double)done / 1e6, (double)total / 1e6);
    if (done == total) fputc('\n', stderr);
  }
}

static int cmd_synth(struct args *a) {
  const char *shape = NULL, *type = "f32", *out = NULL;
  long long seed = 1;
  for (a->i = 2; a->i < a->argc; a->i++) {
    const char *o = a->argv[a->i];
    if (wants_help(a)) {
      printf("\nshapes:");
      for (const char *const *s = npulm_synth_shapes(); *s != NULL; s++) printf(" %s", *s);
      printf("\n");
      return 0;
    } else if (is_opt(o, NULL, "--shape")) shape = opt_value(a);
    else if (is_opt(o, NULL, "--seed")) seed = opt_int(a, 0, INT64_MAX);
    else if (is_opt(o, NULL, "--type")) type = opt_value(a);
    else if (is_opt(o, "-o", "--output")) out = opt_value(a);
    else unknown_option(a);
  }
  if (shape == NULL) die(a->cmd, "%s", "no shape: pass --shape NAME (see --help)");
  if (out == NULL) die(a->cmd, "%s", "no output file: pass -o FILE.gguf");
  npulm_error err;
  if (npulm_synth(shape, (uint64_t)seed, type, out, synth_progress, NULL, &err) != NPULM_OK) {
    die(a->cmd, "%s", err.msg);
  }
  fprintf(stderr, "wrote %s (shape %s, %s, seed %lld)\n", out, shape, type, seed);
  return 0;
}

/* ---- diff ----------------------------------------------------------------------------------- */

static void print_diff_json(const npulm_diff_report *r) {
  json_t *root = json_object(), *ops = json_array();
  for (int i = 0; i < r->n_entries; i++) {
    const npulm_diff_entry *e = &r->entries[i];
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(e->name));
    json_object_set_new(o, "layer", json_integer(e->layer));
    json_object_set_new(o, "op", json_string(e->op != NULL ? e->op : "?"));
    json_object_set_new(o, "backend", json_string(e->backend != NULL ? e->backend : "?"));
    json_object_set_new(o, "dtype", json_string(e->dtype != NULL ? e->dtype : "?"));
    /* JSON has no infinity: an exact match has a null SQNR */
    json_object_set_new(o, "sqnr_db", isfinite(e->sqnr_db) ? json_real(e->sqnr_db) : json_null());
    json_object_set_new(o, "max_abs_err", json_real(e->max_abs_err));
    json_array_append_new(ops, o);
  }
  json_object_set_new(root, "n_tokens", json_integer(r->n_tokens));
  json_object_set_new(root, "ops", ops);
  json_object_set_new(root, "kl_mean", json_real(r->kl_mean));
  json_object_set_new(root, "kl_max", json_real(r->kl_max));
  json_object_set_new(root, "top1_agreement", json_real(r->top1_agreement));
  json_dumpf(root, stdout, JSON_INDENT(2));
  fputc('\n', stdout);
  json_decref(root);
}

static int cmd_diff(struct args *a) {
  const char *model_path = NULL, *text = NULL;
  bool json = false;
  npulm_compile_params cp = npulm_compile_default_params();
  for (a->i = 2; a->i < a->argc; a->i++) {
    const char *o = a->argv[a->i];
    if (wants_help(a)) return 0;
    else if (is_opt(o, "-m", "--model")) model_path = opt_value(a);
    else if (is_opt(o, "-p", "--prompt")) text = opt_value(a);
    else if (is_opt(o, NULL, "--json")) json = true;
    else if (compile_option(a, &cp, true)) continue;
    else unknown_option(a);
  }
  if (text == NULL) die(a->cmd, "%s", "no text: pass -p TEXT");
  npulm_model *model = open_model(a->cmd, resolve_model(a->cmd, model_path));
  compile_if_needed(a->cmd, model, &cp, false);
  free_compile_params(&cp);
  npulm_diff_report *r;
  npulm_error err;
  if (npulm_diff(model, text, strlen(text), &r, &err) != NPULM_OK) die(a->cmd, "%s", err.msg);
  if (json) {
    print_diff_json(r);
  } else {
    printf("%-24s %-9s %-4s %-4s %10s %12s\n", "activation", "op", "on", "type", "SQNR dB",
           "max |err|");
    for (int i = 0; i < r->n_entries; i++) {
      const npulm_diff_entry *e = &r->entries[i];
      printf("%-24s %-9s %-4s %-4s %10.2f %12.5f\n", e->name, e->op != NULL ? e->op : "?",
             e->backend != NULL ? e->backend : "?", e->dtype != NULL ? e->dtype : "?",
             e->sqnr_db, e->max_abs_err);
    }
    printf("final logits over %d tokens: KL(reference || compiled) mean %.6f, max %.6f; "
           "top-1 agreement %.1f%%\n",
           r->n_tokens, r->kl_mean, r->kl_max, 100.0 * r->top1_agreement);
  }
  npulm_diff_free(r);
  npulm_model_close(model);
  return 0;
}

/* bench lives in tools/bench.c */
static int cmd_bench(struct args *a) { return npulm_cmd_bench(a->argc, a->argv); }

/* ---- main ----------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  static const struct {
    const char *name;
    int (*fn)(struct args *);
    const char *usage;
  } commands[] = {
      {"run", cmd_run, usage_run},
      {"compile", cmd_compile, usage_compile},
      {"inspect", cmd_inspect, usage_inspect},
      {"diff", cmd_diff, usage_diff},
      {"tokenize", cmd_tokenize, usage_tokenize},
      {"ppl", cmd_ppl, usage_ppl},
      {"synth", cmd_synth, usage_synth},
      {"bench", cmd_bench, npulm_usage_bench},
  };
  if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
    fputs(usage_main, argc < 2 ? stderr : stdout);
    return argc < 2 ? 1 : 0;
  }
  for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
    if (strcmp(argv[1], commands[i].name) == 0) {
      struct args a = {.argc = argc, .argv = argv, .i = 2, .cmd = argv[1], .usage = commands[i].usage};
      return commands[i].fn(&a);
    }
  }
  fprintf(stderr, "npulm: unknown command '%s' (see 'npulm --help')\n", argv[1]);
  return 1;
}
