// Chat templates: a list of messages to the prompt's texts and token ids. BOS and EOS enter as
// ids, never as text, so a user cannot forge them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/prompt_text.h"
#include "io/tokenizer.h"

namespace pipeline {

struct ChatMessage {
  std::string role;  // system (or developer, OpenAI's newer name for it) | user | assistant
  std::string content;
};

// Whether a message may have this role (a template may still refuse where it stands).
bool is_chat_role(std::string_view role);

enum class ChatTemplate {
  Llama2,  // Meta's: <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s>...
  Raw,     // contents joined by newlines after BOS, for models without a chat format
};

// Where a chat prompt ends.
enum class PromptEnd {
  NewAnswer,             // after the last message, a user's: the assistant's answer begins
  ContinueFinalMessage,  // inside the last message, the assistant's, which the answer continues
                         // (vLLM's continue_final_message: the client writes its beginning)
};

std::optional<ChatTemplate> parse_chat_template(std::string_view name);

// The dialog as the texts the template writes, one segment a turn. Throws
// std::invalid_argument with a message fit for a 400 answer on a dialog the template cannot
// express (unknown role, the wrong role last, roles out of order).
PromptText chat_prompt(ChatTemplate chat_template, const std::vector<ChatMessage>& messages,
                       PromptEnd end = PromptEnd::NewAnswer);

// chat_prompt() encoded (encode_prompt()).
std::vector<int32_t> apply_chat_template(const Tokenizer& tokenizer, ChatTemplate chat_template,
                                         const std::vector<ChatMessage>& messages,
                                         PromptEnd end = PromptEnd::NewAnswer);

}  // namespace pipeline
