//! Health-weighted routing: pick a model's backend cluster by measured health.
