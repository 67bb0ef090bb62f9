// Review that comes back. Every chapter page records the first answer a reader gives to each
// question in a page view (quiz.js's "mhbook-quiz-answer" event): right is FSRS's rating Good,
// wrong is Again, and ts-fsrs (vendored from the npm registry, window.FSRS) schedules the
// question's next review. The history stays in this browser's localStorage under STORE; the
// review page (the book's review.md, where #mhbook-review stands) shows the questions that
// are due, lets the reader export, import and reset the history. No account, no server.
(function () {
  "use strict";
  const STORE = "mhbook-review-v1";
  // Anki's "learn ahead limit": a question due within the next 20 minutes is shown now, so
  // that a wrong answer (FSRS brings it back in minutes) is on the review page at once.
  const LEARN_AHEAD_MS = 20 * 60 * 1000;
  // One learning step of a minute: a wrong answer comes back after a minute, a first right
  // one graduates at once (two days with FSRS's default weights; ts-fsrs's default steps,
  // 1 and 10 minutes, would keep a right answer in learning for 10 minutes more). FSRS's
  // desired retention stays at its default, 0.9.
  const scheduler = FSRS.fsrs({ learning_steps: ["1m"], relearning_steps: ["1m"] });

  function load() {
    try {
      const data = JSON.parse(localStorage.getItem(STORE) || "{}");
      return data && data.version === 1 ? data : { version: 1, cards: {} };
    } catch (error) {
      return { version: 1, cards: {} };
    }
  }
  function save(data) {
    localStorage.setItem(STORE, JSON.stringify(data));
  }

  // One answer, scheduled: the question's card moves on by FSRS's rule.
  function record(id, correct, now = new Date()) {
    const data = load();
    const entry = data.cards[id];
    const card = entry ? FSRS.TypeConvert.card(entry.card) : FSRS.createEmptyCard(now);
    const next = scheduler.next(card, now, correct ? FSRS.Rating.Good : FSRS.Rating.Again).card;
    data.cards[id] = {
      card: next,
      answers: ((entry && entry.answers) || 0) + 1,
      lastCorrect: correct,
    };
    save(data);
    return data.cards[id];
  }

  function due(data, now = new Date()) {
    return Object.entries(data.cards)
      .filter(([, entry]) => new Date(entry.card.due).getTime() <= now.getTime() + LEARN_AHEAD_MS)
      .sort((a, b) => new Date(a[1].card.due) - new Date(b[1].card.due))
      .map(([id]) => id);
  }

  function when(date) {
    const minutes = Math.round((new Date(date) - new Date()) / 60000);
    if (minutes < 1) return "now";
    if (minutes < 60) return `in ${minutes} minute${minutes === 1 ? "" : "s"}`;
    const hours = Math.round(minutes / 60);
    if (hours < 36) return `in ${hours} hour${hours === 1 ? "" : "s"}`;
    const days = Math.round(hours / 24);
    return `in ${days} days`;
  }

  document.addEventListener("mhbook-quiz-answer", (event) => {
    const entry = record(event.detail.id, event.detail.correct);
    const quiz = document.querySelector(`.mhbook-quiz[data-quiz-id="${event.detail.id}"]`);
    if (!quiz) return;
    let note = quiz.querySelector(".mhbook-quiz-next");
    if (!note) {
      note = document.createElement("p");
      note.className = "mhbook-quiz-next";
      quiz.append(note);
    }
    note.textContent = `This question comes back ${when(entry.card.due)}.`;
  });

  const root = document.getElementById("mhbook-review");
  if (!root) return;
  const bank = window.mhbookQuizBank || {};
  const base = new URL(root.dataset.bank, location.href); // the book's _static/ folder
  const bookRoot = new URL("../", base);

  function questionElement(id) {
    const item = bank[id];
    const box = document.createElement("section");
    box.className = "mhbook-review-item";
    const from = document.createElement("p");
    const link = document.createElement("a");
    const page = new URL(item.page, bookRoot);
    link.href = page.href;
    link.textContent = item.title;
    from.append("From ", link, ":");
    box.append(from);
    const holder = document.createElement("div");
    holder.innerHTML = item.html;
    // The explanations' links were written for the chapter's page.
    holder.querySelectorAll("a[href]").forEach((a) => {
      const href = a.getAttribute("href");
      if (href.startsWith("#")) a.href = page.href.split("#")[0] + href;
      else if (!/^[a-z]+:/.test(href)) a.href = new URL(href, page).href;
    });
    const quiz = holder.querySelector(".mhbook-quiz");
    quiz.id = "";
    box.append(quiz);
    window.mhbookQuiz.mount(quiz);
    return box;
  }

  function render() {
    const data = load();
    const ids = due(data).filter((id) => id in bank);
    const answered = Object.keys(data.cards).length;
    root.replaceChildren();
    const summary = document.createElement("p");
    summary.className = "mhbook-review-summary";
    summary.setAttribute("role", "status");
    const total = Object.keys(bank).length;
    const upcoming = Object.values(data.cards)
      .map((entry) => new Date(entry.card.due))
      .filter((date) => date.getTime() > Date.now() + LEARN_AHEAD_MS)
      .sort((a, b) => a - b)[0];
    summary.textContent =
      `${ids.length} question${ids.length === 1 ? "" : "s"} to review now. ` +
      `You have answered ${answered} of the book's ${total} questions.` +
      (upcoming ? ` The next one after these comes back ${when(upcoming)}.` : "");
    root.append(summary);
    for (const id of ids) root.append(questionElement(id));
    if (window.MathJax && window.MathJax.Hub) window.MathJax.Hub.Queue(["Typeset", window.MathJax.Hub, root]);
    root.append(controls());
  }

  function controls() {
    const box = document.createElement("div");
    box.className = "mhbook-review-controls";
    const heading = document.createElement("h2");
    heading.textContent = "Your history";
    const exportButton = document.createElement("button");
    exportButton.type = "button";
    exportButton.textContent = "Export";
    exportButton.addEventListener("click", () => {
      const blob = new Blob([JSON.stringify(load(), null, 1)], { type: "application/json" });
      const a = document.createElement("a");
      a.href = URL.createObjectURL(blob);
      a.download = "mhbook-review.json";
      document.body.append(a);
      a.click();
      a.remove();
    });
    const importLabel = document.createElement("label");
    importLabel.textContent = "Import a history file ";
    const importBox = document.createElement("input");
    importBox.type = "file";
    importBox.accept = "application/json,.json";
    importLabel.append(importBox);
    const status = document.createElement("p");
    status.setAttribute("role", "status");
    importBox.addEventListener("change", async () => {
      try {
        const data = JSON.parse(await importBox.files[0].text());
        if (!data || data.version !== 1 || typeof data.cards !== "object") throw new Error();
        save(data);
        render();
      } catch (error) {
        status.textContent = "That file is not an mhbook review history.";
      }
    });
    const reset = document.createElement("button");
    reset.type = "button";
    reset.textContent = "Reset…";
    reset.addEventListener("click", () => {
      if (reset.dataset.armed) {
        localStorage.removeItem(STORE);
        render();
      } else {
        reset.dataset.armed = "1";
        reset.textContent = "Reset: forget every answer (press again)";
      }
    });
    box.append(heading, exportButton, " ", importLabel, " ", reset, status);
    return box;
  }

  window.mhbookReview = { record, due, load, STORE };
  render();
})();
