#include "graph/stage_registry.h"

#include <stdexcept>

#include "stages/batch_window.h"
#include "stages/decode_step.h"
#include "stages/detokenize.h"
#include "stages/emit.h"
#include "stages/prefill.h"
#include "stages/tokenize.h"

namespace pipeline {

const char* param_type_name(ParamType type) {
  switch (type) {
    case ParamType::Integer:
      return "an integer";
    case ParamType::Number:
      return "a number";
    case ParamType::String:
      return "a string";
    case ParamType::Boolean:
      return "a boolean";
  }
  return "?";
}

StageRegistry& StageRegistry::global() {
  static StageRegistry registry = [] {
    StageRegistry r;
    r.add(TokenizeStage::info());
    r.add(BatchWindowStage::info());
    r.add(PrefillStage::info());
    r.add(DecodeStepStage::info());
    r.add(DetokenizeStage::info());
    r.add(EmitStage::info());
    return r;
  }();
  return registry;
}

void StageRegistry::add(StageInfo info) {
  if (stages_.contains(info.name))
    throw std::invalid_argument("stage '" + info.name + "' is already registered");
  auto name = info.name;
  stages_.emplace(std::move(name), std::move(info));
}

const StageInfo* StageRegistry::find(const std::string& name) const {
  auto it = stages_.find(name);
  return it == stages_.end() ? nullptr : &it->second;
}

std::vector<std::string> StageRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [name, info] : stages_) out.push_back(name);
  return out;
}

}  // namespace pipeline
