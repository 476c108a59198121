// openai.test.js — corrald's OpenAI-compatible API through the official `openai` npm package,
// unmodified (version pinned in package-lock.json), against a real corrald serving stories260K.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { after, before, test } from 'node:test';

import OpenAI from 'openai';

import { sharedPath, startCorrald, waitFor } from './harness.js';

const PROMPT = 'Once upon a time';
const REFERENCE = fs.readFileSync(sharedPath('reference/stories260K.greedy.txt'), 'utf8');

let daemon;
let client;

before(async () => {
  daemon = await startCorrald();
  // The client insists on some key; a loopback daemon without http.keys takes any.
  client = new OpenAI({ baseURL: daemon.url('/v1'), apiKey: 'unused', maxRetries: 0, timeout: 60000 });
});

after(async () => {
  await daemon?.stop();
});

test('completions: greedy text equals the stories260K reference (corral run)', async () => {
  const r = await client.completions.create({
    model: 'stories',
    prompt: PROMPT,
    max_tokens: 256,
    temperature: 0,
  });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].text, REFERENCE);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 256);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 256);
  // corral's Done figures ride along in usage.
  assert.ok(r.usage.corral.total_us > 0);
  assert.ok(r.usage.corral.decode_us > 0);
});

test('completions: a stream concatenates to the same text', async () => {
  const stream = await client.completions.create({
    model: 'stories',
    prompt: PROMPT,
    max_tokens: 256,
    temperature: 0,
    stream: true,
  });
  let text = '';
  let finish = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    text += chunk.choices[0].text;
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.equal(text, REFERENCE);
  assert.equal(finish, 'length');
  assert.ok(chunks >= 2);
});

test('chat: a whole answer, with usage and the request id header', async () => {
  const { data, response } = await client.chat.completions
    .create(
      {
        model: 'stories',
        messages: [
          { role: 'system', content: 'You tell stories.' },
          { role: 'user', content: PROMPT },
        ],
        max_tokens: 12,
        temperature: 0,
        seed: 7,
      },
      { headers: { 'X-Request-Id': 'chat-whole-1' } },
    )
    .withResponse();
  assert.equal(response.headers.get('x-request-id'), 'chat-whole-1');
  assert.equal(data.object, 'chat.completion');
  assert.match(data.id, /^chatcmpl-/);
  assert.equal(data.model, 'stories');
  assert.equal(data.choices[0].message.role, 'assistant');
  assert.equal(typeof data.choices[0].message.content, 'string');
  assert.ok(data.choices[0].message.content.length > 0);
  assert.equal(data.choices[0].finish_reason, 'length');
  assert.equal(data.usage.completion_tokens, 12);
});

test('chat: a stream with include_usage equals the whole answer', async () => {
  const body = {
    model: 'stories',
    messages: [{ role: 'user', content: PROMPT }],
    max_completion_tokens: 40,
    temperature: 0,
  };
  const whole = await client.chat.completions.create(body);
  const stream = await client.chat.completions.create({
    ...body,
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  let role = null;
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    if (!chunk.choices.length) continue;
    const c = chunk.choices[0];
    if (c.delta.role) role = c.delta.role;
    if (c.delta.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(role, 'assistant');
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, 'length');
  assert.ok(usage, 'the last chunk carries usage');
  assert.equal(usage.completion_tokens, 40);
  assert.ok(usage.corral.total_us > 0);
});

test('chat: stop strings end the answer with finish_reason stop', async () => {
  const r = await client.completions.create({
    model: 'stories',
    prompt: PROMPT,
    max_tokens: 256,
    temperature: 0,
    stop: ['.'],
  });
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.choices[0].text, REFERENCE.slice(0, REFERENCE.indexOf('.')));
});

test('models: every configured model with its state', async () => {
  const list = [];
  for await (const m of client.models.list()) list.push(m);
  assert.deepEqual(
    list.map((m) => m.id),
    ['stories'],
  );
  assert.equal(list[0].object, 'model');
  assert.ok(['unloaded', 'loading', 'resident', 'swapped'].includes(list[0].corral.state));
  const one = await client.models.retrieve('stories');
  assert.equal(one.id, 'stories');
  await assert.rejects(client.models.retrieve('nope'), (e) => e instanceof OpenAI.NotFoundError);
});

test('errors: OpenAI-shaped, with the status and the field named', async () => {
  const chat = (extra) =>
    client.chat.completions.create({
      model: 'stories',
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 4,
      ...extra,
    });
  await assert.rejects(chat({ model: 'nope' }), (e) => {
    assert.ok(e instanceof OpenAI.NotFoundError);
    assert.equal(e.status, 404);
    assert.equal(e.param, 'model');
    assert.match(e.message, /nope/);
    return true;
  });
  for (const [extra, param] of [
    [{ n: 2 }, 'n'],
    [{ tools: [{ type: 'function', function: { name: 'f', parameters: {} } }] }, 'tools'],
    [{ temperature: 'hot' }, 'temperature'],
    [{ max_tokens: 0 }, 'max_tokens'],
    [{ messages: [{ role: 'tool', content: 'x' }] }, 'messages[0].role'],
    [{ corral: { priority: 'urgent' } }, 'corral.priority'],
    [{ logprobs: true, top_logprobs: 21 }, 'top_logprobs'],
    [{ top_logprobs: 2 }, 'top_logprobs'],
  ]) {
    await assert.rejects(chat(extra), (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, `${JSON.stringify(extra)}: ${e}`);
      assert.equal(e.status, 400);
      assert.equal(e.param, param);
      assert.equal(e.type, 'invalid_request_error');
      return true;
    });
  }
  // Unknown fields are ignored, as OpenAI ignores them.
  const ok = await chat({ user: 'someone', store: false, metadata: { a: 'b' }, some_future_field: 1 });
  assert.equal(ok.choices.length, 1);
  // A stream that fails before its first token is an HTTP error, not a stream.
  await assert.rejects(chat({ model: 'nope', stream: true }), (e) => e instanceof OpenAI.NotFoundError);
});

test('logprobs: per token, with alternatives, whole and streamed', async () => {
  const body = {
    model: 'stories',
    messages: [{ role: 'user', content: PROMPT }],
    max_tokens: 10,
    temperature: 0,
    logprobs: true,
    top_logprobs: 3,
  };
  const whole = await client.chat.completions.create(body);
  const content = whole.choices[0].logprobs.content;
  assert.equal(content.length, 10);
  for (const t of content) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 3);
    // Greedy: the token taken is the most likely one.
    assert.equal(t.top_logprobs[0].token, t.token);
    assert.equal(t.top_logprobs[0].logprob, t.logprob);
    assert.ok(t.top_logprobs[1].logprob <= t.top_logprobs[0].logprob);
    assert.deepEqual(t.bytes, [...Buffer.from(t.token, 'utf8')]);
  }
  assert.equal(content.map((t) => t.token).join(''), whole.choices[0].message.content);
  const stream = await client.chat.completions.create({ ...body, stream: true });
  const streamed = [];
  for await (const chunk of stream) {
    if (chunk.choices[0]?.logprobs) streamed.push(...chunk.choices[0].logprobs.content);
  }
  assert.deepEqual(streamed, content);
  // The legacy completions shape: tokens, token_logprobs, top_logprobs, text_offset.
  const c = await client.completions.create({
    model: 'stories', prompt: PROMPT, max_tokens: 5, temperature: 0, logprobs: 2,
  });
  const lp = c.choices[0].logprobs;
  assert.equal(lp.tokens.length, 5);
  assert.equal(lp.tokens.join(''), c.choices[0].text);
  assert.equal(lp.text_offset[0], 0);
  assert.equal(lp.text_offset[1], lp.tokens[0].length);
  assert.equal(Object.keys(lp.top_logprobs[0]).length, 2);
  // Without asking, none.
  const plain = await client.chat.completions.create({ ...body, logprobs: false, top_logprobs: 0 });
  assert.equal(plain.choices[0].logprobs, null);
});

test('corral extras: priority, session and regex constraint', async () => {
  const r = await client.chat.completions.create({
    model: 'stories',
    messages: [{ role: 'user', content: PROMPT }],
    max_tokens: 30,
    temperature: 0,
    corral: { priority: 'background', session: 'http-test', regex: '[a-z ]+' },
  });
  assert.match(r.choices[0].message.content, /^[a-z ]+$/);
  const again = await client.chat.completions.create({
    model: 'stories',
    messages: [{ role: 'user', content: PROMPT }],
    max_tokens: 4,
    temperature: 0,
    corral: { session: 'http-test' },
  });
  // The session kept the prompt's KV cache: part of the prompt was not run again.
  assert.ok(again.usage.prompt_tokens_details.cached_tokens > 0);
});

// A schema the tiny model can finish inside the token budget: every output that ends with
// finish_reason 'stop' must parse and validate.
const PERSON = {
  type: 'object',
  properties: {
    name: { type: 'string', minLength: 1, maxLength: 8 },
    age: { type: 'integer', minimum: 0, maximum: 120 },
    pet: { enum: ['cat', 'dog'] },
  },
  required: ['name', 'age', 'pet'],
  additionalProperties: false,
};

function checkPerson(text) {
  const v = JSON.parse(text);
  assert.deepEqual(Object.keys(v), ['name', 'age', 'pet']);
  assert.equal(typeof v.name, 'string');
  assert.ok(v.name.length >= 1 && v.name.length <= 8, v.name);
  assert.ok(Number.isInteger(v.age) && v.age >= 0 && v.age <= 120, String(v.age));
  assert.ok(['cat', 'dog'].includes(v.pet), v.pet);
}

test('response_format json_schema: the output parses and validates, whole and streamed', async () => {
  const request = {
    model: 'stories',
    messages: [{ role: 'user', content: 'Describe a person as JSON.' }],
    max_tokens: 200,
    temperature: 0.7,
    seed: 7,
    response_format: { type: 'json_schema', json_schema: { name: 'person', schema: PERSON, strict: true } },
  };
  const r = await client.chat.completions.create(request);
  assert.equal(r.choices[0].finish_reason, 'stop');
  checkPerson(r.choices[0].message.content);
  const stream = await client.chat.completions.create({ ...request, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  assert.equal(text, r.choices[0].message.content);
});

test('response_format json_object: any JSON object; a schema it cannot compile is a 400', async () => {
  const r = await client.chat.completions.create({
    model: 'stories',
    messages: [{ role: 'user', content: PROMPT }],
    max_tokens: 200,
    temperature: 0.5,
    seed: 3,
    response_format: { type: 'json_object' },
  });
  if (r.choices[0].finish_reason === 'stop') {
    const v = JSON.parse(r.choices[0].message.content);
    assert.equal(typeof v, 'object');
    assert.ok(v !== null && !Array.isArray(v));
  } else {
    assert.equal(r.choices[0].finish_reason, 'length');
  }
  await assert.rejects(
    client.chat.completions.create({
      model: 'stories',
      messages: [{ role: 'user', content: PROMPT }],
      response_format: {
        type: 'json_schema',
        json_schema: { name: 'x', schema: { type: 'number', multipleOf: 3 } },
      },
    }),
    (e) => e.status === 400 && /multipleOf/.test(e.message),
  );
});

test('an aborted stream cancels its request in the core', async () => {
  const controller = new AbortController();
  const stream = await client.chat.completions.create(
    {
      model: 'stories',
      messages: [{ role: 'user', content: PROMPT }],
      max_tokens: 2000,
      temperature: 0,
      stream: true,
    },
    { signal: controller.signal, headers: { 'X-Request-Id': 'abort-me-1' } },
  );
  let seen = 0;
  for await (const chunk of stream) {
    if (chunk.choices[0]?.delta?.content) seen++;
    if (seen === 2) {
      controller.abort();
      break;
    }
  }
  assert.equal(seen, 2);
  // The daemon notices the closed connection, cancels the generation (2,000 tokens take stories
  // about a second and a half), and says how far it got.
  const line = await waitFor(
    () =>
      daemon
        .log()
        .split('\n')
        .find((l) => l.includes('client left') && l.includes('request_id=abort-me-1')),
    30000,
    'the cancelled request to end',
  );
  assert.match(line, /stop=cancelled/);
  const generated = Number(/generated_tokens=(\d+)/.exec(line)[1]);
  assert.ok(generated < 2000, line);
});
