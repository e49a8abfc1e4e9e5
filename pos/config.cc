// config.cc — YAML → Config with strict validation; the only place yaml-cpp is used.
// Parsing never throws out of this file: yaml-cpp exceptions become Status. Every error names the
// key path and the line, so a bad file is fixed from the message alone.
#include "pos/config.h"

#include <fnmatch.h>

#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <utility>

namespace pos {

namespace {

constexpr uint64_t kMiB = 1ull << 20;

// yaml-cpp's marks are 0-based; people count lines from 1. 0: no position known.
int line_of(const YAML::Node& n) {
  const YAML::Mark m = n.Mark();
  return m.line >= 0 ? m.line + 1 : 0;
}

Status error_at(int line, const std::string& what) {
  return Status::InvalidArgument(line > 0 ? "line " + std::to_string(line) + ": " + what : what);
}

// "1 GiB", or "1000 bytes": a size as a user would write it.
std::string bytes_text(uint64_t b) {
  static const std::pair<const char*, uint64_t> kUnits[] = {
      {"TiB", 1ull << 40}, {"GiB", 1ull << 30}, {"MiB", 1ull << 20}, {"KiB", 1ull << 10}};
  for (const auto& [name, unit] : kUnits)
    if (b >= unit && b % unit == 0) return std::to_string(b / unit) + " " + name;
  return std::to_string(b) + " bytes";
}

// One key of the file: its path ("client.max_clients"), its value and the line to blame.
struct Entry {
  std::string path;
  YAML::Node value;
  int line = 0;  // the value's, else the key's
  // `what` continues the path: ": 'x' is not ..." or " must be ...".
  Status error(const std::string& what) const { return error_at(line, path + what); }
};

StatusOr<std::string> text_of(const Entry& e) {
  if (e.value.IsScalar()) return e.value.Scalar();
  if (!e.value.IsDefined() || e.value.IsNull()) return e.error(" has no value");
  return e.error(e.value.IsSequence() ? " must be a single value, not a list" : " must be a single value, not a mapping");
}

StatusOr<uint64_t> read_uint(const Entry& e, uint64_t lo, uint64_t hi) {
  auto t = text_of(e);
  if (!t.ok()) return t.status();
  auto v = parse_uint(*t);
  if (!v.ok()) return e.error(": " + v.status().message());
  if (*v < lo || *v > hi)
    return e.error(": " + *t + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return *v;
}

StatusOr<uint64_t> read_size(const Entry& e, uint64_t lo, uint64_t hi = UINT64_MAX) {
  auto t = text_of(e);
  if (!t.ok()) return t.status();
  auto v = parse_size(*t);
  if (!v.ok()) return e.error(": " + v.status().message());
  if (*v < lo) return e.error(": " + *t + " is less than the minimum, " + bytes_text(lo));
  if (*v > hi) return e.error(": " + *t + " is more than the maximum, " + bytes_text(hi));
  return *v;
}

StatusOr<bool> read_bool(const Entry& e) {
  auto t = text_of(e);
  if (!t.ok()) return t.status();
  if (*t == "true") return true;
  if (*t == "false") return false;
  return e.error(": '" + *t + "' is not true or false");
}

// One of the listed words, e.g. {"host", "cuda"}.
StatusOr<std::string> read_word(const Entry& e, std::initializer_list<const char*> words) {
  auto t = text_of(e);
  if (!t.ok()) return t.status();
  std::string list;
  for (const char* w : words) {
    if (*t == w) return *t;
    list += (list.empty() ? "" : "|") + std::string(w);
  }
  return e.error(" must be " + list + ", not '" + *t + "'");
}

StatusOr<LogLevel> level_of(const std::string& s) {
  if (s == "error") return LogLevel::kError;
  if (s == "warn") return LogLevel::kWarn;
  if (s == "info") return LogLevel::kInfo;
  if (s == "debug") return LogLevel::kDebug;
  return Status::InvalidArgument("must be error|warn|info|debug, not '" + s + "'");
}

// Keys that existed once: a file that still gives one learns where its meaning went.
const std::map<std::string, std::string>& retired_keys() {
  static const std::map<std::string, std::string> k = {
      {"checkpoint.mode",
       "checkpoints are requested per job, each request naming its mode (sync or async; "
       "docs/checkpoint.md): there is no default mode to configure, remove the key"},
  };
  return k;
}

// Walks a file's mappings once, key by key: each key is checked against its section's list, a
// repeated key is refused (yaml-cpp's lookups would silently take the first), and each value goes
// to its setter.
class Reader {
 public:
  explicit Reader(Config* c) : c_(c) {}

  Status document(const YAML::Node& root) {
    if (!root.IsDefined() || root.IsNull()) return Status::Ok();
    if (!root.IsMap())
      return error_at(line_of(root), "a config is a mapping of keys (e.g. `backend: host`), not " +
                                         std::string(root.IsSequence() ? "a list" : "a single value"));
    POS_RETURN_IF_ERROR(walk(Entry{"", root, line_of(root)}, top_keys()));
    return check_across_keys();
  }

 private:
  using Setter = std::function<Status(const Entry&)>;
  struct Key {
    const char* name;
    Setter set;
  };

  Status walk(const Entry& section, const std::vector<Key>& keys) {
    if (section.value.IsNull()) return Status::Ok();  // "client:" with every key commented out
    if (!section.value.IsMap()) return section.error(" must be a mapping of keys");
    const std::string prefix = section.path.empty() ? "" : section.path + ".";
    std::map<std::string, int> seen;
    for (const auto& kv : section.value) {
      const int key_line = line_of(kv.first);
      if (!kv.first.IsScalar())
        return error_at(key_line, (prefix.empty() ? std::string("a key") : "a key of " + section.path) +
                                      " is not a plain word");
      const std::string name = kv.first.Scalar();
      const std::string path = prefix + name;
      if (const auto [it, fresh] = seen.emplace(name, key_line); !fresh)
        return error_at(key_line, path + " is given twice (first on line " + std::to_string(it->second) +
                                      "); a key appears once per mapping");
      const auto k = std::find_if(keys.begin(), keys.end(), [&](const Key& x) { return name == x.name; });
      if (k == keys.end()) {
        if (const auto r = retired_keys().find(path); r != retired_keys().end())
          return error_at(key_line, "unknown config key '" + path + "': " + r->second);
        std::string known;
        for (const Key& x : keys) known += (known.empty() ? "" : ", ") + std::string(x.name);
        return error_at(key_line, "unknown config key '" + path + "' (" +
                                      (prefix.empty() ? std::string("top-level keys") : "keys of " + section.path) +
                                      ": " + known + ")");
      }
      // A missing value's mark is wherever the parser stood next (often a later line): blame the key.
      const int value_line = kv.second.IsNull() ? 0 : line_of(kv.second);
      Entry e{path, kv.second, value_line > 0 ? value_line : key_line};
      lines_[path] = key_line;
      POS_RETURN_IF_ERROR(k->set(e));
    }
    return Status::Ok();
  }

  // Assigns a read value (StatusOr<U>) to a field, converting to the field's type.
  template <typename T, typename U>
  static Status store(StatusOr<U> v, T* out) {
    if (!v.ok()) return v.status();
    *out = static_cast<T>(*v);
    return Status::Ok();
  }

  std::vector<Key> top_keys() {
    return {
        {"backend", [this](const Entry& e) { return store(read_word(e, {"host", "cuda"}), &c_->backend); }},
        {"log_level",
         [this](const Entry& e) -> Status {
           auto t = text_of(e);
           if (!t.ok()) return t.status();
           auto l = level_of(*t);
           if (!l.ok()) return e.error(" " + l.status().message());
           c_->log_level = *l;
           return Status::Ok();
         }},
        {"client", [this](const Entry& e) { return walk(e, client_keys()); }},
        {"queues", [this](const Entry& e) { return walk(e, queue_keys()); }},
        {"host_backend", [this](const Entry& e) { return walk(e, host_backend_keys()); }},
        {"checkpoint", [this](const Entry& e) { return walk(e, checkpoint_keys()); }},
        {"posd", [this](const Entry& e) { return walk(e, posd_keys()); }},
    };
  }

  std::vector<Key> client_keys() {
    return {
        {"max_clients", [this](const Entry& e) { return store(read_uint(e, 1, 4096), &c_->max_clients); }},
        {"memory_quota", [this](const Entry& e) { return store(read_size(e, 0), &c_->memory_quota); }},
        // An address, so an integer (hex welcome), not a size.
        {"va_base",
         [this](const Entry& e) -> Status {
           auto v = read_uint(e, 1, UINT64_MAX);
           if (!v.ok()) return v.status();
           if (*v % 4096 != 0) return e.error(": " + hex_text(*v) + " is not 4 KiB aligned");
           c_->va_base = *v;
           return Status::Ok();
         }},
        {"va_size",
         [this](const Entry& e) -> Status {
           auto v = read_size(e, 64 * kMiB);
           if (!v.ok()) return v.status();
           if (*v % (2 * kMiB) != 0) return e.error(": " + e.value.Scalar() + " is not a multiple of 2 MiB");
           c_->va_size = *v;
           return Status::Ok();
         }},
    };
  }

  std::vector<Key> queue_keys() {
    return {
        {"depth", [this](const Entry& e) { return store(read_uint(e, 16, 1u << 20), &c_->queue_depth); }},
        {"spin_us",
         [this](const Entry& e) -> Status {
           auto v = read_uint(e, 0, 10'000'000);
           if (!v.ok()) return v.status();
           c_->spin_ns = *v * 1000;
           return Status::Ok();
         }},
        {"sync_spin_us",
         [this](const Entry& e) -> Status {
           auto v = read_uint(e, 0, 10'000'000);
           if (!v.ok()) return v.status();
           c_->sync_spin_ns = *v * 1000;
           return Status::Ok();
         }},
        {"record_latency", [this](const Entry& e) { return store(read_bool(e), &c_->record_latency); }},
        {"delayed_verdict",
         [this](const Entry& e) -> Status {
           auto w = read_word(e, {"auto", "on", "off"});
           if (!w.ok()) return w.status();
           c_->delayed_verdict = *w == "auto" ? VerdictLook::kAuto
                                 : *w == "on"   ? VerdictLook::kDelayed
                                                : VerdictLook::kImmediate;
           return Status::Ok();
         }},
    };
  }

  std::vector<Key> host_backend_keys() {
    return {
        {"device_count", [this](const Entry& e) { return store(read_uint(e, 1, 64), &c_->host_device_count); }},
        // 0 would be a device on which every allocation fails; 1 MiB is the least worth presenting.
        {"device_memory", [this](const Entry& e) { return store(read_size(e, kMiB), &c_->host_device_memory); }},
        {"device_name",
         [this](const Entry& e) -> Status {
           auto t = text_of(e);
           if (!t.ok()) return t.status();
           if (t->empty()) return e.error(" must not be empty");
           c_->host_device_name = *t;
           return Status::Ok();
         }},
    };
  }

  std::vector<Key> checkpoint_keys() {
    return {
        {"shadow_pool",
         [this](const Entry& e) -> Status {
           if (e.value.IsScalar() && e.value.Scalar() == "auto") {
             c_->shadow_pool_bytes = 0;
             return Status::Ok();
           }
           auto v = read_size(e, 0);
           if (!v.ok()) return v.status();
           if (*v == 0) return e.error(" must be auto or a size above 0");
           c_->shadow_pool_bytes = *v;
           return Status::Ok();
         }},
        {"copy_threads",
         [this](const Entry& e) -> Status {
           if (e.value.IsScalar() && e.value.Scalar() == "auto") {
             c_->ckpt_copy_threads = 0;
             return Status::Ok();
           }
           return store(read_uint(e, 1, 64), &c_->ckpt_copy_threads);
         }},
        // Two slots of at least 256 KiB for one lane.
        {"staging", [this](const Entry& e) { return store(read_size(e, 512ull << 10, 1ull << 30), &c_->ckpt_staging_bytes); }},
        {"keep_shadows",
         [this](const Entry& e) -> Status {
           auto w = read_word(e, {"auto", "true", "false"});
           if (!w.ok()) return w.status();
           if (*w == "auto") c_->ckpt_keep_shadows.reset();
           else c_->ckpt_keep_shadows = *w == "true";
           return Status::Ok();
         }},
    };
  }

  std::vector<Key> posd_keys() {
    return {
        {"socket",
         [this](const Entry& e) -> Status {
           if (e.value.IsNull()) {  // like "": the default
             c_->posd_socket.clear();
             return Status::Ok();
           }
           return store(text_of(e), &c_->posd_socket);
         }},
        {"group",
         [this](const Entry& e) -> Status {
           // Empty, null and -1 (the old way of saying "none") mean no group.
           if (e.value.IsNull()) {
             c_->posd_group.clear();
             return Status::Ok();
           }
           POS_RETURN_IF_ERROR(store(text_of(e), &c_->posd_group));
           if (c_->posd_group == "-1") c_->posd_group.clear();
           return Status::Ok();
         }},
        {"devices", [this](const Entry& e) { return devices(e); }},
        {"max_pending", [this](const Entry& e) { return store(read_uint(e, 1, 4096), &c_->posd_max_pending); }},
        {"arena", [this](const Entry& e) { return store(read_size(e, kMiB), &c_->posd_arena_bytes); }},
        {"arena_max", [this](const Entry& e) { return store(read_size(e, kMiB), &c_->posd_arena_max); }},
        {"isolation",
         [this](const Entry& e) -> Status {
           auto w = read_word(e, {"process", "shared"});
           if (!w.ok()) return w.status();
           c_->posd_isolation = *w == "process" ? Isolation::kProcess : Isolation::kShared;
           return Status::Ok();
         }},
        {"spare_session", [this](const Entry& e) { return store(read_bool(e), &c_->posd_spare_session); }},
        {"checkpoint_staging_ahead",
         [this](const Entry& e) { return store(read_bool(e), &c_->posd_checkpoint_staging_ahead); }},
        {"checkpoint_policy", [this](const Entry& e) { return walk(e, policy_keys()); }},
        {"migration", [this](const Entry& e) { return walk(e, migration_keys()); }},
        {"limits", [this](const Entry& e) { return limits(e); }},
        {"usage_region",
         [this](const Entry& e) -> Status {
           POS_RETURN_IF_ERROR(store(text_of(e), &c_->posd_usage_region));
           if (!c_->posd_usage_region.empty() && c_->posd_usage_region.front() != '/')
             return e.error(" must be an absolute path");
           return Status::Ok();
         }},
        {"metrics",
         [this](const Entry& e) -> Status {
           if (e.value.IsNull()) {  // like "": off
             c_->posd_metrics.clear();
             return Status::Ok();
           }
           return store(text_of(e), &c_->posd_metrics);
         }},
        {"session_binary",
         [this](const Entry& e) -> Status {
           if (e.value.IsNull()) {
             c_->posd_session_binary.clear();
             return Status::Ok();
           }
           return store(text_of(e), &c_->posd_session_binary);
         }},
        {"host_kernel_libraries",
         [this](const Entry& e) -> Status {
           if (!e.value.IsSequence()) return e.error(" must be a list of paths, e.g. [/opt/kernels.so]");
           c_->host_kernel_libraries.clear();
           for (size_t i = 0; i < e.value.size(); ++i) {
             const YAML::Node item = e.value[i];
             const int line = !item.IsNull() && line_of(item) > 0 ? line_of(item) : e.line;
             const Entry one{e.path + "[" + std::to_string(i) + "]", item, line};
             auto t = text_of(one);
             if (!t.ok()) return t.status();
             if (t->empty()) return one.error(" is an empty path");
             c_->host_kernel_libraries.push_back(*t);
           }
           return Status::Ok();
         }},
    };
  }

  std::vector<Key> policy_keys() {
    auto& p = c_->posd_policy;
    return {
        {"jobs",
         [this, &p](const Entry& e) -> Status {
           if (!e.value.IsSequence()) return e.error(" must be a list of job-name patterns, e.g. [\"train*\"]");
           p.jobs.clear();
           for (size_t i = 0; i < e.value.size(); ++i) {
             const YAML::Node item = e.value[i];
             const Entry one{e.path + "[" + std::to_string(i) + "]", item, !item.IsNull() && line_of(item) > 0 ? line_of(item) : e.line};
             auto t = text_of(one);
             if (!t.ok()) return t.status();
             if (t->empty()) return one.error(" is an empty pattern");
             p.jobs.push_back(*t);
           }
           return Status::Ok();
         }},
        {"every", [&p](const Entry& e) { return store(text_of(e), &p.every); }},
        {"dir",
         [&p](const Entry& e) -> Status {
           POS_RETURN_IF_ERROR(store(text_of(e), &p.dir));
           if (!p.dir.empty() && p.dir.front() != '/') return e.error(" must be an absolute path");
           return Status::Ok();
         }},
        {"keep", [&p](const Entry& e) { return store(read_uint(e, 1, 100000), &p.keep); }},
        {"full_every", [&p](const Entry& e) { return store(read_uint(e, 1, 64), &p.full_every); }},
        {"mode",
         [&p](const Entry& e) -> Status {
           auto w = read_word(e, {"async", "sync"});
           if (!w.ok()) return w.status();
           p.async = *w == "async";
           return Status::Ok();
         }},
        {"with_cpu", [&p](const Entry& e) { return store(read_bool(e), &p.with_cpu); }},
        {"cli", [&p](const Entry& e) { return store(text_of(e), &p.cli); }},
    };
  }

  // posd.limits: a list of {jobs: [patterns], memory: SIZE}.
  Status limits(const Entry& e) {
    if (e.value.IsNull()) {
      c_->posd_limits.clear();
      return Status::Ok();
    }
    if (!e.value.IsSequence())
      return e.error(" must be a list of rules, e.g. [{jobs: [\"train*\"], memory: 8GiB}]");
    c_->posd_limits.clear();
    for (size_t i = 0; i < e.value.size(); ++i) {
      const YAML::Node item = e.value[i];
      const Entry one{e.path + "[" + std::to_string(i) + "]", item, !item.IsNull() && line_of(item) > 0 ? line_of(item) : e.line};
      if (!item.IsMap()) return one.error(" must be a mapping with jobs and memory");
      Config::JobLimits rule;
      bool memory_given = false;
      POS_RETURN_IF_ERROR(walk(one, {
          {"jobs",
           [&rule](const Entry& j) -> Status {
             if (!j.value.IsSequence()) return j.error(" must be a list of job-name patterns, e.g. [\"train*\"]");
             for (size_t k = 0; k < j.value.size(); ++k) {
               const YAML::Node p = j.value[k];
               const Entry pe{j.path + "[" + std::to_string(k) + "]", p, !p.IsNull() && line_of(p) > 0 ? line_of(p) : j.line};
               auto t = text_of(pe);
               if (!t.ok()) return t.status();
               if (t->empty()) return pe.error(" is an empty pattern");
               rule.jobs.push_back(*t);
             }
             return Status::Ok();
           }},
          {"memory",
           [&rule, &memory_given](const Entry& m) -> Status {
             memory_given = true;
             return store(read_size(m, 0), &rule.memory);
           }},
          {"gpu_share",
           [&rule](const Entry& g) -> Status {
             auto t = text_of(g);
             if (!t.ok()) return t.status();
             auto pm = parse_share(*t);
             if (!pm.ok()) return g.error(": " + pm.status().message());
             rule.gpu_share = *pm;
             return Status::Ok();
           }},
          {"sms",
           [&rule](const Entry& n) -> Status {
             auto v = read_uint(n, 1, 100000);
             if (!v.ok()) return v.status();
             rule.sms = static_cast<uint32_t>(*v);
             return Status::Ok();
           }},
      }));
      if (rule.jobs.empty()) return one.error(" names no jobs (jobs: [\"pattern\", ...])");
      if (!memory_given && rule.gpu_share == 0 && rule.sms == 0)
        return one.error(" sets no limit (memory: SIZE, gpu_share: PCT, sms: N)");
      c_->posd_limits.push_back(std::move(rule));
    }
    return Status::Ok();
  }

  std::vector<Key> migration_keys() {
    auto& m = c_->posd_migration;
    auto absolute = [](const Entry& e, std::string* to) -> Status {
      POS_RETURN_IF_ERROR(store(text_of(e), to));
      if (!to->empty() && to->front() != '/') return e.error(" must be an absolute path");
      return Status::Ok();
    };
    return {
        {"listen", [&m](const Entry& e) { return store(text_of(e), &m.listen); }},
        {"secret_file", [&m, absolute](const Entry& e) { return absolute(e, &m.secret_file); }},
        {"dir", [&m, absolute](const Entry& e) { return absolute(e, &m.dir); }},
        {"cli", [&m](const Entry& e) { return store(text_of(e), &m.cli); }},
    };
  }

  // posd.devices: a non-empty list of distinct, non-negative device indices.
  Status devices(const Entry& e) {
    if (!e.value.IsSequence()) return e.error(" must be a list of device indices, e.g. [0, 2]");
    if (e.value.size() == 0) return e.error(" is empty: list at least one device, or leave the key out for all");
    std::vector<int32_t> out;
    for (size_t i = 0; i < e.value.size(); ++i) {
      const YAML::Node item = e.value[i];
      const Entry one{e.path, item, !item.IsNull() && line_of(item) > 0 ? line_of(item) : e.line};
      const std::string text = item.IsScalar() ? item.Scalar() : std::string("(not a number)");
      if (!text.empty() && text[0] == '-' && parse_uint(text.substr(1)).ok())
        return one.error(": device " + text + " is negative");
      auto v = parse_uint(text);
      if (!v.ok() || *v > INT32_MAX) return one.error(": '" + text + "' is not a device index");
      const auto d = static_cast<int32_t>(*v);
      if (std::find(out.begin(), out.end(), d) != out.end()) return one.error(" lists device " + text + " twice");
      out.push_back(d);
    }
    c_->posd_devices = std::move(out);
    return Status::Ok();
  }

  // Checks that involve several keys blame the first of them the file gives (defaults alone pass).
  int first_line(std::initializer_list<const char*> paths) const {
    int best = 0;
    for (const char* p : paths)
      if (const auto it = lines_.find(p); it != lines_.end() && (best == 0 || it->second < best)) best = it->second;
    return best;
  }

  Status check_across_keys() const {
    if (c_->posd_arena_bytes > c_->posd_arena_max)
      return error_at(first_line({"posd.arena", "posd.arena_max"}),
                      "posd.arena, " + bytes_text(c_->posd_arena_bytes) + ", is more than posd.arena_max, " +
                          bytes_text(c_->posd_arena_max));
    const unsigned __int128 end = c_->va_base + static_cast<unsigned __int128>(c_->va_size) * c_->max_clients;
    if (end > (1ull << 47))
      return error_at(first_line({"client.va_base", "client.va_size", "client.max_clients"}),
                      "client.va_base + client.max_clients * client.va_size ends at about " +
                          std::to_string(static_cast<uint64_t>(end >> 40)) +
                          " TiB, past the 128 TiB user address space");
    return Status::Ok();
  }

  static std::string hex_text(uint64_t v) {
    char b[24];
    std::snprintf(b, sizeof(b), "0x%llx", static_cast<unsigned long long>(v));
    return b;
  }

  Config* c_;
  std::map<std::string, int> lines_;  // key path → its line, for check_across_keys
};

}  // namespace

StatusOr<Config> parse_config(const std::string& yaml_text) {
  Config c;
  try {
    const std::vector<YAML::Node> docs = YAML::LoadAll(yaml_text);
    if (docs.size() > 1)
      return error_at(line_of(docs[1]), "a config is one YAML document; this text holds " + std::to_string(docs.size()) +
                                            " (remove the '---' separator)");
    POS_RETURN_IF_ERROR(Reader(&c).document(docs.empty() ? YAML::Node() : docs[0]));
  } catch (const YAML::Exception& e) {
    const std::string where = e.mark.line >= 0 ? "line " + std::to_string(e.mark.line + 1) + ", column " +
                                                     std::to_string(e.mark.column + 1) + ": "
                                               : std::string();
    return Status::InvalidArgument(where + "not valid YAML: " + e.msg);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("config: ") + e.what());
  }
  return c;
}

// Every field, by its key. A field added to Config and not here would silently take its default in
// every session process: config_test round-trips a config with every field off its default.
std::string config_to_yaml(const Config& c) {
  static const char* const kLevels[] = {"error", "warn", "info", "debug"};
  YAML::Emitter y;
  y << YAML::BeginMap;
  y << YAML::Key << "backend" << YAML::Value << c.backend;
  y << YAML::Key << "log_level" << YAML::Value << kLevels[static_cast<int>(c.log_level) & 3];
  y << YAML::Key << "client" << YAML::Value << YAML::BeginMap;
  y << YAML::Key << "max_clients" << YAML::Value << c.max_clients;
  y << YAML::Key << "memory_quota" << YAML::Value << c.memory_quota;
  y << YAML::Key << "va_base" << YAML::Value << c.va_base;
  y << YAML::Key << "va_size" << YAML::Value << c.va_size;
  y << YAML::EndMap;
  y << YAML::Key << "queues" << YAML::Value << YAML::BeginMap;
  y << YAML::Key << "depth" << YAML::Value << c.queue_depth;
  y << YAML::Key << "spin_us" << YAML::Value << c.spin_ns / 1000;
  y << YAML::Key << "sync_spin_us" << YAML::Value << c.sync_spin_ns / 1000;
  y << YAML::Key << "record_latency" << YAML::Value << (c.record_latency ? "true" : "false");
  y << YAML::Key << "delayed_verdict" << YAML::Value
    << (c.delayed_verdict == VerdictLook::kAuto ? "auto" : c.delayed_verdict == VerdictLook::kDelayed ? "on" : "off");
  y << YAML::EndMap;
  y << YAML::Key << "host_backend" << YAML::Value << YAML::BeginMap;
  y << YAML::Key << "device_count" << YAML::Value << c.host_device_count;
  y << YAML::Key << "device_memory" << YAML::Value << c.host_device_memory;
  y << YAML::Key << "device_name" << YAML::Value << YAML::DoubleQuoted << c.host_device_name;
  y << YAML::EndMap;
  y << YAML::Key << "checkpoint" << YAML::Value << YAML::BeginMap;
  y << YAML::Key << "shadow_pool" << YAML::Value;
  if (c.shadow_pool_bytes == 0) y << "auto";
  else y << c.shadow_pool_bytes;
  y << YAML::Key << "copy_threads" << YAML::Value;
  if (c.ckpt_copy_threads == 0) y << "auto";
  else y << c.ckpt_copy_threads;
  y << YAML::Key << "staging" << YAML::Value << c.ckpt_staging_bytes;
  y << YAML::Key << "keep_shadows" << YAML::Value;
  if (c.ckpt_keep_shadows.has_value()) y << *c.ckpt_keep_shadows;
  else y << "auto";
  y << YAML::EndMap;
  y << YAML::Key << "posd" << YAML::Value << YAML::BeginMap;
  y << YAML::Key << "socket" << YAML::Value << YAML::DoubleQuoted << c.posd_socket;
  y << YAML::Key << "group" << YAML::Value << YAML::DoubleQuoted << c.posd_group;
  if (!c.posd_devices.empty()) {
    y << YAML::Key << "devices" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (const int32_t d : c.posd_devices) y << d;
    y << YAML::EndSeq;
  }
  y << YAML::Key << "max_pending" << YAML::Value << c.posd_max_pending;
  y << YAML::Key << "arena" << YAML::Value << c.posd_arena_bytes;
  y << YAML::Key << "arena_max" << YAML::Value << c.posd_arena_max;
  y << YAML::Key << "host_kernel_libraries" << YAML::Value << YAML::BeginSeq;
  for (const auto& l : c.host_kernel_libraries) y << YAML::DoubleQuoted << l;
  y << YAML::EndSeq;
  y << YAML::Key << "isolation" << YAML::Value << (c.posd_isolation == Isolation::kProcess ? "process" : "shared");
  y << YAML::Key << "session_binary" << YAML::Value << YAML::DoubleQuoted << c.posd_session_binary;
  y << YAML::Key << "spare_session" << YAML::Value << c.posd_spare_session;
  y << YAML::Key << "checkpoint_staging_ahead" << YAML::Value << c.posd_checkpoint_staging_ahead;
  y << YAML::Key << "metrics" << YAML::Value << YAML::DoubleQuoted << c.posd_metrics;
  y << YAML::Key << "usage_region" << YAML::Value << YAML::DoubleQuoted << c.posd_usage_region;
  y << YAML::Key << "limits" << YAML::Value << YAML::BeginSeq;
  for (const Config::JobLimits& r : c.posd_limits) {
    y << YAML::BeginMap << YAML::Key << "jobs" << YAML::Value << YAML::BeginSeq;
    for (const std::string& j : r.jobs) y << YAML::DoubleQuoted << j;
    y << YAML::EndSeq;
    if (r.memory != UINT64_MAX) y << YAML::Key << "memory" << YAML::Value << r.memory;
    if (r.gpu_share != 0)
      y << YAML::Key << "gpu_share" << YAML::Value
        << (std::to_string(r.gpu_share / 10) + "." + std::to_string(r.gpu_share % 10) + "%");
    if (r.sms != 0) y << YAML::Key << "sms" << YAML::Value << r.sms;
    y << YAML::EndMap;
  }
  y << YAML::EndSeq;
  y << YAML::EndMap;
  y << YAML::EndMap;
  return std::string(y.c_str()) + "\n";
}

StatusOr<Config> load_config_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return Status::InvalidArgument("cannot read config file '" + path + "': " + std::strerror(errno));
  if (S_ISDIR(st.st_mode))
    return Status::InvalidArgument("config file '" + path +
                                   "' is a directory; name a YAML file (docs/configuration.md)");
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument("config file '" + path + "' is not a regular file");
  std::ifstream in(path);
  if (!in) return Status::InvalidArgument("cannot read config file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::InvalidArgument("cannot read config file '" + path + "'");
  auto c = parse_config(ss.str());
  if (!c.ok()) return c.status().with_context(path);
  return c;
}

Status apply_environment_overrides(Config* c) {
  if (const char* b = std::getenv("POS_BACKEND"); b != nullptr && *b != '\0') {
    const std::string s(b);
    if (s != "host" && s != "cuda") return Status::InvalidArgument("POS_BACKEND must be host|cuda, not '" + s + "'");
    c->backend = s;
  }
  if (const char* l = std::getenv("POS_LOG_LEVEL"); l != nullptr && *l != '\0') {
    auto lv = level_of(l);
    if (!lv.ok()) return Status::InvalidArgument("POS_LOG_LEVEL " + lv.status().message());
    c->log_level = *lv;
  }
  return Status::Ok();
}

StatusOr<Config> config_from_environment() {
  Config c;
  if (const char* p = std::getenv("POS_CONFIG"); p != nullptr && *p != '\0') {
    auto r = load_config_file(p);
    if (!r.ok()) return r.status();
    c = *r;
  }
  POS_RETURN_IF_ERROR(apply_environment_overrides(&c));
  return c;
}

namespace {
const Config::JobLimits* rule_for_job(const Config& c, const std::string& job) {
  for (const Config::JobLimits& r : c.posd_limits)
    for (const std::string& pattern : r.jobs)
      if (::fnmatch(pattern.c_str(), job.c_str(), 0) == 0) return &r;
  return nullptr;
}
}  // namespace

bool policy_names_job(const Config& c, const std::string& job) {
  for (const std::string& pattern : c.posd_policy.jobs)
    if (::fnmatch(pattern.c_str(), job.c_str(), 0) == 0) return true;
  return false;
}

uint64_t memory_quota_for_job(const Config& c, const std::string& job) {
  const Config::JobLimits* r = rule_for_job(c, job);
  return r != nullptr && r->memory != UINT64_MAX ? r->memory : c.memory_quota;
}

uint32_t gpu_share_for_job(const Config& c, const std::string& job) {
  const Config::JobLimits* r = rule_for_job(c, job);
  return r != nullptr ? r->gpu_share : 0;
}

uint32_t sms_for_job(const Config& c, const std::string& job) {
  const Config::JobLimits* r = rule_for_job(c, job);
  return r != nullptr ? r->sms : 0;
}

}  // namespace pos
