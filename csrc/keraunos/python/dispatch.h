#pragma once
#include <nanobind/nanobind.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace keraunos::py {
namespace nb = nanobind;

struct CallKey {
  std::vector<int64_t> ints;
  std::vector<std::string> strs;
  bool operator==(const CallKey&) const = default;
  size_t hash() const;
};
struct CallKeyHash {
  size_t operator()(const CallKey& k) const { return k.hash(); }
};

// A jitted function's cache: call signature -> program. On a miss it calls
// compile_fn(tensors, alias_groups, args, kwargs) -> (program, extra_inputs, post).
class Dispatcher {
public:
  Dispatcher(nb::object tensor_type, nb::object compile_fn);
  nb::object call(nb::args args, nb::kwargs kwargs);
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }
  size_t size() const { return cache_.size(); }
  void clear();
  // Garbage-collector support: the compile function usually refers back to this object.
  int traverse(visitproc visit, void* arg);
  void release();

private:
  struct Entry {
    nb::object program;
    std::vector<nb::object> extra; // lifted tensors (captured globals, closures)
    nb::object post;               // rebuilds the user's output structure, or None
    std::vector<nb::object> keep;  // objects the key names by identity
  };
  void walk(PyObject* o, CallKey& key, std::vector<PyObject*>& tensors,
            std::vector<nb::object>& keep);
  std::vector<int64_t> alias_groups(const std::vector<PyObject*>& tensors);

  nb::object tensor_type_;
  nb::object compile_fn_;
  std::unordered_map<CallKey, Entry, CallKeyHash> cache_;
  int64_t hits_ = 0, misses_ = 0;
};

} // namespace keraunos::py
