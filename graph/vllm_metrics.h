// The engine's measures again under vLLM's metric names (vllm:*, labelled model_name), so that
// vLLM's Grafana dashboard, its benchmark tooling and alerts written for a vLLM server read this
// one unchanged. Only what measures the same thing is written; see the list in vllm_metrics.cpp.
#pragma once

#include <string>

#include "graph/metrics.h"

namespace pipeline {

std::string vllm_metrics_text(const Metrics& metrics, const std::string& model_name);

}  // namespace pipeline
