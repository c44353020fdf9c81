#include "model/model_runner.h"

namespace pipeline {

namespace {

[[noreturn]] void out_of_range(const char* field, const char* range, const std::string& value) {
  throw std::invalid_argument(std::string("RunnerOptions.") + field + " must be " + range +
                              ", got " + value);
}

}  // namespace

void check_runner_options(const RunnerOptions& o) {
  if (o.kv_block_size <= 0)
    out_of_range("kv_block_size", "positive", std::to_string(o.kv_block_size));
  if (o.kv_cache_blocks < 0)
    out_of_range("kv_cache_blocks", ">= 0", std::to_string(o.kv_cache_blocks));
  if (!(o.kv_cache_fraction > 0.0 && o.kv_cache_fraction <= 1.0))
    out_of_range("kv_cache_fraction", "in (0, 1]", std::to_string(o.kv_cache_fraction));
  if (o.threads < 0) out_of_range("threads", ">= 0", std::to_string(o.threads));
  if (o.max_pass_tokens < 0)
    out_of_range("max_pass_tokens", ">= 0", std::to_string(o.max_pass_tokens));
  if (o.max_pass_logit_rows < 0)
    out_of_range("max_pass_logit_rows", ">= 0", std::to_string(o.max_pass_logit_rows));
}

}  // namespace pipeline
