//! The A/B step of the walk: once the body is read, the call is put in its
//! user's group, which goes upstream (`x-user-group`, a baggage member), back
//! to the client, onto the request metrics, and picks the group's overrides
//! of routing, shaping, the cache and the degrade actions.

use crate::ab::{self, Group};
use crate::config::Config;
use crate::degrade::DegradeConfig;
use crate::routing::config::RoutingConfig;
use crate::shaping::ShapingConfig;

use std::ops::ControlFlow;

use super::{merge_baggage, set_request, Call, Env, Flow, HeldBody, Host};

impl Call {
    /// Puts the call in its user's group (A/B on): the user is the
    /// `ab.user_header` header, else the body's `user`. Always goes on.
    pub(super) fn join_group(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        body: Option<HeldBody>,
    ) -> Flow {
        self.put_in_group(env, host, body.as_ref());
        ControlFlow::Continue(body)
    }

    fn put_in_group(&mut self, env: &mut Env<'_>, host: &mut dyn Host, body: Option<&HeldBody>) {
        let cfg = &env.config.ab;
        if cfg.groups.is_empty() {
            return;
        }
        let key = host
            .request_header(&cfg.user_header)
            .filter(|k| !k.is_empty())
            .or_else(|| body.and(self.request.view.user.clone()));
        let Some(index) = cfg.assign(key.as_deref()) else {
            return;
        };
        self.decided.group = Some(index);
        let Some(group) = self.group(env.config) else {
            return;
        };
        let name = group.name.clone();
        let cache = group.cache;
        set_request(env, host, ab::GROUP_HEADER, Some(&name));
        merge_baggage(env, host, ab::BAGGAGE_KEY, &name);
        if cache == Some(false) {
            self.cache.status = None;
            self.cache.group_off = true;
        }
    }

    /// The call's group, once it joined one.
    pub(super) fn group<'c>(&self, config: &'c Config) -> Option<&'c Group> {
        config.ab.groups.get(self.decided.group?)
    }

    /// The routing of this call: its group's, or the top-level one.
    pub(super) fn routing_config<'c>(&self, config: &'c Config) -> &'c RoutingConfig {
        self.group(config)
            .and_then(|g| g.routing.as_ref())
            .unwrap_or(&config.routing)
    }

    /// The shaping of this call: its group's, or the top-level one.
    pub(super) fn shaping_config<'c>(&self, config: &'c Config) -> &'c ShapingConfig {
        self.group(config)
            .and_then(|g| g.shaping.as_ref())
            .unwrap_or(&config.shaping)
    }

    /// The degrade actions of this call: its group's, or the top-level
    /// ones. Its level is never read here: it is the model's, for every group.
    pub(super) fn degrade_config<'c>(&self, config: &'c Config) -> &'c DegradeConfig {
        self.group(config)
            .and_then(|g| g.degrade.as_ref())
            .unwrap_or(&config.degrade)
    }
}
