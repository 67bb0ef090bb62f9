// The visible strings of the page's JavaScript in the edition's language (locales/README.md).
//
// The explorers, live panels, quizzes and the review page write English, in the notebooks'
// outputs and from their scripts, the same in every edition (their code and numbers are the
// English book's, byte for byte). On a page of the Portuguese or Chinese edition,
// _ext/mhbook_editions.py puts the edition's string table (locales/strings/<lang>.json) in
// `window.mhbookStrings` before this script; this script then rewrites, inside those panels,
// every text node, and every aria-label, title and placeholder, whose whole text is a key of
// the table, now and whenever a panel's script writes new text. A key with `{name}` parts
// ("This question comes back {when}.") stands for any text in their place, carried over into
// the translation (itself translated where the table has it: "in {n} days"). Without a table (the English book, Jupyter, Colab) it does nothing.
(function () {
  "use strict";
  const table = window.mhbookStrings || {};
  if (!Object.keys(table).length) return;
  const PANELS = ".mhbook-explorer, .mhbook-quiz, .mhbook-review";
  const ATTRIBUTES = ["aria-label", "title", "placeholder"];
  // Never text in these: code, math, and what a model writes or a reader types (pre).
  const SKIP = "script, style, code, pre, textarea, .MathJax, .math";
  const exact = new Map();
  const patterns = [];
  const escape = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  for (const [english, translated] of Object.entries(table)) {
    if (!/\{\w+\}/.test(english)) {
      exact.set(english, translated);
      continue;
    }
    const names = [];
    const source = english
      .split(/\{(\w+)\}/)
      .map((part, i) => (i % 2 ? (names.push(part), "(.+?)") : escape(part)))
      .join("");
    patterns.push([new RegExp(`^${source}$`, "s"), names, translated]);
  }

  function translate(text) {
    const core = text.trim();
    if (!core || !/[A-Za-z]/.test(core)) return null;
    if (exact.has(core)) return text.replace(core, exact.get(core));
    for (const [pattern, names, translated] of patterns) {
      const found = core.match(pattern);
      if (found) {
        const part = (n) => {
          const text = found[1 + names.indexOf(n)];
          return translate(text) ?? text; // "in 2 days" inside "comes back in 2 days."
        };
        const filled = translated.replace(/\{(\w+)\}/g, (_, n) => part(n));
        return text.replace(core, filled);
      }
    }
    return null;
  }

  function walk(root) {
    if (root.nodeType === 3) {
      const parent = root.parentElement;
      if (parent && parent.closest(SKIP)) return;
      const done = translate(root.nodeValue);
      if (done !== null && done !== root.nodeValue) root.nodeValue = done;
      return;
    }
    const texts = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let node = texts.nextNode(); node; node = texts.nextNode()) {
      const parent = node.parentElement;
      if (parent && parent.closest(SKIP)) continue;
      const done = translate(node.nodeValue);
      if (done !== null && done !== node.nodeValue) node.nodeValue = done;
    }
    const elements = root.nodeType === 1 ? [root, ...root.querySelectorAll("*")] : [];
    for (const el of elements) {
      for (const name of ATTRIBUTES) {
        const value = el.getAttribute(name);
        const done = value && translate(value);
        if (done && done !== value) el.setAttribute(name, done);
      }
    }
  }

  function inPanel(node) {
    const el = node.nodeType === 1 ? node : node.parentElement;
    return el && el.closest(PANELS);
  }

  function start() {
    document.querySelectorAll(PANELS).forEach(walk);
    new MutationObserver((changes) => {
      for (const change of changes) {
        if (!inPanel(change.target)) continue;
        if (change.type === "characterData") walk(change.target);
        else if (change.type === "attributes") walk(change.target);
        else change.addedNodes.forEach((node) => walk(node));
      }
    }).observe(document.body, {
      childList: true,
      characterData: true,
      subtree: true,
      attributes: true,
      attributeFilter: ATTRIBUTES,
    });
  }

  // A number typed into a quiz, as the edition writes it (pt-BR: decimal comma).
  window.mhbookDecimalComma = document.documentElement.lang.startsWith("pt");

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
