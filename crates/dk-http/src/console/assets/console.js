// dk console: live prompts (server-sent events), the microphones banner
// and its stop buttons, the title badge, time left, copy buttons and
// confirmations. Every card's HTML comes from the
// vessel, escaped there; nothing here builds markup from data. The
// console's secret path is kept in this origin's storage, so the sign-in
// page (/console/, where notifications lead) can forward to it.
"use strict";
(function () {
  const body = document.body;
  const KEPT = "dk-console";
  if (body.dataset.landing) {
    const kept = window.localStorage && localStorage.getItem(KEPT);
    if (kept && /^\/console\/[0-9a-f]{32}$/.test(kept)) window.location.replace(kept + "/");
    return;
  }
  const base = body.dataset.base;
  if (!base) return;
  if (window.localStorage) localStorage.setItem(KEPT, base);
  const baseTitle = body.dataset.title || document.title;
  const list = document.getElementById("prompts");
  const announce = document.getElementById("announce");

  function setCount(n) {
    body.dataset.pending = String(n);
    document.title = n > 0 ? "(" + n + ") " + baseTitle : baseTitle;
    const badge = document.getElementById("badge");
    if (badge) {
      badge.hidden = n === 0;
      badge.lastChild.textContent = String(n);
    }
    const none = document.getElementById("none");
    if (none) none.hidden = n > 0;
  }

  function arm(root) {
    for (const el of root.querySelectorAll("[data-left-ms]")) {
      el.dataset.deadline = String(performance.now() + Number(el.dataset.leftMs));
    }
  }

  function tick() {
    for (const el of document.querySelectorAll("[data-deadline]")) {
      const left = Math.max(0, Number(el.dataset.deadline) - performance.now());
      const secs = Math.floor(left / 1000);
      el.textContent = Math.floor(secs / 60) + ":" + String(secs % 60).padStart(2, "0");
    }
  }

  arm(document);
  setInterval(tick, 1000);

  for (const button of document.querySelectorAll("button[data-copy]")) {
    button.addEventListener("click", function () {
      const source = document.getElementById(button.dataset.copy);
      if (!source || !navigator.clipboard) return;
      navigator.clipboard.writeText(source.textContent).then(function () {
        announce.textContent = "Copied";
      });
    });
  }

  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  }

  if (!window.EventSource) return;
  const source = new EventSource(base + "/live");
  source.addEventListener("sync", function (event) {
    const message = JSON.parse(event.data);
    setCount(message.pending);
    if (!list) return;
    const open = new Set(message.ids.map(function (id) { return "prompt-" + id; }));
    for (const card of list.querySelectorAll(".prompt")) {
      if (!open.has(card.id)) card.remove();
    }
  });
  source.addEventListener("asked", function (event) {
    const message = JSON.parse(event.data);
    setCount(message.pending);
    if (list && !document.getElementById("prompt-" + message.id)) {
      const template = document.createElement("template");
      template.innerHTML = message.html;
      const card = template.content.firstElementChild;
      arm(card);
      list.append(card);
      announce.textContent = message.summary;
    }
  });
  source.addEventListener("closed", function (event) {
    const message = JSON.parse(event.data);
    setCount(message.pending);
    const card = document.getElementById("prompt-" + message.id);
    if (card) card.remove();
  });
  // The microphones banner: replaced whole as microphones open and close.
  const microphones = document.getElementById("microphones");
  source.addEventListener("microphones", function (event) {
    const message = JSON.parse(event.data);
    if (!microphones) return;
    const template = document.createElement("template");
    template.innerHTML = message.html;
    microphones.replaceChildren(template.content);
    microphones.hidden = message.count === 0;
  });
  // A stop is sent without leaving the page; the banner follows the feed.
  document.addEventListener("submit", function (event) {
    const form = event.target;
    if (!(form instanceof HTMLFormElement) || !form.classList.contains("mic-stop")) return;
    event.preventDefault();
    const button = form.querySelector("button");
    if (button) button.disabled = true;
    fetch(form.action, {
      method: "POST",
      body: new URLSearchParams(new FormData(form)),
      credentials: "same-origin",
      redirect: "manual",
    }).then(function (answer) {
      announce.textContent = answer.ok || answer.type === "opaqueredirect"
        ? "Microphone stopped" : "The stop did not reach the device";
    }, function () {
      form.submit();
    });
  });
  source.addEventListener("reload", function () {
    if (list) window.location.reload();
  });
})();
