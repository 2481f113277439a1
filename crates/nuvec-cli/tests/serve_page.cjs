// The chat page in headless Chromium against a running `nuvec serve --api-key KEY`, driven by
// crates/nuvec-cli/tests/serve_page.rs: the page as a person uses it, checked against what the
// server answers to the same request whole. Exits non-zero with the first failed check.
//
// env: NUVEC_PAGE_BASE (http://HOST:PORT), NUVEC_PAGE_KEY, NUVEC_PAGE_SHOT (the PNG to write),
// NUVEC_CHROMIUM, NUVEC_PAGE_NODE_MODULES (scripts/setup-page-tests.sh sets the last two).
"use strict";
const assert = require("node:assert/strict");
const path = require("node:path");

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run the test through scripts/test.sh`);
  return value;
};
const { chromium } = require(path.join(env("NUVEC_PAGE_NODE_MODULES"), "playwright-core"));
const BASE = env("NUVEC_PAGE_BASE");
const KEY = env("NUVEC_PAGE_KEY");
const QUESTION = "What is the capital of France?";
const MAX_TOKENS = 120;
const FOLLOW_UP = "Name three famous places to visit there, as a numbered list.";
const LONG = "Write a very long story about a dragon who learns to cook.";

const log = (...args) => console.log("[page]", ...args);

// The server answering `body` whole (not streamed), with the key.
async function whole(body) {
  const response = await fetch(`${BASE}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
    body: JSON.stringify(body),
  });
  return { status: response.status, json: await response.json() };
}

async function health() {
  return (await (await fetch(`${BASE}/health`)).json()).requests;
}

async function setField(page, id, value) {
  await page.fill(`#${id}`, value);
  await page.press(`#${id}`, "Tab"); // the change event, as leaving the field gives it
}

// The text `markdown` renders to, by the page's own renderer.
const rendered = (page, markdown) =>
  page.evaluate((md) => {
    const div = document.createElement("div");
    div.innerHTML = window.NuvecMarkdown.render(md);
    return div.textContent;
  }, markdown);

const stored = (page) => page.evaluate(() => JSON.parse(localStorage.getItem("nuvec.chat")).messages);

async function checkRenderer(page) {
  const render = (md) => page.evaluate((s) => window.NuvecMarkdown.render(s), md);
  const hostile = await render('<script>alert(1)</script><img src=x onerror="alert(2)"> [x](javascript:alert(3))');
  assert.ok(!/<script|<img|href="javascript/i.test(hostile), `markup got through: ${hostile}`);
  assert.equal(
    await render("# Title\n**b** *i* `a<b>` [l](https://e.com/a_b?x=1&y=2)\n\n- one\n- two\n\n```js\nx < y\n```"),
    "<h1>Title</h1>\n" +
      '<p><strong>b</strong> <em>i</em> <code>a&lt;b&gt;</code> <a href="https://e.com/a_b?x=1&amp;y=2" ' +
      'target="_blank" rel="noopener noreferrer">l</a></p>\n' +
      "<ul><li>one</li><li>two</li></ul>\n" +
      '<pre><code class="language-js">x &lt; y</code></pre>',
  );
}

async function main() {
  const browser = await chromium.launch({
    executablePath: env("NUVEC_CHROMIUM"),
    // Root has no user namespaces to sandbox with; the page is our own, served on loopback.
    args: ["--no-sandbox"],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1000, height: 760 } });
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    const sent = [];
    page.on("request", (r) => r.url().endsWith("/v1/chat/completions") && sent.push(r.postDataJSON()));

    // 1. Without a key, /v1/models is refused and the page says what to do.
    await page.goto(`${BASE}/`);
    await page.waitForSelector("#notice:not([hidden])");
    const refused = await page.textContent("#notice");
    assert.match(refused, /API key/, refused);
    assert.match(refused, /401/, refused);
    log("without a key:", refused);
    await checkRenderer(page);

    // 2. With the key the models load.
    await setField(page, "api-key", KEY);
    await page.waitForSelector("#notice", { state: "hidden" });
    const models = await (await fetch(`${BASE}/v1/models`, { headers: { authorization: `Bearer ${KEY}` } })).json();
    assert.equal(await page.inputValue("#model"), models.data[0].id);

    // 3. The server's refusal of a setting is shown, and the question is kept to send again.
    await page.click("#settings-toggle");
    await setField(page, "temperature", "-1");
    await setField(page, "max_tokens", String(MAX_TOKENS));
    const bad = await whole({ messages: [{ role: "user", content: QUESTION }], temperature: -1, max_tokens: MAX_TOKENS });
    assert.equal(bad.status, 400, JSON.stringify(bad.json));
    await page.fill("#input", QUESTION);
    await page.press("#input", "Enter");
    await page.waitForFunction((m) => document.querySelector("#notice").textContent.includes(m), bad.json.error.message);
    assert.equal(await page.inputValue("#input"), QUESTION);
    assert.equal(await page.locator("#log .msg").count(), 0);
    log("refused:", await page.textContent("#notice"));

    // 4. Greedy: the streamed answer as it arrives, and at its end what the server answers whole.
    await setField(page, "temperature", "0");
    await page.evaluate(() => {
      // Every text the answer showed while streaming, to see it grow.
      window.seen = [];
      new MutationObserver(() => {
        const m = document.querySelector("#log .msg.assistant[data-state=streaming] .answer");
        if (m && m.textContent && window.seen.at(-1) !== m.textContent) window.seen.push(m.textContent);
      }).observe(document.querySelector("#log"), { subtree: true, childList: true, characterData: true });
    });
    // The second turn asks for a list, so the Markdown is more than a paragraph, and sends the
    // first answer back as history.
    const history = [];
    const shown = [];
    for (const [i, question] of [QUESTION, FOLLOW_UP].entries()) {
      if (i > 0) await page.fill("#input", question);
      await page.evaluate(() => (window.seen = []));
      await page.press("#input", "Enter");
      await page.waitForSelector(`#log .msg.assistant:nth-child(${2 * i + 2})[data-state=done]`, { timeout: 60000 });
      history.push({ role: "user", content: question });
      const body = sent.at(-1);
      const request = { model: models.data[0].id, messages: history, temperature: 0, max_tokens: MAX_TOKENS };
      for (const [k, v] of Object.entries(request)) assert.deepEqual(body[k], v, `the page sent ${k} = ${JSON.stringify(body[k])}`);
      assert.equal(body.stream, true);
      const expected = await whole(request);
      assert.equal(expected.status, 200, JSON.stringify(expected.json));
      const answer = expected.json.choices[0].message.content;
      log("expected:", JSON.stringify(answer));
      assert.equal((await stored(page))[2 * i + 1].content, answer, "the streamed answer kept");
      const text = await page.textContent(`#log .msg.assistant:nth-child(${2 * i + 2}) .answer`);
      assert.equal(text, await rendered(page, answer), "the streamed answer shown");
      const seen = await page.evaluate(() => window.seen);
      // Shown before it ended (how often depends on the machine's speed: the long answer below
      // checks it grows).
      assert.ok(seen.length >= 1, "the answer was not shown while it streamed");
      log(`shown in ${seen.length} steps:`, JSON.stringify(text));
      history.push({ role: "assistant", content: answer });
      shown.push(text);
    }
    const html = await page.innerHTML("#log .msg.assistant:nth-child(4) .answer");
    log("rendered:", html);

    // 5. Stop during a long answer: the page says so and the server cancels the request.
    const before = await health();
    await setField(page, "max_tokens", "4000");
    await page.fill("#input", LONG);
    await page.press("#input", "Enter");
    // It grows as it streams: three different texts, the last longer than the first (not each
    // longer than the one before: "*a" shrinks to "a" when its "*" closes).
    await page.evaluate(() => (window.seen = []));
    await page.waitForFunction(() => {
      const m = document.querySelector("#log .msg.assistant:last-child");
      return m.dataset.state === "streaming" && window.seen.length >= 3;
    });
    const grew = await page.evaluate(() => window.seen);
    assert.ok(grew.at(-1).length > grew[0].length, `it grew: ${JSON.stringify(grew)}`);
    await page.click("#stop");
    await page.waitForSelector("#log .msg.assistant:last-child[data-state=stopped]");
    assert.equal(await page.textContent("#log .msg.assistant:last-child .status"), "Stopped.");
    const stopped = await page.textContent("#log .msg.assistant:last-child .answer");
    for (let waited = 0; ; waited += 100) {
      const now = await health();
      if (now.cancelled === before.cancelled + 1 && now.running === 0) break;
      assert.ok(waited < 30000, `the server did not cancel the stopped request: ${JSON.stringify(now)}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    log("stopped after:", JSON.stringify(stopped));

    // 6. A reload keeps the conversation.
    await page.reload();
    await page.waitForSelector("#log .msg.assistant:last-child[data-state=stopped]");
    const kept = await page.$$eval("#log .msg", (ms) => ms.map((m) => [m.className, m.dataset.state, m.querySelector(".answer")?.textContent ?? m.textContent]));
    assert.deepEqual(kept, [
      ["msg user", "done", QUESTION],
      ["msg assistant", "done", shown[0]],
      ["msg user", "done", FOLLOW_UP],
      ["msg assistant", "done", shown[1]],
      ["msg user", "done", LONG],
      ["msg assistant", "stopped", stopped],
    ]);

    // 7. The screenshot, with the answer on the page as it is taken.
    assert.deepEqual(await page.$$eval("#log .msg.assistant .answer", (as) => as.slice(0, 2).map((a) => a.textContent)), shown);
    await page.screenshot({ path: env("NUVEC_PAGE_SHOT"), fullPage: true });

    // 8. New chat empties it; reasoning is folded above its answer; an error in the stream is
    //    shown (a scripted stream: SmolLM2 does not reason, and the server fails no stream).
    await page.click("#new-chat");
    assert.equal(await page.locator("#log .msg").count(), 0);
    assert.deepEqual(await stored(page), []);
    const sse = (...chunks) => chunks.map((c) => `data: ${typeof c === "string" ? c : JSON.stringify(c)}\n\n`).join("");
    const delta = (d) => ({ choices: [{ index: 0, delta: d, finish_reason: null }] });
    await page.route("**/v1/chat/completions", (route) =>
      route.fulfill({
        status: 200,
        headers: { "content-type": "text/event-stream" },
        body: sse(delta({ role: "assistant", content: "" }), delta({ reasoning_content: "Think *first*." }), delta({ content: "So **yes**." }), "[DONE]"),
      }),
    );
    await page.fill("#input", "Scripted.");
    await page.press("#input", "Enter");
    await page.waitForSelector("#log .msg.assistant[data-state=done]");
    const folded = await page.$eval("#log .msg.assistant", (m) => {
      const d = m.querySelector("details.reasoning");
      return { open: d.open, hidden: d.hidden, text: d.querySelector(".thoughts").innerHTML, above: !!(d.compareDocumentPosition(m.querySelector(".answer")) & Node.DOCUMENT_POSITION_FOLLOWING), answer: m.querySelector(".answer").innerHTML };
    });
    assert.deepEqual(folded, { open: false, hidden: false, text: "<p>Think <em>first</em>.</p>", above: true, answer: "<p>So <strong>yes</strong>.</p>" });
    await page.unroute("**/v1/chat/completions");
    await page.route("**/v1/chat/completions", (route) =>
      route.fulfill({
        status: 200,
        headers: { "content-type": "text/event-stream" },
        body: sse(delta({ content: "Half" }), { error: { message: "the engine stopped", type: "server_error" } }, "[DONE]"),
      }),
    );
    await page.fill("#input", "Scripted again.");
    await page.press("#input", "Enter");
    await page.waitForSelector("#log .msg.assistant:last-child[data-state=error]");
    assert.match(await page.textContent("#notice"), /the engine stopped/);
    assert.match(await page.textContent("#log .msg.assistant:last-child .status"), /the engine stopped/);

    assert.deepEqual(errors, [], "the page threw");
    log("ok");
  } finally {
    await browser.close();
  }
}

// Every step has Playwright's own timeout; this bounds the whole.
const guard = setTimeout(() => {
  console.error("[page] the page test took over 4 minutes");
  process.exit(2);
}, 240000);
main().then(
  () => clearTimeout(guard),
  (e) => {
    console.error("[page] FAILED:", e && e.stack ? e.stack : e);
    process.exit(1);
  },
);
