/* Synthetic models inside npulm: the shape table behind npulm_synth, and one writer of small or
 * real-shaped llama-family GGUFs with knobs to break them, shared by npulm_synth, the tests and the
 * fuzz seeds (the fixture). */
#ifndef NPU_MODEL_SYNTH_H
#define NPU_MODEL_SYNTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io/gguf_write.h"
#include "npulm.h"
#include "npulm_bench.h"

/* One model's hyperparameters (its HF config.json / llama2.c header). */
struct npu_synth_shape {
  const char *name;  /* what npulm_synth takes (NULL for a custom shape) */
  const char *arch;  /* general.architecture */
  const char *title; /* general.name */
  uint32_t dim;
  uint32_t n_layers;
  uint32_t n_heads;
  uint32_t n_kv_heads;
  uint32_t ffn_dim;
  uint32_t n_vocab; /* at least 259: <unk>, <s>, </s> and the 256 byte tokens */
  uint32_t n_ctx;
  float rope_base;
  float rms_eps;
  bool tied;         /* no output.weight: the output projection is token_embd */
  bool qkv_bias;     /* attn_{q,k,v}.bias (qwen2) */
  bool head_dim_key; /* config.json has "head_dim": {arch}.attention.{key,value}_length */
  /* Llama 3 RoPE scaling (rope_type "llama3"): the converter writes rope_freqs.weight. */
  float rope_llama3_factor; /* 0 = none */
  float rope_low_freq_factor;
  float rope_high_freq_factor;
  uint32_t rope_orig_ctx;
};

/* The named shape 'name' (npulm_synth_shapes lists them), or NULL. */
const struct npu_synth_shape *npu_synth_shape_find(const char *name);

/* The number of weights of 'sh' (the elements of every tensor it writes), or 0 out of memory. */
uint64_t npu_synth_n_params(const struct npu_synth_shape *sh);

/* A tensor as the fill hook sees it. 1-D tensors (norms, biases, rope factors) are always F32. */
struct npu_synth_tensor {
  const char *name;
  uint32_t n_dims;
  uint64_t ne[2];
  uint32_t type; /* ggml type in the file */
};

/* Write the 'n' values of tensor 't' from element 'first' on into 'vals'. Called in file order,
 * tensor by tensor, in chunks of consecutive elements. */
typedef void (*npu_synth_fill_fn)(void *user, const struct npu_synth_tensor *t, uint64_t first,
                                  float *vals, size_t n);

/* How to write a shape, and what to break in it. Zero-initialize: every zero field is the
 * default (F32 matrices, seed 0, synth's random weights, nothing broken). */
struct npu_synth_options {
  /* ggml type of the 2-D weights: one ggml_blocks.c writes (another: zero bytes). Q4_0 is
   * llama-quantize's Q4_0 mix: the classifier in Q6_K, or Q8_0 where its rows are not 256-blocks.
   */
  uint32_t type2d;
  uint64_t seed;
  npu_synth_fill_fn fill; /* NULL: seeded normal weights of realistic scale */
  void *user;             /* given to 'fill' */
  npulm_progress_fn progress;
  void *progress_user;
  /* Breakage, for tests of hostile files. */
  const char *omit_key;    /* leave out this hyperparameter key (full name: "llama.block_count") */
  const char *omit_tensor; /* leave out this tensor */
  const char *wide_tensor; /* declare this tensor 32 elements wider in ne[0] */
  const char *poke_tensor; /* after conversion, overwrite element 'poke_at' of this tensor... */
  uint64_t poke_at;
  uint32_t poke_bits; /* ...with these F32 bits, or the low 16 in an F16 or BF16 tensor */
  bool no_tensors;    /* metadata and vocabulary only, as llama.cpp's ggml-vocab-*.gguf files */
};

/* Add the metadata (hyperparameters, a SentencePiece vocabulary of sh->n_vocab pieces), the tensor
 * declarations and the tensor data of 'sh' to 'w', an open writer to which nothing but metadata
 * has been added (a caller may add keys of its own first); the caller finishes and frees it.
 * Returns the writer's status; on error '*err' names the problem. */
npulm_status npu_synth_write(struct npu_gguf_writer *w, const struct npu_synth_shape *sh,
                             const struct npu_synth_options *o, npulm_error *err);

#endif /* NPU_MODEL_SYNTH_H */
