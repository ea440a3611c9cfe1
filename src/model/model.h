/* Llama-family models read from GGUF: the configuration, FP32 views of every weight (each value
 * checked finite), and the tokenizer. Weights stored as F32 are used in place (zero-copy); other
 * types are dequantized once at load. */
#ifndef NPU_MODEL_MODEL_H
#define NPU_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io/gguf.h"
#include "model/tokenizer.h"
#include "npulm.h"

enum npu_arch { NPU_ARCH_LLAMA, NPU_ARCH_QWEN2 };

/* How RoPE pairs the dimensions of a head: llama.cpp's "norm" rotates adjacent pairs (2i, 2i+1),
 * "neox" rotates (i, i + rope_dim/2). */
enum npu_rope_type { NPU_ROPE_NORM, NPU_ROPE_NEOX };

struct npu_config {
  enum npu_arch arch;
  enum npu_rope_type rope_type;
  int dim; /* embedding width */
  int n_layers;
  int n_heads;
  int n_kv_heads; /* < n_heads for grouped-query attention */
  int head_dim;
  int rope_dim; /* leading dimensions of each head that RoPE rotates (<= head_dim) */
  int ffn_dim;
  int n_vocab;
  int n_ctx_train;
  float rope_base;
  float rms_eps;
  bool tied_output;
  bool has_qkv_bias; /* qwen2 */
  bool vocab_only;   /* opened by npulm_model_open_vocab: no weights, and every field but n_vocab
                        and name is 0 */
  char name[128];
};

struct npu_layer_weights {
  const float *attn_norm; /* (dim) */
  const float *wq;        /* (n_heads * head_dim, dim): row o holds the weights of output o */
  const float *wk;        /* (n_kv_heads * head_dim, dim) */
  const float *wv;        /* (n_kv_heads * head_dim, dim) */
  const float *bq;        /* (n_heads * head_dim) or NULL */
  const float *bk;        /* (n_kv_heads * head_dim) or NULL */
  const float *bv;        /* (n_kv_heads * head_dim) or NULL */
  const float *wo;        /* (dim, n_heads * head_dim) */
  const float *ffn_norm;  /* (dim) */
  const float *w_gate;    /* (ffn_dim, dim) */
  const float *w_up;      /* (ffn_dim, dim) */
  const float *w_down;    /* (dim, ffn_dim) */
};

struct npu_weights {
  const float *token_embd;          /* (n_vocab, dim) */
  struct npu_layer_weights *layers; /* (n_layers) */
  const float *output_norm;         /* (dim) */
  const float *output;              /* (n_vocab, dim); token_embd when tied */
  const float *rope_freqs;          /* (rope_dim / 2) frequency divisors (llama 3), or NULL */
};

struct npu_program;

struct npulm_model {
  struct npu_config cfg;
  struct npu_program *program; /* static graphs, or NULL until compiled / loaded */
  struct npu_weights w;
  struct npu_tok *tok;
  struct npu_gguf *gguf;
  float **owned; /* dequantized copies, freed with the model */
  size_t n_owned;
  uint64_t n_params;
  bool weights_vouched; /* a program file's: its checksums held, so its weights are the ones its
                           compile read from a model whose every weight was found finite */
  /* The weights of the model that its file holds no float copy of: a lean program file's (an
   * integer program compiled without --keep-float), whose NPU runs them from the int8 form its
   * program holds. Set before npu_model_read (from the program file's weight list), which leaves
   * their views NULL; NULL and 0 for every other model. Freed with the model. */
  char **omitted;
  int32_t n_omitted;
  /* Set before npu_model_read: the matrices (the 2-D weights) are checked (shape, type) but not
   * read, their views left NULL; npu_model_read_rows reads them a block of rows at a time. A
   * compile that streams reads a model so, a layer at a time, in bounded memory. */
  bool defer_matrices;
  /* Bytes of weights to hold in memory (npulm_open_params.mem_budget; 0: none): set before the
   * program is loaded, which then leaves the packed weights in the file's mapping; the sessions
   * decide what stays (runtime/neurons.h). */
  uint64_t mem_budget;
  bool buffered_io; /* npulm_open_params.buffered_io */
};

/* Tokenize all of 'text' into a malloc'd array (free it with free()), sized as the text needs. */
npulm_status npu_tokenize_alloc(const struct npulm_model *m, const char *text, size_t len,
                                bool add_bos, int32_t **ids_out, size_t *n_out, npulm_error *err);

/* Read everything of the model in 'm->gguf' (already open): configuration, tokenizer, weights.
 * Weights are checked finite unless 'm->weights_vouched'. On failure 'm' holds what was read so
 * far, for npu_model_release. */
npulm_status npu_model_read(struct npulm_model *m, npulm_error *err);

/* Whether the file of 'm' holds no float copy of weight 'name' (it is in m->omitted). */
bool npu_model_omits(const struct npulm_model *m, const char *name);

/* NPULM_ERR_UNSUPPORTED if 'm' lacks the float copy of weights it has ('m->n_omitted' > 0: a
 * lean program file): what needs the float model ('what': "the reference forward", "compiling",
 * ...) checks this first, so that it refuses in one line instead of reading a NULL view. */
npulm_status npu_model_check_float(const struct npulm_model *m, const char *what, npulm_error *err);

/* Rows [row0, row0 + n_rows) of weight matrix 'name' of the model's file as floats at 'out'
 * (n_rows times its row length), each value checked finite, and the file's pages they came from
 * let go of: how a model read with defer_matrices gives its matrices. */
npulm_status npu_model_read_rows(const struct npulm_model *m, const char *name, uint64_t row0,
                                 uint64_t n_rows, float *out, npulm_error *err);

/* Read only the tokenizer of 'm->gguf' (and the name): a model with no weights (cfg.vocab_only). */
npulm_status npu_model_read_vocab(struct npulm_model *m, npulm_error *err);

/* Free what npu_model_read or npu_model_read_vocab read, and close 'm->gguf'; not 'm' itself nor
 * its program (a higher layer's, freed by npulm_model_close). */
void npu_model_release(struct npulm_model *m);

/* Read the configuration of 'g' (keys as llama.cpp writes them) and check it is coherent. */
npulm_status npu_config_read(const struct npu_gguf *g, struct npu_config *cfg, npulm_error *err);

/* NPULM_ERR_ARG if 'cfg' is a model's that has no weights (cfg->vocab_only): what compiles or
 * runs a model checks this first. */
npulm_status npu_config_check_weights(const struct npu_config *cfg, npulm_error *err);

#endif /* NPU_MODEL_MODEL_H */
