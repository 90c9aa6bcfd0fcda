// Drives infer's chat page in headless Chromium: sends a message, waits for the streamed
// reply and its tok/s line, checks them, and saves a screenshot.
// Usage: node check.mjs http://127.0.0.1:8000 screenshot.png [api-key]
import { chromium } from "playwright-core";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [url, out, key] = process.argv.slice(2);
if (!url || !out) {
  console.error("usage: node check.mjs URL SCREENSHOT.png [API_KEY]");
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
page.on("console", (m) => m.type() === "error" && errors.push(m.text()));
try {
  await page.goto(url);
  await page.click("summary"); // open the settings: the screenshot shows the controls
  if (key) {
    await page.fill("#api-key", key);
    await page.dispatchEvent("#api-key", "change");
  }
  await page.waitForFunction(() => !document.getElementById("model").textContent.includes("connecting"));
  const model = await page.textContent("#model");
  if (model.startsWith("not connected")) throw new Error(model);
  await page.fill("#max-tokens", "48");
  // Greedy, so the answer is the model's deterministic one.
  await page.$eval("#temperature", (el) => { el.value = "0"; el.dispatchEvent(new Event("input")); });
  await page.fill("#prompt", "What is the capital of France? Answer in one sentence.");
  await page.press("#prompt", "Enter");
  await page.waitForSelector(".msg.assistant .meta", { timeout: 120_000 });
  const reply = await page.textContent(".msg.assistant");
  const stats = await page.textContent("#stats");
  await page.screenshot({ path: out });
  console.log(JSON.stringify({ model, reply, stats, errors }));
  // With a key, the page's first /v1/models call (before the key was typed) is a 401.
  const unexpected = errors.filter((e) => !(key && e.includes("401")));
  if (!/tok\/s/.test(stats) || !/Paris/.test(reply) || unexpected.length) {
    throw new Error(`unexpected page state: ${JSON.stringify({ reply, stats, errors })}`);
  }
} finally {
  await context.close();
}
