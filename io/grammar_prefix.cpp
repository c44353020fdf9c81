#include "io/grammar_prefix.h"

#include <algorithm>
#include <string>
#include <unordered_map>

#include "io/utf8.h"

namespace pipeline {
namespace {

// Following one character: from the node after it, every way through choices, calls and returns
// to the next characters (or to root's end), each written out as a parse. A frame's stack is a
// chain of links, so a call or a return is a link rather than a copy; a (node, context) pair
// met again is skipped, a context being one stack below the node, which is what ends the loops
// of a repetition whose body can be empty. A call that returns to the same node in the same
// context as one before it shares that call's stack and context, so the callee is followed once:
// with a fresh context for each, a grammar whose ways split and join again (r ::= (s | s) "z"?,
// nested) was followed once per way, 2^depth times.
class Closure {
 public:
  void begin(const Grammar& grammar, std::vector<uint32_t>& out) {
    grammar_ = &grammar;
    out_ = &out;
    out.clear();
    links_.clear();
    work_.clear();  // a step that threw (past a limit) leaves its work behind
    calls_.clear();
    steps_ = 0;
    complete_ = false;
    if (seen_.size() < grammar.node_count()) seen_.resize(grammar.node_count(), 0);
  }

  // The parse whose frames below its top are `frames` (bottom first) goes on at `node`.
  void follow(const uint32_t* frames, uint32_t depth, uint32_t node) {
    // Each level of this stack is a context of its own: one link per frame, whose context is
    // the one its node resumes in.
    const uint32_t base = contexts(depth + 1);
    uint32_t below = kNoLink;
    for (uint32_t level = 0; level < depth; ++level) {
      links_.push_back({frames[level], base + level, below});
      below = uint32_t(links_.size() - 1);
    }
    work_.push_back({node, base + depth, below, depth});
    while (!work_.empty()) {
      const Step step = work_.back();
      work_.pop_back();
      visit(step);
    }
  }

  bool complete() const { return complete_; }

 private:
  static constexpr uint32_t kNoLink = UINT32_MAX;
  struct Link {
    uint32_t node;     // where the caller goes on
    uint32_t context;  // the context it goes on in
    uint32_t below;    // the link under it
  };
  struct Step {
    uint32_t node;
    uint32_t context;
    uint32_t link;   // the frame under the node (kNoLink: none)
    uint32_t depth;  // frames under the node
  };

  // `count` fresh context numbers; 0 is never one, so a node never met reads as unseen.
  uint32_t contexts(uint32_t count) {
    if (next_context_ > UINT32_MAX - count) {
      std::fill(seen_.begin(), seen_.end(), 0);
      calls_.clear();  // their contexts are numbers that will come again
      next_context_ = 1;
    }
    next_context_ += count;
    return next_context_ - count;
  }

  void visit(const Step& step) {
    if (++steps_ > GrammarPrefix::kMaxSteps)
      throw GrammarError("the grammar is too complex to follow: one character takes more than " +
                         std::to_string(GrammarPrefix::kMaxSteps) + " steps");
    if (seen_[step.node] == step.context) return;
    seen_[step.node] = step.context;
    const Grammar::Node& node = grammar_->node(step.node);
    switch (node.kind) {
      case Grammar::NodeKind::Char:
        // Only where the parse can still finish within the bound on open calls.
        if (step.depth + 1 + node.need <= Grammar::kMaxDepth) emit(step);
        return;
      case Grammar::NodeKind::Split:
        for (uint32_t to : grammar_->alternatives(node))
          work_.push_back({to, step.context, step.link, step.depth});
        return;
      case Grammar::NodeKind::Call: {
        const uint32_t start = grammar_->rule_start(node.target);
        if (node.next == Grammar::kReturn) {  // a last call: the callee takes the frame over
          work_.push_back({start, step.context, step.link, step.depth});
          return;
        }
        if (step.depth + 1 + grammar_->node(node.next).need > Grammar::kMaxDepth) return;
        const auto [call, added] =
            calls_.try_emplace(uint64_t(node.next) << 32 | step.context, Callee{});
        if (added) {
          links_.push_back({node.next, step.context, step.link});
          call->second = {contexts(1), uint32_t(links_.size() - 1)};
        }
        work_.push_back({start, call->second.context, call->second.link, step.depth + 1});
        return;
      }
      case Grammar::NodeKind::Return:
        if (step.link == kNoLink) {
          emit_end();
          return;
        }
        const Link& caller = links_[step.link];
        work_.push_back({caller.node, caller.context, caller.below, step.depth - 1});
        return;
    }
  }

  // The parse at a Char node, written out and kept unless it is one already.
  void emit(const Step& step) {
    std::vector<uint32_t>& out = *out_;
    const size_t at = out.size();
    out.resize(at + step.depth + 2);
    out[at] = step.depth + 1;
    out[at + step.depth + 1] = step.node;
    uint32_t link = step.link;
    for (size_t level = step.depth; level > 0; --level, link = links_[link].below)
      out[at + level] = links_[link].node;
    keep_if_new(at);
  }

  void emit_end() {
    if (complete_) return;
    complete_ = true;
    out_->push_back(0);
    keep_if_new(out_->size() - 1);
  }

  void keep_if_new(size_t at) {
    std::vector<uint32_t>& out = *out_;
    const size_t length = out[at] + 1;
    size_t parses = 1;
    for (size_t other = 0; other < at; other += out[other] + 1, ++parses) {
      if (out[other] + 1 == length &&
          std::equal(out.begin() + ptrdiff_t(other), out.begin() + ptrdiff_t(other + length),
                     out.begin() + ptrdiff_t(at))) {
        out.resize(at);
        return;
      }
    }
    if (parses > GrammarPrefix::kMaxParses)
      throw GrammarError("the grammar is too ambiguous to follow: the text so far has more than " +
                         std::to_string(GrammarPrefix::kMaxParses) + " parses that go on apart");
  }

  const Grammar* grammar_ = nullptr;
  std::vector<uint32_t>* out_ = nullptr;
  std::vector<Link> links_;
  std::vector<Step> work_;
  std::vector<uint32_t> seen_;  // per node: the context it was last met in
  // The callee of each call followed: by the node it returns to and the caller's context.
  struct Callee {
    uint32_t context = 0;
    uint32_t link = 0;
  };
  std::unordered_map<uint64_t, Callee> calls_;
  uint32_t next_context_ = 1;
  size_t steps_ = 0;
  bool complete_ = false;
};

// What taking a character made of a state, remembered per thread: guided decoding's mask feeds
// the same few states the same characters over and over (inside a string nearly every byte of
// every token takes the state back to itself), and finding the answer costs less than following
// the parses again. A direct-mapped table; small states only, so it stays within a few MiB.
class TakenMemo {
 public:
  static constexpr size_t kEntries = 4096;
  static constexpr size_t kMostHeld = 64;  // a state or result longer (in uint32s) is not kept

  struct Entry {
    uint64_t grammar = 0;  // Grammar::id(); 0: empty
    uint32_t code = 0;
    bool complete = false;
    uint64_t before_hash = 0;
    uint64_t after_hash = 0;
    std::vector<uint32_t> before;
    std::vector<uint32_t> after;
  };

  // The entry for this step, kept or not; `hash` is the state's (GrammarPrefix keeps it).
  Entry& slot(uint64_t grammar, uint32_t code, uint64_t hash) {
    const uint64_t mixed =
        (hash ^ (grammar * 0x9E3779B97F4A7C15ull) ^ code) * 0xFF51AFD7ED558CCDull;
    return entries_[(mixed >> 32) % kEntries];
  }
  static bool holds(const Entry& entry, uint64_t grammar, uint32_t code, uint64_t hash,
                    const std::vector<uint32_t>& before) {
    return entry.grammar == grammar && entry.code == code && entry.before_hash == hash &&
           entry.before == before;
  }

 private:
  std::vector<Entry> entries_ = std::vector<Entry>(kEntries);
};

// One each per thread: guided decoding follows characters for many copies of a state, and the
// work space is as large as a grammar's graph.
thread_local Closure closure;
thread_local std::vector<uint32_t> followed;
thread_local TakenMemo memo;

uint64_t hash_of(const std::vector<uint32_t>& parses) {
  uint64_t hash = 0xCBF29CE484222325ull;
  for (uint32_t word : parses) hash = (hash ^ word) * 0x100000001B3ull;
  return hash;
}

// The fewest and most code points of a UTF-8 length.
constexpr uint32_t kLeast[] = {0, 0, 0x80, 0x800, 0x10000};
constexpr uint32_t kMost[] = {0, 0x7F, 0x7FF, 0xFFFF, kMaxCodePoint};

}  // namespace

GrammarPrefix::GrammarPrefix(const Grammar& grammar) : grammar_(&grammar) {
  closure.begin(grammar, followed);
  closure.follow(nullptr, 0, grammar.start());
  parses_.swap(followed);
  hash_ = hash_of(parses_);
  complete_ = closure.complete();
}

bool GrammarPrefix::feed(uint8_t byte) {
  if (remaining_ == 0) {
    if (byte < 0x80) return take(byte);
    length_ = byte >= 0xF8 ? 0 : byte >= 0xF0 ? 4 : byte >= 0xE0 ? 3 : byte >= 0xC0 ? 2 : 0;
    if (length_ == 0) return false;
    remaining_ = uint8_t(length_ - 1);
    code_ = byte & (0x7Fu >> length_);
    return narrow();
  }
  if (!is_continuation_byte(char(byte))) return false;
  code_ = (code_ << 6) | (byte & 0x3Fu);
  if (--remaining_ > 0) return narrow();
  return code_ >= kLeast[length_] && take(code_);
}

// A character begun: the parses whose next character can begin with these bytes.
bool GrammarPrefix::narrow() {
  const uint32_t shift = 6u * remaining_;
  const uint32_t lo = std::max(code_ << shift, kLeast[length_]);
  const uint32_t hi = std::min((code_ << shift) | ((1u << shift) - 1), kMost[length_]);
  if (lo > hi) return false;  // an overlong form, or past the last code point
  size_t kept = 0;
  size_t next = 0;
  for (size_t at = 0; at < parses_.size(); at = next) {
    const uint32_t frames = parses_[at];
    next = at + frames + 1;  // read now: moving a kept parse forward may write over parses_[at]
    if (frames == 0 || !grammar_->intersects(grammar_->node(parses_[at + frames]).target, lo, hi))
      continue;
    std::copy(parses_.begin() + ptrdiff_t(at), parses_.begin() + ptrdiff_t(at + frames + 1),
              parses_.begin() + ptrdiff_t(kept));
    kept += frames + 1;
  }
  parses_.resize(kept);
  hash_ = hash_of(parses_);
  complete_ = false;
  return kept != 0;
}

// A whole character: every parse that takes it goes on past it.
bool GrammarPrefix::take(uint32_t code) {
  TakenMemo::Entry& entry = memo.slot(grammar_->id(), code, hash_);
  if (TakenMemo::holds(entry, grammar_->id(), code, hash_, parses_)) {
    parses_ = entry.after;
    hash_ = entry.after_hash;
    complete_ = entry.complete;
    return !parses_.empty();
  }
  const bool keep = parses_.size() <= TakenMemo::kMostHeld;
  if (keep) {
    entry.grammar = 0;  // empty until the step is whole: follow() may throw
    entry.before = parses_;
    entry.before_hash = hash_;
  }
  follow(code);
  if (keep && parses_.size() <= TakenMemo::kMostHeld) {
    entry.grammar = grammar_->id();
    entry.code = code;
    entry.complete = complete_;
    entry.after = parses_;
    entry.after_hash = hash_;
  }
  return !parses_.empty();
}

void GrammarPrefix::follow(uint32_t code) {
  closure.begin(*grammar_, followed);
  for (size_t at = 0; at < parses_.size(); at += parses_[at] + 1) {
    const uint32_t frames = parses_[at];
    if (frames == 0) continue;
    const Grammar::Node& top = grammar_->node(parses_[at + frames]);
    if (grammar_->contains(top.target, code))
      closure.follow(parses_.data() + at + 1, frames - 1, top.next);
  }
  parses_.swap(followed);
  hash_ = hash_of(parses_);
  complete_ = closure.complete();
}

}  // namespace pipeline
