// This server's own API, as the page uses it. Paths are relative, so the page works under a
// proxy's path prefix (--root-path) as at `/`.

import { SseParser, errorMessage, listedModels } from "./format.js";

const KEY_ITEM = "edgeserve.api-key";

/** An answer that was not a success: its status and the server's message. */
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/** The API key lives in sessionStorage: this tab only, gone when it closes. */
export const apiKey = {
  get: () => sessionStorage.getItem(KEY_ITEM) || "",
  set: (key) => sessionStorage.setItem(KEY_ITEM, key),
  forget: () => sessionStorage.removeItem(KEY_ITEM),
};

async function call(path, { key = apiKey.get(), ...init } = {}) {
  const headers = { ...init.headers };
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(path, { ...init, headers });
  if (!response.ok) throw new ApiError(response.status, errorMessage(response.status, await response.text()));
  return response;
}

/** GET /v1/models as listedModels reads it: the served model and its LoRA adapters, or a
 * catalogue's models with their status; `key` tries a key other than the stored one. */
export async function listModels(key = apiKey.get()) {
  return listedModels((await (await call("v1/models", { key })).json()).data);
}

/** POST /models/load: load a catalogue model now; resolves once it has loaded, throws an
 * ApiError that says why when it could not. */
export async function loadModel(id) {
  await call("models/load", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model: id }),
  });
}

/** GET /health: its JSON at any status (503 while the model loads), null when unreachable. */
export async function health() {
  try {
    const response = await fetch("health", { cache: "no-store" });
    return await response.json();
  } catch {
    return null;
  }
}

/** POST /v1/chat/completions, streamed: yields each chunk's JSON until `[DONE]`. Aborting
 * `signal` closes the connection, and the server cancels the answer. */
export async function* chatStream(body, signal) {
  const response = await call("v1/chat/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
    signal,
  });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  const parser = new SseParser();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    for (const data of parser.push(value)) {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new ApiError(chunk.error.code, chunk.error.message);
      yield chunk;
    }
  }
}
