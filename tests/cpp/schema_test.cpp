// Schema parsing and argument binding.
#include "keraunos/ir/error.h"
#include "keraunos/ops/builder.h"
#include "keraunos/ops/op_table.h"
#include "keraunos/ir/schema.h"

#include <gtest/gtest.h>

namespace keraunos {
namespace {

const char* kSchema =
    "f(Tensor a, int b=2, int[] dims=[0, 1], *, float c=1.0, str? mode=None, bool flag=True, "
    "Tensor|Scalar other=-3, float eps=1e-05) -> Tensor";

TEST(ParseSchema, ParamsTypesDefaults) {
  Schema s = parse_schema(kSchema);
  EXPECT_EQ(s.name, "f");
  EXPECT_EQ(s.returns, "Tensor");
  ASSERT_EQ(s.params.size(), 8u);
  const auto& p = s.params;
  EXPECT_EQ(p[0].name, "a");
  EXPECT_EQ(p[0].type, ArgType::Tensor);
  EXPECT_FALSE(p[0].has_default);
  EXPECT_FALSE(p[0].kwarg_only);
  EXPECT_EQ(p[1].type, ArgType::Int);
  EXPECT_TRUE(p[1].has_default);
  EXPECT_EQ(p[1].default_value, Arg(int64_t{2}));
  EXPECT_EQ(p[2].type, ArgType::IntList);
  EXPECT_EQ(p[2].default_value, Arg::int_list({0, 1}));
  EXPECT_FALSE(p[2].kwarg_only);
  EXPECT_TRUE(p[3].kwarg_only);
  EXPECT_EQ(p[3].type, ArgType::Float);
  EXPECT_EQ(p[3].default_value, Arg(1.0));
  EXPECT_TRUE(p[3].default_value.is_float());
  EXPECT_EQ(p[4].type, ArgType::Str);
  EXPECT_TRUE(p[4].optional);
  EXPECT_TRUE(p[4].default_value.is_none());
  EXPECT_EQ(p[5].default_value, Arg(true));
  EXPECT_EQ(p[6].type, ArgType::TensorOrNum);
  EXPECT_EQ(p[6].default_value, Arg(int64_t{-3}));
  EXPECT_EQ(p[7].default_value, Arg(1e-5));
  EXPECT_EQ(s.str(),
            "f(Tensor a, int b=2, tuple of ints dims=[0, 1], *, float c=1.0, str? mode=None, "
            "bool flag=True, Tensor or number other=-3, float eps=1e-05) -> Tensor");
}

TEST(ParseSchema, OpTableSchemas) {
  const OpDef* add = find_op("add");
  ASSERT_NE(add, nullptr);
  EXPECT_EQ(add->schema.params.size(), 3u);
  EXPECT_TRUE(add->schema.params[2].kwarg_only);
  EXPECT_EQ(add->schema.params[2].name, "alpha");
  const OpDef* full = find_op("prim_full");
  ASSERT_NE(full, nullptr);
  EXPECT_EQ(full->schema.params[2].type, ArgType::ScalarType);
  EXPECT_EQ(full->schema.params[3].type, ArgType::DeviceT);
  EXPECT_EQ(find_op("no_such_op"), nullptr);
}

struct Bound {
  Arg::List args;
  std::string error;
  ErrorKind kind = ErrorKind::Runtime;
};

Bound bind(const Arg::List& args, const Kwargs& kwargs = {}) {
  static const Schema s = parse_schema(kSchema);
  Bound r;
  try {
    r.args = bind_args(s, args, kwargs, "torch.f");
  } catch (const UserError& e) {
    r.error = e.what();
    r.kind = e.kind();
  }
  return r;
}

TEST(BindArgs, DefaultsFilled) {
  Builder b;
  auto t = b.new_tensor(DType::Float32, Device{}, {2});
  Bound r = bind({Arg(t)});
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.args.size(), 8u);
  EXPECT_EQ(r.args[0].tensor(), t);
  EXPECT_EQ(r.args[1], Arg(int64_t{2}));
  EXPECT_EQ(r.args[2], Arg::int_list({0, 1}));
  EXPECT_EQ(r.args[3], Arg(1.0));
  EXPECT_TRUE(r.args[4].is_none());
  EXPECT_EQ(r.args[5], Arg(true));
  EXPECT_EQ(r.args[6], Arg(int64_t{-3}));
}

TEST(BindArgs, PositionalAndKeywords) {
  Builder b;
  auto t = b.new_tensor(DType::Float32, Device{}, {2});
  Bound r = bind({Arg(t), Arg(int64_t{5})},
                 {{"c", Arg(int64_t{3})}, {"mode", Arg("floor")}, {"dims", Arg(int64_t{4})},
                  {"other", Arg(t)}});
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.args[1], Arg(int64_t{5}));
  EXPECT_EQ(r.args[2], Arg::int_list({4})); // a single int becomes a list
  EXPECT_TRUE(r.args[3].is_float());        // an int for a float parameter becomes a float
  EXPECT_EQ(r.args[3], Arg(3.0));
  EXPECT_EQ(r.args[4], Arg("floor"));
  EXPECT_EQ(r.args[6].tensor(), t);
  // Keyword for a positional parameter; bool accepted as int.
  Bound k = bind({}, {{"a", Arg(t)}, {"b", Arg(true)}});
  ASSERT_EQ(k.error, "");
  EXPECT_EQ(k.args[1], Arg(true));
}

TEST(BindArgs, Errors) {
  Builder b;
  auto t = Arg(b.new_tensor(DType::Float32, Device{}, {2}));
  struct Case {
    Arg::List args;
    Kwargs kwargs;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{t, Arg(int64_t{1}), Arg::int_list({1}), Arg(1.0)}, {},
       "torch.f() takes 3 positional arguments but 4 were given"},
      {{t}, {{"d", Arg(int64_t{1})}}, "torch.f() got an unexpected keyword argument 'd'"},
      {{t, Arg(int64_t{1})}, {{"b", Arg(int64_t{2})}},
       "torch.f() got multiple values for argument 'b'"},
      {{}, {{"b", Arg(int64_t{2})}}, "torch.f() missing required argument 'a'"},
      {{t, Arg(2.5)}, {}, "torch.f(): argument 'b' must be int, not float"},
      {{Arg(int64_t{1})}, {}, "torch.f(): argument 'a' must be Tensor, not int"},
      {{t}, {{"mode", Arg(int64_t{3})}}, "torch.f(): argument 'mode' must be str or None, not int"},
      {{t}, {{"flag", Arg()}}, "torch.f(): argument 'flag' must be bool, not None"},
      {{t}, {{"flag", Arg(int64_t{1})}}, "torch.f(): argument 'flag' must be bool, not int"},
      {{t, Arg(int64_t{1}), Arg(Arg::List{Arg(int64_t{1}), Arg(2.0)})}, {},
       "torch.f(): argument 'dims' must be tuple of ints, not list"},
      {{t}, {{"other", Arg("x")}}, "torch.f(): argument 'other' must be Tensor or number, not str"},
      {{t}, {{"c", Arg(true)}}, "torch.f(): argument 'c' must be float, not bool"},
  };
  for (const auto& c : cases) {
    Bound r = bind(c.args, c.kwargs);
    EXPECT_EQ(r.error, c.message);
    EXPECT_EQ(r.kind, ErrorKind::Type) << c.message;
  }
}

TEST(BindArgs, ThroughTheBuilderNamesTheCall) {
  Builder b;
  auto t = b.add_input(DType::Float32, Device{}, {2}, {});
  auto loc = std::make_shared<SourceLoc>(SourceLoc{"user.py", 12, "f"});
  try {
    b.call_user(OpId::add, {Arg(t)}, {}, "torch.add", loc);
    FAIL() << "expected an error";
  } catch (const UserError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Type);
    EXPECT_EQ(std::string(e.what()), "torch.add() missing required argument 'b' (at user.py:12)");
  }
  // A failed call records nothing.
  EXPECT_EQ(b.scope_size(), 0u);
}

} // namespace
} // namespace keraunos
