//! Structured outputs: a request's output constrained to a JSON schema, any JSON object, a
//! regular expression, one of a list of strings, or a Lark grammar. llguidance compiles the
//! constraint over the model's tokenizer (a token trie built once per engine); each step every
//! constrained sequence gets a bitmask of the tokens that keep the output valid, which the
//! batch sampler applies, and the sampled token advances the sequence's matcher.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{token_bytes_from_tokenizer_json, Matcher, ParserFactory};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::error::{InferError, Result};
use crate::narrow::u32_index;
use crate::tokenizer::Tokenizer;

/// The parameter errors name (the server maps it to the field the client used).
pub const PARAM: &str = "structured_outputs";

/// What the output must match (vLLM's `StructuredOutputsParams`, one field set).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StructuredOutput {
    /// A JSON schema (OpenAI's `response_format: json_schema`, vLLM's `json`).
    Json(Value),
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A regular expression the whole output matches.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark dialect (vLLM's `grammar`; EBNF-like `start: ...` rules).
    Grammar(String),
}

impl StructuredOutput {
    /// llguidance's grammar for the constraint; errors name what is wrong with it. With
    /// `strict_schema` false, object schemas that do not say otherwise allow no properties
    /// beyond their own (see `close_objects`).
    fn grammar(&self, strict_schema: bool) -> Result<TopLevelGrammar> {
        Ok(match self {
            StructuredOutput::Json(schema) => {
                let mut schema = json_schema(schema)?;
                if !strict_schema {
                    close_objects(&mut schema);
                }
                TopLevelGrammar::from_json_schema(schema)
            }
            StructuredOutput::JsonObject => {
                TopLevelGrammar::from_json_schema(json_schema(&json!({"type": "object"}))?)
            }
            StructuredOutput::Regex(rx) => TopLevelGrammar::from_regex(rx),
            StructuredOutput::Choice(choices) => {
                if choices.is_empty() {
                    return Err(InferError::invalid(PARAM, "`choice` is an empty list"));
                }
                // A Lark alternation of string literals (JSON string syntax escapes them).
                let alternatives: Vec<String> = choices
                    .iter()
                    .map(|c| serde_json::to_string(c).unwrap_or_default())
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}", alternatives.join(" | ")))
            }
            StructuredOutput::Grammar(g) => TopLevelGrammar::from_lark(g.clone()),
        })
    }
}

/// A schema as llguidance takes it: an object (`true` is `{}`), with compact separators and no
/// free whitespace unless the schema says otherwise in `x-guidance` (free whitespace lets a
/// small model pad the output with blank lines until `max_tokens`).
fn json_schema(schema: &Value) -> Result<Value> {
    let mut schema = match schema {
        Value::Object(_) => schema.clone(),
        Value::Bool(true) => json!({}),
        other => {
            return Err(InferError::invalid(
                PARAM,
                format!("a JSON schema must be an object, not `{other}`"),
            ))
        }
    };
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(
            || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    Ok(schema)
}

/// vLLM's default JSON-schema reading (xgrammar's strict mode; its guidance backend's
/// `disable_additional_properties`): an object schema that does not say whether other
/// properties are allowed allows none. Clients' tool schemas (LangChain, openai-node) leave
/// `additionalProperties` out, and a small model given the freedom invents keys until
/// `max_tokens`. Applied to every subschema; explicit `additionalProperties`,
/// `patternProperties` or `unevaluatedProperties` are kept as written.
pub fn close_objects(schema: &mut Value) {
    let Value::Object(obj) = schema else {
        return;
    };
    let typed_object = match obj.get("type") {
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        _ => false,
    };
    let open = [
        "additionalProperties",
        "patternProperties",
        "unevaluatedProperties",
    ]
    .iter()
    .all(|k| !obj.contains_key(*k));
    if (typed_object || obj.contains_key("properties")) && open {
        obj.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (key, value) in obj.iter_mut() {
        match key.as_str() {
            // Maps of name to subschema.
            "properties" | "$defs" | "definitions" | "patternProperties" | "dependentSchemas" => {
                if let Value::Object(subs) = value {
                    subs.values_mut().for_each(close_objects);
                }
            }
            // Lists of subschemas.
            "anyOf" | "oneOf" | "allOf" | "prefixItems" => {
                if let Value::Array(subs) = value {
                    subs.iter_mut().for_each(close_objects);
                }
            }
            // One subschema (or, for `items`, a list in the old tuple form).
            "items"
            | "additionalProperties"
            | "additionalItems"
            | "not"
            | "if"
            | "then"
            | "else"
            | "contains"
            | "propertyNames"
            | "unevaluatedItems" => match value {
                Value::Array(subs) => subs.iter_mut().for_each(close_objects),
                other => close_objects(other),
            },
            _ => {}
        }
    }
}

/// Compiles constraints for one tokenizer: the token trie and llguidance's parser factory,
/// built once (tens of milliseconds for a 50k vocabulary) and shared by every request.
pub struct GrammarCompiler {
    factory: ParserFactory,
    /// JSON Schema's own reading of objects (other properties allowed unless forbidden)
    /// instead of vLLM's (`close_objects`).
    strict_schema: bool,
}

impl GrammarCompiler {
    /// `vocab` is the width of the model's logits rows (at least the tokenizer's vocabulary);
    /// `strict_schema`: see the field.
    pub fn new(tokenizer: &Tokenizer, vocab: usize, strict_schema: bool) -> Result<Self> {
        let env: TokEnv = Arc::new(TrieEnv::new(tokenizer, vocab)?);
        let mut factory = ParserFactory::new_simple(&env).map_err(setup_err)?;
        factory.quiet();
        Ok(GrammarCompiler {
            factory,
            strict_schema,
        })
    }

    /// A matcher at the start of the output; a constraint that does not compile is an
    /// invalid-parameter error with llguidance's message.
    pub fn compile(&self, spec: &StructuredOutput) -> Result<Matcher> {
        let grammar = spec.grammar(self.strict_schema)?;
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| InferError::invalid(PARAM, e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(InferError::invalid(PARAM, e));
        }
        Ok(matcher)
    }
}

/// The tokens a matcher allows next (EOS alone once it has stopped); `None` if it failed, in
/// which case the sequence is ended by the caller.
pub fn allowed_tokens(matcher: &mut Matcher) -> Option<SimpleVob> {
    matcher.compute_mask_or_eos().ok()
}

/// Sets every logit the mask does not allow to -inf (ids past the mask are not allowed).
pub fn apply_mask(logits: &mut [f32], allowed: &SimpleVob) {
    let words = allowed.as_slice();
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        // Most words of a grammar's mask are all-out or all-in: one fill or nothing.
        match words.get(w).copied().unwrap_or(0) {
            u32::MAX => {}
            0 => chunk.fill(f32::NEG_INFINITY),
            // A select, not a branch: allowed tokens are scattered (a branch per token
            // mispredicts about half the time).
            bits => {
                for (i, l) in chunk.iter_mut().enumerate() {
                    let keep = (bits >> i) & 1 != 0;
                    *l = if keep { *l } else { f32::NEG_INFINITY };
                }
            }
        }
    }
}

/// llguidance's view of our tokenizer: every token's bytes in a trie (special tokens marked so
/// text never matches them), and the tokenizer itself for the text a grammar forces. Built from
/// the `tokenizer.json` form with llguidance's own byte decoding, so it needs no second copy of
/// the `tokenizers` crate (whose C parts would not build for the browser).
struct TrieEnv {
    trie: TokTrie,
    tokenizer: tokenizers::Tokenizer,
}

impl TrieEnv {
    fn new(tokenizer: &Tokenizer, vocab: usize) -> Result<Self> {
        let json: Value = serde_json::from_str(&tokenizer.to_json()?).map_err(setup_err)?;
        // llguidance asserts on vocabularies it does not expect (the model file is outside
        // data): a panic there is an error here, not a crash of the server.
        let words = std::panic::catch_unwind(|| token_bytes_from_tokenizer_json(&json))
            .map_err(|_| setup_err("the tokenizer's vocabulary could not be read as bytes"))?;
        let mut words = words.map_err(setup_err)?;
        if words.len() > vocab {
            return Err(setup_err(format!(
                "the tokenizer has {} tokens but the model's logits only {vocab}",
                words.len()
            )));
        }
        // Rows past the tokenizer (padding in the embedding) are special tokens no text matches.
        while words.len() < vocab {
            let mut name = format!(".<[{}]>", words.len()).into_bytes();
            name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
            words.push(name);
        }
        let eos = tokenizer.eos_token_ids();
        let info = TokRxInfo::new(u32_index(vocab), eos.first().copied().unwrap_or(0));
        let mut trie = TokTrie::from(&info, &words);
        if eos.len() > 1 {
            trie = trie.with_eos_tokens(eos);
        }
        Ok(TrieEnv {
            trie,
            tokenizer: tokenizer.inner().clone(),
        })
    }
}

impl TokenizerEnv for TrieEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            // A text the tokenizer rejects falls back to the trie's greedy split (empty here).
            self.tokenizer
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .unwrap_or_default()
        })
    }
}

/// llguidance's errors (`anyhow`) while building the tokenizer side.
fn setup_err(e: impl std::fmt::Display) -> InferError {
    InferError::Tokenizer(format!("structured outputs: {e}"))
}
