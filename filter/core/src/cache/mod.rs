//! Response cache: deterministic LLM calls answered from Envoy shared data.
