"""Baseline models and runtimes the benchmark compares Slapo against (megatron-core's own
models, unscheduled HuggingFace models under DeepSpeed)."""
