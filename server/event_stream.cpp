#include "server/event_stream.h"

#include <utility>
#include <variant>

namespace pipeline {
namespace {

// The token counts an event carries: a delta's so far, a completion's in the end (an error none).
TokenCounts counts_of(const SinkEvent& event) {
  if (const auto* delta = std::get_if<Delta>(&event)) return delta->counts;
  if (const auto* completion = std::get_if<Completion>(&event)) return completion->counts();
  return {};
}

}  // namespace

EventStream::EventStream(std::shared_ptr<CallChoices> choices, std::shared_ptr<ResponseQueue> queue,
                         ResponseBuilder builder, bool include_usage,
                         std::optional<ChoiceEvent> first, std::chrono::seconds keepalive,
                         std::unique_ptr<ActiveResponse> active)
    : choices_(std::move(choices)),
      queue_(std::move(queue)),
      builder_(std::move(builder)),
      include_usage_(include_usage),
      pending_(std::move(first)),
      keepalive_(keepalive),
      active_(std::move(active)) {}

bool EventStream::write_next(httplib::DataSink& out) {
  std::optional<ChoiceEvent> event = std::move(pending_);
  pending_.reset();
  if (!event) event = queue_->next(kEventPoll);
  std::string text;
  if (event && !opened_) {
    opened_ = true;
    text = opening(*event);
  }
  if (event) text += render(*event);
  const auto now = std::chrono::steady_clock::now();
  if (text.empty() && keepalive_.count() > 0 && now - last_write_ >= keepalive_)
    text = kKeepAliveComment;
  // Nothing to send while the sequences wait (preempted, say): a write would not tell whether
  // the client is still there, so ask the socket.
  if (text.empty()) return out.is_writable() || client_gone();
  if (!out.write(text.data(), text.size())) return client_gone();
  last_write_ = now;
  if (ended_) out.done();
  return true;
}

void EventStream::released(bool success) {
  if (!success || !ended_) client_gone();
}

std::string EventStream::opening(const ChoiceEvent& first) {
  if (!choices_->requests().front()->chat) return {};
  builder_.count_prompt(counts_of(first.event), first.choice);
  std::string text;
  for (int i = 0; i < int(choices_->requests().size()); ++i)
    text += sse_event(builder_.role_chunk(i));
  return text;
}

std::string EventStream::render(ChoiceEvent& event) {
  if (auto* delta = std::get_if<Delta>(&event.event)) {
    if (!builder_.shows(*delta, event.choice)) return {};
    return sse_event(builder_.delta_chunk(*delta, event.choice));
  }
  // A stream ends with [DONE] after an error too, as vLLM's does: clients that read until
  // [DONE] would otherwise take the error for a broken connection. The other choices end.
  if (auto* error = std::get_if<RequestError>(&event.event)) {
    ended_ = true;
    choices_->end_all(*error);
    return sse_event(error_body(*error)) + std::string(kSseDone);
  }
  const auto& completion = std::get<Completion>(event.event);
  std::string text = sse_event(builder_.finish_chunk(completion, event.choice));
  if (!choices_->finish(event.choice, completion)) return text;
  ended_ = true;
  if (include_usage_) text += sse_event(builder_.usage_chunk(choices_->completions()));
  text += kSseDone;
  return text;
}

bool EventStream::client_gone() {
  choices_->cancel_all();
  return false;
}

}  // namespace pipeline
