/* The program file, private to its three parts (program_verify.c, program_load.c,
 * program_save.c): its format, its records' layouts and what the parts share.
 *
 * A program file is a compiled model — configuration, tokenizer, static graphs with placement and
 * memory plan, weights and, for an integer NPU, every NPU operation's integer data — as one
 * mmap-able file, read back as hostile input.
 *
 * Format, version 9. A program file is a GGUF v3 file (ggml/docs/gguf.md), so the bounds-checked
 * GGUF reader parses it, the model loader and the tokenizer read it unchanged, and the float
 * weights it holds are used in place from the mapping. It is written whole or not at all (a
 * temporary file renamed into place) and every byte of it is checksummed (gguf_checksum.h). It
 * holds:
 *
 *   general.alignment          u32   64: every tensor's data starts on a cache line
 *   (the source model's metadata, value for value and in its order: general.*, {arch}.*,
 *    tokenizer.ggml.*; except general.alignment, the npulm.* keys of an earlier program, and
 *    general.file_type, which becomes 0 = all F32 where the source has it)
 *   npulm.program.version      u32   9; any other value is refused (NPULM_ERR_UNSUPPORTED: version
 *                                    1 files, FP32 only, version 2 files, without attention on
 *                                    the integer NPU, version 3 files, without its RMSNorm,
 *                                    version 4 files, without checksums, version 5 files,
 *                                    without tensor roles, version 6 files, with every float
 *                                    weight and no npulm.weights.float, version 7 files, with
 *                                    every tensor name and I32 shifts, and version 8 files,
 *                                    int8 only, must be recompiled)
 *   npulm.compile.chunks       i32[] prefill chunk sizes, ascending (may be empty)
 *   npulm.compile.buckets      i32[] context buckets, ascending
 *   npulm.compile.float_ops    u32   ops the precision policy keeps in float: bits 1 << enum npu_op
 *   npulm.weights              str[] npu_weight_table's names in its order (a weight the model
 *                                    lacks, such as an absent bias, is listed all the same)
 *   npulm.weights.float        u8[]  per name of npulm.weights, whether the file holds that weight
 *                                    as an F32 tensor: 0 the model lacks it, 1 held, 2 not held:
 *                                    an integer program compiled without --keep-float leaves out
 *                                    the weights that only its integer NPU nodes read (their int8
 *                                    form is in the sites). The model is read without them (NULL
 *                                    views), and loading refuses a file in which a node the
 *                                    executor runs in float (every node of an FP32 program, the
 *                                    CPU's of an integer one) reads one; the reference forward
 *                                    and compiling refuse such a model (the GGUF has them)
 *   npulm.graph.count          u32   graphs: rows 1, then each chunk size, each with every bucket
 *                                    >= rows, in that order (as npu_compile makes them)
 *   npulm.graph.G.info         i32[3] rows, ctx, n_transfers            (G = 0 .. count - 1)
 *   npulm.graph.G.arena_size   u64[2] bytes of the NPU arena, of the CPU arena
 *   npulm.graph.G.tensors      i32[14 * n_tensors], per tensor: kind, dtype, backend,
 *                                    kv_is_value, ne0, ne1, ne2, ref, offset (low 32 bits),
 *                                    offset (high 32 bits), q.scale (f32 bits), q.zero_point,
 *                                    layer (-1 outside the blocks), role (enum npu_tensor_role)
 *   npulm.graph.G.tensor_names str[n_tensors], each shorter than NPU_IR_NAME_MAX bytes; empty
 *                                    for a tensor named as its record implies
 *                                    (npu_program_tensor_name: a WEIGHT's weight's name, a
 *                                    tensor with a role "blk.L.<role>", or "<role>" in layer
 *                                    -1), which the loader rebuilds; an empty name where the
 *                                    record implies none is refused
 *   npulm.graph.G.nodes        i32[9 * n_nodes], per node: op, backend, pinned, in0, in1, in2,
 *                                    out, layer, param (f32 bits)
 *   npulm.graph.G.subgraphs    i32[3 * n_subgraphs], per subgraph: first, count, backend
 *   npulm.quant.mode           u32   enum npu_quant_mode: 0 = f32 (the NPU computes in FP32; no
 *                                    other npulm.quant / npulm.qsite key is read), else 1 +
 *                                    outliers (0 naive, 1 shadow, 2 smooth) + 3 * precision (0
 *                                    w8a8, 1 w8a16, 2 w4a16, 3 w4a16-block, 4 w4a8): 1 =
 *                                    w8a8-naive, ..., 15 = w4a8-smooth
 *   npulm.quant.smooth_alpha   f32   } the options the program was quantized with (mode != 0;
 *                                      smooth_alpha -1: chosen per block and matmul input)
 *   npulm.quant.shadow_threshold f32 }
 *   npulm.qtensors             i32[3 * n], per quantized tensor name: dtype, scale (f32 bits),
 *                                    zero point (struct npu_qtensor)
 *   npulm.qtensor_names        str[n]
 *   npulm.qsites               i32[42 * n_sites], per site (struct npu_qsite): op, n, k,
 *                                    n_outliers, outlier_dim; gemm x_zero_point, y_zero_point;
 *                                    gather y_zero_point; add a_zero_point, b_zero_point,
 *                                    left_shift, a_mult, a_shift, b_mult, b_shift, y_mult, y_shift,
 *                                    y_zero_point; mul a_zero_point, b_zero_point, y_mult, y_shift,
 *                                    y_zero_point (fields 0 .. 22); qk q_zero_point, k_zero_point,
 *                                    mult, shift, s_zero_point (23 .. 27); softmax mult, shift
 *                                    (28, 29); pv v_zero_point, mult, shift, y_zero_point
 *                                    (30 .. 33); rmsnorm eps (low, high 32 bits), shift,
 *                                    y_zero_point (34 .. 37), with n its width; gemm w_bits
 *                                    (8 or 4), w_block (0, or 32 for int4), acc_shift (the
 *                                    narrowing of an int16 input's sums, 0..32) (38 .. 40); SILU
 *                                    lut_wide (41: 1 for an int16 table). The fields of other ops
 *                                    than the site's are 0; a LAST_ROW site has none.
 *   npulm.qsite_names          str[n_sites], each shorter than NPU_IR_NAME_MAX bytes
 *   npulm.qsites.luts          i8[256 * number of SILU sites of int8]: their tables, in site
 *                                    order
 *   npulm.qsites.luts16        i16[513 * number of SILU sites of int16]: their tables
 *                                    (npu_qs16_lut), in site order
 *   npulm.qsites.tables        i32[n_sites], optional: per site -1, or for a gather that reads
 *                                    its table out of a matmul's packed weights of the same
 *                                    [n, k] (a tied embedding, stored once) that matmul's site;
 *                                    such a gather has no packed tensor of its own
 *   npulm.sparse.level, npulm.sparse.layers: optional, a program compiled with a sparsity: its
 *                                    sparse decode data (program_sparse.c gives the keys and
 *                                    the tensors npulm.sparse.L.*); a reader without sparse
 *                                    decode runs such a file dense
 *   npulm.sparse_input.level, .below, .keep (.auto): optional, a program compiled with an input
 *                                    sparsity: the share skipped and each site's threshold
 *                                    (program_sparse.c); a reader without it runs dense
 *   npulm.checksums            u64[1 + n_tensors], the last key: XXH3-64 of the header (bytes
 *                                    0 .. data offset, this array's values read as 0), then of
 *                                    each tensor's data with its padding; the tensors lie back to
 *                                    back to the end of the file, so every byte is covered. All
 *                                    are checked when the file is opened, before any other key
 *                                    but the version is read (npu_program_file_check).
 *
 *   tensors: every weight of npulm.weights.float 1, under its GGUF name and shape, as F32 (a tied
 *   output is stored once, as token_embd.weight; a SmoothQuant program stores its smoothed
 *   weights), and rope_freqs.weight where the model has it;
 *   then for each site S (0 .. n_sites - 1), those of its arrays it has:
 *     npulm.qsite.S.packed     I8  [packed_size]  matmul: npu_qs8_gemm_pack's layout of [n, k]
 *                                                 (w_bits 8) or npu_qc4w_gemm_pack's (4);
 *                                                 gather: the int8 table [n rows, k]
 *     npulm.qsite.S.mult       I32 [n]            } per output channel / table row (an
 *     npulm.qsite.S.shift      I8  [n]            } rmsnorm: mult only, per channel; the
 *                                                 shifts are widened to int32 when loaded)
 *     npulm.qsite.S.outliers   I32 [n_outliers]   shadow outliers: input channels, ascending
 *     npulm.qsite.S.outlier_w  F32 [n_outliers, n] their weight columns (ggml order: ne0 first)
 *     npulm.qsite.S.outlier_gate F32 [outlier_dim, n_outliers] } when outlier_dim > 0: the FFN
 *     npulm.qsite.S.outlier_up   F32 [outlier_dim, n_outliers] } gate and up rows of them
 *   The packed weights of matmuls are copied out of the mapping into huge pages
 *   (npu_quant_place_packed), those of gathers used in place (64-byte aligned, like all tensors);
 *   the small arrays are copied.
 *
 * Version 3 graphs compute in FP32 (quant.mode 0: activations, weights, caches and logits F32,
 * token ids I32) or, for an integer NPU, with I8/I16 activations on the NPU and F32 everywhere
 * else. Attention on the integer NPU (QK, SOFTMAX, PV not in float_ops) reads, as its second
 * operand, an NPU I8 activation [ctx, kv_dim] named blk.L.k_cache / blk.L.v_cache (ref -1,
 * kv_is_value that of its cache) that a CPU TRANSFER from the layer's F32 cache fills, rows
 * 0 .. pos0 + n_valid - 1 each step; its scores are I16 [heads, rows, ctx], its probabilities
 * I16 Q15 (scale 2^-15, zero point 0). Attention that the policy keeps all in float (QK, SOFTMAX
 * and PV in float_ops, the default) is one CPU node of op 13, ATTN: in0 q [rows, q_dim], in1 and
 * in2 the layer's own F32 K and V caches, param the scale, out [rows, q_dim]; it has no scores or
 * probabilities tensors. (Files written before ATTN existed hold QK, SOFTMAX and PV on the CPU
 * instead; they load and run as they are. Op 13 came without a new version: a reader that
 * predates it refuses such a file as having an unknown op.) After the decode graphs, each chunk
 * size has its graphs (one per bucket) with the logits of every row [rows, n_vocab], then those
 * for generation, whose logits are the last real row's only [1, n_vocab]: a node of op 14,
 * LAST_ROW (in0 [rows, dim], out [1, dim]), copies row n_valid - 1 of the last block's output,
 * and the output norm and classifier run on that one row. (Files without the graphs for
 * generation still load and run, computing every row's logits; an older reader refuses the new
 * ones for op 14.) Since version 4 the integer NPU runs RMSNORM (int16 in, int8 out) and
 * LAST_ROW (a copy, its output quantized as its input), and the CPU no longer does between a
 * block's residual add and its next matmul. Enumerations are stored as numbered
 * in ir/ir.h and program/quant_mode.h (pinned by the static asserts below): a change of numbering
 * or of a record's fields needs a new version. Each record's fields are listed once, in the
 * *_RECORD lists below, which the writer and the reader both follow.
 * Loading range-checks every field, runs npu_ir_validate on every graph, links every NPU node to
 * its site (npu_quant_link) and runs npu_program_verify on the whole program, so that no file can
 * make the executor or an integer kernel index outside a tensor, an arena, a site's arrays, the KV
 * cache or the logits. */
#ifndef NPU_PROGRAM_PROGRAM_FILE_H
#define NPU_PROGRAM_PROGRAM_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "program/program.h"
#include "program/program_io.h"

#define NPU_PROGRAM_KEY_VERSION "npulm.program.version"
#define FILE_ALIGNMENT 64u
#define LUT_SIZE 256
#define LUT16_SIZE NPU_QS16_LUT_SIZE
#define GGML_I8 24 /* ggml type ids of the sites' integer arrays */
#define GGML_I32 26

/* The numbering the file format stores. */
_Static_assert(NPU_DT_F32 == 0 && NPU_DT_I8 == 1 && NPU_DT_I16 == 2 && NPU_DT_I32 == 3,
               "enum npu_dtype is stored in program files: bump NPU_PROGRAM_VERSION");
_Static_assert(NPU_BE_NPU == 0 && NPU_BE_CPU == 1 && NPU_BE_COUNT == 2,
               "enum npu_backend is stored in program files: bump NPU_PROGRAM_VERSION");
_Static_assert(NPU_TK_ACT == 0 && NPU_TK_WEIGHT == 1 && NPU_TK_INPUT_IDS == 2 && NPU_TK_KV == 3 &&
                   NPU_TK_LOGITS == 4,
               "enum npu_tensor_kind is stored in program files: bump NPU_PROGRAM_VERSION");
_Static_assert(NPU_OP_GATHER == 0 && NPU_OP_RMSNORM == 1 && NPU_OP_MATMUL == 2 &&
                   NPU_OP_ROPE == 3 && NPU_OP_KV_WRITE == 4 && NPU_OP_QK == 5 &&
                   NPU_OP_SOFTMAX == 6 && NPU_OP_PV == 7 && NPU_OP_ADD == 8 && NPU_OP_MUL == 9 &&
                   NPU_OP_SILU == 10 && NPU_OP_TRANSFER == 11 && NPU_OP_SHADOW == 12 &&
                   NPU_OP_ATTN == 13 && NPU_OP_LAST_ROW == 14 && NPU_OP_COUNT <= 32,
               "enum npu_op is stored in program files: bump NPU_PROGRAM_VERSION");
_Static_assert(NPU_ROLE_NONE == 0 && NPU_ROLE_EMBD == 1 && NPU_ROLE_ATTN_NORM == 2 &&
                   NPU_ROLE_FFN_NORM == 15 && NPU_ROLE_FFN_GATE_PAR == 19 &&
                   NPU_ROLE_LOGITS == 24 && NPU_ROLE_SHADOW_SUM == 28 && NPU_ROLE_COUNT == 29,
               "enum npu_tensor_role is stored in program files: bump NPU_PROGRAM_VERSION");
_Static_assert(NPU_QUANT_F32 == 0 && NPU_QUANT_NAIVE == 1 && NPU_QUANT_SHADOW == 2 &&
                   NPU_QUANT_SMOOTH == 3 && NPU_QUANT_MODE_COUNT == 16 && NPU_PREC_W8A8 == 0 &&
                   NPU_PREC_W8A16 == 1 && NPU_PREC_W4A16 == 2 && NPU_PREC_W4A16_BLOCK == 3 &&
                   NPU_PREC_W4A8 == 4 && NPU_OUTLIERS_NAIVE == 0 && NPU_OUTLIERS_SHADOW == 1 &&
                   NPU_OUTLIERS_SMOOTH == 2,
               "enum npu_quant_mode is stored in program files: bump NPU_PROGRAM_VERSION");
_Static_assert(sizeof(((struct npu_qsite *)0)->lut) == LUT_SIZE, "a site's LUT is 256 bytes");
_Static_assert(sizeof(((struct npu_qsite *)0)->lut16) == LUT16_SIZE * 2,
               "a site's wide LUT is 513 int16 values");

/* ---- Records: the i32 arrays of the metadata ---------------------------------------------------
 * Each list gives a record's fields in file order as X(NAME, member, kind[, group]): the member
 * of the struct it is stored from and loaded into, and how: U8 and I32 (its value), F32 (its
 * bits), LO and HI (the low and high 32 bits of a 64-bit member). A site's field belongs to a
 * group of the site's data (enum npu_site_group, or SITE_GROUP_OP: every site's) and is 0 in the
 * record of an op whose 'sites' in ir/ops.inc do not name that group. */

#define ALL_GROUPS UINT32_MAX
#define SITE_GROUP_OP (1u << 31)
_Static_assert(NPU_SITE_RMSNORM < SITE_GROUP_OP, "SITE_GROUP_OP is no enum npu_site_group bit");

/* The groups of the site record of 'op': its op, and its data's (ir/ops.inc). */
static inline uint32_t npu_site_record_groups(enum npu_op op) {
  return SITE_GROUP_OP | npu_op_info(op)->sites;
}

#define INFO_RECORD(X) X(ROWS, rows, I32) X(CTX, ctx, I32) X(N_TRANSFERS, n_transfers, I32)

#define TENSOR_RECORD(X)                                                                           \
  X(KIND, kind, U8)                                                                                \
  X(DTYPE, dtype, U8)                                                                              \
  X(BACKEND, backend, U8)                                                                          \
  X(KV_IS_VALUE, kv_is_value, U8)                                                                  \
  X(NE0, ne[0], I32)                                                                               \
  X(NE1, ne[1], I32)                                                                               \
  X(NE2, ne[2], I32)                                                                               \
  X(REF, ref, I32)                                                                                 \
  X(OFFSET_LO, offset, LO)                                                                         \
  X(OFFSET_HI, offset, HI)                                                                         \
  X(SCALE, q.scale, F32)                                                                           \
  X(ZERO_POINT, q.zero_point, I32)                                                                 \
  X(LAYER, layer, I32)                                                                             \
  X(ROLE, role, U8)

#define NODE_RECORD(X)                                                                             \
  X(OP, op, U8)                                                                                    \
  X(BACKEND, backend, U8)                                                                          \
  X(PINNED, pinned, U8)                                                                            \
  X(IN0, in[0], I32)                                                                               \
  X(IN1, in[1], I32)                                                                               \
  X(IN2, in[2], I32)                                                                               \
  X(OUT, out, I32)                                                                                 \
  X(LAYER, layer, I32)                                                                             \
  X(PARAM, param, F32)

#define SUBGRAPH_RECORD(X) X(FIRST, first, I32) X(COUNT, count, I32) X(BACKEND, backend, I32)

#define QTENSOR_RECORD(X)                                                                          \
  X(DTYPE, dtype, U8) X(SCALE, q.scale, F32) X(ZERO_POINT, q.zero_point, I32)

/* npulm.qsites (struct npu_qsite); a SILU site's table is in npulm.qsites.luts, LAST_ROW has
 * nothing but its op */
#define SITE_RECORD(X)                                                                             \
  X(OP, op, U8, SITE_GROUP_OP)                                                                     \
  X(N, n, I32, NPU_SITE_N)                                                                         \
  X(K, k, I32, NPU_SITE_TABLE)                                                                     \
  X(N_OUTLIERS, n_outliers, I32, NPU_SITE_OUTLIERS)                                                \
  X(OUTLIER_DIM, outlier_dim, I32, NPU_SITE_OUTLIERS)                                              \
  X(GEMM_X_ZP, gemm.x_zero_point, I32, NPU_SITE_GEMM)                                              \
  X(GEMM_Y_ZP, gemm.y_zero_point, I32, NPU_SITE_GEMM)                                              \
  X(GATHER_Y_ZP, gather.y_zero_point, I32, NPU_SITE_GATHER)                                        \
  X(ADD_A_ZP, add.a_zero_point, I32, NPU_SITE_ADD)                                                 \
  X(ADD_B_ZP, add.b_zero_point, I32, NPU_SITE_ADD)                                                 \
  X(ADD_LEFT_SHIFT, add.left_shift, I32, NPU_SITE_ADD)                                             \
  X(ADD_A_MULT, add.a_mult, I32, NPU_SITE_ADD)                                                     \
  X(ADD_A_SHIFT, add.a_shift, I32, NPU_SITE_ADD)                                                   \
  X(ADD_B_MULT, add.b_mult, I32, NPU_SITE_ADD)                                                     \
  X(ADD_B_SHIFT, add.b_shift, I32, NPU_SITE_ADD)                                                   \
  X(ADD_Y_MULT, add.y_mult, I32, NPU_SITE_ADD)                                                     \
  X(ADD_Y_SHIFT, add.y_shift, I32, NPU_SITE_ADD)                                                   \
  X(ADD_Y_ZP, add.y_zero_point, I32, NPU_SITE_ADD)                                                 \
  X(MUL_A_ZP, mul.a_zero_point, I32, NPU_SITE_MUL)                                                 \
  X(MUL_B_ZP, mul.b_zero_point, I32, NPU_SITE_MUL)                                                 \
  X(MUL_Y_MULT, mul.y_mult, I32, NPU_SITE_MUL)                                                     \
  X(MUL_Y_SHIFT, mul.y_shift, I32, NPU_SITE_MUL)                                                   \
  X(MUL_Y_ZP, mul.y_zero_point, I32, NPU_SITE_MUL)                                                 \
  X(QK_Q_ZP, qk.q_zero_point, I32, NPU_SITE_QK)                                                    \
  X(QK_K_ZP, qk.k_zero_point, I32, NPU_SITE_QK)                                                    \
  X(QK_MULT, qk.mult, I32, NPU_SITE_QK)                                                            \
  X(QK_SHIFT, qk.shift, I32, NPU_SITE_QK)                                                          \
  X(QK_S_ZP, qk.s_zero_point, I32, NPU_SITE_QK)                                                    \
  X(SOFTMAX_MULT, softmax.mult, I32, NPU_SITE_SOFTMAX)                                             \
  X(SOFTMAX_SHIFT, softmax.shift, I32, NPU_SITE_SOFTMAX)                                           \
  X(PV_V_ZP, pv.v_zero_point, I32, NPU_SITE_PV)                                                    \
  X(PV_MULT, pv.mult, I32, NPU_SITE_PV)                                                            \
  X(PV_SHIFT, pv.shift, I32, NPU_SITE_PV)                                                          \
  X(PV_Y_ZP, pv.y_zero_point, I32, NPU_SITE_PV)                                                    \
  X(RMSNORM_EPS_LO, rmsnorm.eps, LO, NPU_SITE_RMSNORM)                                             \
  X(RMSNORM_EPS_HI, rmsnorm.eps, HI, NPU_SITE_RMSNORM)                                             \
  X(RMSNORM_SHIFT, rmsnorm.shift, I32, NPU_SITE_RMSNORM)                                           \
  X(RMSNORM_Y_ZP, rmsnorm.y_zero_point, I32, NPU_SITE_RMSNORM)                                     \
  X(W_BITS, w_bits, U8, NPU_SITE_GEMM)                                                             \
  X(W_BLOCK, w_block, U8, NPU_SITE_GEMM)                                                           \
  X(GEMM_ACC_SHIFT, gemm16.acc_shift, I32, NPU_SITE_GEMM)                                          \
  X(LUT_WIDE, lut_wide, U8, NPU_SITE_LUT)

/* How a field is stored, and the size of the member it comes from. */
enum npu_field_kind { FIELD_U8, FIELD_I32, FIELD_F32, FIELD_LO, FIELD_HI };
#define FIELD_SIZE_U8 1
#define FIELD_SIZE_I32 4
#define FIELD_SIZE_F32 4
#define FIELD_SIZE_LO 8
#define FIELD_SIZE_HI 8

struct npu_record_field {
  uint32_t offset; /* of the member in its struct */
  uint8_t kind;    /* enum npu_field_kind */
  uint32_t group;  /* a site field's group (see above); ALL_GROUPS for the other records */
};

/* The field indices (TENSOR_KIND, ...), the count (TENSOR_FIELDS, ...), a check of each member's
 * size and the table of each record. */
#define FIELD_INDEX(prefix, NAME) prefix##_##NAME,
#define FIELD_ENTRY(type, member, kind, group) {offsetof(type, member), FIELD_##kind, group},
#define FIELD_CHECK(type, member, kind)                                                            \
  _Static_assert(sizeof(((type *)0)->member) == FIELD_SIZE_##kind, #type "." #member);

#define INFO_INDEX(N, m, k) FIELD_INDEX(INFO, N)
#define INFO_ENTRY(N, m, k) FIELD_ENTRY(struct npu_graph, m, k, ALL_GROUPS)
#define INFO_CHECK(N, m, k) FIELD_CHECK(struct npu_graph, m, k)
#define TENSOR_INDEX(N, m, k) FIELD_INDEX(TENSOR, N)
#define TENSOR_ENTRY(N, m, k) FIELD_ENTRY(struct npu_ir_tensor, m, k, ALL_GROUPS)
#define TENSOR_CHECK(N, m, k) FIELD_CHECK(struct npu_ir_tensor, m, k)
#define NODE_INDEX(N, m, k) FIELD_INDEX(NODE, N)
#define NODE_ENTRY(N, m, k) FIELD_ENTRY(struct npu_ir_node, m, k, ALL_GROUPS)
#define NODE_CHECK(N, m, k) FIELD_CHECK(struct npu_ir_node, m, k)
#define SUBGRAPH_INDEX(N, m, k) FIELD_INDEX(SUBGRAPH, N)
#define SUBGRAPH_ENTRY(N, m, k) FIELD_ENTRY(struct npu_subgraph, m, k, ALL_GROUPS)
#define SUBGRAPH_CHECK(N, m, k) FIELD_CHECK(struct npu_subgraph, m, k)
#define QTENSOR_INDEX(N, m, k) FIELD_INDEX(QTENSOR, N)
#define QTENSOR_ENTRY(N, m, k) FIELD_ENTRY(struct npu_qtensor, m, k, ALL_GROUPS)
#define QTENSOR_CHECK(N, m, k) FIELD_CHECK(struct npu_qtensor, m, k)
#define SITE_INDEX(N, m, k, o) FIELD_INDEX(SITE, N)
#define SITE_ENTRY(N, m, k, o) FIELD_ENTRY(struct npu_qsite, m, k, o)
#define SITE_CHECK(N, m, k, o) FIELD_CHECK(struct npu_qsite, m, k)

enum { INFO_RECORD(INFO_INDEX) INFO_FIELDS };
enum { TENSOR_RECORD(TENSOR_INDEX) TENSOR_FIELDS };
enum { NODE_RECORD(NODE_INDEX) NODE_FIELDS };
enum { SUBGRAPH_RECORD(SUBGRAPH_INDEX) SUBGRAPH_FIELDS };
enum { QTENSOR_RECORD(QTENSOR_INDEX) QTENSOR_FIELDS };
enum { SITE_RECORD(SITE_INDEX) SITE_FIELDS };

INFO_RECORD(INFO_CHECK)
TENSOR_RECORD(TENSOR_CHECK)
NODE_RECORD(NODE_CHECK)
SUBGRAPH_RECORD(SUBGRAPH_CHECK)
QTENSOR_RECORD(QTENSOR_CHECK)
SITE_RECORD(SITE_CHECK)
_Static_assert(NODE_IN0 + NPU_IR_MAX_IN == NODE_OUT, "a node record holds every input");
_Static_assert(SITE_FIELDS == 42, "the site record's fields are stored: bump NPU_PROGRAM_VERSION");

static const struct npu_record_field INFO_TABLE[] = {INFO_RECORD(INFO_ENTRY)};
static const struct npu_record_field TENSOR_TABLE[] = {TENSOR_RECORD(TENSOR_ENTRY)};
static const struct npu_record_field NODE_TABLE[] = {NODE_RECORD(NODE_ENTRY)};
static const struct npu_record_field SUBGRAPH_TABLE[] = {SUBGRAPH_RECORD(SUBGRAPH_ENTRY)};
static const struct npu_record_field QTENSOR_TABLE[] = {QTENSOR_RECORD(QTENSOR_ENTRY)};
static const struct npu_record_field SITE_TABLE[] = {SITE_RECORD(SITE_ENTRY)};

/* The record 'rec' ('n' fields) of the struct at 'obj': the fields of 'groups' (a site's
 * npu_site_record_groups, or ALL_GROUPS), the others 0. */
static inline void npu_record_store(const struct npu_record_field *fields, int n, const void *obj,
                                    uint32_t groups, int32_t *rec) {
  for (int i = 0; i < n; i++) {
    const uint8_t *p = (const uint8_t *)obj + fields[i].offset;
    uint64_t w;
    int32_t v = 0;
    if (!(fields[i].group & groups)) {
      /* another op's field */
    } else if (fields[i].kind == FIELD_U8) {
      v = *p;
    } else if (fields[i].kind == FIELD_LO || fields[i].kind == FIELD_HI) {
      memcpy(&w, p, sizeof(w));
      v = (int32_t)(uint32_t)(fields[i].kind == FIELD_LO ? w : w >> 32);
    } else {
      memcpy(&v, p, sizeof(v)); /* I32, or the bits of an F32 */
    }
    rec[i] = v;
  }
}

/* The fields of 'groups' (a site's npu_site_record_groups, or ALL_GROUPS) of the record 'rec'
 * into the struct at 'obj'; the others are left as they are. The caller range-checks the values
 * first. */
static inline void npu_record_load(const struct npu_record_field *fields, int n, const int32_t *rec,
                                   uint32_t groups, void *obj) {
  for (int i = 0; i < n; i++) {
    uint8_t *p = (uint8_t *)obj + fields[i].offset;
    uint64_t w, v = (uint32_t)rec[i];
    if (!(fields[i].group & groups)) continue;
    if (fields[i].kind == FIELD_U8) {
      *p = (uint8_t)rec[i];
    } else if (fields[i].kind == FIELD_LO || fields[i].kind == FIELD_HI) {
      memcpy(&w, p, sizeof(w));
      w = fields[i].kind == FIELD_LO ? (w & ~(uint64_t)UINT32_MAX) | v : (w & UINT32_MAX) | v << 32;
      memcpy(p, &w, sizeof(w));
    } else {
      memcpy(p, &rec[i], sizeof(rec[i]));
    }
  }
}

/* ---- Shared by the verifier and the loader -------------------------------------------------- */

/* Re-prefix an error: "<prefix>: <message>". */
npulm_status npu_program_fail_prefixed(npulm_error *err, npulm_status st, const char *prefix,
                                       const npulm_error *inner);

/* The graphs npu_compile makes for options 'o', in its order: their rows, contexts and logit
 * rows (the arrays may be NULL; else they hold (1 + NPU_MAX_CHUNKS) * NPU_MAX_BUCKETS). Return
 * their count. 'for_generation': each chunk also has graphs whose logits are the last row's only
 * (files written before those existed have not). */
int32_t npu_program_graph_shapes(const struct npu_compile_options *o, bool for_generation,
                                 int32_t *rows_out, int32_t *ctx_out, int32_t *logit_rows_out);

/* The name a graph tensor's record implies, into 'name': a WEIGHT's is its weight's (of the
 * table 'weights', 'n_weights' long), a tensor with a role is "blk.L.<role's name>" in layer L or
 * the role's name outside the blocks (as the graph builder names its activations). Return false
 * when the record implies none (or none that fits). The file stores an empty name for a tensor
 * whose name is the implied one. */
bool npu_program_tensor_name(const struct npu_weight *weights, int32_t n_weights,
                             const struct npu_ir_tensor *t, char name[NPU_IR_NAME_MAX]);

/* A tensor of the file: its name, ggml type, data and GGUF shape (the save's list). */
struct file_tensor {
  const char *name;
  char buf[48]; /* the name of a site's or sparse layer's array */
  uint32_t type;
  const void *data;
  uint32_t n_dims;
  uint64_t ne[2];
  uint64_t bytes;
};

/* An integer array of the file: its name's last part, ggml type, data, shape ([ne0], ne1 = 0, or
 * [ne0, ne1]) and element size. */
struct file_array {
  const char *field;
  uint32_t type;
  const void *data;
  uint64_t ne0, ne1, size;
};

/* Tensor 't' of array 'a', named "<prefix>.<index>.<field>" ("npulm.qsite.3.mult"). */
static inline void npu_file_tensor_of(struct file_tensor *t, const char *prefix, int32_t index,
                                      const struct file_array *a) {
  snprintf(t->buf, sizeof(t->buf), "%s.%d.%s", prefix, index, a->field);
  t->name = t->buf;
  t->type = a->type;
  t->data = a->data;
  t->n_dims = a->ne1 ? 2 : 1;
  t->ne[0] = a->ne0;
  t->ne[1] = a->ne1 ? a->ne1 : 1;
  t->bytes = t->ne[0] * t->ne[1] * a->size;
}

/* ---- Sparse decode data (program_sparse.c) ----------------------------------------------------
 */

#define SPARSE_ARRAYS 7 /* tensors per layer */

/* Append the sparse layers' tensors of 'p' (SPARSE_ARRAYS per layer; none without sparse data)
 * to 'ft' from 'n'; return the new count. */
int32_t npu_program_sparse_tensors(const struct npu_program *p, struct file_tensor *ft, int32_t n);
/* Its metadata keys. */
struct npu_gguf_writer;
npulm_status npu_program_add_sparse(struct npu_gguf_writer *w, const struct npu_program *p,
                                    npulm_error *err);
/* Read the sparse decode data of file 'g' into 'p' (nothing if it has none), checking every
 * size and range; the bundles and predictor weights are used in place, or with 'place' moved
 * into huge pages (npu_sparse_place). */
npulm_status npu_program_load_sparse(const struct npu_gguf *g, const struct npu_config *cfg,
                                     bool place, struct npu_program *p, npulm_error *err);

/* Fail naming site 'i': "program site I ('name'): <what>". */
npulm_status NPU_PRINTF(4, 5) npu_program_site_fail(npulm_error *err, const struct npu_program *p,
                                                    int32_t i, const char *fmt, ...);

/* The checks of npu_program_verify on the integer data (program_verify_sites.c): the sites and
 * the quantization table ('after_site' as npu_program_verify_each_site), the sparse data. */
npulm_status npu_program_verify_quant(const struct npu_program *p, npu_site_checked_fn after_site,
                                      void *user, npulm_error *err);
npulm_status npu_program_verify_sparse(const struct npu_program *p, npulm_error *err);

/* Ranges both halves of the verification check. */
static inline bool npu_verify_is_int(uint8_t dt) { return dt == NPU_DT_I8 || dt == NPU_DT_I16; }

/* A zero point the type 'dt' (I8 or I16) can hold. */
static inline bool npu_verify_zp_fits(uint8_t dt, int32_t zp) {
  return dt == NPU_DT_I8 ? zp >= INT8_MIN && zp <= INT8_MAX
                         : dt == NPU_DT_I16 && zp >= INT16_MIN && zp <= INT16_MAX;
}

/* A multiplier/shift pair in the range of npu_requantize (fixedpoint.h). */
static inline bool npu_verify_requant_ok(int32_t mult, int32_t shift) {
  return mult >= 0 && shift >= -31 && shift <= 30;
}

/* An input multiplier of the integer add: at most 0.5 (npu_ukernels.h). */
static inline bool npu_verify_add_input_ok(int32_t mult, int32_t shift) {
  return npu_verify_requant_ok(mult, shift) && (shift <= -1 || (shift == 0 && mult <= (1 << 30)));
}

#endif /* NPU_PROGRAM_PROGRAM_FILE_H */
