//! The reading of a model server's Prometheus text exposition into the load
//! signals routing weighs: a small line parser, not a full exposition-format
//! reader, that keeps only the few metrics it knows and skips the rest.

use crate::routing::health::Load;

/// Samples of one load metric: sum and count over label sets.
#[derive(Default)]
struct Acc {
    sum: f64,
    n: u32,
}

impl Acc {
    fn add(&mut self, v: f64) {
        self.sum += v;
        self.n = self.n.saturating_add(1);
    }
    fn sum(&self) -> Option<f64> {
        (self.n > 0).then_some(self.sum)
    }
    fn mean(&self) -> Option<f64> {
        (self.n > 0).then(|| self.sum / f64::from(self.n))
    }
}

/// Cap of a summed queue length: a sum of finite samples stays finite.
const MAX_WAITING: f64 = 1e9;

/// Reads load signals from a model server's Prometheus text exposition:
/// waiting requests (vLLM `vllm:num_requests_waiting`, SGLang
/// `sglang:num_queue_reqs`), summed over label sets, and KV-cache usage (vLLM
/// `vllm:kv_cache_usage_perc`, else the older `vllm:gpu_cache_usage_perc`,
/// SGLang `sglang:token_usage`), averaged over label sets since a sum of
/// fractions is no fraction. `None` when no known metric is present.
/// Comments, unknown metrics, malformed lines, NaN and infinities are skipped.
pub fn parse_load(text: &[u8]) -> Option<Load> {
    let mut waiting = Acc::default();
    let mut kv = Acc::default();
    let mut gpu = Acc::default();
    let mut sg_queue = Acc::default();
    let mut sg_tokens = Acc::default();
    for line in text.split(|b| *b == b'\n') {
        let Some((name, value)) = sample(line) else {
            continue;
        };
        match name {
            b"vllm:num_requests_waiting" => waiting.add(value.max(0.0)),
            b"sglang:num_queue_reqs" => sg_queue.add(value.max(0.0)),
            b"vllm:kv_cache_usage_perc" => kv.add(fraction(value)),
            b"vllm:gpu_cache_usage_perc" => gpu.add(fraction(value)),
            b"sglang:token_usage" => sg_tokens.add(fraction(value)),
            _ => {}
        }
    }
    let waiting = match (waiting.sum(), sg_queue.sum()) {
        (None, None) => None,
        (a, b) => Some((a.unwrap_or(0.0) + b.unwrap_or(0.0)).min(MAX_WAITING)),
    };
    let kv_usage = kv
        .mean()
        .or_else(|| gpu.mean())
        .or_else(|| sg_tokens.mean())
        .map(|u| u.clamp(0.0, 1.0));
    (waiting.is_some() || kv_usage.is_some()).then_some(Load { waiting, kv_usage })
}

/// A usage in `[0, 1]`. These metrics are fractions; a value above 1 can only
/// be a percentage from another exporter.
fn fraction(v: f64) -> f64 {
    let v = if v > 1.0 && v <= 100.0 { v / 100.0 } else { v };
    v.clamp(0.0, 1.0)
}

/// One sample line: `name{labels} value [timestamp]`, the value finite.
fn sample(line: &[u8]) -> Option<(&[u8], f64)> {
    let line = line.trim_ascii();
    if line.first().is_none_or(|b| *b == b'#') {
        return None;
    }
    let name_len = line
        .iter()
        .position(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'_' | b':')))
        .unwrap_or(line.len());
    let (name, mut rest) = line.split_at(name_len);
    if name.is_empty() {
        return None;
    }
    if rest.first() == Some(&b'{') {
        rest = rest.get(skip_labels(rest)?..)?;
    }
    // The value follows at least one blank; a timestamp may follow it.
    if !rest.first().is_some_and(|b| *b == b' ' || *b == b'\t') {
        return None;
    }
    let value = rest
        .trim_ascii_start()
        .split(|b| *b == b' ' || *b == b'\t')
        .next()?;
    let value: f64 = std::str::from_utf8(value).ok()?.parse().ok()?;
    value.is_finite().then_some((name, value))
}

/// Length of a `{…}` label block, quotes and escapes inside values honoured;
/// `None` when it never closes.
fn skip_labels(s: &[u8]) -> Option<usize> {
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, b) in s.iter().enumerate().skip(1) {
        if in_quotes {
            if escaped {
                escaped = false;
            } else if *b == b'\\' {
                escaped = true;
            } else if *b == b'"' {
                in_quotes = false;
            }
        } else if *b == b'"' {
            in_quotes = true;
        } else if *b == b'}' {
            return Some(i + 1);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm_metrics() {
        let text = br#"# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B"} 3.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B"} 4
vllm:num_requests_running{engine="0",model_name="x"} 12.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
vllm:kv_cache_usage_perc{engine="0",model_name="x"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="x"} 0.7
vllm:gpu_cache_usage_perc{model_name="x"} 0.99
vllm:num_requests_waiting_total 1000
"#;
        let l = parse_load(text).unwrap();
        assert_eq!(l.waiting, Some(7.0));
        assert!((l.kv_usage.unwrap() - 0.6).abs() < 1e-12);
    }

    #[test]
    fn reads_older_vllm_and_sglang_metrics() {
        let l = parse_load(b"vllm:gpu_cache_usage_perc{model_name=\"x\"} 0.25\n").unwrap();
        assert_eq!(
            l,
            Load {
                waiting: None,
                kv_usage: Some(0.25)
            }
        );
        let l = parse_load(
            b"sglang:num_queue_reqs{model_name=\"q\",dp_rank=\"0\"} 2\r\n\
              sglang:num_queue_reqs{model_name=\"q\",dp_rank=\"1\"} 5\r\n\
              sglang:token_usage{model_name=\"q\"} 0.9\r\n",
        )
        .unwrap();
        assert_eq!(
            l,
            Load {
                waiting: Some(7.0),
                kv_usage: Some(0.9)
            }
        );
    }

    #[test]
    fn parser_is_robust() {
        let text = concat!(
            "\n   \n# comment with vllm:num_requests_waiting 99\n",
            "vllm:num_requests_waiting{a=\"x}y\",b=\"q\\\"}\\\\\",c=\"1,2\"} 2 1712345678000\n",
            "vllm:num_requests_waiting{a=\"unterminated} 50\n",
            "vllm:num_requests_waiting NaN\n",
            "vllm:num_requests_waiting +Inf\n",
            "vllm:num_requests_waiting -Inf\n",
            "vllm:num_requests_waiting -4\n",
            "vllm:num_requests_waiting\n",
            "vllm:num_requests_waiting{} 1e0\n",
            "vllm:num_requests_waiting{}3\n",
            "vllm:num_requests_waiting 1e400\n",
            "vllm:num_requests_waiting abc\n",
            "vllm:num_requests_waiting\t0.5\t# trailing\n",
            "{} 7\n",
            "\u{0}\u{ff}garbage 3\n",
            "vllm:kv_cache_usage_perc 85\n",
            "vllm:kv_cache_usage_perc 250\n",
        );
        let l = parse_load(text.as_bytes()).unwrap();
        assert_eq!(l.waiting, Some(3.5));
        // 85 read as a percentage, 250 clamped.
        assert!((l.kv_usage.unwrap() - 0.925).abs() < 1e-12, "{l:?}");
        assert_eq!(parse_load(b""), None);
        assert_eq!(parse_load(b"up 1\n# EOF\n"), None);
        assert_eq!(parse_load(&[0xff, 0xfe, b'\n', b'{']), None);
        let huge = "vllm:num_requests_waiting 1e300\n".repeat(3);
        assert_eq!(
            parse_load(huge.as_bytes()).unwrap().waiting,
            Some(MAX_WAITING)
        );
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzz;

    fn labels() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(String::new()),
            Just("{}".to_string()),
            fuzz::text().prop_map(|t| {
                let v = t
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                format!("{{model_name=\"{v}\",engine=\"0\"}}")
            }),
        ]
    }

    fn known() -> impl Strategy<Value = (&'static str, f64)> {
        (
            prop::sample::select(vec![
                "vllm:num_requests_waiting",
                "sglang:num_queue_reqs",
                "vllm:kv_cache_usage_perc",
                "vllm:gpu_cache_usage_perc",
                "sglang:token_usage",
            ]),
            prop_oneof![0.0f64..1.0, 0.0f64..1e12, -5.0f64..0.0],
        )
    }

    fn render(samples: &[(&str, f64)], labels: &[String], ts: bool) -> String {
        let mut out = String::from("# HELP x y\n# TYPE x gauge\n");
        for (i, (name, v)) in samples.iter().enumerate() {
            let l = labels.get(i).map_or("", String::as_str);
            out.push_str(&format!("{name}{l} {v:e}"));
            if ts {
                out.push_str(" 1700000000000");
            }
            out.push('\n');
        }
        out
    }

    proptest! {
        #![proptest_config(fuzz::config(256))]

        /// Labels, timestamps and comments never change what is read, and what
        /// is read stays within bounds.
        #[test]
        fn labels_do_not_change_the_load(samples in prop::collection::vec(known(), 0..12), labels in prop::collection::vec(labels(), 12), ts: bool) {
            let plain = parse_load(render(&samples, &[], false).as_bytes());
            prop_assert_eq!(parse_load(render(&samples, &labels, ts).as_bytes()), plain);
            prop_assert_eq!(plain.is_some(), !samples.is_empty());
            if let Some(l) = plain {
                prop_assert!(l.waiting.is_none_or(|w| (0.0..=MAX_WAITING).contains(&w)));
                prop_assert!(l.kv_usage.is_none_or(|u| (0.0..=1.0).contains(&u)));
            }
        }

        /// Arbitrary text: no panic, bounded values.
        #[test]
        fn any_text_reads_bounded(samples in prop::collection::vec(known(), 0..6), noise in prop::collection::vec(any::<u8>(), 0..256), at: usize) {
            let mut text = render(&samples, &[], false).into_bytes();
            let at = at % (text.len() + 1);
            text.splice(at..at, noise);
            if let Some(l) = parse_load(&text) {
                prop_assert!(l.waiting.is_none_or(|w| (0.0..=MAX_WAITING).contains(&w)));
                prop_assert!(l.kv_usage.is_none_or(|u| (0.0..=1.0).contains(&u)));
            }
        }
    }
}
