// The chat page: a conversation kept in localStorage, sent to /v1/chat/completions with
// stream: true and read back as server-sent events; each answer rendered as Markdown
// (markdown.js) as it arrives, its reasoning folded above it. Stop aborts the fetch: the
// server sees the connection close and cancels the request.
(function () {
  "use strict";

  const $ = (id) => document.getElementById(id);
  const CHAT = "nuvec.chat";
  const SETTINGS = "nuvec.settings";
  const KEY = "nuvec.apiKey";
  // Settings fields sent as numbers when filled (empty: the server's default).
  const NUMBERS = ["temperature", "top_p", "top_k", "max_tokens"];
  const FIELDS = ["model", "system", ...NUMBERS];

  let conversation = loadConversation();
  let inFlight = null; // the AbortController of the answer being streamed

  // An error worth showing as it is: the server's message (an OpenAI error object's) and status.
  class ApiProblem extends Error {
    constructor(message, status) {
      super(message);
      this.status = status;
    }
  }

  function stored(key) {
    try {
      return JSON.parse(localStorage.getItem(key));
    } catch {
      return null; // not JSON: start afresh rather than fail to load
    }
  }

  function loadConversation() {
    const saved = stored(CHAT);
    const messages = Array.isArray(saved?.messages) ? saved.messages : [];
    return {
      messages: messages.filter(
        (m) => m && (m.role === "user" || m.role === "assistant") && typeof m.content === "string",
      ),
    };
  }

  function saveConversation() {
    localStorage.setItem(CHAT, JSON.stringify(conversation));
  }

  function saveSettings() {
    const values = {};
    for (const id of FIELDS) values[id] = $(id).value;
    localStorage.setItem(SETTINGS, JSON.stringify(values));
  }

  function headers() {
    const h = { "content-type": "application/json" };
    const key = $("api-key").value.trim();
    if (key) h.authorization = `Bearer ${key}`;
    return h;
  }

  function notice(text) {
    $("notice").textContent = text || "";
    $("notice").hidden = !text;
  }

  // The problem a non-2xx answer describes: its OpenAI error object's message when it has one.
  async function problemOf(response) {
    const text = await response.text();
    let message = text.trim() || response.statusText;
    try {
      message = JSON.parse(text).error.message || message;
    } catch {
      // not an OpenAI error object: its text as it is
    }
    if (response.status === 401) {
      message = `The server needs an API key: enter it in the API key field above (${message}).`;
    }
    return new ApiProblem(`${message} (HTTP ${response.status})`, response.status);
  }

  async function loadModels() {
    const select = $("model");
    const wanted = select.value || stored(SETTINGS)?.model || "";
    let response;
    try {
      response = await fetch("/v1/models", { headers: headers() });
    } catch (e) {
      notice(`Could not reach the server: ${e.message}`);
      return;
    }
    if (!response.ok) {
      notice((await problemOf(response)).message);
      return;
    }
    const ids = ((await response.json()).data || []).map((m) => String(m.id));
    select.replaceChildren(
      ...ids.map((id) => {
        const option = document.createElement("option");
        option.value = option.textContent = id;
        return option;
      }),
    );
    if (ids.includes(wanted)) select.value = wanted;
    notice("");
  }

  // The request for the conversation so far (the answer being written is not part of it).
  function requestBody() {
    const messages = [];
    const system = $("system").value.trim();
    if (system) messages.push({ role: "system", content: system });
    for (const m of conversation.messages) {
      // An answer stopped before its first word or failed says nothing worth sending back.
      if (m.role === "assistant" && !m.content) continue;
      messages.push({ role: m.role, content: m.content });
    }
    const body = { messages, stream: true, stream_options: { include_usage: true } };
    if ($("model").value) body.model = $("model").value;
    for (const id of NUMBERS) {
      const value = $(id).value.trim();
      if (value !== "") body[id] = Number(value);
    }
    return body;
  }

  // Reads server-sent events from `body`, calling `onData` with each event's data, until
  // `data: [DONE]`. False when the stream ended without it.
  async function readEvents(body, onData) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let data = [];
    const dispatch = () => {
      const payload = data.join("\n");
      data = [];
      if (payload === "[DONE]") return true;
      if (payload) onData(payload);
      return false;
    };
    for (;;) {
      const { value, done } = await reader.read();
      buffer += decoder.decode(value, { stream: !done });
      let end;
      while ((end = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, end).replace(/\r$/, "");
        buffer = buffer.slice(end + 1);
        if (line === "") {
          if (dispatch()) return true;
        } else if (line.startsWith("data:")) {
          data.push(line.slice(5).replace(/^ /, ""));
        } // other fields (event:, id:, comments) carry nothing this page uses
      }
      if (done) {
        if (buffer.startsWith("data:")) data.push(buffer.slice(5).replace(/^ /, ""));
        return dispatch();
      }
    }
  }

  // Applies one stream chunk to `answer`.
  function take(answer, payload) {
    let chunk;
    try {
      chunk = JSON.parse(payload);
    } catch {
      throw new ApiProblem(`The server sent a chunk that is not JSON: ${payload.slice(0, 200)}`);
    }
    if (chunk.error) throw new ApiProblem(chunk.error.message || JSON.stringify(chunk.error));
    const choice = chunk.choices?.[0];
    if (choice) {
      answer.reasoning += choice.delta?.reasoning_content || "";
      answer.content += choice.delta?.content || "";
      if (choice.finish_reason) answer.finish = choice.finish_reason;
    }
    if (chunk.usage) answer.tokens = chunk.usage.completion_tokens;
  }

  async function send(text) {
    const body = requestBody();
    body.messages.push({ role: "user", content: text });
    const user = { role: "user", content: text };
    const answer = { role: "assistant", content: "", reasoning: "", state: "streaming" };
    conversation.messages.push(user, answer);
    saveConversation();
    draw();
    const view = $("log").lastElementChild;
    const controller = new AbortController();
    inFlight = controller;
    busy(true);
    notice("");
    let pending = false; // a redraw is scheduled for the next frame
    const redraw = () => {
      if (!pending) {
        pending = true;
        requestAnimationFrame(() => {
          pending = false;
          fill(view, answer);
        });
      }
    };
    try {
      const response = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: headers(),
        body: JSON.stringify(body),
        signal: controller.signal,
      });
      if (!response.ok) {
        // Refused before any answer: take the question back so it can be sent again.
        const problem = await problemOf(response);
        const at = conversation.messages.indexOf(user);
        if (at >= 0) conversation.messages.splice(at, 2);
        $("input").value = text;
        throw problem;
      }
      const finished = await readEvents(response.body, (payload) => {
        take(answer, payload);
        redraw();
      });
      if (!finished) throw new ApiProblem("The answer's stream ended before data: [DONE].");
      answer.state = "done";
    } catch (e) {
      if (e.name === "AbortError") {
        answer.state = "stopped";
      } else {
        answer.state = "error";
        answer.error = e instanceof ApiProblem ? e.message : `The request failed: ${e.message}`;
        notice(answer.error);
      }
    } finally {
      if (inFlight === controller) inFlight = null;
      busy(inFlight !== null);
      saveConversation();
      draw();
    }
  }

  function busy(on) {
    $("send").disabled = on;
    $("stop").disabled = !on;
  }

  function status(m) {
    if (m.state === "stopped") return "Stopped.";
    if (m.state === "error") return `Error: ${m.error}`;
    const parts = [];
    if (m.finish === "length") parts.push("cut at max_tokens");
    if (m.tokens !== undefined) parts.push(`${m.tokens} tokens`);
    return parts.join(" · ");
  }

  // Writes message `m` into its element `view`; model text goes only through the renderer,
  // which escapes it, or into textContent.
  function fill(view, m) {
    view.dataset.state = m.state || "done";
    if (m.role === "user") {
      view.textContent = m.content;
      return;
    }
    const reasoning = view.querySelector(".reasoning");
    reasoning.hidden = !m.reasoning;
    reasoning.querySelector(".thoughts").innerHTML = window.NuvecMarkdown.render(m.reasoning || "");
    view.querySelector(".answer").innerHTML = window.NuvecMarkdown.render(m.content);
    view.querySelector(".status").textContent = status(m);
  }

  function messageView(m) {
    const view = document.createElement("div");
    view.className = `msg ${m.role}`;
    if (m.role === "assistant") {
      const reasoning = document.createElement("details");
      reasoning.className = "reasoning";
      const summary = document.createElement("summary");
      summary.textContent = "Reasoning";
      const thoughts = document.createElement("div");
      thoughts.className = "thoughts";
      reasoning.append(summary, thoughts);
      const answer = document.createElement("div");
      answer.className = "answer";
      const line = document.createElement("div");
      line.className = "status";
      view.append(reasoning, answer, line);
    }
    fill(view, m);
    return view;
  }

  function draw() {
    const log = $("log");
    log.replaceChildren(...conversation.messages.map(messageView));
    log.scrollTop = log.scrollHeight;
  }

  function start() {
    // An answer that was streaming when the page went away ended there.
    for (const m of conversation.messages) if (m.state === "streaming") m.state = "stopped";
    const settings = stored(SETTINGS) || {};
    for (const id of FIELDS) if (id !== "model" && typeof settings[id] === "string") $(id).value = settings[id];
    $("api-key").value = localStorage.getItem(KEY) || "";
    draw();
    loadModels();

    for (const id of FIELDS) $(id).addEventListener("change", saveSettings);
    $("api-key").addEventListener("change", () => {
      localStorage.setItem(KEY, $("api-key").value.trim());
      loadModels();
    });
    $("settings-toggle").addEventListener("click", () => {
      const panel = $("settings");
      panel.hidden = !panel.hidden;
      $("settings-toggle").setAttribute("aria-expanded", String(!panel.hidden));
    });
    $("new-chat").addEventListener("click", () => {
      if (inFlight) inFlight.abort();
      conversation = { messages: [] };
      saveConversation();
      draw();
      notice("");
    });
    $("stop").addEventListener("click", () => inFlight && inFlight.abort());
    $("composer").addEventListener("submit", (event) => {
      event.preventDefault();
      const text = $("input").value.trim();
      if (!text || inFlight) return;
      $("input").value = "";
      send(text);
    });
    $("input").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        $("composer").requestSubmit();
      }
    });
  }

  start();
})();
