//! Tool calling, as OpenAI's API and vLLM's server offer it: `tools` shown to the model
//! through its chat template, `tool_choice` (`auto`: calls parsed from what the model
//! writes; `required` and a named function: the output constrained by grammar so it is
//! always a call), `parallel_tool_calls`, and past calls and tool results in `messages`.

pub mod parse;
pub mod prompt;
pub mod replies;
pub mod stream;

use infer_core::sampling::StructuredOutput;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

pub use parse::{CallFormat, ToolCallParser};
pub use replies::ChatReplies;
pub use stream::{StreamDelta, ToolCall, ToolStream};

use crate::error::RequestError;

/// One entry of `tools`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDef,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FunctionDef {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON schema of the arguments object (absent: no arguments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// Arguments always follow the schema here when grammar constrains them; accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// `tool_choice`: `"none"`, `"auto"`, `"required"`, or `{"type": "function", "function":
/// {"name": ...}}`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(String),
    Named(NamedToolChoice),
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NamedToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: NamedFunction,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NamedFunction {
    pub name: String,
}

/// A past call in an assistant message's `tool_calls`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolCallIn {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub function: FunctionCallIn,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FunctionCallIn {
    pub name: String,
    /// The arguments as a JSON string, as OpenAI sends them back.
    pub arguments: String,
}

/// How a request's replies are read for tool calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolPlan {
    pub format: CallFormat,
    pub parallel: bool,
}

/// What a request's tool fields add to its prompt and sampling.
#[derive(Debug, Clone, Default)]
pub struct ToolSetup {
    /// `tools` as the template (or the written-in preamble) shows them; `None` with
    /// `tool_choice: "none"`.
    pub shown: Option<Value>,
    pub plan: Option<ToolPlan>,
    /// The grammar `required` or a named function puts on the output.
    pub constraint: Option<StructuredOutput>,
}

/// Checks `tools`, `tool_choice` and `parallel_tool_calls` and says what they do. `parser`
/// is the server's tool-call parser (`tool_choice: "auto"` needs one).
pub fn setup(
    tools: Option<&[Tool]>,
    choice: Option<&ToolChoice>,
    parallel: Option<bool>,
    parser: Option<ToolCallParser>,
) -> Result<ToolSetup, RequestError> {
    let tools = tools.unwrap_or_default();
    check_tools(tools)?;
    let parallel = parallel.unwrap_or(true);
    let bad = |msg: String| RequestError::bad_request(msg).param("tool_choice");
    let mode = match choice {
        None if tools.is_empty() => return Ok(ToolSetup::default()),
        None => "auto",
        Some(ToolChoice::Mode(m)) => m.as_str(),
        Some(ToolChoice::Named(n)) => {
            if n.kind != "function" {
                return Err(bad(format!(
                    "tool_choice type `{}` is not supported (only `function`)",
                    n.kind
                )));
            }
            let Some(tool) = tools.iter().find(|t| t.function.name == n.function.name) else {
                return Err(bad(format!(
                    "tool_choice names `{}`, which is not in `tools`",
                    n.function.name
                )));
            };
            return Ok(ToolSetup {
                shown: Some(json!(tools)),
                plan: Some(ToolPlan {
                    format: CallFormat::Arguments(tool.function.name.clone()),
                    parallel,
                }),
                constraint: Some(StructuredOutput::Json(arguments_schema(&tool.function))),
            });
        }
    };
    if tools.is_empty() && mode != "none" {
        return Err(bad(format!("tool_choice `{mode}` needs `tools`")));
    }
    match mode {
        "none" => Ok(ToolSetup::default()),
        "auto" => {
            let Some(parser) = parser else {
                return Err(bad(
                    "tool_choice `auto` needs a tool-call parser for this model's format: start the server with --tool-call-parser (hermes, llama3_json)".into(),
                ));
            };
            Ok(ToolSetup {
                shown: Some(json!(tools)),
                plan: Some(ToolPlan {
                    format: CallFormat::Parsed(parser),
                    parallel,
                }),
                constraint: None,
            })
        }
        "required" => Ok(ToolSetup {
            shown: Some(json!(tools)),
            plan: Some(ToolPlan {
                format: CallFormat::Array,
                parallel,
            }),
            constraint: Some(StructuredOutput::Json(required_schema(tools, parallel)?)),
        }),
        other => Err(bad(format!(
            "unknown tool_choice `{other}` (none, auto, required, or a named function)"
        ))),
    }
}

pub(crate) fn check_tools(tools: &[Tool]) -> Result<(), RequestError> {
    for (i, t) in tools.iter().enumerate() {
        let bad = |msg: String, field: &str| {
            RequestError::bad_request(msg).param(&format!("tools[{i}].{field}"))
        };
        if t.kind != "function" {
            return Err(bad(
                format!("tool type `{}` is not supported (only `function`)", t.kind),
                "type",
            ));
        }
        let name = &t.function.name;
        let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.';
        if name.is_empty() || name.len() > 64 || !name.chars().all(valid) {
            return Err(bad(
                format!("function name `{name}` must be 1-64 of a-z, A-Z, 0-9, _, - and ."),
                "function.name",
            ));
        }
        if tools[..i].iter().any(|o| &o.function.name == name) {
            return Err(bad(
                format!("two tools are named `{name}`"),
                "function.name",
            ));
        }
        if let Some(p) = &t.function.parameters {
            if !p.is_object() {
                return Err(bad(
                    "`parameters` must be a JSON schema object".into(),
                    "function.parameters",
                ));
            }
        }
    }
    Ok(())
}

/// A function's arguments schema (no `parameters`: an object with no properties).
fn arguments_schema(f: &FunctionDef) -> Value {
    f.parameters
        .clone()
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}))
}

/// vLLM's schema for `tool_choice: "required"`: an array of at least one
/// `{"name": <a tool>, "parameters": <its arguments>}`, at most one without
/// `parallel_tool_calls`. Each tool's `$defs` move to the root, where `#/$defs/...` points.
fn required_schema(tools: &[Tool], parallel: bool) -> Result<Value, RequestError> {
    let mut defs = Map::new();
    let mut items = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let mut params = arguments_schema(&t.function);
        if let Some(Value::Object(d)) = params.as_object_mut().and_then(|p| p.remove("$defs")) {
            for (k, v) in d {
                match defs.get(&k) {
                    Some(old) if old != &v => {
                        return Err(RequestError::bad_request(format!(
                            "tools define `$defs/{k}` differently; `tool_choice: required` needs one meaning for each"
                        ))
                        .param(&format!("tools[{i}].function.parameters")))
                    }
                    _ => {
                        defs.insert(k, v);
                    }
                }
            }
        }
        items.push(json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t.function.name]},
                "parameters": params,
            },
            "required": ["name", "parameters"],
            "additionalProperties": false,
        }));
    }
    let mut schema = json!({"type": "array", "minItems": 1, "items": {"anyOf": items}});
    if !parallel {
        schema["maxItems"] = json!(1);
    }
    if !defs.is_empty() {
        schema["$defs"] = Value::Object(defs);
    }
    Ok(schema)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> Tool {
        Tool {
            kind: "function".into(),
            function: FunctionDef {
                name: name.into(),
                description: None,
                parameters: Some(
                    json!({"type": "object", "properties": {"x": {"type": "integer"}}}),
                ),
                strict: None,
            },
        }
    }

    #[test]
    fn choices_map_to_plans_and_grammars() {
        let tools = [tool("f"), tool("g")];
        let none = setup(
            Some(&tools),
            Some(&ToolChoice::Mode("none".into())),
            None,
            None,
        )
        .unwrap();
        assert!(none.plan.is_none() && none.shown.is_none());
        let auto = setup(Some(&tools), None, None, Some(ToolCallParser::Hermes)).unwrap();
        assert_eq!(
            auto.plan.unwrap().format,
            CallFormat::Parsed(ToolCallParser::Hermes)
        );
        let err = setup(Some(&tools), None, None, None).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("tool_choice"));
        let req = setup(
            Some(&tools),
            Some(&ToolChoice::Mode("required".into())),
            Some(false),
            None,
        )
        .unwrap();
        let Some(StructuredOutput::Json(schema)) = req.constraint else {
            panic!()
        };
        assert_eq!(schema["maxItems"], 1);
        assert_eq!(
            schema["items"]["anyOf"][1]["properties"]["name"]["enum"][0],
            "g"
        );
        let named = ToolChoice::Named(NamedToolChoice {
            kind: "function".into(),
            function: NamedFunction { name: "g".into() },
        });
        let n = setup(Some(&tools), Some(&named), None, None).unwrap();
        assert_eq!(n.plan.unwrap().format, CallFormat::Arguments("g".into()));
        let unknown = ToolChoice::Named(NamedToolChoice {
            kind: "function".into(),
            function: NamedFunction { name: "h".into() },
        });
        assert!(setup(Some(&tools), Some(&unknown), None, None).is_err());
        let e = setup(None, Some(&ToolChoice::Mode("required".into())), None, None).unwrap_err();
        assert!(e.message.contains("needs `tools`"), "{e}");
        let dup = setup(Some(&[tool("f"), tool("f")]), None, None, None).unwrap_err();
        assert_eq!(dup.param.as_deref(), Some("tools[1].function.name"));
    }
}
