#include "keraunos/passes/pass_manager.h"

#include "keraunos/ir/error.h"
#include "keraunos/ir/verifier.h"
#include "keraunos/passes/cse.h"
#include "keraunos/passes/dce.h"
#include "keraunos/passes/functionalize.h"
#include "keraunos/passes/grouped_query_attention.h"
#include "keraunos/passes/partition.h"

#include <chrono>

namespace keraunos {

namespace {

struct NamedPass {
  const char* name;
  PassFn fn;
  bool functional; // the output is functional (checked as such)
};

// The pipeline.
constexpr NamedPass kPasses[] = {
    {"functionalize", &functionalize, true},
    {"dce", &dce, true},
    {"cse", &cse, true},
    {"grouped_query_attention", &grouped_query_attention, true},
    {"dce", &dce, true},
    {"partition", &partition, true},
};

void check(const Trace& before, const Trace& after, const char* pass, const PassContext& ctx,
           bool claimed_change, bool functional) {
  VerifyOptions vo;
  vo.reinfer = [&](const BoundSymbol& b) { return reinfer(b, ctx.builder); };
  vo.functional = functional;
  std::string err = verify(after, vo);
  if (err.empty() && !claimed_change && before.str(false) != after.str(false)) {
    // Headers differ by stage name; compare bodies only.
    auto body = [](const Trace& t) {
      std::string s = t.str(false);
      return s.substr(s.find('\n') + 1);
    };
    if (body(before) != body(after)) err = "the pass claimed no change but changed the trace";
  }
  if (!err.empty())
    throw InternalError(std::string("keraunos internal error: the trace failed verification after "
                                    "pass '") +
                        pass + "': " + err + "\n--- before ---\n" + before.str() +
                        "--- after ---\n" + after.str() +
                        "Please report this with the program that produced it.");
}

} // namespace

std::vector<Trace> run_pipeline(Trace acquired, const PassContext& ctx) {
  KR_CHECK(ctx.fusion_type == "consecutive" || ctx.fusion_type == "dataflow", Value,
           "fusion_type must be 'consecutive' or 'dataflow', got '", ctx.fusion_type, "'");
  std::vector<Trace> stages;
  if (ctx.verify) check(acquired, acquired, "acquire", ctx, true, false);
  stages.push_back(std::move(acquired));
  for (const auto& p : kPasses) {
    auto t0 = std::chrono::steady_clock::now();
    PassResult r = p.fn(stages.back(), ctx);
    r.trace.stage = p.name;
    r.trace.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (ctx.verify) check(stages.back(), r.trace, p.name, ctx, r.changed, p.functional);
    stages.push_back(std::move(r.trace));
  }
  return stages;
}

namespace {
void flatten_into(const BoundSymbol& b, std::vector<BoundSymbol>& out) {
  if (b.def().is_prim() || b.def().has(tags::Ret) || b.subsymbols.empty()) {
    BoundSymbol c = b;
    c.subsymbols.clear();
    out.push_back(std::move(c));
    return;
  }
  for (const auto& s : b.subsymbols) flatten_into(s, out);
}
} // namespace

Trace flatten_to_prims(const Trace& trace) {
  Trace t;
  t.inputs = trace.inputs;
  t.stage = "flatten_to_prims";
  for (const auto& b : trace.bsyms) flatten_into(b, t.bsyms);
  return t;
}

} // namespace keraunos
