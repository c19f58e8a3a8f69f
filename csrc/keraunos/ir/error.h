// Two error channels (STYLE.md §4): user errors become Python TypeError / ValueError /
// NotImplementedError / RuntimeError with the op and the user's source line; internal errors
// say which pass failed and ask for a reproducer.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace keraunos {

enum class ErrorKind { Type, Value, NotImplemented, Runtime, Index };

class UserError : public std::runtime_error {
public:
  UserError(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

private:
  ErrorKind kind_;
};

class InternalError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Args> std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
} // namespace detail

} // namespace keraunos

// KR_CHECK(cond, kind, msg...): a user error when cond fails.
#define KR_CHECK(cond, kind, ...)                                                                  \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      throw ::keraunos::UserError(::keraunos::ErrorKind::kind, ::keraunos::detail::cat(__VA_ARGS__)); \
  } while (0)
#define KR_USER_ERROR(kind, ...)                                                                   \
  throw ::keraunos::UserError(::keraunos::ErrorKind::kind, ::keraunos::detail::cat(__VA_ARGS__))
// KR_INTERNAL(cond, msg...): a keraunos bug.
#define KR_INTERNAL(cond, ...)                                                                     \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      throw ::keraunos::InternalError(::keraunos::detail::cat(                                     \
          "keraunos internal error (please report with a reproducer): ", __VA_ARGS__, " [",        \
          __FILE__, ":", __LINE__, "]"));                                                          \
  } while (0)
