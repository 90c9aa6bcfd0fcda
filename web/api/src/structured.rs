//! The request fields that ask for structured outputs, as OpenAI and vLLM name them:
//! `response_format` (`json_object`, `json_schema`), vLLM's `structured_outputs` object and
//! its older `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`. At most one
//! may constrain a request; each becomes the engine's `StructuredOutput`.

use infer_core::sampling::StructuredOutput;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use crate::error::RequestError;

/// OpenAI's `response_format`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    pub name: Option<String>,
    pub description: Option<String>,
    /// Absent: any JSON value.
    pub schema: Option<Value>,
    /// Outputs always follow the schema here (the grammar enforces it), strict or not.
    pub strict: Option<bool>,
}

/// vLLM's `structured_outputs` (one of its constraint fields set). Its options we do not
/// implement (`whitespace_pattern`, `structural_tag`, ...) are refused by name.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StructuredOutputsField {
    pub json: Option<Value>,
    pub regex: Option<String>,
    pub choice: Option<Vec<String>>,
    pub grammar: Option<String>,
    pub json_object: Option<bool>,
}

/// The structured-output fields of a completion or chat request.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub struct StructuredFields {
    pub response_format: Option<ResponseFormat>,
    pub structured_outputs: Option<StructuredOutputsField>,
    pub guided_json: Option<Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
}

impl StructuredFields {
    /// The constraint and the field that asked for it; more than one is a 400.
    pub fn constraint(&self) -> Result<Option<(StructuredOutput, &'static str)>, RequestError> {
        let mut found: Vec<(StructuredOutput, &'static str)> = Vec::new();
        match &self.response_format {
            None | Some(ResponseFormat::Text) => {}
            Some(ResponseFormat::JsonObject) => {
                found.push((StructuredOutput::JsonObject, "response_format"))
            }
            Some(ResponseFormat::JsonSchema { json_schema }) => found.push((
                StructuredOutput::Json(json_schema.schema.clone().unwrap_or(Value::Bool(true))),
                "response_format",
            )),
        }
        if let Some(s) = &self.structured_outputs {
            let p = "structured_outputs";
            if let Some(j) = &s.json {
                found.push((StructuredOutput::Json(parse_schema(j, p)?), p));
            }
            if let Some(r) = &s.regex {
                found.push((StructuredOutput::Regex(r.clone()), p));
            }
            if let Some(c) = &s.choice {
                found.push((StructuredOutput::Choice(c.clone()), p));
            }
            if let Some(g) = &s.grammar {
                found.push((StructuredOutput::Grammar(g.clone()), p));
            }
            if s.json_object == Some(true) {
                found.push((StructuredOutput::JsonObject, p));
            }
        }
        if let Some(j) = &self.guided_json {
            let p = "guided_json";
            found.push((StructuredOutput::Json(parse_schema(j, p)?), p));
        }
        if let Some(r) = &self.guided_regex {
            found.push((StructuredOutput::Regex(r.clone()), "guided_regex"));
        }
        if let Some(c) = &self.guided_choice {
            found.push((StructuredOutput::Choice(c.clone()), "guided_choice"));
        }
        if let Some(g) = &self.guided_grammar {
            found.push((StructuredOutput::Grammar(g.clone()), "guided_grammar"));
        }
        if found.len() > 1 {
            let names: Vec<&str> = found.iter().map(|f| f.1).collect();
            return Err(RequestError::bad_request(format!(
                "only one structured-output constraint may be given; got {}",
                names.join(", ")
            ))
            .param(found[1].1));
        }
        Ok(found.pop())
    }
}

/// vLLM takes a schema as a JSON value or as a string holding one.
fn parse_schema(v: &Value, param: &'static str) -> Result<Value, RequestError> {
    match v {
        Value::String(s) => serde_json::from_str(s).map_err(|e| {
            RequestError::bad_request(format!("the JSON schema is not valid JSON: {e}"))
                .param(param)
        }),
        other => Ok(other.clone()),
    }
}
