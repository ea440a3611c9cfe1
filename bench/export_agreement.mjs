// How near an exported ONNX model's logits come to npulm's over windows of a text: the reference
// from build/bench/export_windows (npulm, one token at a time), the ONNX side a prefill model of
// C = LEN rows at context K = LEN (no past: each window from an empty cache), one run a window.
// Prints the largest |logit difference|, the median over rows of each row's largest, and the share
// of rows whose top-1 token agrees. In place of the ONNX model, another export_windows file (of
// another program over the same windows) puts the two programs side by side, for scale: how far
// quantization itself moves them. Not a test: a measurement, quoted in bench/RESULTS.md.
// onnxruntime-node from tests/export (npm ci --prefix tests/export).
//   node bench/export_agreement.mjs PREFILL.onnx|OTHER.bin WINDOWS.bin
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';

const require = createRequire(new URL('../tests/export/', import.meta.url));
const ort = require('onnxruntime-node');

const [modelPath, refPath] = process.argv.slice(2);
if (!modelPath || !refPath) {
  console.error('usage: node bench/export_agreement.mjs PREFILL.onnx WINDOWS.bin');
  process.exit(2);
}
// An export_windows file: its shape, tokens and logits.
function readWindows(path) {
  const buf = readFileSync(path);
  const [windows, len, nVocab] = new Int32Array(buf.buffer, buf.byteOffset, 3);
  const end = buf.byteOffset + 12 + 4 * windows * len;
  return {
    windows,
    len,
    nVocab,
    tokens: new Int32Array(buf.buffer.slice(buf.byteOffset + 12, end)),
    logits: new Float32Array(buf.buffer.slice(end)),
  };
}
const { windows, len, nVocab, tokens, logits: ref } = readWindows(refPath);
const other = modelPath.endsWith('.bin') ? readWindows(modelPath) : null;
if (other && (other.windows !== windows || other.len !== len || other.nVocab !== nVocab)) {
  console.error(`${modelPath} and ${refPath} hold other windows`);
  process.exit(1);
}

const session = other
  ? null
  : await ort.InferenceSession.create(modelPath, { executionProviders: ['cpu'] });
const maskRow = new Float32Array(len * len);
for (let t = 0; t < len; t++) for (let j = 0; j < len; j++) maskRow[t * len + j] = j <= t ? 0 : -1e9;
const pos = Int32Array.from({ length: len }, (_, i) => i);

// The logits of window w: the ONNX model's, or the other file's.
async function windowLogits(w) {
  if (other) return other.logits.subarray(w * len * nVocab, (w + 1) * len * nVocab);
  const out = await session.run({
    input_ids: new ort.Tensor('int32', tokens.slice(w * len, (w + 1) * len), [1, len]),
    position_ids: new ort.Tensor('int32', pos, [1, len]),
    attention_mask: new ort.Tensor('float32', maskRow, [1, 1, len, len]),
  });
  return out.logits.data;
}

let worst = 0;
let agree = 0;
const rowMax = [];
const t0 = performance.now();
for (let w = 0; w < windows; w++) {
  const got = await windowLogits(w);
  for (let t = 0; t < len; t++) {
    const r = ref.subarray((w * len + t) * nVocab, (w * len + t + 1) * nVocab);
    const g = got.subarray(t * nVocab, (t + 1) * nVocab);
    let m = 0;
    let bestR = 0;
    let bestG = 0;
    for (let v = 0; v < nVocab; v++) {
      m = Math.max(m, Math.abs(r[v] - g[v]));
      if (r[v] > r[bestR]) bestR = v;
      if (g[v] > g[bestG]) bestG = v;
    }
    rowMax.push(m);
    worst = Math.max(worst, m);
    if (bestR === bestG) agree++;
  }
}
const seconds = (performance.now() - t0) / 1000;
rowMax.sort((a, b) => a - b);
const rows = windows * len;
console.log(
  `export_agreement: ${modelPath}: ${windows} windows x ${len} tokens: max |d| ${worst.toFixed(4)}, ` +
    `median row max |d| ${rowMax[rows >> 1].toFixed(4)}, top-1 agreement ${agree}/${rows} ` +
    `(${((100 * agree) / rows).toFixed(2)} %)` +
    (other ? '' : `; onnxruntime ${ort.env.versions.node}, ${(rows / seconds).toFixed(0)} rows/s`),
);
