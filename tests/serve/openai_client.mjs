// `npulm serve` through the official openai npm client, as an application would use it: models,
// completions and chat completions, streaming and not, their text, finish_reason and usage, stop
// strings, seeds, and the client's typed errors (a wrong API key is its AuthenticationError). The
// server runs with --api-key $NPULM_SERVE_KEY. Prints TAP.
// The client is openai 5 (package.json), which uses node's own fetch: 4.x's node-fetch fails every
// stream with "Premature close" under Debian 12's Node 18.20, whatever the server.
import OpenAI from 'openai';
import { apiKey, assert, baseURL, check, done, equal, fail, modelId, request, sseEvents } from './lib.mjs';

/* no retries: a retried 5xx or reset would hide the failure this test is for */
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 30000 });
const prompt = 'Once upon a time';

function usageOf(u, completionTokens) {
  assert(u && typeof u === 'object', `no usage: ${JSON.stringify(u)}`);
  assert(Number.isInteger(u.prompt_tokens) && u.prompt_tokens > 0, `usage.prompt_tokens ${u.prompt_tokens}`);
  if (completionTokens !== undefined) equal(u.completion_tokens, completionTokens, 'usage.completion_tokens');
  assert(Number.isInteger(u.completion_tokens) && u.completion_tokens >= 0, `usage.completion_tokens ${u.completion_tokens}`);
  equal(u.total_tokens, u.prompt_tokens + u.completion_tokens, 'usage.total_tokens');
}

await check('models.list: the one model, its file name as id', async () => {
  const list = await client.models.list();
  equal(list.data.length, 1, 'number of models');
  equal(list.data[0].id, modelId, 'id');
  equal(list.data[0].object, 'model', 'object');
  equal(list.data[0].owned_by, 'npulm', 'owned_by');
  assert(Number.isInteger(list.data[0].created), `created ${list.data[0].created}`);
});

let greedy = null; /* the greedy 16-token completion of `prompt`, for the checks after */
await check('completions.create: greedy, 16 tokens, finish_reason length, usage', async () => {
  const r = await client.completions.create({ model: modelId, prompt, max_tokens: 16, temperature: 0 });
  assert(/^cmpl-/.test(r.id), `id ${r.id}`);
  equal(r.object, 'text_completion', 'object');
  equal(r.model, modelId, 'model');
  assert(Number.isInteger(r.created) && Math.abs(r.created - Date.now() / 1000) < 3600, `created ${r.created}`);
  equal(r.choices.length, 1, 'choices');
  equal(r.choices[0].index, 0, 'index');
  equal(r.choices[0].finish_reason, 'length', 'finish_reason');
  assert(typeof r.choices[0].text === 'string' && r.choices[0].text.trim().length > 0, `text ${JSON.stringify(r.choices[0].text)}`);
  usageOf(r.usage, 16);
  greedy = r;
});

await check('completions.create: greedy is deterministic', async () => {
  const r = await client.completions.create({ prompt, max_tokens: 16, temperature: 0 });
  equal(r.choices[0].text, greedy.choices[0].text, 'text');
  equal(r.usage.prompt_tokens, greedy.usage.prompt_tokens, 'prompt_tokens');
});

await check('completions.create: stream gives the same text in pieces, then finish_reason and usage', async () => {
  const stream = await client.completions.create({ prompt, max_tokens: 16, temperature: 0, stream: true });
  let text = '';
  let last = null;
  let pieces = 0;
  for await (const chunk of stream) {
    equal(chunk.object, 'text_completion', 'chunk object');
    assert(/^cmpl-/.test(chunk.id), `chunk id ${chunk.id}`);
    const c = chunk.choices[0];
    if (c) {
      text += c.text || '';
      if (c.text) pieces++;
    }
    last = chunk;
  }
  equal(text, greedy.choices[0].text, 'streamed text');
  assert(pieces >= 2, `${pieces} pieces: not streamed`);
  equal(last.choices[0].finish_reason, 'length', 'last finish_reason');
  usageOf(last.usage, 16);
  equal(last.usage.prompt_tokens, greedy.usage.prompt_tokens, 'prompt_tokens');
});

await check('completions.create: max_tokens 1 gives one token', async () => {
  const r = await client.completions.create({ prompt, max_tokens: 1, temperature: 0 });
  usageOf(r.usage, 1);
  equal(r.choices[0].finish_reason, 'length', 'finish_reason');
  assert(greedy.choices[0].text.startsWith(r.choices[0].text) && r.choices[0].text.length > 0,
    `${JSON.stringify(r.choices[0].text)} does not start ${JSON.stringify(greedy.choices[0].text)}`);
});

/* a word from the middle of the greedy text: generation stops there, without it */
function stopWord() {
  const t = greedy.choices[0].text;
  const words = t.split(/\s+/).filter((w) => /^[a-z]{3,}$/i.test(w));
  const w = words[Math.min(2, words.length - 1)];
  if (!w) fail(`no word to stop at in ${JSON.stringify(t)}`);
  return { stop: ' ' + w, want: t.slice(0, t.indexOf(' ' + w)) };
}

await check('completions.create: a stop string ends it, not included, finish_reason stop', async () => {
  const { stop, want } = stopWord();
  const r = await client.completions.create({ prompt, max_tokens: 16, temperature: 0, stop: [stop, 'zzzzqqq'] });
  equal(r.choices[0].text, want, `text with stop ${JSON.stringify(stop)}`);
  equal(r.choices[0].finish_reason, 'stop', 'finish_reason');
  usageOf(r.usage);
});

await check('completions.create: a stop string (a plain string) while streaming', async () => {
  const { stop, want } = stopWord();
  const stream = await client.completions.create({ prompt, max_tokens: 16, temperature: 0, stop, stream: true });
  let text = '';
  let reason = null;
  for await (const chunk of stream) {
    if (!chunk.choices[0]) continue;
    text += chunk.choices[0].text || '';
    if (chunk.choices[0].finish_reason) reason = chunk.choices[0].finish_reason;
  }
  equal(text, want, `streamed text with stop ${JSON.stringify(stop)}`);
  equal(reason, 'stop', 'finish_reason');
});

await check('completions.create: the same seed samples the same text at temperature 1', async () => {
  const req = { prompt, max_tokens: 24, temperature: 1, seed: 1234 };
  const a = await client.completions.create(req);
  const b = await client.completions.create(req);
  equal(b.choices[0].text, a.choices[0].text, 'text');
});

await check('completions.create: top_k 1 at temperature 1 is greedy', async () => {
  const r = await client.completions.create({ prompt, max_tokens: 16, temperature: 1, top_k: 1 });
  equal(r.choices[0].text, greedy.choices[0].text, 'text');
});

const messages = [
  { role: 'system', content: 'You are a storyteller.' },
  { role: 'user', content: 'Tell me a story about a cat.' },
];
let chat = null;
await check('chat.completions.create: greedy, assistant message, finish_reason, usage', async () => {
  const r = await client.chat.completions.create({ model: modelId, messages, max_tokens: 24, temperature: 0 });
  assert(/^chatcmpl-/.test(r.id), `id ${r.id}`);
  equal(r.object, 'chat.completion', 'object');
  equal(r.model, modelId, 'model');
  equal(r.choices.length, 1, 'choices');
  equal(r.choices[0].index, 0, 'index');
  equal(r.choices[0].message.role, 'assistant', 'role');
  assert(typeof r.choices[0].message.content === 'string', `content ${r.choices[0].message.content}`);
  assert(['stop', 'length'].includes(r.choices[0].finish_reason), `finish_reason ${r.choices[0].finish_reason}`);
  usageOf(r.usage);
  if (r.choices[0].finish_reason === 'length') equal(r.usage.completion_tokens, 24, 'completion_tokens at length');
  assert(r.usage.completion_tokens <= 24, `completion_tokens ${r.usage.completion_tokens} > max_tokens`);
  /* the template wraps the messages: more prompt tokens than the two texts alone */
  const bare = await client.completions.create({ prompt: messages.map((m) => m.content).join(''), max_tokens: 1 });
  assert(r.usage.prompt_tokens > bare.usage.prompt_tokens,
    `prompt_tokens ${r.usage.prompt_tokens}: no more than the bare texts' ${bare.usage.prompt_tokens}`);
  chat = r;
});

await check('chat.completions.create: stream, role first, same content, finish_reason, usage', async () => {
  const stream = await client.chat.completions.create({ messages, max_tokens: 24, temperature: 0, stream: true });
  let text = '';
  let first = null;
  let last = null;
  for await (const chunk of stream) {
    equal(chunk.object, 'chat.completion.chunk', 'chunk object');
    assert(/^chatcmpl-/.test(chunk.id), `chunk id ${chunk.id}`);
    if (!first) first = chunk;
    if (chunk.choices[0] && chunk.choices[0].delta) text += chunk.choices[0].delta.content || '';
    last = chunk;
  }
  equal(first.choices[0].delta.role, 'assistant', 'first delta.role');
  equal(text, chat.choices[0].message.content, 'streamed content');
  equal(last.choices[0].finish_reason, chat.choices[0].finish_reason, 'last finish_reason');
  usageOf(last.usage, chat.usage.completion_tokens);
});

await check('chat.completions.create: a multi-turn conversation', async () => {
  const r = await client.chat.completions.create({
    messages: [...messages, { role: 'assistant', content: 'Once there was a cat.' }, { role: 'user', content: 'And then?' }],
    max_tokens: 8,
  });
  equal(r.choices[0].message.role, 'assistant', 'role');
  assert(r.usage.prompt_tokens > chat.usage.prompt_tokens, 'the longer conversation has no more prompt tokens');
});

await check('a wrong API key is the client\'s AuthenticationError (401)', async () => {
  const bad = new OpenAI({ baseURL, apiKey: apiKey + 'x', maxRetries: 0 });
  try {
    await bad.completions.create({ prompt, max_tokens: 4 });
  } catch (e) {
    assert(e instanceof OpenAI.AuthenticationError, `got ${e && e.constructor && e.constructor.name}: ${e}`);
    equal(e.status, 401, 'status');
    assert(typeof e.error?.message === 'string' && e.error.message.length > 0, `error ${JSON.stringify(e.error)}`);
    return;
  }
  fail('the request succeeded');
});

await check('an unknown model is the client\'s NotFoundError (404, model_not_found)', async () => {
  try {
    await client.chat.completions.create({ model: 'gpt-4o', messages, max_tokens: 4 });
  } catch (e) {
    assert(e instanceof OpenAI.NotFoundError, `got ${e && e.constructor && e.constructor.name}: ${e}`);
    equal(e.code, 'model_not_found', 'code');
    return;
  }
  fail('the request succeeded');
});

await check('temperature 3 is the client\'s BadRequestError (400, invalid_request_error)', async () => {
  try {
    await client.completions.create({ prompt, max_tokens: 4, temperature: 3 });
  } catch (e) {
    assert(e instanceof OpenAI.BadRequestError, `got ${e && e.constructor && e.constructor.name}: ${e}`);
    equal(e.type, 'invalid_request_error', 'type');
    return;
  }
  fail('the request succeeded');
});

/* the wire format under the client: the SSE framing exactly as the spec gives it */
await check('raw stream: text/event-stream, "data: {json}\\n\\n" events, then "data: [DONE]"', async () => {
  const res = await request('POST', '/v1/chat/completions', { messages, max_tokens: 6, temperature: 0, stream: true });
  equal(res.status, 200, 'status');
  assert(/^text\/event-stream/.test(res.headers['content-type'] || ''), `Content-Type ${res.headers['content-type']}`);
  assert(res.text.endsWith('\n\n'), 'the body does not end with a blank line');
  const events = sseEvents(res.text);
  equal(events[events.length - 1], '[DONE]', 'last event');
  const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
  assert(chunks.length >= 2, `${chunks.length} chunks`);
  const final = chunks[chunks.length - 1];
  assert(final.choices[0].finish_reason, 'no finish_reason in the final chunk');
  assert(chunks.slice(0, -1).every((c) => !c.choices[0] || !c.choices[0].finish_reason),
    'a finish_reason before the final chunk');
  assert(new Set(chunks.map((c) => c.id)).size === 1, 'the chunks have different ids');
});

done();
