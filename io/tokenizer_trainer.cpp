#include "io/tokenizer_trainer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <fstream>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace pipeline {

int train_tokenizer(const std::filesystem::path& corpus, int vocab_size,
                    const std::filesystem::path& out_model_file) {
  if (vocab_size <= 0)
    throw std::invalid_argument("train_tokenizer: vocab_size must be positive, got " +
                                std::to_string(vocab_size));
  if (!std::filesystem::exists(corpus))
    throw std::runtime_error("tokenizer corpus " + corpus.string() + ": no such file");
  if (!std::filesystem::is_regular_file(corpus) || std::filesystem::file_size(corpus) == 0)
    throw std::runtime_error("tokenizer corpus " + corpus.string() +
                             ": not a text file with content (a directory, a device or empty)");

  const std::unordered_map<std::string, std::string> options = {
      {"input", corpus.string()},
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      // Fewer pieces than asked when the corpus runs out of merges, instead of an error.
      {"hard_vocab_limit", "false"},
      // LLaMA-2's tokenizer settings.
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      {"character_coverage", "1.0"},
      {"allow_whitespace_only_pieces", "true"},
      {"remove_extra_whitespaces", "false"},
      {"normalization_rule_name", "identity"},
      {"max_sentence_length", "16384"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      // Determinism: every sentence, in file order, on one thread.
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"num_threads", "1"},
      // Silence sentencepiece's progress log (LOG(INFO) and LOG(WARNING)).
      {"minloglevel", "2"},
  };
  // With an output string, sentencepiece returns the model instead of writing files.
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(options, nullptr, &model);
  if (!status.ok())
    throw std::runtime_error("training a tokenizer on " + corpus.string() + " (vocab_size " +
                             std::to_string(vocab_size) + ") failed: " + status.ToString());

  sentencepiece::SentencePieceProcessor trained;
  if (const auto loaded = trained.LoadFromSerializedProto(model); !loaded.ok())
    throw std::runtime_error("the tokenizer trained on " + corpus.string() +
                             " does not load: " + loaded.ToString());

  std::ofstream out(out_model_file, std::ios::binary | std::ios::trunc);
  out.write(model.data(), std::streamsize(model.size()));
  out.close();
  if (!out) throw std::runtime_error("cannot write tokenizer model " + out_model_file.string());
  return trained.GetPieceSize();
}

}  // namespace pipeline
