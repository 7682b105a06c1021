// The conversation's DOM. Every piece of user or model text goes in through textContent (or a
// text node): nothing here parses HTML, so no answer can become markup or script.

import { answerFigures, formatMs, formatRate, splitFences } from "./format.js";

function make(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function fromTemplate(id) {
  return document.getElementById(id).content.firstElementChild.cloneNode(true);
}

/** Prose as text, ``` fences as code blocks. */
export function renderText(container, text) {
  const nodes = splitFences(text).map((part) => {
    if (!part.code) return make("p", "prose", part.text);
    const block = make("div", "code");
    if (part.lang) block.append(make("div", "code-lang", part.lang));
    const pre = make("pre");
    pre.append(make("code", "", part.text));
    block.append(pre);
    return block;
  });
  container.replaceChildren(...nodes);
}

export function userMessage(text, images) {
  const node = fromTemplate("user-template");
  const gallery = node.querySelector(".images");
  for (const url of images) {
    const img = make("img");
    img.src = url;
    img.alt = "attached image";
    gallery.append(img);
  }
  gallery.hidden = images.length === 0;
  node.querySelector(".text").textContent = text;
  return node;
}

/** An image waiting to be sent, with a button that takes it back. */
export function attachmentChip(url, onRemove) {
  const chip = make("div", "chip");
  const img = make("img");
  img.src = url;
  img.alt = "image to send";
  const remove = make("button", "chip-remove", "×");
  remove.type = "button";
  remove.title = "Remove this image";
  remove.addEventListener("click", onRemove);
  chip.append(img, remove);
  return chip;
}

async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
  const area = make("textarea", "offscreen");
  area.value = text;
  document.body.append(area);
  area.select();
  const copied = document.execCommand("copy");
  area.remove();
  if (!copied) throw new Error("copy refused");
}

/** A model answer that grows as the stream arrives (redrawn at most once a frame), then gets
 * its figures and a copy button. */
export class AnswerView {
  constructor(modelName, onRender) {
    this.onRender = onRender;
    this.node = fromTemplate("assistant-template");
    this.node.querySelector(".who").textContent = modelName;
    this.body = this.node.querySelector(".text");
    this.body.classList.add("streaming");
    this.text = "";
    this.frame = 0;
  }

  update(text) {
    this.text = text;
    this.frame ||= requestAnimationFrame(() => {
      this.frame = 0;
      renderText(this.body, this.text);
      this.onRender();
    });
  }

  /** The answer is over: `reply` has its timings and usage (null when there is none), `note`
   * says how it ended when that is news ("stopped", "max tokens reached"). */
  finish(reply, note) {
    cancelAnimationFrame(this.frame);
    renderText(this.body, this.text);
    this.body.classList.remove("streaming");
    const figures = answerFigures(reply);
    const shown = [
      ["ttft", "TTFT", figures.ttftMs === null ? null : formatMs(figures.ttftMs)],
      ["rate", "", figures.tokensPerSecond === null ? null : formatRate(figures.tokensPerSecond)],
      ["prompt", "prompt", figures.promptTokens],
      ["cached", "cached", figures.cachedTokens],
      ["completion", "completion", figures.completionTokens],
      ["note", "", note],
    ];
    const box = this.node.querySelector(".figures");
    for (const [key, label, value] of shown) {
      if (value === null || value === undefined || value === "") continue;
      const fig = make("span", "fig");
      fig.dataset.fig = key;
      if (label) fig.append(make("span", "fig-label", label));
      fig.append(make("span", "fig-value", String(value)));
      box.append(fig);
    }
    if (this.text) this.#enableCopy();
    this.onRender();
  }

  failed(message) {
    this.node.classList.add("failed");
    this.node.append(make("p", "error", message));
    this.finish({ startedAt: 0, firstTokenAt: null, lastTokenAt: null, usage: null }, "");
  }

  #enableCopy() {
    const button = this.node.querySelector(".copy");
    const label = button.querySelector(".copy-label");
    button.hidden = false;
    button.addEventListener("click", async () => {
      try {
        await copyText(this.text);
        label.textContent = "Copied";
      } catch {
        label.textContent = "Copy failed";
      }
      setTimeout(() => (label.textContent = "Copy"), 1500);
    });
  }
}
