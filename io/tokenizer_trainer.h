// Trains a small LLaMA-style sentencepiece tokenizer (BPE with byte fallback) in-process, so
// synthetic checkpoints (`pipeline make-model`) get a real tokenizer.model.
#pragma once

#include <filesystem>

namespace pipeline {

// Trains on `corpus` (plain text, one sentence per line) and writes the model to
// `out_model_file`. LLaMA's settings: BPE, byte fallback, digits split, <unk>=0 <s>=1 </s>=2,
// no padding piece, no normalization. `vocab_size` is a target: a corpus too small to fill it
// gives fewer pieces. Deterministic: the same corpus and size give the same file.
// Returns the real vocabulary size. Throws std::invalid_argument on a non-positive
// vocab_size and std::runtime_error naming the corpus when training fails.
int train_tokenizer(const std::filesystem::path& corpus, int vocab_size,
                    const std::filesystem::path& out_model_file);

}  // namespace pipeline
