// Runs models `npulm export` wrote under onnxruntime (onnxruntime-node, CPU execution provider,
// default graph optimizations) the way the export contract says a host runs them, and compares
// their logits and greedy tokens with npulm's own (a reference file of build/tests/export_ref).
//
//   node ort_check.mjs --decode D.onnx [--prefill P.onnx] --ref REF.bin --tol X
//                      [--median-tol Y] [--same-tokens N]
//   node ort_check.mjs --decode D.onnx [--ref REF.bin] --bench N
//
// The host keeps a KV cache per layer by position (0 .. the last position used); a step of a
// model with C rows and K context slots (P = K - C past slots) starting at position pos0 gets
// past_* = the cache's positions 0 .. pos0-1 in slots 0 .. pos0-1 (the rest zeros), and its
// present_* rows 0 .. n-1 are written back at positions pos0 .. pos0+n-1. The prompt (REF.bin's
// tokens) goes through the prefill model in chunks of C rows, padded (token 0, the last real
// row's position and mask), or without --prefill one token at a time through the decode model;
// its last logits are compared with REF.bin's row 0. Then N greedy steps (N from REF.bin) run
// through the decode model with onnxruntime's own argmax tokens (lowest index on ties); each
// step's logits are compared with REF.bin's row while the tokens so far agree. Prints the
// onnxruntime version, then one line:
//   ort_check: prefill max|d|=... ; decode steps=N max|d|=... top1 agree a/b; tokens identical: yes
// and exits 1 if a max |d| exceeds --tol (NaN counts as infinite), the median over the decode
// steps of each step's max |d| exceeds --median-tol (default: --tol), or the token sequences
// differ within their first --same-tokens (default: all; both printed). --bench N instead times N decode steps from the prompt (REF.bin's, else token
// 1): median ms/step and tokens/s, for measurements, not tests. Bad arguments: one line, exit 2.
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import * as ort from 'onnxruntime-node';

const NEG = -1e9; // the contract's "may not attend" mask value

function die(msg, code = 2) {
  console.error(`ort_check: ${msg}`);
  process.exit(code);
}

// REF.bin (tests/export/ref_logits.c): n_prompt, n_steps, n_vocab, prompt, generated tokens,
// then (1 + n_steps) rows of n_vocab logits, all little-endian
function readRef(path) {
  const b = readFileSync(path);
  if (b.length < 12) die(`${path}: too short for a reference file`);
  const [nPrompt, nSteps, nVocab] = [0, 1, 2].map((i) => b.readInt32LE(4 * i));
  const nTok = nPrompt + nSteps;
  const size = 12 + 4 * nTok + 4 * (1 + nSteps) * nVocab;
  if (nPrompt < 1 || nSteps < 0 || nVocab < 1 || b.length !== size) {
    die(`${path}: not a reference file (header ${nPrompt} ${nSteps} ${nVocab}, ${b.length} bytes)`);
  }
  const tokens = Array.from({ length: nTok }, (_, i) => b.readInt32LE(12 + 4 * i));
  const logits = new Float32Array(size / 4 - 3 - nTok);
  for (let i = 0; i < logits.length; i++) logits[i] = b.readFloatLE(12 + 4 * nTok + 4 * i);
  const row = (i) => logits.subarray(i * nVocab, (i + 1) * nVocab);
  return { prompt: tokens.slice(0, nPrompt), gen: tokens.slice(nPrompt), nSteps, nVocab, row };
}

// A model and its specialization, read from its inputs' shapes: C rows, K slots, P past slots
async function load(path) {
  let session;
  try {
    session = await ort.InferenceSession.create(path, { executionProviders: ['cpu'] });
  } catch (e) {
    die(`${path}: ${String(e.message).split('\n')[0]}`, 1);
  }
  const meta = Object.fromEntries(session.inputMetadata.map((m) => [m.name, m.shape]));
  const out = Object.fromEntries(session.outputMetadata.map((m) => [m.name, m.shape]));
  const mask = meta.attention_mask;
  if (!mask || mask.length !== 4 || !out.present_key_0 || !out.logits) {
    die(`${path}: not the contract's interface (attention_mask, present_key_0, logits)`, 1);
  }
  const [c, k] = [mask[2], mask[3]];
  // a chunk with C = K has no past inputs (it starts from an empty cache)
  const nLayers = session.outputNames.filter((n) => n.startsWith('present_key_')).length;
  const kvDim = out.present_key_0[2];
  return { path, session, c, k, p: k - c, nLayers, kvDim, nVocab: out.logits[2] };
}

// The host's KV cache: per layer and kind ("key", "value"), kvDim floats per position
function makeCache(nLayers, kvDim, nPos) {
  const cache = {};
  for (let l = 0; l < nLayers; l++) {
    for (const kind of ['key', 'value']) cache[`${kind}_${l}`] = new Float32Array(nPos * kvDim);
  }
  return cache;
}

// One step of 'model' on 'tokens' (at most C) at positions pos0 ...; writes their K/V rows into
// the cache and returns the last real row's logits (a copy)
async function step(model, cache, tokens, pos0) {
  const { c, k, p, kvDim, nVocab } = model;
  const n = tokens.length;
  if (n < 1 || n > c) throw new Error(`${n} tokens for a step of ${c} rows`);
  if (pos0 > p) throw new Error(`position ${pos0} past ${model.path}'s ${p} past slots`);
  const ids = new Int32Array(c);
  const pos = new Int32Array(c);
  const mask = new Float32Array(c * k).fill(NEG);
  for (let t = 0; t < c; t++) {
    const r = Math.min(t, n - 1); // a padded row: the last real row's token position and mask
    ids[t] = t < n ? tokens[t] : 0;
    pos[t] = pos0 + r;
    for (let j = 0; j < pos0; j++) mask[t * k + j] = 0;
    for (let u = 0; u <= r; u++) mask[t * k + p + u] = 0;
  }
  const feeds = {
    input_ids: new ort.Tensor('int32', ids, [1, c]),
    position_ids: new ort.Tensor('int32', pos, [1, c]),
    attention_mask: new ort.Tensor('float32', mask, [1, 1, c, k]),
  };
  if (p === 0 && pos0 > 0) die(`${model.path} has no past slots: it runs a chunk at position 0 only`, 1);
  for (const [name, rows] of Object.entries(cache)) {
    if (p === 0) break;
    const past = new Float32Array(p * kvDim);
    past.set(rows.subarray(0, pos0 * kvDim));
    feeds[`past_${name}`] = new ort.Tensor('float32', past, [1, p, kvDim]);
  }
  const out = await model.session.run(feeds);
  for (const [name, rows] of Object.entries(cache)) {
    rows.set(out[`present_${name}`].data.subarray(0, n * kvDim), pos0 * kvDim);
  }
  return out.logits.data.slice((n - 1) * nVocab, n * nVocab);
}

// Evaluate the prompt from position 0: through the prefill model in chunks, else token by token
async function prefill(prefillModel, decodeModel, cache, prompt) {
  const model = prefillModel ?? decodeModel;
  let logits;
  for (let i = 0; i < prompt.length; i += model.c) {
    logits = await step(model, cache, prompt.slice(i, i + model.c), i);
  }
  return logits;
}

function argmax(x) {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i] > x[best]) best = i;
  return best;
}

function maxAbsDiff(a, b) {
  let m = 0;
  for (let i = 0; i < a.length; i++) {
    const d = Math.abs(a[i] - b[i]);
    if (!(d <= m)) m = Number.isNaN(d) ? Infinity : d;
  }
  return m;
}

const fmt = (x) => (Number.isFinite(x) ? x.toPrecision(4) : String(x));

async function check(decode, pre, ref, tol, medianTol, sameTokens) {
  const cache = makeCache(decode.nLayers, decode.kvDim, ref.prompt.length + ref.nSteps);
  let logits = await prefill(pre, decode, cache, ref.prompt);
  const dPrefill = maxAbsDiff(logits, ref.row(0));
  const top1Prefill = argmax(logits) === argmax(ref.row(0));
  const tokens = [];
  let dDecode = 0;
  const steps = []; // each compared step's max |d|
  let agree = 0;
  let compared = 0;
  let firstDiff = -1;
  for (let i = 0; i < ref.nSteps; i++) {
    const tok = argmax(logits);
    tokens.push(tok);
    if (firstDiff < 0 && tok !== ref.gen[i]) firstDiff = i;
    logits = await step(decode, cache, [tok], ref.prompt.length + i);
    if (firstDiff >= 0) continue; // the reference's row i + 1 followed other tokens
    const d = maxAbsDiff(logits, ref.row(i + 1));
    if (!(d <= dDecode)) dDecode = d;
    steps.push(d);
    compared++;
    if (argmax(logits) === argmax(ref.row(i + 1))) agree++;
  }
  const same = firstDiff < 0 ? 'yes' : `no (first difference at ${firstDiff})`;
  steps.sort((a, b) => a - b);
  const median = steps.length ? steps[Math.floor(steps.length / 2)] : 0;
  console.log(
    `ort_check: prefill max|d|=${fmt(dPrefill)} (top1 ${top1Prefill ? 'agrees' : 'differs'}) ; ` +
      `decode steps=${ref.nSteps} max|d|=${fmt(dDecode)} median step max|d|=${fmt(median)} ` +
      `top1 agree ${agree}/${compared}; ` +
      `tokens identical: ${same}`,
  );
  if (firstDiff >= 0) {
    console.log(`ort_check: npulm tokens: ${ref.gen.join(' ')}`);
    console.log(`ort_check: ort   tokens: ${tokens.join(' ')}`);
  }
  const bad = [];
  if (!(dPrefill <= tol)) bad.push(`prefill max|d| ${fmt(dPrefill)} > tol ${tol}`);
  if (!(dDecode <= tol)) bad.push(`decode max|d| ${fmt(dDecode)} > tol ${tol}`);
  if (!(median <= medianTol)) {
    bad.push(`median step max|d| ${fmt(median)} > median tol ${medianTol}`);
  }
  if (firstDiff >= 0 && firstDiff < sameTokens) {
    bad.push(`the greedy tokens differ before token ${sameTokens}`);
  }
  if (bad.length) console.log(`ort_check: FAIL: ${bad.join('; ')}`);
  return bad.length === 0;
}

async function bench(decode, pre, prompt, n) {
  const cache = makeCache(decode.nLayers, decode.kvDim, prompt.length + n + 1);
  let logits = await prefill(pre, decode, cache, prompt);
  const ms = [];
  for (let i = 0; i <= n; i++) {
    const t0 = performance.now();
    logits = await step(decode, cache, [argmax(logits)], prompt.length + i);
    if (i > 0) ms.push(performance.now() - t0); // step 0 warms up
  }
  ms.sort((a, b) => a - b);
  const median = ms[Math.floor(ms.length / 2)];
  console.log(
    `ort_check: bench ${decode.path}: ${n} decode steps from position ${prompt.length}, ` +
      `median ${median.toFixed(3)} ms/step, ${(1000 / median).toFixed(1)} tokens/s`,
  );
}

async function main() {
  let args;
  try {
    args = parseArgs({
      options: {
        decode: { type: 'string' },
        prefill: { type: 'string' },
        ref: { type: 'string' },
        tol: { type: 'string' },
        'median-tol': { type: 'string' },
        'same-tokens': { type: 'string' },
        bench: { type: 'string' },
      },
    }).values;
  } catch (e) {
    die(e.message);
  }
  const usage =
    'usage: ort_check.mjs --decode D.onnx [--prefill P.onnx] --ref REF.bin --tol X | --bench N';
  if (!args.decode) die(`--decode is needed (${usage})`);
  const benchN = args.bench === undefined ? 0 : Number(args.bench);
  if (args.bench !== undefined && !(Number.isInteger(benchN) && benchN >= 1)) {
    die(`--bench wants a whole number >= 1, not '${args.bench}'`);
  }
  const tol = Number(args.tol);
  if (!benchN && (!args.ref || args.tol === undefined || !(tol >= 0))) {
    die(`--ref and --tol (a number >= 0) are needed (${usage})`);
  }
  const ref = args.ref ? readRef(args.ref) : null;
  const decode = await load(args.decode);
  const pre = args.prefill ? await load(args.prefill) : null;
  if (decode.c !== 1) die(`${args.decode}: ${decode.c} rows a step, a decode model has 1`, 1);
  for (const m of [pre].filter(Boolean)) {
    if (m.nLayers !== decode.nLayers || m.kvDim !== decode.kvDim || m.nVocab !== decode.nVocab) {
      die(`${m.path} and ${decode.path} differ in layers, kv_dim or vocabulary`, 1);
    }
  }
  if (ref && ref.nVocab !== decode.nVocab) {
    die(`${args.ref} has ${ref.nVocab} logits a row, the model ${decode.nVocab}`, 1);
  }
  const spec = (m) => `${m.path} (C=${m.c} K=${m.k})`;
  console.log(
    `ort_check: onnxruntime-node ${ort.env.versions.node}, CPU EP; decode ${spec(decode)}` +
      (pre ? `, prefill ${spec(pre)}` : ''),
  );
  try {
    if (benchN) {
      await bench(decode, pre, ref ? ref.prompt : [1], benchN);
      return 0;
    }
    const medianTol = args['median-tol'] === undefined ? tol : Number(args['median-tol']);
    // how many leading greedy tokens must be npulm's (default: all)
    const sameTokens = args['same-tokens'] === undefined ? ref.nSteps : Number(args['same-tokens']);
    return (await check(decode, pre, ref, tol, medianTol, sameTokens)) ? 0 : 1;
  } catch (e) {
    die(String(e.message).split('\n')[0], 1);
  }
}

process.exit(await main());
