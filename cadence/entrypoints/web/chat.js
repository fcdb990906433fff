// The chat view: streamed answers from /v1/chat/completions, conversations in local storage.
"use strict";

(() => {
  const STORE = "cadence.conversations";
  const SETTINGS = "cadence.chatSettings";
  const FIELDS = ["system-prompt", "temperature", "top-p", "max-tokens", "stop-strings", "json-schema"];
  const $ = (id) => document.getElementById(id);

  let conversations = [];
  let current = null; // the conversation shown
  let controller = null; // the answer being streamed (AbortController)
  let attached = []; // data: URLs of the images the next message carries

  function load() {
    try {
      conversations = JSON.parse(localStorage.getItem(STORE) || "[]");
    } catch (_) {
      conversations = [];
    }
    const settings = JSON.parse(localStorage.getItem(SETTINGS) || "{}");
    for (const f of FIELDS) if (settings[f] !== undefined) $(f).value = settings[f];
  }

  function save() {
    // (`node`: a message's element while it streams; not stored)
    const text = JSON.stringify(conversations.slice(0, 100), (k, v) => (k === "node" ? undefined : v));
    try {
      localStorage.setItem(STORE, text);
    } catch (_) {
      // Over the storage quota (images are large): keep the conversations without them.
      const lean = JSON.stringify(conversations.slice(0, 100), (k, v) => (k === "node" || k === "images" ? undefined : v));
      try {
        localStorage.setItem(STORE, lean);
      } catch (_) {
        /* storage full or off: this session keeps them in memory */
      }
    }
  }

  function saveSettings() {
    const settings = {};
    for (const f of FIELDS) settings[f] = $(f).value;
    localStorage.setItem(SETTINGS, JSON.stringify(settings));
  }

  function newConversation() {
    current = { id: Date.now().toString(36), title: "New chat", messages: [] };
    conversations.unshift(current);
    save();
    render();
  }

  function renderList() {
    const list = $("conversations");
    list.replaceChildren();
    for (const c of conversations) {
      const li = document.createElement("li");
      li.className = c === current ? "active" : "";
      const title = document.createElement("span");
      title.textContent = c.title;
      const del = document.createElement("span");
      del.className = "del";
      del.textContent = "✕";
      del.title = "Delete";
      del.addEventListener("click", (ev) => {
        ev.stopPropagation();
        conversations = conversations.filter((x) => x !== c);
        if (current === c) current = conversations[0] || null;
        save();
        if (!current) newConversation();
        else render();
      });
      li.append(title, del);
      li.addEventListener("click", () => {
        if (controller) return; // finish (or stop) the answer first
        current = c;
        render();
      });
      list.append(li);
    }
  }

  function renderMessages() {
    const box = $("messages");
    box.replaceChildren();
    if (!current.messages.length) {
      const empty = document.createElement("div");
      empty.className = "empty muted";
      empty.textContent = "Ask anything. Answers stream from the model this server runs.";
      box.append(empty);
    }
    for (const m of current.messages) {
      const div = document.createElement("div");
      div.className = "msg " + m.role + (m.error ? " error" : "");
      const role = document.createElement("div");
      role.className = "role";
      role.textContent = m.role === "user" ? "You" : Cadence.model || "assistant";
      const content = document.createElement("div");
      content.className = "content";
      content.textContent = m.error ? m.content + (m.content ? "\n" : "") + "⚠ " + m.error : m.content;
      div.append(role);
      if (m.images && m.images.length) div.append(thumbnails(m.images, "images"));
      div.append(content);
      if (m.meta) {
        const meta = document.createElement("div");
        meta.className = "meta";
        meta.textContent = m.meta;
        div.append(meta);
      }
      m.node = content;
      box.append(div);
    }
    box.scrollTop = box.scrollHeight;
  }

  function render() {
    renderList();
    renderMessages();
  }

  // Image previews: of a sent message, or (with a remove button each) of the attachments.
  function thumbnails(urls, className, onRemove) {
    const box = document.createElement("div");
    box.className = className;
    urls.forEach((url, i) => {
      const fig = document.createElement("figure");
      const img = document.createElement("img");
      img.src = url;
      img.alt = "image " + (i + 1);
      fig.append(img);
      if (onRemove) {
        const x = document.createElement("button");
        x.type = "button";
        x.textContent = "×";
        x.title = "Remove";
        x.addEventListener("click", () => onRemove(i));
        fig.append(x);
      }
      box.append(fig);
    });
    return box;
  }

  function renderAttachments() {
    const box = $("attachments");
    box.hidden = !attached.length;
    box.replaceChildren(...(attached.length ? thumbnails(attached, "", (i) => {
      attached.splice(i, 1);
      renderAttachments();
    }).children : []));
  }

  function attach(files) {
    for (const file of files) {
      if (!file.type.startsWith("image/")) continue;
      const reader = new FileReader();
      reader.onload = () => {
        attached.push(reader.result);
        renderAttachments();
      };
      reader.readAsDataURL(file);
    }
  }

  // A message as the API takes it: text, or with images, content parts.
  function apiContent(m) {
    if (!m.images || !m.images.length) return m.content;
    const parts = m.images.map((url) => ({ type: "image_url", image_url: { url } }));
    if (m.content) parts.push({ type: "text", text: m.content });
    return parts;
  }

  function busy(on) {
    $("send").hidden = on;
    $("stop").hidden = !on;
    $("regenerate").disabled = on;
  }

  // The request body from the settings panel; throws on a JSON schema that does not parse.
  function requestBody(history) {
    const messages = [];
    const system = $("system-prompt").value.trim();
    if (system) messages.push({ role: "system", content: system });
    for (const m of history) if (!m.error || m.content) messages.push({ role: m.role, content: apiContent(m) });
    const body = { model: Cadence.model || undefined, messages, stream: true };
    body.stream_options = { include_usage: true };
    // An empty field leaves the server's default.
    for (const [id, key] of [["temperature", "temperature"], ["top-p", "top_p"], ["max-tokens", "max_tokens"]]) {
      const text = $(id).value.trim();
      if (text !== "") body[key] = Number(text);
    }
    const stops = $("stop-strings").value.split("\n").filter((s) => s.length);
    if (stops.length) body.stop = stops;
    const schemaText = $("json-schema").value.trim();
    $("schema-error").hidden = true;
    if (schemaText) {
      let schema;
      try {
        schema = JSON.parse(schemaText);
      } catch (e) {
        $("schema-error").textContent = "JSON schema: " + e.message;
        $("schema-error").hidden = false;
        throw e;
      }
      body.response_format = { type: "json_schema", json_schema: { name: "output", schema } };
    }
    return body;
  }

  // Server-sent events from a fetch body: yields each event's data string.
  async function* sseData(res) {
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
        const data = event
          .split(/\r?\n/)
          .filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).replace(/^ /, ""))
          .join("\n");
        if (data) yield data;
      }
    }
  }

  async function answer() {
    const history = current.messages.slice();
    let body;
    try {
      body = requestBody(history);
    } catch (_) {
      return;
    }
    const msg = { role: "assistant", content: "", meta: "" };
    current.messages.push(msg);
    renderMessages();
    busy(true);
    controller = new AbortController();
    const t0 = performance.now();
    let tFirst = null;
    let tokens = 0;
    let finish = null;
    try {
      const res = await Cadence.api("/v1/chat/completions", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
        signal: controller.signal,
      });
      if (!res.ok) {
        let why = res.status + " " + res.statusText;
        try {
          why = (await res.json()).error.message;
        } catch (_) {
          /* keep the status line */
        }
        throw new Error(why);
      }
      for await (const data of sseData(res)) {
        if (data === "[DONE]") break;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message || "the server reported an error");
        if (chunk.usage) tokens = chunk.usage.completion_tokens;
        const choice = chunk.choices && chunk.choices[0];
        if (!choice) continue;
        const text = (choice.delta && choice.delta.content) || "";
        if (text) {
          if (tFirst === null) tFirst = performance.now();
          msg.content += text;
          msg.node.textContent = msg.content;
          $("messages").scrollTop = $("messages").scrollHeight;
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    } catch (e) {
      if (e.name === "AbortError") finish = "stopped";
      else msg.error = e.message;
    } finally {
      controller = null;
      busy(false);
    }
    const tEnd = performance.now();
    const parts = [];
    if (tokens) parts.push(`${tokens} tokens`);
    if (tFirst !== null) parts.push(`TTFT ${Math.round(tFirst - t0)} ms`);
    if (tFirst !== null && tokens > 1 && tEnd > tFirst) {
      parts.push(`${((tokens - 1) / ((tEnd - tFirst) / 1000)).toFixed(1)} tok/s`);
    }
    if (finish) parts.push(finish);
    msg.meta = parts.join(" · ");
    delete msg.node;
    save();
    renderMessages();
  }

  async function send(text) {
    if (!current) newConversation();
    const images = attached;
    attached = [];
    renderAttachments();
    current.messages.push(images.length ? { role: "user", content: text, images } : { role: "user", content: text });
    if (current.title === "New chat") current.title = (text || "Image").slice(0, 40);
    save();
    render();
    await answer();
  }

  document.addEventListener("DOMContentLoaded", () => {
    load();
    if (conversations.length) current = conversations[0];
    else newConversation();
    render();
    $("new-chat").addEventListener("click", () => {
      if (!controller) newConversation();
    });
    $("composer").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const text = $("chat-input").value.trim();
      if ((!text && !attached.length) || controller) return;
      $("chat-input").value = "";
      send(text);
    });
    // Images: a model that takes them says so in /v1/engine/stats; a file picker or a paste.
    Cadence.json("/v1/engine/stats").then((stats) => {
      $("attach").hidden = !(stats && stats.images && stats.images.accepted);
    }).catch(() => {});
    $("attach").addEventListener("click", () => $("image-file").click());
    $("image-file").addEventListener("change", (ev) => {
      attach(ev.target.files);
      ev.target.value = "";
    });
    $("chat-input").addEventListener("paste", (ev) => {
      if ($("attach").hidden) return;
      const files = [...(ev.clipboardData ? ev.clipboardData.files : [])];
      if (files.length) {
        ev.preventDefault();
        attach(files);
      }
    });
    $("chat-input").addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey) {
        ev.preventDefault();
        $("composer").requestSubmit();
      }
    });
    $("stop").addEventListener("click", () => controller && controller.abort());
    $("regenerate").addEventListener("click", () => {
      if (controller || !current) return;
      while (current.messages.length && current.messages[current.messages.length - 1].role === "assistant") {
        current.messages.pop();
      }
      if (current.messages.length) answer();
    });
    for (const f of FIELDS) $(f).addEventListener("change", saveSettings);
  });
})();
