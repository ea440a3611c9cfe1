// Shared by the `npulm serve` client tests: TAP output, the server's address from the environment
// (set by tests/cli/test_serve_clients.sh), and a raw HTTP/1.1 client over net sockets, so that a
// test controls every byte it sends (bad methods, lying Content-Length, chunked bodies, trickled
// headers) and sees exactly what comes back, including a connection the server closes unanswered.
import net from 'node:net';

export const port = Number(process.env.NPULM_SERVE_PORT);
export const host = '127.0.0.1';
export const baseURL = `http://${host}:${port}/v1`;
export const apiKey = process.env.NPULM_SERVE_KEY || '';
export const modelId = process.env.NPULM_SERVE_MODEL_ID || 'stories260K.gguf';

if (!(port > 0)) {
  console.error(`${process.argv[1]}: set NPULM_SERVE_PORT to the port of a running npulm serve`);
  process.exit(2);
}

let n = 0;
let failed = 0;

/* check NAME FN: one TAP line; FN (maybe async) fails the check by throwing */
export async function check(name, fn) {
  n++;
  try {
    await fn();
    console.log(`ok ${n} - ${name}`);
  } catch (e) {
    failed++;
    console.log(`not ok ${n} - ${name}`);
    const text = e && e.stack && !(e instanceof CheckError) ? e.stack : String(e && e.message);
    for (const line of text.split('\n').slice(0, 12)) console.log(`#   ${line}`);
  }
}

/* the plan line last (TAP allows it there), and a failing exit status if any check failed */
export function done() {
  console.log(`1..${n}`);
  process.exitCode = failed ? 1 : 0;
}

class CheckError extends Error {}

export function fail(msg) {
  throw new CheckError(msg);
}

export function assert(cond, msg) {
  if (!cond) fail(msg);
}

/* long strings that differ are shown from a little before their first difference */
export function equal(got, want, what) {
  if (got === want) return;
  if (typeof got === 'string' && typeof want === 'string' && got.length + want.length > 160) {
    let i = 0;
    while (i < got.length && got[i] === want[i]) i++;
    const from = Math.max(0, i - 40);
    const show = (t) => JSON.stringify(t.slice(from, i + 60)) + (t.length > i + 60 ? '...' : '');
    fail(`${what}: differs at ${i} of ${got.length} (want ${want.length} chars): from ${from}, got ${show(got)}, want ${show(want)}`);
  }
  fail(`${what}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/*
 * exchange(PARTS, OPTS): connect, send PARTS (strings or Buffers; a number between them is a pause
 * in ms), and collect what comes back until the server closes, or OPTS.timeoutMs (default 10 s)
 * passes, or OPTS.until(bytes so far) is true (then this side closes). Resolves to {data, closed
 * (the server ended or reset it), timedOut, error, ms}. Write errors are expected (a server may
 * answer 413 and close while a body is still being sent) and only recorded.
 */
export function exchange(parts, opts = {}) {
  const timeoutMs = opts.timeoutMs ?? 10000;
  return new Promise((resolve) => {
    const t0 = Date.now();
    const chunks = [];
    let settled = false;
    let error = null;
    const sock = net.connect({ host, port });
    const finish = (closed, timedOut) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      sock.destroy();
      resolve({ data: Buffer.concat(chunks), closed, timedOut, error, ms: Date.now() - t0 });
    };
    const timer = setTimeout(() => finish(false, true), timeoutMs);
    sock.on('data', (d) => {
      chunks.push(d);
      if (opts.until && opts.until(Buffer.concat(chunks))) finish(false, false);
    });
    sock.on('error', (e) => {
      error = e.code || e.message;
      if (e.code !== 'EPIPE') finish(true, false);
    });
    sock.on('end', () => finish(true, false));
    sock.on('close', () => finish(true, false));
    sock.on('connect', async () => {
      for (const p of parts) {
        if (settled || sock.destroyed) return;
        if (typeof p === 'number') await sleep(p);
        else sock.write(p, () => {});
      }
    });
  });
}

/*
 * parse one HTTP/1.1 response (Content-Length, chunked or until close); null if there is none;
 * END is the offset just past it in DATA (null while it is incomplete or runs to the close)
 */
export function parseResponse(data) {
  const sep = data.indexOf('\r\n\r\n');
  if (sep < 0) return null;
  const head = data.subarray(0, sep).toString('latin1').split('\r\n');
  const m = /^HTTP\/1\.[01] (\d{3})/.exec(head[0]);
  if (!m) return null;
  if (m[1][0] === '1') { /* an interim "100 Continue": the response follows it */
    const rest = parseResponse(data.subarray(sep + 4));
    if (rest && rest.end !== null) rest.end += sep + 4;
    return rest;
  }
  const headers = {};
  for (const line of head.slice(1)) {
    const i = line.indexOf(':');
    if (i > 0) headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
  }
  let body = data.subarray(sep + 4);
  let end = null;
  if (/chunked/i.test(headers['transfer-encoding'] || '')) {
    const out = [];
    let p = 0;
    for (;;) {
      const eol = body.indexOf('\r\n', p);
      if (eol < 0) break;
      const size = parseInt(body.subarray(p, eol).toString('latin1'), 16);
      if (size === 0) {
        const trailer = body.indexOf('\r\n\r\n', eol);
        if (trailer >= 0) end = sep + 4 + trailer + 4;
        break;
      }
      if (!(size > 0) || eol + 2 + size > body.length) break;
      out.push(body.subarray(eol + 2, eol + 2 + size));
      p = eol + 2 + size + 2;
    }
    body = Buffer.concat(out);
  } else if (headers['content-length'] !== undefined) {
    const len = Number(headers['content-length']);
    if (body.length >= len) end = sep + 4 + len;
    body = body.subarray(0, len);
  } else if (/^(204|304)$/.test(m[1])) {
    end = sep + 4;
    body = body.subarray(0, 0);
  }
  return { status: Number(m[1]), headers, body, text: body.toString('utf8'), end };
}

/* DATA holds one whole response (by its Content-Length or chunked framing) */
export function complete(data) {
  const res = parseResponse(data);
  return res !== null && res.end !== null;
}

/* the bytes of one request; BODY a string, Buffer or object (sent as JSON), or null */
export function requestBytes(method, path, body = null, headers = {}) {
  let buf = null;
  if (body !== null && body !== undefined) {
    buf = Buffer.isBuffer(body) ? body : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
  }
  const h = { Host: `${host}:${port}`, Connection: 'close', ...headers };
  if (apiKey && !('Authorization' in h)) h.Authorization = `Bearer ${apiKey}`;
  if (buf && !('Content-Length' in h) && !('Transfer-Encoding' in h)) {
    h['Content-Type'] = 'application/json';
    h['Content-Length'] = String(buf.length);
  }
  for (const k of Object.keys(h)) if (h[k] === null) delete h[k];
  let s = `${method} ${path} HTTP/1.1\r\n`;
  for (const [k, v] of Object.entries(h)) s += `${k}: ${v}\r\n`;
  s += '\r\n';
  return buf ? Buffer.concat([Buffer.from(s, 'latin1'), buf]) : Buffer.from(s, 'latin1');
}

/* one request on its own connection; fails the check if no parseable response comes back */
export async function request(method, path, body = null, headers = {}, timeoutMs = 10000) {
  const r = await exchange([requestBytes(method, path, body, headers)], { timeoutMs, until: complete });
  const res = parseResponse(r.data);
  if (!res) {
    fail(`${method} ${path}: no HTTP response (${r.timedOut ? 'timed out' : 'closed'}` +
      `${r.error ? ', ' + r.error : ''}, ${r.data.length} bytes: ${JSON.stringify(r.data.toString('latin1').slice(0, 80))})`);
  }
  return res;
}

export function json(res) {
  try {
    return JSON.parse(res.text);
  } catch {
    return fail(`status ${res.status}, body is not JSON: ${JSON.stringify(res.text.slice(0, 200))}`);
  }
}

/* the response is STATUS with OpenAI's error object {"error":{message,type,param,code}} */
export function errorObject(res, status, want = {}) {
  if (res.status !== status) fail(`status ${res.status}, want ${status}: ${res.text.slice(0, 300)}`);
  assert(/^application\/json/.test(res.headers['content-type'] || ''),
    `Content-Type ${JSON.stringify(res.headers['content-type'])}, want application/json`);
  const j = json(res);
  const e = j && j.error;
  assert(e && typeof e === 'object', `no "error" object: ${res.text.slice(0, 200)}`);
  assert(typeof e.message === 'string' && e.message.length > 0, `error.message is not a non-empty string: ${res.text.slice(0, 200)}`);
  assert(typeof e.type === 'string', `error.type is not a string: ${res.text.slice(0, 200)}`);
  assert('param' in e && 'code' in e, `error lacks "param" or "code": ${res.text.slice(0, 200)}`);
  if (want.type) equal(e.type, want.type, 'error.type');
  if (want.code) equal(e.code, want.code, 'error.code');
  return e;
}

/* a well-formed 200 text completion; returns the parsed object */
export function completion(res) {
  if (res.status !== 200) fail(`status ${res.status}, want 200: ${res.text.slice(0, 300)}`);
  const j = json(res);
  assert(j.choices && j.choices[0] && typeof j.choices[0].text === 'string', `no choices[0].text: ${res.text.slice(0, 200)}`);
  assert(['stop', 'length'].includes(j.choices[0].finish_reason), `finish_reason ${j.choices[0].finish_reason}`);
  return j;
}

/* the data: payloads of an SSE body, in order */
export function sseEvents(text) {
  return text.split('\n\n').filter((e) => e.length > 0).map((e) => {
    assert(e.startsWith('data: '), `event does not start with "data: ": ${JSON.stringify(e.slice(0, 80))}`);
    return e.slice(6);
  });
}
