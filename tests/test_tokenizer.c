/* Tokenizer tests: llama.cpp's tokenizer test vectors (data/vocab/X.gguf.inp and .out, made with
 * Hugging Face tokenizers) for SPM and byte-level BPE vocabularies, decoding back to the input,
 * the stories260K SentencePiece vocabulary (known ids, BOS, special tokens, random round trips,
 * speed), pre-tokenizer choice on a small synthetic BPE vocabulary, and hostile metadata. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "base/common.h"
#include "base/utf8.h"
#include "io/gguf.h"
#include "io/gguf_write.h"
#include "model/tokenizer.h"

/* ---- Helpers -------------------------------------------------------------------------------- */

/* A tokenizer with the GGUF it came from. */
struct loaded {
  struct npu_gguf *g;
  struct npu_tok *tok;
  void *image; /* in-memory GGUF bytes, or NULL */
};

static void loaded_free(struct loaded *l) {
  npu_tok_free(l->tok);
  npu_gguf_close(l->g);
  free(l->image);
  memset(l, 0, sizeof(*l));
}

static void load_file(const char *rel, struct loaded *l) {
  char path[4096];
  snprintf(path, sizeof(path), "%s", test_shared_path(rel));
  TEST_REQUIRE_FILE(path);
  npulm_error err = {{0}};
  memset(l, 0, sizeof(*l));
  if (npu_gguf_open(path, &l->g, &err) != NPULM_OK) fail_msg("open %s: %s", path, err.msg);
  if (npu_tok_load(l->g, &l->tok, &err) != NPULM_OK) fail_msg("load %s: %s", path, err.msg);
}

/* Read a whole shared file; NUL-terminated, '*len' without the NUL. */
static char *read_shared(const char *rel, size_t *len) {
  FILE *f = fopen(test_shared_path(rel), "rb");
  if (f == NULL) fail_msg("cannot open %s", test_shared_path(rel));
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  assert_non_null(buf);
  size_t k;
  while ((k = fread(buf + n, 1, cap - n - 1, f)) > 0) {
    n += k;
    if (cap - n - 1 == 0) {
      cap *= 2;
      buf = realloc(buf, cap);
      assert_non_null(buf);
    }
  }
  fclose(f);
  buf[n] = '\0';
  *len = n;
  return buf;
}

/* Encode into a fresh array; '*n' tokens. */
static int32_t *encode(const struct npu_tok *tok, const char *text, size_t len, bool add_bos,
                       bool parse_special, size_t *n) {
  npulm_error err = {{0}};
  size_t need = 0;
  npulm_status st = npu_tok_encode(tok, text, len, add_bos, parse_special, NULL, 0, &need, &err);
  if (st != NPULM_OK && st != NPULM_ERR_ARG) fail_msg("encode: %s", err.msg);
  if (st == NPULM_OK) assert_int_equal(need, 0);
  int32_t *ids = malloc((need > 0 ? need : 1) * sizeof(*ids));
  assert_non_null(ids);
  st = npu_tok_encode(tok, text, len, add_bos, parse_special, ids, need, n, &err);
  if (st != NPULM_OK) fail_msg("encode: %s", err.msg);
  assert_int_equal(*n, need);
  return ids;
}

/* Decode ids by concatenating their pieces (prev = -1 for the first). Returns a malloc'd buffer of
 * '*len' bytes. */
static char *decode(const struct npu_tok *tok, const int32_t *ids, size_t n, size_t *len) {
  size_t cap = 64, used = 0;
  char *out = malloc(cap);
  assert_non_null(out);
  for (size_t i = 0; i < n; i++) {
    int32_t prev = i == 0 ? -1 : ids[i - 1];
    size_t k = npu_tok_piece(tok, prev, ids[i], NULL, 0);
    while (used + k > cap) {
      cap *= 2;
      out = realloc(out, cap);
      assert_non_null(out);
    }
    assert_int_equal(npu_tok_piece(tok, prev, ids[i], out + used, k), k);
    used += k;
  }
  *len = used;
  return out;
}

/* Print 'n' bytes readably (escapes for control and non-ASCII bytes). */
static void show(const char *label, const char *s, size_t n) {
  char buf[600];
  size_t k = 0;
  for (size_t i = 0; i < n && k + 8 < sizeof(buf); i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      buf[k++] = (char)c;
    } else {
      k += (size_t)snprintf(buf + k, sizeof(buf) - k, "\\x%02x", c);
    }
  }
  buf[k] = '\0';
  print_message("  %s '%s'\n", label, buf);
}

static void show_ids(const char *label, const int32_t *ids, size_t n) {
  char buf[600];
  size_t k = 0;
  for (size_t i = 0; i < n && k + 16 < sizeof(buf); i++) {
    k += (size_t)snprintf(buf + k, sizeof(buf) - k, " %d", ids[i]);
  }
  buf[k] = '\0';
  print_message("  %s%s\n", label, buf);
}

/* ---- llama.cpp's test vectors --------------------------------------------------------------- */

/* Run every case of data/vocab/<name>.gguf.inp/.out as llama.cpp's test-tokenizer-0 does: inputs
 * separated by "\n__ggml_vocab_test__\n", one line of expected ids each, encoded without BOS and
 * without parsing special tokens. Also check that decoding gives the input back. */
static void run_vocab(const char *name) {
  char rel[256];
  snprintf(rel, sizeof(rel), "data/vocab/%s.gguf", name);
  struct loaded l;
  load_file(rel, &l);
  size_t n_inp, n_out;
  snprintf(rel, sizeof(rel), "data/vocab/%s.gguf.inp", name);
  char *inp = read_shared(rel, &n_inp);
  snprintf(rel, sizeof(rel), "data/vocab/%s.gguf.out", name);
  char *outs = read_shared(rel, &n_out);

  static const char sep[] = "\n__ggml_vocab_test__\n";
  const size_t sep_len = sizeof(sep) - 1;
  size_t pos = 0, line = 0, cases = 0, enc_fail = 0, dec_fail = 0;
  char *out_line = outs;
  while (pos < n_inp) {
    char *next = strstr(inp + pos, sep);
    size_t len = next != NULL ? (size_t)(next - (inp + pos)) : n_inp - pos;
    const char *text = inp + pos;
    pos = next != NULL ? pos + len + sep_len : n_inp;

    /* expected ids: the next line of the .out file */
    assert_true(out_line < outs + n_out);
    char *eol = strchr(out_line, '\n');
    if (eol != NULL) *eol = '\0';
    int32_t want[512];
    size_t n_want = 0;
    for (char *p = out_line;;) {
      char *end;
      long v = strtol(p, &end, 10);
      if (end == p) break;
      assert_true(n_want < 512);
      want[n_want++] = (int32_t)v;
      p = end;
    }
    out_line = eol != NULL ? eol + 1 : outs + n_out;
    line++;
    cases++;

    size_t n;
    int32_t *got = encode(l.tok, text, len, false, false, &n);
    if (n != n_want || memcmp(got, want, n * sizeof(*got)) != 0) {
      if (enc_fail++ < 5) {
        print_message("%s case %zu: wrong ids\n", name, line);
        show("input", text, len);
        show_ids("want:", want, n_want);
        show_ids("got: ", got, n);
      }
    }
    size_t dlen;
    char *dec = decode(l.tok, want, n_want, &dlen);
    if (dlen != len || memcmp(dec, text, len) != 0) {
      if (dec_fail++ < 5) {
        print_message("%s case %zu: decodes differently\n", name, line);
        show("input  ", text, len);
        show("decoded", dec, dlen);
      }
    }
    free(dec);
    free(got);
  }
  assert_true(out_line >= outs + n_out); /* as many expected lines as inputs */
  print_message("%s: %zu/%zu encoded exactly, %zu/%zu decoded back exactly\n", name,
                cases - enc_fail, cases, cases - dec_fail, cases);
  free(inp);
  free(outs);
  loaded_free(&l);
  assert_true(cases > 40);
  assert_int_equal(enc_fail, 0);
  assert_int_equal(dec_fail, 0);
}

static void test_vocab_llama_spm(void **state) {
  (void)state;
  run_vocab("ggml-vocab-llama-spm");
}
static void test_vocab_phi3(void **state) {
  (void)state;
  run_vocab("ggml-vocab-phi-3");
}
static void test_vocab_gpt2(void **state) {
  (void)state;
  run_vocab("ggml-vocab-gpt-2");
}
static void test_vocab_starcoder(void **state) {
  (void)state;
  run_vocab("ggml-vocab-starcoder");
}
static void test_vocab_falcon(void **state) {
  (void)state;
  run_vocab("ggml-vocab-falcon");
}
static void test_vocab_deepseek_coder(void **state) {
  (void)state;
  run_vocab("ggml-vocab-deepseek-coder");
}

/* ---- stories260K (SentencePiece, 512 tokens) ------------------------------------------------ */

#define STORIES "models/stories260K.gguf"

static void test_stories_once(void **state) {
  (void)state;
  struct loaded l;
  load_file(STORIES, &l);
  const struct npu_tok *tok = l.tok;
  assert_int_equal(npu_tok_n_vocab(tok), 512);
  assert_int_equal(npu_tok_bos(tok), 1);
  assert_int_equal(npu_tok_eos(tok), 2);
  assert_true(npu_tok_add_bos(tok));
  assert_string_equal(npu_tok_text(tok, 1), "<s>");
  assert_null(npu_tok_text(tok, 512));
  assert_null(npu_tok_text(tok, -1));

  /* ids from an independent (quadratic) implementation of the same merge rule */
  static const char text[] = "Once upon a time";
  static const int32_t want[] = {403, 407, 261, 378};
  size_t n;
  int32_t *ids = encode(tok, text, strlen(text), false, false, &n);
  assert_int_equal(n, 4);
  assert_memory_equal(ids, want, sizeof(want));
  assert_string_equal(npu_tok_text(tok, ids[0]), "\xe2\x96\x81Once");
  size_t dlen;
  char *dec = decode(tok, ids, n, &dlen);
  assert_int_equal(dlen, strlen(text));
  assert_memory_equal(dec, text, dlen);
  free(dec);

  /* BOS first, then the same ids */
  size_t nb;
  int32_t *with_bos = encode(tok, text, strlen(text), true, false, &nb);
  assert_int_equal(nb, n + 1);
  assert_int_equal(with_bos[0], 1);
  assert_memory_equal(with_bos + 1, ids, n * sizeof(*ids));
  /* BOS decodes to nothing and its successor loses the prefixed space */
  dec = decode(tok, with_bos, nb, &dlen);
  assert_int_equal(dlen, strlen(text));
  assert_memory_equal(dec, text, dlen);
  free(dec);
  free(with_bos);

  /* an empty text is no tokens, or just BOS */
  int32_t one[1];
  npulm_error err = {{0}};
  assert_int_equal(npu_tok_encode(tok, "", 0, false, false, one, 1, &n, &err), NPULM_OK);
  assert_int_equal(n, 0);
  assert_int_equal(npu_tok_encode(tok, NULL, 0, true, false, one, 1, &n, &err), NPULM_OK);
  assert_int_equal(n, 1);
  assert_int_equal(one[0], 1);

  /* too small a buffer: the count comes back with an error */
  int32_t two[2] = {-7, -7};
  assert_int_equal(npu_tok_encode(tok, text, strlen(text), false, false, two, 2, &n, &err),
                   NPULM_ERR_ARG);
  assert_int_equal(n, 4);
  assert_int_equal(two[0], 403);
  assert_int_equal(two[1], 407);
  assert_non_null(strstr(err.msg, "4 tokens"));
  free(ids);
  loaded_free(&l);
}

static void test_stories_pieces(void **state) {
  (void)state;
  struct loaded l;
  load_file(STORIES, &l);
  const struct npu_tok *tok = l.tok;
  char buf[32];
  /* the prefixed space goes at the start of a text and after BOS, nowhere else */
  assert_int_equal(npu_tok_piece(tok, -1, 403, buf, sizeof(buf)), 4);
  assert_memory_equal(buf, "Once", 4);
  assert_int_equal(npu_tok_piece(tok, 1, 403, buf, sizeof(buf)), 4);
  assert_int_equal(npu_tok_piece(tok, 261, 403, buf, sizeof(buf)), 5);
  assert_memory_equal(buf, " Once", 5);
  /* control and unknown tokens are nothing; byte tokens are their byte */
  assert_int_equal(npu_tok_piece(tok, -1, 0, buf, sizeof(buf)), 0);
  assert_int_equal(npu_tok_piece(tok, -1, 1, buf, sizeof(buf)), 0);
  assert_int_equal(npu_tok_piece(tok, 5, 2, buf, sizeof(buf)), 0);
  assert_string_equal(npu_tok_text(tok, 13), "<0x0A>");
  assert_int_equal(npu_tok_piece(tok, 5, 13, buf, sizeof(buf)), 1);
  assert_int_equal(buf[0], '\n');
  /* out of range ids are nothing; a short buffer gets a prefix and the full length back */
  assert_int_equal(npu_tok_piece(tok, -1, 512, buf, sizeof(buf)), 0);
  assert_int_equal(npu_tok_piece(tok, -1, -3, buf, sizeof(buf)), 0);
  memset(buf, 'x', sizeof(buf));
  assert_int_equal(npu_tok_piece(tok, 261, 403, buf, 2), 5);
  assert_memory_equal(buf, " Ox", 3);
  /* end of generation */
  assert_true(npu_tok_is_eog(tok, 2));
  assert_false(npu_tok_is_eog(tok, 1));
  assert_false(npu_tok_is_eog(tok, -1));
  assert_false(npu_tok_is_eog(tok, 512));
  loaded_free(&l);
}

static void test_stories_special(void **state) {
  (void)state;
  struct loaded l;
  load_file(STORIES, &l);
  const struct npu_tok *tok = l.tok;
  static const char text[] = "<s>Hello world</s>\n<s>";
  size_t n, nh;
  int32_t *ids = encode(tok, text, strlen(text), false, true, &n);
  int32_t *hello = encode(tok, "Hello world", 11, false, false, &nh);
  /* "<s>" is BOS, the text after it gets SentencePiece's space prefix, "</s>" is EOS */
  assert_true(n >= nh + 4);
  assert_int_equal(ids[0], 1);
  assert_memory_equal(ids + 1, hello, nh * sizeof(*ids));
  assert_int_equal(ids[1 + nh], 2);
  assert_int_equal(ids[n - 1], 1);
  /* the "\n" between two special tokens is a fragment of its own: "▁\n" */
  size_t nl;
  int32_t *newline = encode(tok, "\n", 1, false, false, &nl);
  assert_int_equal(n, nh + 3 + nl);
  assert_memory_equal(ids + nh + 2, newline, nl * sizeof(*ids));
  free(ids);
  free(newline);

  /* without parse_special the same characters are plain text and decode back */
  ids = encode(tok, text, strlen(text), false, false, &n);
  for (size_t i = 0; i < n; i++) assert_true(ids[i] != 1 && ids[i] != 2);
  size_t dlen;
  char *dec = decode(tok, ids, n, &dlen);
  assert_int_equal(dlen, strlen(text));
  assert_memory_equal(dec, text, dlen);
  free(dec);
  free(ids);

  /* a literal U+2581 in the text is a space to SentencePiece: it decodes as one (as llama.cpp) */
  ids = encode(tok,
               "a\xe2\x96\x81"
               "b",
               5, false, false, &n);
  int32_t *spaced = encode(tok, "a b", 3, false, false, &nh);
  assert_int_equal(n, nh);
  assert_memory_equal(ids, spaced, n * sizeof(*ids));
  free(ids);
  free(spaced);
  free(hello);
  loaded_free(&l);
}

/* Random text: UTF-8 from a mix of scripts (mode 0), arbitrary bytes (mode 1), or bytes that
 * can occur in UTF-8 (mode 2: no C0, C1, F5..FF). */
static size_t random_text(uint64_t *rng, char *buf, size_t max_chars, int mode) {
  size_t n_chars = (size_t)(test_rand(rng) % (max_chars + 1)), n = 0;
  for (size_t i = 0; i < n_chars; i++) {
    uint64_t r = test_rand(rng);
    if (mode != 0) {
      unsigned char c = (unsigned char)(r >> 24);
      if (mode == 2 && (c == 0xC0 || c == 0xC1 || c >= 0xF5)) c &= 0x7F;
      buf[n++] = (char)c;
      continue;
    }
    uint32_t cp;
    switch (r % 9) {
    case 0: cp = ' '; break;
    case 1: cp = "\n\t\r"[(r >> 8) % 3]; break;
    case 2: cp = 0x20 + (uint32_t)((r >> 8) % 95); break; /* printable ASCII */
    case 3: cp = 'a' + (uint32_t)((r >> 8) % 26); break;
    case 4: cp = 0xA0 + (uint32_t)((r >> 8) % 0x160); break;    /* Latin-1, Latin Extended */
    case 5: cp = 0x400 + (uint32_t)((r >> 8) % 0x100); break;   /* Cyrillic */
    case 6: cp = 0x4E00 + (uint32_t)((r >> 8) % 0x5000); break; /* CJK */
    case 7: cp = 0x1F300 + (uint32_t)((r >> 8) % 0x300); break; /* emoji */
    default: cp = 1 + (uint32_t)((r >> 8) % 0x10FFFF); break;
    }
    if ((cp >= 0xD800 && cp < 0xE000) || cp == 0x2581) cp = 'x'; /* surrogates; "▁" is a space */
    n += npu_utf8_put(buf + n, cp);
  }
  return n;
}

/* Random texts (random_text 'mode') decode back to themselves. */
static void round_trips(const struct npu_tok *tok, uint64_t seed, int mode, int count) {
  uint64_t rng = seed;
  char text[64 * 4];
  for (int t = 0; t < count; t++) {
    size_t len = random_text(&rng, text, 64, mode);
    size_t n, dlen;
    int32_t *ids = encode(tok, text, len, t % 2 == 0, false, &n);
    char *dec = decode(tok, ids, n, &dlen);
    if (dlen != len || memcmp(dec, text, len) != 0) {
      show("input  ", text, len);
      show("decoded", dec, dlen);
      fail_msg("round trip %d (seed %llu) differs", t, (unsigned long long)seed);
    }
    free(dec);
    free(ids);
  }
}

static void test_stories_round_trips(void **state) {
  (void)state;
  struct loaded l;
  load_file(STORIES, &l);
  round_trips(l.tok, 1, 0, 300);
  round_trips(l.tok, 2, 1, 300); /* byte fallback covers invalid UTF-8 */
  loaded_free(&l);
}

static void test_bpe_round_trips(void **state) {
  (void)state;
  struct loaded l;
  load_file("data/vocab/ggml-vocab-gpt-2.gguf", &l);
  round_trips(l.tok, 3, 0, 200);
  round_trips(l.tok, 4, 1, 200); /* invalid UTF-8 goes through the byte mapping */
  loaded_free(&l);
  /* deepseek-coder's characters for the bytes C0, C1, F5..FF are user-defined tokens ("ö" is
   * 32011): they decode to their text, as they must for "ö" matched in the input, so a lone byte
   * F6 (never part of UTF-8) does not come back */
  load_file("data/vocab/ggml-vocab-deepseek-coder.gguf", &l);
  round_trips(l.tok, 5, 0, 200);
  round_trips(l.tok, 6, 2, 200);
  loaded_free(&l);
}

/* The whole validation text: fast, the same ids as the independent implementation, exact decode. */
static void test_stories_speed(void **state) {
  (void)state;
  struct loaded l;
  load_file(STORIES, &l);
  TEST_REQUIRE_FILE(test_shared_path("data/tinystories-valid.txt"));
  size_t len;
  char *text = read_shared("data/tinystories-valid.txt", &len);
  size_t cap = len + 1, n;
  int32_t *ids = malloc(cap * sizeof(*ids));
  assert_non_null(ids);
  npulm_error err = {{0}};
  double t0 = npu_now();
  assert_int_equal(npu_tok_encode(l.tok, text, len, false, false, ids, cap, &n, &err), NPULM_OK);
  double dt = npu_now() - t0;
  print_message("tinystories-valid.txt: %zu bytes -> %zu tokens in %.1f ms\n", len, n, dt * 1e3);
  assert_true(dt < 1.0);
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; i++) {
    h ^= (uint64_t)ids[i];
    h *= 0x100000001b3ULL;
  }
  if (len == 77517) { /* the file the reference ids were computed from */
    assert_int_equal(n, 39658);
    assert_true(h == 0xc6de6bba2fefd2c6ULL);
  }
  size_t dlen;
  char *dec = decode(l.tok, ids, n, &dlen);
  assert_int_equal(dlen, len);
  assert_memory_equal(dec, text, len);
  free(dec);
  free(ids);
  free(text);
  loaded_free(&l);
}

/* ---- Synthetic vocabularies ----------------------------------------------------------------- */

/* What a synthetic tokenizer GGUF holds; NULL / negative fields are left out. */
struct vocab_spec {
  const char *model;
  const char *pre;
  const char *const *tokens;
  size_t n_tokens;
  const float *scores;
  size_t n_scores;
  const int32_t *types;
  size_t n_types;
  const char *const *merges;
  size_t n_merges;
  int64_t bos, eos;
  bool tokens_as_ints; /* store tokenizer.ggml.tokens with the wrong element type */
};

/* Write 'spec' as an in-memory GGUF and load it. Return the load status; on success 'l' holds the
 * tokenizer. */
static npulm_status load_spec(const struct vocab_spec *spec, struct loaded *l, npulm_error *err) {
  struct npu_gguf_writer *w = NULL;
  memset(l, 0, sizeof(*l));
  assert_int_equal(npu_gguf_writer_open_memory(&w, err), NPULM_OK);
  npulm_status st = NPULM_OK;
  if (spec->model != NULL) st = npu_gguf_writer_add_str(w, "tokenizer.ggml.model", spec->model);
  if (spec->pre != NULL) st = npu_gguf_writer_add_str(w, "tokenizer.ggml.pre", spec->pre);
  if (spec->tokens_as_ints) {
    int32_t v[3] = {1, 2, 3};
    st = npu_gguf_writer_add_arr(w, "tokenizer.ggml.tokens", NPU_GGUF_I32, v, 3);
  } else if (spec->tokens != NULL) {
    st = npu_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", spec->tokens, spec->n_tokens);
  }
  if (spec->scores != NULL) {
    st = npu_gguf_writer_add_arr(w, "tokenizer.ggml.scores", NPU_GGUF_F32, spec->scores,
                                 spec->n_scores);
  }
  if (spec->types != NULL) {
    st = npu_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", NPU_GGUF_I32, spec->types,
                                 spec->n_types);
  }
  if (spec->merges != NULL) {
    st = npu_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", spec->merges, spec->n_merges);
  }
  if (spec->bos >= 0) {
    st = npu_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)spec->bos);
  }
  if (spec->eos >= 0) {
    st = npu_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)spec->eos);
  }
  assert_int_equal(st, NPULM_OK);
  assert_int_equal(npu_gguf_writer_finish(w, err), NPULM_OK);
  size_t size;
  assert_int_equal(npu_gguf_writer_take_memory(w, &l->image, &size, err), NPULM_OK);
  npu_gguf_writer_free(w);
  assert_int_equal(npu_gguf_open_memory(l->image, size, &l->g, err), NPULM_OK);
  st = npu_tok_load(l->g, &l->tok, err);
  if (st != NPULM_OK) assert_null(l->tok);
  return st;
}

/* GPT-2's byte-to-character mapping, written out for the test (the code under test has its own). */
static void byte_char(int b, char out[3]) {
  bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  int cp = b;
  if (!keep) {
    int k = 0;
    for (int x = 0; x < b; x++) {
      if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) k++;
    }
    cp = 256 + k;
  }
  size_t n = npu_utf8_put(out, (uint32_t)cp);
  out[n] = '\0';
}

/* A byte-level vocabulary: the 256 byte characters, then "12", "123", "121", "<|eot|>". Merges
 * "1 2" and "12 3" only ("121" is a token no merge makes). */
struct small_bpe {
  char chars[256][3];
  const char *tokens[260];
  int32_t types[260];
};

static void small_bpe_init(struct small_bpe *v) {
  for (int b = 0; b < 256; b++) {
    byte_char(b, v->chars[b]);
    v->tokens[b] = v->chars[b];
    v->types[b] = 1;
  }
  v->tokens[256] = "12";
  v->tokens[257] = "123";
  v->tokens[258] = "121";
  v->tokens[259] = "<|eot|>";
  v->types[256] = v->types[257] = v->types[258] = 1;
  v->types[259] = 3;
}

static const char *const small_merges[] = {"1 2", "12 3"};

/* Encode "12123" with the given pre-tokenizer. */
static void check_pre(const char *pre, const int32_t *want, size_t n_want) {
  struct small_bpe v;
  small_bpe_init(&v);
  struct vocab_spec spec = {.model = "gpt2",
                            .pre = pre,
                            .tokens = v.tokens,
                            .n_tokens = 260,
                            .types = v.types,
                            .n_types = 260,
                            .merges = small_merges,
                            .n_merges = 2,
                            .bos = 259,
                            .eos = 259};
  struct loaded l;
  npulm_error err = {{0}};
  if (load_spec(&spec, &l, &err) != NPULM_OK) fail_msg("pre '%s': %s", pre, err.msg);
  size_t n;
  int32_t *ids = encode(l.tok, "12123", 5, false, false, &n);
  if (n != n_want || memcmp(ids, want, n * sizeof(*ids)) != 0) {
    show_ids("want:", want, n_want);
    show_ids("got: ", ids, n);
    fail_msg("pre-tokenizer '%s' split \"12123\" wrongly", pre);
  }
  free(ids);
  round_trips(l.tok, 7, 1, 50);
  loaded_free(&l);
}

static void test_bpe_pre_tokenizers(void **state) {
  (void)state;
  const int32_t c1 = '1', c2 = '2', c3 = '3'; /* printable ASCII maps to itself, id = byte */
  /* one word: "1 2" merges twice, then "12 3" */
  check_pre("gpt-2", (const int32_t[]){256, 257}, 2);

  /* digits one by one */
  check_pre("qwen2", (const int32_t[]){c1, c2, c1, c2, c3}, 5);
  check_pre("starcoder", (const int32_t[]){c1, c2, c1, c2, c3}, 5);
  check_pre("smollm", (const int32_t[]){c1, c2, c1, c2, c3}, 5);
  check_pre("deepseek-coder", (const int32_t[]){c1, c2, c1, c2, c3}, 5);
  /* up to three digits ("121" "23"); llama3 takes a whole word that is a token as it is */
  check_pre("llama-bpe", (const int32_t[]){258, c2, c3}, 3);
  check_pre("dbrx", (const int32_t[]){256, c1, c2, c3}, 4);
  check_pre("gpt-4o", (const int32_t[]){256, c1, c2, c3}, 4);
  /* "[0-9][0-9][0-9]" after the GPT-2 split: "121" "23" */
  check_pre("falcon", (const int32_t[]){256, c1, c2, c3}, 4);
  check_pre("default", (const int32_t[]){256, c1, c2, c3}, 4);
}

static void test_bpe_specials(void **state) {
  (void)state;
  struct small_bpe v;
  small_bpe_init(&v);
  struct vocab_spec spec = {.model = "gpt2",
                            .pre = "llama-bpe",
                            .tokens = v.tokens,
                            .n_tokens = 260,
                            .types = v.types,
                            .n_types = 260,
                            .merges = small_merges,
                            .n_merges = 2,
                            .bos = 259,
                            .eos = -1};
  struct loaded l;
  npulm_error err = {{0}};
  assert_int_equal(load_spec(&spec, &l, &err), NPULM_OK);
  assert_true(npu_tok_add_bos(l.tok));              /* llama3 default */
  assert_true(npu_tok_is_eog(l.tok, 259) == false); /* no EOS key, not a known EOG text */
  size_t n;
  int32_t *ids = encode(l.tok, "a<|eot|>1", 9, false, true, &n);
  assert_int_equal(n, 3);
  assert_int_equal(ids[0], 'a');
  assert_int_equal(ids[1], 259);
  assert_int_equal(ids[2], '1');
  free(ids);
  ids = encode(l.tok, "a<|eot|>1", 9, true, false, &n);
  assert_int_equal(n, 1 + 9);
  assert_int_equal(ids[0], 259);
  size_t dlen;
  char *dec = decode(l.tok, ids, n, &dlen); /* the control token decodes to nothing */
  assert_int_equal(dlen, 9);
  assert_memory_equal(dec, "a<|eot|>1", 9);
  free(dec);
  free(ids);
  char buf[8];
  assert_int_equal(npu_tok_piece(l.tok, -1, 259, buf, sizeof(buf)), 0);
  assert_string_equal(npu_tok_text(l.tok, 32), "\xc4\xa0"); /* byte 0x20 is U+0120 */
  assert_int_equal(npu_tok_piece(l.tok, -1, 32, buf, sizeof(buf)), 1);
  assert_int_equal(buf[0], ' ');
  loaded_free(&l);
}

/* Every malformed vocabulary is a one-line error naming the key, and no tokenizer. */
static void expect_error(const struct vocab_spec *spec, npulm_status want, const char *needle) {
  struct loaded l;
  npulm_error err = {{0}};
  npulm_status st = load_spec(spec, &l, &err);
  if (st != want || strstr(err.msg, needle) == NULL || strchr(err.msg, '\n') != NULL) {
    fail_msg("expected %s mentioning '%s', got %s: '%s'", npulm_status_name(want), needle,
             npulm_status_name(st), err.msg);
  }
  loaded_free(&l);
}

static void test_hostile_vocab(void **state) {
  (void)state;
  static const char *const toks[] = {"<unk>", "<s>", "</s>", "a", "b", "ab"};
  static const float scores[] = {0, 0, 0, -1, -2, -0.5f};
  static const int32_t types[] = {2, 3, 3, 1, 1, 1};
  const struct vocab_spec good = {.model = "llama",
                                  .tokens = toks,
                                  .n_tokens = 6,
                                  .scores = scores,
                                  .n_scores = 6,
                                  .types = types,
                                  .n_types = 6,
                                  .bos = 1,
                                  .eos = 2};
  struct loaded l;
  npulm_error err = {{0}};
  assert_int_equal(load_spec(&good, &l, &err), NPULM_OK);
  size_t n;
  /* no byte tokens: a character that is no token is one UNK ("▁" here, and "\xff") */
  int32_t *ids = encode(l.tok, "ab\xff", 3, true, true, &n);
  assert_int_equal(n, 4);
  assert_memory_equal(ids, ((const int32_t[]){1, 0, 5, 0}), 4 * sizeof(*ids));
  free(ids);
  loaded_free(&l);

  struct vocab_spec s = good;
  s.n_tokens = 0;
  expect_error(&s, NPULM_ERR_FORMAT, "tokenizer.ggml.tokens");
  s = good;
  s.tokens = NULL;
  expect_error(&s, NPULM_ERR_FORMAT, "tokenizer.ggml.tokens");
  s = good;
  s.tokens_as_ints = true;
  expect_error(&s, NPULM_ERR_FORMAT, "tokenizer.ggml.tokens");
  s = good;
  s.n_scores = 5;
  expect_error(&s, NPULM_ERR_FORMAT, "tokenizer.ggml.scores");
  s = good;
  s.n_types = 4;
  expect_error(&s, NPULM_ERR_FORMAT, "tokenizer.ggml.token_type");
  /* a token type outside llama.cpp's 0 (undefined) .. 6 (byte) is refused, naming the token;
   * (it decoded to nothing before) */
  static const int32_t bad_types[][6] = {
      {2, 3, 3, 1, 7, 1}, {2, 3, 3, -1, 1, 1}, {2, 3, 3, 1, 1, 256}};
  static const char *const bad_needles[] = {"tokenizer.ggml.token_type[4] = 7 ",
                                            "tokenizer.ggml.token_type[3] = -1 ",
                                            "tokenizer.ggml.token_type[5] = 256 "};
  for (size_t i = 0; i < 3; i++) {
    s = good;
    s.types = bad_types[i];
    expect_error(&s, NPULM_ERR_FORMAT, bad_needles[i]);
  }
  static const int32_t edge_types[] = {0, 3, 3, 1, 5, 6}; /* undefined, unused and byte are types */
  s = good;
  s.types = edge_types;
  assert_int_equal(load_spec(&s, &l, &err), NPULM_OK);
  loaded_free(&l);
  s = good;
  s.bos = 6;
  expect_error(&s, NPULM_ERR_FORMAT, "tokenizer.ggml.bos_token_id");
  s = good;
  s.eos = 1000000;
  expect_error(&s, NPULM_ERR_FORMAT, "tokenizer.ggml.eos_token_id");
  s = good;
  s.model = "bert";
  expect_error(&s, NPULM_ERR_UNSUPPORTED, "tokenizer.ggml.model");
  s = good;
  s.model = NULL;
  expect_error(&s, NPULM_ERR_FORMAT, "tokenizer.ggml.model");

  struct small_bpe v;
  small_bpe_init(&v);
  const struct vocab_spec bpe = {.model = "gpt2",
                                 .pre = "gpt-2",
                                 .tokens = v.tokens,
                                 .n_tokens = 260,
                                 .types = v.types,
                                 .n_types = 260,
                                 .merges = small_merges,
                                 .n_merges = 2,
                                 .bos = -1,
                                 .eos = -1};
  assert_int_equal(load_spec(&bpe, &l, &err), NPULM_OK);
  assert_false(npu_tok_add_bos(l.tok));
  assert_int_equal(npu_tok_bos(l.tok), -1);
  int32_t one[1];
  assert_int_equal(npu_tok_encode(l.tok, "1", 1, true, false, one, 1, &n, &err), NPULM_ERR_ARG);
  loaded_free(&l);
  s = bpe;
  s.pre = "no-such-pre";
  expect_error(&s, NPULM_ERR_UNSUPPORTED, "unknown pre-tokenizer 'no-such-pre'");
  s = bpe;
  s.merges = NULL;
  expect_error(&s, NPULM_ERR_FORMAT, "tokenizer.ggml.merges");
  static const char *const bad_merges[][1] = {{"1 zz"}, {"12"}, {"3 1"}, {" "}};
  for (size_t i = 0; i < 4; i++) {
    s = bpe;
    s.merges = bad_merges[i];
    s.n_merges = 1;
    expect_error(&s, NPULM_ERR_FORMAT, "tokenizer.ggml.merges[0]");
  }
  s = bpe;
  s.pre = "llama-bpe"; /* wants BOS by default, but the file names none */
  expect_error(&s, NPULM_ERR_FORMAT, "tokenizer.ggml.add_bos_token");
}

/* npulm_utf8_sequence: each well-formed length, and every form a JSON string cannot hold; the
 * encoder's output of every plane is well-formed and of its own length. */
static void test_utf8_sequence(void **state) {
  (void)state;
  static const struct {
    const char *s;
    size_t n, want;
  } cases[] = {
      {"a", 1, 1},
      {"\xc3\xa9", 2, 2},
      {"\xe2\x82\xac", 3, 3},
      {"\xf0\x9f\x98\x80", 4, 4},
      {"\xe2\x82", 2, 0},         /* cut short */
      {"\x80", 1, 0},             /* a continuation byte alone */
      {"\xc0\x80", 2, 0},         /* overlong */
      {"\xed\xa0\x80", 3, 0},     /* a surrogate */
      {"\xf4\x90\x80\x80", 4, 0}, /* past U+10FFFF */
      {"\xf8\x88\x80\x80", 4, 0},
      {"a", 0, 0},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    assert_int_equal(npulm_utf8_sequence(cases[i].s, cases[i].n), cases[i].want);
  }
  static const uint32_t cps[] = {0x24, 0x7ff, 0x800, 0xfffd, 0x10000, 0x10ffff};
  for (size_t i = 0; i < sizeof(cps) / sizeof(cps[0]); i++) {
    char buf[4];
    const size_t n = npu_utf8_put(buf, cps[i]);
    assert_int_equal(npulm_utf8_sequence(buf, n), n);
    assert_int_equal(n, cps[i] < 0x80 ? 1 : cps[i] < 0x800 ? 2 : cps[i] < 0x10000 ? 3 : 4);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_vocab_llama_spm),    cmocka_unit_test(test_vocab_phi3),
      cmocka_unit_test(test_vocab_gpt2),         cmocka_unit_test(test_vocab_starcoder),
      cmocka_unit_test(test_vocab_falcon),       cmocka_unit_test(test_vocab_deepseek_coder),
      cmocka_unit_test(test_stories_once),       cmocka_unit_test(test_stories_pieces),
      cmocka_unit_test(test_stories_special),    cmocka_unit_test(test_stories_round_trips),
      cmocka_unit_test(test_bpe_round_trips),    cmocka_unit_test(test_stories_speed),
      cmocka_unit_test(test_bpe_pre_tokenizers), cmocka_unit_test(test_bpe_specials),
      cmocka_unit_test(test_hostile_vocab),      cmocka_unit_test(test_utf8_sequence),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
