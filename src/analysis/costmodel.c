/* The NPU cost model: public NPU profiles, the memory traffic of a decode step, and a predicted
 * time for a run of a compiled program on each profile. Every node costs
 * max(MACs / peak rate, DRAM bytes / bandwidth) on its backend (NPU nodes on the profile, CPU
 * nodes at the host's measured rates); each NPU subgraph launch adds the profile's dispatch
 * overhead and each tensor crossing between the backends a trip through DRAM. A run is cut into
 * steps exactly as a session cuts it (npu_exec_plan_steps). Floats are fine here: this is the
 * host-side model, not the NPU. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "backends/exec.h"
#include "base/common.h"
#include "kernels/cpu/kernels.h"
#include "model/model.h"
#include "npulm_bench.h"
#include "program/program.h"

/* Sources (public figures; what is not published is marked "estimate"):
 * - Hexagon V75 / Snapdragon 8 Gen 3: ~45 int8 TOPS is the figure the trade press and Qualcomm AI
 *   Hub material give for the 8 Gen 3 NPU (Qualcomm's brief states "98% faster" than 8 Gen 2, not
 *   TOPS: so 45 is a third-party figure). Memory: the product brief lists LPDDR5X at up to
 *   4800 MHz; on the phones' 64-bit bus that is 9600 MT/s x 8 B = 76.8 GB/s. FP16 at half the int8
 *   rate, 8 MiB of VTCM and ~100 us per graph execute (FastRPC round trip) are estimates.
 * - Apple M4 Neural Engine: Apple's M4 announcement (May 2024): 16-core Neural Engine, "38 trillion
 *   operations per second", unified memory at 120 GB/s. The precision behind 38 TOPS is not stated
 *   (the M3's 18 TOPS was FP16; 38 is read as int8 here, an estimate); FP16 ~19 TFLOPS, on-chip
 *   memory (unpublished) and ~100 us per Core ML prediction are estimates.
 * - Intel Meteor Lake NPU (NPU 3720, Core Ultra 1st gen): Intel markets up to ~11 TOPS; Chips and
 *   Cheese ("Intel Meteor Lake's NPU", 2024-04-22) counts 4096 int8 MACs per cycle in two Neural
 *   Compute Engines, 9.5 TOPS at the 155H's 1.16 GHz. Memory: dual-channel DDR5-5600, 89.6 GB/s
 *   (LPDDR5X-7467 parts reach ~120 GB/s). FP16 at half rate, the scratchpad size (TechPowerUp's
 *   Meteor Lake deep dive calls it "a tiny scratchpad RAM") and ~200 us per inference request are
 *   estimates.
 * The other precisions (w8a16: int16 activations x int8 weights; w4a8, w4a16: int4 weights). No
 * vendor publishes a TOPS figure for any of them on these parts, so every such rate is an
 * estimate; what is published is which precisions each part runs and how:
 * - Hexagon: Qualcomm's Snapdragon 8 Gen 2 launch (Nov 2022; e.g. Liliputing 2022-11-15,
 *   TechInsights "Hexagon Adds INT4 Support") added INT4 to the Hexagon NPU, claiming "60%"
 *   better performance per watt for sustained AI inference, not a rate. Qualcomm AI Hub ships its
 *   LLMs for the HTP in w4a16 and w8a16 (qualcomm/ai-hub-models issue #269), and ExecuTorch's QNN
 *   backend runs Llama 3.2 on the HTP with 16-bit activations and 8-bit weights ("16a8w",
 *   pytorch/executorch issue #6684): the HTP runs 16 x 8 and 16 x 4 programs. Estimates: 16-bit
 *   activations x 8-bit weights at half the 8 x 8 rate (as if a 16-bit operand took two 8-bit
 *   lanes of the MAC array); int4 weights at the rate of their activations' width (as if unpacked
 *   to 8 bits before the MACs: the bytes halve, the MAC rate does not double).
 * - Apple Neural Engine: Core ML runs int8 x int8 on the Neural Engine only from A17 Pro / M4
 *   (coremltools "What's New": "activation quantization (W8A8 mode), accelerated on NE for A17
 *   pro/M4 chips"; 4-bit weights with per-block scales from iOS 18), and weight-only quantized
 *   weights are decompressed: "All computation at runtime uses float precision"
 *   (coremltools.optimize.coreml.linear_quantize_weights). Core ML documents no int16 activations,
 *   so w8a16 and w4a16 programs are costed at the fp16 rate (an estimate itself); w4a8 at the int8
 *   rate (int4 weights expanded to int8: an estimate, Apple documents no int4 x int8 mode).
 * - Intel NPU: OpenVINO's weight compression keeps "activations as floating-point numbers" with
 *   int4 / int8 weights (OpenVINO "LLM Weight Compression"), and OpenVINO GenAI on the NPU wants
 *   symmetric int4 weights ("symmetrically-quantized 4-bit (INT4) models are preferred for
 *   inference on NPU"): int4 weights run as fp16 compute. So w8a16 and w4a16 at the fp16 rate and
 *   w4a8 at the int8 rate (estimates). */
static const npulm_npu_profile profiles[] = {
    {.name = "hexagon-v75",
     .part = "Qualcomm Hexagon V75 NPU (Snapdragon 8 Gen 3)",
     .int8_tops = 45.0,
     .w8a16_tops = 22.5,
     .w4a8_tops = 45.0,
     .w4a16_tops = 22.5,
     .fp16_tflops = 22.5,
     .dram_gbs = 76.8,
     .sram_mib = 8.0,
     .dispatch_us = 100.0,
     .estimates = "int8 TOPS (third-party), w8a16/w4a8/w4a16 TOPS, fp16 TFLOPS, SRAM, dispatch"},
    {.name = "m4-ane",
     .part = "Apple M4 Neural Engine",
     .int8_tops = 38.0,
     .w8a16_tops = 19.0,
     .w4a8_tops = 38.0,
     .w4a16_tops = 19.0,
     .fp16_tflops = 19.0,
     .dram_gbs = 120.0,
     .sram_mib = 8.0,
     .dispatch_us = 100.0,
     .estimates = "precision of the 38 TOPS, w8a16/w4a8/w4a16 TOPS (fp16 and int8 rates), "
                  "fp16 TFLOPS, SRAM, dispatch"},
    {.name = "mtl-npu",
     .part = "Intel Meteor Lake NPU 3720 (Core Ultra)",
     .int8_tops = 11.0,
     .w8a16_tops = 5.5,
     .w4a8_tops = 11.0,
     .w4a16_tops = 5.5,
     .fp16_tflops = 5.5,
     .dram_gbs = 89.6,
     .sram_mib = 4.0,
     .dispatch_us = 200.0,
     .estimates = "w8a16/w4a8/w4a16 TOPS (fp16 and int8 rates), fp16 TFLOPS, SRAM, dispatch"},
};

const npulm_npu_profile *npulm_npu_profiles(int *n_out) {
  *n_out = (int)(sizeof(profiles) / sizeof(profiles[0]));
  return profiles;
}

/* MAC/s of a matmul with 'w_bits' weights (8 or 4; in k blocks if 'w_block' is not 0) and int16
 * inputs if 'a16' (else int8), on 'p' (NULL: on the host 'h'). */
static double matmul_rate(const npulm_npu_profile *p, const npulm_roofline *h, int w_bits,
                          int w_block, bool a16) {
  if (p != NULL) {
    const double tops =
        w_bits == 4 ? (a16 ? p->w4a16_tops : p->w4a8_tops) : (a16 ? p->w8a16_tops : p->int8_tops);
    return tops * 0.5e12; /* 1 MAC = 2 operations */
  }
  if (w_bits == 4) return a16 ? (w_block != 0 ? h->w4a16_block_macs : h->w4a16_macs) : h->w4a8_macs;
  return a16 ? h->w8a16_macs : h->int8_macs;
}

/* The rate of the matmuls of a program in mode 'quant' (see npulm_roofline_peak), or 0. */
static double quant_peak(const npulm_npu_profile *p, const npulm_roofline *h, const char *quant) {
  const int mode = quant != NULL ? npu_quant_mode_parse(quant) : -1;
  if (mode < 0) return 0.0;
  if (mode == NPU_QUANT_F32) return p != NULL ? p->fp16_tflops * 0.5e12 : h->f32_macs;
  return matmul_rate(p, h, npu_quant_weight_bits((enum npu_quant_mode)mode),
                     npu_quant_weight_block((enum npu_quant_mode)mode),
                     npu_quant_act_bits((enum npu_quant_mode)mode) == 16);
}

double npulm_npu_profile_peak(const npulm_npu_profile *profile, const char *quant) {
  return quant_peak(profile, NULL, quant);
}

double npulm_roofline_peak(const npulm_roofline *host, const char *quant) {
  return quant_peak(NULL, host, quant);
}

/* What one node of one step moves and computes. */
struct node_cost {
  double macs;         /* multiply-accumulates; element-wise ops: one per output element */
  bool arithmetic;     /* a matmul, attention or shadow product: its MACs are the run's MACs */
  double weight_bytes; /* weights read */
  double kv_bytes;     /* KV cache rows read and written */
  double act_bytes;    /* activations read and written (DRAM traffic only if they spill) */
  double io_bytes;     /* token ids and logits: always in DRAM */
  bool transfer;       /* a TRANSFER node: act_bytes cross between the backends */
  /* an integer NPU matmul's precision (w_bits 0 for every other node): its rate */
  int w_bits, w_block;
  bool a16; /* int16 input */
};

/* Rates one run is costed at. */
struct target {
  double npu_macs;         /* NPU MAC/s of every node but an integer matmul (int8, or fp16 for
                              an FP32 program) */
  double npu_mm[2][2][2];  /* NPU MAC/s of an integer matmul: [int4][in blocks][int16 input] */
  double npu_bytes;        /* NPU DRAM bytes/s */
  double npu_sram;         /* bytes of on-chip memory for the NPU's activations */
  double npu_weight_scale; /* bytes per weight element of an FP32 program's NPU matmul, / 4 */
  double dispatch_s;       /* per NPU subgraph */
  bool transfers_cost;     /* crossing between the backends goes through DRAM */
  double cpu_macs, cpu_bytes, cpu_cache; /* the host */
};

static double tensor_bytes(const struct npu_ir_tensor *t) { return (double)npu_ir_tensor_bytes(t); }

/* The integer data of node 'i' of 'g', or NULL (an FP32 program, or a CPU node). */
static const struct npu_qsite *node_site(const struct npu_program *p, const struct npu_graph *g,
                                         int32_t i) {
  if (g->node_site == NULL) return NULL;
  int32_t s = g->node_site[i];
  return s >= 0 && s < p->n_qsites ? &p->qsites[s] : NULL;
}

/* Weight bytes of a matmul node [N, K] on its backend: the site's packed weights with bias and
 * per-channel multipliers, or FP32 weights (and bias) scaled by 'f32_scale' on the NPU. */
static double matmul_weight_bytes(const struct npu_graph *g, const struct npu_ir_node *n,
                                  const struct npu_qsite *site, double f32_scale) {
  if (site != NULL && n->backend == NPU_BE_NPU) {
    return (double)site->packed_size + 8.0 * (double)site->n;
  }
  double b = tensor_bytes(&g->tensors[n->in[1]]);
  if (n->in[2] >= 0) b += tensor_bytes(&g->tensors[n->in[2]]);
  return n->backend == NPU_BE_NPU ? b * f32_scale : b;
}

/* Sum over the step's rows of npu_attn_len: the cache positions each row attends to. */
static double attn_positions(int32_t rows, int32_t pos0, int32_t n_valid) {
  double sum = 0.0;
  for (int32_t t = 0; t < rows; t++) sum += (double)npu_attn_len(pos0, n_valid, t);
  return sum;
}

/* The cost of node 'i' of graph 'g' for a step at 'pos0' with 'n_valid' real rows. 'f32_scale'
 * scales an FP32 program's NPU weights (1: FP32; 0.5: stored as FP16 on a real NPU). */
static void node_cost(const struct npu_program *p, const struct npu_config *c,
                      const struct npu_graph *g, int32_t i, int32_t pos0, int32_t n_valid,
                      double f32_scale, struct node_cost *nc) {
  memset(nc, 0, sizeof(*nc));
  const struct npu_ir_node *n = &g->nodes[i];
  const struct npu_ir_tensor *y = &g->tensors[n->out];
  const struct npu_qsite *site = node_site(p, g, i);
  const double kv_row = (double)c->n_kv_heads * (double)c->head_dim * sizeof(float);
  /* activations in and out; ids and logits are I/O */
  for (int j = 0; j < NPU_IR_MAX_IN; j++) {
    if (n->in[j] < 0) continue;
    const struct npu_ir_tensor *t = &g->tensors[n->in[j]];
    if (t->kind == NPU_TK_ACT) nc->act_bytes += tensor_bytes(t);
    if (t->kind == NPU_TK_INPUT_IDS) nc->io_bytes += tensor_bytes(t);
  }
  if (y->kind == NPU_TK_ACT) nc->act_bytes += tensor_bytes(y);
  if (y->kind == NPU_TK_LOGITS) nc->io_bytes += tensor_bytes(y);
  const double out_elems = (double)y->ne[0] * (double)y->ne[1] * (double)y->ne[2];
  const enum npu_op_cost cost = npu_op_info((enum npu_op)n->op)->cost;
  nc->arithmetic = cost == NPU_COST_ARITHMETIC;
  switch ((enum npu_op)n->op) {
  case NPU_OP_MATMUL: {
    const struct npu_ir_tensor *x = &g->tensors[n->in[0]];
    nc->macs = (double)x->ne[0] * (double)y->ne[1] * (double)x->ne[1];
    nc->weight_bytes = matmul_weight_bytes(g, n, site, f32_scale);
    if (site != NULL && n->backend == NPU_BE_NPU) {
      nc->w_bits = site->w_bits;
      nc->w_block = site->w_block;
      nc->a16 = x->dtype == NPU_DT_I16;
    }
    break;
  }
  case NPU_OP_GATHER: {
    /* only the rows of the step's tokens are read */
    const double rows = (double)y->ne[0], cols = (double)y->ne[1];
    if (site != NULL) nc->weight_bytes = rows * (cols + 8.0);
    else
      nc->weight_bytes = rows * cols * sizeof(float) * (n->backend == NPU_BE_NPU ? f32_scale : 1);
    nc->macs = out_elems;
    break;
  }
  case NPU_OP_RMSNORM:
    nc->weight_bytes = tensor_bytes(&g->tensors[n->in[1]]);
    nc->macs = 2.0 * out_elems;
    break;
  case NPU_OP_QK:
  case NPU_OP_PV: {
    /* q [rows, heads * hd] . K rows -> [heads, rows, ctx]; probs . V rows -> [rows, heads * hd] */
    const int32_t heads = n->op == NPU_OP_QK ? y->ne[0] : g->tensors[n->in[0]].ne[0];
    const double hd = (double)c->head_dim;
    nc->macs = (double)heads * attn_positions(g->rows, pos0, n_valid) * hd;
    nc->kv_bytes = (double)(pos0 + n_valid) * kv_row;
    break;
  }
  case NPU_OP_ATTN: {
    /* QK and PV fused (the softmax between them is not counted as arithmetic), reading both
     * caches */
    nc->macs =
        2.0 * (double)c->n_heads * attn_positions(g->rows, pos0, n_valid) * (double)c->head_dim;
    nc->kv_bytes = 2.0 * (double)(pos0 + n_valid) * kv_row;
    break;
  }
  case NPU_OP_KV_WRITE: nc->kv_bytes = (double)n_valid * kv_row; break;
  case NPU_OP_SOFTMAX: nc->macs = (double)y->ne[0] * attn_positions(g->rows, pos0, n_valid); break;
  case NPU_OP_SHADOW:
    if (site != NULL) {
      const double rows = (double)g->tensors[n->in[0]].ne[0], no = (double)site->n_outliers;
      nc->macs = rows * (double)site->n * no;
      nc->weight_bytes = (double)site->n * no * sizeof(float);
      if (site->outlier_gate != NULL) {
        nc->macs += 2.0 * rows * no * (double)site->outlier_dim;
        nc->weight_bytes += 2.0 * no * (double)site->outlier_dim * sizeof(float);
      }
    }
    break;
  case NPU_OP_TRANSFER:
    nc->transfer = true;
    nc->macs = out_elems;
    break;
  default: /* one operation per output element (ir/ops.inc) */
    assert(cost == NPU_COST_ELEMENTWISE);
    nc->macs = out_elems;
    break;
  }
}

/* Time of one node: max(compute, memory) on its backend; a transfer's DRAM trip is apart. */
static double node_time(const struct target *tg, const struct npu_graph *g,
                        const struct npu_ir_node *n, const struct node_cost *nc,
                        double *transfer_s) {
  if (nc->transfer && tg->transfers_cost) {
    /* written by one side, read by the other, through DRAM */
    *transfer_s += nc->act_bytes / tg->npu_bytes;
    return 0.0;
  }
  const bool npu = n->backend == NPU_BE_NPU;
  const double sram = npu ? tg->npu_sram : tg->cpu_cache;
  const bool spills = (double)g->arena_size[n->backend] > sram;
  const double bytes =
      nc->weight_bytes + nc->kv_bytes + nc->io_bytes + (spills ? nc->act_bytes : 0.0);
  const double rate = !npu              ? tg->cpu_macs
                      : nc->w_bits != 0 ? tg->npu_mm[nc->w_bits == 4][nc->w_block != 0][nc->a16]
                                        : tg->npu_macs;
  const double compute = nc->macs / rate;
  const double memory = bytes / (npu ? tg->npu_bytes : tg->cpu_bytes);
  return compute > memory ? compute : memory;
}

/* The DRAM bytes node 'n' moves under 'tg' (for the run's totals). */
static double node_dram_bytes(const struct target *tg, const struct npu_graph *g,
                              const struct npu_ir_node *n, const struct node_cost *nc) {
  const double sram = n->backend == NPU_BE_NPU ? tg->npu_sram : tg->cpu_cache;
  const bool spills =
      (double)g->arena_size[n->backend] > sram || (nc->transfer && tg->transfers_cost);
  return nc->weight_bytes + nc->kv_bytes + nc->io_bytes + (spills ? nc->act_bytes : 0.0);
}

static npulm_status need_program(const npulm_model *model, npulm_error *err) {
  if (model->program == NULL) {
    return npu_fail(err, NPULM_ERR_ARG,
                    "the model has no program: compile it first (npulm_model_compile)");
  }
  return NPULM_OK;
}

npulm_status npulm_decode_traffic_at(const npulm_model *model, int pos, npulm_decode_traffic *out,
                                     npulm_error *err) {
  memset(out, 0, sizeof(*out));
  npulm_status st = need_program(model, err);
  if (st != NPULM_OK) return st;
  const struct npu_program *p = model->program;
  out->quant = npu_quant_mode_name((enum npu_quant_mode)p->quant_mode);
  const struct npu_graph *g = pos >= 0 ? npu_program_find(p, 1, pos + 1, true) : NULL;
  if (g == NULL) {
    return npu_fail(err, NPULM_ERR_ARG, "position %d is outside the program's contexts", pos);
  }
  bool *seen_w = calloc((size_t)p->n_weights + 1, sizeof(bool));
  bool *seen_s = calloc((size_t)p->n_qsites + 1, sizeof(bool));
  if (seen_w == NULL || seen_s == NULL) {
    free(seen_w);
    free(seen_s);
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  }
  double npu_w = 0, cpu_w = 0, kv = 0, macs = 0, model_bytes = 0;
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const struct npu_ir_node *n = &g->nodes[i];
    struct node_cost nc;
    node_cost(p, &model->cfg, g, i, pos, 1, 1.0, &nc);
    if (n->backend == NPU_BE_NPU) npu_w += nc.weight_bytes;
    else cpu_w += nc.weight_bytes;
    kv += nc.kv_bytes;
    if (nc.arithmetic) macs += nc.macs;
    /* everything the graph holds: integer sites once (a gather that reads a tied classifier's
     * weights holds nothing of its own), FP32 weights once (a tied output shares the
     * embedding), whole tables */
    const struct npu_qsite *site = node_site(p, g, i);
    if (site != NULL && n->backend == NPU_BE_NPU) {
      const int32_t s = g->node_site[i];
      if (!seen_s[s] && site->table_site < 0 &&
          (n->op == NPU_OP_MATMUL || n->op == NPU_OP_GATHER)) {
        model_bytes += n->op == NPU_OP_MATMUL ? (double)site->packed_size + 8.0 * site->n
                                              : (double)site->n * ((double)site->k + 8.0);
      }
      seen_s[s] = true;
    } else {
      for (int j = 0; j < NPU_IR_MAX_IN; j++) {
        if (n->in[j] < 0) continue;
        const struct npu_ir_tensor *t = &g->tensors[n->in[j]];
        if (t->kind != NPU_TK_WEIGHT || t->ref < 0 || t->ref >= p->n_weights) continue;
        bool dup = seen_w[t->ref];
        for (int32_t r = 0; r < t->ref && !dup; r++) {
          dup = seen_w[r] && p->weights[r].data == p->weights[t->ref].data;
        }
        if (!dup) model_bytes += (double)p->weights[t->ref].ne0 * p->weights[t->ref].ne1 * 4.0;
        seen_w[t->ref] = true;
      }
      if (site != NULL && n->op == NPU_OP_SHADOW) model_bytes += nc.weight_bytes;
    }
  }
  free(seen_w);
  free(seen_s);
  out->weight_bytes_npu = (uint64_t)npu_w;
  out->weight_bytes_cpu = (uint64_t)cpu_w;
  out->kv_bytes = (uint64_t)kv;
  out->bytes = out->weight_bytes_npu + out->weight_bytes_cpu + out->kv_bytes;
  out->macs = (uint64_t)macs;
  out->model_bytes = (uint64_t)model_bytes;
  return NPULM_OK;
}

/* Add the cost of one step ('g' at 'pos0', 'n_valid' rows) to 'pr'. */
static void predict_step(const struct npu_program *p, const struct npu_config *c,
                         const struct target *tg, double f32_scale, const struct npu_graph *g,
                         int32_t pos0, int32_t n_valid, npulm_prediction *pr, double *macs,
                         double *bytes) {
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const struct npu_ir_node *n = &g->nodes[i];
    struct node_cost nc;
    node_cost(p, c, g, i, pos0, n_valid, f32_scale, &nc);
    const double t = node_time(tg, g, n, &nc, &pr->transfer_s);
    if (n->backend == NPU_BE_NPU) pr->npu_s += t;
    else pr->cpu_s += t;
    if (nc.arithmetic) *macs += nc.macs;
    *bytes += node_dram_bytes(tg, g, n, &nc);
  }
  for (int32_t s = 0; s < g->n_subgraphs; s++) {
    if (g->subgraphs[s].backend == NPU_BE_NPU) {
      pr->n_dispatches++;
      pr->dispatch_s += tg->dispatch_s;
    }
  }
  pr->n_steps++;
}

npulm_status npulm_predict(const npulm_model *model, const npulm_npu_profile *profile,
                           const npulm_roofline *host, int n_prompt, int n_gen,
                           npulm_prediction *out, npulm_error *err) {
  memset(out, 0, sizeof(*out));
  npulm_status st = need_program(model, err);
  if (st != NPULM_OK) return st;
  if (n_prompt < 0 || n_gen < 0 || (n_prompt == 0 && n_gen == 0)) {
    return npu_fail(err, NPULM_ERR_ARG, "a run needs prompt or generated tokens (got %d and %d)",
                    n_prompt, n_gen);
  }
  if (host == NULL || !(host->int8_macs > 0) || !(host->f32_macs > 0) || !(host->mem_bytes > 0)) {
    return npu_fail(err, NPULM_ERR_ARG, "the host rates must be measured (npulm_roofline_measure)");
  }
  if (profile != NULL &&
      !(profile->int8_tops > 0 && profile->w8a16_tops > 0 && profile->w4a8_tops > 0 &&
        profile->w4a16_tops > 0 && profile->fp16_tflops > 0 && profile->dram_gbs > 0 &&
        profile->sram_mib >= 0 && profile->dispatch_us >= 0)) {
    return npu_fail(err, NPULM_ERR_ARG, "NPU profile '%s' has a rate that is not positive",
                    profile->name != NULL ? profile->name : "?");
  }
  const struct npu_program *p = model->program;
  const bool int8 = p->quant_mode != NPU_QUANT_F32;
  struct target tg = {.cpu_macs = host->f32_macs,
                      .cpu_bytes = host->mem_bytes,
                      .cpu_cache = (double)host->cache_bytes};
  for (int w4 = 0; w4 < 2; w4++) {
    for (int blk = 0; blk < 2; blk++) {
      for (int a16 = 0; a16 < 2; a16++) {
        tg.npu_mm[w4][blk][a16] =
            matmul_rate(profile, host, w4 ? 4 : 8, blk ? NPU_QC4W_BLOCK : 0, a16);
      }
    }
  }
  /* the host must have measured the rate of every precision the program's matmuls compute in
   * (their inputs are int16 exactly when the mode's activations are) */
  for (int32_t i = 0; int8 && profile == NULL && i < p->n_qsites; i++) {
    const struct npu_qsite *site = &p->qsites[i];
    const bool a16 = npu_quant_act_bits((enum npu_quant_mode)p->quant_mode) == 16;
    if (site->op == NPU_OP_MATMUL && !(tg.npu_mm[site->w_bits == 4][site->w_block != 0][a16] > 0)) {
      return npu_fail(err, NPULM_ERR_ARG,
                      "the host's rate of int%d weights%s x int%d inputs must be measured "
                      "(npulm_roofline_measure)",
                      site->w_bits, site->w_block != 0 ? " in blocks" : "", a16 ? 16 : 8);
    }
  }
  double f32_scale = 1.0;
  if (profile != NULL) {
    tg.npu_macs = int8 ? profile->int8_tops * 0.5e12 : profile->fp16_tflops * 0.5e12;
    tg.npu_bytes = profile->dram_gbs * 1e9;
    tg.npu_sram = profile->sram_mib * 1024.0 * 1024.0;
    tg.dispatch_s = profile->dispatch_us * 1e-6;
    tg.transfers_cost = true;
    f32_scale = 0.5; /* an FP32 program runs in FP16 on a real NPU */
  } else {
    tg.npu_macs = int8 ? host->int8_macs : host->f32_macs;
    tg.npu_bytes = host->mem_bytes;
    tg.npu_sram = (double)host->cache_bytes;
  }

  const int32_t n_total = (int32_t)n_prompt + (int32_t)n_gen;
  struct npu_step *steps = calloc((size_t)(n_prompt > 1 ? n_prompt : 1), sizeof(*steps));
  if (steps == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  double macs = 0.0, bytes = 0.0;
  int32_t pos = 0;
  if (n_prompt > 0) {
    const int32_t ns = npu_exec_plan_steps(p, 0, n_prompt, true, steps);
    if (ns < 0) goto no_graph;
    for (int32_t i = 0; i < ns; i++) {
      predict_step(p, &model->cfg, &tg, f32_scale, steps[i].g, steps[i].pos0, steps[i].n_valid, out,
                   &macs, &bytes);
    }
    pos = n_prompt;
  }
  for (; pos < n_total; pos++) {
    if (npu_exec_plan_steps(p, pos, 1, true, steps) != 1) goto no_graph;
    predict_step(p, &model->cfg, &tg, f32_scale, steps[0].g, pos, 1, out, &macs, &bytes);
  }
  free(steps);
  out->seconds = out->npu_s + out->cpu_s + out->dispatch_s + out->transfer_s;
  out->macs = (uint64_t)macs;
  out->bytes = (uint64_t)bytes;
  return NPULM_OK;
no_graph:
  free(steps);
  memset(out, 0, sizeof(*out));
  return npu_fail(err, NPULM_ERR_ARG,
                  "the program has no graph for %d tokens: its largest context is %d", n_total,
                  p->opts.buckets[p->opts.n_buckets - 1]);
}
