// job_manifest.cc — the manifest's writer and its strict reader: a flat JSON object (strings,
// unsigned numbers, booleans), read by hand because a restore must reject every malformed byte.
#include "remoting/server/job_manifest.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "pos/base/text.h"
#include "remoting/common/unique_fd.h"

namespace pos {

Status write_small_file(const std::string& path, const std::string& text, mode_t mode) {
  const std::string tmp = path + ".tmp";
  UniqueFd f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode));
  if (!f) return Status::Unavailable("cannot write " + tmp + ": " + std::strerror(errno));
  if (::write(f.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) || ::fsync(f.get()) != 0)
    return Status::Unavailable("cannot write " + tmp + ": " + std::strerror(errno));
  f.reset();
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Status::Unavailable("cannot write " + path + ": " + std::strerror(errno));
  // The rename itself durable: a crash after the caller's report never loses the file.
  const std::string parent = path.substr(0, path.rfind('/') + 1);
  UniqueFd d(::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d || ::fsync(d.get()) != 0) return Status::Unavailable("cannot sync " + parent + ": " + std::strerror(errno));
  return Status::Ok();
}

std::string manifest_json(const JobManifest& m) {
  auto u = [](uint64_t v) { return std::to_string(v); };
  auto b = [](bool v) { return std::string(v ? "true" : "false"); };
  return "{\"format\":" + u(m.format) + ",\"kind\":" + json_string(m.kind) + ",\"prev\":" + json_string(m.prev) + ",\"pid\":" + u(m.pid) + ",\"uid\":" + u(m.uid) + ",\"job\":" + json_string(m.job) +
         ",\"socket\":" + json_string(m.socket) + ",\"permit\":" + json_string(m.permit) +
         ",\"arena_bytes\":" + u(m.arena_bytes) + ",\"leave_running\":" + b(m.leave_running) +
         ",\"shell_job\":" + b(m.shell_job) + ",\"cut\":" + u(m.cut) + ",\"gpu_bytes\":" + u(m.gpu_bytes) +
         ",\"handles\":" + u(m.handles) + ",\"gpu_bytes_referenced\":" + u(m.gpu_bytes_referenced) +
         ",\"gpu_image_id\":" + json_string(m.gpu_image_id) + ",\"criu_track_mem\":" + b(m.criu_track_mem) +
         ",\"criu_parent\":" + b(m.criu_parent) + ",\"gpu\":" + json_string(m.gpu) + ",\"criu\":" + json_string(m.criu) +
         (m.gpu_uuids.empty() && m.gpus_visible.empty() && m.gpu_name.empty()
              ? std::string()
              : ",\"gpu_uuids\":" + json_string(m.gpu_uuids) + ",\"gpus_visible\":" + json_string(m.gpus_visible) +
                    ",\"gpu_name\":" + json_string(m.gpu_name)) +
         "}\n";
}

namespace {

using Value = FlatJsonValue;

// A list of GPU UUIDs as the manifest holds them: empty, or "GPU-" + 8-4-4-4-12 lowercase hex
// digits, comma-separated (the spelling of remoting/driver/gpu_identity.h, which this layer may not
// include; job_restore.cc parses them with it).
bool gpu_uuid_list(const std::string& s) {
  if (s.empty()) return true;
  if ((s.size() + 1) % 41 != 0) return false;
  for (size_t at = 0; at < s.size(); at += 41) {
    if (s.compare(at, 4, "GPU-") != 0 || (at + 40 < s.size() && s[at + 40] != ',')) return false;
    for (size_t i = 4; i < 40; ++i) {
      const char c = s[at + i];
      const bool dash = i == 12 || i == 17 || i == 22 || i == 27;
      if (dash ? c != '-' : !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    }
  }
  return true;
}

class Reader {
 public:
  Reader(const std::string& t, const char* what = "the manifest") : t_(t), what_(what) {}
  Status object(std::map<std::string, Value>* out) {
    skip();
    if (!eat('{')) return bad("it does not start with '{'");
    skip();
    if (eat('}')) return end();
    for (;;) {
      std::string key;
      POS_RETURN_IF_ERROR(string(&key));
      skip();
      if (!eat(':')) return bad("no ':' after \"" + key + "\"");
      skip();
      Value v;
      POS_RETURN_IF_ERROR(value(&v));
      if (!out->emplace(key, std::move(v)).second) return bad("\"" + key + "\" appears twice");
      skip();
      if (eat('}')) return end();
      if (!eat(',')) return bad("no ',' or '}' after \"" + key + "\"");
      skip();
    }
  }

 private:
  Status end() {
    skip();
    return i_ == t_.size() ? Status::Ok() : bad("bytes follow the object");
  }
  Status value(Value* v) {
    if (i_ < t_.size() && t_[i_] == '"') {
      v->kind = Value::kString;
      return string(&v->s);
    }
    if (t_.compare(i_, 4, "true") == 0) return i_ += 4, v->kind = Value::kBool, v->b = true, Status::Ok();
    if (t_.compare(i_, 5, "false") == 0) return i_ += 5, v->kind = Value::kBool, v->b = false, Status::Ok();
    if (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9') {
      v->kind = Value::kNumber;
      const size_t start = i_;
      while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9') {
        if (i_ - start >= 19) return bad("a number is too large");
        v->n = v->n * 10 + static_cast<uint64_t>(t_[i_++] - '0');
      }
      return Status::Ok();
    }
    return bad("a value is not a string, an unsigned number or a boolean");
  }
  Status string(std::string* out) {
    if (!eat('"')) return bad("a string was expected");
    for (;;) {
      if (i_ >= t_.size()) return bad("a string does not end");
      const char c = t_[i_++];
      if (c == '"') break;
      if (static_cast<unsigned char>(c) < 0x20) return bad("a string holds a control character");
      if (c != '\\') {
        *out += c;
        continue;
      }
      if (i_ >= t_.size()) return bad("a string does not end");
      const char e = t_[i_++];
      if (e == '"' || e == '\\' || e == '/') *out += e;
      else if (e == 'u') {
        // json_string writes \u00XX for control characters only: those are refused.
        return bad("a string holds an escaped character");
      } else return bad("a string holds an unknown escape");
    }
    if (!is_utf8(*out)) return bad("a string is not UTF-8");
    return Status::Ok();
  }
  void skip() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\n' || t_[i_] == '\t' || t_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    if (i_ < t_.size() && t_[i_] == c) return ++i_, true;
    return false;
  }
  Status bad(const std::string& why) const {
    return Status::Corrupt(std::string(what_) + " is not valid: " + why + " (at byte " + std::to_string(i_) + ")");
  }
  const std::string& t_;
  const char* what_;
  size_t i_ = 0;
};

}  // namespace

Status parse_flat_json(const std::string& text, const char* what, std::map<std::string, FlatJsonValue>* out) {
  return Reader(text, what).object(out);
}

StatusOr<JobManifest> parse_manifest(const std::string& text) {
  if (text.size() > 64 * 1024) return Status::Corrupt("the manifest is not valid: it is larger than 64 KiB");
  std::map<std::string, Value> v;
  POS_RETURN_IF_ERROR(Reader(text).object(&v));
  JobManifest m;
  auto want = [&](const char* key, Value::Kind kind) -> const Value* {
    auto it = v.find(key);
    if (it == v.end() || it->second.kind != kind) return nullptr;
    return &it->second;
  };
  auto missing = [](const char* key, const char* type) {
    return Status::Corrupt(std::string("the manifest is not valid: \"") + key + "\" (" + type + ") is missing or of another type");
  };
  const Value* f = want("format", Value::kNumber);
  if (f == nullptr) return missing("format", "a number");
  if (f->n != JobManifest::kFormat)
    return Status::Corrupt("the manifest is format " + std::to_string(f->n) + "; this pos-cli reads format " +
                           std::to_string(JobManifest::kFormat));
  struct NumberField { const char* key; uint64_t* out; };
  uint64_t pid = 0, uid = 0;
  for (const NumberField& n : {NumberField{"pid", &pid}, NumberField{"uid", &uid}, NumberField{"arena_bytes", &m.arena_bytes},
                               NumberField{"cut", &m.cut}, NumberField{"gpu_bytes", &m.gpu_bytes},
                               NumberField{"handles", &m.handles}, NumberField{"gpu_bytes_referenced", &m.gpu_bytes_referenced}}) {
    const Value* x = want(n.key, Value::kNumber);
    if (x == nullptr) return missing(n.key, "a number");
    *n.out = x->n;
  }
  if (pid == 0 || pid > 0x7fffffff) return Status::Corrupt("the manifest names no valid pid");
  if (uid > 0xfffffffe) return Status::Corrupt("the manifest names no valid uid");
  m.pid = static_cast<uint32_t>(pid), m.uid = static_cast<uint32_t>(uid);
  struct StringField { const char* key; std::string* out; };
  for (const StringField& s : {StringField{"kind", &m.kind}, StringField{"prev", &m.prev},
                               StringField{"job", &m.job}, StringField{"socket", &m.socket}, StringField{"permit", &m.permit},
                               StringField{"gpu_image_id", &m.gpu_image_id},
                               StringField{"gpu", &m.gpu}, StringField{"criu", &m.criu}}) {
    const Value* x = want(s.key, Value::kString);
    if (x == nullptr) return missing(s.key, "a string");
    *s.out = x->s;
  }
  if (m.kind != "dump" && m.kind != "pre-dump" && m.kind != "driver-dump" && m.kind != "driver-pre-dump")
    return Status::Corrupt("the manifest's kind \"" + printable(m.kind) +
                           "\" is none of \"dump\", \"pre-dump\", \"driver-dump\", \"driver-pre-dump\"");
  const bool dump = m.kind == "dump";
  for (const std::string* part : {&m.gpu, &m.criu}) {
    if (part->empty() && part == &m.criu && !dump) continue;  // a pre-dump without CRIU's part
    if (part->empty() || part->find('/') != std::string::npos || *part == "." || *part == "..")
      return Status::Corrupt("the manifest names a part outside its directory (\"" + *part + "\")");
  }
  if (!m.prev.empty() && (m.prev[0] == '/' || printable(m.prev) != m.prev))
    return Status::Corrupt("the manifest's previous image is not a relative, printable path");
  if (dump && m.arena_bytes == 0) return Status::Corrupt("the manifest names no session arena");
  if (dump && (m.permit.empty() || m.permit[0] != '/'))
    return Status::Corrupt("the manifest's permit is not an absolute path");
  struct BoolField { const char* key; bool* out; };
  for (const BoolField& b : {BoolField{"leave_running", &m.leave_running}, BoolField{"shell_job", &m.shell_job},
                             BoolField{"criu_track_mem", &m.criu_track_mem}, BoolField{"criu_parent", &m.criu_parent}}) {
    const Value* x = want(b.key, Value::kBool);
    if (x == nullptr) return missing(b.key, "a boolean");
    *b.out = x->b;
  }
  // Optional (images of older pos-cli lack them: unknown), each a string of its kind when present.
  for (const StringField& s : {StringField{"gpu_uuids", &m.gpu_uuids}, StringField{"gpus_visible", &m.gpus_visible},
                               StringField{"gpu_name", &m.gpu_name}}) {
    auto it = v.find(s.key);
    if (it == v.end()) continue;
    if (it->second.kind != Value::kString) return missing(s.key, "a string");
    *s.out = it->second.s;
  }
  if (!gpu_uuid_list(m.gpu_uuids) || !gpu_uuid_list(m.gpus_visible))
    return Status::Corrupt("the manifest's GPU UUIDs are not a comma-separated list of GPU-xxxxxxxx-xxxx-xxxx-xxxx-"
                           "xxxxxxxxxxxx");
  if (printable(m.gpu_name) != m.gpu_name) return Status::Corrupt("the manifest's GPU name is not printable");
  if (m.kind == "driver-dump") {  // an in-process job's: no session, no permit
    if (m.gpu != "gpu" || m.criu != "criu" || m.socket.empty() || m.socket[0] != '/')
      return Status::Corrupt("the manifest of an in-process job's dump names other parts than gpu and criu, or no "
                             "control socket");
  }
  if (m.kind == "driver-pre-dump") {  // an in-process job's GPU checkpoint, and maybe its pages (criu)
    if (m.gpu != "gpu" || (!m.criu.empty() && m.criu != "criu") || m.socket.empty() || m.socket[0] != '/')
      return Status::Corrupt("the manifest of an in-process job's pre-dump names other parts than gpu and criu, or no "
                             "control socket");
  }
  return m;
}

Status check_criu_parents(const std::string& dir, const JobManifest& m) {
  if (m.criu.empty()) return Status::Ok();
  char real[PATH_MAX], real_dir[PATH_MAX];
  if (::realpath(dir.c_str(), real_dir) == nullptr)
    return Status::NotFound("cannot resolve " + dir + ": " + std::strerror(errno));
  const std::string part = dir + "/" + m.criu;
  if (::realpath(part.c_str(), real) == nullptr) return Status::Corrupt("the CPU part " + part + " is missing");
  if (std::string(real) != std::string(real_dir) + "/" + m.criu)
    return Status::Corrupt("the CPU part " + part + " leads outside its image (to " + printable(real, 256) + ")");
  std::string level = real;
  for (int depth = 0;; ++depth) {
    struct stat st {};
    const std::string link = level + "/parent";
    if (::lstat(link.c_str(), &st) != 0) return Status::Ok();  // the chain ends here
    if (depth == 64) return Status::Corrupt("the CPU part " + part + " has more than 64 parents (or a loop)");
    if (::realpath(link.c_str(), real) == nullptr)
      return Status::Corrupt("the previous CPU part " + link + " is gone: " + part + " needs it");
    const std::string target = real;
    const size_t slash = target.rfind('/');
    const std::string image = slash == 0 ? "/" : target.substr(0, slash), name = target.substr(slash + 1);
    auto pm = read_manifest(image);
    if (!pm.ok() || pm->pid != m.pid || pm->uid != m.uid || pm->criu != name)
      return Status::Corrupt("the CPU part " + part + " reads pages through " + link + " from " + printable(target, 256) +
                             ", which is not the CPU part of an image of this job (pid " + std::to_string(m.pid) +
                             ", uid " + std::to_string(m.uid) + ")" +
                             (pm.ok() ? "" : ": " + pm.status().message()));
    level = target;
  }
}

StatusOr<std::string> read_small_file(const std::string& path, size_t max) {
  UniqueFd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!f) return Status::Corrupt("the image has no " + path + " (" + std::strerror(errno) + ")");
  std::string text(max + 1, '\0');
  size_t got = 0;
  for (;;) {
    const ssize_t r = ::read(f.get(), text.data() + got, text.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::Unavailable("cannot read " + path + ": " + std::strerror(errno));
    if (r == 0) break;
    got += static_cast<size_t>(r);
    if (got > max) return Status::Corrupt(path + " is larger than " + std::to_string(max) + " bytes");
  }
  text.resize(got);
  return text;
}

StatusOr<JobManifest> read_manifest(const std::string& dir) {
  auto text = read_small_file(dir + "/manifest", 64 * 1024);
  if (!text.ok()) return text.status().with_context(dir + " is not a pos-cli dump image");
  auto m = parse_manifest(*text);
  if (!m.ok()) return m.status().with_context(dir + "/manifest");
  return m;
}

}  // namespace pos
