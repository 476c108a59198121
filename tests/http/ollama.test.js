// ollama.test.js — corrald's Ollama-compatible API through the official `ollama` npm package,
// unmodified (version pinned in package-lock.json), against a real corrald serving stories260K:
// generate and chat (streamed and whole), tags, ps, show, version, and keep_alive mapped onto
// corral's residency (-1 pins, 0 unloads, a duration makes the model evictable again).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { after, before, test } from 'node:test';

import { Ollama } from 'ollama';

import { sharedPath, startCorrald } from './harness.js';

const PROMPT = 'Once upon a time';
const REFERENCE = fs.readFileSync(sharedPath('reference/stories260K.greedy.txt'), 'utf8');

let daemon;
let ollama;

before(async () => {
  // keep_alive and an empty prompt pin, unpin, load and unload: admin operations, which the
  // keyless loopback client (the default app) may use only as auth.default_app allows.
  daemon = await startCorrald({
    extra: 'auth: {default_app: local}\napps:\n  - name: local\n    admin: true\n',
  });
  ollama = new Ollama({ host: daemon.base });
});

after(async () => {
  await daemon?.stop();
});

const loaded = async () => (await ollama.ps()).models.map((m) => m.name);

test('generate raw: greedy text equals the stories260K reference', async () => {
  const r = await ollama.generate({
    model: 'stories',
    prompt: PROMPT,
    raw: true,
    options: { temperature: 0, num_predict: 256 },
  });
  assert.equal(r.model, 'stories');
  assert.equal(r.done, true);
  assert.equal(r.done_reason, 'length');
  assert.equal(r.response, REFERENCE);
  assert.equal(r.eval_count, 256);
  assert.ok(r.total_duration > 0);
  assert.ok(!Number.isNaN(Date.parse(r.created_at)));
});

test('generate streamed: the pieces concatenate to the same text', async () => {
  const stream = await ollama.generate({
    model: 'stories',
    prompt: PROMPT,
    raw: true,
    stream: true,
    options: { temperature: 0, num_predict: 256 },
  });
  let text = '';
  let last = null;
  let parts = 0;
  for await (const part of stream) {
    text += part.response;
    parts++;
    last = part;
  }
  assert.equal(text, REFERENCE);
  assert.ok(parts >= 2);
  assert.equal(last.done, true);
  assert.equal(last.eval_count, 256);
});

test('chat: whole and streamed agree', async () => {
  const req = {
    model: 'stories',
    messages: [
      { role: 'system', content: 'Tell a story.' },
      { role: 'user', content: PROMPT },
    ],
    options: { temperature: 0, num_predict: 24, stop: ['\n\n'] },
  };
  const whole = await ollama.chat(req);
  assert.equal(whole.message.role, 'assistant');
  assert.ok(whole.message.content.length > 0);
  assert.equal(whole.done, true);
  const stream = await ollama.chat({ ...req, stream: true });
  let text = '';
  for await (const part of stream) text += part.message.content;
  assert.equal(text, whole.message.content);
});

test('tags, show and version', async () => {
  const tags = await ollama.list();
  assert.deepEqual(
    tags.models.map((m) => m.name),
    ['stories'],
  );
  assert.ok(tags.models[0].size > 0);
  assert.equal(tags.models[0].details.format, 'gguf');
  const show = await ollama.show({ model: 'stories' });
  assert.equal(show.model_info['general.architecture'], 'llama');
  await assert.rejects(ollama.show({ model: 'nope' }), (e) => {
    assert.equal(e.status_code, 404);
    assert.match(e.message, /nope/);
    return true;
  });
  const v = await ollama.version();
  assert.match(v.version, /^\d+\.\d+\.\d+/);
});

test('errors carry the status and the message', async () => {
  await assert.rejects(ollama.generate({ model: 'nope', prompt: 'x' }), (e) => {
    assert.equal(e.status_code, 404);
    return true;
  });
  await assert.rejects(
    ollama.generate({ model: 'stories', prompt: 'x', images: ['aGVsbG8='] }),
    (e) => e.status_code === 400 && /images/.test(e.message),
  );
});

test('format: a JSON Schema, and "json" for any object', async () => {
  const schema = {
    type: 'object',
    properties: { color: { enum: ['red', 'green', 'blue'] }, count: { type: 'integer', minimum: 1, maximum: 9 } },
    required: ['color', 'count'],
  };
  const r = await ollama.generate({
    model: 'stories', prompt: 'Pick a color.', format: schema, stream: false,
    options: { temperature: 0.7, seed: 5, num_predict: 100 },
  });
  assert.equal(r.done_reason, 'stop');
  const v = JSON.parse(r.response);
  assert.ok(['red', 'green', 'blue'].includes(v.color), r.response);
  assert.ok(Number.isInteger(v.count) && v.count >= 1 && v.count <= 9, r.response);
  const any = await ollama.generate({
    model: 'stories', prompt: 'Once upon a time', format: 'json', stream: false,
    options: { temperature: 0.5, seed: 2, num_predict: 200 },
  });
  if (any.done_reason === 'stop') assert.equal(typeof JSON.parse(any.response), 'object');
});

test('keep_alive: -1 pins, 0 unloads, a duration unpins; ps shows it', async () => {
  // A generate without a prompt only loads the model.
  const load = await ollama.generate({ model: 'stories', prompt: '', keep_alive: -1 });
  assert.equal(load.done_reason, 'load');
  let ps = await ollama.ps();
  assert.deepEqual(
    ps.models.map((m) => m.name),
    ['stories'],
  );
  assert.equal(ps.models[0].corral.pinned, true);

  await ollama.generate({ model: 'stories', prompt: PROMPT, keep_alive: '5m', options: { num_predict: 2 } });
  ps = await ollama.ps();
  assert.equal(ps.models[0].corral.pinned, false);

  const r = await ollama.generate({ model: 'stories', prompt: PROMPT, keep_alive: 0, options: { num_predict: 2 } });
  assert.equal(r.done, true);
  assert.deepEqual(await loaded(), []);

  await ollama.chat({ model: 'stories', messages: [{ role: 'user', content: 'hi' }], keep_alive: '-1m', options: { num_predict: 2 } });
  assert.deepEqual(await loaded(), ['stories']);
  ps = await ollama.ps();
  assert.equal(ps.models[0].corral.pinned, true);

  const unload = await ollama.generate({ model: 'stories', prompt: '', keep_alive: 0 });
  assert.equal(unload.done_reason, 'unload');
  assert.deepEqual(await loaded(), []);
});
