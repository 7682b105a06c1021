// The chat page: settings, the conversation (kept in this page only), the server's state.

import { ApiError, apiKey, chatStream, health, listModels, loadModel } from "./api.js";
import { chosenModel, describeAdapters, describeHealth, modelChoices } from "./format.js";
import { AnswerView, attachmentChip, userMessage } from "./view.js";

const $ = (id) => document.getElementById(id);
const ui = {
  log: $("log"),
  empty: $("empty"),
  composer: $("composer"),
  prompt: $("prompt"),
  send: $("send"),
  stop: $("stop"),
  attach: $("attach"),
  file: $("file"),
  attachments: $("attachments"),
  system: $("system"),
  temperature: $("temperature"),
  maxTokens: $("max-tokens"),
  modelChoice: $("model-choice"),
  seed: $("seed"),
  settings: $("settings"),
  settingsToggle: $("settings-toggle"),
  keyDialog: $("key-dialog"),
  keyForm: $("key-form"),
  keyInput: $("key-input"),
  keyError: $("key-error"),
  keyState: $("key-state"),
  problem: $("model-problem"),
};

const state = {
  model: null, // the id GET /v1/models gives (--model alone); null until then, and with a catalogue
  catalogue: null, // a catalogue's models as last listed ({id, status, reason, input}), else null
  listed: null, // the names the chooser shows, one a line
  chosen: null, // what the page sends as `model` (the base, an adapter, a catalogue model); null
  // until the API answered
  loading: null, // the catalogue model the page is loading (its POST /models/load runs)
  refused: null, // why the page's last load of the chosen catalogue model failed (the server says)
  health: undefined, // the last /health answer (null: unreachable; undefined: none yet)
  history: [], // the turns sent with the next request
  images: [], // data URLs attached to the next message
  controller: null, // the running answer's AbortController
  follow: true, // keep the newest text in view (the reader has not scrolled up)
  epoch: 0, // counts the clears: an answer that ends after one stays out of the history
};

// ---- the server: model, adapters or catalogue, key, load -----------------------------------

const CHOICE_ITEM = "edgeserve.model";

/** The adapter or catalogue model chosen, kept in localStorage across reloads (nothing is kept
 * for the base). */
const keptChoice = {
  get() {
    try {
      return localStorage.getItem(CHOICE_ITEM);
    } catch {
      return null; // storage turned off
    }
  },
  set(name) {
    try {
      if (name === state.model) localStorage.removeItem(CHOICE_ITEM);
      else localStorage.setItem(CHOICE_ITEM, name);
    } catch {
      // storage turned off: the choice lasts as long as the page
    }
  },
};

function optionGroup(label, names) {
  const group = document.createElement("optgroup");
  group.label = label;
  group.append(...names.map((name) => new Option(name, name)));
  return group;
}

function choose(name) {
  state.chosen = name;
  ui.modelChoice.value = name;
  $("empty-model").textContent = name;
  keptChoice.set(name);
}

/** What GET /v1/models listed (as listedModels reads it): the model's name and the chooser
 * when there are adapters, or a catalogue's chooser (a choice no longer listed falls back). */
function setModels(listed) {
  state.model = listed.base;
  state.catalogue = listed.models;
  if (listed.models) showCatalogue(listed.models);
  else showAdapters(listed);
  const chosen = chosenModel(listed, state.chosen ?? keptChoice.get());
  const changed = chosen !== state.chosen || ui.modelChoice.value !== chosen;
  if (chosen !== null && changed) choose(chosen);
  ui.keyState.hidden = !apiKey.get();
  if (listed.models) showHealth(); // the chip follows the chosen model
}

function showAdapters(listed) {
  $("model-name").textContent = listed.base;
  $("info-adapters").textContent = describeAdapters(listed.adapters);
  const names = [listed.base, ...listed.adapters].join("\n");
  if (names !== state.listed) {
    state.listed = names;
    ui.modelChoice.replaceChildren(
      optionGroup("Base model", [listed.base]),
      ...(listed.adapters.length ? [optionGroup("LoRA adapters", listed.adapters)] : []),
    );
    ui.modelChoice.hidden = listed.adapters.length === 0;
    $("model-name").hidden = listed.adapters.length > 0;
  }
}

/** A catalogue: every model in the chooser with its status (the texts change in place, so an
 * open chooser stays open); the name alone says when there is none. */
function showCatalogue(models) {
  const choices = modelChoices(models);
  const ids = choices.map((choice) => choice.value);
  if (ids.join("\n") !== state.listed) {
    state.listed = ids.join("\n");
    ui.modelChoice.replaceChildren(optionGroup("Models", ids));
    ui.modelChoice.title = "Which model answers: choosing one loads it";
    ui.modelChoice.hidden = models.length === 0;
    $("model-name").textContent = models.length ? ids.join(", ") : "no models";
    $("model-name").hidden = models.length > 0;
  }
  choices.forEach((choice, index) => {
    const option = ui.modelChoice.options[index];
    option.text = choice.text;
    option.title = choice.title;
  });
  if (listedChosen()?.status === "loaded") state.refused = null;
}

/** The chosen model as the catalogue last listed it (undefined with --model alone). */
function listedChosen() {
  return state.catalogue?.find((model) => model.id === state.chosen);
}

/** The chosen catalogue model as the page knows it (for describeHealth). */
function chosenEntry() {
  if (state.chosen === null) return null;
  const listed = listedChosen();
  return {
    id: state.chosen,
    loading: state.loading === state.chosen,
    reason: state.refused ?? listed?.reason ?? null,
    input: listed?.input ?? null,
  };
}

/** Loads the chosen catalogue model, unless it is loaded: the chip says "loading <id>" at
 * once and until it has loaded, or why it could not. */
async function loadChosen() {
  const id = state.chosen;
  state.refused = null;
  if (listedChosen()?.status !== "loaded") {
    state.loading = id;
    showHealth();
    try {
      await loadModel(id);
    } catch (err) {
      if (state.chosen === id) state.refused = err.message;
      if (err.status === 401) askForKey(err.message);
    } finally {
      if (state.loading === id) state.loading = null;
    }
  }
  refreshHealth();
}

/** The models again (an adapter may have been loaded or unloaded at run time, a catalogue
 * model's status changed); a failure waits for the next try, and a chat request shows any
 * error. */
async function relist() {
  try {
    setModels(await listModels());
  } catch {
    // unreachable, loading or a key gone stale: the next poll tries again
  }
}

async function connect() {
  try {
    setModels(await listModels());
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) askForKey(apiKey.get() ? err.message : "");
    else setTimeout(connect, 2000); // loading (503) or unreachable
  }
}

function askForKey(error) {
  if (!state.chosen) $("model-name").textContent = "API key needed";
  ui.keyDialog.hidden = false;
  ui.keyError.textContent = error;
  ui.keyError.hidden = !error;
  ui.keyInput.focus();
}

ui.keyForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  const key = ui.keyInput.value.trim();
  try {
    const listed = await listModels(key);
    apiKey.set(key);
    ui.keyDialog.hidden = true;
    ui.keyInput.value = "";
    setModels(listed);
  } catch (err) {
    askForKey(err.message);
    ui.keyInput.select();
  }
});

$("forget-key").addEventListener("click", () => {
  apiKey.forget();
  askForKey("");
});

let healthTimer = 0;

/** Polls /health (with a catalogue, the models' list too): every 5 s, every second while a
 * model loads, every 30 s while the tab is hidden. */
async function refreshHealth() {
  const body = await health();
  state.health = body;
  if (body?.models && state.chosen !== null) await relist(); // the models' reasons, at once
  showHealth();
  let delay = 5000;
  const loading = body?.status === "loading" || body?.models?.some((m) => m.status === "loading");
  if (loading || state.loading) delay = 1000;
  else if (body && !body.models && state.chosen) relist();
  clearTimeout(healthTimer); // one timer, however many polls ran at once
  healthTimer = setTimeout(refreshHealth, document.hidden ? 30000 : delay);
}

/** The last /health answer on the page: the load chip, the server panel's lines (those that
 * do not apply hidden), a failed load's reason, the attach button. */
function showHealth() {
  const body = state.health;
  if (body === undefined) return;
  const chip = $("load-chip");
  if (body === null) {
    chip.dataset.state = "down";
    $("load-text").textContent = "unreachable";
    return;
  }
  const chosen = body.models ? chosenEntry() : undefined;
  const seen = describeHealth(body, chosen);
  chip.dataset.state = seen.state;
  $("load-text").textContent = seen.text;
  for (const [name, value] of Object.entries(seen.info)) {
    const line = $(`info-${name}`);
    line.textContent = value ?? "";
    line.hidden = line.previousElementSibling.hidden = value === null;
  }
  ui.problem.textContent = seen.problem ?? "";
  ui.problem.hidden = !seen.problem;
  const input = body.models ? chosen?.input : body.input_modalities;
  ui.attach.hidden = !(input ?? []).includes("image");
}

document.addEventListener("visibilitychange", () => document.hidden || refreshHealth());

// ---- the conversation ----------------------------------------------------------------------

function followEnd() {
  if (state.follow) ui.log.scrollTop = ui.log.scrollHeight;
}

ui.log.addEventListener("scroll", () => {
  state.follow = ui.log.scrollHeight - ui.log.scrollTop - ui.log.clientHeight < 48;
});

function chatRequest(turn) {
  const system = ui.system.value.trim();
  const body = {
    model: state.chosen,
    messages: [...(system ? [{ role: "system", content: system }] : []), ...state.history, turn],
    stream: true,
    stream_options: { include_usage: true },
    temperature: Number(ui.temperature.value),
  };
  if (ui.maxTokens.value) body.max_tokens = Number(ui.maxTokens.value);
  if (ui.seed.value) body.seed = Number(ui.seed.value);
  return body;
}

function userTurn(text, images) {
  if (!images.length) return { role: "user", content: text };
  const parts = images.map((url) => ({ type: "image_url", image_url: { url } }));
  return { role: "user", content: [{ type: "text", text }, ...parts] };
}

function setRunning(controller) {
  state.controller = controller;
  ui.send.hidden = controller !== null;
  ui.stop.hidden = controller === null;
}

/** Reads an answer's stream into `reply` (its text, timings, usage and finish reason) and
 * redraws `answer` as it grows. */
async function readAnswer(body, signal, reply, answer) {
  for await (const chunk of chatStream(body, signal)) {
    const choice = chunk.choices?.[0];
    const piece = choice?.delta?.content;
    if (piece) {
      reply.lastTokenAt = performance.now();
      reply.firstTokenAt ??= reply.lastTokenAt;
      reply.text += piece;
      answer.update(reply.text);
    }
    reply.finish = choice?.finish_reason ?? reply.finish;
    reply.usage = chunk.usage ?? reply.usage;
  }
}

async function send() {
  const text = ui.prompt.value.trim();
  if (state.controller || !state.chosen || (!text && !state.images.length)) return;
  const images = state.images.splice(0);
  showAttachments();
  const turn = userTurn(text, images);
  const asked = userMessage(text, images);
  const answer = new AnswerView(state.chosen, followEnd);
  ui.prompt.value = "";
  fitPrompt();
  ui.empty.hidden = true;
  ui.log.append(asked, answer.node);
  state.follow = true;
  followEnd();

  const controller = new AbortController();
  const epoch = state.epoch;
  const reply = {
    text: "",
    usage: null,
    finish: null,
    startedAt: performance.now(),
    firstTokenAt: null,
    lastTokenAt: null,
  };
  setRunning(controller);
  const listed = listedChosen();
  if (listed && listed.status !== "loaded") setTimeout(refreshHealth, 250); // it loads first
  try {
    await readAnswer(chatRequest(turn), controller.signal, reply, answer);
    answer.finish(reply, reply.finish === "length" ? "max tokens reached" : "");
  } catch (err) {
    if (!controller.signal.aborted) {
      answer.failed(err.message);
      asked.classList.add("dropped");
      giveBack(text, images);
      if (err.status === 401) askForKey(err.message);
      return;
    }
    answer.finish({ ...reply, usage: null }, "stopped");
  } finally {
    setRunning(null);
    setTimeout(refreshHealth, 250); // once the server has seen the end too
  }
  if (epoch !== state.epoch) return;
  if (reply.text) state.history.push(turn, { role: "assistant", content: reply.text });
  else asked.classList.add("dropped");
}

/** A message that failed goes back into the composer, unless something new is there. */
function giveBack(text, images) {
  if (ui.prompt.value || state.images.length) return;
  ui.prompt.value = text;
  state.images.push(...images);
  showAttachments();
  fitPrompt();
}

function clearConversation() {
  state.controller?.abort();
  state.epoch += 1;
  state.history = [];
  ui.log.querySelectorAll(".msg").forEach((node) => node.remove());
  ui.empty.hidden = false;
  ui.prompt.focus();
}

// ---- attachments -----------------------------------------------------------------------------

function readAsDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

function showAttachments() {
  ui.attachments.replaceChildren(
    ...state.images.map((url, index) =>
      attachmentChip(url, () => {
        state.images.splice(index, 1);
        showAttachments();
      }),
    ),
  );
  ui.attachments.hidden = state.images.length === 0;
}

ui.attach.addEventListener("click", () => ui.file.click());
ui.file.addEventListener("change", async () => {
  for (const file of ui.file.files) state.images.push(await readAsDataUrl(file));
  ui.file.value = "";
  showAttachments();
});

// ---- the composer and the settings -----------------------------------------------------------

function fitPrompt() {
  ui.prompt.style.height = "auto";
  ui.prompt.style.height = `${Math.min(ui.prompt.scrollHeight, 200)}px`;
}

ui.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  send();
});
ui.prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    ui.composer.requestSubmit();
  }
});
ui.prompt.addEventListener("input", fitPrompt);
ui.stop.addEventListener("click", () => state.controller?.abort());
$("clear").addEventListener("click", clearConversation);
ui.modelChoice.addEventListener("change", () => {
  choose(ui.modelChoice.value);
  if (state.catalogue) loadChosen();
});
ui.temperature.addEventListener("input", () => {
  $("temperature-value").textContent = ui.temperature.value;
});

function showSettings(open) {
  ui.settings.classList.toggle("open", open);
  ui.settingsToggle.setAttribute("aria-expanded", String(open));
}

ui.settingsToggle.addEventListener("click", (event) => {
  event.stopPropagation();
  showSettings(!ui.settings.classList.contains("open"));
});
$("settings-close").addEventListener("click", () => showSettings(false));
document.addEventListener("click", (event) => {
  if (!ui.settings.contains(event.target)) showSettings(false); // a tap beside the drawer
});

refreshHealth();
connect();
ui.prompt.focus();
