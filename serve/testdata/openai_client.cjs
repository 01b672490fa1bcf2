// The official OpenAI client for Node against a leangrad server:
// node openai_client.cjs BASE_URL MODEL. TestOpenAIClient runs it; it exits
// non-zero, saying why, when the server does not answer as the API does.
const OpenAI = require('openai');
const assert = require('node:assert/strict');

async function main() {
  const [baseURL, model] = process.argv.slice(2);
  const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0 });

  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), [model], 'models.list');

  const prompt = 'The quick brown fox';
  const greedy = await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0, n: 2, logprobs: 2 });
  assert.equal(greedy.object, 'text_completion');
  assert.equal(greedy.choices.length, 2, 'n: 2');
  assert.equal(greedy.choices[0].text, greedy.choices[1].text, 'two greedy choices differ');
  assert.equal(greedy.choices[0].finish_reason, 'length');
  assert.equal(greedy.usage.completion_tokens, 24);
  assert.equal(greedy.choices[0].logprobs.tokens.length, 12);
  assert.ok(greedy.choices[0].logprobs.token_logprobs.every((x) => x <= 0), 'log-probabilities above 0');
  assert.ok(greedy.choices[0].logprobs.top_logprobs.every((t) => Object.keys(t).length >= 1), 'top_logprobs');

  let streamed = '';
  let finish = null;
  let usage = null;
  const stream = await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0, stream: true,
    stream_options: { include_usage: true } });
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      streamed += c.text;
      finish = c.finish_reason ?? finish;
    }
    usage = chunk.usage ?? usage;
  }
  assert.equal(streamed, greedy.choices[0].text, 'the stream is not the completion');
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 12);

  const seeded = async () => (await client.completions.create({ model, prompt, max_tokens: 8, temperature: 1, seed: 3 })).choices[0].text;
  assert.equal(await seeded(), await seeded(), 'the same seed drew different text');

  await assert.rejects(client.completions.create({ model: 'no-such-model', prompt, max_tokens: 4 }),
    (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found');
  await assert.rejects(client.completions.create({ model, prompt, max_tokens: 4, temperature: -1 }),
    (e) => e instanceof OpenAI.BadRequestError && /temperature/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model, messages: [{ role: 'user', content: prompt }] }),
    (e) => e instanceof OpenAI.NotFoundError && e.code === 'unknown_url' && /POST \/v1\/completions/.test(e.message));
  console.log(JSON.stringify({ ok: true, text: greedy.choices[0].text }));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
