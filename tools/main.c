/* The npulm command-line tool: run, compile, inspect, verify, tokenize, ppl, synth. Uses only the
 * public API (npulm.h). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cli_util.h"
#include "commands.h"
#include "npulm.h"

/* The help texts, laid out line for line as they print (clang-format would join a string and the
 * option list macro that follows it). */
/* clang-format off */
static const char *const usage_main =
    "usage: npulm COMMAND [options]\n"
    "\n"
    "commands:\n"
    "  run        generate text from a prompt\n"
    "  compile    compile a model into a program file (.npu) of static NPU graphs\n"
    "  inspect    describe a program: graphs, NPU/CPU placement, fallbacks, memory\n"
    "  verify     check a program file: every checksum, then every structural check\n"
    "  diff       compare the compiled model with the FP32 reference, op by op\n"
    "  tokenize   print the token ids of a text\n"
    "  ppl        measure perplexity on a text file (llama-perplexity's method)\n"
    "  synth      write a GGUF with the shapes of a real model and random weights\n"
    "  bench      measure prefill and decode speed (llama-bench's method), roofline, NPU model\n"
    "  version    print the version and the commit it was built from (also: npulm --version)\n"
    "\n"
    "'npulm COMMAND --help' describes a command's options.\n";

static const char *const usage_run =
    "usage: npulm run [-m MODEL.gguf] [-p PROMPT] [options]\n"
    "\n"
    "Generate a continuation of PROMPT, streaming it to stdout; speeds go to stderr.\n"
    "\n"
    "  -m, --model FILE   model (default: $NPULM_MODEL, else " CLI_DEFAULT_MODEL_PATH ")\n"
    "  -p, --prompt TEXT  prompt (default: empty, generation starts from BOS)\n"
    "  -n, --n-predict N  tokens to generate (default 128; -1 = until end of text or context)\n"
    "  -c, --ctx N        context length (default: the model's, at most 4096)\n"
    "  --temp T           temperature; 0 = greedy (default 0.8)\n"
    "  --top-k K          keep the K most likely tokens; 0 = off (default 40)\n"
    "  --top-p P          nucleus sampling threshold; 1 = off (default 0.95)\n"
    "  --seed S           sampling seed (default: from the clock, printed to stderr)\n"
    "  -t, --threads N    threads the NPU's matmuls are cut across (default: one per CPU)\n"
    "  --reference        run the FP32 reference forward instead of the compiled graphs\n"
    CLI_SESSION_OPTIONS_HELP
    CLI_OPEN_OPTIONS_HELP
    "\n"
    "A GGUF model is compiled in memory first (calibrated and quantized as compile would):\n"
    CLI_COMPILE_OPTIONS_HELP;

static const char *const usage_compile =
    "usage: npulm compile [-m MODEL.gguf] -o MODEL.npu [--quant MODE] [--chunks LIST] [--ctx LIST]\n"
    "\n"
    "Compile a model into static graphs, one per specialization (decode, and a prefill chunk of\n"
    "each size, for each context bucket), each partitioned between the NPU and the CPU and\n"
    "memory-planned, and write them with the configuration, tokenizer and weights as one\n"
    "program file, which run, ppl and inspect read with -m.\n"
    "\n"
    "An integer program is compiled from the GGUF a block at a time, so memory stays near one\n"
    "block's float weights at any model size; its packed weights wait in a scratch file beside\n"
    "the output (the disk needs room for them twice; the file is gone when compile ends, however\n"
    "it ends). f32 programs, --keep-float and a program file as the model are compiled in memory.\n"
    "Each phase shows a bar on a terminal, else one line when it ends, with its duration.\n"
    "\n"
    "  -m, --model FILE   model, GGUF or program file (default: $NPULM_MODEL, else\n"
    "                     " CLI_DEFAULT_MODEL_PATH ")\n"
    "  -o, --output FILE  program file to write\n"
    CLI_COMPILE_OPTIONS_HELP
    "  -t, --threads N    calibration threads (default: one per online CPU)\n"
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
    CLI_COMPILE_OPTIONS_HELP
    "  -t, --threads N    calibration threads (default: one per online CPU)\n"
    "  --ctx LIST         the same as --buckets\n";

static const char *const usage_verify =
    "usage: npulm verify [-m] MODEL.npu\n"
    "\n"
    "Check a program file whole: every checksum (XXH3-64 of the header and of each tensor,\n"
    "together every byte of the file), naming each damaged part and its bytes; then, if none\n"
    "is damaged, everything loading checks (graphs, quantization, memory plan). Exits 0 only if\n"
    "the file is sound. (Loading checks the same checksums before it uses any byte.)\n"
    "\n"
    "  -m, --model FILE   program file (or give it as the only argument)\n";

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
    CLI_COMPILE_OPTIONS_HELP;

static const char *const usage_tokenize =
    "usage: npulm tokenize [-m MODEL.gguf] -p TEXT [--bos] [--text]\n"
    "\n"
    "Print the token ids of TEXT as [id, id, ...]. Special-token text (e.g. <s>) is parsed as\n"
    "the special token.\n"
    "\n"
    "  -m, --model FILE   model, or a vocabulary-only GGUF (default: $NPULM_MODEL, else\n"
    "                     " CLI_DEFAULT_MODEL_PATH ")\n"
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
    "  -m, --model FILE   model (default: $NPULM_MODEL, else " CLI_DEFAULT_MODEL_PATH ")\n"
    "  -f, --file FILE    text to score\n"
    "  -c, --ctx N        window length (default 512)\n"
    "  -t, --threads N    windows scored in parallel (default: one per CPU)\n"
    "  --reference        score with the FP32 reference forward instead of the compiled graphs\n"
    "  --decode           evaluate each window a token at a time, as decode steps (the path sparse\n"
    "                     decode takes; --sparse implies it)\n"
    CLI_SESSION_OPTIONS_HELP CLI_OPEN_OPTIONS_HELP
    "\n"
    "A GGUF model is compiled in memory first (calibrated and quantized as compile would):\n"
    CLI_COMPILE_OPTIONS_HELP;

static const char *const usage_synth =
    "usage: npulm synth --shape NAME [--seed S] [--type TYPE] -o FILE.gguf\n"
    "\n"
    "Write a GGUF with the exact tensor shapes and metadata of a real model, seeded random\n"
    "weights of realistic scale and a synthetic tokenizer: for speed work (llama.cpp loads it\n"
    "too). Random weights generate gibberish; accuracy is measured on trained models.\n"
    "\n"
    "  --shape NAME       one of the shapes listed below\n"
    "  --seed S           weight seed (default 1); the same seed writes the same file\n"
    "  --type TYPE        the matrices' type: f32 (default), f16, bf16, q4_0, q8_0, q4_k or q6_k\n"
    "                     (quantized as llama-quantize quantizes, bit for bit; q4_k and q6_k need\n"
    "                     rows of whole 256-value blocks: stories110M, llama-*, qwen2.5-1.5b, -7b);\n"
    "                     norms stay f32; q4_0 is llama.cpp's Q4_0 mix, its classifier in q6_k\n"
    "                     (q8_0 where rows are not 256-value blocks). Weights are made and written\n"
    "                     in chunks: memory stays small at every shape\n"
    "  -o, --output FILE  where to write\n";
/* clang-format on */

/* ---- Helpers -------------------------------------------------------------------------------- */

static npulm_model *open_model(const char *cmd, const char *path) {
  npulm_model *model;
  npulm_error err;
  if (npulm_model_open(path, &model, &err) != NPULM_OK) cli_die(cmd, "%s", err.msg);
  return model;
}

static npulm_model *open_model_params(const char *cmd, const char *path,
                                      const npulm_open_params *op) {
  npulm_model *model;
  npulm_error err;
  if (npulm_model_open_params(path, op, &model, &err) != NPULM_OK) cli_die(cmd, "%s", err.msg);
  return model;
}

/* Tokenize, growing the buffer as the text needs. Returns a malloc'd array of '*n' ids. */
static int32_t *tokenize_all(const char *cmd, const npulm_model *model, const char *text,
                             size_t len, bool add_bos, bool parse_special, size_t *n) {
  size_t cap = len + 8;
  int32_t *ids = malloc(cap * sizeof(int32_t));
  npulm_error err;
  if (ids == NULL) cli_die(cmd, "%s", "out of memory");
  npulm_status st = npulm_tokenize(model, text, len, add_bos, parse_special, ids, cap, n, &err);
  if (st == NPULM_ERR_ARG && *n > cap) {
    int32_t *bigger = realloc(ids, *n * sizeof(int32_t));
    if (bigger == NULL) cli_die(cmd, "%s", "out of memory");
    ids = bigger;
    st = npulm_tokenize(model, text, len, add_bos, parse_special, ids, *n, n, &err);
  }
  if (st != NPULM_OK) cli_die(cmd, "%s", err.msg);
  return ids;
}

/* Compile a GGUF model in memory (a program file carries its program) unless 'reference'. */
static void compile_if_needed(const char *cmd, npulm_model *model, npulm_compile_params *cp,
                              bool reference) {
  npulm_error err;
  if (reference || npulm_model_has_program(model)) return;
  static struct cli_progress progress;
  cp->progress = cli_progress;
  cp->progress_user = &progress;
  if (npulm_model_compile(model, cp, &err) != NPULM_OK) cli_die(cmd, "%s", err.msg);
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

/* What sparse decode did (nothing when decode was dense). */
static void print_sparse_stats(const npulm_session *session) {
  npulm_sparse_stats st;
  npulm_session_sparse_stats(session, &st);
  if (st.layer_steps == 0) return;
  fprintf(stderr,
          "sparse decode: %" PRIu64 " FFN steps | %.1f%% of neurons computed, %.1f%% candidates | "
          "predictor %.3f s, rest of the FFNs %.3f s",
          st.layer_steps, 100.0 * st.kept, 100.0 * st.candidates, st.predict_s, st.ffn_s);
  if (!isnan(st.recall)) fprintf(stderr, " | recall %.4f", st.recall);
  fputc('\n', stderr);
}

/* The process's peak resident set (VmHWM), in bytes; 0 if unknown. */
static uint64_t peak_rss(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  uint64_t kb = 0;
  while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
    if (sscanf(line, "VmHWM: %" SCNu64, &kb) == 1) break;
  }
  if (f != NULL) fclose(f);
  return kb * 1024;
}

/* Where the weights were under a memory budget, and what decode read from storage per step. */
static void print_memory_stats(const npulm_session *session, long long steps) {
  npulm_memory_stats m;
  npulm_session_memory_stats(session, &m);
  if (m.budget == 0) return;
  const double mib = 1024.0 * 1024.0, per = steps > 0 ? (double)steps : 1.0;
  const uint64_t lookups = m.hits + m.misses;
  fprintf(stderr,
          "memory: budget %.1f MiB: %.1f MiB of weights held, %.1f MiB streamed, neuron cache "
          "%.1f MiB hot + %.1f MiB recent | peak RSS %.1f MiB\n"
          "storage: %.2f MiB of neurons and %.2f MiB of streamed weights per step, neurons read "
          "at %.0f MiB/s (I/O thread busy %.3f s, decode waited %.3f s) | neuron cache hit rate "
          "%.1f%%\n",
          (double)m.budget / mib, (double)m.pinned_bytes / mib, (double)m.streamed_bytes / mib,
          (double)m.hot_bytes / mib, (double)m.cache_bytes / mib, (double)peak_rss() / mib,
          (double)m.bytes_read / mib / per, (double)m.streamed_read / mib / per,
          m.read_s > 0 ? (double)m.bytes_read / mib / m.read_s : 0.0, m.read_s, m.io_wait_s,
          lookups > 0 ? 100.0 * (double)m.hits / (double)lookups : 0.0);
}

/* ---- run ------------------------------------------------------------------------------------ */

static void print_piece(const npulm_model *model, int32_t prev, int32_t id) {
  char buf[256];
  size_t n = npulm_token_to_piece(model, prev, id, buf, sizeof(buf));
  fwrite(buf, 1, n < sizeof(buf) ? n : sizeof(buf), stdout);
  fflush(stdout);
}

static int cmd_run(struct cli_args *a) {
  const char *model_path = NULL, *prompt = "";
  long long n_predict = 128, seed = -1;
  npulm_session_params sp = npulm_session_default_params();
  npulm_sampler_params samp = npulm_sampler_default_params();
  npulm_compile_params cp = npulm_compile_default_params();
  npulm_open_params op = {0};
  for (a->i = 2; a->i < a->argc; a->i++) {
    const char *o = a->argv[a->i];
    if (cli_wants_help(a)) return 0;
    else if (cli_is_opt(o, "-m", "--model")) model_path = cli_opt_value(a);
    else if (cli_open_option(a, &op)) continue;
    else if (cli_is_opt(o, "-p", "--prompt")) prompt = cli_opt_value(a);
    else if (cli_is_opt(o, "-n", "--n-predict")) n_predict = cli_opt_int(a, -1, 1 << 30);
    else if (cli_is_opt(o, "-c", "--ctx")) sp.n_ctx = (int)cli_opt_int(a, 0, 1 << 30);
    else if (cli_is_opt(o, "-t", "--threads")) sp.n_threads = (int)cli_opt_int(a, 0, 1024);
    else if (cli_is_opt(o, NULL, "--temp")) samp.temp = cli_opt_float(a);
    else if (cli_is_opt(o, NULL, "--top-k")) samp.top_k = (int)cli_opt_int(a, 0, 1 << 30);
    else if (cli_is_opt(o, NULL, "--top-p")) samp.top_p = cli_opt_float(a);
    else if (cli_is_opt(o, NULL, "--seed")) seed = cli_opt_int(a, -1, INT64_MAX);
    else if (cli_is_opt(o, NULL, "--reference")) sp.reference = true;
    else if (cli_session_option(a, &sp)) continue;
    else if (cli_compile_option(a, &cp, false)) continue;
    else cli_unknown_option(a);
  }
  model_path = cli_resolve_model(a->cmd, model_path);
  npulm_model *model = open_model_params(a->cmd, model_path, &op);
  compile_if_needed(a->cmd, model, &cp, sp.reference);
  cli_free_compile_params(&cp);
  npulm_model_info info;
  npulm_model_get_info(model, &info);
  npulm_error err;
  npulm_session *session;
  if (npulm_session_create(model, &sp, &session, &err) != NPULM_OK) cli_die(a->cmd, "%s", err.msg);
  samp.seed = seed >= 0 ? (uint64_t)seed : (uint64_t)time(NULL);
  npulm_sampler *sampler;
  if (npulm_sampler_create(&samp, info.n_vocab, &sampler, &err) != NPULM_OK) {
    cli_die(a->cmd, "%s", err.msg);
  }

  size_t n_prompt;
  int32_t *tokens =
      tokenize_all(a->cmd, model, prompt, strlen(prompt), info.add_bos, false, &n_prompt);
  int n_ctx = npulm_session_ctx(session);
  if (n_prompt == 0) cli_die(a->cmd, "%s", "the prompt is empty and the model adds no BOS token");
  if (n_prompt >= (size_t)n_ctx) {
    fprintf(stderr,
            "npulm run: the prompt has %zu tokens, more than the context of %d allows "
            "(use -c to enlarge it, up to the model's %d)\n",
            n_prompt, n_ctx, info.n_ctx_train);
    exit(1);
  }

  /* prompt: echo it, then evaluate it in one go */
  fputs(prompt, stdout);
  fflush(stdout);
  double t0 = cli_now();
  if (npulm_session_eval(session, tokens, n_prompt, NULL, &err) != NPULM_OK) {
    cli_die(a->cmd, "%s", err.msg);
  }
  double t1 = cli_now();

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
    if (npulm_session_eval(session, &next, 1, NULL, &err) != NPULM_OK)
      cli_die(a->cmd, "%s", err.msg);
  }
  double t2 = cli_now();
  printf("\n");
  fprintf(stderr,
          "\nprompt: %zu tokens in %.3f s (%.1f tok/s) | generation: %lld tokens in %.3f s "
          "(%.1f tok/s) | stopped: %s | seed %" PRIu64 "\n",
          n_prompt, t1 - t0, (double)n_prompt / (t1 - t0 > 0 ? t1 - t0 : 1e-9), n_gen, t2 - t1,
          n_gen > 0 ? (double)n_gen / (t2 - t1 > 0 ? t2 - t1 : 1e-9) : 0.0, stop, samp.seed);
  print_engine_stats(session);
  print_sparse_stats(session);
  print_memory_stats(session, n_gen + 1);
  free(tokens);
  npulm_sampler_free(sampler);
  npulm_session_free(session);
  npulm_model_close(model);
  return 0;
}

/* ---- compile and inspect -------------------------------------------------------------------- */

static int cmd_compile(struct cli_args *a) {
  const char *model_path = NULL, *out = NULL;
  npulm_compile_params cp = npulm_compile_default_params();
  for (a->i = 2; a->i < a->argc; a->i++) {
    const char *o = a->argv[a->i];
    if (cli_wants_help(a)) return 0;
    else if (cli_is_opt(o, "-m", "--model")) model_path = cli_opt_value(a);
    else if (cli_is_opt(o, "-o", "--output")) out = cli_opt_value(a);
    else if (cli_is_opt(o, "-t", "--threads")) cp.n_threads = (int)cli_opt_int(a, 1, 1024);
    else if (cli_compile_option(a, &cp, true)) continue;
    else cli_unknown_option(a);
  }
  if (out == NULL) cli_die(a->cmd, "%s", "no output file: pass -o MODEL.npu");
  model_path = cli_resolve_model(a->cmd, model_path);
  struct stat in_st, out_st;
  if (stat(model_path, &in_st) == 0 && stat(out, &out_st) == 0 && in_st.st_dev == out_st.st_dev &&
      in_st.st_ino == out_st.st_ino) {
    /* said before compiling; the library refuses it too, after */
    cli_die(a->cmd, "'%s' is the model's own file: write the program to another path", out);
  }
  double t0 = cli_now();
  npulm_error err;
  struct cli_progress progress = {.lines = true};
  cp.progress = cli_progress;
  cp.progress_user = &progress;
  npulm_status st = npulm_compile_file(model_path, out, &cp, &err);
  cli_free_compile_params(&cp);
  if (st != NPULM_OK) cli_die(a->cmd, "%s", err.msg);
  double t1 = cli_now();
  FILE *f = fopen(out, "rb");
  long size = -1;
  if (f != NULL && fseek(f, 0, SEEK_END) == 0) size = ftell(f);
  if (f != NULL) fclose(f);
  fprintf(stderr, "wrote %s (%.1f MB) in %.2f s; 'npulm inspect %s' describes it\n", out,
          (double)size / 1e6, t1 - t0, out);
  return 0;
}

static int cmd_inspect(struct cli_args *a) {
  const char *model_path = NULL;
  npulm_compile_params cp = npulm_compile_default_params();
  for (a->i = 2; a->i < a->argc; a->i++) {
    const char *o = a->argv[a->i];
    if (cli_wants_help(a)) return 0;
    else if (cli_is_opt(o, "-m", "--model")) model_path = cli_opt_value(a);
    else if (cli_compile_option(a, &cp, true)) continue;
    else if (o[0] != '-' && model_path == NULL) model_path = o;
    else cli_unknown_option(a);
  }
  if (model_path == NULL) cli_die(a->cmd, "%s", "no program: pass MODEL.npu (or -m MODEL)");
  npulm_model *model = open_model(a->cmd, model_path);
  npulm_error err;
  if (!npulm_model_has_program(model) || cp.n_chunks > 0 || cp.n_buckets > 0 || cp.quant ||
      cp.float_ops || cp.calib_text) {
    struct cli_progress progress = {.lines = false};
    cp.progress = cli_progress;
    cp.progress_user = &progress;
    if (npulm_model_compile(model, &cp, &err) != NPULM_OK) cli_die(a->cmd, "%s", err.msg);
    printf("(%s compiled in memory)\n", model_path);
  }
  cli_free_compile_params(&cp);
  if (npulm_model_print_program(model, stdout, &err) != NPULM_OK) cli_die(a->cmd, "%s", err.msg);
  npulm_model_close(model);
  return 0;
}

/* ---- verify --------------------------------------------------------------------------------- */

static int cmd_verify(struct cli_args *a) {
  const char *path = NULL;
  for (a->i = 2; a->i < a->argc; a->i++) {
    const char *o = a->argv[a->i];
    if (cli_wants_help(a)) return 0;
    else if (cli_is_opt(o, "-m", "--model")) path = cli_opt_value(a);
    else if (o[0] != '-' && path == NULL) path = o;
    else cli_unknown_option(a);
  }
  if (path == NULL) cli_die(a->cmd, "%s", "no program: pass MODEL.npu (or -m MODEL)");
  npulm_error err;
  if (npulm_program_verify_file(path, stdout, &err) != NPULM_OK) cli_die(a->cmd, "%s", err.msg);
  return 0;
}

/* ---- tokenize ------------------------------------------------------------------------------- */

static int cmd_tokenize(struct cli_args *a) {
  const char *model_path = NULL, *text = NULL;
  bool bos = false, show_text = false;
  for (a->i = 2; a->i < a->argc; a->i++) {
    const char *o = a->argv[a->i];
    if (cli_wants_help(a)) return 0;
    else if (cli_is_opt(o, "-m", "--model")) model_path = cli_opt_value(a);
    else if (cli_is_opt(o, "-p", "--prompt")) text = cli_opt_value(a);
    else if (cli_is_opt(o, NULL, "--bos")) bos = true;
    else if (cli_is_opt(o, NULL, "--text")) show_text = true;
    else cli_unknown_option(a);
  }
  if (text == NULL) cli_die(a->cmd, "%s", "no text: pass -p TEXT");
  npulm_model *model; /* the tokenizer alone: a vocabulary-only GGUF will do */
  npulm_error err;
  if (npulm_model_open_vocab(cli_resolve_model(a->cmd, model_path), &model, &err) != NPULM_OK) {
    cli_die(a->cmd, "%s", err.msg);
  }
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

static int cmd_ppl(struct cli_args *a) {
  const char *model_path = NULL, *file = NULL;
  int n_ctx = 512, n_threads = 0;
  bool reference = false, decode = false;
  npulm_compile_params cp = npulm_compile_default_params();
  npulm_session_params sp = npulm_session_default_params();
  npulm_open_params op = {0};
  for (a->i = 2; a->i < a->argc; a->i++) {
    const char *o = a->argv[a->i];
    if (cli_wants_help(a)) return 0;
    else if (cli_is_opt(o, "-m", "--model")) model_path = cli_opt_value(a);
    else if (cli_open_option(a, &op)) continue;
    else if (cli_is_opt(o, "-f", "--file")) file = cli_opt_value(a);
    else if (cli_is_opt(o, "-c", "--ctx")) n_ctx = (int)cli_opt_int(a, 1, 1 << 24);
    else if (cli_is_opt(o, "-t", "--threads")) n_threads = (int)cli_opt_int(a, 0, 64);
    else if (cli_is_opt(o, NULL, "--reference")) reference = true;
    else if (cli_is_opt(o, NULL, "--decode")) decode = true;
    else if (cli_session_option(a, &sp)) decode = true;
    else if (cli_compile_option(a, &cp, false)) continue;
    else cli_unknown_option(a);
  }
  if (file == NULL) cli_die(a->cmd, "%s", "no text file: pass -f FILE");
  if (n_threads == 0) n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (op.mem_budget > 0) n_threads = 1; /* the budget is each session's: one window at a time */
  const char *path = cli_resolve_model(a->cmd, model_path);
  npulm_model *model = open_model_params(a->cmd, path, &op);
  size_t len;
  char *text = cli_read_file(a->cmd, file, &len);
  compile_if_needed(a->cmd, model, &cp, reference);
  cli_free_compile_params(&cp);
  struct ppl_header header = {path, file, n_ctx, n_threads, false};
  npulm_ppl_result r;
  npulm_sparse_stats sparse;
  npulm_error err;
  if (reference && decode)
    cli_die(a->cmd, "%s", "--decode and --sparse run the compiled graphs, not --reference");
  npulm_status st = reference ? npulm_perplexity_reference(model, text, len, n_ctx, n_threads,
                                                           ppl_progress, &header, &r, &err)
                    : decode  ? npulm_perplexity_decode(model, text, len, n_ctx, n_threads, &sp,
                                                        ppl_progress, &header, &r, &sparse, &err)
                              : npulm_perplexity(model, text, len, n_ctx, n_threads, ppl_progress,
                                                 &header, &r, &err);
  if (st != NPULM_OK) cli_die(a->cmd, "%s", err.msg);
  printf("Final estimate: PPL = %.4f +/- %.5f (%d chunks of %d tokens, %" PRIu64
         " tokens scored, %.2f s)\n",
         r.ppl, r.ppl_stderr, r.n_chunks, r.n_ctx, r.n_scored, r.seconds);
  if (decode && sparse.layer_steps > 0) {
    printf("sparse decode: %.1f%% of FFN neurons computed (%.1f%% skipped), %.1f%% candidates",
           100.0 * sparse.kept, 100.0 * (1.0 - sparse.kept), 100.0 * sparse.candidates);
    if (!isnan(sparse.recall)) printf(", recall %.4f", sparse.recall);
    printf("\n");
  }
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

static int cmd_synth(struct cli_args *a) {
  const char *shape = NULL, *type = "f32", *out = NULL;
  long long seed = 1;
  for (a->i = 2; a->i < a->argc; a->i++) {
    const char *o = a->argv[a->i];
    if (cli_wants_help(a)) {
      printf("\nshapes:");
      for (const char *const *s = npulm_synth_shapes(); *s != NULL; s++) printf(" %s", *s);
      printf("\n");
      return 0;
    } else if (cli_is_opt(o, NULL, "--shape")) shape = cli_opt_value(a);
    else if (cli_is_opt(o, NULL, "--seed")) seed = cli_opt_int(a, 0, INT64_MAX);
    else if (cli_is_opt(o, NULL, "--type")) type = cli_opt_value(a);
    else if (cli_is_opt(o, "-o", "--output")) out = cli_opt_value(a);
    else cli_unknown_option(a);
  }
  if (shape == NULL) cli_die(a->cmd, "%s", "no shape: pass --shape NAME (see --help)");
  if (out == NULL) cli_die(a->cmd, "%s", "no output file: pass -o FILE.gguf");
  npulm_error err;
  if (npulm_synth(shape, (uint64_t)seed, type, out, synth_progress, NULL, &err) != NPULM_OK) {
    cli_die(a->cmd, "%s", err.msg);
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
  json_object_set_new(root, "quant", json_string(r->quant));
  json_object_set_new(root, "kl_mean", json_real(r->kl_mean));
  json_object_set_new(root, "kl_max", json_real(r->kl_max));
  json_object_set_new(root, "top1_agreement", json_real(r->top1_agreement));
  json_dumpf(root, stdout, JSON_INDENT(2));
  fputc('\n', stdout);
  json_decref(root);
}

static int cmd_diff(struct cli_args *a) {
  const char *model_path = NULL, *text = NULL;
  bool json = false;
  npulm_compile_params cp = npulm_compile_default_params();
  for (a->i = 2; a->i < a->argc; a->i++) {
    const char *o = a->argv[a->i];
    if (cli_wants_help(a)) return 0;
    else if (cli_is_opt(o, "-m", "--model")) model_path = cli_opt_value(a);
    else if (cli_is_opt(o, "-p", "--prompt")) text = cli_opt_value(a);
    else if (cli_is_opt(o, NULL, "--json")) json = true;
    else if (cli_compile_option(a, &cp, true)) continue;
    else cli_unknown_option(a);
  }
  if (text == NULL) cli_die(a->cmd, "%s", "no text: pass -p TEXT");
  npulm_model *model = open_model(a->cmd, cli_resolve_model(a->cmd, model_path));
  compile_if_needed(a->cmd, model, &cp, false);
  cli_free_compile_params(&cp);
  npulm_diff_report *r;
  npulm_error err;
  if (npulm_diff(model, text, strlen(text), &r, &err) != NPULM_OK) cli_die(a->cmd, "%s", err.msg);
  if (json) {
    print_diff_json(r);
  } else {
    printf("%-24s %-9s %-4s %-4s %10s %12s\n", "activation", "op", "on", "type", "SQNR dB",
           "max |err|");
    for (int i = 0; i < r->n_entries; i++) {
      const npulm_diff_entry *e = &r->entries[i];
      printf("%-24s %-9s %-4s %-4s %10.2f %12.5f\n", e->name, e->op != NULL ? e->op : "?",
             e->backend != NULL ? e->backend : "?", e->dtype != NULL ? e->dtype : "?", e->sqnr_db,
             e->max_abs_err);
    }
    printf("final logits over %d tokens (%s): KL(reference || compiled) mean %.6f, max %.6f; "
           "top-1 agreement %.1f%%\n",
           r->n_tokens, r->quant, r->kl_mean, r->kl_max, 100.0 * r->top1_agreement);
  }
  npulm_diff_free(r);
  npulm_model_close(model);
  return 0;
}

/* ---- version -------------------------------------------------------------------------------- */

static const char *const usage_version =
    "usage: npulm version\n"
    "\n"
    "Print npulm's version and the git commit the library was built from.\n";

static int cmd_version(struct cli_args *a) {
  for (a->i = 2; a->i < a->argc; a->i++) {
    if (cli_wants_help(a)) return 0;
    cli_unknown_option(a);
  }
  printf("npulm %s\n", npulm_version());
  return 0;
}

/* bench lives in tools/bench.c */
static int cmd_bench(struct cli_args *a) { return npulm_cmd_bench(a->argc, a->argv); }

/* ---- main ----------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  static const struct {
    const char *name;
    int (*fn)(struct cli_args *);
    const char *usage;
  } commands[] = {
      {"run", cmd_run, usage_run},
      {"compile", cmd_compile, usage_compile},
      {"inspect", cmd_inspect, usage_inspect},
      {"verify", cmd_verify, usage_verify},
      {"diff", cmd_diff, usage_diff},
      {"tokenize", cmd_tokenize, usage_tokenize},
      {"ppl", cmd_ppl, usage_ppl},
      {"synth", cmd_synth, usage_synth},
      {"bench", cmd_bench, npulm_usage_bench},
      {"version", cmd_version, usage_version},
  };
  if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
    fputs(usage_main, argc < 2 ? stderr : stdout);
    return argc < 2 ? 1 : 0;
  }
  const char *name = strcmp(argv[1], "--version") == 0 ? "version" : argv[1];
  for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
    if (strcmp(name, commands[i].name) == 0) {
      struct cli_args a = {
          .argc = argc, .argv = argv, .i = 2, .cmd = name, .usage = commands[i].usage};
      return commands[i].fn(&a);
    }
  }
  fprintf(stderr, "npulm: unknown command '%s' (see 'npulm --help')\n", argv[1]);
  return 1;
}
