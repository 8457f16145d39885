// ONNX importer: external data, Constant nodes, unsupported ops, malformed and truncated files.
#include <onnx/onnx_pb.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "engine/exec/executor.h"
#include "engine/passes/passes.h"
#include "importers/onnx/onnx_import.h"
#include "tests/test_util.h"

using namespace wxe;
using namespace wxe::test;

namespace {

std::string tmp_dir() {
  auto d = std::filesystem::temp_directory_path() / ("wxe_onnx_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return d.string();
}

// y = Relu(x * w + c), w an initializer (optionally external), c a Constant node.
onnx::ModelProto small_model(bool external, const std::string& ext_file = "") {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  auto* in = g->add_input();
  in->set_name("x");
  auto* tt = in->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  tt->mutable_shape()->add_dim()->set_dim_param("batch");
  tt->mutable_shape()->add_dim()->set_dim_value(3);
  g->add_output()->set_name("y");
  auto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(3);
  float wv[3] = {1.f, -2.f, 3.f};
  if (external) {
    w->set_data_location(onnx::TensorProto::EXTERNAL);
    auto add = [&](const char* k, const std::string& v) {
      auto* e = w->add_external_data();
      e->set_key(k);
      e->set_value(v);
    };
    add("location", ext_file);
    add("offset", "8");
    add("length", "12");
  } else {
    w->set_raw_data(std::string((const char*)wv, 12));
  }
  auto* c = g->add_node();
  c->set_op_type("Constant");
  c->add_output("c");
  auto* a = c->add_attribute();
  a->set_name("value_float");
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(0.5f);
  auto* mul = g->add_node();
  mul->set_op_type("Mul");
  mul->set_name("mul");
  mul->add_input("x");
  mul->add_input("w");
  mul->add_output("xw");
  auto* add = g->add_node();
  add->set_op_type("Add");
  add->set_name("add");
  add->add_input("xw");
  add->add_input("c");
  add->add_output("s");
  auto* relu = g->add_node();
  relu->set_op_type("Relu");
  relu->set_name("relu");
  relu->add_input("s");
  relu->add_output("y");
  return m;
}

std::string save(const onnx::ModelProto& m, const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  m.SerializeToOstream(&f);
  return path;
}

std::string import_error(const std::string& path) {
  try {
    import_onnx(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void check_runs(const std::string& path) {
  Graph g = import_onnx(path);
  simplify(g, {{"x", {DType::F32, {2, 3}}}});
  Tensor x = Tensor::from_f32({2, 3}, {1, 1, 1, -1, -1, -1});
  Tensor y = Executor(g).run({{"x", x}})[0];
  std::vector<float> want = {1.5f, 0.f, 3.5f, 0.f, 2.5f, 0.f};
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(y.data<float>()[i], want[i]);
}

}  // namespace

TEST(OnnxImport, InlineInitializerAndConstantNode) {
  std::string d = tmp_dir();
  check_runs(save(small_model(false), d + "/inline.onnx"));
}

TEST(OnnxImport, ExternalDataResolvedRelativeToModel) {
  std::string d = tmp_dir();
  std::filesystem::create_directories(d + "/sub");
  float wv[5] = {99.f, 99.f, 1.f, -2.f, 3.f};  // offset 8 skips the first two
  std::ofstream(d + "/sub/weights.bin", std::ios::binary).write((const char*)wv, sizeof wv);
  check_runs(save(small_model(true, "weights.bin"), d + "/sub/ext.onnx"));
}

TEST(OnnxImport, TruncatedExternalDataIsAnError) {
  std::string d = tmp_dir();
  float wv[2] = {0, 0};
  std::ofstream(d + "/short.bin", std::ios::binary).write((const char*)wv, sizeof wv);
  std::string e = import_error(save(small_model(true, "short.bin"), d + "/short.onnx"));
  EXPECT_NE(e.find("initializer 'w'"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}

TEST(OnnxImport, UnsupportedOpsListedTogether) {
  onnx::ModelProto m = small_model(false);
  auto* g = m.mutable_graph();
  for (auto [op, name] : {std::pair{"FooOp", "foo1"}, {"FooOp", "foo2"}, {"BarOp", "bar"}}) {
    auto* n = g->add_node();
    n->set_op_type(op);
    n->set_name(name);
    n->add_input("y");
    n->add_output(std::string(name) + "_out");
  }
  std::string e = import_error(save(m, tmp_dir() + "/unsupported.onnx"));
  EXPECT_NE(e.find("FooOp (node foo1)"), std::string::npos) << e;
  EXPECT_NE(e.find("BarOp (node bar)"), std::string::npos) << e;
  EXPECT_EQ(e.find("foo2"), std::string::npos) << e;
}

TEST(OnnxImport, GarbageAndTruncatedFilesAreOneLineErrors) {
  std::string d = tmp_dir();
  std::ofstream(d + "/garbage.onnx") << "this is not a protobuf \x01\x02\xff";
  std::string e = import_error(d + "/garbage.onnx");
  EXPECT_NE(e.find("garbage.onnx"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
  std::string bytes = small_model(false).SerializeAsString();
  for (size_t cut : {bytes.size() / 4, bytes.size() / 2, bytes.size() - 3}) {
    std::ofstream(d + "/trunc.onnx", std::ios::binary).write(bytes.data(), cut);
    EXPECT_FALSE(import_error(d + "/trunc.onnx").empty()) << "cut at " << cut;
  }
  EXPECT_NE(import_error(d + "/missing.onnx").find("cannot open"), std::string::npos);
}

TEST(OnnxImport, OldOpsetRejected) {
  onnx::ModelProto m = small_model(false);
  m.mutable_opset_import(0)->set_version(9);
  EXPECT_NE(import_error(save(m, tmp_dir() + "/old.onnx")).find("opset 9"), std::string::npos);
}
