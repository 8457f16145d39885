#include "engine/ir/module_roles.h"

#include <algorithm>

#include "engine/ir/error.h"

namespace wxe {

namespace {

struct Registry {
  ModuleTable table;
  bool set = false;
};

Registry& registry() {
  static Registry r;
  return r;
}

// module is `tail`, or ends with "." + tail
bool has_tail(const std::string& module, const std::string& tail) {
  if (module.size() == tail.size()) return module == tail;
  return module.size() > tail.size() && module[module.size() - tail.size() - 1] == '.' &&
         module.compare(module.size() - tail.size(), tail.size(), tail) == 0;
}

// the matching entry of the table, or nullptr
const std::pair<std::string, Role>* entry_of(const std::string& module) {
  for (const auto& e : module_table().roles)
    if (has_tail(module, e.first)) return &e;
  return nullptr;
}

}  // namespace

const char* role_name(Role r) {
  switch (r) {
    case Role::Q: return "q";
    case Role::K: return "k";
    case Role::V: return "v";
    case Role::Qkv: return "qkv";
    case Role::Out: return "out";
    case Role::FfnUp: return "ffn-up";
    case Role::FfnDown: return "ffn-down";
    default: return "none";
  }
}

void set_module_table(ModuleTable t) {
  registry().table = std::move(t);
  registry().set = true;
}

void add_module_role(const std::string& tail, Role role) {
  ModuleTable& t = registry().table;
  WXE_ASSERT(registry().set && !tail.empty());
  t.roles.erase(std::remove_if(t.roles.begin(), t.roles.end(), [&](const auto& e) { return e.first == tail; }),
                t.roles.end());
  t.roles.push_back({tail, role});
}

const ModuleTable& module_table() {
  WXE_CHECK(registry().set, "no module table registered: call register_credit_modules() (models/credit_modules.h) "
            "before loading a model");
  return registry().table;
}

Role module_role(const std::string& module) {
  const auto* e = entry_of(module);
  return e ? e->second : Role::None;
}

std::string sibling_module(const std::string& module, Role r) {
  const auto* e = entry_of(module);
  WXE_ASSERT(e);
  const std::string stem = module.substr(0, module.size() - e->first.size());
  for (const auto& x : module_table().roles)
    if (x.second == r) return stem + x.first;
  fail("module table: no module name for role ", role_name(r));
}

bool is_position_bias_mlp(const std::string& module) {
  const auto& tails = module_table().position_bias_mlps;
  return std::any_of(tails.begin(), tails.end(), [&](const std::string& t) { return has_tail(module, t); });
}

bool is_param_leaf(const std::string& leaf) {
  const auto& l = module_table().param_leaves;
  return std::find(l.begin(), l.end(), leaf) != l.end();
}

}  // namespace wxe
