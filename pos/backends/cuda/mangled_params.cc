// mangled_params.cc — a small reader of Itanium C++ mangled names (the subset kernel signatures use:
// namespaces, classes, templates, substitutions); anything else gives up rather than guess.
#include "pos/backends/cuda/mangled_params.h"

#include <cctype>
#include <string>

namespace pos::cudabk {
namespace {

class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}

  std::optional<std::vector<bool>> run() {
    if (!eat("_Z")) return std::nullopt;
    bool templated = false;
    if (!function_name(&templated)) return std::nullopt;
    // A template function's encoding starts with its return type.
    if (templated) {
      std::string ret;
      if (!type(&ret)) return std::nullopt;
    }
    std::vector<std::string> types;
    while (!ok_end()) {
      std::string t;
      if (!type(&t)) return std::nullopt;
      types.push_back(std::move(t));
    }
    if (types.empty()) return std::nullopt;
    std::vector<bool> out;
    if (types.size() == 1 && types[0] == "v") return out;  // f(void)
    for (const std::string& t : types) out.push_back(is_const_pointer(t));
    return out;
  }

 private:
  bool ok_end() const { return p_ >= s_.size() || s_[p_] == '.'; }  // ".constprop" style suffixes
  bool eat(std::string_view t) {
    if (s_.substr(p_, t.size()) != t) return false;
    p_ += t.size();
    return true;
  }
  char peek(size_t k = 0) const { return p_ + k < s_.size() ? s_[p_ + k] : '\0'; }

  static bool is_const_pointer(const std::string& t) {
    if (t.empty() || t[0] != 'P') return false;
    size_t i = 1;
    while (i < t.size() && (t[i] == 'r' || t[i] == 'V')) ++i;
    return i < t.size() && t[i] == 'K';
  }

  bool source_name(std::string* out) {
    if (!std::isdigit(static_cast<unsigned char>(peek()))) return false;
    size_t n = 0;
    while (std::isdigit(static_cast<unsigned char>(peek()))) {
      n = n * 10 + static_cast<size_t>(peek() - '0');
      ++p_;
      if (n > s_.size()) return false;
    }
    if (n == 0 || p_ + n > s_.size()) return false;
    *out = std::to_string(n) + std::string(s_.substr(p_, n));
    p_ += n;
    return true;
  }

  // S_, S<base-36>_, and the std:: abbreviations; the expansion goes to *out.
  bool substitution(std::string* out) {
    if (!eat("S")) return false;
    const char c = peek();
    if (c == '_') {
      ++p_;
      if (subs_.empty()) return false;
      *out = subs_[0];
      return true;
    }
    if (std::isdigit(static_cast<unsigned char>(c)) || std::isupper(static_cast<unsigned char>(c))) {
      size_t id = 0;
      while (peek() != '_') {
        const char d = peek();
        if (std::isdigit(static_cast<unsigned char>(d))) id = id * 36 + static_cast<size_t>(d - '0');
        else if (std::isupper(static_cast<unsigned char>(d))) id = id * 36 + static_cast<size_t>(d - 'A' + 10);
        else return false;
        ++p_;
      }
      ++p_;
      if (id + 1 >= subs_.size()) return false;
      *out = subs_[id + 1];
      return true;
    }
    if (c == 't' || c == 'a' || c == 'b' || c == 's' || c == 'i' || c == 'o' || c == 'd') {
      ++p_;
      *out = std::string("S") + c;
      return true;
    }
    return false;
  }

  bool template_args(std::string* out) {
    if (!eat("I")) return false;
    std::string text = "I";
    std::vector<std::string> args;
    while (!eat("E")) {
      if (p_ >= s_.size()) return false;
      std::string a;
      if (peek() == 'L') {  // literal: L <type> <value> E
        const size_t start = p_;
        ++p_;
        std::string lt;
        if (!type(&lt)) return false;
        while (p_ < s_.size() && peek() != 'E') ++p_;
        if (!eat("E")) return false;
        a = std::string(s_.substr(start, p_ - start));
      } else if (!type(&a)) {
        return false;
      }
      args.push_back(a);
      text += a;
    }
    text += "E";
    *out = text;
    last_template_args_ = std::move(args);
    return true;
  }

  // A type name may be followed by template arguments: the instance is one more candidate.
  bool template_instance(std::string* out) {
    if (peek() != 'I') return true;
    std::string args;
    if (!template_args(&args)) return false;
    *out += args;
    subs_.push_back(*out);
    return true;
  }

  // The function's own name: its last component is not a substitution candidate.
  bool function_name(bool* templated) {
    if (peek() == 'N') {
      ++p_;
      while (peek() == 'r' || peek() == 'V' || peek() == 'K') ++p_;
      std::string prefix;
      bool last_was_template = false;
      bool pending = false;  // the latest component, entered as a candidate only if more follow
      while (!eat("E")) {
        if (p_ >= s_.size()) return false;
        if (pending) subs_.push_back(prefix), pending = false;
        std::string comp;
        if (peek() == 'I') {
          if (!template_args(&comp)) return false;
          prefix += comp;
          fn_template_args_ = last_template_args_;
          last_was_template = true;
          pending = true;
          continue;
        }
        last_was_template = false;
        if (peek() == 'S') {
          if (!substitution(&comp)) return false;
          prefix += comp;
          continue;  // a substitution is not a new candidate
        }
        if (!source_name(&comp)) return false;
        prefix += comp;
        pending = true;
      }
      *templated = last_was_template;
      return true;
    }
    std::string name;
    if (peek() == 'S' && peek(1) == 't') {
      p_ += 2;
    }
    if (!source_name(&name)) return false;
    if (peek() == 'I') {
      subs_.push_back(name);  // an unscoped template name is a candidate
      std::string args;
      if (!template_args(&args)) return false;
      fn_template_args_ = last_template_args_;
      *templated = true;
    }
    return true;
  }

  bool builtin(std::string* out) {
    static constexpr std::string_view kOne = "vwbcahstijlmxynofdegz";
    const char c = peek();
    if (kOne.find(c) != std::string_view::npos && c != '\0') {
      ++p_;
      *out = std::string(1, c);
      return true;
    }
    if (c == 'D') {
      const char d = peek(1);
      if (d == 'h' || d == 'i' || d == 's' || d == 'u' || d == 'a' || d == 'c' || d == 'n' || d == 'f' || d == 'd' ||
          d == 'e') {
        *out = std::string(s_.substr(p_, 2));
        p_ += 2;
        return true;
      }
      if (d == 'F') {  // DF<bits>_ / DF<bits>b
        const size_t start = p_;
        p_ += 2;
        while (std::isdigit(static_cast<unsigned char>(peek()))) ++p_;
        if (!eat("_") && !eat("b")) return false;
        *out = std::string(s_.substr(start, p_ - start));
        return true;
      }
    }
    return false;
  }

  bool type(std::string* out) {
    const char c = peek();
    if (builtin(out)) return true;
    if (c == 'P' || c == 'R' || c == 'O' || c == 'K' || c == 'V' || c == 'r') {
      ++p_;
      std::string inner;
      if (!type(&inner)) return false;
      *out = std::string(1, c) + inner;
      subs_.push_back(*out);
      return true;
    }
    if (c == 'T') {  // template parameter T_ / T<n>_
      ++p_;
      size_t idx = 0;
      if (!eat("_")) {
        while (std::isdigit(static_cast<unsigned char>(peek()))) idx = idx * 10 + static_cast<size_t>(peek() - '0'), ++p_;
        if (!eat("_")) return false;
        ++idx;
      }
      if (idx >= fn_template_args_.size()) return false;
      *out = fn_template_args_[idx];
      subs_.push_back(*out);
      return template_instance(out);
    }
    if (c == 'S') {
      const bool std_prefix = peek(1) == 't';
      if (std_prefix) {
        p_ += 2;
        std::string n;
        if (!source_name(&n)) return false;
        *out = "St" + n;
        subs_.push_back(*out);
      } else if (!substitution(out)) {
        return false;
      }
      return template_instance(out);
    }
    if (c == 'N') {  // nested class name
      ++p_;
      std::string prefix;
      while (!eat("E")) {
        if (p_ >= s_.size()) return false;
        std::string comp;
        if (peek() == 'I') {
          if (!template_args(&comp)) return false;
        } else if (peek() == 'S') {
          if (!substitution(&comp)) return false;
          prefix += comp;
          continue;
        } else if (!source_name(&comp)) {
          return false;
        }
        prefix += comp;
        subs_.push_back("N" + prefix + "E");
      }
      *out = "N" + prefix + "E";
      return true;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {  // class or enum name
      if (!source_name(out)) return false;
      subs_.push_back(*out);
      return template_instance(out);
    }
    return false;  // arrays, function types, pointers to members, expressions: not handled
  }

  std::string_view s_;
  size_t p_ = 0;
  std::vector<std::string> subs_;
  std::vector<std::string> last_template_args_;
  std::vector<std::string> fn_template_args_;
};

}  // namespace

std::optional<std::vector<bool>> const_pointer_params(std::string_view mangled) { return Reader(mangled).run(); }

}  // namespace pos::cudabk
