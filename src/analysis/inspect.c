/* npulm_model_print_program: a compiled program described for people — its specializations, where
 * each op runs and why some fall back to the CPU, how it is quantized and how much of its
 * arithmetic runs in int8, and the memory it needs. Also npu_program_mac_stats. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/inspect.h"
#include "base/common.h"
#include "program/program.h"
#include "program/sparse_data.h"

/* 'n' bytes as "512 B", "1.5 KiB", "12.0 MiB", "1.25 GiB". */
static const char *human_bytes(uint64_t n, char *buf, size_t cap) {
  if (n < 1024) {
    snprintf(buf, cap, "%llu B", (unsigned long long)n);
  } else if (n < (1ull << 20)) {
    snprintf(buf, cap, "%.1f KiB", (double)n / 1024.0);
  } else if (n < (1ull << 30)) {
    snprintf(buf, cap, "%.1f MiB", (double)n / (1024.0 * 1024.0));
  } else {
    snprintf(buf, cap, "%.2f GiB", (double)n / (1024.0 * 1024.0 * 1024.0));
  }
  return buf;
}

/* 'n' as "950", "12.3 K", "4.56 M", "7.89 G". */
static const char *human_count(uint64_t n, char *buf, size_t cap) {
  if (n < 1000) {
    snprintf(buf, cap, "%llu", (unsigned long long)n);
  } else if (n < 1000000) {
    snprintf(buf, cap, "%.1f K", (double)n / 1e3);
  } else if (n < 1000000000) {
    snprintf(buf, cap, "%.2f M", (double)n / 1e6);
  } else {
    snprintf(buf, cap, "%.2f G", (double)n / 1e9);
  }
  return buf;
}

/* 100 * part / whole, 0 for an empty whole. */
static double percent(uint64_t part, uint64_t whole) {
  return whole > 0 ? 100.0 * (double)part / (double)whole : 0.0;
}

void npu_program_mac_stats(const struct npu_program *p, const struct npu_graph *g,
                           struct npu_mac_stats *out) {
  memset(out, 0, sizeof(*out));
  bool quant = p->quant_mode != NPU_QUANT_F32;
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const struct npu_ir_node *n = &g->nodes[i];
    const struct npu_ir_tensor *y = &g->tensors[n->out];
    const struct npu_ir_tensor *a = n->in[0] >= 0 ? &g->tensors[n->in[0]] : NULL;
    bool on_npu = n->backend == NPU_BE_NPU;
    if (n->op == NPU_OP_MATMUL && a != NULL) {
      /* x [rows, K] . W [N, K] */
      uint64_t rows = (uint64_t)a->ne[0], big_n = (uint64_t)y->ne[1], k = (uint64_t)a->ne[1];
      uint64_t macs = rows * big_n * k;
      out->matmul += macs;
      if (!on_npu) continue;
      out->matmul_npu += macs;
      if (!quant) continue;
      int32_t si = g->node_site != NULL ? g->node_site[i] : -1;
      const struct npu_qsite *s = si >= 0 && si < p->n_qsites ? &p->qsites[si] : NULL;
      uint64_t n_out = s != NULL && s->n_outliers > 0 ? (uint64_t)s->n_outliers : 0;
      uint64_t shadow = rows * big_n * (n_out < k ? n_out : k);
      out->matmul_int8 += macs - shadow;
      out->matmul_shadow += shadow;
      if (n_out > 0) {
        out->n_outliers += (int32_t)n_out;
        out->n_shadowed++;
        if (s->outlier_gate != NULL) {
          out->shadow_extra += 2 * rows * n_out * (uint64_t)s->outlier_dim;
        }
      }
    } else if ((n->op == NPU_OP_QK || n->op == NPU_OP_PV) && a != NULL) {
      /* QK: q [rows, heads * hd] -> s [heads, rows, ctx]; PV: s -> [rows, heads * hd] */
      const struct npu_ir_tensor *s = n->op == NPU_OP_QK ? y : a, *v = n->op == NPU_OP_QK ? a : y;
      uint64_t heads = (uint64_t)s->ne[0], hd = heads > 0 ? (uint64_t)v->ne[1] / heads : 0;
      uint64_t macs = heads * (uint64_t)s->ne[1] * (uint64_t)s->ne[2] * hd;
      out->attention += macs;
      if (on_npu) out->attention_npu += macs;
      if (on_npu && quant) out->attention_int8 += macs; /* the integer QK / PV kernels */
    } else if (n->op == NPU_OP_ATTN && a != NULL) {
      /* QK and PV fused, on the CPU: q [rows, heads * hd] over ctx keys, twice */
      const struct npu_ir_tensor *k = &g->tensors[n->in[1]];
      out->attention += 2 * (uint64_t)a->ne[0] * (uint64_t)k->ne[0] * (uint64_t)a->ne[1];
    }
  }
}

/* Nodes of graph 'g' per op and backend. */
static void count_ops(const struct npu_graph *g, int32_t counts[NPU_OP_COUNT][NPU_BE_COUNT]) {
  memset(counts, 0, sizeof(int32_t) * NPU_OP_COUNT * NPU_BE_COUNT);
  for (int32_t i = 0; i < g->n_nodes; i++) counts[g->nodes[i].op][g->nodes[i].backend]++;
}

static void print_header(const struct npulm_model *m, const struct npu_program *p, FILE *out) {
  const struct npu_config *c = &m->cfg;
  const struct npu_compile_options *o = &p->opts;
  fprintf(out,
          "program of '%s' (%s: %d layers, dim %d, %d heads / %d KV heads, vocab %d, context %d)\n",
          c->name[0] ? c->name : "unnamed", c->arch == NPU_ARCH_QWEN2 ? "qwen2" : "llama",
          c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->n_vocab, c->n_ctx_train);
  fprintf(out, "  prefill chunks:");
  if (o->n_chunks == 0) fprintf(out, " none");
  for (int32_t i = 0; i < o->n_chunks; i++) fprintf(out, i ? ", %d" : " %d", o->chunks[i]);
  fprintf(out, "; context buckets:");
  for (int32_t i = 0; i < o->n_buckets; i++) fprintf(out, i ? ", %d" : " %d", o->buckets[i]);
  fprintf(out, "; kept in float:");
  bool any = false;
  for (int op = 0; op < NPU_OP_COUNT; op++) {
    if (o->float_ops & (1u << op)) {
      fprintf(out, "%s %s", any ? "," : "", npu_op_name((enum npu_op)op));
      any = true;
    }
  }
  fprintf(out, "%s\n", any ? "" : " nothing");
}

static void print_graphs(const struct npu_program *p, FILE *out) {
  fprintf(out,
          "\nspecializations: %d graphs (decode, and prefill of %d chunk size%s with the logits "
          "of all rows or of the last, for each context bucket)\n",
          p->n_graphs, p->opts.n_chunks, p->opts.n_chunks == 1 ? "" : "s");
  fprintf(out, "  graph  step      rows    ctx  logits  nodes   NPU   CPU  subgraphs  transfers   "
               "copied/step   NPU arena   CPU arena\n");
  bool any_kv = false;
  for (int32_t i = 0; i < p->n_graphs; i++) {
    const struct npu_graph *g = &p->graphs[i];
    int32_t on[NPU_BE_COUNT] = {0};
    uint64_t copied = 0;
    bool kv_copies = false;
    for (int32_t k = 0; k < g->n_nodes; k++) {
      const struct npu_ir_node *n = &g->nodes[k];
      on[n->backend]++;
      if (n->op != NPU_OP_TRANSFER) continue;
      /* a KV cache copy moves rows 0 .. pos0 + n_valid - 1: at most the whole bucket */
      copied += npu_ir_tensor_bytes(&g->tensors[n->out]);
      kv_copies |= g->tensors[n->in[0]].kind == NPU_TK_KV;
    }
    char b0[32], b1[32], b2[32], c0[40];
    snprintf(c0, sizeof(c0), "%s%s", kv_copies ? "<= " : "", human_bytes(copied, b0, sizeof(b0)));
    any_kv |= kv_copies;
    fprintf(out, "  %5d  %-7s %6d %6d  %6s %6d %5d %5d %10d %10d %13s %11s %11s\n", i,
            g->rows == 1 ? "decode" : "prefill", g->rows, g->ctx,
            npu_graph_logit_rows(g) == g->rows ? "all" : "last", g->n_nodes, on[NPU_BE_NPU],
            on[NPU_BE_CPU], g->n_subgraphs, g->n_transfers, c0,
            human_bytes(g->arena_size[NPU_BE_NPU], b1, sizeof(b1)),
            human_bytes(g->arena_size[NPU_BE_CPU], b2, sizeof(b2)));
  }
  if (any_kv) {
    fprintf(out, "  (<=: a KV cache copy for attention on the NPU moves only the rows up to the "
                 "step's\n  last position; the figure counts the whole context bucket)\n");
  }
}

static void print_placement(const struct npu_program *p, FILE *out) {
  int32_t counts[NPU_OP_COUNT][NPU_BE_COUNT], other[NPU_OP_COUNT][NPU_BE_COUNT];
  if (p->n_graphs == 0) return;
  count_ops(&p->graphs[0], counts);
  bool same = true;
  for (int32_t i = 1; i < p->n_graphs && same; i++) {
    count_ops(&p->graphs[i], other);
    same = memcmp(counts, other, sizeof(counts)) == 0;
  }
  fprintf(out, "\nplacement (nodes per graph%s):\n",
          same ? ", the same in every graph" : " of graph 0; the graphs differ");
  fprintf(out, "  op           NPU    CPU\n");
  int32_t total[NPU_BE_COUNT] = {0};
  for (int op = 0; op < NPU_OP_COUNT; op++) {
    if (counts[op][NPU_BE_NPU] + counts[op][NPU_BE_CPU] == 0) continue;
    fprintf(out, "  %-10s %5d  %5d%s\n", npu_op_name((enum npu_op)op), counts[op][NPU_BE_NPU],
            counts[op][NPU_BE_CPU],
            op == NPU_OP_TRANSFER ? "   (copies into the arena of the backend that reads them)"
                                  : "");
    for (int be = 0; be < NPU_BE_COUNT; be++) total[be] += counts[op][be];
  }
  fprintf(out, "  %-10s %5d  %5d\n", "total", total[NPU_BE_NPU], total[NPU_BE_CPU]);

  fprintf(out, "\nCPU fallbacks (nodes per graph%s):\n", same ? "" : " of graph 0");
  bool any = false;
  for (int op = 0; op < NPU_OP_COUNT; op++) {
    if (op == NPU_OP_TRANSFER || counts[op][NPU_BE_CPU] == 0) continue;
    const char *why = op == NPU_OP_SHADOW
                          ? "shadow outlier execution: outlier channels in float by design"
                          : npu_fallback_reason((enum npu_op)op, p->opts.float_ops);
    fprintf(out, "  %-10s %5d  %s\n", npu_op_name((enum npu_op)op), counts[op][NPU_BE_CPU],
            why != NULL ? why : "placed on the CPU by the program");
    any = true;
  }
  if (!any) fprintf(out, "  none: every op runs on the NPU\n");
}

static void print_memory(const struct npulm_model *m, const struct npu_program *p, FILE *out) {
  const struct npu_config *c = &m->cfg;
  char b0[32], b1[32];
  /* the float weights the executor reads (an integer NPU reads its int8 data instead): the same
   * whether the program was compiled in memory or loaded from a file with or without the float
   * copy of the NPU's matrices */
  bool *reads = calloc((size_t)p->n_weights + 1, sizeof(*reads));
  int32_t n_tensors = 0;
  uint64_t bytes = 0;
  bool shared = false; /* the tied output's table is read in float */
  if (reads != NULL) npu_program_float_weights(p, reads);
  for (int32_t i = 0; i < p->n_weights && reads != NULL; i++) {
    const struct npu_weight *w = &p->weights[i];
    bool seen = !reads[i] || w->data == NULL;
    for (int32_t j = 0; j < i && !seen; j++) {
      seen = reads[j] && strcmp(p->weights[j].name, w->name) == 0;
      shared |= seen;
    }
    if (seen) continue;
    n_tensors++;
    bytes += (uint64_t)w->ne0 * (uint64_t)w->ne1 * sizeof(float);
  }
  free(reads);
  const bool integer = p->quant_mode != NPU_QUANT_F32;
  fprintf(out, "\nmemory:\n");
  fprintf(out, "  weights    %s F32 in %d tensors%s%s\n", human_bytes(bytes, b0, sizeof(b0)),
          n_tensors, integer ? " read in float by the CPU (the NPU's: integers, below)" : "",
          c->tied_output && (shared || !integer) ? " (the output layer shares the token embedding)"
                                                 : "");
  int32_t max_ctx = p->opts.buckets[p->opts.n_buckets - 1];
  fprintf(out,
          "  KV cache   %s F32 at context %d (%d layers x K and V x %d positions x %d values)\n",
          human_bytes(p->kv_bytes, b0, sizeof(b0)), max_ctx, c->n_layers, max_ctx,
          c->n_kv_heads * c->head_dim);
  int32_t largest[NPU_BE_COUNT] = {0};
  for (int32_t i = 1; i < p->n_graphs; i++) {
    for (int be = 0; be < NPU_BE_COUNT; be++) {
      if (p->graphs[i].arena_size[be] > p->graphs[largest[be]].arena_size[be]) largest[be] = i;
    }
  }
  if (p->n_graphs > 0) {
    const struct npu_graph *gn = &p->graphs[largest[NPU_BE_NPU]];
    const struct npu_graph *gc = &p->graphs[largest[NPU_BE_CPU]];
    fprintf(out,
            "  arenas     NPU %s (graph %d: rows %d, ctx %d), CPU %s (graph %d: rows %d, ctx %d)\n",
            human_bytes(gn->arena_size[NPU_BE_NPU], b0, sizeof(b0)), largest[NPU_BE_NPU], gn->rows,
            gn->ctx, human_bytes(gc->arena_size[NPU_BE_CPU], b1, sizeof(b1)), largest[NPU_BE_CPU],
            gc->rows, gc->ctx);
  }
}

/* SmoothQuant's alpha: the forced one, or those chosen for each block and matmul input (when the
 * program was quantized here: a program file keeps only that they were chosen). */
static void print_smooth(const struct npu_program *p, FILE *out) {
  if (p->smooth_alpha != NPU_SMOOTH_AUTO) {
    fprintf(out, "; SmoothQuant, alpha %.2f\n", (double)p->smooth_alpha);
    return;
  }
  fprintf(out, "; SmoothQuant, alpha chosen per block and matmul input by the predicted error%s\n",
          p->smooth_alphas != NULL ? " (- = not smoothed)" : "");
  if (p->smooth_alphas == NULL || p->n_graphs == 0) return;
  fprintf(out, "  %-6s", "block");
  for (int gi = 0; gi < NPU_SMOOTH_GROUPS; gi++) {
    fprintf(out, " %8s", npu_smooth_group_name((enum npu_smooth_group)gi));
  }
  fprintf(out, "\n");
  int32_t n_layers = 0;
  for (int32_t i = 0; i < p->graphs[0].n_nodes; i++) {
    if (p->graphs[0].nodes[i].layer >= n_layers) n_layers = p->graphs[0].nodes[i].layer + 1;
  }
  for (int32_t l = 0; l < n_layers; l++) {
    fprintf(out, "  %-6d", (int)l);
    for (int gi = 0; gi < NPU_SMOOTH_GROUPS; gi++) {
      const float a = p->smooth_alphas[(size_t)l * NPU_SMOOTH_GROUPS + (size_t)gi];
      if (a == NPU_SMOOTH_NONE) fprintf(out, " %8s", "-");
      else fprintf(out, " %8.2f", (double)a);
    }
    fprintf(out, "\n");
  }
}

/* The quantization: mode, tensor types, outliers. */
static void print_quant(const struct npu_program *p, FILE *out) {
  enum npu_quant_mode mode = (enum npu_quant_mode)p->quant_mode;
  fprintf(out, "\nquantization: %s", npu_quant_mode_name(mode));
  if (mode == NPU_QUANT_F32) {
    fprintf(out, " (the NPU computes in FP32: nothing runs in int8)\n");
  } else {
    const int block = npu_quant_weight_block(mode), abits = npu_quant_act_bits(mode);
    fprintf(out, ": int%d weights ", npu_quant_weight_bits(mode));
    if (block > 0)
      fprintf(out, "in blocks of %d along k (block scales 0..15 x the channel's)", block);
    else fprintf(out, "per output channel");
    fprintf(out, ", int%d activations per tensor (%s)", abits,
            abits == 16 ? "symmetric" : "asymmetric");
    if (npu_quant_outliers(mode) == NPU_OUTLIERS_SHADOW) {
      fprintf(out, "; input channels above %.1fx the median channel's run in float on the CPU\n",
              (double)p->shadow_threshold);
    } else if (npu_quant_outliers(mode) == NPU_OUTLIERS_SMOOTH) {
      print_smooth(p, out);
    } else {
      fprintf(out, "; no outlier handling\n");
    }
  }
  if (p->n_graphs == 0) return;
  /* activation types of the decode graph, per backend */
  const struct npu_graph *g = &p->graphs[0];
  int32_t count[NPU_BE_COUNT][NPU_DT_COUNT] = {{0}};
  for (int32_t i = 0; i < g->n_tensors; i++) {
    const struct npu_ir_tensor *t = &g->tensors[i];
    if (t->kind == NPU_TK_ACT && t->backend < NPU_BE_COUNT && t->dtype < NPU_DT_COUNT) {
      count[t->backend][t->dtype]++;
    }
  }
  static const char *const dt_names[NPU_DT_COUNT] = {"F32", "I8", "I16", "I32"};
  fprintf(out, "  activations (graph 0):");
  for (int be = 0; be < NPU_BE_COUNT; be++) {
    fprintf(out, "%s %s", be ? ";" : "", npu_backend_name((enum npu_backend)be));
    bool any = false;
    for (int dt = 0; dt < NPU_DT_COUNT; dt++) {
      if (count[be][dt] == 0) continue;
      fprintf(out, "%s %d %s", any ? "," : "", count[be][dt], dt_names[dt]);
      any = true;
    }
    if (!any) fprintf(out, " none");
  }
  fprintf(out, "; weights, KV cache and logits F32\n");
  if (mode == NPU_QUANT_F32) return;
  int32_t n_i8 = 0, n_i16 = 0, n_outliers = 0, n_shadowed = 0;
  uint64_t packed = 0;
  for (int32_t i = 0; i < p->n_qtensors; i++) {
    n_i8 += p->qtensors[i].dtype == NPU_DT_I8;
    n_i16 += p->qtensors[i].dtype == NPU_DT_I16;
  }
  bool tied = false;
  int32_t n_w4 = 0, n_w8 = 0; /* matmuls by weight bits */
  for (int32_t i = 0; i < p->n_qsites; i++) {
    const struct npu_qsite *s = &p->qsites[i];
    tied |= s->table_site >= 0;
    n_outliers += s->n_outliers;
    n_shadowed += s->n_outliers > 0;
    if (s->table_site < 0) packed += s->packed_size; /* tied: once */
    if (s->op == NPU_OP_MATMUL) {
      n_w4 += s->w_bits == 4;
      n_w8 += s->w_bits == 8;
    }
  }
  char b0[32];
  fprintf(out,
          "  quantization table: %d tensors (%d I8, %d I16); %d NPU operations with %s of integer "
          "weights and tables%s\n",
          p->n_qtensors, n_i8, n_i16, p->n_qsites, human_bytes(packed, b0, sizeof(b0)),
          tied ? " (the embedding gathered from the classifier's)" : "");
  fprintf(out, "  matmul weights: %d int8, %d int4%s\n", n_w8, n_w4,
          n_w4 > 0 ? " (the classifier keeps int8)" : "");
  fprintf(out, "  outlier channels: %d in %d matmul%s%s\n", n_outliers, n_shadowed,
          n_shadowed == 1 ? "" : "s",
          n_outliers > 0 ? " (computed in float on the CPU, added back on the NPU)" : "");
}

/* The share of the MACs that run in int8 on the NPU, for decode and the largest prefill graph. */
static void print_macs(const struct npu_program *p, FILE *out) {
  int32_t pick[2] = {-1, -1}; /* decode at the largest bucket; the largest prefill graph */
  for (int32_t i = 0; i < p->n_graphs; i++) {
    const struct npu_graph *g = &p->graphs[i];
    int k = g->rows == 1 ? 0 : 1;
    const struct npu_graph *best = pick[k] >= 0 ? &p->graphs[pick[k]] : NULL;
    if (best == NULL || g->rows > best->rows || (g->rows == best->rows && g->ctx > best->ctx)) {
      pick[k] = i;
    }
  }
  fprintf(out,
          "\nMACs per step (integer: on the NPU in integers, int8 or int4 weights by int8 or int16 "
          "activations; shadow: outlier channels in float on the CPU):\n");
  fprintf(out, "  graph  step      rows    ctx   weight matmuls integer shadow   with attention"
               " integer\n");
  for (int k = 0; k < 2; k++) {
    if (pick[k] < 0) continue;
    const struct npu_graph *g = &p->graphs[pick[k]];
    struct npu_mac_stats st;
    npu_program_mac_stats(p, g, &st);
    char b0[32], b1[32];
    uint64_t all = st.matmul + st.attention;
    fprintf(out, "  %5d  %-7s %6d %6d %16s %6.1f%% %6.1f%% %16s %6.1f%%\n", pick[k],
            g->rows == 1 ? "decode" : "prefill", g->rows, g->ctx,
            human_count(st.matmul, b0, sizeof(b0)), percent(st.matmul_int8, st.matmul),
            percent(st.matmul_shadow, st.matmul), human_count(all, b1, sizeof(b1)),
            percent(st.matmul_int8 + st.attention_int8, all));
  }
}

/* What --sparsity auto tried: each level's decode perplexity over dense's (0: not tried). */
static void print_auto(const float *levels, const float *ratios, int n, FILE *out) {
  bool tried = false;
  for (int i = 0; i < n; i++) tried |= ratios[i] != 0.0f;
  if (!tried) return;
  fprintf(out,
          "  chosen by --sparsity auto: decode perplexity on the calibration text over dense's");
  for (int i = 0; i < n; i++) {
    if (ratios[i] != 0.0f)
      fprintf(out, "%s %.2f: x%.4f", i ? "," : "", (double)levels[i], (double)ratios[i]);
  }
  fprintf(out, " (tolerance x1.01)\n");
}

/* Sparse decode: per layer its thresholds, what calibration kept, the predictor's size and cost,
 * and the bytes the bundles add to the file. */
static void print_sparse(const struct npu_program *p, FILE *out) {
  const struct npu_sparse *sp = p->sparse;
  if (sp == NULL) return;
  char b1[32], b2[32], b3[32], b4[32];
  uint64_t bundles = 0, pred = 0, pred_macs = 0, ffn_macs = 0;
  for (int32_t l = 0; l < sp->n_layers; l++) {
    bundles += npu_sparse_bundle_bytes(sp, l);
    pred += npu_sparse_predictor_bytes(sp, l);
    pred_macs += (uint64_t)sp->layers[l].rank * ((uint64_t)sp->dim + (uint64_t)sp->layers[l].n_ff);
    ffn_macs += 3 * (uint64_t)sp->dim * (uint64_t)sp->layers[l].n_ff;
  }
  fprintf(out,
          "sparse decode: skips %.0f%% of each layer's FFN neurons on the calibration text (least "
          "|SiLU(gate)|); bundles of gate row, up row, down column (%d bytes each) add %s to the "
          "file (the dense FFN weights stay, for prefill); predictors %s, %s MACs per token "
          "(%.1f%% of the dense FFN's %s)\n",
          100.0 * (double)sp->level, 3 * sp->kp, human_bytes(bundles, b1, sizeof(b1)),
          human_bytes(pred, b2, sizeof(b2)), human_count(pred_macs, b3, sizeof(b3)),
          percent(pred_macs, ffn_macs), human_count(ffn_macs, b4, sizeof(b4)));
  print_auto(npu_sparse_auto_levels, sp->auto_ratio, NPU_SPARSE_AUTO_LEVELS, out);
  fprintf(out, "  layer  rank  kept: |SiLU(gate)| >= tau  gate in steps: keep v >= hi | lo_a..lo_b"
               "  kept  candidates  recall  predictor\n");
  for (int32_t l = 0; l < sp->n_layers; l++) {
    const struct npu_sparse_layer *ly = &sp->layers[l];
    struct npu_sparse_sites sites;
    npulm_error err;
    const bool ok = npu_sparse_sites_of(p, l, &sites, &err) == NPULM_OK;
    const double g_hi = ok ? (double)ly->hi * sites.gate_scale : 0.0; /* SiLU(g_hi) = tau */
    fprintf(out, "  %5d  %4d  tau %-18.4g  %8.2f | %8.2f..%-8.2f  %4.1f%%  %9.1f%%  %6.4f  %s\n", l,
            ly->rank, g_hi / (1.0 + exp(-g_hi)), (double)ly->hi, (double)ly->lo_a, (double)ly->lo_b,
            100.0 * (double)ly->keep, 100.0 * (double)ly->cand, (double)ly->recall,
            human_bytes(npu_sparse_predictor_bytes(sp, l), b1, sizeof(b1)));
  }
}

/* Input-sparse decode: per sparsified matmul its threshold and the share of channels calibration
 * kept, and the weight bytes a decode step is expected to read. */
static void print_input_sparse(const struct npu_program *p, FILE *out) {
  if (!npu_program_input_sparse(p)) return;
  uint64_t sparse = 0, kept = 0;
  for (int32_t i = 0; i < p->n_qsites; i++) {
    const struct npu_qsite *s = &p->qsites[i];
    if (s->skip_below <= 0) continue;
    sparse += s->packed_size;
    kept += (uint64_t)((double)s->packed_size * (double)s->skip_keep);
  }
  char b1[32], b2[32];
  fprintf(out,
          "input-sparse decode: skips %.0f%% of each block matmul's input channels on the "
          "calibration text (|x - zero point| below the threshold); expected to read %s of its "
          "%s of sparsified weights per token (%.1f%%; the classifier stays dense); the runtime "
          "holds a channel-major copy of them\n",
          100.0 * (double)p->input_sparsity, human_bytes(kept, b1, sizeof(b1)),
          human_bytes(sparse, b2, sizeof(b2)), percent(kept, sparse));
  print_auto(npu_input_auto_levels, p->input_auto_ratio, NPU_INPUT_AUTO_LEVELS, out);
  fprintf(out, "  %-28s %6s  %9s  %s\n", "matmul", "k", "threshold", "kept");
  for (int32_t i = 0; i < p->n_qsites; i++) {
    const struct npu_qsite *s = &p->qsites[i];
    if (s->skip_below <= 0) continue;
    fprintf(out, "  %-28s %6d  %9d  %5.1f%%\n", s->name, s->k, s->skip_below,
            100.0 * (double)s->skip_keep);
  }
}

npulm_status npulm_model_print_program(const npulm_model *model, FILE *out, npulm_error *err) {
  const struct npu_program *p = model->program;
  if (p == NULL) return npu_fail(err, NPULM_ERR_ARG, "the model has no program: compile it first");
  print_header(model, p, out);
  print_graphs(p, out);
  print_placement(p, out);
  print_quant(p, out);
  print_sparse(p, out);
  print_input_sparse(p, out);
  print_macs(p, out);
  print_memory(model, p, out);
  if (fflush(out) != 0 || ferror(out)) {
    return npu_fail(err, NPULM_ERR_IO, "cannot write the program description");
  }
  return NPULM_OK;
}
