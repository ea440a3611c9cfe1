// Concurrent streams against an OpenAI-compatible server (npulm serve, llama-server): for each
// number of streams, 'reps' rounds of that many streaming /v1/completions started at once, greedy,
// each generating exactly --tokens tokens (ignore_eos, which both servers honour), and the medians
// over the rounds of:
// - aggregate decode t/s: the sum over the streams of (tokens - 1) / (last token - first token),
//   the rate the server decodes at while they all run;
// - wall t/s: all tokens / (last stream done - start), prefill and queueing included;
// - time to first token: from sending the request to its first token, the median stream.
// Not a test: a measurement, quoted in bench/RESULTS.md. Node 18+ (fetch), no packages.
//   node bench/serve_load.mjs --url http://127.0.0.1:8080 [--streams 1,2,4,8] [--tokens 64]
//        [--reps 3] [--prompt TEXT]
const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, a, i, all) => {
    if (a.startsWith("--")) pairs.push([a.slice(2), all[i + 1]]);
    return pairs;
  }, []),
);
const url = args.url ?? "http://127.0.0.1:8080";
const streamsList = (args.streams ?? "1,2,4,8").split(",").map(Number);
const tokens = Number(args.tokens ?? 64);
const reps = Number(args.reps ?? 3);
const basePrompt = args.prompt ?? "Once upon a time, there was a little girl named";

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

// One streaming completion: its start, first-token and end times (ms) and token count.
let nRequests = 0;
async function stream() {
  // a distinct start: no server may reuse an earlier request's cache (llama-server keeps each
  // slot's last prompt and reuses its longest common prefix)
  const body = {
    prompt: `${++nRequests}. ${basePrompt}`,
    max_tokens: tokens,
    temperature: 0,
    stream: true,
    ignore_eos: true,
    stream_options: { include_usage: true },
  };
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  let first = 0, chunks = 0, usage = null, buf = "";
  const decoder = new TextDecoder();
  for await (const part of res.body) {
    buf += decoder.decode(part, { stream: true });
    let at;
    while ((at = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, at).trim();
      buf = buf.slice(at + 2);
      if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
      const data = JSON.parse(event.slice(6));
      if (data.usage) usage = data.usage;
      const text = data.choices?.[0]?.text ?? "";
      if (text.length > 0) {
        if (first === 0) first = performance.now();
        chunks++;
      }
    }
  }
  const end = performance.now();
  const n = usage?.completion_tokens ?? chunks;
  return { t0, first, end, n };
}

async function round(n) {
  const start = performance.now();
  const runs = await Promise.all(Array.from({ length: n }, () => stream()));
  const last = Math.max(...runs.map((r) => r.end));
  const total = runs.reduce((s, r) => s + r.n, 0);
  return {
    decode: runs.reduce((s, r) => s + (r.n - 1) / ((r.end - r.first) / 1000), 0),
    wall: total / ((last - start) / 1000),
    ttft: median(runs.map((r) => r.first - r.t0)),
    tokens: total / n,
  };
}

await round(1); // warmup
console.log("streams  decode t/s (agg)  wall t/s  TTFT ms  tokens/stream  rounds");
for (const n of streamsList) {
  const rs = [];
  for (let r = 0; r < reps; r++) rs.push(await round(n));
  const f = (k, d) => median(rs.map((x) => x[k])).toFixed(d);
  console.log(
    `${String(n).padStart(7)}  ${f("decode", 1).padStart(16)}  ${f("wall", 1).padStart(8)}  ` +
      `${f("ttft", 1).padStart(7)}  ${f("tokens", 0).padStart(13)}  ${reps}`,
  );
}
