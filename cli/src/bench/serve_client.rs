//! One streamed completion request against a server, timed the way vLLM's serving benchmark
//! times it: time to the first token, gaps between later chunks, end to end.

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

/// Where and how to send requests.
#[derive(Debug, Clone)]
pub struct Target {
    /// `http://host:port` without a trailing slash.
    pub base: String,
    pub model: String,
    pub api_key: Option<String>,
}

/// What one request measured.
#[derive(Debug, Clone, Default)]
pub struct RequestResult {
    pub prompt_len: usize,
    pub output_tokens: usize,
    pub ttft: Duration,
    /// Gaps between consecutive chunks after the first (one token each on a streaming server).
    pub itl: Vec<Duration>,
    pub latency: Duration,
}

impl Target {
    fn post(&self, path: &str) -> ureq::Request {
        let r = ureq::post(&format!("{}{path}", self.base)).timeout(Duration::from_secs(3600));
        match &self.api_key {
            Some(k) => r.set("Authorization", &format!("Bearer {k}")),
            None => r,
        }
    }

    fn get(&self, path: &str) -> ureq::Request {
        let r = ureq::get(&format!("{}{path}", self.base)).timeout(Duration::from_secs(60));
        match &self.api_key {
            Some(k) => r.set("Authorization", &format!("Bearer {k}")),
            None => r,
        }
    }

    /// The served model's name (the first of `/v1/models`).
    pub fn served_model(&self) -> Result<String> {
        let v: Value = call(self.get("/v1/models").call())?;
        v["data"][0]["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("/v1/models lists no model: {v}"))
    }

    /// Token ids of `text` by the server's own tokenizer (`POST /tokenize`).
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>> {
        let v: Value = call(
            self.post("/tokenize")
                .send_json(json!({"prompt": text, "add_special_tokens": false})),
        )?;
        serde_json::from_value(v["tokens"].clone())
            .with_context(|| format!("/tokenize answered without token ids: {v}"))
    }

    /// Sends one streamed completion of `prompt` (token ids) generating `max_tokens` tokens
    /// (EOS ignored, greedy) and times it.
    pub fn complete(&self, prompt: &[u32], max_tokens: usize) -> Result<RequestResult> {
        let body = json!({
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": true,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let start = Instant::now();
        let reply = self.post("/v1/completions").send_json(body);
        let reply = reply.map_err(|e| anyhow!(describe(e)))?;
        let mut result = RequestResult {
            prompt_len: prompt.len(),
            ..RequestResult::default()
        };
        let (mut last, mut done) = (None::<Instant>, false);
        for line in BufReader::new(reply.into_reader()).lines() {
            let line = line.context("reading the stream")?;
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                done = true;
                break;
            }
            let chunk: Value = serde_json::from_str(data)
                .with_context(|| format!("a chunk that is not JSON: {data}"))?;
            if let Some(n) = chunk["usage"]["completion_tokens"].as_u64() {
                result.output_tokens = usize::try_from(n).unwrap_or(usize::MAX);
            }
            if chunk["choices"].as_array().is_some_and(|c| !c.is_empty()) {
                let now = Instant::now();
                match last {
                    None => result.ttft = now - start,
                    Some(prev) => result.itl.push(now - prev),
                }
                last = Some(now);
            }
        }
        if !done {
            bail!("the stream ended without `data: [DONE]`");
        }
        if last.is_none() {
            bail!("the stream carried no tokens");
        }
        result.latency = start.elapsed();
        Ok(result)
    }
}

fn call(r: Result<ureq::Response, ureq::Error>) -> Result<Value> {
    let r = r.map_err(|e| anyhow!(describe(e)))?;
    r.into_json().context("the reply is not JSON")
}

/// An HTTP error with the server's message when it sent one.
fn describe(e: ureq::Error) -> String {
    match e {
        ureq::Error::Status(code, r) => {
            let body = r.into_string().unwrap_or_default();
            let msg = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                .unwrap_or(body);
            format!("HTTP {code}: {msg}")
        }
        other => other.to_string(),
    }
}
