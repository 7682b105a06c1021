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

/** The model the page sends as `model` (and names its answers by), from GET /v1/models'
 * `listed` ({base, adapters}) and the choice kept from before: that adapter while the server
 * lists it, else the base model. */
export function chosenModel(listed, kept) {
  return listed.adapters.includes(kept) ? kept : listed.base;
}

/** The server panel's line for the LoRA adapters. */
export function describeAdapters(adapters) {
  return adapters.length ? adapters.join(", ") : "none";
}

/** What /health says, in words for the page: the state of the load chip and its text, and
 * the server panel's lines. */
export function describeHealth(health) {
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
    },
  };
}
