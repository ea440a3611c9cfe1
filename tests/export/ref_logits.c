/* npulm's own logits for a greedy run, the reference that tests/export/ort_check.mjs compares an
 * exported ONNX model's against (tests/cli/test_export.sh). Public API only (include/npulm.h).
 *
 *   export_ref MODEL OUT.bin --prompt TEXT --steps N [--quant MODE] [--ctx K]
 *
 * MODEL is a program file (.npu), run with its program, or a GGUF, compiled first with --quant
 * (default w8a8-smooth; --quant is refused for a program file). --ctx: the session's context
 * (default the model's, at most 4096). The prompt is tokenized as npulm run does (BOS if the
 * model wants it) and evaluated in one npulm_session_eval call; then N times the greedy token
 * (argmax of the last logits, the lowest index on ties) is evaluated alone.
 *
 * OUT.bin, little-endian, written whole or not at all:
 *   int32 n_prompt, int32 n_steps, int32 n_vocab,
 *   int32 prompt tokens[n_prompt], int32 generated tokens[n_steps],
 *   float32 logits[(1 + n_steps) * n_vocab]
 * Row 0 is the logits after the prompt (of its last token), which chose generated token 0; row i
 * the logits after generated token i - 1, which chose generated token i; the last row chooses
 * nothing. Errors: one line on stderr, exit 1. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <npulm.h>

/* The index of the largest of 'n' values, the lowest on ties. */
static int32_t argmax(const float *x, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return best;
}

/* Append 'n' 32-bit values (int32 or float, 'x' read as bytes), little-endian whatever the
 * host's order, to 'f'. Return 0, or -1 on a write error. */
static int put32(FILE *f, const void *x, size_t n) {
  _Static_assert(sizeof(float) == 4, "float is not 32-bit");
  for (size_t i = 0; i < n; i++) {
    uint32_t w;
    memcpy(&w, (const unsigned char *)x + 4 * i, 4);
    unsigned char b[4] = {(unsigned char)w, (unsigned char)(w >> 8), (unsigned char)(w >> 16),
                          (unsigned char)(w >> 24)};
    if (fwrite(b, 1, 4, f) != 4) return -1;
  }
  return 0;
}

/* Write the reference file at 'path' through 'path'.tmp, synced and renamed into place. Return 0,
 * or -1 with 'err' naming the problem. */
static int write_ref(const char *path, const int32_t *prompt, int n_prompt, const int32_t *gen,
                     int n_steps, const float *logits, int n_vocab, npulm_error *err) {
  size_t len = strlen(path) + 5;
  char *tmp = malloc(len);
  if (!tmp) {
    snprintf(err->msg, sizeof(err->msg), "out of memory");
    return -1;
  }
  snprintf(tmp, len, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  int ok = f != NULL;
  int32_t head[3] = {n_prompt, n_steps, n_vocab};
  ok = ok && put32(f, head, 3) == 0 && put32(f, prompt, (size_t)n_prompt) == 0 &&
       put32(f, gen, (size_t)n_steps) == 0 &&
       put32(f, logits, (size_t)(1 + n_steps) * (size_t)n_vocab) == 0 && fflush(f) == 0 &&
       fsync(fileno(f)) == 0;
  if (f && fclose(f) != 0) ok = 0;
  if (ok && rename(tmp, path) != 0) ok = 0;
  if (!ok) {
    snprintf(err->msg, sizeof(err->msg), "cannot write %s", path);
    if (f) remove(tmp);
  }
  free(tmp);
  return ok ? 0 : -1;
}

/* A whole decimal number in [lo, hi] from 'arg', or -1. */
static long parse_int(const char *arg, long lo, long hi) {
  char *end;
  long v = strtol(arg, &end, 10);
  return (*arg && !*end && v >= lo && v <= hi) ? v : -1;
}

int main(int argc, char **argv) {
  const char *usage = "usage: export_ref MODEL OUT.bin --prompt TEXT --steps N [--quant MODE] "
                      "[--ctx K]";
  const char *model_path = NULL, *out_path = NULL, *prompt = NULL, *quant = NULL;
  long steps = -1, ctx = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int has_value = i + 1 < argc;
    if (!strcmp(a, "--prompt") && has_value) {
      prompt = argv[++i];
    } else if (!strcmp(a, "--steps") && has_value) {
      if ((steps = parse_int(argv[++i], 0, 1 << 20)) < 0) {
        fprintf(stderr, "export_ref: --steps wants a whole number >= 0, not '%s'\n", argv[i]);
        return 1;
      }
    } else if (!strcmp(a, "--quant") && has_value) {
      quant = argv[++i];
    } else if (!strcmp(a, "--ctx") && has_value) {
      if ((ctx = parse_int(argv[++i], 1, 1 << 20)) < 0) {
        fprintf(stderr, "export_ref: --ctx wants a whole number >= 1, not '%s'\n", argv[i]);
        return 1;
      }
    } else if (a[0] == '-' && a[1] != '\0') {
      fprintf(stderr, "export_ref: unknown option or missing value: %s (%s)\n", a, usage);
      return 1;
    } else if (!model_path) {
      model_path = a;
    } else if (!out_path) {
      out_path = a;
    } else {
      fprintf(stderr, "export_ref: one argument too many: %s (%s)\n", a, usage);
      return 1;
    }
  }
  if (!model_path || !out_path || !prompt || steps < 0) {
    fprintf(stderr, "export_ref: MODEL, OUT.bin, --prompt and --steps are needed (%s)\n", usage);
    return 1;
  }

  npulm_model *model = NULL;
  npulm_session *session = NULL;
  int32_t *tokens = NULL;
  float *logits = NULL;
  npulm_error err;
  int status = 1;
  err.msg[0] = '\0';

  if (npulm_model_open(model_path, &model, &err) != NPULM_OK) goto fail;
  if (npulm_model_has_program(model)) {
    if (quant) {
      snprintf(err.msg, sizeof(err.msg), "--quant is for a GGUF; %s carries its program",
               model_path);
      goto fail;
    }
  } else {
    npulm_compile_params cp = npulm_compile_default_params();
    cp.quant = quant;
    if (npulm_model_compile(model, &cp, &err) != NPULM_OK) goto fail;
  }
  npulm_model_info info;
  npulm_model_get_info(model, &info);

  /* the prompt as npulm run tokenizes it: BOS when the model wants it, no special-token text, in
   * len + 8 ids as npulm run first tries (BOS, SentencePiece's leading space, then at least a byte
   * per token); a text that needs more is refused */
  size_t len = strlen(prompt), n_prompt = 0;
  tokens = malloc((len + 8 + (size_t)steps) * sizeof(*tokens));
  if (!tokens) {
    snprintf(err.msg, sizeof(err.msg), "out of memory");
    goto fail;
  }
  if (npulm_tokenize(model, prompt, len, info.add_bos, false, tokens, len + 8, &n_prompt, &err) !=
      NPULM_OK)
    goto fail;
  if (n_prompt == 0) {
    snprintf(err.msg, sizeof(err.msg), "the prompt is empty and the model adds no BOS token");
    goto fail;
  }
  int32_t *gen = tokens + n_prompt;

  npulm_session_params sp = npulm_session_default_params();
  sp.n_ctx = (int)ctx;
  if (npulm_session_create(model, &sp, &session, &err) != NPULM_OK) goto fail;
  if ((long)n_prompt + steps > npulm_session_ctx(session)) {
    snprintf(err.msg, sizeof(err.msg), "%zu prompt tokens + %ld steps exceed the context of %d",
             n_prompt, steps, npulm_session_ctx(session));
    goto fail;
  }
  size_t n_vocab = (size_t)info.n_vocab;
  logits = malloc((size_t)(1 + steps) * n_vocab * sizeof(*logits));
  if (!logits) {
    snprintf(err.msg, sizeof(err.msg), "out of memory");
    goto fail;
  }

  /* the prompt in one evaluation, then one greedy token at a time */
  if (npulm_session_eval(session, tokens, n_prompt, NULL, &err) != NPULM_OK) goto fail;
  memcpy(logits, npulm_session_logits(session), n_vocab * sizeof(*logits));
  for (long i = 0; i < steps; i++) {
    gen[i] = argmax(logits + (size_t)i * n_vocab, info.n_vocab);
    if (npulm_session_eval(session, &gen[i], 1, NULL, &err) != NPULM_OK) goto fail;
    memcpy(logits + (size_t)(i + 1) * n_vocab, npulm_session_logits(session),
           n_vocab * sizeof(*logits));
  }

  if (write_ref(out_path, tokens, (int)n_prompt, gen, (int)steps, logits, info.n_vocab, &err) != 0)
    goto fail;
  status = 0;

fail:
  if (status != 0) fprintf(stderr, "export_ref: %s\n", err.msg);
  free(logits);
  free(tokens);
  npulm_session_free(session);
  npulm_model_close(model);
  return status;
}
