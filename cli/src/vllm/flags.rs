//! Every flag of `vllm serve` (vLLM 0.11: `vllm/engine/arg_utils.py` `EngineArgs.add_cli_args`,
//! `AsyncEngineArgs`, and `vllm/entrypoints/openai/cli_args.py`), and what infer makes of it.
//! Flags infer parses itself (`Own`) are checked against clap by the tests; the others are
//! rewritten away before clap sees them: taken as what infer does anyway (`Inherent`, said
//! once at start-up), taken at the listed values only (`Values`), or refused with the reason
//! and what to do instead (`Refused`).

/// What infer does with one vLLM flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// infer has the flag (or an alias of it) with vLLM's meaning.
    Own,
    /// What the flag asks is what infer does anyway (or it concerns something infer does not
    /// have, so it cannot change a result): accepted, with this note.
    Inherent(&'static str),
    /// Accepted at these values (what infer does); another value is refused with the note.
    Values(&'static [&'static str], &'static str),
    /// Refused: why, and what to do instead.
    Refused(&'static str),
}

/// How a flag is written on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arity {
    /// `--flag`, and `--no-flag` for vLLM's boolean flags.
    Switch,
    /// `--flag VALUE` or `--flag=VALUE`.
    Value,
}

pub struct VllmFlag {
    pub name: &'static str,
    /// Short spellings (`-tp`, `-O`).
    pub short: &'static [&'static str],
    pub arity: Arity,
    pub disposition: Disposition,
}

use Arity::{Switch, Value};
use Disposition::{Inherent, Own, Refused, Values};

const fn f(name: &'static str, arity: Arity, disposition: Disposition) -> VllmFlag {
    VllmFlag {
        name,
        short: &[],
        arity,
        disposition,
    }
}

const fn s(
    name: &'static str,
    short: &'static [&'static str],
    arity: Arity,
    disposition: Disposition,
) -> VllmFlag {
    VllmFlag {
        name,
        short,
        arity,
        disposition,
    }
}

const TEXT_ONLY: &str = "infer serves text-only models";
const NO_LORA: &str = "LoRA adapters are not supported; merge the adapter into the weights";
const ONE_ENGINE: &str = "infer runs one engine per server; run replicas behind a router";
const GRAPH_SIZES: &str = "CUDA graphs are recorded at infer's batch sizes (1, 2, 4, 8, 16, 24, … 512) up to --max-cudagraph-capture-size; sizes change speed, not results";
const NO_MAMBA: &str = "infer has no Mamba / hybrid models";
const NO_EPLB: &str =
    "expert parallelism is not supported; mixture-of-experts models run with tensor parallelism";
const LOGS: &str = "set INFER_LOG (e.g. INFER_LOG=info,infer_web::access=warn) and --log-format";

/// Where the list comes from (the README's table names it).
#[cfg_attr(not(test), allow(dead_code))]
pub const SOURCE: &str =
    "vLLM 0.11 (vllm/engine/arg_utils.py, vllm/entrypoints/openai/cli_args.py)";

/// vLLM's flags, in the order its `--help` lists them.
pub const FLAGS: &[VllmFlag] = &[
    // serve
    f("--config", Value, Own),
    f("--headless", Switch, Refused(ONE_ENGINE)),
    s("--api-server-count", &["-asc"], Value, Values(&["1"], "infer serves from one process")),
    f("--grpc", Switch, Refused("infer serves HTTP (OpenAI's REST API) only")),
    // ModelConfig
    f("--model", Value, Own),
    f("--runner", Value, Own),
    f("--convert", Value, Own),
    f("--task", Value, Own),
    f("--tokenizer", Value, Own),
    f("--tokenizer-mode", Value, Values(&["auto", "hf"], "infer reads the model's own tokenizer (tokenizer.json or the GGUF's)")),
    f("--trust-remote-code", Switch, Inherent("nothing remote ever runs here: infer implements each architecture itself, so no model code is downloaded or trusted")),
    f("--dtype", Value, Own),
    f("--seed", Value, Own),
    f("--hf-config-path", Value, Refused("infer reads config.json beside the weights (or the GGUF's metadata); pass an HF folder")),
    f("--allowed-local-media-path", Value, Refused(TEXT_ONLY)),
    f("--allowed-media-domains", Value, Refused(TEXT_ONLY)),
    f("--revision", Value, Refused("infer fetches the hub's main revision; download another revision and pass its folder")),
    f("--code-revision", Value, Refused("no model code is downloaded (see --trust-remote-code)")),
    f("--rope-scaling", Value, Refused("RoPE scaling comes from the model's config; edit config.json or the GGUF's metadata")),
    f("--rope-theta", Value, Refused("RoPE theta comes from the model's config; edit config.json or the GGUF's metadata")),
    f("--tokenizer-revision", Value, Refused("infer fetches the hub's main revision; pass a local --tokenizer folder")),
    f("--max-model-len", Value, Own),
    s("--quantization", &["-q"], Value, Values(&["gguf", "None", ""], "infer reads the quantization from the model file (GGUF Q4_0/Q4_1/Q4_K/Q5_K/Q6_K/Q8_0/F16/F32); it does not quantize at load")),
    f("--enforce-eager", Switch, Own),
    f("--max-logprobs", Value, Own),
    f("--logprobs-mode", Value, Values(&["processed_logprobs"], "infer reports log-probabilities after penalties and bias, before temperature (vLLM's processed_logprobs)")),
    f("--disable-sliding-window", Switch, Refused("sliding windows come from the model's config")),
    f("--disable-cascade-attn", Switch, Inherent("infer has no cascade attention")),
    f("--skip-tokenizer-init", Switch, Refused("infer always loads the tokenizer (it detokenizes and applies stop strings)")),
    f("--enable-prompt-embeds", Switch, Refused("prompts are text or token ids")),
    f("--served-model-name", Value, Own),
    f("--config-format", Value, Values(&["auto", "hf"], "infer reads HF config.json or GGUF metadata")),
    f("--hf-token", Value, Refused("set HF_TOKEN in the environment")),
    f("--hf-overrides", Value, Refused("edit the model's config.json")),
    f("--pooler-config", Value, Own),
    f("--override-pooler-config", Value, Own),
    f("--logits-processor-pattern", Value, Refused("custom logits processors cannot be loaded")),
    f("--generation-config", Value, Own),
    f("--override-generation-config", Value, Own),
    f("--enable-sleep-mode", Switch, Refused("sleep mode is not supported")),
    f("--model-impl", Value, Values(&["auto", "vllm"], "infer runs its own implementation of each architecture")),
    f("--override-attention-dtype", Value, Refused("attention runs in the backend's own precision (--dtype)")),
    f("--logits-processors", Value, Refused("custom logits processors cannot be loaded")),
    f("--io-processor-plugin", Value, Refused("plugins cannot be loaded")),
    // LoadConfig
    f("--load-format", Value, Own),
    f("--download-dir", Value, Refused("hub downloads go to the Hugging Face cache: set HF_HOME or HF_HUB_CACHE")),
    f("--safetensors-load-strategy", Value, Inherent("infer maps safetensors files and copies each tensor once")),
    f("--model-loader-extra-config", Value, Refused("infer has one loader per format")),
    f("--ignore-patterns", Value, Refused("infer reads only the files it needs")),
    f("--use-tqdm-on-load", Switch, Inherent("infer shows a progress bar while it loads weights on a terminal")),
    f("--pt-load-map-location", Value, Refused("PyTorch .bin/.pt checkpoints are not read; use safetensors or GGUF")),
    // StructuredOutputsConfig
    f("--reasoning-parser", Value, Own),
    f("--guided-decoding-backend", Value, Inherent("structured outputs always use llguidance (vLLM's `guidance` backend)")),
    f("--guided-decoding-disable-fallback", Switch, Inherent("llguidance has no fallback to disable")),
    f("--guided-decoding-disable-any-whitespace", Switch, Inherent("JSON is written without free whitespace already")),
    f("--guided-decoding-disable-additional-properties", Switch, Inherent("object schemas allow no unlisted properties unless they say so (--strict-json-schema for JSON Schema's reading)")),
    // ParallelConfig
    f("--distributed-executor-backend", Value, Own),
    s("--pipeline-parallel-size", &["-pp"], Value, Values(&["1"], "pipeline parallelism is not supported; use --tensor-parallel-size")),
    s("--tensor-parallel-size", &["-tp"], Value, Own),
    s("--decode-context-parallel-size", &["-dcp"], Value, Values(&["1"], "context parallelism is not supported")),
    s("--data-parallel-size", &["-dp"], Value, Values(&["1"], ONE_ENGINE)),
    s("--data-parallel-rank", &["-dpn"], Value, Refused(ONE_ENGINE)),
    s("--data-parallel-start-rank", &["-dpr"], Value, Refused(ONE_ENGINE)),
    s("--data-parallel-size-local", &["-dpl"], Value, Refused(ONE_ENGINE)),
    s("--data-parallel-address", &["-dpa"], Value, Refused(ONE_ENGINE)),
    s("--data-parallel-rpc-port", &["-dpp"], Value, Refused(ONE_ENGINE)),
    s("--data-parallel-backend", &["-dpb"], Value, Refused(ONE_ENGINE)),
    f("--data-parallel-hybrid-lb", Switch, Refused(ONE_ENGINE)),
    f("--enable-expert-parallel", Switch, Refused(NO_EPLB)),
    f("--all2all-backend", Value, Refused(NO_EPLB)),
    f("--enable-dbo", Switch, Refused("dual-batch overlap is not supported")),
    f("--dbo-decode-token-threshold", Value, Refused("dual-batch overlap is not supported")),
    f("--dbo-prefill-token-threshold", Value, Refused("dual-batch overlap is not supported")),
    f("--disable-nccl-for-dp-synchronization", Switch, Refused(ONE_ENGINE)),
    f("--enable-eplb", Switch, Refused(NO_EPLB)),
    f("--eplb-config", Value, Refused(NO_EPLB)),
    f("--expert-placement-strategy", Value, Refused(NO_EPLB)),
    f("--num-redundant-experts", Value, Refused(NO_EPLB)),
    f("--eplb-window-size", Value, Refused(NO_EPLB)),
    f("--eplb-step-interval", Value, Refused(NO_EPLB)),
    f("--eplb-log-balancedness", Switch, Refused(NO_EPLB)),
    f("--max-parallel-loading-workers", Value, Inherent("each rank loads its own slice of the weights")),
    f("--ray-workers-use-nsight", Switch, Refused("infer's ranks are not Ray workers; profile a rank with nsys directly")),
    f("--disable-custom-all-reduce", Switch, Inherent("all-reduces go through NCCL or MPI; there is no custom all-reduce to disable")),
    f("--worker-cls", Value, Refused("worker classes cannot be loaded")),
    f("--worker-extension-cls", Value, Refused("worker classes cannot be loaded")),
    f("--enable-multimodal-encoder-data-parallel", Switch, Refused(TEXT_ONLY)),
    // CacheConfig
    f("--block-size", Value, Own),
    f("--gpu-memory-utilization", Value, Own),
    f("--kv-cache-memory-bytes", Value, Own),
    f("--swap-space", Value, Own),
    f("--kv-cache-dtype", Value, Values(&["auto"], "the KV cache is kept in the backend's activation type (f32 on CPU, f16/f32 on GPUs); fp8 is not supported")),
    f("--num-gpu-blocks-override", Value, Own),
    f("--enable-prefix-caching", Switch, Own),
    f("--prefix-caching-hash-algo", Value, Inherent("prefix-cache blocks are keyed by their full token ids, so the hash cannot collide into a wrong hit")),
    f("--cpu-offload-gb", Value, Refused("weights stay on the device; use a smaller or more quantized GGUF")),
    f("--calculate-kv-scales", Switch, Inherent("there is no fp8 KV cache whose scales could be computed")),
    f("--kv-sharing-fast-prefill", Switch, Refused("cross-layer KV sharing is not supported")),
    f("--mamba-cache-dtype", Value, Refused(NO_MAMBA)),
    f("--mamba-ssm-cache-dtype", Value, Refused(NO_MAMBA)),
    f("--mamba-block-size", Value, Refused(NO_MAMBA)),
    // MultiModalConfig
    f("--limit-mm-per-prompt", Value, Refused(TEXT_ONLY)),
    f("--enable-mm-embeds", Switch, Refused(TEXT_ONLY)),
    f("--media-io-kwargs", Value, Refused(TEXT_ONLY)),
    f("--mm-processor-kwargs", Value, Refused(TEXT_ONLY)),
    f("--mm-processor-cache-gb", Value, Refused(TEXT_ONLY)),
    f("--disable-mm-preprocessor-cache", Switch, Refused(TEXT_ONLY)),
    f("--mm-processor-cache-type", Value, Refused(TEXT_ONLY)),
    f("--mm-shm-cache-max-object-size-mb", Value, Refused(TEXT_ONLY)),
    f("--mm-encoder-tp-mode", Value, Refused(TEXT_ONLY)),
    f("--mm-encoder-attn-backend", Value, Refused(TEXT_ONLY)),
    f("--interleave-mm-strings", Switch, Refused(TEXT_ONLY)),
    f("--skip-mm-profiling", Switch, Refused(TEXT_ONLY)),
    f("--video-pruning-rate", Value, Refused(TEXT_ONLY)),
    // LoRAConfig
    f("--enable-lora", Switch, Refused(NO_LORA)),
    f("--max-loras", Value, Refused(NO_LORA)),
    f("--max-lora-rank", Value, Refused(NO_LORA)),
    f("--lora-extra-vocab-size", Value, Refused(NO_LORA)),
    f("--lora-dtype", Value, Refused(NO_LORA)),
    f("--max-cpu-loras", Value, Refused(NO_LORA)),
    f("--fully-sharded-loras", Switch, Refused(NO_LORA)),
    f("--default-mm-loras", Value, Refused(NO_LORA)),
    // ObservabilityConfig
    f("--show-hidden-metrics-for-version", Value, Inherent("infer hides no deprecated metrics")),
    f("--otlp-traces-endpoint", Value, Refused("OpenTelemetry traces are not exported; scrape /metrics")),
    f("--collect-detailed-traces", Value, Refused("OpenTelemetry traces are not exported; scrape /metrics")),
    // SchedulerConfig
    f("--max-num-batched-tokens", Value, Own),
    f("--max-num-seqs", Value, Own),
    f("--max-num-partial-prefills", Value, Values(&["1"], "one prompt is prefilled in chunks at a time, as vLLM's default")),
    f("--max-long-partial-prefills", Value, Values(&["1"], "one prompt is prefilled in chunks at a time, as vLLM's default")),
    f("--long-prefill-token-threshold", Value, Values(&["0"], "long prompts are not treated apart (vLLM's default, 0)")),
    f("--num-lookahead-slots", Value, Values(&["0"], "speculative decoding sizes its own slots (--speculative-config)")),
    f("--scheduling-policy", Value, Own),
    f("--no-enable-chunked-prefill", Switch, Refused("prompts are always prefilled in chunks; raise --max-num-batched-tokens to take long prompts in fewer steps")),
    f("--enable-chunked-prefill", Switch, Inherent("prompts are always prefilled in chunks under --max-num-batched-tokens")),
    f("--disable-chunked-mm-input", Switch, Inherent(TEXT_ONLY)),
    f("--scheduler-cls", Value, Refused("scheduler classes cannot be loaded")),
    f("--external_parameters", Value, Refused("scheduler classes cannot be loaded")),
    f("--disable-hybrid-kv-cache-manager", Switch, Inherent("there is one KV cache manager for every layer")),
    f("--async-scheduling", Switch, Inherent("the next step is scheduled while the device computes the last one")),
    // CompilationConfig and VllmConfig
    f("--cudagraph-capture-sizes", Value, Inherent(GRAPH_SIZES)),
    f("--cuda-graph-sizes", Value, Inherent(GRAPH_SIZES)),
    f("--max-cudagraph-capture-size", Value, Own),
    f("--speculative-config", Value, Own),
    f("--kv-transfer-config", Value, Refused("disaggregated prefill (KV transfer) is not supported")),
    f("--kv-events-config", Value, Refused("KV cache events are not published")),
    s("--compilation-config", &["-O"], Value, Inherent("infer has no torch.compile; CUDA graphs record decode steps unless --enforce-eager")),
    f("--additional-config", Value, Refused("there are no platform plugins to configure")),
    f("--structured-outputs-config", Value, Refused("structured outputs use llguidance with vLLM's default reading of schemas; --strict-json-schema reads them as JSON Schema does")),
    f("--disable-log-stats", Switch, Own),
    f("--aggregate-engine-logging", Switch, Inherent("one engine: its statistics are the aggregate")),
    // AsyncEngineArgs
    f("--enable-log-requests", Switch, Own),
    f("--disable-log-requests", Switch, Own),
    // Frontend
    f("--lora-modules", Value, Refused(NO_LORA)),
    f("--chat-template", Value, Own),
    f("--chat-template-content-format", Value, Values(&["auto", "string"], "message parts are joined into a string for the template")),
    f("--trust-request-chat-template", Switch, Own),
    f("--default-chat-template-kwargs", Value, Own),
    f("--response-role", Value, Values(&["assistant"], "replies are always the assistant's")),
    f("--return-tokens-as-token-ids", Switch, Own),
    f("--enable-auto-tool-choice", Switch, Own),
    f("--exclude-tools-when-tool-choice-none", Switch, Refused("tools are always shown to the template")),
    f("--tool-call-parser", Value, Own),
    f("--tool-parser-plugin", Value, Refused("plugins cannot be loaded; --tool-call-parser hermes or llama3_json")),
    f("--tool-server", Value, Refused("built-in tools (MCP, code interpreter) are not run by the server")),
    f("--log-config-file", Value, Refused(LOGS)),
    f("--max-log-len", Value, Own),
    f("--enable-prompt-tokens-details", Switch, Inherent("usage always has prompt_tokens_details.cached_tokens")),
    f("--enable-per-request-metrics", Switch, Refused("per-request timings are on /metrics (histograms), not in replies")),
    f("--enable-server-load-tracking", Switch, Inherent("the load is always on /metrics (num_requests_running, num_requests_waiting)")),
    f("--enable-force-include-usage", Switch, Refused("streams carry usage when a request asks for it (stream_options.include_usage)")),
    f("--enable-tokenizer-info-endpoint", Switch, Inherent("/tokenizer_info is always served (behind --api-key)")),
    f("--enable-log-outputs", Switch, Refused("outputs are never logged")),
    f("--enable-log-deltas", Switch, Refused("outputs are never logged")),
    f("--log-error-stack", Switch, Inherent("errors are logged with their cause chain")),
    f("--tokens-only", Switch, Refused("the full OpenAI API is always served")),
    f("--host", Value, Own),
    f("--port", Value, Own),
    f("--uds", Value, Refused("infer listens on TCP (--host, --port)")),
    f("--uvicorn-log-level", Value, Own),
    f("--disable-uvicorn-access-log", Switch, Own),
    f("--disable-access-log-for-endpoints", Value, Own),
    f("--allow-credentials", Switch, Own),
    f("--allowed-origins", Value, Own),
    f("--allowed-methods", Value, Own),
    f("--allowed-headers", Value, Own),
    f("--api-key", Value, Own),
    f("--ssl-keyfile", Value, Own),
    f("--ssl-certfile", Value, Own),
    f("--ssl-ca-certs", Value, Own),
    f("--enable-ssl-refresh", Switch, Own),
    f("--ssl-cert-reqs", Value, Own),
    f("--ssl-ciphers", Value, Refused("TLS is rustls with its own suites (TLS 1.3, and TLS 1.2 with ECDHE and AEAD ciphers only); OpenSSL cipher strings are not read")),
    f("--root-path", Value, Own),
    f("--middleware", Value, Refused("ASGI middleware cannot be loaded")),
    f("--enable-request-id-headers", Switch, Own),
    f("--disable-fastapi-docs", Switch, Own),
    f("--h11-max-incomplete-event-size", Value, Inherent("request heads are bounded by the server's own limits (--header-read-timeout, hyper's head size)")),
    f("--h11-max-header-count", Value, Inherent("request heads are bounded by the server's own limits (--header-read-timeout, hyper's head size)")),
    f("--enable-offline-docs", Switch, Inherent("there is no docs UI")),
];
