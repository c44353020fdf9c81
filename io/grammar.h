// guided_grammar (and llama.cpp's `grammar`): a GBNF grammar (io/grammar_syntax.h) compiled into
// a graph GrammarPrefix (io/grammar_prefix.h) follows a character at a time. Each rule's body
// becomes nodes: a character from a set, a call of a rule, a choice among nodes, and the one
// return that ends every rule; repetitions are copies and loops of what they repeat.
//
// A grammar is refused (GrammarError) where following it could loop or paint an answer into a
// corner: a rule that can come back to itself before writing a character (left recursion, which
// llama.cpp refuses too: it would call itself forever), and a rule reachable from root that
// derives no finite text (each of its ways goes on forever, e.g. `a ::= "x" a`). So every prefix
// GrammarPrefix accepts can be finished into a text root derives. A grammar whose only text is
// empty is held: the answer is then empty, as with a regex that matches only the empty text.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "io/grammar_syntax.h"

namespace pipeline {

class Grammar {
 public:
  // A grammar's text may be at most this long (as a regex's): what is built grows with it.
  static constexpr size_t kMaxTextBytes = 65536;
  // The compiled graph holds at most this many nodes and choices' alternatives (repetitions
  // copy what they repeat: "x"{1000}{1000} would be a million), a few MiB at most.
  static constexpr size_t kMaxNodes = 200000;
  // A parse holds at most this many rule calls open at once (a rule that calls another before
  // its own end keeps a frame for where to go on). Deeper nesting is refused byte by byte, never
  // at a dead end: a parse is followed only where it can still finish within the bound, as JSON
  // mode bounds JSON's nesting. A grammar whose shortest text already needs more is refused.
  static constexpr uint32_t kMaxDepth = 64;

  // Throws GrammarError: a syntax error (with its line and column), an undefined rule, no root,
  // left recursion or a rule deriving no finite text (naming the rule), or a limit passed.
  static std::shared_ptr<const Grammar> from_gbnf(std::string_view text);

  enum class NodeKind : uint8_t {
    Char,    // one character from set `target`, then `next`
    Call,    // the text of rule `target`, then `next`
    Split,   // any of the `count` nodes at alternatives()[target...]
    Return,  // the end of a rule
  };
  struct Node {
    NodeKind kind = NodeKind::Return;
    uint32_t target = 0;
    uint32_t next = 0;
    uint32_t count = 0;
    // The fewest calls open at once above this node's own frame on any way from it to its rule's
    // end (kNever: there is none), so a parse can tell whether it can still finish.
    uint32_t need = 0;
  };
  static constexpr uint32_t kReturn = 0;  // the node every rule ends at
  static constexpr uint32_t kNever = UINT32_MAX;

  const Node& node(uint32_t index) const { return nodes_[index]; }
  size_t node_count() const { return nodes_.size(); }
  std::span<const uint32_t> alternatives(const Node& split) const {
    return {alternatives_.data() + split.target, split.count};
  }
  uint32_t rule_start(uint32_t rule) const { return rule_starts_[rule]; }
  uint32_t start() const { return rule_starts_[root_]; }
  // Unique among the grammars this process makes (an address can be reused once one is freed):
  // what GrammarPrefix's per-thread memory of steps is keyed by.
  uint64_t id() const { return id_; }

  // Whether set `set` holds `code`; whether it holds any of lo..hi.
  bool contains(uint32_t set, uint32_t code) const {
    const CharSet& s = sets_[set];
    if (code < 128) return (s.ascii[code >> 6] >> (code & 63)) & 1;
    return intersects(set, code, code);
  }
  bool intersects(uint32_t set, uint32_t lo, uint32_t hi) const;

 private:
  friend class GrammarCompiler;
  Grammar();

  struct CharSet {
    uint64_t ascii[2] = {};  // its code points below 128, as bits
    uint32_t first = 0;      // its ranges: ranges_[first, first + count)
    uint32_t count = 0;
  };

  std::vector<Node> nodes_;
  std::vector<uint32_t> alternatives_;
  std::vector<CharSet> sets_;
  std::vector<CodePointRange> ranges_;
  std::vector<uint32_t> rule_starts_;
  uint32_t root_ = 0;
  uint64_t id_;
};

}  // namespace pipeline
