// Runs an explorer's code (mhbook/viz/explorers/svg.py: embed) with two names in scope:
// `root`, the explorer's <div>, and `data`, the JSON that Python wrote into it.
(function (uid) {
  "use strict";
  const me = document.currentScript; // null where a notebook runs the script with eval
  const root = (me && me.closest(".mhbook-explorer")) || document.getElementById(uid);
  if (!root) return;
  const holder = root.querySelector(":scope > script.mhbook-explorer-data");
  const data = JSON.parse(holder.textContent);
  /* CODE */
})(/* UID */);
