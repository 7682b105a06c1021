// The chat page's pure helpers (edgeserve/http/webui/format.js), run in the page by
// tests/integration/test_webui_browser.py: each case is [what a helper returned, the value
// expected].
async () => {
  const f = await import('./webui/format.js');
  const sse = new f.SseParser();
  const pieces = ['data: {"a"', ':1}\n\n: ping - now\n\nda', 'ta: [DONE]\r\n\r\ndata: x\ndata: y\n\n'];
  const usage = {prompt_tokens: 9, completion_tokens: 11, prompt_tokens_details: {cached_tokens: 4}};
  // A catalogue: GET /v1/models' cards, the models listedModels reads from them, /health.
  const cards = [
    {id: 'broken', status: {value: 'failed', failed: true, reason: 'not a GGUF file'}},
    {id: 'gemma', status: {value: 'loaded'}},
    {id: 'smollm2', status: {value: 'unloaded'}},
  ];
  const catalogue = [
    {id: 'broken', status: 'failed', reason: 'not a GGUF file', input: null},
    {id: 'gemma', status: 'loaded', reason: null, input: ['text']},
    {id: 'smollm2', status: 'unloaded', reason: null, input: null},
  ];
  const listed = {base: null, adapters: [], models: catalogue};
  const fleet = {status: 'ok', models: catalogue.map(({id, status}) => ({id, status}))};
  const chosen = (id, known) => ({id, loading: false, reason: null, input: null, ...known});
  // The chip, the failure's reason, and the Model and Input lines.
  const seen = (health, model) => {
    const {state, text, problem, info} = f.describeHealth(health, model);
    return [state, text, problem, info.model, info.input];
  };
  return [
    [pieces.map((piece) => sse.push(piece)), [[], ['{"a":1}'], ['[DONE]', 'x\ny']]],
    [f.errorMessage(401, '{"detail": "Invalid API key.", "message": "Invalid API key."}'), 'Invalid API key.'],
    [f.errorMessage(400, '{"detail": "Invalid role"}'), 'Invalid role'],
    [f.errorMessage(422, '{"detail": [{"loc": ["body", "messages"], "msg": "Field required"}]}'),
     'body.messages: Field required'],
    [f.errorMessage(504, '{"error": {"message": "too slow", "code": 504}}'), 'too slow'],
    [f.errorMessage(502, ''), 'HTTP 502'],
    [f.errorMessage(502, 'Bad gateway\n'), 'Bad gateway'],
    [f.splitFences('Look:\n```py\nx = 1\n```\nDone.'),
     [{code: false, lang: '', text: 'Look:'}, {code: true, lang: 'py', text: 'x = 1'},
      {code: false, lang: '', text: 'Done.'}]],
    [f.splitFences('a\n```\nstill streaming'),
     [{code: false, lang: '', text: 'a'}, {code: true, lang: '', text: 'still streaming'}]],
    [f.splitFences('```\n```\n'), []],
    [f.answerFigures({startedAt: 100, firstTokenAt: 350, lastTokenAt: 850, usage}),
     {ttftMs: 250, tokensPerSecond: 20, promptTokens: 9, completionTokens: 11, cachedTokens: 4}],
    [f.answerFigures({startedAt: 0, firstTokenAt: 5, lastTokenAt: 5, usage: null}),
     {ttftMs: 5, tokensPerSecond: null, promptTokens: null, completionTokens: null, cachedTokens: null}],
    [[f.formatMs(85.4), f.formatMs(1234), f.formatRate(21.26), f.formatRate(512.4)],
     ['85 ms', '1.23 s', '21.3 tok/s', '512 tok/s']],
    [f.describeHealth({status: 'ok', model: 'm', n_ctx: 4096, parallel: 4, busy_slots: 2,
       queue_length: 1, kv_cells_used: 300, gpu_offload: true, n_gpu_layers: 18,
       input_modalities: ['text', 'image']}),
     {state: 'busy', text: '2/4 busy, 1 queued', info: {model: 'm', ctx: '4,096 tokens',
       slots: '2 of 4 busy', queue: '1 waiting', kv: '300 of 4096 cells',
       gpu: '18 layers offloaded', input: 'text, image', prompts: null}}],
    [f.describeHealth({status: 'ok', prompt_cache: [
       {tier: 'ram', entries: 3, bytes: 37748736, hits: 5, misses: 2},
       {tier: 'disk', entries: 7, bytes: 1048576, hits: 1, misses: 1}]}).info.prompts,
     'ram: 3 prompts, 36 MiB, 5 hits\ndisk: 7 prompts, 1.0 MiB, 1 hits'],
    [f.describeHealth({status: 'loading'}).text, 'loading model'],
    [[f.chosenModel({base: 'm', adapters: ['a', 'b']}, 'b'),
      f.chosenModel({base: 'm', adapters: ['a', 'b']}, 'gone'),
      f.chosenModel({base: 'm', adapters: ['a']}, null),
      f.chosenModel({base: 'm', adapters: []}, 'a')],
     ['b', 'm', 'm', 'm']],
    [[f.describeAdapters(['support', 'sql']), f.describeAdapters([])], ['support, sql', 'none']],
    [f.listedModels([{id: 'm'}, {id: 'support', parent: 'm'}, {id: 'sql', parent: 'm'}]),
     {base: 'm', adapters: ['support', 'sql'], models: null}],
    [f.listedModels(cards), {base: null, adapters: [], models: catalogue}],
    [f.listedModels([]), {base: null, adapters: [], models: []}],
    [f.listedModels([{id: 'v', status: {value: 'loaded'}, input_modalities: ['text', 'image']},
                     {id: 'u', status: {value: 'unloaded'}}]).models.map((model) => model.input),
     [['text', 'image'], null]],
    [[f.chosenModel(listed, 'smollm2'), f.chosenModel(listed, 'gone'), f.chosenModel(listed, null),
      f.chosenModel({base: null, adapters: [], models: [catalogue[0], catalogue[2]]}, null),
      f.chosenModel({base: null, adapters: [], models: []}, 'gemma')],
     ['smollm2', 'gemma', 'gemma', 'broken', null]],
    [f.modelChoices(catalogue),
     [{value: 'broken', text: 'broken — failed', title: 'not a GGUF file'},
      {value: 'gemma', text: 'gemma — loaded', title: ''},
      {value: 'smollm2', text: 'smollm2 — unloaded', title: ''}]],
    [f.describeHealth(fleet, chosen('smollm2', {loading: true})),
     {state: 'loading', text: 'loading smollm2', problem: null, info: {model: 'smollm2',
       models: 'broken — failed\ngemma — loaded\nsmollm2 — unloaded', adapters: null,
       ctx: null, slots: null, queue: null, kv: null, gpu: null, input: null,
       prompts: null}}],
    [[seen(fleet, chosen('gemma', {input: ['text', 'image']})),
      seen({status: 'ok', models: [{id: 'smollm2', status: 'loading'}]}, chosen('smollm2')),
      seen(fleet, chosen('smollm2')),
      seen(fleet, chosen('broken', {reason: 'not a GGUF file'})),
      seen(fleet, chosen('broken')),
      seen(fleet, chosen('smollm2', {reason: 'no room to load smollm2'})),
      seen({...fleet, status: 'draining'}, chosen('gemma')),
      seen(fleet, null),
      seen({status: 'unavailable', models: []}, null)],
     [['idle', 'loaded', null, 'gemma', 'text, image'],
      ['loading', 'loading smollm2', null, 'smollm2', null],
      ['unknown', 'not loaded', null, 'smollm2', null],
      ['down', 'broken failed', 'not a GGUF file', 'broken', null],
      ['down', 'broken failed', 'broken failed to load', 'broken', null],
      ['down', 'smollm2 failed', 'no room to load smollm2', 'smollm2', null],
      ['down', 'shutting down', null, 'gemma', null],
      ['unknown', '3 models', null, 'none', null],
      ['down', 'no models', null, 'none', null]]],
  ];
}
