// The trace builder: acquisition (the Python tracer calls `call_user` for every torch call)
// and decomposition (op implementations call `call` for the prims they decompose into) both
// record bound symbols through it.
#pragma once
#include "keraunos/ir/trace.h"

#include <memory>
#include <string>
#include <vector>

namespace keraunos {

struct BuilderOptions {
  DType default_float = DType::Float32;
};

class Builder {
public:
  explicit Builder(BuilderOptions opts = {});

  const BuilderOptions& options() const { return opts_; }

  // A program input. `storage_id` groups inputs that share memory (-1: a storage of its own).
  TensorRef add_input(DType dtype, Device device, Shape shape, Shape strides,
                      int64_t storage_offset = 0, int64_t storage_id = -1,
                      bool requires_grad = false);

  // A fresh tensor with its own storage (contiguous when `strides` is empty).
  TensorRef new_tensor(DType dtype, Device device, Shape shape, Shape strides = {});
  // A tensor sharing `base`'s storage (a view).
  TensorRef new_view(const TensorRef& base, Shape shape, Shape strides, int64_t storage_offset,
                     std::optional<DType> dtype = std::nullopt);

  // Records `op(args)` (args already canonical) in the current scope; returns its outputs.
  Arg call(OpId op, Arg::List args, std::shared_ptr<const SourceLoc> loc = nullptr);
  // Binds a user call (positional + keyword args) and records it with its source location.
  // User errors are re-thrown naming `display` and the location.
  Arg call_user(OpId op, const Arg::List& args, const Kwargs& kwargs, const std::string& display,
                std::shared_ptr<const SourceLoc> loc);

  // Appends a ready-made bound symbol to the current scope (passes that copy symbols).
  void append(BoundSymbol b) { scopes_.back()->push_back(std::move(b)); }
  // Makes fresh names and storage ids start above every one `t` uses (passes that add
  // symbols to an existing trace).
  void reserve_names(const Trace& t);

  // Records the write of `src` into `dst` (prims.copy_, converting dtype).
  void write_into(const TensorRef& dst, const TensorRef& src);

  // Ends the trace with `return output`.
  void set_return(Arg output);
  Trace finish();

  // The symbol of the current scope (or of `also_known`'s list) that made `t` (nullptr for
  // inputs and tensors of other scopes). Backward rules use it to rewrite a gradient made a
  // line before, or to see how a forward value was made.
  const BoundSymbol* producer(const TensorRef& t) const;
  // Symbols outside the builder whose outputs producer() also finds (the autodiff pass: the
  // forward program's, while it builds the backward). The list must outlive the builder's use.
  void also_known(const std::vector<BoundSymbol>* symbols) { known_ = symbols; }

  // Number of bound symbols recorded in the current scope (for tests).
  size_t scope_size() const { return scopes_.back()->size(); }

private:
  std::string fresh_name();

  BuilderOptions opts_;
  int64_t next_name_ = 0;
  int64_t next_storage_ = 0;
  std::vector<TensorRef> inputs_;
  std::vector<BoundSymbol> top_;
  std::vector<std::vector<BoundSymbol>*> scopes_;
  const std::vector<BoundSymbol>* known_ = nullptr;
  bool returned_ = false;
};

// Re-runs `bsym`'s implementation on its arguments in a scratch builder and returns the
// outputs it infers (the verifier compares them with the recorded ones).
Arg reinfer(const BoundSymbol& bsym, const BuilderOptions& opts);

} // namespace keraunos
