//! The `log` backend: lines go to Envoy's log through the checked call, so a
//! host that refuses one loses the line instead of trapping the VM (the SDK's
//! logger unwraps).

use proxy_wasm::types::LogLevel;

use crate::hostcall;

struct HostLog;

static LOGGER: HostLog = HostLog;

/// Installs the logger (once per VM; later calls only move the level).
pub fn init(level: log::LevelFilter) {
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(level);
}

impl log::Log for HostLog {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = match record.level() {
            log::Level::Trace => LogLevel::Trace,
            log::Level::Debug => LogLevel::Debug,
            log::Level::Info => LogLevel::Info,
            log::Level::Warn => LogLevel::Warn,
            log::Level::Error => LogLevel::Error,
        };
        let _ = hostcall::log(level, &record.args().to_string());
    }

    fn flush(&self) {}
}
