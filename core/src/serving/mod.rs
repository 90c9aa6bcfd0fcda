//! The asynchronous engine (vLLM's `AsyncLLMEngine`): the engine on its own thread, a command
//! channel in and one event channel per request out. Every front end that serves requests
//! concurrently drives this one implementation: the HTTP server and the Python package.
//!
//! A request's stream is its lifetime: dropping the receiver aborts the request within one
//! engine step, so a disconnected client or a cancelled Python task frees its KV blocks.
//! Several engine requests of one client request (a completion's prompts) are admitted all
//! together or not at all. What the front end wants to know about the work (metrics, logs)
//! it learns through an [`EngineObserver`].

mod embed_batch;
mod engine_thread;

use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc as tmpsc, oneshot};

use crate::engine::{EngineConfig, EngineStats, Executor, RequestOutput};
use crate::{EmbedParams, Engine, GrammarCompiler, GrammarMatcher, InferError, SamplingParams};

pub use embed_batch::Embed;

/// What a request's stream receives.
#[derive(Debug)]
pub enum Event {
    Output(RequestOutput),
    /// The request is over without its output: the engine failed (`shutdown: false`), or a
    /// shutdown aborted it.
    Failed {
        message: String,
        shutdown: bool,
    },
}

/// A request's events, in order; the last is a finished output or `Failed`.
pub type Events = tmpsc::UnboundedReceiver<Event>;

/// Why a request was not queued.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("{0}")]
    Invalid(#[from] InferError),
    #[error(
        "the server is busy: {waiting} requests would wait beyond what the batch takes (--max-waiting {limit}); retry later"
    )]
    Busy { waiting: usize, limit: usize },
    /// More prompts than the batch and the waiting queue hold together: it would never be
    /// admitted, so retrying is pointless.
    #[error(
        "the request has {requests} prompts but at most {limit} can be queued at once (--max-num-seqs + --max-waiting); send fewer per request"
    )]
    TooManyPrompts { requests: usize, limit: usize },
    #[error("the engine has stopped")]
    Stopped,
}

/// One engine request.
#[derive(Debug, Clone)]
pub struct NewRequest {
    pub id: String,
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
}

/// What a front end learns of the engine thread's work; every method has a no-op default.
/// Called on the engine thread, between steps: keep them cheap.
pub trait EngineObserver: Send {
    /// Once, when the engine is built.
    fn started(&mut self, _config: &EngineConfig, _stats: &EngineStats) {}
    /// A request was queued.
    fn admitted(&mut self, _request: &NewRequest) {}
    /// A step's output for one request (its last when `output.finished()`).
    fn output(&mut self, _output: &RequestOutput, _at: Instant) {}
    /// A request was aborted before it finished (`id`).
    fn aborted(&mut self, _id: &str) {}
    /// An embedding request was answered.
    fn embedded(&mut self, _latency: Duration, _prompt_tokens: usize) {}
    /// After each loop iteration: the engine's counters; `idle` when nothing is left to run.
    fn stats(&mut self, _stats: &EngineStats, _idle: bool) {}
    /// While idle: wake the loop after this long (for a log line still owed), or never.
    fn wake_in(&self) -> Option<Duration> {
        None
    }
}

/// An observer that wants nothing.
pub struct Unobserved;
impl EngineObserver for Unobserved {}

/// A request's stream with its constraint compiled, on its way to the engine thread.
struct Compiled {
    request: NewRequest,
    grammar: Option<GrammarMatcher>,
    events: tmpsc::UnboundedSender<Event>,
}

enum Command {
    /// A client request's engine requests, admitted all together or not at all.
    Add {
        requests: Vec<Compiled>,
        accepted: oneshot::Sender<Result<(), SubmitError>>,
    },
    /// Abort these requests (their streams end with nothing more).
    Abort(Vec<String>),
    /// Inputs to embed (a pooling engine's work).
    Embed(Embed),
    Stats(oneshot::Sender<EngineStats>),
    /// Finish nothing more: abort what is in flight and exit.
    Shutdown,
}

/// A cloneable handle on the engine thread.
#[derive(Clone)]
pub struct AsyncEngine {
    commands: Sender<Command>,
    thread: Arc<std::sync::Mutex<Option<JoinHandle<()>>>>,
    /// Compiles structured-output constraints on the blocking pool, off the engine thread
    /// (a grammar of 50,000 choices takes seconds; the running streams must not wait for it).
    grammars: Option<Arc<GrammarCompiler>>,
    config: EngineConfig,
}

impl AsyncEngine {
    /// Builds the engine on its own thread (so neither it nor its backend has to be `Send`)
    /// and runs it there; `build` also returns what the caller needs back (the tokenizer).
    /// Waiting requests beyond `max_waiting` that the batch cannot take are refused
    /// (0: unbounded).
    pub fn start<E, T>(
        build: impl FnOnce() -> Result<(Engine<E>, T), String> + Send + 'static,
        max_waiting: usize,
        observer: Box<dyn EngineObserver>,
    ) -> Result<(Self, T), String>
    where
        E: Executor + 'static,
        T: Send + 'static,
    {
        let (commands, rx) = mpsc::channel();
        let (ready_tx, ready) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || {
                let engine = match build() {
                    Ok((engine, extra)) => engine_and_reply(engine, extra, &ready_tx),
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                engine_thread::run(engine, max_waiting, observer, rx)
            })
            .map_err(|e| format!("spawning the engine thread: {e}"))?;
        let (extra, grammars, config) = ready
            .recv()
            .map_err(|_| "the engine thread died while starting".to_string())??;
        let handle = AsyncEngine {
            commands,
            thread: Arc::new(std::sync::Mutex::new(Some(thread))),
            grammars,
            config,
        };
        Ok((handle, extra))
    }

    /// The engine's configuration (context, KV pool, scheduler limits).
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Queues a request; its outputs arrive on the returned channel. Fails at once on bad
    /// parameters or a full waiting queue.
    pub async fn submit(
        &self,
        id: String,
        prompt: Vec<u32>,
        params: SamplingParams,
    ) -> Result<Events, SubmitError> {
        let mut events = self
            .submit_all(vec![NewRequest { id, prompt, params }])
            .await?;
        events.pop().ok_or(SubmitError::Stopped)
    }

    /// Queues several requests as one (a completion's prompts): all are admitted, or none
    /// is and the error says why, before any of them is computed.
    pub async fn submit_all(&self, requests: Vec<NewRequest>) -> Result<Vec<Events>, SubmitError> {
        let (mut compiled, mut receivers) = (Vec::new(), Vec::new());
        for request in requests {
            let grammar = self.compile(&request.params).await?;
            let (events, rx) = tmpsc::unbounded_channel();
            compiled.push(Compiled {
                request,
                grammar,
                events,
            });
            receivers.push(rx);
        }
        let (accepted, reply) = oneshot::channel();
        let cmd = Command::Add {
            requests: compiled,
            accepted,
        };
        self.commands.send(cmd).map_err(|_| SubmitError::Stopped)?;
        reply.await.map_err(|_| SubmitError::Stopped)??;
        Ok(receivers)
    }

    /// The request's structured-output constraint, compiled on the blocking pool.
    async fn compile(
        &self,
        params: &SamplingParams,
    ) -> Result<Option<GrammarMatcher>, SubmitError> {
        let (Some(spec), Some(compiler)) = (&params.structured_outputs, &self.grammars) else {
            return Ok(None);
        };
        let (spec, compiler) = (spec.clone(), compiler.clone());
        match tokio::task::spawn_blocking(move || compiler.compile(&spec)).await {
            Ok(Ok(matcher)) => Ok(Some(matcher)),
            Ok(Err(e)) => Err(SubmitError::Invalid(e)),
            // The compile task panicked: let the engine compile it and report.
            Err(_) => Ok(None),
        }
    }

    /// Aborts requests by id (unknown or finished ones are ignored); their streams close.
    /// Dropping a stream does the same.
    pub fn abort(&self, ids: Vec<String>) {
        let _ = self.commands.send(Command::Abort(ids));
    }

    /// The embeddings of `inputs` (a pooling engine's work); requests that arrive together
    /// with the same settings are computed as one batch.
    pub async fn embed(
        &self,
        inputs: Vec<Vec<u32>>,
        params: EmbedParams,
    ) -> Result<Vec<Vec<f32>>, SubmitError> {
        let (reply, rx) = oneshot::channel();
        let cmd = Command::Embed(Embed {
            inputs,
            params,
            reply,
            arrival: Instant::now(),
        });
        self.commands.send(cmd).map_err(|_| SubmitError::Stopped)?;
        Ok(rx.await.map_err(|_| SubmitError::Stopped)??)
    }

    /// The engine's counters now (`None` once it has stopped).
    pub async fn stats(&self) -> Option<EngineStats> {
        let (tx, rx) = oneshot::channel();
        self.commands.send(Command::Stats(tx)).ok()?;
        rx.await.ok()
    }

    /// Whether the engine thread is still running (it ends on shutdown or a panic).
    pub fn is_running(&self) -> bool {
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner());
        thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Aborts everything in flight and waits for the engine thread to exit.
    pub fn shutdown(&self) {
        let _ = self.commands.send(Command::Shutdown);
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

type Ready<T> = Result<(T, Option<Arc<GrammarCompiler>>, EngineConfig), String>;

/// Tells the starting thread what it needs from the built engine.
fn engine_and_reply<E: Executor, T>(
    mut engine: Engine<E>,
    extra: T,
    ready: &mpsc::Sender<Ready<T>>,
) -> Engine<E> {
    // Without a tokenizer there are no constraints to compile.
    let grammars = engine.grammar_compiler().ok();
    let _ = ready.send(Ok((extra, grammars, *engine.config())));
    engine
}
