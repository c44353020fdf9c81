#include "stages/tokenize.h"

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <utility>

#include "graph/log.h"
#include "io/prompt_text.h"
#include "model/bad_words.h"

namespace pipeline {

StageInfo TokenizeStage::info() {
  StageInfo info;
  info.name = "tokenize";
  info.summary = "chat template or raw prompt → token ids; refuses prompts that cannot fit";
  info.accepts = kind_of<Submitted>();
  info.produces = kinds<Tokenized, StreamEvents>();
  info.make = [](const GraphNodeSpec&, EngineContext& ctx) {
    return std::make_unique<TokenizeStage>(ctx);
  };
  return info;
}

// The prompt's token ids, its last truncate_prompt_tokens when the client asks (vLLM's left
// truncation): a prompt's own ids (checked against the model's vocabulary, which the API checked
// against the tokenizer's), or the chat template's or the prompt's text encoded (the prompt's
// after BOS unless add_special_tokens is false). A
// text is measured before it is encoded, which costs seconds a megabyte: one that cannot fit is
// refused unencoded, and a truncated one has only its end encoded.
std::vector<int32_t> TokenizeStage::prompt_tokens(const Request& req, int answer,
                                                  const std::string& prompt_param) const {
  const int keep = req.truncate_prompt_tokens;
  check_truncation(keep);
  if (!req.chat && !req.prompt_ids.empty()) return prompt_ids(req.prompt_ids, keep);
  const PromptText text = prompt_text(req);
  if (keep > 0) return encode_prompt_end(ctx_.tokenizer, text, size_t(keep));
  check_fits(min_tokens(text), answer, prompt_param, "at least ");
  return encode_prompt(ctx_.tokenizer, text);
}

PromptText TokenizeStage::prompt_text(const Request& req) const {
  return req.chat ? chat_prompt(ctx_.chat_template, req.messages, req.prompt_end)
                  : PromptText{{req.prompt, req.add_bos, /*eos_after=*/false}};
}

int64_t TokenizeStage::min_tokens(const PromptText& text) const {
  return int64_t(std::min<size_t>(min_prompt_tokens(ctx_.tokenizer, text), INT_MAX));
}

void TokenizeStage::check_truncation(int keep) const {
  const int context = ctx_.model.max_position_embeddings;
  const int64_t pool = pool_tokens();
  if (keep > context)
    throw Refusal{"truncate_prompt_tokens is " + std::to_string(keep) +
                      " but the model's context is " + std::to_string(context) + " tokens",
                  "truncate_prompt_tokens"};
  if (keep > pool)
    throw Refusal{"truncate_prompt_tokens is " + std::to_string(keep) +
                      " but the KV cache holds only " + std::to_string(pool) + " tokens",
                  "truncate_prompt_tokens"};
}

std::vector<int32_t> TokenizeStage::prompt_ids(const std::vector<int32_t>& ids, int keep) const {
  for (int32_t id : ids)
    if (id < 0 || id >= ctx_.model.vocab_size)
      throw std::invalid_argument("token id " + std::to_string(id) +
                                  " is outside the model's vocabulary of " +
                                  std::to_string(ctx_.model.vocab_size) + " tokens");
  if (keep > 0 && size_t(keep) < ids.size()) return {ids.end() - keep, ids.end()};
  return ids;
}

// A prompt of `n` tokens ("at least n" where only a bound is known) must leave room for
// `answer` more, in the model's context and in the whole KV pool.
void TokenizeStage::check_fits(int64_t n, int answer, const std::string& prompt_param,
                               const std::string& at_least) const {
  const int context = ctx_.model.max_position_embeddings;
  const std::string prompt_is = "the prompt is " + at_least + std::to_string(n) + " tokens";
  const std::string no_room = answer ? ", which leaves no room for a completion" : "";
  if (n + answer > context)
    throw Refusal{
        prompt_is + " but the model's context is " + std::to_string(context) + " tokens" + no_room,
        prompt_param};
  const int64_t pool = pool_tokens();
  if (n + answer > pool)
    throw Refusal{prompt_is + " but the KV cache holds only " + std::to_string(pool) + " tokens",
                  prompt_param};
}

// A max_tokens the client gave must fit beside the prompt, in the context and in the KV pool.
void TokenizeStage::check_room(int64_t prompt, int max_tokens, int context, int64_t pool,
                               const std::string& prompt_param, const std::string& max_tokens_param,
                               const std::string& at_least) {
  const int64_t asked = prompt + max_tokens;
  const std::string request = "you requested " + at_least + std::to_string(asked) + " tokens (" +
                              at_least + std::to_string(prompt) + " in the " + prompt_param + ", " +
                              std::to_string(max_tokens) + " in the completion)";
  if (asked > context)
    throw Refusal{"This model's maximum context length is " + std::to_string(context) +
                      " tokens. However, " + request + ". Please reduce the length of the " +
                      prompt_param + " or completion.",
                  max_tokens_param};
  if (asked > pool)
    throw Refusal{"The KV cache holds only " + std::to_string(pool) + " tokens, but " + request +
                      ". Please reduce the length of the " + prompt_param + " or completion.",
                  max_tokens_param};
}

int64_t TokenizeStage::pool_tokens() const {
  return int64_t(ctx_.scheduler.num_blocks()) * ctx_.scheduler.block_size();
}

void TokenizeStage::check_in_vocabulary(int32_t token, const char* param) const {
  if (token >= ctx_.model.vocab_size)
    throw Refusal{std::string(param) + " names token " + std::to_string(token) +
                      " but the vocabulary has " + std::to_string(ctx_.model.vocab_size) +
                      " tokens",
                  param};
}

void TokenizeStage::resolve_bad_words(const Request& req, SamplingParams& sampling) const {
  // A prompt-only answer (echo with max_tokens 0) keeps no token it draws: nothing to ban.
  if (req.bad_words.empty() || req.prompt_only) return;
  try {
    sampling.bad_word_sequences = bad_word_sequences(ctx_.tokenizer, req.bad_words);
  } catch (const std::invalid_argument& e) {
    throw Refusal{e.what(), "bad_words"};
  }
  if (!first_draw_possible(sampling, ctx_.model.vocab_size))
    throw Refusal{"bad_words bans every token " +
                      std::string(sampling.allowed_tokens.empty() ? "of the vocabulary"
                                                                  : "allowed_token_ids allows") +
                      (sampling.min_tokens > 0 ? " that min_tokens does not hold back" : "") +
                      ": nothing could be drawn",
                  "bad_words"};
}

void TokenizeStage::prepare(Sequence& seq) const {
  const Request& req = *seq.request;
  const std::string prompt_param = req.chat ? "messages" : "prompt";
  if (auto problem = validate(req.sampling); !problem.empty()) throw Refusal{problem, ""};
  for (const LogitBias& b : req.sampling.logit_bias) check_in_vocabulary(b.token, "logit_bias");
  for (int32_t token : req.sampling.allowed_tokens) check_in_vocabulary(token, "allowed_token_ids");
  for (int32_t token : req.stop_token_ids) check_in_vocabulary(token, "stop_token_ids");
  // Positions the answer needs beside the prompt: at least one, none for a prompt-only answer
  // (its one token is dropped, never computed).
  const int answer = req.prompt_only ? 0 : 1;
  try {
    seq.tokens = prompt_tokens(req, answer, prompt_param);
  } catch (const ChatTemplateError& e) {
    throw Refusal{e.what(), e.param()};
  } catch (const std::invalid_argument& e) {
    throw Refusal{e.what(), prompt_param};
  }
  const int n = int(seq.tokens.size());
  if (n == 0) throw Refusal{"the prompt is empty", prompt_param};
  check_fits(n, answer, prompt_param);
  const int context = ctx_.model.max_position_embeddings;
  const int64_t pool = pool_tokens();
  if (!req.max_tokens_param.empty() && !req.prompt_only)
    check_room(n, req.max_tokens, context, pool, prompt_param, req.max_tokens_param);
  // Only once the prompt fits: the text state decodes the whole prompt, which for one far past
  // the context (three million token ids, say) took longer than the rest of the refusal.
  try {
    seq.text = std::make_unique<TextState>(ctx_.tokenizer, seq.tokens, req.stop,
                                           req.include_stop_str_in_output);
  } catch (const std::invalid_argument& e) {
    throw Refusal{e.what(), "stop"};
  }
  seq.prompt_len = n;
  seq.max_tokens = req.prompt_only
                       ? 1
                       : int(std::min<int64_t>({req.max_tokens > 0 ? req.max_tokens : INT_MAX,
                                                context - n, pool - n}));
  if (req.sampling.min_tokens > seq.max_tokens)
    throw Refusal{"min_tokens is " + std::to_string(req.sampling.min_tokens) + " but only " +
                      std::to_string(seq.max_tokens) + " tokens fit after the " +
                      std::to_string(n) + "-token " + prompt_param,
                  "min_tokens"};
  // What ends the answer: the end of sequence (unless ignored) and the stop token ids. The
  // model step ends a sequence on one, and min_tokens bans them from the first draws.
  SamplingParams sampling = req.sampling;
  if (!req.ignore_eos) sampling.ending_tokens = ctx_.model.eos_token_ids;
  sampling.ending_tokens.insert(sampling.ending_tokens.end(), req.stop_token_ids.begin(),
                                req.stop_token_ids.end());
  if (sampling.min_tokens > 0 && !sampling.allowed_tokens.empty() &&
      std::all_of(sampling.allowed_tokens.begin(), sampling.allowed_tokens.end(), [&](int32_t t) {
        return std::find(sampling.ending_tokens.begin(), sampling.ending_tokens.end(), t) !=
               sampling.ending_tokens.end();
      }))
    throw Refusal{
        "allowed_token_ids holds only tokens that end the answer, which min_tokens "
        "bans from its first draws: nothing could be drawn",
        "allowed_token_ids"};
  resolve_bad_words(req, sampling);
  std::optional<GuidedDecoding> guide;
  if (req.json_schema || req.text_pattern || req.grammar) {
    if (ctx_.guided_vocabulary.eos_tokens().empty())
      throw Refusal{std::string(req.json_schema    ? "response_format and guided_json need"
                                : req.text_pattern ? "guided_regex and guided_choice need"
                                                   : "guided_grammar and grammar need") +
                        " a model with an end-of-sequence token to end the answer they guide; "
                        "this model's generation config names none",
                    req.json_schema    ? "response_format"
                    : req.text_pattern ? "guided_regex"
                                       : "guided_grammar"};
    if (req.json_schema) {
      guide.emplace(ctx_.guided_vocabulary, req.json_schema);
    } else if (req.text_pattern) {
      guide.emplace(ctx_.guided_vocabulary, req.text_pattern);
    } else {
      guide.emplace(ctx_.guided_vocabulary, req.grammar);
    }
  }
  seq.sampler = std::make_unique<Sampler>(sampling, ctx_.seed_base + seq.number, std::move(guide));
}

std::optional<RequestError> TokenizeStage::refusal_before_encoding(const Request& req) const {
  const std::string prompt_param = req.chat ? "messages" : "prompt";
  const int keep = req.truncate_prompt_tokens;
  try {
    check_truncation(keep);
    int64_t at_least = 1;  // a truncated prompt: only its length after encoding is known
    if (!req.chat && !req.prompt_ids.empty())
      at_least = int64_t(keep > 0 ? std::min<size_t>(req.prompt_ids.size(), size_t(keep))
                                  : req.prompt_ids.size());
    else if (keep == 0)
      at_least = min_tokens(prompt_text(req));
    check_fits(at_least, req.prompt_only ? 0 : 1, prompt_param, "at least ");
    if (!req.max_tokens_param.empty() && !req.prompt_only)
      check_room(at_least, req.max_tokens, ctx_.model.max_position_embeddings, pool_tokens(),
                 prompt_param, req.max_tokens_param, "at least ");
  } catch (const Refusal& refusal) {
    return refusal_error(req, refusal);
  } catch (const std::invalid_argument&) {
    return std::nullopt;  // a prompt the template cannot render: the stage's own refusal says so
  }
  return std::nullopt;
}

// A list's prompt is named, since the call's one error must say which prompt it was.
RequestError TokenizeStage::refusal_error(const Request& req, const Refusal& refusal) {
  const int index = req.prompt_index;
  const std::string message =
      (index >= 0 ? "prompt[" + std::to_string(index) + "]: " : "") + refusal.message;
  return RequestError{400, message, "invalid_request_error", refusal.param, ""};
}

void TokenizeStage::operator()(Message message, const Emit& emit) {
  SequencePtr seq = std::get<Submitted>(message).seq;
  if (seq->stream.ended()) return;  // failed while it queued (shutdown)
  try {
    prepare(*seq);
  } catch (const Refusal& refusal) {
    emit(StreamEvents{{StreamEvent{seq, 0, refusal_error(*seq->request, refusal)}}});
    return;
  }
  ctx_.metrics.prompt_tokens.add(uint64_t(seq->prompt_len));
  if (ctx_.config.server.logs_requests()) {
    // A prompt answered alone (echo, max_tokens 0) still draws a token, which its answer drops.
    if (seq->request->prompt_only)
      log_line("request %s added: %d prompt tokens, the prompt alone to answer",
               seq->request->id.c_str(), seq->prompt_len);
    else
      log_line("request %s added: %d prompt tokens, up to %d new", seq->request->id.c_str(),
               seq->prompt_len, seq->max_tokens);
  }
  emit(Tokenized{std::move(seq)});
}

}  // namespace pipeline
