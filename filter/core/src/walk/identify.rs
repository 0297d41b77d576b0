//! The identify step of the walk (see [`crate::identity`]): on request
//! headers, before any step that spends (limits, the cache, the trip
//! upstream), the call learns who its caller is, or is refused with a 401
//! in its API's shape. A virtual key is taken off the call here, so that
//! nothing after this step, the upstream included, ever reads it.

use crate::budget::reply;
use crate::dialect::answer::ReplyKind;
use crate::dialect::gemini::without_query_key;
use crate::identity::{self, Caller};
use crate::metrics::{self as names};

use super::{set_request, Call, Env, Host, Step};

impl Call {
    /// Finds the call's tenant; `Some(step)` when the call was refused.
    pub(super) fn identify(&mut self, env: &mut Env<'_>, host: &mut dyn Host) -> Option<Step> {
        let cfg = &env.config.tenant;
        let dialect = self.request.dialect;
        let found = {
            let reader: &dyn Host = host;
            let header = |n: &str| reader.request_header(n);
            let property = |p: &[&str]| reader.property(p);
            let caller = Caller {
                header: &header,
                property: &property,
            };
            identity::resolve(cfg, dialect, &self.request.path, &caller)
        };
        match found {
            Ok(id) => {
                for name in &id.presented.headers {
                    set_request(env, host, name, None);
                }
                if id.presented.query {
                    if let Some(path) = without_query_key(&self.request.path) {
                        set_request(env, host, ":path", Some(&path));
                        self.request.path = path;
                    }
                }
                self.request.tenant = id.tenant;
                None
            }
            Err(why) => {
                let labels = [("reason", why.as_str()), ("api", dialect.api())];
                env.metrics
                    .counter(&names::name(names::IDENTITY_REFUSED, &labels), 1);
                let r =
                    reply::with_message(ReplyKind::Unauthenticated, why.message(cfg.from), None);
                Some(self.reply_locally(env, host, r))
            }
        }
    }
}
