//! `infer serve`: the OpenAI-compatible server. The engine is built and run on its own
//! thread; warp serves on a tokio runtime until SIGINT / SIGTERM.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use clap::Args;
use infer_web::api::prepare::ChatLimits;
use infer_web::api::tools::ToolCallParser;
use infer_web::budget::Budget;
use infer_web::cors::parse_list;
use infer_web::{CorsConfig, EngineHandle, Metrics, ServeOptions, ServerState};

use crate::model::ModelArgs;

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to bind (127.0.0.1: this machine only).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on /v1 endpoints.
    #[arg(long, env = "INFER_API_KEY")]
    pub api_key: Option<String>,
    /// Model name clients use (default: the --model value; for an absolute path, its file or
    /// folder name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Waiting requests beyond which new ones get 503 at once (0 = no limit).
    #[arg(long, default_value_t = 256)]
    pub max_waiting: usize,
    /// Prefix of the Prometheus metric names: `vllm` makes `/metrics` read exactly as vLLM's
    /// (`vllm:num_requests_waiting`, ...), for its dashboards and the Kubernetes gateway.
    #[arg(long, default_value = "infer", value_parser = ["infer", "vllm"])]
    pub metrics_prefix: String,
    /// How replies are read for tool calls with `tool_choice: "auto"`: `hermes`
    /// (`<tool_call>{...}</tool_call>`: Hermes, Qwen, and models whose template takes no
    /// tools), `llama3_json` (Llama 3.x), `auto` (from the chat template), `none` (refuse
    /// `auto`; `required` and named functions still work, by grammar).
    #[arg(long, default_value = "auto", value_parser = ["auto", "hermes", "llama3_json", "none"])]
    pub tool_call_parser: String,
    /// Seconds a client has to send a request's headers; idle keep-alive connections are
    /// closed after it too.
    #[arg(long, default_value_t = 10)]
    pub header_read_timeout: u64,
    /// Open connections at most (lowered to fit the open-file limit); more wait to be accepted.
    #[arg(long, default_value_t = 4096)]
    pub max_connections: usize,
    /// Seconds in-flight requests get after SIGTERM / SIGINT before they are aborted (a second
    /// signal exits at once).
    #[arg(long, default_value_t = 5)]
    pub shutdown_grace: u64,
    /// CORS: origins allowed to call the API from a browser page (vLLM's flag: a JSON list or
    /// comma-separated; `*` for any). Without it, cross-origin calls are refused.
    #[arg(long)]
    pub allowed_origins: Option<String>,
    /// CORS methods (default with --allowed-origins: GET, HEAD, POST, OPTIONS).
    #[arg(long, default_value = "*")]
    pub allowed_methods: String,
    /// CORS request headers (default: the ones OpenAI clients send).
    #[arg(long, default_value = "*")]
    pub allowed_headers: String,
    /// CORS: allow credentials (cookies, HTTP auth) on cross-origin calls.
    #[arg(long)]
    pub allowed_credentials: bool,
    /// The time a step should take when --max-num-batched-tokens is not given: the token
    /// budget follows the measured cost of a token, so long prompts are admitted in chunks
    /// that keep every running stream's gap between tokens near this. 0: no pacing.
    #[arg(long, default_value_t = 250)]
    pub step_target_ms: u64,
    /// Chat messages one request may hold (more: a 400 naming this flag), checked before the
    /// template renders them.
    #[arg(long, default_value_t = ChatLimits::default().max_messages)]
    pub max_chat_messages: usize,
    /// Tools one chat request may hold (OpenAI allows 128).
    #[arg(long, default_value_t = ChatLimits::default().max_tools)]
    pub max_tools: usize,
    /// Requests parsed, rendered and tokenized at once (default: one per core); more wait, up
    /// to 30 s, then get 503. Each costs many times its body while it is prepared.
    #[arg(long)]
    pub max_tokenizing_requests: Option<usize>,
    /// MiB of large (> 64 KiB) request bodies held at once; past it, new ones get 503.
    #[arg(long, default_value_t = infer_web::budget::DEFAULT_BODY_MIB)]
    pub max_body_memory_mib: usize,
    /// vLLM's switch for `tool_choice: "auto"`, accepted so vLLM command lines run: here auto
    /// tool choice is on whenever --tool-call-parser resolves to a parser.
    #[arg(long)]
    pub enable_auto_tool_choice: bool,
}

/// The tool-call parser `--tool-call-parser` names, or the chat template's.
fn tool_parser(flag: &str, template: Option<&str>) -> Option<ToolCallParser> {
    let parser = match flag {
        "none" => None,
        "auto" => ToolCallParser::detect(template),
        name => ToolCallParser::from_name(name),
    };
    match parser {
        Some(p) => tracing::info!(parser = p.name(), "tool calls: tool_choice auto reads replies"),
        None if flag == "auto" => tracing::warn!(
            "tool calls: no parser reads this chat template's format; tool_choice auto is refused (pass --tool-call-parser)"
        ),
        None => tracing::info!("tool calls: tool_choice auto is refused (--tool-call-parser none)"),
    }
    parser
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down");
    // A second signal means now.
    tokio::spawn(async {
        let _ = tokio::signal::ctrl_c().await;
        eprintln!("infer serve: second signal, exiting at once");
        std::process::exit(130);
    });
    #[cfg(unix)]
    if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        tokio::spawn(async move {
            s.recv().await;
            eprintln!("infer serve: second signal, exiting at once");
            std::process::exit(143);
        });
    }
}

/// The --model value, as vLLM names the model; an absolute path is cut to its last part, so
/// routes open without the key (`/metrics` labels) do not disclose where the model lives.
fn default_served_name(model: &str) -> String {
    let path = std::path::Path::new(model);
    match path.file_name().and_then(|n| n.to_str()) {
        Some(name) if path.is_absolute() => name.to_string(),
        _ => model.to_string(),
    }
}

pub fn run(args: ServeArgs) -> Result<()> {
    let name = args
        .served_model_name
        .clone()
        .unwrap_or_else(|| default_served_name(&args.model.model));
    let model = args.model;
    let gguf = std::path::PathBuf::from(&model.model);
    let gguf = (gguf.extension().is_some_and(|e| e == "gguf") && gguf.is_file()).then_some(gguf);
    let metrics = Arc::new(Metrics::new(&name, &args.metrics_prefix)?);
    let cors = match &args.allowed_origins {
        None => None,
        Some(origins) => Some(CorsConfig {
            origins: parse_list(origins).map_err(|e| anyhow!("--allowed-origins: {e}"))?,
            methods: parse_list(&args.allowed_methods)
                .map_err(|e| anyhow!("--allowed-methods: {e}"))?,
            headers: parse_list(&args.allowed_headers)
                .map_err(|e| anyhow!("--allowed-headers: {e}"))?,
            credentials: args.allowed_credentials,
        }),
    };
    let limits = ChatLimits {
        max_messages: args.max_chat_messages.max(1),
        max_tools: args.max_tools,
    };
    let budget = Budget::new(
        args.max_body_memory_mib,
        args.max_tokenizing_requests
            .unwrap_or_else(infer_web::budget::default_preparing),
        infer_web::budget::DEFAULT_PREPARE_WAIT,
    );
    if args.enable_auto_tool_choice && args.tool_call_parser == "none" {
        anyhow::bail!("--enable-auto-tool-choice needs a --tool-call-parser other than none");
    }
    let step_target = (model.engine.max_num_batched_tokens.is_none() && args.step_target_ms > 0)
        .then(|| Duration::from_millis(args.step_target_ms));
    let (engine, (tokenizer, backend, max_model_len)) = EngineHandle::start(
        move || {
            let (mut engine, tokenizer, backend) = model.engine().map_err(|e| format!("{e:#}"))?;
            engine.set_step_target(step_target);
            if let Err(e) = engine.prepare_structured_outputs() {
                tracing::warn!("structured outputs and tool choice will fail: {e}");
            }
            let max_model_len = engine.config().max_model_len;
            Ok((engine, (tokenizer, backend, max_model_len)))
        },
        args.max_waiting,
        metrics.clone(),
    )
    .map_err(|e| anyhow!(e))?;
    let parser = tool_parser(&args.tool_call_parser, tokenizer.chat_template());
    let state = Arc::new(
        ServerState::new(
            engine,
            tokenizer,
            name,
            max_model_len,
            backend.clone(),
            metrics,
        )
        .with_model_file(gguf)
        .with_tool_parser(parser)
        .with_cors(cors)
        .with_limits(limits, budget),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let addr = SocketAddr::new(args.host, args.port);
        let options = ServeOptions {
            header_read_timeout: Duration::from_secs(args.header_read_timeout.max(1)),
            max_connections: args.max_connections.max(1),
            shutdown_grace: Duration::from_secs(args.shutdown_grace),
            ..ServeOptions::default()
        };
        let (local, server) =
            infer_web::bind_with(state, addr, args.api_key, options, shutdown_signal())
                .await
                .with_context(|| format!("binding {addr}"))?;
        eprintln!("infer serve: http://{local} ({backend})");
        server.await;
        Ok::<(), anyhow::Error>(())
    })?;
    // Tokenizations still running on the blocking pool are not waited for: the grace period
    // bounds the whole exit (dropping the runtime would wait for them).
    runtime.shutdown_timeout(Duration::from_millis(100));
    Ok(())
}
