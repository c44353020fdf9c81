#include "stages/emit.h"

namespace pipeline {

StageInfo EmitStage::info() {
  StageInfo info;
  info.name = "emit";
  info.summary = "text deltas and endings → each request's sink, in order";
  info.accepts = kind_of<StreamEvents>();
  info.needs_every = kind_of<StreamEvents>();
  info.make = [](const GraphNodeSpec&, EngineContext&) { return std::make_unique<EmitStage>(); };
  return info;
}

void EmitStage::operator()(Message message, const Emit&) {
  for (auto& event : std::get<StreamEvents>(message).events)
    event.seq->stream.deliver(event.index, std::move(event.payload));
}

}  // namespace pipeline
