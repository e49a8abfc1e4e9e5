// config.cc — YAML → Config with validation; the only place yaml-cpp is used.
// Parsing never throws out of this file: yaml-cpp exceptions become Status.
#include "pos/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

namespace pos {

namespace {

StatusOr<LogLevel> parse_level(const std::string& s) {
  if (s == "error") return LogLevel::kError;
  if (s == "warn" || s == "warning") return LogLevel::kWarn;
  if (s == "info") return LogLevel::kInfo;
  if (s == "debug") return LogLevel::kDebug;
  return Status::InvalidArgument("log_level must be error|warn|info|debug, got '" + s + "'");
}

Status check_keys(const YAML::Node& node, const std::string& where, const std::set<std::string>& allowed) {
  if (!node.IsMap()) return Status::InvalidArgument(where + " must be a mapping");
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    if (allowed.count(key) == 0) return Status::InvalidArgument("unknown config key '" + where + key + "'");
  }
  return Status::Ok();
}

Status read_size(const YAML::Node& n, const std::string& key, uint64_t* out) {
  if (!n[key]) return Status::Ok();
  auto v = parse_size(n[key].as<std::string>());
  if (!v.ok()) return v.status().with_context(key);
  *out = *v;
  return Status::Ok();
}

template <typename T>
Status read_uint(const YAML::Node& n, const std::string& key, T* out, uint64_t lo, uint64_t hi) {
  if (!n[key]) return Status::Ok();
  auto v = parse_size(n[key].as<std::string>());
  if (!v.ok()) return v.status().with_context(key);
  if (*v < lo || *v > hi)
    return Status::InvalidArgument(key + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  *out = static_cast<T>(*v);
  return Status::Ok();
}

// posd.devices: a non-empty list of distinct, non-negative device indices.
StatusOr<std::vector<int32_t>> parse_device_list(const YAML::Node& n) {
  if (!n.IsSequence())
    return Status::InvalidArgument("posd.devices must be a list of device indices, e.g. [0, 2]");
  if (n.size() == 0)
    return Status::InvalidArgument("posd.devices is empty: list at least one device, or leave the key out for all");
  std::vector<int32_t> out;
  for (const auto& e : n) {
    const std::string text = e.IsScalar() ? e.as<std::string>() : std::string("(not a number)");
    size_t i = text.size() > 1 && text[0] == '-' ? 1 : 0;
    bool digits = i < text.size() && text.size() - i <= 9;
    for (; digits && i < text.size(); ++i) digits = std::isdigit(static_cast<unsigned char>(text[i])) != 0;
    if (!digits) return Status::InvalidArgument("posd.devices: '" + text + "' is not a device index");
    const int32_t d = static_cast<int32_t>(std::stol(text));
    if (d < 0) return Status::InvalidArgument("posd.devices: device " + text + " is negative");
    if (std::find(out.begin(), out.end(), d) != out.end())
      return Status::InvalidArgument("posd.devices lists device " + text + " twice");
    out.push_back(d);
  }
  return out;
}

Status apply(const YAML::Node& root, Config* c) {
  if (!root || root.IsNull()) return Status::Ok();
  POS_RETURN_IF_ERROR(check_keys(root, "", {"backend", "log_level", "client", "queues", "host_backend", "checkpoint", "posd"}));
  if (root["backend"]) {
    c->backend = root["backend"].as<std::string>();
    if (c->backend != "host" && c->backend != "cuda")
      return Status::InvalidArgument("backend must be host|cuda, got '" + c->backend + "'");
  }
  if (root["log_level"]) {
    auto l = parse_level(root["log_level"].as<std::string>());
    if (!l.ok()) return l.status();
    c->log_level = *l;
  }
  if (const auto n = root["client"]) {
    POS_RETURN_IF_ERROR(check_keys(n, "client.", {"max_clients", "memory_quota", "va_base", "va_size"}));
    POS_RETURN_IF_ERROR(read_uint(n, "max_clients", &c->max_clients, 1, 4096));
    POS_RETURN_IF_ERROR(read_size(n, "memory_quota", &c->memory_quota));
    if (n["va_base"]) c->va_base = std::strtoull(n["va_base"].as<std::string>().c_str(), nullptr, 0);
    POS_RETURN_IF_ERROR(read_size(n, "va_size", &c->va_size));
  }
  if (const auto n = root["queues"]) {
    POS_RETURN_IF_ERROR(check_keys(n, "queues.", {"depth", "spin_us", "sync_spin_us", "record_latency", "delayed_verdict"}));
    POS_RETURN_IF_ERROR(read_uint(n, "depth", &c->queue_depth, 16, 1u << 20));
    uint64_t us = c->spin_ns / 1000;
    POS_RETURN_IF_ERROR(read_uint(n, "spin_us", &us, 0, 10'000'000));
    c->spin_ns = us * 1000;
    uint64_t sync_us = c->sync_spin_ns / 1000;
    POS_RETURN_IF_ERROR(read_uint(n, "sync_spin_us", &sync_us, 0, 10'000'000));
    c->sync_spin_ns = sync_us * 1000;
    if (n["record_latency"]) c->record_latency = n["record_latency"].as<bool>();
    if (n["delayed_verdict"]) {
      const std::string v = n["delayed_verdict"].as<std::string>();
      if (v == "auto") c->delayed_verdict = VerdictLook::kAuto;
      else if (v == "on" || v == "true") c->delayed_verdict = VerdictLook::kDelayed;
      else if (v == "off" || v == "false") c->delayed_verdict = VerdictLook::kImmediate;
      else return Status::InvalidArgument("queues.delayed_verdict must be auto|on|off, not '" + v + "'");
    }
  }
  if (const auto n = root["host_backend"]) {
    POS_RETURN_IF_ERROR(check_keys(n, "host_backend.", {"device_count", "device_memory", "device_name"}));
    POS_RETURN_IF_ERROR(read_uint(n, "device_count", &c->host_device_count, 1, 64));
    POS_RETURN_IF_ERROR(read_size(n, "device_memory", &c->host_device_memory));
    if (n["device_name"]) c->host_device_name = n["device_name"].as<std::string>();
  }
  if (const auto n = root["posd"]) {
    POS_RETURN_IF_ERROR(
        check_keys(n, "posd.", {"socket", "group", "devices", "arena", "arena_max", "host_kernel_libraries"}));
    if (n["socket"]) c->posd_socket = n["socket"].as<std::string>();
    if (n["group"]) {
      // -1 (the old way of saying "none") and "" mean no group.
      c->posd_group = n["group"].IsNull() ? "" : n["group"].as<std::string>();
      if (c->posd_group == "-1") c->posd_group.clear();
    }
    if (const auto d = n["devices"]) {
      auto v = parse_device_list(d);
      if (!v.ok()) return v.status();
      c->posd_devices = std::move(v.value());
    }
    POS_RETURN_IF_ERROR(read_size(n, "arena", &c->posd_arena_bytes));
    POS_RETURN_IF_ERROR(read_size(n, "arena_max", &c->posd_arena_max));
    if (c->posd_arena_bytes < (1u << 20) || c->posd_arena_bytes > c->posd_arena_max)
      return Status::InvalidArgument("posd.arena must be at least 1 MiB and at most posd.arena_max");
    if (const auto l = n["host_kernel_libraries"]) {
      if (!l.IsSequence()) return Status::InvalidArgument("posd.host_kernel_libraries must be a list of paths");
      for (const auto& e : l) c->host_kernel_libraries.push_back(e.as<std::string>());
    }
  }
  if (const auto n = root["checkpoint"]) {
    POS_RETURN_IF_ERROR(check_keys(n, "checkpoint.", {"mode", "shadow_pool"}));
    if (n["shadow_pool"] && n["shadow_pool"].as<std::string>() == "auto") {
      c->shadow_pool_bytes = 0;
    } else {
      POS_RETURN_IF_ERROR(read_size(n, "shadow_pool", &c->shadow_pool_bytes));
      if (n["shadow_pool"] && c->shadow_pool_bytes == 0)
        return Status::InvalidArgument("checkpoint.shadow_pool must be auto or a size above 0");
    }
    if (n["mode"]) {
      c->checkpoint_mode = n["mode"].as<std::string>();
      if (c->checkpoint_mode != "off" && c->checkpoint_mode != "sync" && c->checkpoint_mode != "async")
        return Status::InvalidArgument("checkpoint.mode must be off|sync|async");
    }
  }
  // Ranges: each client's range must be page aligned and the whole set must fit in user space.
  if (c->va_base % 4096 != 0 || c->va_size % (2ull << 20) != 0 || c->va_size < (64ull << 20))
    return Status::InvalidArgument("client.va_base must be 4 KiB aligned and client.va_size a multiple of 2 MiB, >= 64 MiB");
  if (c->va_base + static_cast<unsigned __int128>(c->va_size) * c->max_clients > (1ull << 47))
    return Status::InvalidArgument("client.va_base + max_clients * va_size exceeds the 128 TiB user address space");
  return Status::Ok();
}

}  // namespace

StatusOr<Config> parse_config(const std::string& yaml_text) {
  Config c;
  try {
    POS_RETURN_IF_ERROR(apply(YAML::Load(yaml_text), &c));
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(std::string("config: ") + e.what());
  }
  return c;
}

StatusOr<Config> load_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::InvalidArgument("cannot read config file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  auto c = parse_config(ss.str());
  if (!c.ok()) return c.status().with_context(path);
  return c;
}

StatusOr<Config> config_from_environment() {
  Config c;
  if (const char* p = std::getenv("POS_CONFIG"); p != nullptr && *p != '\0') {
    auto r = load_config_file(p);
    if (!r.ok()) return r.status();
    c = *r;
  }
  if (const char* b = std::getenv("POS_BACKEND"); b != nullptr && *b != '\0') {
    std::string s(b);
    if (s != "host" && s != "cuda") return Status::InvalidArgument("POS_BACKEND must be host|cuda");
    c.backend = s;
  }
  if (const char* l = std::getenv("POS_LOG_LEVEL"); l != nullptr && *l != '\0') {
    auto lv = parse_level(l);
    if (!lv.ok()) return lv.status();
    c.log_level = *lv;
  }
  return c;
}

}  // namespace pos
