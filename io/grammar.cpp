#include "io/grammar.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <string>

#include "io/grammar_prefix.h"

namespace pipeline {

// Builds a Grammar's graph from the parsed rules, then checks it. Nodes are built backwards,
// each from the node that follows it, so every rule's body ends at the one Grammar::kReturn.
class GrammarCompiler {
 public:
  explicit GrammarCompiler(const GrammarSyntax& syntax, Grammar& grammar)
      : syntax_(syntax), grammar_(grammar), set_of_expr_(syntax.exprs.size(), kNone) {}

  void compile() {
    grammar_.nodes_.push_back({});  // kReturn
    grammar_.root_ = uint32_t(syntax_.root);
    for (const GrammarRule& rule : syntax_.rules)
      grammar_.rule_starts_.push_back(build(rule.body, Grammar::kReturn));
    grammar_.nodes_.shrink_to_fit();
    grammar_.alternatives_.shrink_to_fit();
    const std::vector<bool> reachable = reachable_rules();
    refuse_left_recursion(reachable);
    compute_needs();
    refuse_endless_rules(reachable);
  }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;

  std::string name(size_t rule) const { return syntax_.rules[rule].name; }

  uint32_t add(const Grammar::Node& node) {
    if (grammar_.nodes_.size() + grammar_.alternatives_.size() >= Grammar::kMaxNodes)
      throw GrammarError("the grammar is too large: it compiles to more than " +
                         std::to_string(Grammar::kMaxNodes) + " nodes");
    grammar_.nodes_.push_back(node);
    return uint32_t(grammar_.nodes_.size() - 1);
  }
  // A choice with room for `count` alternatives, filled in by the caller.
  uint32_t add_split(uint32_t count) {
    Grammar::Node split{Grammar::NodeKind::Split, uint32_t(grammar_.alternatives_.size()), 0, count,
                        0};
    grammar_.alternatives_.resize(grammar_.alternatives_.size() + count);
    return add(split);
  }
  void set_alternative(uint32_t split, uint32_t i, uint32_t to) {
    grammar_.alternatives_[grammar_.nodes_[split].target + i] = to;
  }

  // The nodes that write expr `index` and then go on to `next`; returns the first.
  uint32_t build(int index, uint32_t next) {
    const GrammarExpr& expr = syntax_.exprs[size_t(index)];
    switch (expr.kind) {
      case GrammarExpr::Kind::Set:
        return add({Grammar::NodeKind::Char, set_of(index), next, 0, 0});
      case GrammarExpr::Kind::Concat:
        for (auto child = expr.children.rbegin(); child != expr.children.rend(); ++child)
          next = build(*child, next);
        return next;
      case GrammarExpr::Kind::Alternation: {
        std::vector<uint32_t> branches;
        for (int child : expr.children) branches.push_back(build(child, next));
        const uint32_t split = add_split(uint32_t(branches.size()));
        for (uint32_t i = 0; i < branches.size(); ++i) set_alternative(split, i, branches[i]);
        return split;
      }
      case GrammarExpr::Kind::Repeat:
        return repeat(expr, next);
      case GrammarExpr::Kind::Rule:
        return add({Grammar::NodeKind::Call, uint32_t(expr.rule), next, 0, 0});
    }
    throw GrammarError("unknown grammar expression");
  }

  // min copies one after another, then a loop (unbounded) or max - min nested optional copies:
  // x{1,3} is x (x (x)?)?.
  uint32_t repeat(const GrammarExpr& expr, uint32_t next) {
    const int body = expr.children[0];
    uint32_t rest = next;
    if (expr.max == GrammarExpr::kUnbounded) {
      rest = add_split(2);
      set_alternative(rest, 0, build(body, rest));
      set_alternative(rest, 1, next);
    } else {
      for (int i = expr.min; i < expr.max; ++i) {
        const uint32_t copy = build(body, rest);
        rest = add_split(2);
        set_alternative(rest, 0, copy);
        set_alternative(rest, 1, next);
      }
    }
    for (int i = 0; i < expr.min; ++i) rest = build(body, rest);
    return rest;
  }

  // A Set expression's set, made once however often repetitions copy it.
  uint32_t set_of(int index) {
    uint32_t& set = set_of_expr_[size_t(index)];
    if (set != kNone) return set;
    Grammar::CharSet chars;
    chars.first = uint32_t(grammar_.ranges_.size());
    for (const CodePointRange& range : syntax_.exprs[size_t(index)].ranges) {
      grammar_.ranges_.push_back(range);
      for (uint32_t code = range.lo; code <= std::min(range.hi, 127u); ++code)
        chars.ascii[code >> 6] |= uint64_t(1) << (code & 63);
    }
    chars.count = uint32_t(grammar_.ranges_.size()) - chars.first;
    grammar_.sets_.push_back(chars);
    set = uint32_t(grammar_.sets_.size() - 1);
    return set;
  }

  // Each node's successors, as the checks below walk them: a call goes on to its rule's start
  // and to what follows it.
  template <class Visit>
  void successors(uint32_t index, Visit&& visit) const {
    const Grammar::Node& node = grammar_.nodes_[index];
    switch (node.kind) {
      case Grammar::NodeKind::Char:
        visit(node.next);
        return;
      case Grammar::NodeKind::Call:
        visit(grammar_.rule_starts_[node.target]);
        visit(node.next);
        return;
      case Grammar::NodeKind::Split:
        for (uint32_t to : grammar_.alternatives(node)) visit(to);
        return;
      case Grammar::NodeKind::Return:
        return;
    }
  }

  // The rules root's text can use.
  std::vector<bool> reachable_rules() const {
    std::vector<bool> seen_node(grammar_.nodes_.size());
    std::vector<bool> reachable(syntax_.rules.size());
    std::vector<uint32_t> stack{grammar_.start()};
    reachable[grammar_.root_] = true;
    seen_node[grammar_.start()] = true;
    while (!stack.empty()) {
      const uint32_t index = stack.back();
      stack.pop_back();
      const Grammar::Node& node = grammar_.nodes_[index];
      if (node.kind == Grammar::NodeKind::Call) reachable[node.target] = true;
      successors(index, [&](uint32_t to) {
        if (seen_node[to]) return;
        seen_node[to] = true;
        stack.push_back(to);
      });
    }
    return reachable;
  }

  // Left recursion: a rule that can call itself again, through any rules, before writing a
  // character. A parse would push frames for it forever.
  void refuse_left_recursion(const std::vector<bool>& reachable) const {
    // Whether each node can reach its rule's end writing nothing (0) or not (kNever).
    const std::vector<uint32_t> nullable = fixed_point([&](const Grammar::Node& node, auto value) {
      switch (node.kind) {
        case Grammar::NodeKind::Char:
          return Grammar::kNever;
        case Grammar::NodeKind::Call:
          return std::max(value(grammar_.rule_starts_[node.target]), value(node.next));
        default:
          return least_alternative(node, value);
      }
    });
    const size_t rules = syntax_.rules.size();
    // calls[r]: the rules r can call before writing anything.
    std::vector<std::vector<uint32_t>> calls(rules);
    std::vector<uint32_t> seen(grammar_.nodes_.size(), kNone);
    for (uint32_t rule = 0; rule < rules; ++rule) {
      if (!reachable[rule]) continue;
      std::vector<uint32_t> stack{grammar_.rule_starts_[rule]};
      seen[stack[0]] = rule;
      while (!stack.empty()) {
        const Grammar::Node& node = grammar_.nodes_[stack.back()];
        stack.pop_back();
        const auto go = [&](uint32_t to) {
          if (seen[to] == rule) return;
          seen[to] = rule;
          stack.push_back(to);
        };
        if (node.kind == Grammar::NodeKind::Split) {
          for (uint32_t to : grammar_.alternatives(node)) go(to);
        } else if (node.kind == Grammar::NodeKind::Call) {
          calls[rule].push_back(node.target);
          if (nullable[grammar_.rule_starts_[node.target]] == 0) go(node.next);
        }
      }
    }
    // A depth-first search over those calls; an edge back to a rule on the path closes a cycle.
    enum : uint8_t { kUnvisited, kOnPath, kDone };
    std::vector<uint8_t> state(rules, kUnvisited);
    for (uint32_t first = 0; first < rules; ++first) {
      if (!reachable[first] || state[first] != kUnvisited) continue;
      std::vector<std::pair<uint32_t, size_t>> path{{first, 0}};  // rule, next call to try
      state[first] = kOnPath;
      while (!path.empty()) {
        auto& [rule, next_call] = path.back();
        if (next_call == calls[rule].size()) {
          state[rule] = kDone;
          path.pop_back();
          continue;
        }
        const uint32_t callee = calls[rule][next_call++];
        if (state[callee] == kOnPath) throw left_recursion(path, callee);
        if (state[callee] == kUnvisited) {
          state[callee] = kOnPath;
          path.push_back({callee, 0});
        }
      }
    }
  }

  GrammarError left_recursion(const std::vector<std::pair<uint32_t, size_t>>& path,
                              uint32_t rule) const {
    std::string cycle;
    bool on_cycle = false;
    for (const auto& [step, unused] : path) {
      on_cycle = on_cycle || step == rule;
      if (!on_cycle) continue;
      cycle += name(step);
      cycle += " -> ";
    }
    cycle += name(rule);
    return GrammarError("rule " + name(rule) +
                        " is left-recursive: it can come back to itself before writing a "
                        "character (" +
                        cycle + "), which would never end");
  }

  // Per node, the least value `evaluate` (of the node and its successors' values) settles on,
  // from kNever down and 0 at kReturn: a worklist over each node's predecessors, so a value
  // is evaluated again only when one it depends on has fallen.
  template <class Evaluate>
  std::vector<uint32_t> fixed_point(Evaluate&& evaluate) const {
    const size_t count = grammar_.nodes_.size();
    std::vector<std::vector<uint32_t>> predecessors(count);
    for (uint32_t index = 0; index < count; ++index)
      successors(index, [&](uint32_t to) { predecessors[to].push_back(index); });
    std::vector<uint32_t> values(count, Grammar::kNever);
    values[Grammar::kReturn] = 0;
    const auto value = [&](uint32_t index) { return values[index]; };
    std::deque<uint32_t> work(predecessors[Grammar::kReturn].begin(),
                              predecessors[Grammar::kReturn].end());
    while (!work.empty()) {
      const uint32_t index = work.front();
      work.pop_front();
      const uint32_t now = evaluate(grammar_.nodes_[index], value);
      if (now >= values[index]) continue;
      values[index] = now;
      work.insert(work.end(), predecessors[index].begin(), predecessors[index].end());
    }
    return values;
  }

  template <class Value>
  uint32_t least_alternative(const Grammar::Node& split, Value&& value) const {
    uint32_t least = Grammar::kNever;
    for (uint32_t to : grammar_.alternatives(split)) least = std::min(least, value(to));
    return least;
  }

  // Node::need: the fewest calls open at once on the way to the rule's end.
  void compute_needs() {
    const std::vector<uint32_t> needs = fixed_point([&](const Grammar::Node& node, auto value) {
      switch (node.kind) {
        case Grammar::NodeKind::Char:
          return value(node.next);
        case Grammar::NodeKind::Call: {
          const uint32_t callee = value(grammar_.rule_starts_[node.target]);
          if (node.next == Grammar::kReturn) return callee;  // the callee takes the frame over
          if (callee == Grammar::kNever || value(node.next) == Grammar::kNever)
            return Grammar::kNever;
          return std::max(callee + 1, value(node.next));
        }
        default:
          return least_alternative(node, value);
      }
    });
    for (size_t index = 0; index < needs.size(); ++index)
      grammar_.nodes_[index].need = needs[index];
  }

  void refuse_endless_rules(const std::vector<bool>& reachable) const {
    std::string endless;
    int count = 0;
    for (size_t rule = 0; rule < syntax_.rules.size(); ++rule) {
      if (!reachable[rule] || grammar_.nodes_[grammar_.rule_starts_[rule]].need != Grammar::kNever)
        continue;
      if (count++ > 0) endless += ", ";
      endless += name(rule);
    }
    if (count > 0)
      throw GrammarError((count == 1 ? "rule " : "rules ") + endless +
                         (count == 1 ? " derives" : " derive") +
                         " no finite text: each of their ways goes on forever");
    if (grammar_.nodes_[grammar_.start()].need + 1 > Grammar::kMaxDepth)
      throw GrammarError("root's shortest text needs more than " +
                         std::to_string(Grammar::kMaxDepth) + " rule calls open at once");
  }

  const GrammarSyntax& syntax_;
  Grammar& grammar_;
  std::vector<uint32_t> set_of_expr_;
};

Grammar::Grammar() {
  static std::atomic<uint64_t> made{0};
  id_ = ++made;
}

std::shared_ptr<const Grammar> Grammar::from_gbnf(std::string_view text) {
  if (text.size() > kMaxTextBytes)
    throw GrammarError("the grammar is " + std::to_string(text.size()) + " bytes; at most " +
                       std::to_string(kMaxTextBytes) + " are held");
  const GrammarSyntax syntax = parse_grammar(text);
  std::shared_ptr<Grammar> grammar(new Grammar);
  GrammarCompiler(syntax, *grammar).compile();
  GrammarPrefix start(*grammar);  // refuses a grammar whose start already passes its limits
  return grammar;
}

bool Grammar::intersects(uint32_t set, uint32_t lo, uint32_t hi) const {
  const CharSet& s = sets_[set];
  const CodePointRange* begin = ranges_.data() + s.first;
  const CodePointRange* end = begin + s.count;
  const CodePointRange* range = std::lower_bound(
      begin, end, lo, [](const CodePointRange& r, uint32_t code) { return r.hi < code; });
  return range != end && range->lo <= hi;
}

}  // namespace pipeline
