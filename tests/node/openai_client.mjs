// The official openai npm client against a running `pipeline run`: chat completions streamed
// and not, text completions streamed and not, and errors surfacing as the client's own types.
// Environment: PIPELINE_BASE_URL (http://HOST:PORT/v1), PIPELINE_MODEL, PIPELINE_API_KEY.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { makeParseableResponseFormat } from 'openai/lib/parser';

const baseURL = process.env.PIPELINE_BASE_URL;
const model = process.env.PIPELINE_MODEL;
assert.ok(baseURL, 'PIPELINE_BASE_URL is not set');
assert.ok(model, 'PIPELINE_MODEL is not set');

const client = new OpenAI({
  baseURL,
  apiKey: process.env.PIPELINE_API_KEY ?? 'none',
  maxRetries: 0,
  timeout: 60_000,
});

const checks = [];
function check(name, body) {
  checks.push([name, body]);
}

const messages = [{ role: 'user', content: 'Tell me a story about a dog.' }];

check('chat completion, whole and streamed, give the same greedy text', async () => {
  const whole = await client.chat.completions.create({
    model, messages, temperature: 0, max_tokens: 32,
  });
  assert.equal(whole.object, 'chat.completion');
  assert.equal(whole.model, model);
  assert.match(whole.id, /^chatcmpl-/);
  assert.equal(whole.choices.length, 1);
  assert.equal(whole.choices[0].message.role, 'assistant');
  const text = whole.choices[0].message.content;
  assert.ok(text.length > 0, 'empty answer');
  assert.ok(['stop', 'length'].includes(whole.choices[0].finish_reason));
  assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);

  const stream = await client.chat.completions.create({
    model, messages, temperature: 0, max_tokens: 32, stream: true,
    stream_options: { include_usage: true },
  });
  let streamed = '';
  let role = null;
  let finishReason = null;
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      role ??= choice.delta.role ?? null;
      streamed += choice.delta.content ?? '';
      finishReason = choice.finish_reason ?? finishReason;
    }
  }
  assert.equal(role, 'assistant');
  assert.equal(streamed, text);
  assert.equal(finishReason, whole.choices[0].finish_reason);
  // The same counts; the stream's prompt was cached by the whole answer's request, as OpenAI's
  // prompt caching reports it.
  for (const key of ['prompt_tokens', 'completion_tokens', 'total_tokens'])
    assert.equal(usage[key], whole.usage[key]);
  assert.ok(usage.prompt_tokens_details.cached_tokens > 0);
  assert.ok(usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens);
});

check('text completion, whole and streamed, give the same greedy text', async () => {
  const request = { model, prompt: 'Once upon a time', temperature: 0, max_tokens: 24 };
  const whole = await client.completions.create(request);
  assert.equal(whole.object, 'text_completion');
  assert.match(whole.id, /^cmpl-/);
  const text = whole.choices[0].text;
  assert.ok(text.length > 0, 'empty answer');

  const stream = await client.completions.create({ ...request, stream: true });
  let streamed = '';
  let finishReason = null;
  for await (const chunk of stream) {
    streamed += chunk.choices[0]?.text ?? '';
    finishReason = chunk.choices[0]?.finish_reason ?? finishReason;
  }
  assert.equal(streamed, text);
  assert.equal(finishReason, whole.choices[0].finish_reason);
});

check('chat logprobs come in OpenAI\'s shape', async () => {
  const whole = await client.chat.completions.create({
    model, messages, temperature: 0, max_tokens: 4, logprobs: true, top_logprobs: 2,
  });
  const content = whole.choices[0].logprobs.content;
  assert.ok(content.length > 0);
  for (const entry of content) {
    assert.equal(typeof entry.token, 'string');
    assert.ok(entry.logprob <= 0);
    assert.equal(entry.top_logprobs.length, 2);
  }
});

check('errors surface as the client\'s error classes', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'no-such-model', messages }),
    (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found');
  await assert.rejects(
    client.chat.completions.create({ model, messages, temperature: 7 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'temperature');
  await assert.rejects(
    client.chat.completions.create({ model, messages, n: 1000 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'n');
});

check('n choices come numbered, whole and streamed', async () => {
  const request = { model, messages, n: 2, max_tokens: 8, temperature: 0 };
  const whole = await client.chat.completions.create(request);
  assert.deepEqual(whole.choices.map((c) => c.index), [0, 1]);
  const texts = ['', ''];
  for await (const chunk of await client.chat.completions.create({ ...request, stream: true }))
    for (const choice of chunk.choices) texts[choice.index] += choice.delta.content ?? '';
  assert.deepEqual(texts, whole.choices.map((c) => c.message.content));
});

check('the stream helper parses a json_schema answer as it streams', async () => {
  // What zodResponseFormat() builds, without zod: the helper parses the content after each
  // delta, so a first delta of whitespace alone would throw.
  const schema = {
    type: 'object',
    properties: { name: { type: 'string', maxLength: 12 } },
    required: ['name'],
    additionalProperties: false,
  };
  const response_format = makeParseableResponseFormat(
    { type: 'json_schema', json_schema: { name: 'dog', schema, strict: true } },
    (content) => JSON.parse(content));
  const stream = client.chat.completions.stream({
    model, messages, max_tokens: 200, temperature: 0, response_format,
  });
  const final = await stream.finalChatCompletion();
  const parsed = final.choices[0].message.parsed;
  assert.equal(typeof parsed.name, 'string');
  assert.deepEqual(Object.keys(parsed), ['name']);
});

check('the model is listed', async () => {
  const ids = [];
  for await (const entry of client.models.list()) ids.push(entry.id);
  assert.deepEqual(ids, [model]);
});

let failed = 0;
for (const [name, body] of checks) {
  try {
    await body();
    console.log(`ok: ${name}`);
  } catch (error) {
    failed += 1;
    console.log(`FAILED: ${name}\n${error?.stack ?? error}`);
  }
}
console.log(`openai node client: ${checks.length - failed} of ${checks.length} checks passed`);
process.exit(failed === 0 ? 0 : 1);
