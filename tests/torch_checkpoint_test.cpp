// importers/torch: torch.save zip archives read without Python. Fixtures in tests/data/pt were
// made by models/make_pt_fixtures.py with PyTorch (the oracle for every expected value).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "engine/io/npy.h"
#include "tests/fixtures.h"
#include "tests/test_util.h"
#include "importers/torch/torch_checkpoint.h"
#include "importers/torch/zip.h"

namespace wxe {
namespace {

using namespace std::string_literals;
using namespace wxe::test;

std::string src(const std::string& rel) { return data_path(rel); }
std::string pt(const std::string& name) { return src("tests/data/pt/" + name); }


// ---- a STORED zip writer, to wrap hand-made or mutated pickles ----

void put16(std::string& s, uint32_t v) { s += (char)(v & 0xff); s += (char)((v >> 8) & 0xff); }
void put32(std::string& s, uint32_t v) { put16(s, v & 0xffff); put16(s, v >> 16); }

using Entries = std::vector<std::pair<std::string, std::string>>;

std::string make_zip(const Entries& entries) {
  std::string out, cd;
  for (const auto& [name, data] : entries) {
    uint32_t crc = torch_zip::crc32(reinterpret_cast<const uint8_t*>(data.data()), data.size());
    uint32_t off = (uint32_t)out.size();
    put32(out, 0x04034b50); put16(out, 20); put16(out, 0); put16(out, 0); put32(out, 0);
    put32(out, crc); put32(out, (uint32_t)data.size()); put32(out, (uint32_t)data.size());
    put16(out, (uint32_t)name.size()); put16(out, 0);
    out += name;
    out += data;
    put32(cd, 0x02014b50); put16(cd, 20); put16(cd, 20); put16(cd, 0); put16(cd, 0); put32(cd, 0);
    put32(cd, crc); put32(cd, (uint32_t)data.size()); put32(cd, (uint32_t)data.size());
    put16(cd, (uint32_t)name.size()); put16(cd, 0); put16(cd, 0); put16(cd, 0); put16(cd, 0);
    put32(cd, 0); put32(cd, off);
    cd += name;
  }
  uint32_t cd_off = (uint32_t)out.size();
  out += cd;
  put32(out, 0x06054b50); put16(out, 0); put16(out, 0);
  put16(out, (uint32_t)entries.size()); put16(out, (uint32_t)entries.size());
  put32(out, (uint32_t)cd.size()); put32(out, cd_off); put16(out, 0);
  return out;
}

Entries read_entries(const std::string& path) {
  torch_zip::Reader z(path);
  Entries r;
  for (const auto& e : z.entries()) r.emplace_back(e.name, z.read(e));
  return r;
}

std::string& pickle_of(Entries& es) {
  for (auto& [n, d] : es)
    if (n.size() >= 8 && n.compare(n.size() - 8, 8, "data.pkl") == 0) return d;
  throw std::runtime_error("no data.pkl");
}

// A checkpoint whose data.pkl is `pkl`, with storage "0" = two float32 (1, 2).
std::string write_pickle_zip(const std::string& name, const std::string& pkl,
                             const std::string& storage0 = std::string("\0\0\x80\x3f\0\0\0\x40", 8)) {
  std::string path = tmp_path(name);
  spit(path, make_zip({{"archive/data.pkl", pkl}, {"archive/data/0", storage0},
                       {"archive/version", "3\n"}}));
  return path;
}

std::string binunicode(const std::string& s) {
  std::string r = "X";
  put32(r, (uint32_t)s.size());
  return r + s;
}

// _rebuild_tensor_v2(storage '0' (2 floats), offset, (n,), (stride,), False, OrderedDict())
std::string tensor_op(int offset, int n, int stride) {
  std::string s = "ctorch._utils\n_rebuild_tensor_v2\n((" + binunicode("storage") +
                  "ctorch\nFloatStorage\n" + binunicode("0") + binunicode("cpu") + "K\x02tQ";
  s += "K"; s += (char)offset;
  s += "K"; s += (char)n; s += "\x85";
  s += "K"; s += (char)stride; s += "\x85";
  s += "\x89" "ccollections\nOrderedDict\n)RtR";
  return s;
}

// ---- expected values from PyTorch ----

struct Expect {
  std::string key, dtype, shape, npy;
};

std::vector<Expect> read_expect(const std::string& name) {
  std::ifstream f(pt(name + ".expect.txt"));
  EXPECT_TRUE(f.good()) << name;
  std::vector<Expect> r;
  std::string line;
  while (std::getline(f, line)) {
    Expect e;
    std::stringstream ss(line);
    std::getline(ss, e.key, '\t');
    std::getline(ss, e.dtype, '\t');
    std::getline(ss, e.shape, '\t');
    std::getline(ss, e.npy, '\t');
    r.push_back(e);
  }
  return r;
}

std::string shape_csv(const Shape& s) {
  std::string r;
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r;
}

// Same keys in the same order, same dtypes and shapes, bitwise equal values.
void expect_matches(const std::vector<std::pair<std::string, Tensor>>& got, const std::string& name) {
  std::vector<Expect> exp = read_expect(name);
  ASSERT_EQ(got.size(), exp.size()) << name;
  for (size_t i = 0; i < exp.size(); ++i) {
    SCOPED_TRACE(name + ": " + exp[i].key);
    EXPECT_EQ(got[i].first, exp[i].key);
    const Tensor& t = got[i].second;
    EXPECT_EQ(dtype_name(t.dtype), exp[i].dtype);
    EXPECT_EQ(shape_csv(t.shape), exp[i].shape);
    Tensor ref = read_npy(pt(exp[i].npy));
    Tensor cmp = t.dtype == DType::BF16 ? t.to_f32() : t;  // bf16 expected as float32 (exact)
    ASSERT_EQ(cmp.dtype, ref.dtype);
    ASSERT_EQ(cmp.nbytes(), ref.nbytes());
    if (cmp.nbytes()) {
      EXPECT_EQ(std::memcmp(cmp.raw(), ref.raw(), cmp.nbytes()), 0);
    }
  }
}

// ---- tests ----

TEST(TorchCheckpoint, BareStateDictAllDtypes) {
  std::vector<std::string> other = {"stale"};
  StateDict sd = read_torch_state_dict(pt("bare.pt"), &other);
  expect_matches(sd.tensors, "bare");
  EXPECT_TRUE(other.empty());
}

TEST(TorchCheckpoint, DeflateAndZip64Archives) {
  std::string z64 = slurp(pt("bare_zip64.pt"));
  ASSERT_NE(z64.find(std::string("PK\x06\x06", 4)), std::string::npos) << "fixture lacks ZIP64 records";
  expect_matches(read_torch_state_dict(pt("bare_zip64.pt")).tensors, "bare");
  expect_matches(read_torch_state_dict(pt("bare_deflate.pt")).tensors, "bare");
  torch_zip::Reader z(pt("bare_deflate.pt"));
  int deflated = 0;
  for (auto& e : z.entries()) deflated += e.method == 8;
  EXPECT_GT(deflated, 0);
}

TEST(TorchCheckpoint, StridedViewsAndSharedStorage) {
  StateDict sd = read_torch_state_dict(pt("views.pt"));  // pickle protocol 4
  expect_matches(sd.tensors, "views");
  ASSERT_GE(sd.tensors.size(), 3u);
  Tensor& base = sd.tensors[0].second;
  Tensor& tr = sd.tensors[1].second;
  ASSERT_EQ(tr.shape, (Shape{6, 4}));
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 6; ++j) EXPECT_EQ(tr.data<float>()[j * 4 + i], base.data<float>()[i * 6 + j]);
  // Views are copied out: writing one does not change another.
  float before = tr.data<float>()[0];
  base.data<float>()[0] = 123.f;
  EXPECT_EQ(tr.data<float>()[0], before);
}

TEST(TorchCheckpoint, TrainerCheckpointReturnsModelStateDict) {
  std::vector<std::string> other;
  StateDict sd = read_torch_state_dict(pt("trainer.pt"), &other);
  expect_matches(sd.tensors, "trainer");
  auto has = [&](const std::string& k) { return std::find(other.begin(), other.end(), k) != other.end(); };
  for (const char* k : {"epoch", "optimizer_state_dict", "scheduler_state_dict", "scaler_state_dict",
                        "loss", "extra_u16"})
    EXPECT_TRUE(has(k)) << k;
  EXPECT_FALSE(has("model_state_dict"));
}

TEST(TorchCheckpoint, ParametersUnderStateDictKey) {
  std::vector<std::string> other;
  StateDict sd = read_torch_state_dict(pt("params.pt"), &other);
  expect_matches(sd.tensors, "params");
  EXPECT_EQ(other, std::vector<std::string>{"note"});
}

TEST(TorchCheckpoint, LegacyAndNonZipFilesRejected) {
  EXPECT_NE(error_of([] { read_torch_state_dict(pt("legacy.pt")); }).find("legacy"), std::string::npos);
  std::string e = error_of([] { read_torch_state_dict(pt("bare.expect.txt")); });
  EXPECT_NE(e.find("not a zip"), std::string::npos) << e;
  e = error_of([] { read_torch_state_dict(pt("no_such_file.pt")); });
  EXPECT_NE(e.find("no_such_file.pt"), std::string::npos) << e;
}

TEST(TorchCheckpoint, MaliciousGlobalsRejectedAndNothingRuns) {
  std::string marker = "/tmp/wxe_pwned_" + std::to_string(getpid());
  std::filesystem::remove(marker);
  const std::pair<const char*, const char*> cases[] = {
      {"evil_os_system.pt", "'os.system'"},
      {"evil_posix_system.pt", "'posix.system'"},
      {"evil_builtins_eval.pt", "'builtins.eval'"},
      {"evil_subprocess.pt", "'subprocess.Popen'"}};
  for (auto& [file, name] : cases) {
    std::string e = error_of([&] { read_torch_state_dict(pt(file)); });
    EXPECT_NE(e.find(name), std::string::npos) << e;
    EXPECT_NE(e.find(file), std::string::npos) << e;
    EXPECT_NE(e.find("disallowed global"), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  EXPECT_FALSE(std::filesystem::exists(marker)) << "a payload ran: " << marker;
  // Rejected at the GLOBAL opcode itself: no REDUCE needed.
  const std::pair<std::string, std::string> globals[] = {
      {"cos\nsystem\n", "os.system"},
      {"c__builtin__\neval\n", "__builtin__.eval"},
      {"cbuiltins\ngetattr\n", "builtins.getattr"},
      {"ctorch\nload\n", "torch.load"},
      {"ctorch._utils\n_rebuild_qtensor\n", "torch._utils._rebuild_qtensor"},
      {"cnumpy.core.multiarray\n_reconstruct\n", "numpy.core.multiarray._reconstruct"},
      {std::string("\x8c\x02os\x8c\x06system\x93", 13), "os.system"},  // STACK_GLOBAL
  };
  for (auto& [op, name] : globals) {
    std::string path = write_pickle_zip("global.pt", "\x80\x02" + op + ".");
    std::string e = error_of([&] { read_torch_state_dict(path); });
    EXPECT_NE(e.find("disallowed global '" + name + "'"), std::string::npos) << e;
  }
}

TEST(TorchCheckpoint, MalformedPicklesAreErrors) {
  std::string tensor_ok = tensor_op(0, 2, 1);
  const std::pair<std::string, std::string> cases[] = {
      {"", "truncated"},
      {"\x80\x02", "truncated"},
      {"\x80\x02R.", "stack underflow"},
      {"\x80\x02}(X\x01\x00\x00\x00w."s, "open MARK"},
      {"\x80\x02}}."s, "2 objects"},
      {"\x80\x02\xff.", "opcode 0xff"},
      {"\x80\x09}.", "protocol"},
      {"\x80\x02h\x05.", "memo"},
      {"\x80\x02u.", "MARK"},
      {"\x80\x02](K\x01K\x02u.", "SETITEM on a list"},
      {"\x80\x02}K\x01" "a.", "APPEND on a dict"},
      {"\x80\x02]q\x00h\x00" "a."s, "not a dict"},  // a list containing itself
      {"\x80\x02K\x01.", "not a dict"},
      {"\x80\x02}(" + binunicode("w") + binunicode("x") + "u.", "no state dict found"},
      {"\x80\x02}(" + binunicode("model_state_dict") + "}(" + binunicode("w") + binunicode("x") +
           "uu.", "entry 'w' in model_state_dict is str 'x', not a tensor"},
      {"\x80\x02}(" + binunicode("w") + tensor_op(1, 2, 1) + "u.", "tensor 'w'"},   // past the end
      {"\x80\x02}(" + binunicode("w") + tensor_op(0, 3, 1) + "u.", "reads past"},
      {"\x80\x02}(" + binunicode("w") + tensor_op(0, 2, 2) + "u.", "reads past"},
      {"\x80\x02}(" + binunicode("w") + tensor_ok + binunicode("v") + tensor_op(0, 2, 9) +
           "u.", "tensor 'v'"},
      {"\x80\x02}(" + binunicode("w") + "ctorch._utils\n_rebuild_tensor_v2\n(K\x00K\x00)"s +
           ")\x89}tRu.", "not a storage"},
      {"\x80\x02}(" + binunicode("w") + "ctorch\nFloatStorage\n)Ru.", "not callable"},
      {"\x80\x02(" + binunicode("storage") + "ctorch\nFloatStorage\n" + binunicode("7") +
           binunicode("cpu") + "K\x02tQ.", "missing"},
      {"\x80\x02(" + binunicode("storage") + "ctorch\nFloatStorage\n" + binunicode("0") +
           binunicode("cpu") + "K\x03tQ.", "holds 8 bytes"},
      {"\x80\x02(" + binunicode("module") + "tQ.", "persistent id"},
      {"\x80\x02X\xff\xff\xff\x7f" "abc", "truncated"},
      {"\x80\x02\x8d\xff\xff\xff\xff\xff\xff\xff\xff" "abc", "truncated"},
      {"\x80\x02\x95\xff\xff\xff\xff\xff\xff\xff\x7f}.", "frame"},
  };
  for (auto& [pkl, want] : cases) {
    std::string path = write_pickle_zip("bad.pt", pkl);
    std::string e = error_of([&] { read_torch_state_dict(path); });
    EXPECT_NE(e.find(want), std::string::npos) << "pickle " << testing::PrintToString(pkl) << ": " << e;
    EXPECT_NE(e.find(path), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  // The same hand-made tensor op is fine when in bounds.
  StateDict sd = read_torch_state_dict(write_pickle_zip("ok.pt", "\x80\x02}(" + binunicode("w") + tensor_ok + "u."));
  ASSERT_EQ(sd.tensors.size(), 1u);
  EXPECT_EQ(sd.tensors[0].second.data<float>()[1], 2.f);
}

TEST(TorchCheckpoint, DeepNestingAndHugeCountsAreBounded) {
  // 300k nested lists: no recursion anywhere (parse, validation, destruction).
  std::string deep = "\x80\x02";
  deep += std::string(300000, ']');
  deep += std::string(299999, 'a');
  deep += ".";
  std::string e = error_of([&] { read_torch_state_dict(write_pickle_zip("deep.pt", deep)); });
  EXPECT_NE(e.find("not a dict"), std::string::npos) << e;
  // Deep nesting inside a trainer checkpoint's other entries is fine.
  std::string ok = "\x80\x02}(" + binunicode("model_state_dict") + "}" + binunicode("junk") +
                   std::string(100000, ']') + std::string(99999, 'a') + "u.";
  StateDict sd = read_torch_state_dict(write_pickle_zip("deep_ok.pt", ok));
  EXPECT_TRUE(sd.tensors.empty());
  // An expanded view bigger than any sane budget (stride 0) is refused, not allocated.
  std::string big = "\x80\x02}(" + binunicode("w") + "ctorch._utils\n_rebuild_tensor_v2\n((" +
                    binunicode("storage") + "ctorch\nFloatStorage\n" + binunicode("0") +
                    binunicode("cpu") + "K\x02tQK\x00J\x00\x00\x00\x40J\x00\x00\x00\x40\x86K\x00K\x00\x86\x89}tRu."s;
  e = error_of([&] { read_torch_state_dict(write_pickle_zip("big.pt", big)); });
  EXPECT_NE(e.find("too large"), std::string::npos) << e;
}

TEST(TorchCheckpoint, TruncatedFilesAreErrors) {
  for (const char* name : {"bare.pt", "views.pt", "trainer.pt", "bare_zip64.pt", "bare_deflate.pt"}) {
    std::string bytes = slurp(pt(name));
    std::string path = tmp_path("torch_cut.pt");
    size_t step = std::max<size_t>(1, bytes.size() / 800);
    for (size_t n = 0; n < bytes.size(); n += step) {
      spit(path, bytes.substr(0, n));
      EXPECT_THROW(read_torch_state_dict(path), Error) << name << " cut at " << n;
    }
  }
  // Truncated pickles inside a valid zip.
  Entries es = read_entries(pt("trainer.pt"));
  std::string pkl = pickle_of(es);
  std::string path = tmp_path("torch_cutpkl.pt");
  for (size_t n = 0; n < pkl.size(); n += std::max<size_t>(1, pkl.size() / 800)) {
    pickle_of(es) = pkl.substr(0, n);
    spit(path, make_zip(es));
    EXPECT_THROW(read_torch_state_dict(path), Error) << "data.pkl cut at " << n;
  }
}

// Random byte flips / inserts / deletes: every outcome is a result or a wxe::Error.
void mutate(std::string& s, std::mt19937& rng) {
  int ops = 1 + rng() % 4;
  for (int k = 0; k < ops; ++k) {
    size_t at = s.empty() ? 0 : rng() % s.size();
    switch (rng() % 5) {
      case 0: if (!s.empty()) s[at] ^= (char)(1 << (rng() % 8)); break;
      case 1: if (!s.empty()) s[at] = (char)rng(); break;
      case 2: s.insert(s.begin() + at, (char)rng()); break;
      case 3: if (!s.empty()) s.erase(at, 1 + rng() % 4); break;
      case 4: {  // an interesting value: 0, 0xff, a small int
        static const char vals[] = {0, '\xff', 1, 2, '\x7f', '\x80', '.', '(', 'R'};
        if (!s.empty()) s[at] = vals[rng() % sizeof vals];
        break;
      }
    }
  }
}

TEST(TorchCheckpoint, MutationFuzzNeverCrashes) {
  auto t0 = std::chrono::steady_clock::now();
  std::mt19937 rng(20240601);
  std::string path = tmp_path("torch_fuzz.pt");
  int ok = 0, errors = 0;
  for (const char* name : {"bare.pt", "views.pt", "trainer.pt", "params.pt", "evil_os_system.pt"}) {
    std::string file = slurp(pt(name));
    Entries es = read_entries(pt(name));
    std::string pkl = pickle_of(es);
    for (int it = 0; it < 700; ++it) {
      bool whole_file = it % 4 == 0;  // mostly mutate the pickle (re-zipped with a valid CRC)
      if (whole_file) {
        std::string m = file;
        mutate(m, rng);
        spit(path, m);
      } else {
        std::string m = pkl;
        mutate(m, rng);
        pickle_of(es) = m;
        spit(path, make_zip(es));
      }
      try {
        StateDict sd = read_torch_state_dict(path);
        ++ok;
      } catch (const Error& e) {
        ++errors;
        std::string msg = e.what();
        ASSERT_NE(msg.find(path), std::string::npos) << msg;
        ASSERT_EQ(msg.find('\n'), std::string::npos) << msg;
      }
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("mutation fuzz: %d loaded, %d errors, %.2f s\n", ok, errors, secs);
  EXPECT_GT(errors, 0);
}

// The real CREDIT checkpoints (the CREDIT fixtures outside the repository, $WXE_FIXTURES), when
// present.
void check_real(const std::string& model) {
  const std::string dir = credit_fixtures_dir();
  std::string ckpt = dir + model + "_checkpoint.pt", keys = dir + model + "_state_dict_keys.txt";
  if (!credit_fixtures_present({model + "_checkpoint.pt", model + "_state_dict_keys.txt"}))
    GTEST_SKIP() << credit_fixture_skip(model + "_checkpoint.pt");
  std::vector<std::string> other;
  StateDict sd = read_torch_state_dict(ckpt, &other);
  EXPECT_NE(std::find(other.begin(), other.end(), "optimizer_state_dict"), other.end());
  EXPECT_NE(std::find(other.begin(), other.end(), "epoch"), other.end());
  std::ifstream f(keys);
  std::string line;
  size_t i = 0;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    std::stringstream ss(line);
    std::string key, shape, dtype;
    std::getline(ss, key, '\t');
    std::getline(ss, shape, '\t');
    std::getline(ss, dtype, '\t');
    std::string want;  // "(8, 7, 4, 4)" / "(8,)" / "()" -> "8,7,4,4"
    for (char c : shape)
      if (std::isdigit((unsigned char)c) || c == ',') want += c;
    if (!want.empty() && want.back() == ',') want.pop_back();
    ASSERT_LT(i, sd.tensors.size()) << key;
    EXPECT_EQ(sd.tensors[i].first, key);
    EXPECT_EQ(shape_csv(sd.tensors[i].second.shape), want) << key;
    EXPECT_EQ(dtype_name(sd.tensors[i].second.dtype), dtype) << key;
    ++i;
  }
  EXPECT_EQ(i, sd.tensors.size());
}

TEST(TorchCheckpoint, RealCreditCrossformerTiny) { check_real("crossformer_tiny"); }
TEST(TorchCheckpoint, RealCreditWxformerTiny) { check_real("wxformer_tiny"); }

}  // namespace
}  // namespace wxe
