//! Callouts in flight and what should happen to each one's answer. Every
//! callout a call or one of the worker's background jobs sends is registered
//! here under the host's token with its continuation, so the host looks a
//! token up once and hands the answer over: a new kind of wait (a guardrail's
//! verdict, a credential refresh) is one more variant, not one more map and
//! branch in the plugin.

use std::collections::BTreeMap;

mod jobs;
#[cfg(test)]
mod tests;

pub use jobs::{Callout, Job, JobWait, Jobs, Outcome, SpanExport};

use crate::walk::CallWait;

/// What should happen to a callout's answer. `C` is the host's handle on
/// the call that sent it (the core never sees the host's contexts).
#[derive(Debug)]
pub enum Continuation<C> {
    /// A call's callout: handed to the call, which goes on by `then`.
    Call {
        /// The call.
        call: C,
        /// What it does with the answer.
        then: CallWait,
    },
    /// A background job's callout.
    Job(JobWait),
}

/// How much of an answer its continuation reads: every host call left out
/// is time off the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reads {
    /// Every header (else `:status` alone).
    pub headers: bool,
    /// The body, when no longer than this (a longer one is left unread and
    /// taken as empty); 0 reads none.
    pub body_up_to: usize,
}

impl<C> Continuation<C> {
    /// How much of its answer this continuation reads.
    pub fn reads(&self) -> Reads {
        match self {
            // A call relays or parses the whole answer, as the host bounds it.
            Self::Call { .. } => Reads {
                headers: true,
                body_up_to: usize::MAX,
            },
            Self::Job(job) => Reads {
                headers: false,
                body_up_to: job.reads_body_up_to(),
            },
        }
    }
}

/// Callouts in flight, past their timeout, before the registry gives up on
/// the host's answer: the host answers a timed-out callout itself (without
/// headers), so this only catches an answer that never comes.
pub const GRACE_MS: u64 = 5_000;

/// The most callouts one worker keeps in flight: a worker past it sends
/// them still, but their answers are not waited for (counted by the host as
/// an internal error).
pub const MAX_PENDING: usize = 16_384;

/// A registered callout.
#[derive(Debug)]
struct Pending<C> {
    then: Continuation<C>,
    /// When the host's answer is given up on, ms.
    give_up_ms: u64,
}

/// The callouts in flight of one worker, by token.
#[derive(Debug)]
pub struct Waits<C> {
    pending: BTreeMap<u32, Pending<C>>,
}

impl<C> Default for Waits<C> {
    fn default() -> Self {
        Self {
            pending: BTreeMap::new(),
        }
    }
}

/// Why [`Waits::register`] kept nothing: the continuation, handed back.
#[derive(Debug)]
pub struct Full<C>(pub Continuation<C>);

impl<C> Waits<C> {
    /// Registers `then` for the answer of callout `token`, sent at `now_ms`
    /// with a timeout of `timeout_ms`. A token the host hands out again
    /// replaces the entry it had (the host never does while it is in flight).
    pub fn register(
        &mut self,
        token: u32,
        then: Continuation<C>,
        now_ms: u64,
        timeout_ms: u64,
    ) -> Result<(), Full<C>> {
        if self.pending.len() >= MAX_PENDING && !self.pending.contains_key(&token) {
            return Err(Full(then));
        }
        let give_up_ms = now_ms.saturating_add(timeout_ms).saturating_add(GRACE_MS);
        self.pending.insert(token, Pending { then, give_up_ms });
        Ok(())
    }

    /// What should happen to the answer of callout `token`, once: `None` for
    /// a token not registered, or no longer (answered, given up on, or of a
    /// call that ended).
    pub fn take(&mut self, token: u32) -> Option<Continuation<C>> {
        self.pending.remove(&token).map(|p| p.then)
    }

    /// The callouts whose answer is given up on at `now_ms`, removed: their
    /// continuations take them as unanswered.
    pub fn expired(&mut self, now_ms: u64) -> Vec<Continuation<C>> {
        let gone: Vec<u32> = self
            .pending
            .iter()
            .filter(|(_, p)| p.give_up_ms <= now_ms)
            .map(|(token, _)| *token)
            .collect();
        gone.into_iter()
            .filter_map(|token| self.take(token))
            .collect()
    }

    /// Forgets the callouts of the calls `ended` says ended: their answers
    /// find no continuation. How many it forgot.
    pub fn forget_calls(&mut self, ended: impl Fn(&C) -> bool) -> usize {
        let before = self.pending.len();
        self.pending.retain(|_, p| match &p.then {
            Continuation::Call { call, .. } => !ended(call),
            Continuation::Job(_) => true,
        });
        before.saturating_sub(self.pending.len())
    }

    /// Callouts in flight.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// No callout in flight.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}
