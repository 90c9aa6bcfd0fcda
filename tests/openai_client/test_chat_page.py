"""The chat page at `/` in headless Chromium against the suite's server
(web/chat-page/test.mjs: a real greedy reply; markdown rendered and sanitised; the conversation
kept across reloads and cleared; max tokens cut to the context left; errors in view). Needs
node, Debian's chromium and `npm ci` in web/chat-page (scripts/openai-client-tests.sh runs it
before building the server, which embeds the page's libraries from there)."""

import json
import subprocess

from conftest import KEY, ROOT


def test_chat_page_in_chromium(server):
    page = ROOT / "web" / "chat-page"
    assert (page / "node_modules" / "playwright-core").is_dir(), "run `npm ci` in web/chat-page"
    done = subprocess.run(["node", str(page / "test.mjs"), server, KEY], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"] and "Paris" in result["reply"]
