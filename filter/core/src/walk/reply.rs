//! What the filter tells the client: its own replies (refusals, cached
//! answers) and the headers it adds to every answer, whoever gives it.

use crate::budget;
use crate::cache::CacheStatus;
use crate::config::Config;
use crate::metrics::internal_error;
use crate::summary::End;
use crate::{ab, routing, shaping, trace_context};

use super::end::Served;
use super::{Call, Env, Host, Step};

impl Call {
    /// Answers the call with the filter's own reply (a refusal).
    pub(super) fn reply_locally(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        r: budget::LocalReply,
    ) -> Step {
        let r = r.in_dialect(self.request.dialect);
        let headers: Vec<(&str, &str)> = r.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let cache = self.cache.status;
        if self.send_local_reply(env, host, r.status, &headers, &r.body, cache) {
            Step::Pause
        } else {
            Step::Continue
        }
    }

    /// Sends a local reply with the filter's own headers, telling the
    /// client `cache` as the cache's result; the call is then answered with
    /// it. False (counted) when the host refused it, and the call's cache
    /// result stays what it was.
    pub(super) fn send_local_reply(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        status: u32,
        headers: &[(&str, &str)],
        body: &[u8],
        cache: Option<CacheStatus>,
    ) -> bool {
        if let Some(held) = self
            .progress
            .held()
            .filter(|_| (200..300).contains(&status))
        {
            // An answer waits for the guardrail service's verdict, as the
            // upstream's would.
            let headers = headers
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect();
            held.reply = Some((status, headers, body.to_vec(), cache));
            return true;
        }
        let told = self.client_headers(env.config, None, cache);
        let mut all = headers.to_vec();
        all.extend(told.iter().map(|(k, v)| (*k, v.as_str())));
        let local = u16::try_from(status).unwrap_or(500);
        self.drop_verdict(env);
        let served = Served {
            cache,
            ..self.served()
        };
        self.write_record_of(env, host, Some(End::Local(local)), served);
        if !host.send_local_reply(status, &all, body) {
            internal_error(env.metrics, "local_reply");
            return false;
        }
        self.cache.status = cache;
        self.progress.answered(status);
        true
    }

    /// The headers the filter tells the client about the call, whoever
    /// answers it: the trace id, the cluster that served it (`served_by`:
    /// `None` when the filter answered itself), the cache's result
    /// (`cache`), what degrade and shaping did, the A/B group.
    pub(super) fn client_headers(
        &self,
        config: &Config,
        served_by: Option<&str>,
        cache: Option<CacheStatus>,
    ) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(t) = &self.decided.trace_id {
            out.push((trace_context::TRACE_ID_HEADER, t.clone()));
        }
        if let Some(c) = served_by {
            out.push((routing::CLUSTER_RESPONSE_HEADER, c.to_string()));
        }
        // A backend declared as a provider: which one answered, and its
        // name of the model.
        let declared = served_by.and_then(|c| self.provider_of(config, c));
        if let Some((provider, _)) = declared {
            out.push((routing::PROVIDER_HEADER, provider.to_string()));
        }
        if let Some(x_cache) = cache {
            out.push((crate::cache::X_CACHE, x_cache.header().to_string()));
        }
        if let Some(level) = self.decided.degraded {
            out.push((crate::degrade::HEADER, level.to_string()));
        }
        if let Some(s) = self.decided.shaped.header() {
            out.push((shaping::HEADER, s));
        }
        if let Some(g) = self.group(config) {
            out.push((ab::GROUP_HEADER, g.name.clone()));
        }
        if let Some((_, model)) = declared {
            out.push((routing::fallback::MODEL_HEADER, model.to_string()));
        } else if let (Some(_), Some(model)) = (&self.dispatch.fallback, &self.dispatch.model) {
            out.push((routing::fallback::MODEL_HEADER, model.clone()));
        }
        if self.decided.downgraded {
            out.push((crate::degrade::DOWNGRADE_HEADER, "cache".to_string()));
        }
        self.limit_headers(&mut out);
        out
    }

    /// The provider of the call's model's backend on `cluster`, with its
    /// name of the model, when it was declared as one.
    fn provider_of<'c>(
        &'c self,
        config: &'c Config,
        cluster: &str,
    ) -> Option<(&'static str, &'c str)> {
        let model = self.dispatch.model.as_deref()?;
        let backends = self.routing_config(config).backends(model)?;
        let b = backends.iter().find(|b| b.cluster == cluster)?;
        Some((b.provider?, b.model.as_deref().unwrap_or(model)))
    }
}
