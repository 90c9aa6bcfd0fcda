//! The loop on the engine thread: take the commands that arrived, drop the requests whose
//! stream is gone, step, send each request its output.

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::Instant;

use tokio::sync::mpsc as tmpsc;

use super::{embed_batch, Command, Compiled, EngineObserver, Event, SubmitError};
use crate::engine::EngineStats;
use crate::{Engine, Executor};

struct Loop<E: Executor> {
    engine: Engine<E>,
    streams: HashMap<String, tmpsc::UnboundedSender<Event>>,
    max_waiting: usize,
    observer: Box<dyn EngineObserver>,
}

pub(super) fn run<E: Executor>(
    engine: Engine<E>,
    max_waiting: usize,
    mut observer: Box<dyn EngineObserver>,
    rx: Receiver<Command>,
) {
    observer.started(engine.config(), &engine.stats());
    Loop {
        engine,
        streams: HashMap::new(),
        max_waiting,
        observer,
    }
    .run(rx)
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
                        return self.abort_all("the engine's handles are gone", true)
                    }
                }
            } else {
                // Idle: wake when the observer still owes something (a log line).
                match self.observer.wake_in() {
                    None => match rx.recv() {
                        Ok(c) => Some(c),
                        Err(_) => return,
                    },
                    Some(wait) => match rx.recv_timeout(wait) {
                        Ok(c) => Some(c),
                        Err(RecvTimeoutError::Timeout) => None,
                        Err(RecvTimeoutError::Disconnected) => return,
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
                            return self.abort_all("the engine is shutting down", true);
                        }
                    }
                }
                next = rx.try_recv().ok();
            }
            embed_batch::run(&mut self.engine, self.observer.as_mut(), embeds);
            self.drop_disconnected();
            if self.engine.has_unfinished() {
                self.step();
            }
            self.report_stats();
        }
    }

    fn report_stats(&mut self) {
        let now: EngineStats = self.engine.stats();
        self.observer.stats(&now, !self.engine.has_unfinished());
    }

    /// Returns false on shutdown.
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Add { requests, accepted } => {
                let result = self.admit(requests);
                let ids = result.as_ref().cloned().unwrap_or_default();
                if accepted.send(result.map(|_| ())).is_err() {
                    // The submitter went away before hearing back.
                    for id in ids {
                        self.abort(&id);
                    }
                }
            }
            Command::Abort(ids) => {
                for id in ids {
                    self.abort(&id);
                }
            }
            Command::Embed(e) => {
                embed_batch::run(&mut self.engine, self.observer.as_mut(), vec![e])
            }
            Command::Stats(reply) => {
                let _ = reply.send(self.engine.stats());
            }
            Command::Shutdown => return false,
        }
        true
    }

    /// Adds a client request's engine requests, all or none. The waiting bound counts only
    /// requests that cannot start at the next step: a burst the batch has room for is not
    /// "waiting" (its requests are admitted within one step).
    fn admit(&mut self, requests: Vec<Compiled>) -> Result<Vec<String>, SubmitError> {
        let scheduler = self.engine.scheduler();
        let batch = self.engine.config().scheduler.max_num_seqs;
        let free = batch.saturating_sub(scheduler.num_running());
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
        for Compiled {
            request,
            grammar,
            events,
        } in requests
        {
            self.observer.admitted(&request);
            let added_now = self.engine.add_request_compiled(
                request.id.clone(),
                request.prompt,
                request.params,
                grammar,
            );
            if let Err(e) = added_now {
                for id in &added {
                    self.abort(id);
                }
                return Err(e.into());
            }
            self.streams.insert(request.id.clone(), events);
            added.push(request.id);
        }
        Ok(added)
    }

    fn abort(&mut self, id: &str) {
        if self.engine.abort_request(id) {
            self.observer.aborted(id);
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
            tracing::debug!(request = %id, "stream dropped: aborting");
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
                    self.observer.output(&out, now);
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

    fn abort_all(&mut self, why: &str, shutdown: bool) {
        for (id, tx) in std::mem::take(&mut self.streams) {
            let _ = tx.send(Event::Failed {
                message: why.to_string(),
                shutdown,
            });
            if self.engine.abort_request(&id) {
                self.observer.aborted(&id);
            }
        }
        self.report_stats();
    }
}
