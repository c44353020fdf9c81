#include "io/grammar_syntax.h"

#include <algorithm>
#include <map>
#include <optional>

#include "io/utf8.h"

namespace pipeline {
namespace {

constexpr uint32_t kFirstSurrogate = 0xD800;
constexpr uint32_t kLastSurrogate = 0xDFFF;

// A class's code points less the surrogates, which no UTF-8 text holds: a set here is what an
// answer's characters can be.
std::vector<CodePointRange> without_surrogates(std::vector<CodePointRange> ranges) {
  std::vector<CodePointRange> out;
  for (const CodePointRange& range : normalized_ranges(std::move(ranges))) {
    if (range.hi < kFirstSurrogate || range.lo > kLastSurrogate) {
      out.push_back(range);
      continue;
    }
    if (range.lo < kFirstSurrogate) out.push_back({range.lo, kFirstSurrogate - 1});
    if (range.hi > kLastSurrogate) out.push_back({kLastSurrogate + 1, range.hi});
  }
  return out;
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '-';
}

// A recursive-descent parser over the grammar's bytes, after llama.cpp's:
//   grammar      := space* (rule)*
//   rule         := name '::=' alternatives (newline | end)
//   alternatives := sequence ('|' sequence)*
//   sequence     := (item quantifier*)*
class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  GrammarSyntax parse() {
    space(/*newlines=*/true);
    while (!ends()) rule();
    for (size_t r = 0; r < syntax_.rules.size(); ++r)
      if (syntax_.rules[r].body < 0)
        fail_at(first_use_[r], "rule " + syntax_.rules[r].name + " is used but never defined");
    const auto root = names_.find("root");
    if (root == names_.end())
      throw GrammarError("the grammar defines no rule root, the rule an answer is written from");
    syntax_.root = root->second;
    return std::move(syntax_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) { fail_at(at_, what); }
  [[noreturn]] void fail_at(size_t offset, const std::string& what) {
    const auto [line, column] = place(offset);
    std::string message = what;
    message += " at line ";
    message += std::to_string(line);
    message += ", column ";
    message += std::to_string(column);
    throw GrammarError(message);
  }
  // Line and column (from 1; columns count characters) of a byte offset, counted on from the
  // place asked for before when that lies before it: rules are placed in the order they are
  // written, so placing them all reads the text once, not once per rule.
  std::pair<int, int> place(size_t offset) {
    if (offset < placed_.offset) placed_ = Place{};
    for (; placed_.offset < offset; ++placed_.offset) {
      const char c = text_[placed_.offset];
      if (c == '\n') {
        ++placed_.line;
        placed_.column = 1;
      } else if (!is_continuation_byte(c)) {
        ++placed_.column;
      }
    }
    return {placed_.line, placed_.column};
  }
  // What stands at at_, for errors.
  std::string here() const {
    if (ends()) return "the end of the grammar";
    const char c = text_[at_];
    if (c == '\n' || c == '\r') return "a newline";
    if (uint8_t(c) < 0x20 || uint8_t(c) >= 0x7F) return "this character";
    return std::string("'") + c + "'";
  }

  bool ends() const { return at_ == text_.size(); }
  bool peek(char c) const { return at_ < text_.size() && text_[at_] == c; }

  // Spaces, tabs and comments; newlines too where a rule cannot end.
  void space(bool newlines) {
    while (!ends()) {
      const char c = text_[at_];
      if (c == '#') {
        while (!ends() && text_[at_] != '\n' && text_[at_] != '\r') ++at_;
      } else if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
        ++at_;
      } else {
        return;
      }
    }
  }

  void rule() {
    const size_t start = at_;
    const std::string name = this->name();
    rule_index(name, start);  // rules are numbered in the order they are first named
    space(/*newlines=*/false);
    if (text_.substr(at_, 3) != "::=") fail("expecting ::= after rule " + name + ", not " + here());
    at_ += 3;
    space(/*newlines=*/true);
    const int body = alternatives(/*nested=*/false);
    const bool carriage_return = peek('\r');  // "\r\n", or "\r" alone, ends a line too
    if (carriage_return) ++at_;
    if (peek('\n')) {
      ++at_;
    } else if (!carriage_return && !ends()) {
      if (peek('<')) fail("token references (<...>) are not held: a grammar here is over text");
      if (peek(')')) fail("a ')' closes no group");
      fail("expecting a newline or the end of the grammar after rule " + name + ", not " + here());
    }
    define(name, start, body);
    space(/*newlines=*/true);
  }

  std::string name() {
    const size_t start = at_;
    while (!ends() && is_name_char(text_[at_])) ++at_;
    if (at_ == start) fail("expecting a rule name, not " + here());
    return std::string(text_.substr(start, at_ - start));
  }

  int rule_index(const std::string& name, size_t used_at) {
    const auto [it, added] = names_.try_emplace(name, int(syntax_.rules.size()));
    if (added) {
      syntax_.rules.push_back(GrammarRule{name, -1, 0, 0});
      first_use_.push_back(used_at);
    }
    return it->second;
  }

  void define(const std::string& name, size_t start, int body) {
    GrammarRule& rule = syntax_.rules[size_t(rule_index(name, start))];
    if (rule.body >= 0)
      fail_at(start, "rule " + name + " is defined twice (first at line " +
                         std::to_string(rule.line) + ", column " + std::to_string(rule.column) +
                         ")");
    rule.body = body;
    std::tie(rule.line, rule.column) = place(start);
  }

  // A node, refused where it would nest too deep for the recursion that reads it.
  int add(GrammarExpr node, size_t start) {
    int height = 1;
    for (int child : node.children) height = std::max(height, heights_[size_t(child)] + 1);
    if (height > kMaxGrammarNesting)
      fail_at(start, "groups and quantifiers may nest at most " +
                         std::to_string(kMaxGrammarNesting) + " deep");
    syntax_.exprs.push_back(std::move(node));
    heights_.push_back(height);
    return int(syntax_.exprs.size()) - 1;
  }
  int set(std::vector<CodePointRange> ranges, size_t start) {
    GrammarExpr node;
    node.kind = GrammarExpr::Kind::Set;
    node.ranges = without_surrogates(std::move(ranges));
    if (node.ranges.empty()) fail_at(start, "the class matches no character");
    return add(std::move(node), start);
  }
  int gather(GrammarExpr::Kind kind, std::vector<int> children, size_t start) {
    if (children.size() == 1) return children[0];
    GrammarExpr node;
    node.kind = kind;
    node.children = std::move(children);
    return add(std::move(node), start);
  }

  int alternatives(bool nested) {
    const size_t start = at_;
    std::vector<int> branches{sequence(nested)};
    while (peek('|')) {
      ++at_;
      space(/*newlines=*/true);
      branches.push_back(sequence(nested));
    }
    return gather(GrammarExpr::Kind::Alternation, std::move(branches), start);
  }

  // Items one after another, each followed by spaces (newlines too, when nested in a group).
  int sequence(bool nested) {
    const size_t start = at_;
    std::vector<int> items;
    while (!ends()) {
      const size_t item_start = at_;
      const char c = text_[at_];
      if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (items.empty()) fail(std::string("nothing before '") + c + "' to repeat");
        items.back() = quantified(items.back(), nested);
      } else if (c == '"') {
        items.push_back(literal());
      } else if (c == '[') {
        items.push_back(character_class());
      } else if (c == '(') {
        items.push_back(group());
      } else if (c == '.') {
        ++at_;
        items.push_back(set({{0, kMaxCodePoint}}, item_start));
      } else if (is_name_char(c)) {
        GrammarExpr reference;
        reference.kind = GrammarExpr::Kind::Rule;
        reference.rule = rule_index(name(), item_start);
        items.push_back(add(std::move(reference), item_start));
      } else {
        break;
      }
      space(nested);
    }
    return gather(GrammarExpr::Kind::Concat, std::move(items), start);
  }

  int quantified(int item, bool nested) {
    const size_t start = at_;
    GrammarExpr node;
    node.kind = GrammarExpr::Kind::Repeat;
    node.children = {item};
    const char c = text_[at_++];
    node.min = c == '+' ? 1 : 0;
    node.max = c == '?' ? 1 : GrammarExpr::kUnbounded;
    if (c == '{') {
      space(nested);
      node.min = node.max = count();
      space(nested);
      if (peek(',')) {
        ++at_;
        space(nested);
        node.max = !ends() && is_digit(text_[at_]) ? count() : GrammarExpr::kUnbounded;
        space(nested);
      }
      if (!peek('}')) fail("expecting ',' or '}' in the repetition, not " + here());
      ++at_;
      if (node.max != GrammarExpr::kUnbounded && node.max < node.min)
        fail_at(start, "the repetition's most is below its least");
    }
    return add(std::move(node), start);
  }

  int count() {
    const size_t start = at_;
    if (ends() || !is_digit(text_[at_])) fail("expecting a count, not " + here());
    int value = 0;
    for (; !ends() && is_digit(text_[at_]); ++at_) {
      value = value * 10 + (text_[at_] - '0');
      if (value > kMaxGrammarRepeat)
        fail_at(start, "a repetition count may be at most " + std::to_string(kMaxGrammarRepeat));
    }
    return value;
  }

  int group() {
    const size_t start = at_++;
    if (++groups_open_ > kMaxGrammarNesting)
      fail_at(start, "groups and quantifiers may nest at most " +
                         std::to_string(kMaxGrammarNesting) + " deep");
    space(/*newlines=*/true);
    const int inner = alternatives(/*nested=*/true);
    if (ends()) fail_at(start, "the group opened here is not closed");
    if (!peek(')')) fail("expecting ')' or more of the group, not " + here());
    ++at_;
    --groups_open_;
    return inner;
  }

  int literal() {
    const size_t start = at_++;
    std::vector<int> characters;
    while (!peek('"')) {
      if (ends()) fail_at(start, "the string opened here is not closed");
      const size_t character_start = at_;
      const uint32_t code = character();
      characters.push_back(set({{code, code}}, character_start));
    }
    ++at_;
    return gather(GrammarExpr::Kind::Concat, std::move(characters), start);
  }

  int character_class() {
    const size_t start = at_++;
    const bool negated = peek('^');
    if (negated) ++at_;
    std::vector<CodePointRange> ranges;
    while (!peek(']')) {
      if (ends()) fail_at(start, "the class opened here is not closed");
      const size_t item_start = at_;
      CodePointRange range{character(), 0};
      range.hi = range.lo;
      if (peek('-') && at_ + 1 < text_.size() && text_[at_ + 1] != ']') {
        ++at_;
        range.hi = character();
        if (range.hi < range.lo) fail_at(item_start, "the range runs backwards");
      }
      ranges.push_back(range);
    }
    ++at_;
    if (ranges.empty()) fail_at(start, "an empty class matches no character");
    return set(negated ? complement_ranges(ranges) : ranges, start);
  }

  // One character of a literal or class: an escape, or a UTF-8 character as it stands.
  uint32_t character() {
    const size_t start = at_;
    if (peek('\\')) return escape();
    const std::optional<uint32_t> code = decode_utf8(text_, &at_);
    if (!code) fail_at(start, "the grammar is not valid UTF-8");
    return *code;
  }

  uint32_t escape() {
    const size_t start = at_++;
    if (ends()) fail_at(start, "the grammar ends in a backslash");
    const char c = text_[at_++];
    switch (c) {
      case 'x':
        return hex_code(start, 2);
      case 'u':
        return hex_code(start, 4);
      case 'U':
        return hex_code(start, 8);
      case 'n':
        return '\n';
      case 'r':
        return '\r';
      case 't':
        return '\t';
      case '\\':
      case '"':
      case '[':
      case ']':
        return uint8_t(c);
      default:
        --at_;
        fail_at(start, "unknown escape: a backslash before " + here());
    }
  }

  uint32_t hex_code(size_t start, int digits) {
    uint32_t code = 0;
    for (int i = 0; i < digits; ++i, ++at_) {
      const char h = ends() ? '\0' : text_[at_];
      const int value = is_digit(h)              ? h - '0'
                        : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                        : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                                 : -1;
      if (value < 0)
        fail_at(start, std::string(text_.substr(start, 2)) + " needs " + std::to_string(digits) +
                           " hexadecimal digits");
      code = code * 16 + uint32_t(value);
    }
    if (code > kMaxCodePoint || (code >= kFirstSurrogate && code <= kLastSurrogate))
      fail_at(start, "the escape names no character");
    return code;
  }

  std::string_view text_;
  size_t at_ = 0;
  int groups_open_ = 0;  // a group adds no node of its own, so its nesting is counted here
  GrammarSyntax syntax_;
  std::vector<int> heights_;          // per expr: the levels of nesting it holds
  std::map<std::string, int> names_;  // rule name -> index into syntax_.rules
  std::vector<size_t> first_use_;     // per rule: where it is first named
  struct Place {
    size_t offset = 0;
    int line = 1;
    int column = 1;
  };
  Place placed_;  // the last place() asked for
};

}  // namespace

GrammarSyntax parse_grammar(std::string_view text) {
  return Parser(text).parse();
}

}  // namespace pipeline
