//! The semantic cache's steps in the walk: after an exact miss the call
//! waits for its question's embedding (a callout with its own timeout), is
//! answered from the entry of the closest earlier question of the same
//! context when it is similar enough, and otherwise goes on as a plain miss
//! whose answer, once stored, is indexed under that vector.

use crate::cache::semantic::{self, EmbedFailure, Index};
use crate::cache::{CacheStatus, Entry, Key, Lookup, Store};
use crate::host::{Metrics, StoreError};
use crate::metrics as names;
use crate::walk::CallWait;

use std::ops::ControlFlow;

use super::state::SemanticCall;
use super::{Call, CalloutAnswer, Env, Flow, HeldBody, Host, Step};

impl Call {
    /// Sends the embeddings callout of a call the exact cache missed and
    /// parks it until the answer; goes on when the call does not take part
    /// or the callout could not be sent.
    pub(super) fn ask_embedding(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        body: Option<HeldBody>,
    ) -> Flow {
        let Some(sem) = env.config.cache.semantic.as_ref() else {
            return ControlFlow::Continue(body);
        };
        let Some(body) = body else {
            return ControlFlow::Continue(None);
        };
        let query = body.tree().and_then(|tree| {
            self.with_cache_request(env, host, Some(tree), |req| {
                semantic::query(&env.config.cache, sem, req, tree)
            })
        });
        let Some(query) = query else {
            return ControlFlow::Continue(Some(body));
        };
        let callout = semantic::embeddings_request(&sem.embeddings, &query.text);
        let service = &sem.embeddings.service;
        if !self.ask_service(env, host, service, &callout, CallWait::Embedding) {
            count_failure(env.metrics, EmbedFailure::Dispatch);
            return ControlFlow::Continue(Some(body));
        }
        self.cache.semantic = Some(SemanticCall {
            context: query.context,
            sent_ms: env.now_ms,
            vector: None,
        });
        self.progress.embed(body);
        ControlFlow::Break(Step::Pause)
    }

    /// The embeddings callout answered (or timed out): a semantic hit is
    /// answered here (`Step::Pause`); otherwise the call goes on as after an
    /// exact miss (`Step::Continue` resumes the request; `Step::Pause` when
    /// it now waits for an identical call or was refused).
    pub(super) fn embedding_answered(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        answer: &CalloutAnswer,
    ) -> Step {
        let Some(body) = self.progress.stop_waiting() else {
            return Step::Pause;
        };
        if self.semantic_hit(env, host, answer) {
            return Step::Pause;
        }
        let flow = self.cache_claim(env, Some(body));
        self.then_upstream(env, host, flow)
    }

    /// Looks the question's vector up in its context and answers from the
    /// best match's entry; false when none is similar enough (or its answer
    /// left the exact cache).
    fn semantic_hit(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        answer: &CalloutAnswer,
    ) -> bool {
        let (Some(sem), Some(call)) = (
            env.config.cache.semantic.as_ref(),
            self.cache.semantic.as_mut(),
        ) else {
            return false;
        };
        env.metrics.histogram(
            names::CACHE_EMBEDDING_DURATION,
            env.now_ms.saturating_sub(call.sent_ms),
        );
        let unit = match semantic::read_embedding(answer.status, &answer.body, sem.max_dimensions) {
            Ok(unit) => unit,
            Err(e) => {
                count_failure(env.metrics, e);
                return false;
            }
        };
        let matches = Index::new(env.store, sem).lookup(&call.context, &unit, env.now_ms);
        call.vector = Some(unit);
        if let Some(best) = matches.best {
            env.metrics.histogram(
                names::CACHE_SEMANTIC_SIMILARITY,
                semantic::vector::permille(best),
            );
        }
        let store = Store::new(env.store, &env.config.cache);
        for (similarity, key) in matches.above {
            let Lookup::Hit { entry, age_s } = store.lookup(&key, env.now_ms) else {
                continue;
            };
            let shown = format!("{:.3}", similarity.clamp(0.0, 1.0));
            let extra = Some((semantic::X_CACHE_SIMILARITY, shown.as_str()));
            if self.reply_from_entry(env, host, &entry, age_s, CacheStatus::Semantic, extra) {
                return true;
            }
        }
        false
    }

    /// Adds the question's vector, when it came, to the index as pointing at
    /// the entry just stored under `key`.
    pub(super) fn index_vector(&self, env: &mut Env<'_>, key: &Key, entry: &Entry) {
        let (Some(sem), Some(call)) = (
            env.config.cache.semantic.as_ref(),
            self.cache.semantic.as_ref(),
        ) else {
            return;
        };
        let Some(unit) = call.vector.as_deref() else {
            return;
        };
        let index = Index::new(env.store, sem);
        let result = match index.insert(
            &call.context,
            key,
            unit,
            entry.stored_at_ms(),
            entry.expires_at_ms(),
        ) {
            Ok(added) => {
                if let Some(t) = added.totals {
                    t.set_gauges(env.metrics);
                }
                if added.evicted {
                    "evicted"
                } else {
                    "stored"
                }
            }
            Err(StoreError::CasMismatch) => "contended",
            Err(StoreError::Host) => "host_error",
        };
        env.metrics.counter(
            &names::name(names::CACHE_SEMANTIC_STORES, &[("result", result)]),
            1,
        );
    }
}

fn count_failure(m: &mut dyn Metrics, e: EmbedFailure) {
    m.counter(
        &names::name(names::CACHE_EMBEDDING_FAILURES, &[("reason", e.as_str())]),
        1,
    );
}
