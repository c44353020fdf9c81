// Stage name (as written in a config's graph.nodes[].stage) → what the stage is and how to
// make one. The six built-in stages are registered in stage_registry.cpp, one line each;
// a test or an extension adds its own with StageRegistry::global().add(...).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/message.h"
#include "graph/serve_config.h"
#include "graph/stage.h"

namespace pipeline {

struct EngineContext;

enum class ParamType { Integer, Number, String, Boolean };
const char* param_type_name(ParamType type);  // "an integer", ...

// A stage's own parameter, written beside name/stage/concurrency in its graph node.
struct StageParam {
  std::string name;
  ParamType type = ParamType::Integer;
  bool required = false;
};

struct StageInfo {
  std::string name;
  std::string summary;      // one line, for `pipeline graph`
  KindSet accepts = 0;      // message kinds its body takes
  KindSet produces = 0;     // message kinds it emits; 0: an output (a sink of the graph)
  KindSet needs_every = 0;  // kinds it must receive from every node that produces them
  bool serial = false;      // one body at a time (a model stage, the scheduler)
  bool async = false;       // an async_node: it emits from its own thread
  std::vector<StageParam> params;
  std::function<std::unique_ptr<Stage>(const GraphNodeSpec&, EngineContext&)> make;
};

class StageRegistry {
 public:
  // The process-wide registry, holding the built-in stages.
  static StageRegistry& global();

  // Throws std::invalid_argument when the name is taken.
  void add(StageInfo info);
  const StageInfo* find(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  std::map<std::string, StageInfo> stages_;
};

}  // namespace pipeline
