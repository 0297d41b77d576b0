//! The A/B step in a build without A/B groups (the sidecar build: the
//! gateway tier puts each user in the same group by the same hash of the
//! same key): no call joins a group, and every call takes the top-level
//! routing, shaping and degrade actions. An `ab` section is refused at load.

use crate::ab::Group;
use crate::config::Config;
use crate::degrade::DegradeConfig;
use crate::routing::config::RoutingConfig;
use crate::shaping::ShapingConfig;

use super::{Call, Env, Flow, HeldBody, Host};

use std::ops::ControlFlow;

impl Call {
    /// Goes on: there is no group to join.
    pub(super) fn join_group(
        &mut self,
        _env: &mut Env<'_>,
        _host: &mut dyn Host,
        body: Option<HeldBody>,
    ) -> Flow {
        ControlFlow::Continue(body)
    }

    /// No call has a group.
    pub(super) fn group<'c>(&self, _config: &'c Config) -> Option<&'c Group> {
        None
    }

    /// The top-level routing.
    pub(super) fn routing_config<'c>(&self, config: &'c Config) -> &'c RoutingConfig {
        &config.routing
    }

    /// The top-level shaping.
    pub(super) fn shaping_config<'c>(&self, config: &'c Config) -> &'c ShapingConfig {
        &config.shaping
    }

    /// The top-level degrade actions.
    pub(super) fn degrade_config<'c>(&self, config: &'c Config) -> &'c DegradeConfig {
        &config.degrade
    }
}
