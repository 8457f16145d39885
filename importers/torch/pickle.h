// Restricted unpickler for torch.save's data.pkl (internal to importers/torch; tests use it).
//
// It executes nothing. GLOBAL / STACK_GLOBAL resolve only against a fixed allow-list of the
// names a state dict needs (OrderedDict, the tensor/parameter rebuild functions, storage
// types, dtypes, set/frozenset, _codecs.encode); any other name is an error at that opcode.
// REDUCE / NEWOBJ / BUILD are interpreted for those names only. The result is a flat object
// table (no pointers between objects, so no recursion anywhere, cycles are harmless), and the
// memory it may use is capped in proportion to the pickle's size.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/ir/tensor.h"

namespace wxe::torch_pickle {

// Element types of torch storages and dtypes: a superset of wxe::DType, so that tensors wxe
// does not use (e.g. in optimizer or RNG state) still parse; only returned tensors need a
// wxe dtype.
enum class ScalarType : uint8_t {
  F32, F64, F16, BF16, I64, I32, I16, I8, U8, Bool, U16, U32, U64, C64, C128,
  F8E4M3FN, F8E5M2, F8E4M3FNUZ, F8E5M2FNUZ
};
size_t scalar_size(ScalarType t);
const char* scalar_name(ScalarType t);
// false if wxe has no such dtype
bool to_dtype(ScalarType t, DType* out);

enum class Kind : uint8_t {
  None, Bool, Int, BigInt, Float, Str, Bytes, Tuple, List, Dict, Global, Storage, Tensor
};
const char* kind_name(Kind k);

enum class GlobalId : uint8_t {
  OrderedDict, Set, FrozenSet, CodecsEncode, RebuildTensorV2, RebuildTensorV3,
  RebuildParameter, RebuildParameterWithState, StorageType, Dtype
};

struct Obj {
  Kind kind = Kind::None;
  uint8_t tag = 0;   // Global: GlobalId; Storage/Tensor: ScalarType
  uint8_t tag2 = 0;  // Global StorageType/Dtype: ScalarType; StorageType: 1 if untyped
  int32_t ref = -1;  // Str/Bytes/BigInt/Global: strings(); Tuple/List/Dict: seq; Storage;
                     // Tensor: index into storages()/tensors()
  int64_t i = 0;     // Bool/Int value, Float bits
};

struct StorageInfo {
  std::string key;     // zip entry <prefix>/data/<key>
  ScalarType type;
  uint64_t numel = 0;  // elements of `type`
  uint64_t nbytes = 0;
};

struct TensorInfo {
  int32_t storage = -1;  // index into storages()
  ScalarType type = ScalarType::F32;
  int64_t offset = 0;    // in elements
  int32_t size = -1;     // object ids of the size and stride tuples (of Int)
  int32_t stride = -1;
  int64_t numel = 0;
  bool in_bounds = true; // false: reads past its storage (explain_bounds() says how)
};

class Unpickler {
 public:
  // Says whether the archive has storage `key` and its size in bytes.
  using StorageLookup = std::function<bool(const std::string& key, uint64_t* nbytes)>;
  // `where` prefixes every error message (e.g. "file.pt: data.pkl").
  Unpickler(std::string where, const uint8_t* data, size_t n, StorageLookup lookup);

  // Runs to STOP; returns the id of the top-level object.
  int32_t load();

  const Obj& obj(int32_t id) const { return objs_[id]; }
  Kind kind(int32_t id) const { return objs_[id].kind; }
  const std::string& str(int32_t id) const { return strs_[objs_[id].ref]; }  // Str, Bytes
  const std::vector<int32_t>& seq(int32_t id) const { return seqs_[objs_[id].ref]; }
  const TensorInfo& tensor(int32_t id) const { return tensors_[objs_[id].ref]; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::vector<StorageInfo>& storages() const { return storages_; }
  // size / stride of a tensor as integers
  std::vector<int64_t> ints(int32_t tuple_id) const;
  // Why a tensor is out of bounds (one line, no key).
  std::string explain_bounds(const TensorInfo& t) const;
  // A short description for messages: "int 3", "str 'abc'", "list", ...
  std::string describe(int32_t id) const;
  // Dict lookup by string key; -1 if absent.
  int32_t dict_get(int32_t dict_id, const std::string& key) const;

 private:
  [[noreturn]] void bad(const std::string& msg) const;
  uint8_t byte();
  const uint8_t* take(uint64_t n);
  uint64_t le(int nbytes);
  std::string line();
  void charge(uint64_t bytes);
  int32_t new_obj(Obj o);
  int32_t new_int(int64_t v);
  int32_t new_seq(Kind k, std::vector<int32_t> items = {});
  int32_t new_str(Kind k, std::string_view s);
  void push(int32_t id);
  int32_t pop();
  int32_t top() const;
  std::vector<int32_t> pop_mark();
  void memo_put(uint64_t key);
  int32_t memo_get(uint64_t key);
  void set_item(int32_t dict, int32_t key, int32_t value);
  void append(int32_t list, int32_t value);
  std::string key_of(int32_t id) const;
  int32_t global(const std::string& module, const std::string& name);
  int32_t reduce(int32_t callable, int32_t args);
  int32_t rebuild_tensor(const std::vector<int32_t>& a, bool v3);
  int32_t persistent_load(int32_t pid);
  int64_t as_int(int32_t id, const char* what) const;
  int32_t int_tuple(int32_t id, const char* what) const;

  std::string where_;
  const uint8_t* data_;
  size_t n_;
  size_t pos_ = 0, op_pos_ = 0;
  StorageLookup lookup_;
  uint64_t budget_;  // bytes the object model may still allocate

  std::vector<Obj> objs_;
  std::deque<std::string> strs_;                            // interned contents
  std::unordered_map<std::string_view, int32_t> str_index_; // content -> strs_ index
  std::vector<std::vector<int32_t>> seqs_;
  std::unordered_map<int32_t, std::unordered_map<std::string, uint32_t>> dict_index_;
  std::vector<StorageInfo> storages_;
  std::vector<TensorInfo> tensors_;
  std::vector<int32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, int32_t> memo_;
};

}  // namespace wxe::torch_pickle
