// `npulm serve` against malformed and hostile clients, over raw sockets: bad JSON, every field of
// the wrong type or out of range, unknown paths, methods and models, missing or wrong API keys,
// oversize and lying bodies, invalid UTF-8, prompts past the context, slowloris connections,
// more connections than --max-connections, clients that vanish mid-request. Each must get the
// status the spec gives and, where the server itself answers, OpenAI's error object; afterwards
// the server must still be healthy. The server runs with the options below (the environment
// says them; tests/cli/test_serve_clients.sh starts it so). Prints TAP.
import {
  apiKey, assert, check, complete, done, equal, errorObject, exchange, fail, json, modelId,
  parseResponse, request, requestBytes, sleep, sseEvents,
} from './lib.mjs';

const timeoutS = Number(process.env.NPULM_SERVE_TIMEOUT || 2); /* --timeout */
const maxConnections = Number(process.env.NPULM_SERVE_MAX_CONNECTIONS || 8); /* --max-connections */
const maxBody = Number(process.env.NPULM_SERVE_MAX_BODY || 65536); /* --max-body */
const nCtx = Number(process.env.NPULM_SERVE_CTX || 256); /* the slot's context (-c) */
/* and --parallel 1, so that a slot a vanished client kept would block the next request */

const C = '/v1/completions';
const CHAT = '/v1/chat/completions';
const ok = { prompt: 'Once', max_tokens: 2 };
const okChat = { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 };
const utf8 = new TextDecoder('utf-8', { fatal: true });

/* NAME: BODY sent to PATH gets STATUS and the error object (of type invalid_request_error for 400) */
async function bad(name, path, body, status = 400, want = {}) {
  await check(name, async () => {
    const res = await request('POST', path, body);
    errorObject(res, status, status === 400 ? { type: 'invalid_request_error', ...want } : want);
  });
}

/* NAME: BODY is accepted: a well-formed 200 answer */
async function good(name, path, body, more = () => {}) {
  await check(name, async () => {
    const res = await request('POST', path, body);
    if (res.status !== 200) fail(`status ${res.status}, want 200: ${res.text.slice(0, 300)}`);
    assert(/^application\/json/.test(res.headers['content-type'] || ''), `Content-Type ${res.headers['content-type']}`);
    const j = json(res);
    assert(j.choices && j.choices[0] && ['stop', 'length'].includes(j.choices[0].finish_reason),
      `no choices[0] with a finish_reason: ${res.text.slice(0, 200)}`);
    more(j);
  });
}

/* NAME: BODY is either refused (400 with the error object) or served (200): both are right */
async function either(name, path, body) {
  await check(name, async () => {
    const res = await request('POST', path, body);
    if (res.status === 200) json(res);
    else errorObject(res, 400, { type: 'invalid_request_error' });
  });
}

const withField = (base, field, value) => Buffer.from(JSON.stringify(base).slice(0, -1) + `,"${field}":${value}}`);
const raw = (s) => Buffer.from(s, 'latin1');

/* ---- malformed JSON ---------------------------------------------------------------------------- */
await bad('json: truncated object', C, '{"prompt": "Once", "max_tokens": 2');
await bad('json: truncated inside a string', C, '{"prompt": "On');
await bad('json: trailing garbage', C, '{"prompt":"Once","max_tokens":2} xyz');
await bad('json: two objects', C, '{"prompt":"Once"}{"prompt":"Twice"}');
await bad('json: empty body', C, '');
await bad('json: whitespace only', C, ' \r\n\t ');
await bad('json: an array, not an object', C, '[{"prompt":"Once"}]');
await bad('json: a string, not an object', C, '"Once"');
await bad('json: a number, not an object', C, '42');
await bad('json: null, not an object', C, 'null');
await bad('json: true, not an object', C, 'true');
await bad('json: single quotes', C, "{'prompt':'Once'}");
await bad('json: trailing comma', C, '{"prompt":"Once",}');
await bad('json: unquoted key', C, '{prompt:"Once"}');
await bad('json: 20000 nested arrays', C, `{"prompt":"Once","x":${'['.repeat(20000)}${']'.repeat(20000)}}`);
await bad('json: 10000 nested objects', C, `${'{"a":'.repeat(10000)}1${'}'.repeat(10000)}`);
await bad('json: 30000 unclosed arrays', C, '['.repeat(30000));
await bad('json: bad escape \\x41', C, '{"prompt":"\\x41","max_tokens":2}');
await bad('json: lone surrogate \\ud800', C, '{"prompt":"a\\ud800b","max_tokens":2}');
await bad('json: raw newline inside a string', C, '{"prompt":"a\nb","max_tokens":2}');
await bad('json: max_tokens 1e400 overflows', C, '{"prompt":"Once","max_tokens":1e400}');
await bad('json: max_tokens 10^23 overflows', C, '{"prompt":"Once","max_tokens":100000000000000000000000}');
await bad('json: NaN', C, '{"prompt":"Once","temperature":NaN}');
await bad('json: Infinity', C, '{"prompt":"Once","temperature":Infinity}');
await bad('json: hex number', C, '{"prompt":"Once","max_tokens":0x10}');
await bad('json: chat body truncated', CHAT, '{"messages":[{"role":"user","content":"hi"}');
await either('json: \\u0000 inside the prompt', C, '{"prompt":"a\\u0000b","max_tokens":2}');

/* ---- invalid UTF-8: JSON text is UTF-8 (RFC 8259 8.1), so these are not JSON: 400 -------------- */
await bad('utf-8: bytes ff fe in the prompt', C, raw('{"prompt":"a\xff\xfeb","max_tokens":2}'));
await bad('utf-8: overlong c0 af', C, raw('{"prompt":"a\xc0\xafb","max_tokens":2}'));
await bad('utf-8: encoded surrogate ed a0 80', C, raw('{"prompt":"a\xed\xa0\x80b","max_tokens":2}'));
await bad('utf-8: truncated sequence e4 b8 before the quote', C, raw('{"prompt":"a\xe4\xb8","max_tokens":2}'));
await bad('utf-8: invalid byte in a chat message', CHAT, raw('{"messages":[{"role":"user","content":"\x80"}],"max_tokens":2}'));
await good('utf-8: valid multibyte prompt is served', C, { prompt: 'Ünïcödé 日本語 😀 Once', max_tokens: 4 });

/* ---- completions: every field of the wrong type or out of range --------------------------------- */
for (const [v, what] of [['5', 'a number'], ['1.5', 'a real'], ['[1,2,3]', 'an array of numbers'], ['null', 'null'],
  ['true', 'a boolean'], ['{}', 'an object']]) {
  await bad(`prompt: ${what}`, C, withField({ max_tokens: 2 }, 'prompt', v));
}
await bad('prompt: missing', C, { max_tokens: 2 });
for (const [v, what] of [['-1', '-1'], ['1.5', '1.5'], ['"10"', 'the string "10"'], ['1e30', '1e30'],
  ['5000', 'above --max-tokens 4096'], ['9007199254740993', '2^53+1'], ['true', 'a boolean'], ['[]', 'an array'],
  ['{}', 'an object']]) {
  await bad(`max_tokens: ${what}`, C, withField({ prompt: 'Once' }, 'max_tokens', v));
}
await check('max_tokens: 0 gives no tokens, or is refused', async () => {
  const res = await request('POST', C, { prompt: 'Once', max_tokens: 0 });
  if (res.status !== 200) return void errorObject(res, 400, { type: 'invalid_request_error' });
  const j = json(res);
  equal(j.choices[0].text, '', 'text');
  equal(j.usage.completion_tokens, 0, 'completion_tokens');
});
await good('max_tokens: 4096 stops at the context end with "length"', C, { prompt: 'Once', max_tokens: 4096, temperature: 0 }, (j) => {
  assert(j.usage.total_tokens <= nCtx, `total_tokens ${j.usage.total_tokens} > context ${nCtx}`);
  if (j.choices[0].finish_reason === 'length') assert(j.usage.total_tokens >= nCtx - 1, `"length" at ${j.usage.total_tokens} tokens, before the context end ${nCtx}`);
});
for (const [v, what] of [['-1', '-1'], ['3', '3'], ['2.0001', '2.0001'], ['-0.0001', '-0.0001'], ['"x"', 'a string'],
  ['true', 'a boolean'], ['[1]', 'an array']]) {
  await bad(`temperature: ${what}`, C, withField(ok, 'temperature', v));
}
await good('temperature: 0 is served', C, { ...ok, temperature: 0 });
await good('temperature: 2 is served', C, { ...ok, temperature: 2 });
for (const [v, what] of [['0', '0'], ['2', '2'], ['-0.5', '-0.5'], ['1.0001', '1.0001'], ['"x"', 'a string']]) {
  await bad(`top_p: ${what}`, C, withField(ok, 'top_p', v));
}
await good('top_p: 1 is served', C, { ...ok, top_p: 1 });
await good('top_p: 0.5 is served', C, { ...ok, top_p: 0.5 });
for (const [v, what] of [['-1', '-1'], ['1.5', '1.5'], ['"x"', 'a string'], ['true', 'a boolean']]) {
  await bad(`top_k: ${what}`, C, withField(ok, 'top_k', v));
}
await good('top_k: 40 is served', C, { ...ok, top_k: 40 });
for (const [v, what] of [['"x"', 'a string'], ['1.5', '1.5'], ['{}', 'an object']]) {
  await bad(`seed: ${what}`, C, withField(ok, 'seed', v));
}
await bad('stop: five strings', C, { ...ok, stop: ['a', 'b', 'c', 'd', 'e'] });
for (const [v, what] of [['5', 'a number'], ['[1]', 'an array of a number'], ['["a",5]', 'an array with a number'],
  ['{}', 'an object'], ['true', 'a boolean']]) {
  await bad(`stop: ${what}`, C, withField(ok, 'stop', v));
}
await good('stop: four strings are served', C, { ...ok, stop: ['a', 'b', 'c', 'd'] });
for (const [v, what] of [['"yes"', 'the string "yes"'], ['1', 'a number'], ['{}', 'an object']]) {
  await bad(`stream: ${what}`, C, withField(ok, 'stream', v));
}
await bad('model: a number', C, { ...ok, model: 5 });
await bad('model: unknown, 404 model_not_found', C, { ...ok, model: 'gpt-4' }, 404, { code: 'model_not_found' });
await bad('model: empty string, 404 model_not_found', C, { ...ok, model: '' }, 404, { code: 'model_not_found' });
await good('model: its own id is served', C, { ...ok, model: modelId });
await good('unknown fields are ignored', C, { ...ok, user: 'u', frobnicate: [1, { a: 2 }], logit_bias: {} });

/* ---- chat: messages of every wrong shape --------------------------------------------------------- */
for (const [v, what] of [[undefined, 'missing'], ['"hi"', 'a string'], ['{}', 'an object'], ['[]', 'empty'],
  ['[5]', 'a number in it'], ['[null]', 'a null in it'], ['[[]]', 'an array in it'],
  ['[{"content":"hi"}]', 'a message without role'], ['[{"role":"user"}]', 'a message without content'],
  ['[{"role":"wizard","content":"hi"}]', 'an unknown role'], ['[{"role":5,"content":"hi"}]', 'a role that is a number'],
  ['[{"role":"user","content":5}]', 'content a number'], ['[{"role":"user","content":null}]', 'content null'],
  ['[{"role":"user","content":{"text":"hi"}}]', 'content an object'],
  ['[{"role":"user","content":"hi"},{"role":"user"}]', 'a second message without content']]) {
  await bad(`messages: ${what}`, CHAT, v === undefined ? { max_tokens: 2 } : withField({ max_tokens: 2 }, 'messages', v));
}
await bad('chat: temperature 3', CHAT, { ...okChat, temperature: 3 });
await bad('chat: max_tokens -1', CHAT, { ...okChat, max_tokens: -1 });
await bad('chat: stream "yes"', CHAT, { ...okChat, stream: 'yes' });
await bad('chat: stop a number', CHAT, { ...okChat, stop: 5 });
await bad('chat: unknown model, 404 model_not_found', CHAT, { ...okChat, model: 'gpt-4o' }, 404, { code: 'model_not_found' });

/* ---- the context ----------------------------------------------------------------------------------- */
const story = 'Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. ';
const long = story.repeat(Math.ceil((nCtx * 6) / story.length));
await bad('context: a prompt longer than the context', C, { prompt: long, max_tokens: 2 });
await bad('context: chat messages longer than the context', CHAT, { messages: [{ role: 'user', content: long }], max_tokens: 2 });
await bad('context: a long prompt, streaming, is refused before the stream', C, { prompt: long, max_tokens: 2, stream: true });
await good('context: prompt + max_tokens past the context stops with "length" there', C,
  { prompt: story.repeat(4), max_tokens: nCtx, temperature: 0 }, (j) => {
    assert(j.usage.total_tokens <= nCtx, `total_tokens ${j.usage.total_tokens} > context ${nCtx}`);
    assert(j.usage.completion_tokens < nCtx, `completion_tokens ${j.usage.completion_tokens}`);
  });

/* ---- paths, methods, keys ---------------------------------------------------------------------------- */
async function status(name, method, path, want, opts = {}) {
  await check(name, async () => {
    const res = await request(method, path, opts.body ?? null, opts.headers ?? {});
    errorObject(res, want, opts.want ?? {});
  });
}
await status('path: GET /nope is 404', 'GET', '/nope', 404);
await status('path: GET / is 404', 'GET', '/', 404);
await status('path: POST /v1/nope is 404', 'POST', '/v1/nope', 404, { body: ok });
await status('path: POST /v1/completions/x is 404', 'POST', '/v1/completions/x', 404, { body: ok });
await status('path: GET /v1 is 404', 'GET', '/v1', 404);
await status('path: GET /v1/../../etc/passwd is 404', 'GET', '/v1/../../etc/passwd', 404);
await status('method: GET /v1/completions is 405', 'GET', C, 405);
await status('method: GET /v1/chat/completions is 405', 'GET', CHAT, 405);
await status('method: PUT /v1/completions is 405', 'PUT', C, 405, { body: ok });
await status('method: DELETE /v1/models is 405', 'DELETE', '/v1/models', 405);
await status('method: POST /health is 405', 'POST', '/health', 405, { body: ok });
await status('method: POST /v1/models is 405', 'POST', '/v1/models', 405, { body: ok });
await status('method: PATCH /v1/chat/completions is 405', 'PATCH', CHAT, 405, { body: okChat });
await check('method: a 405 says the allowed method in Allow (RFC 9110 15.5.6)', async () => {
  const res = await request('GET', C);
  equal(res.status, 405, 'status');
  assert(/\bPOST\b/.test(res.headers.allow || ''), `Allow: ${JSON.stringify(res.headers.allow)}`);
});
if (apiKey) {
  await status('key: no Authorization is 401', 'POST', C, 401, { body: ok, headers: { Authorization: null } });
  await status('key: a wrong key is 401', 'POST', C, 401, { body: ok, headers: { Authorization: `Bearer ${apiKey}x` } });
  await status('key: the key less its last character is 401', 'POST', C, 401, { body: ok, headers: { Authorization: `Bearer ${apiKey.slice(0, -1)}` } });
  await status('key: Basic, not Bearer, is 401', 'POST', C, 401, { body: ok, headers: { Authorization: `Basic ${apiKey}` } });
  await status('key: "Bearer" alone is 401', 'POST', C, 401, { body: ok, headers: { Authorization: 'Bearer' } });
  await status('key: the key without "Bearer " is 401', 'POST', C, 401, { body: ok, headers: { Authorization: apiKey } });
  await status('key: chat without a key is 401', 'POST', CHAT, 401, { body: okChat, headers: { Authorization: null } });
  await check('key: /health needs no key', async () => {
    const res = await request('GET', '/health', null, { Authorization: null });
    equal(res.status, 200, 'status');
  });
}

/* ---- bodies: too big, lying, chunked --------------------------------------------------------------- */
const bigPrompt = { prompt: 'x'.repeat(maxBody + 4096), max_tokens: 2 };
await bad(`body: ${maxBody + 4096} bytes with Content-Length is 413`, C, bigPrompt, 413);
await check('body: too big sent chunked is 413', async () => {
  const body = Buffer.from(JSON.stringify(bigPrompt));
  const parts = [requestBytes('POST', C, null, { 'Transfer-Encoding': 'chunked', 'Content-Type': 'application/json' })];
  for (let p = 0; p < body.length; p += 8192) {
    const piece = body.subarray(p, p + 8192);
    parts.push(Buffer.concat([Buffer.from(`${piece.length.toString(16)}\r\n`), piece, Buffer.from('\r\n')]));
  }
  parts.push(Buffer.from('0\r\n\r\n'));
  const res = parseResponse((await exchange(parts, { until: complete })).data);
  assert(res, 'no response');
  errorObject(res, 413);
});
await check('body: a small chunked body is served', async () => {
  const body = JSON.stringify(ok);
  const res = parseResponse((await exchange([requestBytes('POST', C, null, { 'Transfer-Encoding': 'chunked', 'Content-Type': 'application/json' }),
    `${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`], { until: complete })).data);
  assert(res, 'no response');
  equal(res.status, 200, `status (${res && res.text.slice(0, 200)})`);
});
await check('body: Content-Length 10 GB, no body sent: 413 at once', async () => {
  const r = await exchange([requestBytes('POST', C, null, { 'Content-Length': '10000000000', 'Content-Type': 'application/json' })],
    { until: complete, timeoutMs: 3000 });
  const res = parseResponse(r.data);
  assert(res, `no response in ${r.ms} ms`);
  errorObject(res, 413);
});
await check('body: Expect 100-continue with a 2 MB Content-Length: 413, not 100', async () => {
  const r = await exchange([requestBytes('POST', C, null, { 'Content-Length': '2000000', 'Content-Type': 'application/json', Expect: '100-continue' })],
    { until: complete, timeoutMs: 3000 });
  assert(!/^HTTP\/1\.1 100/.test(r.data.toString('latin1')), 'the server asked for the body');
  const res = parseResponse(r.data);
  assert(res, `no response in ${r.ms} ms`);
  errorObject(res, 413);
});
for (const [cl, what] of [['99999999999999999999999', 'past 64 bits'], ['-5', 'negative'], ['abc', 'not a number'], ['5, 7', 'two values']]) {
  await check(`body: Content-Length ${what}: 400 or 413, at once`, async () => {
    const r = await exchange([requestBytes('POST', C, null, { 'Content-Length': cl, 'Content-Type': 'application/json' }), JSON.stringify(ok)],
      { until: complete, timeoutMs: 3000 });
    const res = parseResponse(r.data);
    if (!res) assert(r.closed, `no answer in ${r.ms} ms`);
    else assert(res.status === 400 || res.status === 413, `status ${res.status}`);
  });
}

/* ---- the HTTP layer itself: answered with a 4xx/5xx or closed, never a hang ---------------------- */
async function refused(name, parts) {
  await check(name, async () => {
    const r = await exchange(parts, { until: complete, timeoutMs: 4000 });
    const res = parseResponse(r.data);
    if (!res) assert(r.closed, `neither answered nor closed in ${r.ms} ms`);
    else assert(res.status >= 400 && res.status < 600, `status ${res.status}`);
  });
}
await refused('http: a 100 KB URL', [`GET /${'a'.repeat(100000)} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`]);
await refused('http: a 100 KB header', [`GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'b'.repeat(100000)}\r\nConnection: close\r\n\r\n`]);
await refused('http: 5000 headers', [`GET /health HTTP/1.1\r\nHost: x\r\n${'X-A: b\r\n'.repeat(5000)}Connection: close\r\n\r\n`]);
await refused('http: a garbage request line', ['GARBAGE\r\n\r\n']);
await refused('http: HTTP/9.9', ['GET /health HTTP/9.9\r\nHost: x\r\n\r\n']);
await refused('http: a NUL byte in the path', [raw('GET /he\x00alth HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n')]);
await refused('http: binary noise', [Buffer.from(Array.from({ length: 4096 }, (_, i) => (i * 7919 + 13) & 255))]);
/* a server may close after any answer (RFC 9112 9.3.2), if it says so: then the second needs none */
await check('http: two pipelined requests: two answers, or the first says Connection: close', async () => {
  const first = requestBytes('GET', '/health', null, { Connection: 'keep-alive' });
  const r = await exchange([Buffer.concat([first, requestBytes('GET', '/v1/models')])], {
    timeoutMs: 4000,
    until: (d) => { const a = parseResponse(d); return a && a.end !== null && complete(d.subarray(a.end)); },
  });
  const a = parseResponse(r.data);
  assert(a && a.end !== null, 'no first answer');
  equal(a.status, 200, 'first status');
  const b = parseResponse(r.data.subarray(a.end));
  if (!b && /close/i.test(a.headers.connection || '')) return;
  assert(b, 'no second answer, and the first did not say Connection: close');
  equal(b.status, 200, 'second status');
  equal(json(b).data[0].id, modelId, 'second answer\'s model');
});

/* ---- sampling into the middle of UTF-8 sequences: the answers stay valid UTF-8 JSON ---------------- */
await check('utf-8: temperature 2 from a non-ASCII prompt gives valid UTF-8 JSON (8 seeds)', async () => {
  for (let seed = 1; seed <= 8; seed++) {
    const res = await request('POST', C, { prompt: 'Ünïcödé 日本語 😀', max_tokens: 48, temperature: 2, seed });
    equal(res.status, 200, `seed ${seed} status`);
    utf8.decode(res.body);
    json(res);
  }
});
await check('utf-8: the same, streamed chat: every event valid UTF-8 JSON (8 seeds)', async () => {
  for (let seed = 1; seed <= 8; seed++) {
    const res = await request('POST', CHAT, { messages: [{ role: 'user', content: '日本語 😀 Ünïcödé' }], max_tokens: 48, temperature: 2, seed, stream: true });
    equal(res.status, 200, `seed ${seed} status`);
    const events = sseEvents(utf8.decode(res.body));
    equal(events[events.length - 1], '[DONE]', 'last event');
    for (const e of events.slice(0, -1)) JSON.parse(e);
  }
});

/* ---- slowloris: every connection that has not sent its request within --timeout is closed --------- */
const bound = (timeoutS + 3) * 1000;
const slow = {
  'nothing sent': [],
  'headers one byte every 300 ms': [...'GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ' + 'a'.repeat(60)].flatMap((c) => [c, 300]),
  'headers done, 10 of 100 body bytes': [requestBytes('POST', C, null, { 'Content-Length': '100', 'Content-Type': 'application/json' }), '{"prompt":'],
  'body one byte every 300 ms': [requestBytes('POST', C, null, { 'Content-Length': '100', 'Content-Type': 'application/json' }),
    ...'{"prompt":"' .concat('a'.repeat(80)).split('').flatMap((c) => [c, 300])],
};
const t0 = Date.now();
const held = Object.entries(slow).map(([what, parts]) => [what, exchange(parts, { timeoutMs: bound + 2000 })]);
await sleep(300);
await check('slowloris: /health answers while four slow connections are held', async () => {
  const t = Date.now();
  const res = await request('GET', '/health', null, {}, 2000);
  equal(res.status, 200, 'status');
  assert(Date.now() - t < 1000, `took ${Date.now() - t} ms`);
});
for (const [what, p] of held) {
  await check(`slowloris: ${what}: closed within --timeout ${timeoutS} s (bound ${bound / 1000} s)`, async () => {
    const r = await p;
    assert(r.closed && !r.timedOut, `still open after ${Date.now() - t0} ms`);
    assert(r.ms <= bound, `closed after ${r.ms} ms`);
    const res = parseResponse(r.data);
    if (res) equal(res.status, 408, 'the status before closing');
  });
}

/* ---- more connections than --max-connections: refused or 503 at once, never left waiting (24 more:
 * past the few a server may still answer 503 before it refuses outright) ------------------------------ */
await check(`connections: beyond --max-connections ${maxConnections}: refused or 503 within 1.2 s`, async () => {
  const holders = Array.from({ length: maxConnections }, () => exchange([], { timeoutMs: bound }));
  await sleep(300);
  const extra = await Promise.all(Array.from({ length: 24 }, () =>
    exchange([requestBytes('GET', '/health')], { until: complete, timeoutMs: 1200 })));
  for (const r of extra) {
    const res = parseResponse(r.data);
    if (res) errorObject(res, 503);
    else assert(r.closed, `neither refused nor answered in ${r.ms} ms (a hang until a connection frees)`);
  }
  await Promise.all(holders);
});
await check('connections: after they are gone, /health answers', async () => {
  equal((await request('GET', '/health', null, {}, 3000)).status, 200, 'status');
});

/* ---- clients that vanish: the server goes on, and the one slot (--parallel 1) is freed ------------ */
/* a request of 8 tokens completes within LIMIT_MS; a 503 while the server has yet to see the
 * vanished connections close (its count of open ones lags a little) is retried within the limit */
async function prompt8(limitMs) {
  const t = Date.now();
  let res;
  for (;;) {
    res = await request('POST', C, { prompt: 'Once', max_tokens: 8, temperature: 0 }, {}, limitMs + 1000);
    if (res.status !== 503 || Date.now() - t > limitMs) break;
    await sleep(50);
  }
  if (res.status !== 200) fail(`status ${res.status}: ${res.text.slice(0, 200)}`);
  equal(json(res).usage.completion_tokens, 8, 'completion_tokens');
  assert(Date.now() - t <= limitMs, `took ${Date.now() - t} ms`);
}
const endless = { prompt: 'Once upon a time', max_tokens: 4096, temperature: 1, stream: true };
await check('vanish: a client gone after the first streamed event: the next request completes promptly', async () => {
  const r = await exchange([requestBytes('POST', C, endless)], { until: (d) => d.includes('\ndata: ') });
  assert(!r.closed && !r.timedOut, `no stream began (${r.data.toString().slice(0, 200)})`);
  await prompt8(2000);
});
await check('vanish: a client gone while its answer is computed', async () => {
  await exchange([requestBytes('POST', C, { ...endless, stream: false })], { timeoutMs: 20 });
  await prompt8(2000);
});
await check('vanish: a chat client gone mid-stream', async () => {
  const r = await exchange([requestBytes('POST', CHAT, { messages: [{ role: 'user', content: 'Go on.' }], max_tokens: 4096, stream: true })],
    { until: (d) => d.includes('\ndata: ') });
  assert(!r.closed && !r.timedOut, 'no stream began');
  await prompt8(2000);
});
await check('vanish: twenty clients gone mid-stream in a row, then a request completes promptly', async () => {
  for (let i = 0; i < 20; i++) {
    await exchange([requestBytes('POST', C, { ...endless, seed: i })], { until: (d) => d.includes('\ndata: ') });
  }
  await prompt8(3000);
});
await check('vanish: eight clients gone at once with their streams queued on the one slot', async () => {
  await Promise.all(Array.from({ length: 8 }, (_, i) => exchange([requestBytes('POST', C, { ...endless, seed: 100 + i })], { timeoutMs: 50 })));
  await prompt8(3000);
});
await check('vanish: a client gone half-way through sending its body', async () => {
  await exchange([requestBytes('POST', C, null, { 'Content-Length': '1000', 'Content-Type': 'application/json' }), '{"prompt":"Once'], { timeoutMs: 50 });
  await prompt8(2000);
});

/* ---- a burst on the one slot: every request served, or refused with 503, none left hanging ------- */
await check(`burst: 30 requests at once on one slot and ${maxConnections} connections: each 200 or 503, within 20 s`, async () => {
  const t = Date.now();
  const all = await Promise.all(Array.from({ length: 30 }, (_, i) =>
    exchange([requestBytes('POST', i % 2 ? CHAT : C, i % 2 ? { ...okChat, max_tokens: 64 } : { prompt: 'Once', max_tokens: 64, stream: i % 4 === 0 })],
      { until: complete, timeoutMs: 20000 })));
  let served = 0;
  for (const r of all) {
    const res = parseResponse(r.data);
    if (!res) fail(`a request neither answered nor refused (${r.timedOut ? 'timed out' : 'closed'} after ${r.ms} ms)`);
    if (res.status === 200) served++;
    else errorObject(res, 503);
  }
  assert(served > 0, 'none served');
  assert(Date.now() - t < 20000, `took ${Date.now() - t} ms`);
});

/* ---- afterwards ------------------------------------------------------------------------------------- */
await check('after all that: /health is 200 {"status":"ok"}', async () => {
  const res = await request('GET', '/health', null, { Authorization: null });
  equal(res.status, 200, 'status');
  equal(json(res).status, 'ok', 'status field');
});
await check('after all that: a normal completion works', async () => {
  const res = await request('POST', C, { prompt: 'Once upon a time', max_tokens: 16, temperature: 0 });
  equal(res.status, 200, 'status');
  const j = json(res);
  equal(j.usage.completion_tokens, 16, 'completion_tokens');
  equal(j.choices[0].finish_reason, 'length', 'finish_reason');
});

done();
