// Shared by the chat and the engine view: the API key, fetch with auth, tabs, health.
"use strict";

const Cadence = (() => {
  const KEY_STORE = "cadence.apiKey";
  let keyPrompt = null; // the open dialog's promise, shared by every caller that got a 401
  let dismissed = false; // the user closed the dialog without a key: no more prompts by itself

  function apiKey() {
    return localStorage.getItem(KEY_STORE) || "";
  }

  function askForKey() {
    if (keyPrompt) return keyPrompt;
    const dialog = document.getElementById("api-key-dialog");
    const input = document.getElementById("api-key-input");
    input.value = apiKey();
    keyPrompt = new Promise((resolve) => {
      dialog.addEventListener(
        "close",
        () => {
          if (dialog.returnValue === "save") localStorage.setItem(KEY_STORE, input.value.trim());
          dismissed = dialog.returnValue !== "save";
          keyPrompt = null;
          resolve(dialog.returnValue === "save");
        },
        { once: true },
      );
    });
    dialog.returnValue = "";
    dialog.showModal();
    input.focus();
    return keyPrompt;
  }

  // fetch() on this server with the API key; a 401 asks for the key once and retries.
  async function api(path, options = {}) {
    for (let attempt = 0; ; attempt++) {
      const headers = { ...(options.headers || {}) };
      const key = apiKey();
      if (key) headers["Authorization"] = "Bearer " + key;
      const res = await fetch(path, { ...options, headers });
      if (res.status !== 401 || attempt > 0 || dismissed) return res;
      if (!(await askForKey())) return res;
    }
  }

  // The JSON body, or an Error carrying the server's OpenAI-style error message.
  async function json(path, options = {}) {
    const res = await api(path, options);
    let body = null;
    try {
      body = await res.json();
    } catch (_) {
      /* not JSON */
    }
    if (!res.ok) {
      const msg = (body && body.error && body.error.message) || res.status + " " + res.statusText;
      throw new Error(msg);
    }
    return body;
  }

  function showView(name) {
    for (const tab of document.querySelectorAll(".tab")) {
      tab.classList.toggle("active", tab.dataset.view === name);
    }
    for (const view of document.querySelectorAll(".view")) {
      view.classList.toggle("active", view.id === "view-" + name);
    }
    location.hash = name;
    document.dispatchEvent(new CustomEvent("cadence:view", { detail: name }));
  }

  async function checkHealth() {
    const dot = document.getElementById("health");
    try {
      const res = await fetch("/health");
      dot.className = "dot " + (res.ok ? "ok" : "bad");
      dot.title = res.ok ? "engine healthy" : "engine unavailable";
    } catch (_) {
      dot.className = "dot bad";
      dot.title = "server unreachable";
    }
  }

  async function loadModel() {
    try {
      const models = await json("/v1/models");
      Cadence.model = models.data[0].id;
      document.getElementById("model-name").textContent = Cadence.model;
      if (models.data.length > 1) pickModel(models.data);
    } catch (e) {
      document.getElementById("model-name").textContent = "(" + e.message + ")";
    }
  }

  // LoRA adapters (served beside the base model): the chat asks the one picked here.
  function pickModel(cards) {
    const pick = document.createElement("select");
    pick.id = "model-pick";
    pick.title = "the model the chat asks: the base, or a LoRA adapter over it";
    for (const card of cards) {
      const opt = document.createElement("option");
      opt.value = card.id;
      opt.textContent = card.parent ? card.id + " (LoRA)" : card.id;
      pick.appendChild(opt);
    }
    pick.addEventListener("change", () => { Cadence.model = pick.value; });
    document.getElementById("model-name").after(pick);
  }

  function fmt(n, digits = 0) {
    if (n === null || n === undefined || Number.isNaN(n)) return "–";
    return Number(n).toLocaleString("en-US", {
      minimumFractionDigits: digits,
      maximumFractionDigits: digits,
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    for (const tab of document.querySelectorAll(".tab")) {
      tab.addEventListener("click", () => showView(tab.dataset.view));
    }
    document.getElementById("key-button").addEventListener("click", () => {
      dismissed = false;
      askForKey().then((saved) => saved && loadModel());
    });
    const wanted = location.hash.replace("#", "");
    if (wanted === "engine") showView("engine");
    checkHealth();
    setInterval(checkHealth, 5000);
    loadModel();
  });

  return { api, json, askForKey, showView, fmt, model: null };
})();
