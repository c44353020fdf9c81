#include "io/text_pattern.h"

#include <algorithm>
#include <array>
#include <map>

namespace pipeline {
namespace {

// Bytes lo..hi, both included.
struct ByteRange {
  uint8_t lo;
  uint8_t hi;
};

// The UTF-8 encodings of the code points lo..hi (surrogates left out), as sequences of byte
// ranges: every byte string one sequence admits, position by position, encodes a code point in
// the range, and each such code point has its one string. The range is split until each piece
// shares its encoding's length and, at each continuation byte, either agrees on every bit above
// it or spans the whole of it.
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<ByteRange>>& out) {
  if (lo <= 0xDFFF && hi >= 0xD800) {
    if (lo < 0xD800) utf8_sequences(lo, 0xD7FF, out);
    if (hi > 0xDFFF) utf8_sequences(0xE000, hi, out);
    return;
  }
  for (uint32_t longest : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= longest && hi > longest) {
      utf8_sequences(lo, longest, out);
      utf8_sequences(longest + 1, hi, out);
      return;
    }
  }
  const int length = hi < 0x80 ? 1 : hi < 0x800 ? 2 : hi < 0x10000 ? 3 : 4;
  for (int i = 1; i < length; ++i) {
    const uint32_t low_bits = (1u << (6 * i)) - 1;
    if ((lo & ~low_bits) == (hi & ~low_bits)) continue;
    if ((lo & low_bits) != 0) {
      utf8_sequences(lo, lo | low_bits, out);
      utf8_sequences((lo | low_bits) + 1, hi, out);
      return;
    }
    if ((hi & low_bits) != low_bits) {
      utf8_sequences(lo, (hi & ~low_bits) - 1, out);
      utf8_sequences(hi & ~low_bits, hi, out);
      return;
    }
  }
  const auto encode = [length](uint32_t code) {
    std::array<uint8_t, 4> bytes{};
    static constexpr uint8_t kLead[] = {0, 0, 0xC0, 0xE0, 0xF0};
    for (int k = length - 1; k > 0; --k, code >>= 6)
      bytes[size_t(k)] = uint8_t(0x80 | (code & 0x3F));
    bytes[0] = uint8_t(kLead[length] | code);
    return bytes;
  };
  const std::array<uint8_t, 4> first = encode(lo);
  const std::array<uint8_t, 4> last = encode(hi);
  std::vector<ByteRange> sequence;
  for (int k = 0; k < length; ++k) sequence.push_back({first[size_t(k)], last[size_t(k)]});
  out.push_back(std::move(sequence));
}

// A nondeterministic automaton over bytes with empty moves (Thompson's construction), built
// from the tree; the subset construction below makes it deterministic.
class Nfa {
 public:
  // The tree's automaton can be far larger than its text ({n,m} copies what it repeats).
  static constexpr size_t kMaxStates = 200000;

  explicit Nfa(const RegexTree& tree) {
    const Fragment whole = build(tree, tree.root);
    start_ = whole.start;
    accept_ = whole.end;
  }

  struct Edge {
    ByteRange bytes;
    int to;
  };
  struct State {
    std::vector<int> empty;  // empty moves
    std::vector<Edge> edges;
  };
  const std::vector<State>& states() const { return states_; }
  int start() const { return start_; }
  int accept() const { return accept_; }

 private:
  struct Fragment {
    int start;
    int end;
  };

  int add_state() {
    if (states_.size() == kMaxStates)
      throw TextPatternError("the pattern is too large: it comes to more than " +
                             std::to_string(kMaxStates) + " automaton states");
    states_.emplace_back();
    return int(states_.size()) - 1;
  }
  void empty_move(int from, int to) { states_[size_t(from)].empty.push_back(to); }

  Fragment build(const RegexTree& tree, int index) {
    const RegexNode& node = tree.nodes[size_t(index)];
    switch (node.kind) {
      case RegexNode::Kind::Set:
        return character(node.ranges);
      case RegexNode::Kind::Concat: {
        const int start = add_state();
        int end = start;
        for (int child : node.children) {
          const Fragment part = build(tree, child);
          empty_move(end, part.start);
          end = part.end;
        }
        return {start, end};
      }
      case RegexNode::Kind::Alternation: {
        const Fragment whole{add_state(), add_state()};
        for (int child : node.children) {
          const Fragment branch = build(tree, child);
          empty_move(whole.start, branch.start);
          empty_move(branch.end, whole.end);
        }
        return whole;
      }
      case RegexNode::Kind::Repeat:
        return repeat(tree, node);
    }
    throw TextPatternError("unknown regex node");
  }

  Fragment character(const std::vector<CodePointRange>& ranges) {
    const Fragment whole{add_state(), add_state()};
    std::vector<std::vector<ByteRange>> sequences;
    for (const CodePointRange& range : ranges) utf8_sequences(range.lo, range.hi, sequences);
    for (const std::vector<ByteRange>& sequence : sequences) {
      int from = whole.start;
      for (size_t k = 0; k < sequence.size(); ++k) {
        const int to = k + 1 == sequence.size() ? whole.end : add_state();
        states_[size_t(from)].edges.push_back({sequence[k], to});
        from = to;
      }
    }
    return whole;
  }

  // min copies one after another, then either a loop (unbounded) or max - min copies each of
  // which may be skipped to the end.
  Fragment repeat(const RegexTree& tree, const RegexNode& node) {
    const int child = node.children[0];
    const int start = add_state();
    int end = start;
    for (int i = 0; i < node.min; ++i) {
      const Fragment copy = build(tree, child);
      empty_move(end, copy.start);
      end = copy.end;
    }
    if (node.max == RegexNode::kUnbounded) {
      const Fragment loop = build(tree, child);
      const int after = add_state();
      empty_move(end, loop.start);
      empty_move(end, after);
      empty_move(loop.end, loop.start);
      empty_move(loop.end, after);
      return {start, after};
    }
    const int after = add_state();
    for (int i = node.min; i < node.max; ++i) {
      const Fragment copy = build(tree, child);
      empty_move(end, copy.start);
      empty_move(end, after);
      end = copy.end;
    }
    empty_move(end, after);
    return {start, after};
  }

  std::vector<State> states_;
  int start_ = 0;
  int accept_ = 0;
};

// The subset construction's steps: the states a set reaches by empty moves, and by each byte
// class. Marks are stamped per call, so no step clears or allocates a table the size of the Nfa.
class SubsetSteps {
 public:
  // The work the construction may do, in Nfa states visited: a pattern that needs more is
  // refused rather than left to hold a request thread for seconds.
  static constexpr size_t kMaxVisits = 10'000'000;

  explicit SubsetSteps(const Nfa& nfa) : nfa_(nfa), marks_(nfa.states().size(), 0) {}

  // Of `set` and the states it reaches by empty moves, those that tell a set's future: the ones
  // with edges, and the accepting state. Sorted, each once: two closures that keep the same
  // states are one state of the automaton.
  std::vector<int> closure(const std::vector<int>& set) {
    ++stamp_;
    std::vector<int> reached;
    for (int state : set) reach(state, reached);
    for (size_t next = 0; next < reached.size(); ++next)
      for (int to : nfa_.states()[size_t(reached[next])].empty) reach(to, reached);
    count(reached.size());
    std::erase_if(reached, [&](int state) {
      return nfa_.states()[size_t(state)].edges.empty() && state != nfa_.accept();
    });
    std::sort(reached.begin(), reached.end());
    return reached;
  }

  // Per byte class, the states `set`'s edges lead to on it (before empty moves); byte classes
  // are ranges of bytes in order, so an edge's classes are a range too.
  std::vector<std::vector<int>> moves(const std::vector<int>& set, const uint8_t* byte_class,
                                      int classes) {
    std::vector<std::vector<int>> moved(static_cast<size_t>(classes));
    for (int state : set)
      for (const Nfa::Edge& edge : nfa_.states()[size_t(state)].edges)
        for (int c = byte_class[edge.bytes.lo]; c <= byte_class[edge.bytes.hi]; ++c)
          moved[size_t(c)].push_back(edge.to);
    count(set.size());
    return moved;
  }

 private:
  void count(size_t visits) {
    visits_ += visits;
    if (visits_ > kMaxVisits)
      throw TextPatternError("the pattern is too complex: building its automaton takes more than " +
                             std::to_string(kMaxVisits / 1'000'000) + " million steps");
  }

  void reach(int state, std::vector<int>& reached) {
    if (marks_[size_t(state)] == stamp_) return;
    marks_[size_t(state)] = stamp_;
    reached.push_back(state);
  }

  const Nfa& nfa_;
  std::vector<uint32_t> marks_;  // per Nfa state: the stamp of the closure that reached it
  uint32_t stamp_ = 0;
  size_t visits_ = 0;
};

}  // namespace

std::shared_ptr<const TextPattern> TextPattern::from_regex(std::string_view pattern) {
  if (pattern.size() > kMaxTextBytes)
    throw TextPatternError("the pattern is " + std::to_string(pattern.size()) + " bytes; at most " +
                           std::to_string(kMaxTextBytes) + " are held");
  try {
    return std::shared_ptr<const TextPattern>(new TextPattern(parse_regex(pattern)));
  } catch (const RegexSyntaxError& e) {
    throw TextPatternError(e.what());
  }
}

std::shared_ptr<const TextPattern> TextPattern::from_choices(std::span<const std::string> texts) {
  if (texts.empty()) throw TextPatternError("there must be at least one choice");
  size_t bytes = 0;
  for (const std::string& text : texts) bytes += text.size();
  if (bytes > kMaxTextBytes)
    throw TextPatternError("the choices come to " + std::to_string(bytes) + " bytes; at most " +
                           std::to_string(kMaxTextBytes) + " are held");
  try {
    return std::shared_ptr<const TextPattern>(new TextPattern(literal_alternatives(texts)));
  } catch (const RegexSyntaxError& e) {
    throw TextPatternError(e.what());
  }
}

// The subset construction: each state of the automaton is the set of Nfa states its text can
// reach. Then the states from which no accepted text can be reached are dropped, and the rest
// renumbered from the start.
TextPattern::TextPattern(const RegexTree& tree) {
  const Nfa nfa(tree);
  // A byte where some edge's range begins or ends after begins a new class.
  std::array<bool, 257> boundary{};
  boundary[0] = true;
  for (const Nfa::State& state : nfa.states()) {
    for (const Nfa::Edge& edge : state.edges) {
      boundary[edge.bytes.lo] = true;
      boundary[size_t(edge.bytes.hi) + 1] = true;
    }
  }
  for (int byte = 0; byte < 256; ++byte) {
    if (boundary[size_t(byte)]) ++classes_;
    byte_class_[byte] = uint8_t(classes_ - 1);
  }

  SubsetSteps steps(nfa);
  // Each state's set once, as its key in `numbers` (a map's keys stay where they are).
  std::map<std::vector<int>, int32_t> numbers{{steps.closure({nfa.start()}), 0}};
  std::vector<const std::vector<int>*> sets{&numbers.begin()->first};
  std::vector<int32_t> rows;  // the unpruned table
  for (size_t current = 0; current < sets.size(); ++current) {
    for (std::vector<int>& moved : steps.moves(*sets[current], byte_class_, classes_)) {
      if (moved.empty()) {
        rows.push_back(kNoState);
        continue;
      }
      std::vector<int> next = steps.closure(moved);
      auto [it, added] = numbers.try_emplace(std::move(next), int32_t(sets.size()));
      if (added) {
        if (sets.size() == size_t(kMaxStates))
          throw TextPatternError("the pattern is too large: it needs more than " +
                                 std::to_string(kMaxStates) + " automaton states");
        sets.push_back(&it->first);
      }
      rows.push_back(it->second);
    }
  }

  // Live: an accepted text can still be reached. Found backwards from the accepting states.
  const size_t count = sets.size();
  std::vector<std::vector<int32_t>> sources(count);
  for (size_t state = 0; state < count; ++state)
    for (int c = 0; c < classes_; ++c)
      if (const int32_t to = rows[state * size_t(classes_) + size_t(c)]; to != kNoState)
        sources[size_t(to)].push_back(int32_t(state));
  std::vector<bool> accepts(count);
  for (size_t state = 0; state < count; ++state)
    accepts[state] = std::binary_search(sets[state]->begin(), sets[state]->end(), nfa.accept());
  std::vector<bool> live(count);
  std::vector<int32_t> stack;
  for (size_t state = 0; state < count; ++state) {
    if (accepts[state]) {
      live[state] = true;
      stack.push_back(int32_t(state));
    }
  }
  while (!stack.empty()) {
    const int32_t state = stack.back();
    stack.pop_back();
    for (int32_t from : sources[size_t(state)]) {
      if (live[size_t(from)]) continue;
      live[size_t(from)] = true;
      stack.push_back(from);
    }
  }
  if (!live[0]) throw TextPatternError("the pattern matches no text");

  std::vector<int32_t> renumbered(count, kNoState);
  int32_t next_number = 0;
  for (size_t state = 0; state < count; ++state)
    if (live[state]) renumbered[state] = next_number++;
  transitions_.reserve(size_t(next_number) * size_t(classes_));
  for (size_t state = 0; state < count; ++state) {
    if (!live[state]) continue;
    accepting_.push_back(accepts[state] ? 1 : 0);
    for (int c = 0; c < classes_; ++c) {
      const int32_t to = rows[state * size_t(classes_) + size_t(c)];
      transitions_.push_back(to == kNoState ? kNoState : renumbered[size_t(to)]);
    }
  }
}

}  // namespace pipeline
