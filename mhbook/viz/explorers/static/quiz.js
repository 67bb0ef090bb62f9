// The chapters' quizzes, answerable: each <div class="mhbook-quiz"> (written by the book's
// _ext/mhbook_quiz.py, or by mhbook.viz.explorers.quiz.quiz_html in a reader copy) gets radio
// buttons (or a number box) and a Check button; the explanation of the reader's choice appears
// in a live region, which screen readers announce. A question's first answer in a page view is
// sent as the event "mhbook-quiz-answer" ({id, correct}); the book's review (quiz_review.js)
// schedules it. Written by hand, because jupyterquiz (2.9, the well-kept tool for JSON quizzes in
// Jupyter Book) falls back to MathJax from a CDN, makes its multiple-choice answers clickable
// labels that the keyboard cannot reach, and does not announce its feedback; and its questions
// live in JSON, where the book's translations would not reach them.
(function () {
  "use strict";
  if (window.mhbookQuiz) {
    window.mhbookQuiz.mountAll(document);
    return;
  }
  let count = 0;

  // A mask written as rows of 0/1 joined by "/" (1 = may attend), drawn as a grid.
  function maskPicture(text) {
    const rows = text.split("/");
    const cell = 14;
    const svgNS = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(svgNS, "svg");
    svg.setAttribute("width", rows[0].length * cell + 1);
    svg.setAttribute("height", rows.length * cell + 1);
    svg.setAttribute("role", "img");
    svg.setAttribute(
      "aria-label",
      "mask, queries by rows: " + rows.map((r) => r.split("").join(" ")).join("; ")
    );
    svg.classList.add("mhbook-quiz-mask");
    rows.forEach((row, i) =>
      row.split("").forEach((v, j) => {
        const rect = document.createElementNS(svgNS, "rect");
        rect.setAttribute("x", j * cell + 0.5);
        rect.setAttribute("y", i * cell + 0.5);
        rect.setAttribute("width", cell);
        rect.setAttribute("height", cell);
        rect.setAttribute("class", v === "1" ? "attend" : "blocked");
        svg.appendChild(rect);
      })
    );
    return svg;
  }

  // The picked choice's explanation, copied into the live region (typeset math included:
  // the explanations stay in the page, folded but measurable, so MathJax typesets them
  // with the rest; the copy drops their ids).
  function spokenText(el) {
    const copy = el.cloneNode(true);
    copy.querySelectorAll("script[type^='math/tex']").forEach((s) => s.replaceWith(s.textContent));
    copy.querySelectorAll(".MathJax, .MathJax_Preview, .MathJax_Display").forEach((e) => e.remove());
    return copy.textContent.replace(/\\[()[\]]/g, "").replace(/\s+/g, " ").trim();
  }

  function announce(quiz, choice, correct) {
    const result = quiz.querySelector(".mhbook-quiz-result");
    result.replaceChildren();
    const verdict = document.createElement("strong");
    verdict.textContent = correct ? "✓ Right. " : "✗ Not right. ";
    result.append(verdict);
    if (choice) {
      const why = choice.querySelector(".mhbook-quiz-feedback").cloneNode(true);
      why.querySelectorAll("[id]").forEach((el) => el.removeAttribute("id"));
      why.querySelectorAll("pre").forEach((pre) => (pre.tabIndex = 0));
      result.append(...why.childNodes);
      result.dataset.choice = choice.dataset.value;
    }
    result.className = "mhbook-quiz-result " + (correct ? "right" : "wrong");
    const raw = result.querySelector(".math:not(.MathJax_Processed)");
    if (raw && window.MathJax && window.MathJax.Hub && !result.querySelector(".MathJax, .MathJax_Display")) {
      window.MathJax.Hub.Queue(["Typeset", window.MathJax.Hub, result]);
    }
    if (!quiz.dataset.answered) {
      quiz.dataset.answered = "1";
      document.dispatchEvent(
        new CustomEvent("mhbook-quiz-answer", { detail: { id: quiz.dataset.quizId, correct } })
      );
    }
  }

  function mountChoices(quiz, form, choices) {
    const answer = Number(quiz.dataset.answer);
    // The choices stay a list; a group around it names them by the question.
    const list = quiz.querySelector(".mhbook-quiz-choices");
    const group = document.createElement("div");
    group.setAttribute("role", "radiogroup");
    group.setAttribute("aria-labelledby", quiz.id + "-prompt");
    list.replaceWith(group);
    group.append(list);
    choices.forEach((li, n) => {
      const label = li.querySelector(".mhbook-quiz-label");
      if (quiz.dataset.kind === "mask") {
        const code = label.querySelector("code");
        if (code) code.replaceWith(maskPicture(code.textContent.trim()));
      }
      const input = document.createElement("input");
      // A choice of math alone has no text for the accessibility tree once MathJax draws it:
      // its name is its TeX, read now, before MathJax runs.
      if (label.querySelector(".math")) input.setAttribute("aria-label", spokenText(label));
      input.type = "radio";
      input.name = quiz.id;
      input.value = String(n + 1);
      input.id = `${quiz.id}-${n + 1}`;
      const wrap = document.createElement("label");
      wrap.htmlFor = input.id;
      wrap.append(...label.childNodes);
      label.replaceChildren(input, wrap);
      input.addEventListener("keydown", (event) => {
        if (event.key === "Enter") {
          event.preventDefault();
          input.checked = true; // Enter answers with the focused choice
          form.requestSubmit();
        }
      });
    });
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const picked = form.querySelector(`input[name="${quiz.id}"]:checked`);
      const result = quiz.querySelector(".mhbook-quiz-result");
      if (!picked) {
        result.className = "mhbook-quiz-result";
        result.textContent = "Pick an answer first.";
        return;
      }
      const n = Number(picked.value);
      choices.forEach((li, i) => li.classList.remove("right", "wrong"));
      choices[n - 1].classList.add(n === answer ? "right" : "wrong");
      announce(quiz, choices[n - 1], n === answer);
    });
  }

  function mountNumber(quiz, form, choices) {
    const answer = Number(quiz.dataset.answer);
    const tolerance = Number(quiz.dataset.tolerance || 0);
    const box = document.createElement("input");
    box.type = "text";
    box.inputMode = "decimal";
    box.id = quiz.id + "-number";
    box.className = "mhbook-quiz-number";
    box.setAttribute("aria-labelledby", quiz.id + "-prompt");
    form.prepend(box);
    quiz.querySelector(".mhbook-quiz-choices").classList.add("mhbook-quiz-folded");
    quiz.querySelector(".mhbook-quiz-choices").inert = true;
    const by = (value) => choices.find((li) => li.dataset.value === value);
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      // 1,234.5 in English; where the page's edition writes a decimal comma (pt-BR), 1.234,5
      // (or 1234.5: a number without a comma is read as in English)
      const text = box.value.trim().replace(/[_\s]/g, "");
      const comma = window.mhbookDecimalComma && text.includes(",");
      const plain = comma ? text.replace(/\./g, "").replace(",", ".") : text.replace(/,/g, "");
      const typed = Number(plain);
      const result = quiz.querySelector(".mhbook-quiz-result");
      if (!box.value.trim() || Number.isNaN(typed)) {
        result.className = "mhbook-quiz-result";
        result.textContent = "Type a number first.";
        return;
      }
      if (Math.abs(typed - answer) <= tolerance) return announce(quiz, by("="), true);
      const known = choices.find(
        (li) => !["=", "?"].includes(li.dataset.value) && Number(li.dataset.value) === typed
      );
      announce(quiz, known || by("?"), false);
    });
  }

  function mount(quiz) {
    if (quiz.dataset.mounted) return;
    quiz.dataset.mounted = "1";
    count += 1;
    quiz.id = quiz.id || `mhbook-quiz-${quiz.dataset.quizId}-${count}`;
    const prompt = quiz.querySelector(".mhbook-quiz-prompt");
    prompt.id = quiz.id + "-prompt";
    // A snippet wider than the box scrolls: the keyboard must reach it.
    prompt.querySelectorAll("pre").forEach((pre) => (pre.tabIndex = 0));
    const choices = Array.from(quiz.querySelectorAll(".mhbook-quiz-choice"));
    choices.forEach((li) => {
      const why = li.querySelector(".mhbook-quiz-feedback");
      why.classList.add("mhbook-quiz-folded");
      why.inert = true; // nor focused nor read: its links wait in the live region's copy
    });
    const form = document.createElement("form");
    form.className = "mhbook-quiz-form";
    const check = document.createElement("button");
    check.type = "submit";
    check.textContent = "Check";
    form.append(check);
    const result = document.createElement("div");
    result.className = "mhbook-quiz-result";
    result.setAttribute("role", "status");
    result.setAttribute("aria-live", "polite");
    quiz.append(form, result);
    if (quiz.dataset.kind === "number") mountNumber(quiz, form, choices);
    else {
      // The choices go inside the form, so that Enter on a choice checks it.
      form.prepend(quiz.querySelector(".mhbook-quiz-choices"));
      mountChoices(quiz, form, choices);
    }
  }

  function mountAll(root) {
    root.querySelectorAll(".mhbook-quiz").forEach(mount);
  }

  window.mhbookQuiz = { mount, mountAll, maskPicture };
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", () => mountAll(document));
  } else mountAll(document);
})();
