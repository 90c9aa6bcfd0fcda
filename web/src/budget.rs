//! What bounds a request's memory before the engine has it: the bytes of request bodies held at
//! once, and how many requests are parsed, rendered and tokenized at once (each costs many
//! times its body while it is). Past a burst of big requests, the allocator's free memory goes
//! back to the system.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use warp::http::StatusCode;

use crate::errors::ApiError;

/// Bodies past this size are charged to the shared byte budget (smaller ones are bounded by the
/// connection cap alone).
pub const CHARGED_BODY_BYTES: usize = 64 << 10;
/// The byte budget's unit.
const UNIT: usize = 1 << 20;
/// MiB of large bodies held at once, by default (32 of the largest, 8 MiB, bodies).
pub const DEFAULT_BODY_MIB: usize = 256;
/// How long a request waits for a preparation slot, by default.
pub const DEFAULT_PREPARE_WAIT: Duration = Duration::from_secs(30);

/// Requests prepared at once by default: one per core (tokenizing is CPU-bound; more at once
/// only holds more memory).
pub fn default_preparing() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// Limits on work in flight before the engine, shared by every handler.
pub struct Budget {
    /// MiB of charged request bodies held at once.
    body_units: Arc<Semaphore>,
    body_total: usize,
    /// Requests being parsed, rendered and tokenized at once.
    preparing: Arc<Semaphore>,
    preparing_total: usize,
    /// How long a request waits for a preparation slot before it is turned away (503).
    wait: Duration,
    /// A big request was prepared since the allocator last gave memory back.
    big_since_trim: AtomicBool,
}

/// A body's share of the byte budget; given back when dropped.
pub struct BodyCharge(Option<OwnedSemaphorePermit>);

/// A preparation slot; gives memory back on drop when it was the last of a burst.
pub struct Preparing {
    _permit: OwnedSemaphorePermit,
    budget: Arc<Budget>,
    big: bool,
}

impl Budget {
    /// `body_mib`: MiB of big bodies held at once; `preparing`: requests prepared at once.
    pub fn new(body_mib: usize, preparing: usize, wait: Duration) -> Arc<Self> {
        let (body_mib, preparing) = (body_mib.max(1), preparing.max(1));
        Arc::new(Budget {
            body_units: Arc::new(Semaphore::new(body_mib)),
            body_total: body_mib,
            preparing: Arc::new(Semaphore::new(preparing)),
            preparing_total: preparing,
            wait,
            big_since_trim: AtomicBool::new(false),
        })
    }

    /// Charges a body that has grown to `len` bytes (`charge` holds what it has so far). Past
    /// the budget the request is refused at once (503: the condition passes as others finish).
    pub fn charge_body(&self, charge: &mut BodyCharge, len: usize) -> Result<(), ApiError> {
        if len <= CHARGED_BODY_BYTES {
            return Ok(());
        }
        let units = len.div_ceil(UNIT).min(self.body_total);
        let held = charge.0.as_ref().map_or(0, |p| p.num_permits());
        if units <= held {
            return Ok(());
        }
        // `units` is at most the budget's permits, which a semaphore counts in u32.
        let more = u32::try_from(units - held).unwrap_or(u32::MAX);
        match self.body_units.clone().try_acquire_many_owned(more) {
            Ok(p) => {
                match &mut charge.0 {
                    Some(held) => held.merge(p),
                    None => charge.0 = Some(p),
                }
                Ok(())
            }
            Err(_) => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the server is holding {} MiB of large request bodies, its limit; retry shortly",
                    self.body_total
                ),
            )),
        }
    }

    /// Waits for a preparation slot (503 after the wait). `big`: the request's body was large
    /// (its preparation may leave much free memory behind).
    pub async fn preparing(self: &Arc<Self>, big: bool) -> Result<Preparing, ApiError> {
        let acquire = self.preparing.clone().acquire_owned();
        match tokio::time::timeout(self.wait, acquire).await {
            Ok(Ok(permit)) => Ok(Preparing {
                _permit: permit,
                budget: self.clone(),
                big,
            }),
            _ => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "{} requests are being tokenized and more wait; retry shortly",
                    self.preparing_total
                ),
            )),
        }
    }
}

impl BodyCharge {
    pub fn none() -> Self {
        BodyCharge(None)
    }
}

impl Drop for Preparing {
    fn drop(&mut self) {
        let budget = &self.budget;
        if self.big {
            budget.big_since_trim.store(true, Ordering::Relaxed);
        }
        // This slot is still held: it is the last one when all the others are free.
        let last = budget.preparing.available_permits() + 1 == budget.preparing_total;
        if last && budget.big_since_trim.swap(false, Ordering::Relaxed) {
            give_back_free_memory();
        }
    }
}

/// Returns the allocator's free pages to the system. glibc keeps what a burst freed in its
/// arenas (gigabytes after a few dozen huge bodies) until told to trim.
fn give_back_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only walks the allocator's own free lists; any thread may call it.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}
