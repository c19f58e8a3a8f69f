#pragma once
#include <nanobind/nanobind.h>

#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace keraunos::py {
namespace nb = nanobind;

// A call the dispatcher refuses before anything runs: a tensor argument keraunos cannot read
// (a torch.func-transformed tensor inside torch.vmap / torch.func.grad, a tensor with no
// strided storage such as a sparse one, whose data_ptr() raises). Python sees
// keraunos._C.UnsupportedCall, a subclass of NotImplementedError; torch.compile regions run
// eagerly on it.
struct UnsupportedCall : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// For each tensor, the index of the first earlier tensor sharing its storage, or -1. The
// dispatcher's cache key holds it; a split program's segments group their inputs with it.
std::vector<int64_t> alias_groups(const std::vector<PyObject*>& tensors);

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
// Every Python C-API result is checked: a failing attribute or method raises the Python
// error (or UnsupportedCall), never dereferences NULL.
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
  void check_not_transformed(const std::vector<PyObject*>& tensors);

  nb::object tensor_type_;
  nb::object compile_fn_;
  std::unordered_map<CallKey, Entry, CallKeyHash> cache_;
  int64_t hits_ = 0, misses_ = 0;
};

} // namespace keraunos::py
