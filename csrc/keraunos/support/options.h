// Every knob of keraunos in one registry: environment variables, jit options and tuning keys.
// Each is declared once (options.cpp) with its environment variable, default and meaning, read
// through this header only, and listed by keraunos.options(). Nothing else reads KERAUNOS_*.
//
// A value comes from, in order: the jit call's own argument (for jit options, applied by the
// caller), set() (keraunos.set_option), the environment variable (read at each get()), the
// default. Callers that read an option once per process say so in its doc.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace keraunos::options {

enum class Kind {
  Flag,   // on/off: unset gives the default; "", "0", "false", "off", "no" are off
  Text,   // a string (a path, a library, a choice)
  Words,  // whitespace-separated words (a command, compiler flags)
  Tuning, // "key=value,...": integer keys declared in the tuning-key table
};

struct Option {
  const char* name;     // "cache_dir"
  const char* env;      // "KERAUNOS_CACHE_DIR", or nullptr (a jit option only)
  Kind kind;
  const char* fallback; // the default, as text ("" where there is none)
  const char* jit_arg;  // keraunos.jit's keyword for it, or nullptr
  const char* doc;
};

// One key of a Tuning option: an integer in [lo, hi] (a power of two where `pow2`), or 0
// where `zero_ok`; a switch is 0 or 1 (any nonzero value turns it on).
struct TuningKey {
  const char* option;
  const char* name;
  int64_t lo, hi;
  bool pow2, zero_ok, is_switch;
  const char* doc;
};

std::span<const Option> all();
std::span<const TuningKey> tuning_keys();

// The option's text: set()'s value, else its environment variable (empty counts as unset,
// except for flags), else nullopt. Unknown names are internal errors.
std::optional<std::string> get(std::string_view name);
// set()'s value alone (nullopt when set() has not been called or was cleared).
std::optional<std::string> override_of(std::string_view name);
// `s` split at whitespace (spaces, tabs, newlines): how Words options are read.
std::vector<std::string> split_words(std::string_view s);
// get() or the default.
std::string text(std::string_view name);
bool flag(std::string_view name);
std::vector<std::string> words(std::string_view name);
// A Tuning option's keys, validated against the table (a user error names the option's
// environment variable and the bad item); `spec` overrides the option's current text.
std::vector<std::pair<std::string, int64_t>> tuning(std::string_view name,
                                                    std::optional<std::string> spec = {});

// Sets (or, with nullopt, clears) the option's value for this process; a user error for an
// unknown name or a value its kind refuses.
void set(std::string_view name, std::optional<std::string> value);

} // namespace keraunos::options
