#include "model/batch.h"

#include <algorithm>

namespace pipeline {

int Batch::total_tokens() const {
  int total = 0;
  for (const SequenceChunk& seq : seqs) total += int(seq.tokens.size());
  return total;
}

int Batch::logit_rows() const {
  int rows = 0;
  for (const SequenceChunk& seq : seqs) rows += seq.all_logits ? int(seq.tokens.size()) : 1;
  return rows;
}

bool Batch::is_decode() const {
  return !seqs.empty() && std::all_of(seqs.begin(), seqs.end(), [](const SequenceChunk& seq) {
    return seq.tokens.size() == 1;
  });
}

bool Batch::argmax_only() const {
  return !seqs.empty() && std::all_of(seqs.begin(), seqs.end(), [](const SequenceChunk& seq) {
    return seq.argmax_only && !seq.all_logits;
  });
}

}  // namespace pipeline
