//! The engine on its own thread. HTTP handlers talk to it over channels: a command channel in,
//! one event channel per request out. Every loop iteration drops the requests whose receiver is
//! gone (the client disconnected), so their blocks are freed within one engine step.

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use infer_core::{
    EmbedParams, Engine, EngineStats, Executor, GrammarCompiler, GrammarMatcher, InferError,
    RequestOutput, SamplingParams,
};
use tokio::sync::{mpsc as tmpsc, oneshot};

use crate::metrics::Metrics;

/// What a request's stream receives.
#[derive(Debug)]
pub enum Event {
    Output(RequestOutput),
    /// The request is over without its output: the engine failed (`shutdown: false`), or the
    /// server's shutdown aborted it.
    Failed {
        message: String,
        shutdown: bool,
    },
}

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

/// One engine request of a client request.
pub struct NewRequest {
    pub id: String,
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
}

/// A request on its way to the engine thread, its constraint compiled.
struct Compiled {
    request: NewRequest,
    grammar: Option<GrammarMatcher>,
}

enum Command {
    /// A client request's engine requests, admitted all together or not at all.
    Add {
        requests: Vec<(Compiled, tmpsc::UnboundedSender<Event>)>,
        accepted: oneshot::Sender<Result<(), SubmitError>>,
    },
    /// A pooling server's request: its inputs' embeddings.
    Embed(crate::embed_batch::Embed),
    Stats(oneshot::Sender<EngineStats>),
    /// Finish nothing more: abort what is in flight and exit.
    Shutdown,
}

/// A cloneable handle on the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    commands: Sender<Command>,
    thread: Arc<std::sync::Mutex<Option<JoinHandle<()>>>>,
    /// Compiles structured-output constraints on the blocking pool, off the engine thread
    /// (a grammar of 50,000 choices takes seconds; the running streams must not wait for it).
    grammars: Option<Arc<GrammarCompiler>>,
}

/// How the engine thread runs and what it logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopOptions {
    /// Waiting requests beyond which new ones are refused (0: no limit).
    pub max_waiting: usize,
    /// vLLM's periodic engine line (`stats_log`), every this long; `None`:
    /// `--disable-log-stats`.
    pub log_stats: Option<std::time::Duration>,
    /// vLLM's `--enable-log-requests`: each admitted request's id, prompt length, parameters
    /// and its prompt ids cut to this many (`--max-log-len`); `None`: not logged.
    pub log_requests: Option<usize>,
}

impl LoopOptions {
    /// No logs; `max_waiting` as given.
    pub fn quiet(max_waiting: usize) -> Self {
        LoopOptions {
            max_waiting,
            log_stats: None,
            log_requests: None,
        }
    }
}

struct Loop<E: Executor> {
    engine: Engine<E>,
    streams: HashMap<String, tmpsc::UnboundedSender<Event>>,
    max_waiting: usize,
    log_requests: Option<usize>,
    stats_log: Option<crate::stats_log::StatsLog>,
    metrics: Arc<Metrics>,
    /// The stats behind the metrics' last update (counters grow by the difference).
    last_stats: EngineStats,
    /// When each running request last produced tokens (for the inter-token latency).
    last_output: HashMap<String, Instant>,
}

impl EngineHandle {
    /// Builds the engine on its own thread (so neither it nor its backend has to be `Send`)
    /// and runs it there; `build` also returns what the caller needs back (the tokenizer).
    /// `max_waiting` bounds the waiting queue (0 = unbounded); `metrics` follow the engine.
    pub fn start<E, T>(
        build: impl FnOnce() -> Result<(Engine<E>, T), String> + Send + 'static,
        options: LoopOptions,
        metrics: Arc<Metrics>,
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
                    Ok((mut engine, extra)) => {
                        // Without a tokenizer there are no constraints to compile.
                        let grammars = engine.grammar_compiler().ok();
                        let _ = ready_tx.send(Ok((extra, grammars)));
                        engine
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                metrics.record_cache_config(engine.config());
                let last_stats = engine.stats();
                let stats_log = options
                    .log_stats
                    .map(|every| crate::stats_log::StatsLog::new(every, &last_stats));
                Loop {
                    engine,
                    streams: HashMap::new(),
                    max_waiting: options.max_waiting,
                    log_requests: options.log_requests,
                    stats_log,
                    metrics,
                    last_stats,
                    last_output: HashMap::new(),
                }
                .run(rx)
            })
            .map_err(|e| format!("spawning the engine thread: {e}"))?;
        let (extra, grammars) = ready
            .recv()
            .map_err(|_| "the engine thread died while starting".to_string())??;
        let handle = EngineHandle {
            commands,
            thread: Arc::new(std::sync::Mutex::new(Some(thread))),
            grammars,
        };
        Ok((handle, extra))
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
        let (mut with_events, mut receivers) = (Vec::new(), Vec::new());
        for request in requests {
            let grammar = self.compile(&request.params).await?;
            let (tx, rx) = tmpsc::unbounded_channel();
            with_events.push((Compiled { request, grammar }, tx));
            receivers.push(rx);
        }
        let (accepted, reply) = oneshot::channel();
        let cmd = Command::Add {
            requests: with_events,
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

    /// The embeddings of `inputs` (a pooling engine's work); requests that arrive together
    /// with the same settings are computed as one batch.
    pub async fn embed(
        &self,
        inputs: Vec<Vec<u32>>,
        params: EmbedParams,
    ) -> Result<Vec<Vec<f32>>, SubmitError> {
        let (reply, rx) = oneshot::channel();
        let cmd = Command::Embed(crate::embed_batch::Embed {
            inputs,
            params,
            reply,
            arrival: std::time::Instant::now(),
        });
        self.commands.send(cmd).map_err(|_| SubmitError::Stopped)?;
        Ok(rx.await.map_err(|_| SubmitError::Stopped)??)
    }

    pub async fn stats(&self) -> Option<EngineStats> {
        let (tx, rx) = oneshot::channel();
        self.commands.send(Command::Stats(tx)).ok()?;
        rx.await.ok()
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

impl<E: Executor> Loop<E> {
    fn run(mut self, rx: Receiver<Command>) {
        loop {
            // Block while idle; otherwise take what arrived and step.
            let first = if self.engine.has_unfinished() {
                match rx.try_recv() {
                    Ok(c) => Some(c),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => {
                        return self.abort_all("the server stopped", true)
                    }
                }
            } else {
                // Idle: wake for the engine line still owed for the last work, if any.
                let due = self
                    .stats_log
                    .as_ref()
                    .and_then(|l| l.due_in(&self.last_stats));
                match due {
                    None => match rx.recv() {
                        Ok(c) => Some(c),
                        Err(_) => return,
                    },
                    Some(wait) => match rx.recv_timeout(wait) {
                        Ok(c) => Some(c),
                        Err(mpsc::RecvTimeoutError::Timeout) => None,
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    },
                }
            };
            let mut next = first;
            let mut embeds = Vec::new();
            while let Some(cmd) = next {
                match cmd {
                    Command::Embed(e) => embeds.push(e),
                    cmd => {
                        if !self.handle(cmd) {
                            return self.abort_all("the server is shutting down", true);
                        }
                    }
                }
                next = rx.try_recv().ok();
            }
            crate::embed_batch::run(&mut self.engine, &self.metrics, embeds);
            self.drop_disconnected();
            if self.engine.has_unfinished() {
                self.step();
            }
            self.update_metrics();
        }
    }

    fn update_metrics(&mut self) {
        let now = self.engine.stats();
        if let Some(log) = &mut self.stats_log {
            log.tick(&now, !self.engine.has_unfinished());
        }
        self.metrics.record_engine(&now, &self.last_stats);
        self.last_stats = now;
    }

    /// Returns false on shutdown.
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Add { requests, accepted } => {
                let result = self.admit(requests);
                let ids = result.as_ref().cloned().unwrap_or_default();
                if accepted.send(result.map(|_| ())).is_err() {
                    // The handler went away before hearing back.
                    for id in ids {
                        self.abort(&id);
                    }
                }
                true
            }
            Command::Embed(e) => {
                crate::embed_batch::run(&mut self.engine, &self.metrics, vec![e]);
                true
            }
            Command::Stats(reply) => {
                let _ = reply.send(self.engine.stats());
                true
            }
            Command::Shutdown => false,
        }
    }

    /// Adds a client request's engine requests, all or none. The waiting bound counts only
    /// requests that cannot start at the next step: a burst the batch has room for is not
    /// "waiting" (its requests are admitted within one step).
    fn admit(
        &mut self,
        requests: Vec<(Compiled, tmpsc::UnboundedSender<Event>)>,
    ) -> Result<Vec<String>, SubmitError> {
        let scheduler = self.engine.scheduler();
        let free = self
            .engine
            .config()
            .scheduler
            .max_num_seqs
            .saturating_sub(scheduler.num_running());
        let batch = self.engine.config().scheduler.max_num_seqs;
        if self.max_waiting > 0 && requests.len() > batch + self.max_waiting {
            return Err(SubmitError::TooManyPrompts {
                requests: requests.len(),
                limit: batch + self.max_waiting,
            });
        }
        let waiting = scheduler.num_waiting() + requests.len();
        let beyond = waiting.saturating_sub(free);
        if self.max_waiting > 0 && beyond > self.max_waiting {
            return Err(SubmitError::Busy {
                waiting: beyond,
                limit: self.max_waiting,
            });
        }
        let mut added: Vec<String> = Vec::with_capacity(requests.len());
        for (
            Compiled {
                request: r,
                grammar,
            },
            events,
        ) in requests
        {
            if let Some(max) = self.log_requests {
                let shown = &r.prompt[..r.prompt.len().min(max)];
                tracing::info!(
                    target: "infer::requests",
                    request_id = %r.id,
                    prompt_tokens = r.prompt.len(),
                    params = ?r.params,
                    prompt_token_ids = ?shown,
                    "received request"
                );
            }
            let added_now =
                self.engine
                    .add_request_compiled(r.id.clone(), r.prompt, r.params, grammar);
            if let Err(e) = added_now {
                for id in &added {
                    self.abort(id);
                }
                return Err(e.into());
            }
            self.streams.insert(r.id.clone(), events);
            added.push(r.id);
        }
        Ok(added)
    }

    fn abort(&mut self, id: &str) {
        self.last_output.remove(id);
        if self.engine.abort_request(id) {
            self.metrics.record_aborted();
        }
        self.streams.remove(id);
    }

    fn drop_disconnected(&mut self) {
        let gone: Vec<String> = self
            .streams
            .iter()
            .filter(|(_, tx)| tx.is_closed())
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            tracing::debug!(request = %id, "client disconnected: aborting");
            self.abort(&id);
        }
    }

    fn step(&mut self) {
        match self.engine.step() {
            Ok(outputs) => {
                let now = Instant::now();
                for out in outputs {
                    let id = out.request_id.clone();
                    let finished = out.finished();
                    self.record_if_finished(&out);
                    if let Some(prev) = self.last_output.insert(id.clone(), now) {
                        self.metrics.record_inter_token((now - prev).as_secs_f64());
                    }
                    if finished {
                        self.last_output.remove(&id);
                    }
                    let delivered = self
                        .streams
                        .get(&id)
                        .is_some_and(|tx| tx.send(Event::Output(out)).is_ok());
                    if finished {
                        self.streams.remove(&id);
                    } else if !delivered {
                        self.abort(&id);
                    }
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "engine step failed");
                self.abort_all(&format!("engine error: {e}"), false);
            }
        }
    }

    fn record_if_finished(&self, out: &RequestOutput) {
        let Some(outputs) = &out.outputs else { return };
        let longest = outputs.iter().map(|o| o.token_ids.len()).max().unwrap_or(0);
        // The best output's reason stands for the request, as in its response.
        if let Some(first) = outputs.first() {
            self.metrics
                .record_finished(&out.metrics, first.finish_reason, longest);
        }
    }

    fn abort_all(&mut self, why: &str, shutdown: bool) {
        self.last_output.clear();
        for (id, tx) in std::mem::take(&mut self.streams) {
            let _ = tx.send(Event::Failed {
                message: why.to_string(),
                shutdown,
            });
            if self.engine.abort_request(&id) {
                self.metrics.record_aborted();
            }
        }
        self.update_metrics();
    }
}
