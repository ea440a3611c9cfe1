// `npulm serve --parallel 8` under concurrent greedy requests: eight different requests at once
// (completions and chat, some streaming, different prompt lengths and max_tokens, started a few ms
// apart so that prefills land between batched decode steps) must give exactly the text, finish
// reason and usage that the same requests give one at a time afterwards on the same server; and a
// greedy completion must be exactly what `npulm run -p PROMPT -n N --temp 0` prints after the
// prompt it echoes. Prints TAP.
import { spawnSync } from 'node:child_process';
import OpenAI from 'openai';
import { apiKey, assert, baseURL, check, done, equal, sleep } from './lib.mjs';

const client = new OpenAI({ baseURL, apiKey: apiKey || 'none', maxRetries: 0, timeout: 60000 });

const requests = [
  { kind: 'completion', stream: false, prompt: 'Once upon a time', max_tokens: 32 },
  { kind: 'completion', stream: true, prompt: 'The little dog ran to the park and', max_tokens: 48 },
  { kind: 'chat', stream: false, messages: [{ role: 'user', content: 'Tell me a story about a cat.' }], max_tokens: 24 },
  { kind: 'completion', stream: false, prompt: 'Tom had a red ball. One day, he', max_tokens: 40 },
  { kind: 'chat', stream: true, messages: [{ role: 'system', content: 'You tell short stories.' }, { role: 'user', content: 'A bird and a tree.' }], max_tokens: 36 },
  { kind: 'completion', stream: true, prompt: 'Lily', max_tokens: 28 },
  { kind: 'completion', stream: false, prompt: 'The sun was hot and the children wanted to swim in the big blue lake near', max_tokens: 44 },
  { kind: 'chat', stream: true, messages: [{ role: 'user', content: 'Why is the sky blue?' }], max_tokens: 30 },
];

/* one request; resolves to {text, finish, usage} the same way for every kind */
async function run(r) {
  /* no stream_options: the spec's final chunk carries usage anyway (as llama-server's does) */
  const common = { temperature: 0, max_tokens: r.max_tokens, stream: r.stream };
  const res = r.kind === 'chat'
    ? await client.chat.completions.create({ ...common, messages: r.messages })
    : await client.completions.create({ ...common, prompt: r.prompt });
  if (!r.stream) {
    const c = res.choices[0];
    return { text: r.kind === 'chat' ? c.message.content : c.text, finish: c.finish_reason, usage: res.usage };
  }
  let text = '';
  let finish = null;
  let usage = null;
  for await (const chunk of res) {
    const c = chunk.choices[0];
    if (c) text += (r.kind === 'chat' ? c.delta && c.delta.content : c.text) || '';
    if (c && c.finish_reason) finish = c.finish_reason;
    if (chunk.usage) usage = chunk.usage;
  }
  return { text, finish, usage };
}

const describe = (r, i) => `#${i} ${r.kind}${r.stream ? ' stream' : ''} max_tokens ${r.max_tokens}`;

function same(got, want, what) {
  equal(got.text, want.text, `${what} text`);
  equal(got.finish, want.finish, `${what} finish_reason`);
  assert(got.usage && want.usage, `${what}: no usage`);
  equal(got.usage.prompt_tokens, want.usage.prompt_tokens, `${what} prompt_tokens`);
  equal(got.usage.completion_tokens, want.usage.completion_tokens, `${what} completion_tokens`);
}

/* all at once, each started 3 ms after the one before; results in request order */
async function together(reqs) {
  return Promise.all(reqs.map(async (r, i) => {
    await sleep(3 * i);
    return run(r);
  }));
}

let concurrent = null;
await check('eight concurrent greedy requests all complete', async () => {
  concurrent = await together(requests);
  concurrent.forEach((c, i) => {
    assert(c.text.length > 0, `${describe(requests[i], i)}: empty text`);
    assert(['stop', 'length'].includes(c.finish), `${describe(requests[i], i)}: finish_reason ${c.finish}`);
  });
});

for (let i = 0; i < requests.length; i++) {
  await check(`concurrent equals alone: ${describe(requests[i], i)}`, async () => {
    assert(concurrent, 'the concurrent round failed');
    same(concurrent[i], await run(requests[i]), describe(requests[i], i));
  });
}

/* longer generations, so that the eight overlap for many decode steps even on a fast model */
const long = requests.map((r, i) => ({ ...r, max_tokens: 160 + 16 * i }));
await check('eight concurrent 160-272 token requests equal the same requests alone', async () => {
  const got = await together(long);
  for (let i = 0; i < long.length; i++) same(got[i], await run(long[i]), describe(long[i], i));
});

await check('the same prompt eight times at once: eight identical answers', async () => {
  const r = { kind: 'completion', stream: false, prompt: 'One day, a girl named', max_tokens: 40 };
  const got = await together(Array(8).fill(r));
  const alone = await run(r);
  got.forEach((g, i) => same(g, alone, `copy ${i}`));
});

/*
 * `npulm run` echoes the prompt, prints each generated piece, then one "\n" when it stops (at -n
 * tokens, an end-of-generation token or the context end), so its continuation is stdout less the
 * prompt in front and that newline.
 */
const bin = process.env.NPULM_BIN;
const model = process.env.NPULM_MODEL;
/* -n 600 runs into the context's end (the model's 512 in run, -c 512 here): both stop there */
for (const [prompt, n] of [['Once upon a time', 40], ['The cat sat on the', 24], ['Ben and Mia', 33], ['Once upon a time', 600]]) {
  await check(`completion equals npulm run -p ${JSON.stringify(prompt)} -n ${n} --temp 0`, async () => {
    assert(bin && model, 'set NPULM_BIN and NPULM_MODEL');
    const p = spawnSync(bin, ['run', '-m', model, '-p', prompt, '-n', String(n), '--temp', '0'],
      { encoding: 'utf8', timeout: 60000 });
    equal(p.status, 0, `npulm run exit status (stderr: ${p.stderr && p.stderr.slice(-300)})`);
    assert(p.stdout.startsWith(prompt) && p.stdout.endsWith('\n'), `run printed ${JSON.stringify(p.stdout)}`);
    const want = p.stdout.slice(prompt.length, -1);
    const got = await run({ kind: 'completion', stream: false, prompt, max_tokens: n });
    equal(got.text, want, 'text');
    assert(got.usage.total_tokens <= 512, `total_tokens ${got.usage.total_tokens}, past the context of 512`);
    const streamed = await run({ kind: 'completion', stream: true, prompt, max_tokens: n });
    equal(streamed.text, want, 'streamed text');
  });
}

done();
