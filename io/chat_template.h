// Chat templates: a list of messages to the prompt's texts and token ids. BOS and EOS enter as
// ids, never as text, so a user cannot forge them.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
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

// A dialog the template cannot express (unknown role, the wrong role last, roles out of order):
// a message fit for a 400 answer, and the field it names ("messages[2].role").
class ChatTemplateError : public std::invalid_argument {
 public:
  ChatTemplateError(std::string param, const std::string& message)
      : std::invalid_argument(message), param_(std::move(param)) {}
  const std::string& param() const { return param_; }

 private:
  std::string param_;
};

// The dialog as the texts the template writes, one segment a turn. Throws ChatTemplateError.
PromptText chat_prompt(ChatTemplate chat_template, const std::vector<ChatMessage>& messages,
                       PromptEnd end = PromptEnd::NewAnswer);

// chat_prompt() encoded (encode_prompt()).
std::vector<int32_t> apply_chat_template(const Tokenizer& tokenizer, ChatTemplate chat_template,
                                         const std::vector<ChatMessage>& messages,
                                         PromptEnd end = PromptEnd::NewAnswer);

}  // namespace pipeline
