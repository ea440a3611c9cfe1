/* Private to the tokenizer files: the vocabulary (struct npu_tok), its token and merge hash tables,
 * and the per-call output and scratch helpers (vocab.c) that the front end (tokenizer.c) and both
 * algorithms (tokenizer_spm.c, tokenizer_bpe.c) share. */
#ifndef NPU_MODEL_VOCAB_H
#define NPU_MODEL_VOCAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "model/tokenizer.h"
#include "npulm.h"

/* tokenizer.ggml.token_type values (llama.cpp's LLAMA_TOKEN_TYPE_*). */
enum npu_tok_type {
  NPU_TOK_UNDEFINED = 0,
  NPU_TOK_NORMAL = 1,
  NPU_TOK_UNKNOWN = 2,
  NPU_TOK_CONTROL = 3,
  NPU_TOK_USER_DEFINED = 4,
  NPU_TOK_UNUSED = 5,
  NPU_TOK_BYTE = 6,
};

enum npu_tok_kind {
  NPU_TOK_SPM, /* tokenizer.ggml.model = "llama" */
  NPU_TOK_BPE, /* tokenizer.ggml.model = "gpt2" */
};

#define NPU_TOK_MAX_REGEX 5 /* longest pre-tokenizer regex sequence */
#define NPU_TOK_FLAG_EOG 1u /* token ends generation */

/* One merge of tokenizer.ggml.merges: the pair (left, right) of token ids becomes 'id'. */
struct npu_tok_merge {
  uint64_t key; /* left << 32 | right */
  int32_t rank; /* index in tokenizer.ggml.merges; -1 marks an empty slot */
  int32_t id;
};

struct npu_tok {
  enum npu_tok_kind kind;
  int32_t n_vocab;
  /* token i's text: pool + off[i], len[i] bytes, NUL-terminated in the pool */
  char *pool;
  size_t *off;       /* (n_vocab) */
  uint32_t *len;     /* (n_vocab) */
  float *score;      /* (n_vocab) SPM merge priority; 0 when the file has no scores */
  uint8_t *type;     /* (n_vocab) enum npu_tok_type */
  uint8_t *flags;    /* (n_vocab) NPU_TOK_FLAG_* */
  int16_t *byte_val; /* (n_vocab) the byte a BYTE token "<0xXX>" stands for, else -1 */
  uint32_t max_len;  /* longest token text */

  /* text -> id: open addressing, linear probing; -1 marks an empty slot */
  int32_t *slots;
  size_t slot_mask;

  /* (left id, right id) -> merge, BPE only */
  struct npu_tok_merge *merges;
  size_t merge_mask;

  int32_t byte_tok[256]; /* token for a lone byte (SPM "<0xXX>", BPE mapped char), or -1 */
  uint16_t byte_cp[256]; /* GPT-2 bytes_to_unicode: byte -> code point */
  int16_t cp_byte[324];  /* and back (code points < 324), -1 where none */

  /* control, user-defined and unknown tokens, longest text first, for matching in text */
  int32_t *special;
  size_t n_special;

  int32_t bos, eos, unk, eot, eom; /* -1 if none */
  bool add_bos;
  bool add_space_prefix;
  bool ignore_merges; /* BPE: a pre-tokenized word that is a token is not merged (llama3) */

  pcre2_code *regex[NPU_TOK_MAX_REGEX]; /* the pre-tokenizer, applied in order */
  size_t n_regex;
};

/* Id of the token whose text is exactly s[0..n), or -1. */
int32_t npu_tok_lookup(const struct npu_tok *tok, const char *s, size_t n);

/* The merge of (left, right), or NULL. */
const struct npu_tok_merge *npu_tok_find_merge(const struct npu_tok *tok, int32_t left,
                                               int32_t right);

/* Building the tables at load (vocab.c): the size of a table for 'n' entries (a power of two,
 * 0 on overflow), then each token and merge inserted into a table of that size. */
size_t npu_tok_table_size(size_t n);
void npu_tok_insert_token(struct npu_tok *tok, int32_t id);
void npu_tok_insert_merge(struct npu_tok *tok, int32_t left, int32_t right, int32_t rank,
                          int32_t id);

/* Ids produced by an encode call: counted always, stored while they fit. */
struct npu_tok_out {
  int32_t *ids;
  size_t cap;
  size_t n;
};

static inline void npu_tok_push(struct npu_tok_out *o, int32_t id) {
  if (o->n < o->cap) o->ids[o->n] = id;
  o->n++;
}

/* Emit the byte-fallback tokens of the character s[0..n) that is no token: its bytes' tokens, or
 * one UNK if the vocab lacks one of them (nothing if it has no UNK either). */
void npu_tok_push_bytes(const struct npu_tok *tok, const char *s, size_t n, struct npu_tok_out *o);

/* Grow '*buf' (elements of 'elem' bytes, '*cap' of them) to hold at least 'need'. Return false on
 * overflow or allocation failure, leaving '*buf' as it was. */
bool npu_tok_reserve(void **buf, size_t *cap, size_t need, size_t elem);

/* Scratch buffers of one encode call, grown as needed and freed by npu_tok_scratch_free. */
struct npu_tok_scratch {
  char *text; /* SPM escaped text, BPE mapped word */
  size_t text_cap;
  void *sym; /* symbols of the word being merged */
  size_t sym_cap;
  void *heap; /* candidate merges */
  size_t heap_cap;
  void *spans, *spans2; /* BPE pre-tokenizer pieces */
  size_t spans_cap, spans2_cap;
  pcre2_match_data *md;
};

void npu_tok_scratch_free(struct npu_tok_scratch *s);

/* A candidate merge of two adjacent symbols. Merges are taken highest 'priority' first (the SPM
 * score of the merged piece, or minus the BPE merge rank; ranks are far below 2^24, so exact in a
 * float), then leftmost first. */
struct npu_tok_bigram {
  float priority;
  int32_t left, right; /* symbol indices */
  int32_t lid, rid;    /* BPE: the two sides' token ids when queued, to spot stale entries */
  uint32_t size;       /* SPM: bytes of the merged piece */
  int32_t id;          /* the merged token */
};

/* The merge queue: a binary heap of '*n' bigrams in s->heap. Push returns false when out of
 * memory; pop requires *n > 0. */
bool npu_tok_heap_push(struct npu_tok_scratch *s, size_t *n, struct npu_tok_bigram b);
struct npu_tok_bigram npu_tok_heap_pop(struct npu_tok_scratch *s, size_t *n);

/* Length of the UTF-8 sequence that lead byte 'c' announces (1 for continuation bytes). */
static inline size_t npu_tok_utf8_len(unsigned char c) {
  static const uint8_t lens[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return lens[c >> 4];
}

/* SentencePiece encoding of one text fragment (no special tokens in it): spaces become U+2581,
 * with one prepended when 'space_prefix'; then score-driven merges and byte fallback. */
npulm_status npu_tok_spm_encode(const struct npu_tok *tok, const char *text, size_t len,
                                bool space_prefix, struct npu_tok_scratch *s,
                                struct npu_tok_out *out, npulm_error *err);

/* Byte-level BPE encoding of one text fragment: the pre-tokenizer regexes split it into words,
 * each word's bytes go through the GPT-2 byte mapping and are merged by rank. */
npulm_status npu_tok_bpe_encode(const struct npu_tok *tok, const char *text, size_t len,
                                struct npu_tok_scratch *s, struct npu_tok_out *out,
                                npulm_error *err);

/* Choose and compile the pre-tokenizer named 'pre' (tokenizer.ggml.pre; NULL = "default").
 * Sets tok->regex, tok->n_regex, tok->ignore_merges and '*add_bos_default'. Unknown names are
 * NPULM_ERR_UNSUPPORTED. */
npulm_status npu_tok_bpe_init(struct npu_tok *tok, const char *pre, size_t pre_len,
                              bool *add_bos_default, npulm_error *err);

#endif /* NPU_MODEL_VOCAB_H */
