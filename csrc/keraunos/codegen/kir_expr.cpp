#include "keraunos/codegen/kir_expr.h"

#include "keraunos/ir/error.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <unordered_map>

namespace keraunos::kir {

namespace {

// ---------------------------------------------------------------------------------------------
// Interning: one live node per structure. The table holds weak references; expired entries are
// swept when it has doubled since the last sweep.

size_t mix(size_t h, size_t v) { return h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2)); }

size_t hash_of(const ExprNode& n) {
  size_t h = mix(static_cast<size_t>(n.kind), static_cast<size_t>(n.dtype));
  h = mix(h, std::hash<std::string>{}(n.name));
  h = mix(h, std::hash<int64_t>{}(n.i));
  int64_t bits;
  static_assert(sizeof bits == sizeof n.f);
  std::memcpy(&bits, &n.f, sizeof bits);
  h = mix(h, std::hash<int64_t>{}(bits));
  h = mix(h, n.prim ? static_cast<size_t>(*n.prim) + 1 : 0);
  for (const Expr& a : n.args) h = mix(h, std::hash<const void*>{}(a.get()));
  return h;
}

bool same(const ExprNode& a, const ExprNode& b) {
  if (a.kind != b.kind || a.dtype != b.dtype || a.name != b.name || a.i != b.i ||
      a.prim != b.prim || a.args.size() != b.args.size())
    return false;
  // Literals compare by bits: -0.0 and 0.0 differ, a NaN equals itself.
  if (std::memcmp(&a.f, &b.f, sizeof a.f) != 0) return false;
  for (size_t k = 0; k < a.args.size(); ++k)
    if (a.args[k].get() != b.args[k].get()) return false;
  return true;
}

struct Table {
  std::mutex mu;
  std::unordered_multimap<size_t, std::weak_ptr<const ExprNode>> nodes;
  size_t swept_at = 1024;
};

Table& table() {
  static Table* t = new Table; // never destroyed: nodes may outlive static destruction order
  return *t;
}

Expr intern(ExprNode n) {
  n.hash = hash_of(n);
  n.costly = n.kind == ExprKind::Call && n.prim && op_def(*n.prim).has(tags::X);
  for (const Expr& a : n.args) n.costly |= a->costly;
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto [lo, hi] = t.nodes.equal_range(n.hash);
  for (auto it = lo; it != hi; ++it)
    if (Expr e = it->second.lock(); e && same(*e, n)) return e;
  if (t.nodes.size() >= 2 * t.swept_at) {
    for (auto it = t.nodes.begin(); it != t.nodes.end();)
      it = it->second.expired() ? t.nodes.erase(it) : std::next(it);
    t.swept_at = std::max<size_t>(1024, t.nodes.size());
  }
  Expr e = std::make_shared<const ExprNode>(std::move(n));
  t.nodes.emplace(e->hash, e);
  return e;
}

ExprNode node(ExprKind k, DType d) {
  ExprNode n;
  n.kind = k;
  n.dtype = d;
  return n;
}

int rank(DType d) {
  switch (d) {
  case DType::Bool:
    return 0;
  case DType::UInt8:
  case DType::Int8:
  case DType::Int16:
  case DType::Int32:
    return 1; // C promotes these to int
  case DType::Int64:
    return 2;
  case DType::Float16:
  case DType::BFloat16:
  case DType::Float32:
    return 3;
  case DType::Float64:
    return 4;
  }
  return 0;
}

bool is_compare(ExprKind k) {
  return k == ExprKind::Eq || k == ExprKind::Ne || k == ExprKind::Lt || k == ExprKind::Le ||
         k == ExprKind::Gt || k == ExprKind::Ge || k == ExprKind::And || k == ExprKind::Or;
}

const char* infix(ExprKind k) {
  switch (k) {
  case ExprKind::Add:
    return " + ";
  case ExprKind::Sub:
    return " - ";
  case ExprKind::Mul:
    return " * ";
  case ExprKind::Div:
    return " / ";
  case ExprKind::Mod:
    return " % ";
  case ExprKind::Eq:
    return " == ";
  case ExprKind::Ne:
    return " != ";
  case ExprKind::Lt:
    return " < ";
  case ExprKind::Le:
    return " <= ";
  case ExprKind::Gt:
    return " > ";
  case ExprKind::Ge:
    return " >= ";
  case ExprKind::BitAnd:
    return " & ";
  case ExprKind::BitOr:
    return " | ";
  case ExprKind::BitXor:
    return " ^ ";
  case ExprKind::And:
    return " && ";
  case ExprKind::Or:
    return " || ";
  case ExprKind::Var:
  case ExprKind::Int:
  case ExprKind::Float:
  case ExprKind::Bool:
  case ExprKind::Cast:
  case ExprKind::Neg:
  case ExprKind::Not:
  case ExprKind::BitNot:
  case ExprKind::Select:
  case ExprKind::Clamp:
  case ExprKind::Call:
    break;
  }
  return nullptr;
}

} // namespace

std::string prim_helper(OpId prim) {
  std::string_view name = op_def(prim).id_name;
  KR_INTERNAL(name.substr(0, 5) == "prim_", "prim_helper: ", name, " is not a prim");
  return "kr_" + std::string(name.substr(5));
}

std::optional<OpId> helper_prim(std::string_view helper) {
  if (helper.substr(0, 3) != "kr_") return std::nullopt;
  const OpDef* def = find_op("prim_" + std::string(helper.substr(3)));
  if (!def || !def->has(tags::P) || !def->has(tags::E)) return std::nullopt;
  return def->id;
}

Expr var(const std::string& name, DType dtype) {
  ExprNode n = node(ExprKind::Var, dtype);
  n.name = name;
  return intern(std::move(n));
}

Expr int_lit(int64_t v, DType dtype) {
  KR_INTERNAL(is_int(dtype), "int_lit: not an integer dtype");
  ExprNode n = node(ExprKind::Int, dtype);
  n.i = v;
  return intern(std::move(n));
}

Expr float_lit(double v, DType dtype) {
  KR_INTERNAL(dtype == DType::Float32 || dtype == DType::Float64, "float_lit: not a compute float");
  ExprNode n = node(ExprKind::Float, dtype);
  n.f = dtype == DType::Float32 ? static_cast<double>(static_cast<float>(v)) : v;
  return intern(std::move(n));
}

Expr bool_lit(bool v) {
  ExprNode n = node(ExprKind::Bool, DType::Bool);
  n.i = v;
  return intern(std::move(n));
}

Expr cast(DType to, const Expr& a) {
  if (a->dtype == to) return a;
  ExprNode n = node(ExprKind::Cast, to);
  n.args = {a};
  return intern(std::move(n));
}

Expr unary(ExprKind k, const Expr& a) {
  KR_INTERNAL(k == ExprKind::Neg || k == ExprKind::Not || k == ExprKind::BitNot,
              "unary: not a unary kind");
  ExprNode n = node(k, k == ExprKind::Not ? DType::Bool : a->dtype);
  n.args = {a};
  return intern(std::move(n));
}

Expr binary(ExprKind k, const Expr& a, const Expr& b) {
  KR_INTERNAL(infix(k) != nullptr, "binary: not a binary kind");
  DType d = is_compare(k) ? DType::Bool : rank(b->dtype) > rank(a->dtype) ? b->dtype : a->dtype;
  ExprNode n = node(k, d);
  n.args = {a, b};
  return intern(std::move(n));
}

Expr select(const Expr& c, const Expr& a, const Expr& b) {
  ExprNode n = node(ExprKind::Select, rank(b->dtype) > rank(a->dtype) ? b->dtype : a->dtype);
  n.args = {c, a, b};
  return intern(std::move(n));
}

Expr clamp_index(const Expr& i, int64_t lo, int64_t hi) {
  KR_INTERNAL(is_int(i->dtype) && lo <= hi, "clamp_index: bad operands");
  ExprNode n = node(ExprKind::Clamp, DType::Int64);
  n.args = {cast(DType::Int64, i), int_lit(lo, DType::Int64), int_lit(hi, DType::Int64)};
  return intern(std::move(n));
}

Expr call(const std::string& helper, std::vector<Expr> args, DType result,
          std::optional<OpId> prim) {
  ExprNode n = node(ExprKind::Call, result);
  n.name = helper;
  n.args = std::move(args);
  n.prim = prim;
  return intern(std::move(n));
}

std::optional<Range> int_range(const Expr& e,
                               const std::function<std::optional<Range>(const std::string&)>& var_range,
                               int64_t limit) {
  using R = std::optional<Range>;
  auto fits = [&](__int128 lo, __int128 hi) -> R {
    if (lo < -static_cast<__int128>(limit) || hi > limit) return std::nullopt;
    return Range{static_cast<int64_t>(lo), static_cast<int64_t>(hi)};
  };
  if (e->dtype == DType::Bool) { // comparisons, logic: integer operands must fit too
    for (const Expr& x : e->args)
      if (is_int(x->dtype) && x->dtype != DType::Bool && !int_range(x, var_range, limit))
        return std::nullopt;
    return Range{0, 1};
  }
  std::vector<Range> a;
  for (const Expr& x : e->args) {
    if (e->kind == ExprKind::Select && a.empty()) { // the condition: a bool
      a.push_back({0, 1});
      continue;
    }
    R r = int_range(x, var_range, limit);
    if (!r) return std::nullopt;
    a.push_back(*r);
  }
  switch (e->kind) {
  case ExprKind::Var:
    return is_int(e->dtype) ? var_range(e->name) : std::nullopt;
  case ExprKind::Int:
    return fits(e->i, e->i);
  case ExprKind::Bool:
    return Range{0, 1};
  case ExprKind::Cast: // to a wider (or equal) integer type only
    return is_int(e->dtype) && rank(e->dtype) >= rank(e->args[0]->dtype) ? R(a[0]) : std::nullopt;
  case ExprKind::Neg:
    return fits(-static_cast<__int128>(a[0].second), -static_cast<__int128>(a[0].first));
  case ExprKind::Add:
    return fits(static_cast<__int128>(a[0].first) + a[1].first,
                static_cast<__int128>(a[0].second) + a[1].second);
  case ExprKind::Sub:
    return fits(static_cast<__int128>(a[0].first) - a[1].second,
                static_cast<__int128>(a[0].second) - a[1].first);
  case ExprKind::Mul: {
    __int128 p[4] = {static_cast<__int128>(a[0].first) * a[1].first,
                     static_cast<__int128>(a[0].first) * a[1].second,
                     static_cast<__int128>(a[0].second) * a[1].first,
                     static_cast<__int128>(a[0].second) * a[1].second};
    return fits(*std::min_element(p, p + 4), *std::max_element(p, p + 4));
  }
  case ExprKind::Div: // by a positive literal: C truncates toward zero
    if (e->args[1]->kind != ExprKind::Int || e->args[1]->i <= 0) return std::nullopt;
    return fits(a[0].first / e->args[1]->i, a[0].second / e->args[1]->i);
  case ExprKind::Mod: { // by a positive literal: the sign of the dividend
    if (e->args[1]->kind != ExprKind::Int || e->args[1]->i <= 0) return std::nullopt;
    const int64_t m = e->args[1]->i - 1;
    return fits(a[0].first < 0 ? -m : 0, a[0].second > 0 ? m : 0);
  }
  case ExprKind::Eq:
  case ExprKind::Ne:
  case ExprKind::Lt:
  case ExprKind::Le:
  case ExprKind::Gt:
  case ExprKind::Ge:
  case ExprKind::And:
  case ExprKind::Or:
  case ExprKind::Not:
    return Range{0, 1};
  case ExprKind::Select:
    return fits(std::min(a[1].first, a[2].first), std::max(a[1].second, a[2].second));
  case ExprKind::Clamp:
    return fits(std::max(std::min(a[0].first, a[2].first), a[1].first),
                std::min(std::max(a[0].second, a[1].first), a[2].second));
  case ExprKind::Float:
  case ExprKind::BitNot:
  case ExprKind::BitAnd:
  case ExprKind::BitOr:
  case ExprKind::BitXor:
  case ExprKind::Call:
    return std::nullopt;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Printing.

namespace {

std::string int_text(int64_t v, DType d) {
  std::string digits;
  if (v == std::numeric_limits<int64_t>::min())
    digits = "(-9223372036854775807LL - 1LL)";
  else
    digits = v < 0 ? "(-" + std::to_string(-v) + "LL)" : std::to_string(v) + "LL";
  if (d == DType::Int64) return digits;
  return "((" + std::string(ctype(d)) + ")" + digits + ")";
}

std::string float_text(double v, DType d) {
  const bool dbl = d == DType::Float64;
  if (std::isnan(v)) return dbl ? "kr_nan_d()" : "kr_nan_f()";
  if (std::isinf(v)) {
    std::string s = dbl ? "kr_inf_d()" : "kr_inf_f()";
    return v < 0 ? "(-" + s + ")" : s;
  }
  // The shortest decimal that reads back as the same value (C compilers round decimal
  // literals correctly), with a float suffix for float32.
  char buf[64];
  const auto r = dbl ? std::to_chars(buf, buf + sizeof buf, v)
                     : std::to_chars(buf, buf + sizeof buf, static_cast<float>(v));
  std::string t(buf, r.ptr);
  if (t.find_first_of(".e") == std::string::npos) t += ".0";
  if (!dbl) t += "f";
  return v < 0 || (v == 0 && std::signbit(v)) ? "(" + t + ")" : t;
}

void print(std::string& out, const Expr& e);

// An operand of an infix operator: parenthesized unless it binds at least as tightly as a cast.
void operand(std::string& out, const Expr& e) {
  const bool wrap = e->kind == ExprKind::Select || infix(e->kind) != nullptr;
  if (wrap) out += '(';
  print(out, e);
  if (wrap) out += ')';
}

void print(std::string& out, const Expr& e) {
  switch (e->kind) {
  case ExprKind::Var:
    out += e->name;
    return;
  case ExprKind::Int:
    out += int_text(e->i, e->dtype);
    return;
  case ExprKind::Float:
    out += float_text(e->f, e->dtype);
    return;
  case ExprKind::Bool:
    out += e->i ? "true" : "false";
    return;
  case ExprKind::Cast:
    out += "(";
    out += ctype(e->dtype);
    out += ")(";
    print(out, e->args[0]);
    out += ")";
    return;
  case ExprKind::Neg:
  case ExprKind::Not:
  case ExprKind::BitNot:
    out += e->kind == ExprKind::Neg ? "-(" : e->kind == ExprKind::Not ? "!(" : "~(";
    print(out, e->args[0]);
    out += ")";
    return;
  case ExprKind::Select:
    operand(out, e->args[0]);
    out += " ? ";
    operand(out, e->args[1]);
    out += " : ";
    operand(out, e->args[2]);
    return;
  case ExprKind::Clamp:
  case ExprKind::Call:
    out += e->kind == ExprKind::Clamp ? "kr_clamp_index" : e->name.c_str();
    out += "(";
    for (size_t k = 0; k < e->args.size(); ++k) {
      if (k) out += ", ";
      print(out, e->args[k]);
    }
    out += ")";
    return;
  case ExprKind::Add:
  case ExprKind::Sub:
  case ExprKind::Mul:
  case ExprKind::Div:
  case ExprKind::Mod:
  case ExprKind::Eq:
  case ExprKind::Ne:
  case ExprKind::Lt:
  case ExprKind::Le:
  case ExprKind::Gt:
  case ExprKind::Ge:
  case ExprKind::BitAnd:
  case ExprKind::BitOr:
  case ExprKind::BitXor:
  case ExprKind::And:
  case ExprKind::Or:
    operand(out, e->args[0]);
    out += infix(e->kind);
    operand(out, e->args[1]);
    return;
  }
}

} // namespace

std::string c_text(const Expr& e) {
  std::string out;
  print(out, e);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Queries and rewriting.

void for_each_var(const Expr& e, const std::function<void(const std::string&)>& fn) {
  if (e->kind == ExprKind::Var) fn(e->name);
  for (const Expr& a : e->args) for_each_var(a, fn);
}

bool mentions(const Expr& e, const std::string& name) {
  if (e->kind == ExprKind::Var) return e->name == name;
  for (const Expr& a : e->args)
    if (mentions(a, name)) return true;
  return false;
}

namespace {
Expr rebuild(const Expr& e, std::vector<Expr> args) {
  bool changed = false;
  for (size_t k = 0; k < args.size(); ++k) changed |= args[k].get() != e->args[k].get();
  if (!changed) return e;
  ExprNode n = *e;
  n.args = std::move(args);
  return intern(std::move(n));
}

Expr subst(const Expr& e, const std::function<Expr(const ExprNode&)>& fn,
           std::unordered_map<const ExprNode*, Expr>& memo) {
  if (auto it = memo.find(e.get()); it != memo.end()) return it->second;
  Expr out;
  if (e->kind == ExprKind::Var) {
    out = fn(*e);
    if (!out) out = e;
  } else {
    std::vector<Expr> args;
    args.reserve(e->args.size());
    for (const Expr& a : e->args) args.push_back(subst(a, fn, memo));
    out = rebuild(e, std::move(args));
  }
  memo.emplace(e.get(), out);
  return out;
}
} // namespace

Expr substitute(const Expr& e, const std::function<Expr(const ExprNode&)>& fn) {
  std::unordered_map<const ExprNode*, Expr> memo;
  return subst(e, fn, memo);
}

Expr rename(const Expr& e, const std::string& from, const std::string& to) {
  return substitute(e, [&](const ExprNode& v) -> Expr {
    return v.name == from ? var(to, v.dtype) : nullptr;
  });
}

// ---------------------------------------------------------------------------------------------
// Parsing (recursive descent over C's precedence levels).

namespace {

class Parser {
public:
  Parser(std::string_view s, const std::function<DType(const std::string&)>& type_of)
      : s_(s), type_of_(type_of) {}

  Expr run() {
    Expr e = ternary();
    skip();
    KR_INTERNAL(p_ == s_.size(), "kir::parse: unexpected '", s_.substr(p_), "' in '", s_, "'");
    return e;
  }

private:
  void skip() {
    while (p_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[p_]))) ++p_;
  }
  bool eat(std::string_view tok) {
    skip();
    if (s_.substr(p_, tok.size()) != tok) return false;
    p_ += tok.size();
    return true;
  }
  void expect(std::string_view tok) {
    KR_INTERNAL(eat(tok), "kir::parse: expected '", tok, "' at '", s_.substr(p_), "' in '", s_,
                "'");
  }

  Expr ternary() {
    Expr c = binary_level(0);
    if (!eat("?")) return c;
    Expr a = ternary();
    expect(":");
    Expr b = ternary();
    return select(c, a, b);
  }

  // Levels, loosest first.
  Expr binary_level(int level) {
    static const std::vector<std::vector<std::pair<std::string_view, ExprKind>>> kLevels = {
        {{"||", ExprKind::Or}},
        {{"&&", ExprKind::And}},
        {{"|", ExprKind::BitOr}},
        {{"^", ExprKind::BitXor}},
        {{"&", ExprKind::BitAnd}},
        {{"==", ExprKind::Eq}, {"!=", ExprKind::Ne}},
        {{"<=", ExprKind::Le}, {">=", ExprKind::Ge}, {"<", ExprKind::Lt}, {">", ExprKind::Gt}},
        {{"+", ExprKind::Add}, {"-", ExprKind::Sub}},
        {{"*", ExprKind::Mul}, {"/", ExprKind::Div}, {"%", ExprKind::Mod}},
    };
    if (level == static_cast<int>(kLevels.size())) return prefix();
    Expr e = binary_level(level + 1);
    for (;;) {
      skip();
      bool found = false;
      for (const auto& [tok, kind] : kLevels[level]) {
        if (s_.substr(p_, tok.size()) != tok) continue;
        // "|" is not "||", "&" not "&&".
        if ((tok == "|" || tok == "&") && s_.substr(p_, 2) == std::string(2, tok[0])) continue;
        p_ += tok.size();
        e = binary(kind, e, binary_level(level + 1));
        found = true;
        break;
      }
      if (!found) return e;
    }
  }

  std::optional<DType> ctype_name(std::string_view w) {
    static const std::pair<std::string_view, DType> kTypes[] = {
        {"bool", DType::Bool},       {"uint8_t", DType::UInt8},   {"int8_t", DType::Int8},
        {"int16_t", DType::Int16},   {"int32_t", DType::Int32},   {"int64_t", DType::Int64},
        {"float", DType::Float32},   {"double", DType::Float64},
    };
    for (const auto& [n, d] : kTypes)
      if (n == w) return d;
    return std::nullopt;
  }

  Expr prefix() {
    skip();
    if (eat("-")) {
      Expr a = prefix();
      if (a->kind == ExprKind::Float) return float_lit(-a->f, a->dtype);
      if (a->kind == ExprKind::Int) return int_lit(-a->i, a->dtype);
      return unary(ExprKind::Neg, a);
    }
    if (s_.substr(p_, 2) != "!=" && eat("!")) return unary(ExprKind::Not, prefix());
    if (eat("~")) return unary(ExprKind::BitNot, prefix());
    // A cast: "(" type ")".
    if (p_ < s_.size() && s_[p_] == '(') {
      size_t q = p_ + 1;
      while (q < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[q])) || s_[q] == '_')) ++q;
      if (q < s_.size() && s_[q] == ')') {
        if (auto d = ctype_name(s_.substr(p_ + 1, q - p_ - 1))) {
          p_ = q + 1;
          Expr a = prefix();
          if (a->kind == ExprKind::Int && is_float(*d)) return float_lit(static_cast<double>(a->i), *d);
          if (a->kind == ExprKind::Int && is_int(*d)) return int_lit(a->i, *d);
          if (a->kind == ExprKind::Float && a->dtype != *d && is_float(*d)) return float_lit(a->f, *d);
          ExprNode n = node(ExprKind::Cast, *d);
          n.args = {a};
          return a->dtype == *d ? a : intern(std::move(n));
        }
      }
    }
    return primary();
  }

  Expr number() {
    size_t q = p_;
    auto word = [&](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; };
    while (q < s_.size() && (word(s_[q]) || ((s_[q] == '+' || s_[q] == '-') && q > p_ &&
                                             (s_[q - 1] == 'p' || s_[q - 1] == 'P' ||
                                              ((s_[q - 1] == 'e' || s_[q - 1] == 'E') &&
                                               s_.substr(p_, 2) != "0x")))))
      ++q;
    std::string t(s_.substr(p_, q - p_));
    p_ = q;
    const bool hex = t.size() > 1 && (t[1] == 'x' || t[1] == 'X');
    const bool is_fl = t.find('.') != std::string::npos || (hex && t.find('p') != std::string::npos) ||
                       (!hex && (t.find('e') != std::string::npos || t.back() == 'f'));
    char* end = nullptr;
    if (is_fl) {
      const bool f32 = !hex && t.back() == 'f';
      if (f32) t.pop_back();
      const double v = std::strtod(t.c_str(), &end);
      KR_INTERNAL(end == t.c_str() + t.size(), "kir::parse: bad number '", t, "' in '", s_, "'");
      return float_lit(v, f32 ? DType::Float32 : DType::Float64);
    }
    while (!t.empty() && (t.back() == 'L' || t.back() == 'l' || t.back() == 'u' || t.back() == 'U')) t.pop_back();
    const long long v = std::strtoll(t.c_str(), &end, 0);
    KR_INTERNAL(!t.empty() && end == t.c_str() + t.size(), "kir::parse: bad number '", t, "' in '", s_, "'");
    return int_lit(v, DType::Int64);
  }

  Expr primary() {
    skip();
    KR_INTERNAL(p_ < s_.size(), "kir::parse: unexpected end of '", s_, "'");
    const char c = s_[p_];
    if (c == '(') {
      ++p_;
      Expr e = ternary();
      expect(")");
      return e;
    }
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') return number();
    size_t q = p_;
    while (q < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[q])) || s_[q] == '_')) ++q;
    KR_INTERNAL(q > p_, "kir::parse: unexpected '", s_.substr(p_), "' in '", s_, "'");
    std::string name(s_.substr(p_, q - p_));
    p_ = q;
    if (name == "true" || name == "false") return bool_lit(name == "true");
    if (!eat("(")) return var(name, type_of_(name));
    std::vector<Expr> args;
    if (!eat(")")) {
      do args.push_back(ternary());
      while (eat(","));
      expect(")");
    }
    if (name == "kr_nan_f" || name == "kr_inf_f" || name == "kr_nan_d" || name == "kr_inf_d") {
      const DType d = name.back() == 'f' ? DType::Float32 : DType::Float64;
      return float_lit(name[3] == 'n' ? std::nan("") : HUGE_VAL, d);
    }
    if (name == "kr_clamp_index") {
      KR_INTERNAL(args.size() == 3 && args[1]->kind == ExprKind::Int &&
                      args[2]->kind == ExprKind::Int,
                  "kir::parse: kr_clamp_index takes an index and two integer literals");
      return clamp_index(args[0], args[1]->i, args[2]->i);
    }
    if (name == "kr_h2f" || name == "kr_bf2f") return call(name, args, DType::Float32);
    if (name == "kr_f2h") return call(name, args, DType::Float16);
    if (name == "kr_f2bf") return call(name, args, DType::BFloat16);
    const std::optional<OpId> prim = helper_prim(name);
    KR_INTERNAL(!args.empty(), "kir::parse: call of ", name, " without arguments");
    DType result = args[0]->dtype;
    if (prim == OpId::prim_isnan || prim == OpId::prim_isinf) result = DType::Bool;
    for (size_t k = 1; k < args.size() && prim != OpId::prim_isnan; ++k)
      if (rank(args[k]->dtype) > rank(result)) result = args[k]->dtype;
    return call(name, std::move(args), result, prim);
  }

  std::string_view s_;
  const std::function<DType(const std::string&)>& type_of_;
  size_t p_ = 0;
};

} // namespace

Expr parse(std::string_view text, const std::function<DType(const std::string&)>& type_of) {
  return Parser(text, type_of).run();
}

} // namespace keraunos::kir
