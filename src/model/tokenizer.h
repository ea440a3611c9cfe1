/* Tokenizers read from GGUF metadata: SentencePiece-style ("llama": score-driven merges, byte
 * fallback) and byte-level BPE ("gpt2": ranked merges after a regex pre-tokenizer chosen by
 * tokenizer.ggml.pre). The tokenizer copies what it needs: it outlives the GGUF mapping. */
#ifndef NPU_MODEL_TOKENIZER_H
#define NPU_MODEL_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io/gguf.h"
#include "npulm.h"

struct npu_tok;

/* Build a tokenizer from the tokenizer.ggml.* keys of 'g'. Return NPULM_OK and '*out', or an error
 * naming the missing or malformed key (or the unsupported model / pre-tokenizer). */
npulm_status npu_tok_load(const struct npu_gguf *g, struct npu_tok **out, npulm_error *err);
void npu_tok_free(struct npu_tok *tok); /* accepts NULL */

int npu_tok_n_vocab(const struct npu_tok *tok);
int32_t npu_tok_bos(const struct npu_tok *tok); /* -1 if none */
int32_t npu_tok_eos(const struct npu_tok *tok); /* -1 if none */
bool npu_tok_add_bos(const struct npu_tok *tok);
/* True for tokens that end generation (EOS, EOT, ...). */
bool npu_tok_is_eog(const struct npu_tok *tok, int32_t id);

/* Same contract as npulm_tokenize(). */
npulm_status npu_tok_encode(const struct npu_tok *tok, const char *text, size_t len, bool add_bos,
                            bool parse_special, int32_t *ids, size_t cap, size_t *n_out,
                            npulm_error *err);

/* Same contracts as npulm_token_text() and npulm_token_to_piece(). */
const char *npu_tok_text(const struct npu_tok *tok, int32_t id);
size_t npu_tok_piece(const struct npu_tok *tok, int32_t prev, int32_t id, char *buf, size_t cap);

#endif /* NPU_MODEL_TOKENIZER_H */
