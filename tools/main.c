/* The npulm command-line tool: run, chat, compile, inspect, verify, tokenize, ppl, synth; bench
 * and serve live in their own files. Uses only the public API (npulm.h). */
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
#include "npulm_bench.h"

/* The help texts, laid out line for line as they print (clang-format would join a string and the
 * option list macro that follows it). */
/* clang-format off */
static const char *const usage_main =
    "usage: npulm COMMAND [options]\n"
    "\n"
    "commands:\n"
    "  run        generate text from a prompt\n"
    "  chat       chat with a model on stdin, in its chat template (the same as run -i)\n"
    "  compile    compile a model into a program file (.npu) of static NPU graphs\n"
    "  inspect    describe a program: graphs, NPU/CPU placement, fallbacks, memory\n"
    "  verify     check a program file: every checksum, then every structural check\n"
    "  diff       compare the compiled model with the FP32 reference, op by op\n"
    "  tokenize   print the token ids of a text\n"
    "  ppl        measure perplexity on a text file (llama-perplexity's method)\n"
    "  synth      write a GGUF with the shapes of a real model and random weights\n"
    "  bench      measure prefill and decode speed (llama-bench's method), roofline, NPU model\n"
    "  serve      serve the model over HTTP with OpenAI's API (completions, chat, streaming)\n"
    "  export     write a specialization as ONNX with QDQ and AIMET encodings (vendor NPU flows)\n"
    "  version    print the version and the commit it was built from (also: npulm --version)\n"
    "\n"
    "'npulm COMMAND --help' describes a command's options.\n";

static const char *const usage_run =
    "usage: npulm run [-m MODEL.gguf] [-p PROMPT | -f FILE] [options]\n"
    "       npulm run -i [options], or npulm chat [options]\n"
    "\n"
    "Generate a continuation of PROMPT, streaming it to stdout; speeds go to stderr. Without -p\n"
    "or -f, a prompt piped or redirected to stdin is read. The last line break of a prompt read\n"
    "from a file or stdin is not part of it.\n"
    "\n"
    "With -i (or as npulm chat), chat: each line read from stdin (after a \"> \" on stderr when\n"
    "stdin is a terminal) is a user message; the conversation is formatted with the chat\n"
    "template, and only its new part is evaluated, the history staying in the KV cache (all of\n"
    "it again when the template writes the history differently from what the cache holds). The\n"
    "reply streams to stdout and ends at an end-of-generation token, the template's end of turn,\n"
    "-n tokens or the end of the context, which ends the chat with a line on stderr and exit\n"
    "status 1 (old turns are not dropped). The chat ends at end of input (Ctrl-D) or a line\n"
    "\"/exit\".\n"
    "\n"
    "  -m, --model FILE   model (default: $NPULM_MODEL, else " CLI_DEFAULT_MODEL_PATH ")\n"
    "  -p, --prompt TEXT  prompt (default: empty, generation starts from BOS); - reads it from\n"
    "                     stdin\n"
    "  -f, --file FILE    read the prompt from FILE\n"
    "  -i, --interactive  chat (see above)\n"
    "  --chat-template NAME  the chat's template (default: the one the model's\n"
    "                     tokenizer.chat_template names or matches, else chatml): one of\n"
    "                     chatml, llama2, llama2-sys, llama3, mistral-v1, mistral-v3, mistral-v7,\n"
    "                     gemma, phi3, zephyr and the others of llama.cpp's built-in templates\n"
    "  --system TEXT      the chat's system message\n"
    "  -v, --verbose      chat: the template, and per turn the tokens reused from the cache and\n"
    "                     evaluated, on stderr\n"
    "  -n, --n-predict N  tokens to generate (per reply in a chat; default 128; -1 = until end\n"
    "                     of text or context)\n"
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
  if (st.input_steps > 0) {
    fprintf(stderr,
            "input-sparse decode: %" PRIu64 " matmul steps | %.1f%% of input channels read | "
            "%.1f%% of decode weight bytes read | thresholds %.3f s, sparse GEMVs %.3f s | "
            "channel-major weights %.1f MiB\n",
            st.input_steps, 100.0 * st.input_kept, 100.0 * st.bytes_share, st.select_s, st.gemv_s,
            (double)st.input_bytes / (1024.0 * 1024.0));
  }
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
  const struct cli_memory_rates rates = cli_memory_rates(&m);
  fprintf(
      stderr,
      "memory: budget %.1f MiB: %.1f MiB of weights held, %.1f MiB streamed, neuron cache "
      "%.1f MiB hot + %.1f MiB window + %.1f MiB scratch | peak RSS %.1f MiB\n"
      "storage: %.2f MiB of neurons (%.2f MiB moved, %s) and %.2f MiB of streamed weights per "
      "step, neurons read at %.0f MiB/s (I/O busy %.3f s, decode waited %.3f s) | neuron bytes from "
      "memory %.1f%%, gate hit rate %.1f%%, up/down hit rate %.1f%%\n",
      (double)m.budget / mib, (double)m.pinned_bytes / mib, (double)m.streamed_bytes / mib,
      (double)m.hot_bytes / mib, (double)m.cache_bytes / mib, (double)m.scratch_bytes / mib,
      (double)peak_rss() / mib, (double)m.bytes_read / mib / per,
      (double)m.storage_bytes / mib / per, m.direct_io ? "direct" : "buffered",
      (double)m.streamed_read / mib / per, rates.read_mib_s, m.read_s, m.io_wait_s,
      rates.from_memory, rates.gate_hits, rates.pair_hits);
}

/* ---- run ------------------------------------------------------------------------------------ */

static void print_piece(const npulm_model *model, int32_t prev, int32_t id) {
  char buf[256];
  size_t n = npulm_token_to_piece(model, prev, id, buf, sizeof(buf));
  fwrite(buf, 1, n < sizeof(buf) ? n : sizeof(buf), stdout);
  fflush(stdout);
}

/* What run and chat were asked, and what they set up. */
struct run {
  const char *cmd;
  npulm_model *model;
  npulm_model_info info;
  npulm_session *session;
  npulm_sampler *sampler;
  uint64_t seed;
  long long n_predict;
  bool verbose;
};

/* A prompt piped or redirected to stdin (a terminal, or a device such as /dev/null, is none). */
static bool stdin_has_text(void) {
  struct stat st;
  return !isatty(STDIN_FILENO) && fstat(STDIN_FILENO, &st) == 0 &&
         (S_ISFIFO(st.st_mode) || S_ISREG(st.st_mode));
}

/* Generate a continuation of the prompt, streaming it to stdout. */
static int run_prompt(struct run *r, const char *prompt, size_t len) {
  size_t n_prompt;
  int32_t *tokens = tokenize_all(r->cmd, r->model, prompt, len, r->info.add_bos, false, &n_prompt);
  int n_ctx = npulm_session_ctx(r->session);
  npulm_error err;
  if (n_prompt == 0) cli_die(r->cmd, "%s", "the prompt is empty and the model adds no BOS token");
  if (n_prompt >= (size_t)n_ctx) {
    cli_die(r->cmd,
            "the prompt has %zu tokens, more than the context of %d allows (use -c to enlarge it, "
            "up to the model's %d)",
            n_prompt, n_ctx, r->info.n_ctx_train);
  }

  /* prompt: echo it, then evaluate it in one go */
  fwrite(prompt, 1, len, stdout);
  fflush(stdout);
  double t0 = cli_now();
  if (npulm_session_eval(r->session, tokens, n_prompt, NULL, &err) != NPULM_OK) {
    cli_die(r->cmd, "%s", err.msg);
  }
  double t1 = cli_now();

  /* generation: sample, print, feed back */
  int32_t prev = tokens[n_prompt - 1];
  long long n_gen = 0;
  const char *stop = "length limit";
  for (;;) {
    if (r->n_predict >= 0 && n_gen >= r->n_predict) break;
    if (npulm_session_pos(r->session) >= n_ctx) {
      stop = "context full";
      break;
    }
    int32_t next = npulm_sampler_sample(r->sampler, npulm_session_logits(r->session));
    if (npulm_token_is_eog(r->model, next)) {
      stop = "end of text";
      break;
    }
    print_piece(r->model, prev, next);
    n_gen++;
    prev = next;
    if (npulm_session_eval(r->session, &next, 1, NULL, &err) != NPULM_OK)
      cli_die(r->cmd, "%s", err.msg);
  }
  double t2 = cli_now();
  printf("\n");
  fprintf(stderr,
          "\nprompt: %zu tokens in %.3f s (%.1f tok/s) | generation: %lld tokens in %.3f s "
          "(%.1f tok/s) | stopped: %s | seed %" PRIu64 "\n",
          n_prompt, t1 - t0, (double)n_prompt / (t1 - t0 > 0 ? t1 - t0 : 1e-9), n_gen, t2 - t1,
          n_gen > 0 ? (double)n_gen / (t2 - t1 > 0 ? t2 - t1 : 1e-9) : 0.0, stop, r->seed);
  print_engine_stats(r->session);
  print_sparse_stats(r->session);
  print_memory_stats(r->session, n_gen + 1);
  free(tokens);
  return 0;
}

/* ---- chat ----------------------------------------------------------------------------------- */

/* A conversation and the tokens of it the session's KV cache holds. */
struct chat {
  const char *template_name;
  npulm_chat_message *msgs; /* contents malloc'd */
  size_t n_msgs, cap_msgs;
  char *text; /* the conversation formatted, NUL-terminated */
  size_t text_cap;
  int32_t *cached; /* the tokens in the KV cache, in order */
  size_t n_cached, cap_cached;
  char end_marker[64]; /* the text that ends an assistant message in this template, or "" */
};

static void *grow(const char *cmd, void *p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return p;
  size_t c = *cap > 0 ? *cap : 16;
  while (c < need) c *= 2;
  void *q = realloc(p, c * elem);
  if (q == NULL) cli_die(cmd, "%s", "out of memory");
  *cap = c;
  return q;
}

static void chat_add(const char *cmd, struct chat *c, const char *role, const char *content,
                     size_t len) {
  c->msgs = grow(cmd, c->msgs, &c->cap_msgs, c->n_msgs + 1, sizeof(*c->msgs));
  char *copy = malloc(len + 1);
  if (copy == NULL) cli_die(cmd, "%s", "out of memory");
  memcpy(copy, content, len);
  copy[len] = '\0';
  c->msgs[c->n_msgs++] = (npulm_chat_message){role, copy};
}

/* Format 'n' messages into c->text; return its length. */
static size_t chat_format(const char *cmd, struct chat *c, const npulm_chat_message *msgs, size_t n,
                          bool add_assistant) {
  npulm_error err;
  size_t len;
  for (;;) {
    npulm_status st = npulm_chat_apply(NULL, c->template_name, msgs, n, add_assistant, c->text,
                                       c->text_cap, &len, &err);
    if (st == NPULM_OK) return len;
    if (len < c->text_cap) cli_die(cmd, "%s", err.msg);
    c->text = grow(cmd, c->text, &c->text_cap, len + 1, 1);
  }
}

/* The end of an assistant message in the template: what follows the content of a lone assistant
 * message, without surrounding whitespace ("<|im_end|>", "<|eot_id|>", "</s>"). */
static void chat_find_end_marker(const char *cmd, struct chat *c) {
  static const char probe[] = "\x01";
  const npulm_chat_message m = {"assistant", probe};
  size_t len = chat_format(cmd, c, &m, 1, false);
  const char *at = strstr(c->text, probe), *end = c->text + len;
  c->end_marker[0] = '\0';
  if (at == NULL) return;
  at += strlen(probe);
  while (at < end && (*at == ' ' || *at == '\n')) at++;
  while (end > at && (end[-1] == ' ' || end[-1] == '\n')) end--;
  if ((size_t)(end - at) < sizeof(c->end_marker)) {
    memcpy(c->end_marker, at, (size_t)(end - at));
    c->end_marker[end - at] = '\0';
  }
}

/* How many bytes at the end of 'text' could begin 'marker' (held back until they are known not
 * to). */
static size_t marker_overlap(const char *text, size_t len, const char *marker) {
  size_t m = strlen(marker);
  for (size_t k = m > len ? len : m - 1; k > 0; k--) {
    if (memcmp(text + len - k, marker, k) == 0) return k;
  }
  return 0;
}

/* Evaluate the conversation formatted up to the assistant's opening: only the tokens past those
 * the cache holds when the cache's tokens begin them, else all of them again. False (with a line
 * on stderr) if they do not fit in the context. */
static bool chat_eval_prompt(struct run *r, struct chat *c, int turn) {
  size_t len = chat_format(r->cmd, c, c->msgs, c->n_msgs, true);
  size_t n;
  int32_t *ids = tokenize_all(r->cmd, r->model, c->text, len, r->info.add_bos, true, &n);
  int n_ctx = npulm_session_ctx(r->session);
  if (n >= (size_t)n_ctx) {
    fprintf(stderr,
            "npulm %s: the conversation has %zu tokens, more than the context of %d allows: chat "
            "ended (use -c to enlarge it, up to the model's %d)\n",
            r->cmd, n, n_ctx, r->info.n_ctx_train);
    free(ids);
    return false;
  }
  size_t keep = c->n_cached;
  if (keep > n || (keep > 0 && memcmp(ids, c->cached, keep * sizeof(int32_t)) != 0)) {
    /* the template wrote the history differently from what the cache holds */
    npulm_session_reset(r->session);
    keep = 0;
  }
  npulm_error err;
  double t0 = cli_now();
  if (npulm_session_eval(r->session, ids + keep, n - keep, NULL, &err) != NPULM_OK) {
    cli_die(r->cmd, "%s", err.msg);
  }
  if (r->verbose) {
    fprintf(stderr,
            "turn %d: %zu tokens of the conversation, %zu reused from the cache, %zu "
            "evaluated in %.3f s\n",
            turn, n, keep, n - keep, cli_now() - t0);
  }
  c->cached = grow(r->cmd, c->cached, &c->cap_cached, n, sizeof(int32_t));
  memcpy(c->cached, ids, n * sizeof(int32_t));
  c->n_cached = n;
  free(ids);
  return true;
}

/* Generate the assistant's reply, streaming it, until an end-of-generation token, the template's
 * end marker, -n tokens or the end of the context; add it to the conversation. False if the
 * context ended it. */
static bool chat_reply(struct run *r, struct chat *c) {
  char *reply = NULL;
  size_t len = 0, cap = 0, shown = 0;
  int32_t prev = c->n_cached > 0 ? c->cached[c->n_cached - 1] : -1;
  int n_ctx = npulm_session_ctx(r->session);
  bool room = true;
  npulm_error err;
  for (long long n_gen = 0; r->n_predict < 0 || n_gen < r->n_predict; n_gen++) {
    if (npulm_session_pos(r->session) >= n_ctx) {
      room = false;
      break;
    }
    int32_t next = npulm_sampler_sample(r->sampler, npulm_session_logits(r->session));
    if (npulm_token_is_eog(r->model, next)) break;
    char piece[256];
    size_t n = npulm_token_to_piece(r->model, prev, next, piece, sizeof(piece));
    if (n > sizeof(piece)) n = sizeof(piece);
    reply = grow(r->cmd, reply, &cap, len + n + 1, 1);
    memcpy(reply + len, piece, n);
    len += n;
    reply[len] = '\0';
    if (npulm_session_eval(r->session, &next, 1, NULL, &err) != NPULM_OK) {
      cli_die(r->cmd, "%s", err.msg);
    }
    c->cached = grow(r->cmd, c->cached, &c->cap_cached, c->n_cached + 1, sizeof(int32_t));
    c->cached[c->n_cached++] = next;
    prev = next;
    const char *end = c->end_marker[0] != '\0' ? strstr(reply, c->end_marker) : NULL;
    if (end != NULL) {
      len = (size_t)(end - reply);
      break;
    }
    /* print what can no longer turn out to be the start of the end marker */
    size_t ready = c->end_marker[0] != '\0' ? len - marker_overlap(reply, len, c->end_marker) : len;
    if (ready > shown) {
      fwrite(reply + shown, 1, ready - shown, stdout);
      fflush(stdout);
      shown = ready;
    }
  }
  if (len > shown) fwrite(reply + shown, 1, len - shown, stdout);
  fputc('\n', stdout);
  fflush(stdout);
  chat_add(r->cmd, c, "assistant", reply != NULL ? reply : "", len);
  free(reply);
  if (!room) {
    fprintf(stderr,
            "npulm %s: the context of %d tokens is full: chat ended (use -c to enlarge "
            "it, up to the model's %d)\n",
            r->cmd, n_ctx, r->info.n_ctx_train);
  }
  return room;
}

/* Read user lines from stdin and answer each, the history staying in the KV cache, until EOF or
 * "/exit" (status 0), or the end of the context (status 1). */
static int run_chat(struct run *r, const char *template_name, const char *system) {
  struct chat c = {.template_name = template_name};
  chat_find_end_marker(r->cmd, &c);
  if (r->verbose) {
    fprintf(stderr, "chat template: %s, end marker '%s' | seed %" PRIu64 "\n", template_name,
            c.end_marker, r->seed);
  }
  if (system != NULL) chat_add(r->cmd, &c, "system", system, strlen(system));
  bool tty = isatty(STDIN_FILENO);
  char *line = NULL;
  size_t line_cap = 0;
  int status = 0;
  for (int turn = 1;; turn++) {
    if (tty) fputs("> ", stderr);
    ssize_t n = getline(&line, &line_cap, stdin);
    if (n < 0) break;
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) n--;
    line[n] = '\0';
    if (strcmp(line, "/exit") == 0) break;
    chat_add(r->cmd, &c, "user", line, (size_t)n);
    /* the context's end ends the chat, the rest of the input unanswered: a failure */
    if (!chat_eval_prompt(r, &c, turn) || !chat_reply(r, &c)) {
      status = 1;
      break;
    }
  }
  if (tty) fputc('\n', stderr);
  free(line);
  for (size_t i = 0; i < c.n_msgs; i++) free((char *)c.msgs[i].content);
  free(c.msgs);
  free(c.text);
  free(c.cached);
  return status;
}

/* npulm run, and npulm chat (run -i) */
static int run_or_chat(struct cli_args *a, bool chat) {
  const char *model_path = NULL, *prompt_arg = NULL, *prompt_file = NULL;
  const char *template_name = NULL, *system = NULL;
  struct run r = {.cmd = a->cmd, .n_predict = 128};
  long long seed = -1;
  npulm_session_params sp = npulm_session_default_params();
  npulm_sampler_params samp = npulm_sampler_default_params();
  npulm_compile_params cp = npulm_compile_default_params();
  npulm_open_params op = {0};
  for (a->i = 2; a->i < a->argc; a->i++) {
    const char *o = a->argv[a->i];
    if (cli_wants_help(a)) return 0;
    else if (cli_is_opt(o, "-m", "--model")) model_path = cli_opt_value(a);
    else if (cli_open_option(a, &op)) continue;
    else if (cli_is_opt(o, "-p", "--prompt")) prompt_arg = cli_opt_value(a);
    else if (cli_is_opt(o, "-f", "--file")) prompt_file = cli_opt_value(a);
    else if (cli_is_opt(o, "-i", "--interactive")) chat = true;
    else if (cli_is_opt(o, NULL, "--chat-template")) template_name = cli_opt_value(a);
    else if (cli_is_opt(o, NULL, "--system")) system = cli_opt_value(a);
    else if (cli_is_opt(o, "-v", "--verbose")) r.verbose = true;
    else if (cli_is_opt(o, "-n", "--n-predict")) r.n_predict = cli_opt_int(a, -1, 1 << 30);
    else if (cli_is_opt(o, "-c", "--ctx")) sp.n_ctx = (int)cli_opt_int(a, 1, 1 << 20);
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
  if (prompt_arg != NULL && prompt_file != NULL) {
    cli_die(a->cmd, "%s", "-p and -f both give the prompt: give one");
  }
  if (chat && (prompt_arg != NULL || prompt_file != NULL)) {
    cli_die(a->cmd, "%s",
            "a chat reads its messages from stdin: -p and -f do not apply (--system sets the "
            "system message)");
  }
  if (!chat && (template_name != NULL || system != NULL)) {
    cli_die(a->cmd, "%s", "--chat-template and --system apply to a chat (-i, or npulm chat)");
  }
  /* the prompt first, so that a file that cannot be read fails before the model loads */
  char *prompt = NULL;
  size_t prompt_len = 0;
  if (prompt_file != NULL) prompt = cli_read_file(a->cmd, prompt_file, &prompt_len);
  else if (prompt_arg != NULL && strcmp(prompt_arg, "-") == 0) {
    prompt = cli_read_stdin(a->cmd, &prompt_len);
  } else if (prompt_arg == NULL && !chat && stdin_has_text()) {
    prompt = cli_read_stdin(a->cmd, &prompt_len);
  }
  /* as llama.cpp's -f: a file's (or stdin's) last line break is not part of the prompt */
  if (prompt_len > 0 && prompt[prompt_len - 1] == '\n') prompt_len--;
  const char *text = prompt != NULL ? prompt : prompt_arg != NULL ? prompt_arg : "";
  if (prompt == NULL) prompt_len = strlen(text);

  model_path = cli_resolve_model(a->cmd, model_path);
  r.model = open_model_params(a->cmd, model_path, &op);
  npulm_error err;
  if (chat) {
    if (template_name == NULL) template_name = npulm_model_chat_template(r.model);
    /* a known template writes a message, which needs more room than this */
    const npulm_chat_message probe = {"user", "x"};
    char small[1];
    size_t need;
    npulm_chat_apply(NULL, template_name, &probe, 1, false, small, sizeof(small), &need, &err);
    if (need == 0) cli_die(a->cmd, "%s", err.msg);
  }
  cli_compile_if_needed(a->cmd, r.model, &cp, sp.reference);
  cli_free_compile_params(&cp);
  npulm_model_get_info(r.model, &r.info);
  if (npulm_session_create(r.model, &sp, &r.session, &err) != NPULM_OK) {
    cli_die(a->cmd, "%s", err.msg);
  }
  samp.seed = r.seed = seed >= 0 ? (uint64_t)seed : (uint64_t)time(NULL);
  if (npulm_sampler_create(&samp, r.info.n_vocab, &r.sampler, &err) != NPULM_OK) {
    cli_die(a->cmd, "%s", err.msg);
  }
  int status = chat ? run_chat(&r, template_name, system) : run_prompt(&r, text, prompt_len);
  free(prompt);
  npulm_sampler_free(r.sampler);
  npulm_session_free(r.session);
  npulm_model_close(r.model);
  return status;
}

static int cmd_run(struct cli_args *a) { return run_or_chat(a, false); }
static int cmd_chat(struct cli_args *a) { return run_or_chat(a, true); }

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
  npulm_error err;
  if (npulm_check_output(model_path, out, &err) != NPULM_OK) cli_die(a->cmd, "%s", err.msg);
  double t0 = cli_now();
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
  cli_compile_if_needed(a->cmd, model, &cp, reference);
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
  if (decode && sparse.input_steps > 0) {
    printf("input-sparse decode: %.1f%% of input channels read, %.1f%% of decode weight bytes "
           "read (%.1f%% skipped)\n",
           100.0 * sparse.input_kept, 100.0 * sparse.bytes_share,
           100.0 * (1.0 - sparse.bytes_share));
  }
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
  cli_compile_if_needed(a->cmd, model, &cp, false);
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

/* serve lives in tools/serve.c */
static int cmd_serve(struct cli_args *a) { return npulm_cmd_serve(a->argc, a->argv); }
static int cmd_export(struct cli_args *a) { return npulm_cmd_export(a->argc, a->argv); }

/* ---- main ----------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  static const struct {
    const char *name;
    int (*fn)(struct cli_args *);
    const char *usage;
  } commands[] = {
      {"run", cmd_run, usage_run},
      {"chat", cmd_chat, usage_run},
      {"compile", cmd_compile, usage_compile},
      {"inspect", cmd_inspect, usage_inspect},
      {"verify", cmd_verify, usage_verify},
      {"diff", cmd_diff, usage_diff},
      {"tokenize", cmd_tokenize, usage_tokenize},
      {"ppl", cmd_ppl, usage_ppl},
      {"synth", cmd_synth, usage_synth},
      {"bench", cmd_bench, npulm_usage_bench},
      {"serve", cmd_serve, npulm_usage_serve},
      {"export", cmd_export, npulm_usage_export},
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
