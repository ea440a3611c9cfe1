/* The encodings file of an export, in AIMET's format (version 0.6.1): for each quantized tensor
 * of the ONNX graph, keyed by its name, a list of encodings (one per tensor for activations, one
 * per output channel for weights), each with bitwidth, dtype, is_symmetric, scale, offset, min
 * and max, in AIMET's unsigned frame: offset = -(zero_point + 2^(bits-1)), real = (q_u + offset)
 * * scale over q_u in [0, 2^bits - 1], so min = offset * scale and max = (offset + 2^bits - 1) *
 * scale. An LPBQ weight's channel entry adds "block_size" and "per_block_int_scale" (its blocks'
 * integer scales, each block's real scale that times the channel's), as AIMET's LPBQ encodings
 * carry them.
 *
 * Written as it is made, straight to the file: a document model (jansson) would hold every
 * entry at once, and an 8B LPBQ model has 218 million block scales. Activation entries, a few
 * per layer, wait in memory and go last. The file is written whole or not at all. */
#ifndef NPU_EXPORT_ENCODINGS_H
#define NPU_EXPORT_ENCODINGS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/atomic_file.h"
#include "npulm.h"

struct npu_encodings {
  struct npu_afile file;
  npulm_status status; /* the first failure; every later call does nothing */
  npulm_error err;
  int32_t params;            /* param entries written */
  int32_t channels;          /* channels of the param entry open (-1: none) */
  struct XXH3_state_s *hash; /* of every byte written (xxhash.h's XXH3_state_t) */
  char *activations;         /* the activation section's text so far */
  size_t act_len, act_cap;
};

/* Start writing the encodings file at 'path'. */
npulm_status npu_encodings_open(struct npu_encodings *e, const char *path, npulm_error *err);

/* An activation: a 'bits'-bit tensor 'name' with real value (q - zero_point) * scale. */
void npu_encodings_activation(struct npu_encodings *e, const char *name, int bits, double scale,
                              int32_t zero_point);

/* A weight 'name': begin, then one channel after another (symmetric, 'bits' bits; with
 * 'n_blocks' > 0, at most NPU_ENCODINGS_MAX_BLOCKS, the LPBQ block scales of the channel, each
 * in [0, 15], blocks of 'block_size' along k), end. */
#define NPU_ENCODINGS_MAX_BLOCKS 1024 /* 32768 / 32: the widest k a matmul takes */
void npu_encodings_param_begin(struct npu_encodings *e, const char *name);
void npu_encodings_param_channel(struct npu_encodings *e, int bits, double scale,
                                 const uint8_t *block_scales, int32_t n_blocks, int32_t block_size);
void npu_encodings_param_end(struct npu_encodings *e);

/* Finish with the activation section and 'quantizer_args' (a JSON object's text), and put the
 * file in place, '*digest_out' the XXH3-64 of all its bytes; or give up, leaving no file. Both
 * free 'e''s memory. */
npulm_status npu_encodings_commit(struct npu_encodings *e, const char *quantizer_args,
                                  uint64_t *digest_out, npulm_error *err);
void npu_encodings_abort(struct npu_encodings *e);

#endif /* NPU_EXPORT_ENCODINGS_H */
