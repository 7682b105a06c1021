// Pure helpers of the chat page: text in, values out; no DOM, no network.

/** Server-sent events from decoded text pieces, split anywhere: `push` returns the `data`
 * payloads of the events the piece completed (comments such as `: ping` are dropped). */
export class SseParser {
  #buffer = "";

  push(text) {
    this.#buffer += text.replaceAll("\r", "");
    const payloads = [];
    let end;
    while ((end = this.#buffer.indexOf("\n\n")) >= 0) {
      const block = this.#buffer.slice(0, end);
      this.#buffer = this.#buffer.slice(end + 2);
      const data = block
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(line.startsWith("data: ") ? 6 : 5));
      if (data.length) payloads.push(data.join("\n"));
    }
    return payloads;
  }
}

/** The text an error response says: edgeserve's `message`, the reference's `detail` (a
 * string, or FastAPI's list of problems), an OpenAI-style `error.message`, else the body. */
export function errorMessage(status, body) {
  let parsed;
  try {
    parsed = JSON.parse(body);
  } catch {
    return body.trim() || `HTTP ${status}`;
  }
  if (typeof parsed?.message === "string") return parsed.message;
  if (typeof parsed?.detail === "string") return parsed.detail;
  if (Array.isArray(parsed?.detail)) {
    return parsed.detail.map((item) => `${(item.loc || []).join(".")}: ${item.msg}`).join("; ");
  }
  if (typeof parsed?.error?.message === "string") return parsed.error.message;
  return body.trim() || `HTTP ${status}`;
}

/** Prose and ``` fenced code blocks, in order: [{code, lang, text}], blank ones left out. A
 * fence still open (the answer is streaming) runs to the end of the text. */
export function splitFences(text) {
  const parts = [];
  let lines = [];
  let lang = null;
  const flush = (code) => {
    const body = lines.join("\n");
    if (body.trim()) parts.push({ code, lang: code ? lang : "", text: body });
    lines = [];
  };
  for (const line of text.split("\n")) {
    const fence = /^ {0,3}```\s*([^\s`]*)\s*$/.exec(line);
    if (fence && lang === null) {
      flush(false);
      lang = fence[1];
    } else if (fence && !fence[1]) {
      flush(true);
      lang = null;
    } else {
      lines.push(line);
    }
  }
  flush(lang !== null);
  return parts;
}

/** The figures of one answer from its timings (performance.now() milliseconds) and the
 * stream's usage (null when the stream was stopped before it). Tokens per second is the
 * decoding speed after the first token. */
export function answerFigures({ startedAt, firstTokenAt, lastTokenAt, usage }) {
  const completion = usage ? usage.completion_tokens : null;
  const decodeMs = lastTokenAt - firstTokenAt;
  return {
    ttftMs: firstTokenAt === null ? null : firstTokenAt - startedAt,
    tokensPerSecond: completion > 1 && decodeMs > 0 ? ((completion - 1) * 1000) / decodeMs : null,
    promptTokens: usage ? usage.prompt_tokens : null,
    completionTokens: completion,
    cachedTokens: usage ? (usage.prompt_tokens_details?.cached_tokens ?? 0) : null,
  };
}

export function formatMs(ms) {
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(2)} s`;
}

export function formatRate(perSecond) {
  return `${perSecond.toFixed(perSecond < 100 ? 1 : 0)} tok/s`;
}

/** What GET /v1/models' cards list. With --model alone, `base` (the model's id) and
 * `adapters` (its LoRA adapters' names: the cards whose `parent` is the model), `models`
 * null. With a catalogue (its cards have a `status`), `base` null, no adapters, and `models`:
 * each model's id, status, the reason its load failed (or null) and what it reads (text alone
 * unless its card says more; null while it is not loaded: the server does not know yet), in
 * the server's order. */
export function listedModels(cards) {
  if (!cards.length || cards.some((card) => card.status)) {
    const models = cards.map((card) => ({
      id: card.id,
      status: card.status.value,
      reason: card.status.reason ?? null,
      input: card.input_modalities ?? (card.status.value === "loaded" ? ["text"] : null),
    }));
    return { base: null, adapters: [], models };
  }
  const base = (cards.find((card) => !card.parent) ?? cards[0]).id;
  const adapters = cards.filter((card) => card.parent === base).map((card) => card.id);
  return { base, adapters, models: null };
}

/** The model the page sends as `model` (and names its answers by), from `listed` (as
 * listedModels gives it) and the choice kept from before. With --model alone: that adapter
 * while the server lists it, else the base model. With a catalogue: that model while it is
 * listed, else the first one loaded, else the first one (null when there is none). */
export function chosenModel(listed, kept) {
  if (!listed.models) return listed.adapters.includes(kept) ? kept : listed.base;
  const ids = listed.models.map((model) => model.id);
  if (ids.includes(kept)) return kept;
  return (listed.models.find((model) => model.status === "loaded") ?? listed.models[0])?.id ?? null;
}

/** A catalogue model in one line: its id and status ("gemma — loaded"). */
export function modelLine(model) {
  return `${model.id} — ${model.status}`;
}

/** The chooser's entries for a catalogue's models: the id as the value, the id and status as
 * the text, and for a failed model the reason as the title (it stays choosable: choosing it
 * tries the load again). */
export function modelChoices(models) {
  return models.map((model) => ({
    value: model.id,
    text: modelLine(model),
    title: model.status === "failed" ? (model.reason ?? "failed to load") : "",
  }));
}

/** The server panel's line for the LoRA adapters. */
export function describeAdapters(adapters) {
  return adapters.length ? adapters.join(", ") : "none";
}

/** What /health says, in words for the page: the state of the load chip and its text, and
 * the server panel's lines. With a catalogue (`health.models`) see describeCatalogueHealth:
 * `chosen` is the chosen model as the page knows it. */
export function describeHealth(health, chosen) {
  if (Array.isArray(health.models)) return describeCatalogueHealth(health, chosen);
  const busy = health.busy_slots ?? 0;
  const queued = health.queue_length ?? 0;
  let state = "idle";
  let text = "idle";
  if (health.status === "loading") [state, text] = ["loading", "loading model"];
  else if (health.status === "draining") [state, text] = ["down", "shutting down"];
  else if (busy || queued) {
    state = "busy";
    text = `${busy}/${health.parallel} busy` + (queued ? `, ${queued} queued` : "");
  }
  const gpu = health.gpu_offload ? `${health.n_gpu_layers} layers offloaded` : "none (CPU)";
  return {
    state,
    text,
    info: {
      model: health.model ?? "–",
      ctx: health.n_ctx ? `${health.n_ctx.toLocaleString("en")} tokens` : "–",
      slots: health.parallel ? `${busy} of ${health.parallel} busy` : "–",
      queue: `${queued} waiting`,
      kv: health.n_ctx ? `${health.kv_cells_used ?? 0} of ${health.n_ctx} cells` : "–",
      gpu,
      input: (health.input_modalities ?? ["text"]).join(", "),
      prompts: describePromptCache(health.prompt_cache),
    },
  };
}

/** The prompt cache's tiers below the KV cache (/health's `prompt_cache`: [{tier, entries,
 * bytes, hits, misses}]) on one line each, or null (the line hidden) with none. */
export function describePromptCache(tiers) {
  if (!tiers?.length) return null;
  const mib = (bytes) => `${(bytes / 2 ** 20).toFixed(bytes < 10 * 2 ** 20 ? 1 : 0)} MiB`;
  return tiers
    .map((t) => `${t.tier}: ${t.entries} prompts, ${mib(t.bytes)}, ${t.hits} hits`)
    .join("\n");
}

/** /health with a catalogue ({status, models: [{id, status}]}) in words for the page. The
 * load chip follows the chosen model (`chosen`: its `id`; `loading`, whether the page's own
 * load of it runs; `reason`, why its last load failed or was refused, or null; `input`, what
 * it reads, or null; null before the page has chosen): "loading <id>" while it loads, then
 * "loaded"; a failure gives its reason as `problem`. The server panel lists every model with
 * its status in place of one engine's figures (the lines that do not apply are null). */
export function describeCatalogueHealth(health, chosen) {
  const models = health.models;
  return {
    ...catalogueChip(health, chosen),
    info: {
      model: chosen?.id ?? "none",
      models: models.length ? models.map(modelLine).join("\n") : "none",
      adapters: null,
      ctx: null,
      slots: null,
      queue: null,
      kv: null,
      gpu: null,
      input: chosen?.input ? chosen.input.join(", ") : null,
      prompts: null,
    },
  };
}

function catalogueChip(health, chosen) {
  const count = health.models.length;
  const status = health.models.find((model) => model.id === chosen?.id)?.status;
  const chip = (state, text, problem = null) => ({ state, text, problem });
  if (health.status === "draining") return chip("down", "shutting down");
  if (!count) return chip("down", "no models");
  if (!chosen) return chip("unknown", `${count} model${count === 1 ? "" : "s"}`);
  if (chosen.loading || status === "loading") return chip("loading", `loading ${chosen.id}`);
  if (status === "loaded") return chip("idle", "loaded");
  if (status === "failed" || chosen.reason) {
    return chip("down", `${chosen.id} failed`, chosen.reason ?? `${chosen.id} failed to load`);
  }
  return chip("unknown", "not loaded");
}
