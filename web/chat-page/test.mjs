// The chat page at / in headless Chromium against a running `infer serve`:
// - a real greedy reply streams in with its tok/s line;
// - a markdown reply renders headings, lists and `<pre><code>`; script tags and event-handler
//   attributes in a reply are not run (DOMPurify);
// - a reload keeps the conversation; Clear forgets it;
// - max tokens is cut to the context the prompt leaves; a conversation that fills the context
//   is an error bubble in view, and nothing is sent;
// - an API error is shown in view.
// Canned replies come from Playwright's request routing, so they do not depend on the model.
// Usage: node test.mjs URL [API_KEY] [SCREENSHOT.png]
import { chromium } from "playwright-core";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import assert from "node:assert/strict";

const [url, key, shot] = process.argv.slice(2);
if (!url) {
  console.error("usage: node test.mjs URL [API_KEY] [SCREENSHOT.png]");
  process.exit(2);
}
const context = await chromium.launchPersistentContext(mkdtempSync(join(tmpdir(), "chrome-")), {
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1100, height: 720 },
  args: ["--headless=new", "--no-sandbox", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"],
});
const page = context.pages()[0] ?? (await context.newPage());
const errors = [];
page.on("pageerror", (e) => errors.push(e.message));
page.on("dialog", (d) => { errors.push(`dialog: ${d.message()}`); d.dismiss(); });

// An SSE body as the server streams chat: one content delta per piece, then usage.
function sse(pieces) {
  const chunk = (delta, finish = null) => ({ object: "chat.completion.chunk", choices: [{ index: 0, delta, finish_reason: finish }] });
  const events = [chunk({ role: "assistant", content: "" }), ...pieces.map((p) => chunk({ content: p })),
    chunk({}, "stop"), { choices: [], usage: { prompt_tokens: 5, completion_tokens: pieces.length, total_tokens: 5 + pieces.length } }];
  return events.map((e) => `data: ${JSON.stringify(e)}\n\n`).join("") + "data: [DONE]\n\n";
}

async function connect() {
  // The settings (key, temperature, max tokens) are in a closed <details>.
  await page.evaluate(() => { document.getElementById("settings").open = true; });
  if (key) {
    await page.evaluate((k) => { document.getElementById("api-key").value = k; }, key);
    await page.dispatchEvent("#api-key", "change");
  }
  await page.waitForFunction(() => /context \d+/.test(document.getElementById("model").textContent));
}

async function ask(text) {
  await page.fill("#prompt", text);
  await page.press("#prompt", "Enter");
}

// Waits for the page to hold `n` messages, the last a finished reply.
async function replied(n, timeout = 30_000) {
  await page.waitForFunction((n) => {
    const all = document.querySelectorAll(".msg");
    return all.length === n && all[n - 1].matches(".msg.assistant") && all[n - 1].querySelector(".meta");
  }, n, { timeout });
}

async function inView(selector) {
  return page.$eval(selector, (el) => {
    const r = el.getBoundingClientRect();
    const log = document.getElementById("log").getBoundingClientRect();
    return r.bottom <= log.bottom + 1 && r.top >= log.top - 1 && r.bottom <= innerHeight;
  });
}

const results = {};
try {
  await page.goto(url);
  await page.evaluate(() => localStorage.clear());
  await page.reload();
  await connect();
  const contextSize = Number((await page.textContent("#model")).match(/context (\d+)/)[1]);
  assert.equal(await page.textContent("#notice"), "", "the markdown libraries are not served");

  // A real reply, greedy.
  await page.fill("#max-tokens", "48");
  await page.$eval("#temperature", (el) => { el.value = "0"; el.dispatchEvent(new Event("input")); });
  await ask("What is the capital of France? Answer in one sentence.");
  await replied(2, 120_000);
  results.reply = await page.textContent(".msg.assistant");
  assert.match(results.reply, /Paris/);
  assert.match(await page.textContent("#stats"), /tok\/s/);
  if (shot) await page.screenshot({ path: shot });

  // Markdown, and a reply that tries to run script.
  const hostile = ["# Plan\n\n", "- one\n- **two**\n\n", "```python\nprint('hi')\n", "```\n\n",
    "<script>window.__pwned = 1</script>", "<img src=x onerror=\"window.__pwned = 2\">",
    "[link](javascript:window.__pwned=3)"];
  await page.route("**/v1/chat/completions", (route) =>
    route.fulfill({ status: 200, headers: { "content-type": "text/event-stream" }, body: sse(hostile) }));
  await ask("Give me markdown");
  await replied(4);
  const last = ".msg.assistant:last-of-type";
  assert.equal(await page.textContent(`${last} pre code`), "print('hi')\n");
  assert.equal(await page.textContent(`${last} h1`), "Plan");
  assert.equal(await page.$$eval(`${last} li`, (l) => l.length), 2);
  await page.waitForTimeout(300);
  assert.equal(await page.$$eval('.msg a[href^="javascript"]', (l) => l.length), 0);
  assert.equal(await page.evaluate(() => window.__pwned), undefined, "script in a reply ran");
  assert.equal(await page.$$eval(".msg script, .msg [onerror]", (l) => l.length), 0);
  assert.ok(await inView(`${last} .meta`), "the reply's stats are not in view");

  // The conversation survives a reload, rendered again.
  await page.reload();
  await connect();
  assert.equal(await page.$$eval(".msg", (l) => l.length), 4);
  assert.equal(await page.textContent(`${last} pre code`), "print('hi')\n");
  assert.equal(await page.evaluate(() => window.__pwned), undefined);

  // Max tokens is cut to what the prompt leaves of the context.
  let sent = null;
  await page.unroute("**/v1/chat/completions");
  await page.route("**/v1/chat/completions", (route) => {
    sent = route.request().postDataJSON();
    route.fulfill({ status: 200, headers: { "content-type": "text/event-stream" }, body: sse(["ok"]) });
  });
  await page.fill("#max-tokens", String(contextSize));
  await ask("Short question");
  await replied(6);
  const count = await page.evaluate(async ([k, messages]) => {
    const h = { "Content-Type": "application/json" };
    if (k) h.Authorization = `Bearer ${k}`;
    const r = await fetch("/tokenize", { method: "POST", headers: h, body: JSON.stringify({ messages, add_generation_prompt: true }) });
    return (await r.json()).count;
  }, [key, sent.messages]);
  assert.equal(sent.max_tokens, contextSize - count, `max_tokens ${sent.max_tokens}, context ${contextSize}, prompt ${count}`);
  assert.match(await page.textContent(".msg.assistant:last-of-type .meta"), /cut to/);
  // The field itself is held to the context.
  await page.fill("#max-tokens", String(contextSize * 4));
  await page.dispatchEvent("#max-tokens", "change");
  assert.equal(Number(await page.inputValue("#max-tokens")), contextSize);

  // A server error shows in view.
  await page.unroute("**/v1/chat/completions");
  await page.route("**/v1/chat/completions", (route) => route.fulfill({
    status: 400, headers: { "content-type": "application/json" },
    body: JSON.stringify({ error: { message: "temperature is out of range", type: "BadRequestError", param: "temperature", code: 400 } }),
  }));
  await ask("This one fails");
  await page.waitForSelector(".msg.error");
  assert.match(await page.textContent(".msg.error"), /temperature is out of range/);
  assert.ok(await inView(".msg.error"), "the error is not in view");

  // A conversation longer than the context: an error in view, and nothing sent.
  await page.unroute("**/v1/chat/completions");
  let posted = 0;
  await page.route("**/v1/chat/completions", (route) => { posted += 1; route.abort(); });
  await page.evaluate((n) => {
    const long = Array.from({ length: 40 }, (_, i) => ({ role: i % 2 ? "assistant" : "user", content: "word ".repeat(n) }));
    localStorage.setItem("infer-chat", JSON.stringify({ history: long }));
  }, Math.ceil(contextSize / 10));
  await page.reload();
  await connect();
  await ask("And now?");
  await page.waitForSelector(".msg.error");
  assert.match(await page.textContent(".msg.error"), /fills the model's context/);
  assert.ok(await inView(".msg.error"), "the context error is not in view");
  assert.equal(posted, 0);

  // Clear forgets it across reloads.
  await page.click("#clear");
  await page.reload();
  await connect();
  assert.equal(await page.$$eval(".msg", (l) => l.length), 0);

  assert.deepEqual(errors, []);
  console.log(JSON.stringify({ ok: true, ...results }));
} catch (e) {
  // What the page showed, to tell a page fault from a test fault.
  const log = await page.$$eval(".msg", (l) => l.map((m) => `${m.className}: ${m.textContent.slice(0, 200)}`)).catch(() => []);
  console.error(JSON.stringify({ log, errors }, null, 1));
  throw e;
} finally {
  await context.close();
}
