//! The tokenizer of a model: the `tokenizers` crate for encode/decode, built from GGUF metadata
//! or loaded from `tokenizer.json`, plus the special ids and chat template that go with it.

mod chat;
mod detokenizer;
mod gguf;

use std::path::Path;

pub use chat::{render as render_chat_template, template_takes_tools, ChatMessage};
pub use detokenizer::IncrementalDetokenizer;

use crate::error::{InferError, Result};
use crate::gguf::{GgufFile, GgufValue};
use crate::hf::read_json;

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// Every id that ends generation (EOS, end-of-turn, ...).
    eos_token_ids: Vec<u32>,
    chat_template: Option<String>,
    /// The longest token's text in bytes, found on first use.
    max_token_bytes: std::sync::OnceLock<usize>,
}

fn tk_err(e: impl std::fmt::Display) -> InferError {
    InferError::Tokenizer(e.to_string())
}

/// The model's own chat template, unless it is too large, does not parse or does not render
/// within budget: then the model loads without one (chat requests get a clear error saying so,
/// completions work) and the log says why.
fn shipped_template(template: Option<String>) -> Option<String> {
    let template = template?;
    match chat::check(&template) {
        Ok(()) => Some(template),
        Err(e) => {
            tracing::warn!("the model's chat template is refused: {e}");
            None
        }
    }
}

impl Tokenizer {
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let parts = gguf::build(g)?;
        tracing::debug!(add_bos = parts.add_bos, eos = ?parts.eos_ids, "GGUF tokenizer built");
        let name = |id: Option<u32>| id.and_then(|i| parts.tokenizer.id_to_token(i));
        Ok(Tokenizer {
            bos_token: name(parts.bos),
            eos_token: name(parts.eos_ids.first().copied()),
            eos_token_ids: parts.eos_ids,
            chat_template: shipped_template(
                g.get("tokenizer.chat_template")
                    .and_then(GgufValue::as_str)
                    .map(str::to_string),
            ),
            inner: parts.tokenizer,
            max_token_bytes: Default::default(),
        })
    }

    /// Loads `tokenizer.json` (+ `tokenizer_config.json`) from an HF model directory;
    /// `extra_eos` comes from `config.json` / `generation_config.json`.
    pub fn from_hf_dir(dir: &Path, extra_eos: &[u32]) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Err(InferError::ModelDir {
                path: dir.to_path_buf(),
                reason: "tokenizer.json is missing".into(),
            });
        }
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| InferError::Tokenizer(format!("{}: {e}", path.display())))?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: serde_json::Value = if cfg_path.exists() {
            read_json(&cfg_path)?
        } else {
            serde_json::Value::Null
        };
        let token_text = |key: &str| -> Option<String> {
            match cfg.get(key)? {
                serde_json::Value::String(s) => Some(s.clone()),
                v => v.get("content")?.as_str().map(str::to_string),
            }
        };
        let chat_template = match cfg.get("chat_template") {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            // A list of named templates: take "default".
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
            _ => None,
        };
        let bos_token = token_text("bos_token");
        let eos_token = token_text("eos_token");
        let mut eos_token_ids: Vec<u32> = Vec::new();
        for id in eos_token
            .iter()
            .filter_map(|t| inner.token_to_id(t))
            .chain(extra_eos.iter().copied())
        {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
        Ok(Tokenizer {
            inner,
            bos_token,
            eos_token,
            eos_token_ids,
            chat_template: shipped_template(chat_template),
            max_token_bytes: Default::default(),
        })
    }

    /// Token ids of `text`. `add_special_tokens` applies the tokenizer's own post-processing
    /// (e.g. a BOS for Llama); text such as `<|im_start|>` is matched as one special token either way.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(tk_err)?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner.decode(ids, skip_special_tokens).map_err(tk_err)
    }

    /// The BOS and EOS tokens' text, as `tokenizer_config.json` names them.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// A token's text in the vocabulary (byte-level form for BPE vocabularies).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Replaces the model's chat template (vLLM's `--chat-template`), checking that it parses.
    pub fn with_chat_template(mut self, template: String) -> Result<Self> {
        chat::check(&template)?;
        self.chat_template = Some(template);
        Ok(self)
    }

    /// Renders messages with the model's chat template. The result already holds the template's
    /// special tokens, so encode it with `add_special_tokens = false` (as vLLM does).
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.apply_chat_template_with_tools(messages, None, add_generation_prompt)
    }

    /// As `apply_chat_template`, with OpenAI's `tools` (a list of `{type, function}`) handed to
    /// the template as `tools`, as HF's `apply_chat_template(tools=...)` does.
    pub fn apply_chat_template_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.apply_chat_template_with(messages, tools, None, add_generation_prompt)
    }

    /// As `apply_chat_template_with_tools`, with extra template variables (vLLM's
    /// `chat_template_kwargs`, e.g. Qwen3's `enable_thinking`); they may not set the names
    /// the call sets itself.
    pub fn apply_chat_template_with(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.apply_chat_template_from(None, messages, tools, kwargs, add_generation_prompt)
    }

    /// As `apply_chat_template_with`, rendering `template` instead of the model's when given
    /// (a request's own, which vLLM takes with `--trust-request-chat-template`); the model's
    /// size bound applies to it, and every render is bounded in time and output.
    pub fn apply_chat_template_from(
        &self,
        template: Option<&str>,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let template = match template {
            Some(t) => {
                chat::check_size(t)?;
                t
            }
            None => self.chat_template.as_deref().ok_or_else(|| {
                InferError::ChatTemplate(
                    "the model has no chat template; drop --chat to use the prompt verbatim".into(),
                )
            })?,
        };
        chat::render(
            template,
            messages,
            tools,
            kwargs,
            add_generation_prompt,
            self.bos_token.as_deref().unwrap_or(""),
            self.eos_token.as_deref().unwrap_or(""),
        )
    }

    /// The `tokenizer.json` form, so a tokenizer built from GGUF can be saved as an HF one.
    pub fn to_json(&self) -> Result<String> {
        self.inner.to_string(false).map_err(tk_err)
    }

    /// Writes a Hugging Face tokenizer folder that `AutoTokenizer.from_pretrained(dir)` loads
    /// with the same ids: `tokenizer.json`, `tokenizer_config.json` (the special tokens, the
    /// chat template, `model_max_length`) and `special_tokens_map.json`. For tools that need
    /// an HF tokenizer (guidellm, aiperf) when the model is a GGUF, which ships none.
    pub fn save_hf_dir(&self, dir: &Path, model_max_length: usize) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| InferError::io(dir, e))?;
        let write = |name: &str, text: String| {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|e| InferError::io(&path, e))
        };
        write("tokenizer.json", self.to_json()?)?;
        let mut specials = serde_json::Map::new();
        for (key, token) in [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
        ] {
            if let Some(t) = token {
                specials.insert(key.into(), t.clone().into());
            }
        }
        let mut config = specials.clone();
        // The generic fast tokenizer: special tokens come from tokenizer.json's
        // post-processor, as they do here, and decoding does not touch spaces.
        config.insert("tokenizer_class".into(), "PreTrainedTokenizerFast".into());
        config.insert("clean_up_tokenization_spaces".into(), false.into());
        config.insert("model_max_length".into(), model_max_length.into());
        if let Some(t) = &self.chat_template {
            config.insert("chat_template".into(), t.clone().into());
        }
        let pretty = |m: serde_json::Map<String, serde_json::Value>| {
            serde_json::to_string_pretty(&serde_json::Value::Object(m)).map_err(tk_err)
        };
        write("tokenizer_config.json", pretty(config)?)?;
        write("special_tokens_map.json", pretty(specials)?)?;
        Ok(())
    }

    /// The most bytes of text one token stands for (its vocabulary entry's length, which a
    /// byte-level or byte-fallback entry never undercuts): a text of `b` bytes has at least
    /// `b / max_token_bytes()` tokens, which bounds a prompt before it is tokenized.
    pub fn max_token_bytes(&self) -> usize {
        *self.max_token_bytes.get_or_init(|| {
            self.inner
                .get_vocab(true)
                .keys()
                .map(String::len)
                .max()
                .unwrap_or(1)
                .max(1)
        })
    }

    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}
