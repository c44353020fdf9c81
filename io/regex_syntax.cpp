#include "io/regex_syntax.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>

namespace pipeline {
namespace {

const std::vector<CodePointRange> kDigits = {{'0', '9'}};
const std::vector<CodePointRange> kWordCharacters = {
    {'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const std::vector<CodePointRange> kSpaces = {{'\t', '\r'}, {' ', ' '}};  // \t \n \v \f \r

// A recursive-descent parser over the pattern's bytes:
//   alternation := concat ('|' concat)*
//   concat      := (atom quantifier?)*
class Parser {
 public:
  explicit Parser(std::string_view pattern) : pattern_(pattern) {}

  RegexTree parse() {
    if (peek('^')) ++at_;  // the answer is matched whole: an anchor there says nothing more
    tree_.root = alternation();
    if (!ends()) fail("a ')' closes no group");  // the one place an alternation stops early
    return std::move(tree_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { fail_at(at_, what); }
  // Positions count characters, as Python's re reports them.
  [[noreturn]] void fail_at(size_t offset, const std::string& what) const {
    const size_t position =
        size_t(std::count_if(pattern_.begin(), pattern_.begin() + ptrdiff_t(offset),
                             [](char c) { return (uint8_t(c) & 0xC0) != 0x80; }));
    throw RegexSyntaxError(what + " at position " + std::to_string(position));
  }
  bool peek(char c) const { return at_ < pattern_.size() && pattern_[at_] == c; }
  bool ends() const { return at_ == pattern_.size(); }

  int add(RegexNode node) {
    tree_.nodes.push_back(std::move(node));
    return int(tree_.nodes.size()) - 1;
  }
  int set(std::vector<CodePointRange> ranges) {
    RegexNode node;
    node.kind = RegexNode::Kind::Set;
    node.ranges = normalized_ranges(std::move(ranges));
    return add(std::move(node));
  }

  int alternation() {
    std::vector<int> branches{concat()};
    while (peek('|')) {
      ++at_;
      branches.push_back(concat());
    }
    if (branches.size() == 1) return branches[0];
    RegexNode node;
    node.kind = RegexNode::Kind::Alternation;
    node.children = std::move(branches);
    return add(std::move(node));
  }

  int concat() {
    RegexNode node;
    node.kind = RegexNode::Kind::Concat;
    while (!ends() && !peek('|') && !peek(')')) {
      if (peek('$') && at_ + 1 == pattern_.size()) {  // the answer ends there anyway
        ++at_;
        break;
      }
      const size_t start = at_;
      const std::optional<int> item = atom();
      if (!item) fail_at(start, "nothing to repeat");
      node.children.push_back(quantified(*item));
    }
    if (node.children.size() == 1) return node.children[0];
    return add(std::move(node));
  }

  // The atom at at_, or nullopt where a quantifier stands instead.
  std::optional<int> atom() {
    const char c = pattern_[at_];
    switch (c) {
      case '*':
      case '+':
      case '?':
        return std::nullopt;
      case '{':
        if (quantifier_at(at_)) return std::nullopt;
        ++at_;
        return set({{'{', '{'}});
      case '(':
        return group();
      case '[':
        return set(character_class());
      case '.':
        ++at_;
        return set(complement_ranges({{'\n', '\n'}}));
      case '\\':
        return set(escape(/*in_class=*/false));
      case '^':
        fail("'^' is held only at the start of the pattern");
      case '$':
        fail("'$' is held only at the end of the pattern");
      default:
        return set({single(literal())});
    }
  }

  static CodePointRange single(uint32_t code) { return {code, code}; }

  uint32_t literal() {
    const size_t start = at_;
    const std::optional<uint32_t> code = decode_utf8(pattern_, &at_);
    if (!code) fail_at(start, "the pattern is not valid UTF-8");
    return *code;
  }

  int group() {
    const size_t start = at_++;
    // Parsing and compiling recurse once per level: a bound keeps a hostile pattern off the
    // bottom of the stack.
    if (++depth_ > kMaxRegexDepth)
      fail_at(start, "groups may nest at most " + std::to_string(kMaxRegexDepth) + " deep");
    if (peek('?')) {
      ++at_;
      if (peek(':')) {
        ++at_;
      } else if (peek('P') && at_ + 1 < pattern_.size() && pattern_[at_ + 1] == '<') {
        at_ += 2;
        group_name(start);
      } else if (peek('<') && at_ + 1 < pattern_.size() && pattern_[at_ + 1] != '=' &&
                 pattern_[at_ + 1] != '!') {
        ++at_;
        group_name(start);
      } else {
        fail_at(start,
                "lookarounds, backreferences, comments and inline flags are not supported "
                "(only (...), (?:...) and named groups)");
      }
    }
    const int inside = alternation();
    if (!peek(')')) fail_at(start, "the group opened here is not closed");
    ++at_;
    --depth_;
    return inside;
  }

  // An identifier, as Python wants it (non-ASCII characters taken as letters), used once.
  void group_name(size_t group_start) {
    const size_t name_start = at_;
    const auto word_byte = [](uint8_t c) { return c >= 0x80 || std::isalnum(c) || c == '_'; };
    while (!ends() && word_byte(uint8_t(pattern_[at_]))) ++at_;
    const std::string name(pattern_.substr(name_start, at_ - name_start));
    if (name.empty() || !peek('>') || std::isdigit(uint8_t(name[0])))
      fail_at(group_start, "a group name must be an identifier in <>");
    if (!group_names_.insert(name).second)
      fail_at(group_start, "redefinition of group name '" + name + "'");
    ++at_;
  }

  // Whether a quantifier {n}, {n,}, {,m}, {n,m} or {,} (as *) begins at `offset`.
  bool quantifier_at(size_t offset) const {
    size_t i = offset + 1;
    const auto digits = [&] {
      const size_t begin = i;
      while (i < pattern_.size() && std::isdigit(uint8_t(pattern_[i]))) ++i;
      return i > begin;
    };
    const bool low = digits();
    bool comma = false;
    if (i < pattern_.size() && pattern_[i] == ',') {
      ++i;
      comma = true;
      digits();
    }
    return i < pattern_.size() && pattern_[i] == '}' && (low || comma);  // "{}" is text
  }

  int count() {
    const size_t start = at_;
    int64_t value = 0;
    while (!ends() && std::isdigit(uint8_t(pattern_[at_]))) {
      value = std::min<int64_t>(value * 10 + (pattern_[at_] - '0'), int64_t(kMaxRegexRepeat) + 1);
      ++at_;
    }
    if (value > kMaxRegexRepeat)
      fail_at(start, "a repetition count may be at most " + std::to_string(kMaxRegexRepeat));
    return int(value);
  }

  int quantified(int item) {
    if (ends()) return item;
    const size_t start = at_;
    int min = 0;
    int max = 0;
    switch (pattern_[at_]) {
      case '*':
        max = RegexNode::kUnbounded;
        ++at_;
        break;
      case '+':
        min = 1;
        max = RegexNode::kUnbounded;
        ++at_;
        break;
      case '?':
        max = 1;
        ++at_;
        break;
      case '{': {
        if (!quantifier_at(at_)) return item;
        ++at_;
        min = std::isdigit(uint8_t(pattern_[at_])) ? count() : 0;
        max = min;
        if (peek(',')) {
          ++at_;
          max = peek('}') ? RegexNode::kUnbounded : count();
        }
        ++at_;  // '}'
        if (max != RegexNode::kUnbounded && max < min)
          fail_at(start, "a repetition's minimum exceeds its maximum");
        break;
      }
      default:
        return item;
    }
    if (peek('?')) ++at_;  // lazy: the same texts
    if (!ends() && (peek('*') || peek('+') || peek('?') || (peek('{') && quantifier_at(at_))))
      fail("multiple repeat (possessive quantifiers are not supported)");
    RegexNode node;
    node.kind = RegexNode::Kind::Repeat;
    node.children = {item};
    node.min = min;
    node.max = max;
    return add(std::move(node));
  }

  // `[...]` at at_: its code points.
  std::vector<CodePointRange> character_class() {
    const size_t start = at_++;
    const bool negated = peek('^');
    if (negated) ++at_;
    std::vector<CodePointRange> ranges;
    bool first = true;
    while (!peek(']') || first) {
      if (ends()) fail_at(start, "the class opened here is not closed");
      first = false;
      const size_t item_start = at_;
      std::vector<CodePointRange> item = class_item();
      const bool range = peek('-') && at_ + 1 < pattern_.size() && pattern_[at_ + 1] != ']';
      if (range && (item.size() != 1 || item[0].lo != item[0].hi))
        fail_at(item_start, "a class range must begin at one character");
      if (range) {
        ++at_;
        const std::vector<CodePointRange> end = class_item();
        if (end.size() != 1 || end[0].lo != end[0].hi)
          fail_at(item_start, "a class range must end at one character");
        if (end[0].lo < item[0].lo) fail_at(item_start, "a class range runs backwards");
        item[0].hi = end[0].lo;
      }
      ranges.insert(ranges.end(), item.begin(), item.end());
    }
    ++at_;  // ']'
    return negated ? complement_ranges(ranges) : ranges;
  }

  std::vector<CodePointRange> class_item() {
    if (peek('\\')) return escape(/*in_class=*/true);
    return {single(literal())};
  }

  // The escape at at_ (a backslash): its code points.
  std::vector<CodePointRange> escape(bool in_class) {
    const size_t start = at_++;
    if (ends()) fail_at(start, "the pattern ends in a backslash");
    const char c = pattern_[at_++];
    switch (c) {
      case 'd':
        return kDigits;
      case 'D':
        return complement_ranges(kDigits);
      case 'w':
        return kWordCharacters;
      case 'W':
        return complement_ranges(kWordCharacters);
      case 's':
        return kSpaces;
      case 'S':
        return complement_ranges(kSpaces);
      case 'n':
        return {single('\n')};
      case 't':
        return {single('\t')};
      case 'r':
        return {single('\r')};
      case 'f':
        return {single('\f')};
      case 'v':
        return {single('\v')};
      case 'a':
        return {single('\a')};
      case 'x':
        return {single(hex_code(start, 2))};
      case 'u':
        return {single(hex_code(start, 4))};
      case 'U':
        return {single(hex_code(start, 8))};
      case 'b':
        if (in_class) return {single('\b')};
        break;
      case '0':
      case '1':
      case '2':
      case '3':
      case '4':
      case '5':
      case '6':
      case '7':
      case '8':
      case '9':
        return {single(octal(start, in_class))};
      default:
        if (uint8_t(c) >= 0x80) {  // a backslash before a non-ASCII character: that character
          --at_;
          return {single(literal())};
        }
        if (!std::isalnum(uint8_t(c))) return {single(uint8_t(c))};
        break;
    }
    if (c == 'b' || c == 'B' || c == 'A' || c == 'Z' || c == 'z' || c == 'G')
      fail_at(start, "the anchor \\" + std::string(1, c) +
                         " is not supported: the pattern matches the whole answer");
    fail_at(start, "unknown escape \\" + std::string(1, c));
  }

  // A backslash and a digit (at_ past the digit), as Python reads them: \0 and up to two more
  // octal digits, or three octal digits, is a character (in a class, any octal digit begins
  // one); anything else is a backreference.
  uint32_t octal(size_t start, bool in_class) {
    const auto octal_digit = [&](size_t i) {
      return i < pattern_.size() && pattern_[i] >= '0' && pattern_[i] <= '7';
    };
    const char first = pattern_[start + 1];
    const bool three = octal_digit(start + 1) && octal_digit(at_) && octal_digit(at_ + 1);
    if (in_class && !octal_digit(start + 1))
      fail_at(start, std::string("unknown escape \\") + first);
    if (!in_class && first != '0' && !three) fail_at(start, "backreferences are not supported");
    uint32_t code = uint32_t(first - '0');
    for (int more = 0; more < 2 && octal_digit(at_); ++more)
      code = code * 8 + uint32_t(pattern_[at_++] - '0');
    if (code > 0377) fail_at(start, "an octal escape must be at most \\377");
    return code;
  }

  uint32_t hex_code(size_t start, int digits) {
    uint32_t code = 0;
    for (int i = 0; i < digits; ++i, ++at_) {
      if (ends() || !std::isxdigit(uint8_t(pattern_[at_])))
        fail_at(start, std::string(pattern_.substr(start, 2)) + " needs " + std::to_string(digits) +
                           " hexadecimal digits");
      const char h = char(std::tolower(uint8_t(pattern_[at_])));
      code = code * 16 + uint32_t(h <= '9' ? h - '0' : h - 'a' + 10);
    }
    if (code > kMaxCodePoint || (code >= 0xD800 && code <= 0xDFFF))
      fail_at(start, "the escape names no character");
    return code;
  }

  std::string_view pattern_;
  size_t at_ = 0;
  int depth_ = 0;                      // groups open
  std::set<std::string> group_names_;  // named groups so far
  RegexTree tree_;
};

}  // namespace

RegexTree parse_regex(std::string_view pattern) {
  return Parser(pattern).parse();
}

RegexTree literal_alternatives(std::span<const std::string> texts) {
  RegexTree tree;
  RegexNode alternation;
  alternation.kind = RegexNode::Kind::Alternation;
  for (const std::string& text : texts) {
    RegexNode literal;
    literal.kind = RegexNode::Kind::Concat;
    for (size_t at = 0; at < text.size();) {
      const size_t start = at;
      const std::optional<uint32_t> code = decode_utf8(text, &at);
      if (!code)
        throw RegexSyntaxError("choice " + std::to_string(alternation.children.size()) +
                               " is not valid UTF-8 at byte " + std::to_string(start));
      RegexNode character;
      character.kind = RegexNode::Kind::Set;
      character.ranges = {{*code, *code}};
      tree.nodes.push_back(std::move(character));
      literal.children.push_back(int(tree.nodes.size()) - 1);
    }
    tree.nodes.push_back(std::move(literal));
    alternation.children.push_back(int(tree.nodes.size()) - 1);
  }
  tree.nodes.push_back(std::move(alternation));
  tree.root = int(tree.nodes.size()) - 1;
  return tree;
}

}  // namespace pipeline
