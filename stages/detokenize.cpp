#include "stages/detokenize.h"

#include <algorithm>
#include <string_view>

namespace pipeline {
namespace {

// Whether `id`, which ended an answer, is one of the client's stop token ids rather than an end
// of sequence: an end of sequence comes first unless ignored, as vLLM checks them.
bool is_named_stop_token(const Request& request, const std::vector<int32_t>& eos_ids, int32_t id) {
  const auto holds = [id](const std::vector<int32_t>& ids) {
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  };
  return holds(request.stop_token_ids) && (request.ignore_eos || !holds(eos_ids));
}

// The failure that waited for the tokens drawn before it (Sequence::fail_unless_answered) ends
// the request once detokenize has had them all, unless they ended its answer.
void fail_once_caught_up(const SequencePtr& seq, StreamEvents& out) {
  TextState& state = *seq->text;
  if (state.done || !state.failure_after_drawn) return;
  if (state.completion_tokens < seq->tokens_drawn.load()) return;
  state.done = true;
  out.events.push_back({seq, state.next_event++, *state.failure_after_drawn});
}

}  // namespace

StageInfo DetokenizeStage::info() {
  StageInfo info;
  info.name = "detokenize";
  info.summary = "token ids → text deltas (incremental UTF-8), stop strings";
  info.accepts = kind_of<StepResult>();
  info.produces = kind_of<StreamEvents>();
  info.needs_every = kind_of<StepResult>();
  info.make = [](const GraphNodeSpec&, EngineContext& ctx) {
    return std::make_unique<DetokenizeStage>(ctx);
  };
  return info;
}

void DetokenizeStage::operator()(Message message, const Emit& emit) {
  auto& result = std::get<StepResult>(message);
  StreamEvents out;
  for (auto& output : result.outputs) {
    const SequencePtr& seq = output.seq;
    seq->text->tokens.push(uint64_t(output.index),
                           {std::move(output.sampled), output.finish, output.drawn_at,
                            std::move(output.prompt_scores)},
                           [&](const GeneratedToken& token) {
                             add_token(seq, token, out);
                             fail_once_caught_up(seq, out);
                           });
  }
  if (!out.events.empty()) emit(std::move(out));
}

void DetokenizeStage::add_token(const SequencePtr& seq, const GeneratedToken& token,
                                StreamEvents& out) const {
  TextState& state = *seq->text;
  if (state.done) return;  // tokens sampled after a stop string matched
  ++state.completion_tokens;
  // Counted here rather than where sampled, so that the metric counts what usage does; a
  // prompt-only answer's one token is dropped, and counts nowhere.
  const bool counted = !seq->request->prompt_only;
  if (counted) ctx_.metrics.generated_tokens.add();
  const int32_t id = token.sampled.token;
  std::optional<FinishReason> finish = token.finish;

  Delta delta;
  if (state.completion_tokens == 1 && seq->request->prompt_logprobs) {
    // Every prompt token but the first is scored: anything else is a bug, not a null logprob.
    if (int(token.prompt_scores.size()) != seq->prompt_len - 1) {
      state.done = true;
      out.events.push_back({seq, state.next_event++,
                            RequestError{500, "internal error: the prompt's scores are incomplete",
                                         "server_error", "", ""}});
      return;
    }
    delta.prompt = scored_prompt(state, token);
  }
  // The token that ended the answer (an end of sequence, a stop token id) is not text unless
  // asked for, as in vLLM (an end of sequence has none anyway).
  const Request& request = *seq->request;
  const bool ending_token = finish == FinishReason::Stop && !request.include_stop_str_in_output;
  const bool at_text_start = state.decoder.at_text_start();
  std::string text = ending_token ? std::string() : state.decoder.push(id);
  if (request.sampling.logprobs)
    delta.tokens.push_back(
        {id, logprob_text(id, text, at_text_start), token.sampled.logprob, token.sampled.top});
  // A stop string may end only in the text of the tokens after the first min_tokens.
  const bool may_stop = state.completion_tokens > request.sampling.min_tokens;
  const auto stops_in = [&](const std::string& new_text) {
    return may_stop ? state.stops.push(new_text)
                    : StopStringMatcher::Result{state.stops.push_unmatched(new_text), false};
  };
  auto pushed = stops_in(std::move(text));
  delta.text = std::move(pushed.text);
  if (!pushed.stopped && finish) {
    auto tail = stops_in(state.decoder.flush());
    delta.text += tail.text;
    pushed.stopped = tail.stopped;
    pushed.stop = std::move(tail.stop);
    if (!tail.stopped) delta.text += state.stops.flush();
  }
  StopReason stop_reason;
  if (pushed.stopped) {
    finish = FinishReason::Stop;
    stop_reason = std::move(pushed.stop);
    seq->stopped.store(true);
  } else if (finish == FinishReason::Stop &&
             is_named_stop_token(request, ctx_.model.eos_token_ids, id)) {
    stop_reason = id;
  }
  delta.new_token = !ending_token;
  const TokenCounts counts{seq->prompt_len, counted ? state.completion_tokens : 0,
                           seq->cached_prompt_tokens.value_or(0)};
  delta.counts = counts;
  if (delta.new_token || !delta.text.empty() || !delta.tokens.empty() || !delta.prompt.empty())
    out.events.push_back({seq, state.next_event++, std::move(delta)});
  if (finish) {
    state.done = true;
    out.events.push_back(
        {seq, state.next_event++,
         Completion{*finish, counts.prompt_tokens, counts.completion_tokens, counts.cached_tokens,
                    std::move(stop_reason), token.drawn_at}});
  }
}

// A generated token's text as logprobs show it. At the start of a text (a prompt of no text, or
// only a BOS), sentencepiece drops the word-start space of the first piece, and so does the
// answer's text; the token's text drops it too, so that the tokens still spell the text.
std::string DetokenizeStage::logprob_text(int32_t id, const std::string& decoded,
                                          bool at_text_start) const {
  std::string text = ctx_.tokenizer.token_text(id);
  if (!at_text_start || decoded.size() >= text.size()) return text;
  const size_t dropped = text.size() - decoded.size();
  const bool only_spaces_dropped = text.find_first_not_of(' ') >= dropped;
  if (only_spaces_dropped && text.compare(dropped, std::string::npos, decoded) == 0) return decoded;
  return text;
}

std::vector<TokenOutput> DetokenizeStage::scored_prompt(const TextState& state,
                                                        const GeneratedToken& token) const {
  const auto output = [&](int32_t id) {
    return TokenOutput{id, ctx_.tokenizer.token_text(id), std::nullopt, {}};
  };
  std::vector<TokenOutput> prompt = {output(state.first_prompt_token)};
  for (const SampledToken& score : token.prompt_scores) {
    prompt.push_back(output(score.token));
    prompt.back().logprob = score.logprob;
    prompt.back().top = score.top;
  }
  return prompt;
}

}  // namespace pipeline
