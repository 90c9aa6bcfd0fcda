//! The server's OpenAPI document (`GET /openapi.json`, which vLLM's FastAPI serves too): every
//! route, with the request bodies' schemas generated from the very types the server parses
//! them into, so the document cannot drift from what is accepted.

use schemars::generate::SchemaSettings;
use schemars::JsonSchema;
use serde_json::{json, Map, Value};

use crate::embeddings::EmbeddingRequest;
use crate::responses::ResponsesRequest;
use crate::types::{ChatRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest};

/// A route the document describes: method, path, summary, and for POST the body's type.
struct Route {
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    body: Option<Value>,
    /// Answers with server-sent events when the body asks `stream: true`.
    streams: bool,
    /// What a 200 carries (`application/json` unless said).
    content_type: &'static str,
}

fn get(path: &'static str, summary: &'static str) -> Route {
    Route {
        method: "get",
        path,
        summary,
        body: None,
        streams: false,
        content_type: "application/json",
    }
}

fn schema_ref<T: JsonSchema>(generator: &mut schemars::SchemaGenerator) -> Value {
    serde_json::to_value(generator.subschema_for::<T>()).unwrap_or_default()
}

/// The OpenAPI 3.0 document of `infer serve` version `version`.
pub fn document(version: &str) -> Value {
    let mut generator = SchemaSettings::openapi3().into_generator();
    let post = |path, summary, body, streams| Route {
        method: "post",
        path,
        summary,
        body: Some(body),
        streams,
        content_type: "application/json",
    };
    let routes = [
        post(
            "/v1/completions",
            "Completions of a prompt (OpenAI's legacy API, vLLM's extras included)",
            schema_ref::<CompletionRequest>(&mut generator),
            true,
        ),
        post(
            "/v1/chat/completions",
            "A chat reply, with tools, structured outputs and reasoning",
            schema_ref::<ChatRequest>(&mut generator),
            true,
        ),
        post(
            "/v1/responses",
            "OpenAI's Responses API, stateless",
            schema_ref::<ResponsesRequest>(&mut generator),
            true,
        ),
        post(
            "/v1/embeddings",
            "Embeddings of inputs (a server started with --runner pooling)",
            schema_ref::<EmbeddingRequest>(&mut generator),
            false,
        ),
        post(
            "/tokenize",
            "Token ids of a prompt, or of chat messages rendered by the template",
            schema_ref::<TokenizeRequest>(&mut generator),
            false,
        ),
        post(
            "/detokenize",
            "The text of token ids",
            schema_ref::<DetokenizeRequest>(&mut generator),
            false,
        ),
        get("/v1/models", "The served model and its aliases"),
        get("/v1/models/{model}", "One served model"),
        get(
            "/tokenizer_info",
            "The tokenizer: special tokens, chat template, context length",
        ),
        get("/health", "200 while the engine runs"),
        get("/version", "The server's version"),
        Route {
            content_type: "text/plain",
            ..get("/metrics", "Prometheus metrics (vLLM's names)")
        },
        get(
            "/server_info",
            "Server and engine settings (SGLang's router reads it)",
        ),
        get("/get_server_info", "As /server_info"),
        get(
            "/model_info",
            "The model's path and kind (SGLang's router reads it)",
        ),
        get("/get_model_info", "As /model_info"),
        get("/get_load", "Requests running and waiting"),
    ];
    let mut paths = Map::new();
    for r in routes {
        let mut ok = json!({
            "description": "success",
            "content": {r.content_type: {}},
        });
        if r.streams {
            ok["content"]["text/event-stream"] = json!({"schema": {"type": "string", "description": "with `stream: true`: server-sent events, `data: {chunk}` lines ending with `data: [DONE]`"}});
        }
        let mut op = json!({
            "summary": r.summary,
            "responses": {
                "200": ok,
                "4XX": {
                    "description": "a request the server refuses: the message says why, `param` names the field",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
                },
            },
        });
        if r.path.contains("{model}") {
            op["parameters"] = json!([{
                "name": "model", "in": "path", "required": true,
                "schema": {"type": "string"}, "description": "a served model name (may hold slashes)",
            }]);
        }
        if let Some(schema) = r.body {
            op["requestBody"] = json!({
                "required": true,
                "content": {"application/json": {"schema": schema}},
            });
        }
        let entry = paths.entry(r.path.to_string()).or_insert_with(|| json!({}));
        entry[r.method] = op;
    }
    // With the OpenAPI 3.0 transforms applied (`nullable` instead of type arrays, ...).
    let mut schemas: Map<String, Value> = generator.take_definitions(true);
    schemas.insert(
        "ErrorResponse".into(),
        json!({
            "type": "object",
            "required": ["error"],
            "properties": {"error": {
                "type": "object",
                "required": ["message", "type"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": "string", "nullable": true},
                    "code": {"type": "string", "nullable": true},
                },
            }},
        }),
    );
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "infer",
            "version": version,
            "description": "An OpenAI-compatible server; the fields vLLM adds are taken as vLLM takes them.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        // The key is optional: only a server started with --api-key asks for it.
        "security": [{"bearer": []}, {}],
    })
}
