// inspect.cc — text and JSON views of an image: inventory, client, every handle with its blob.
// JSON comes from Protobuf's own mapping (field names as in image.proto), so it stays in step.
#include "ckpt/inspect.h"

#include <google/protobuf/util/json_util.h>

#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <vector>

#include "pos/base/api_id.h"
#include "pos/base/text.h"

namespace pos::ckpt {
namespace {

const char* kTypeNames[] = {"device", "context", "stream", "event", "memory", "module", "function", "var", "cublas"};

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof(buf), f, ap);
  va_end(ap);
  return buf;
}

std::string api_name_of(uint32_t id) {
  const ApiInfo* a = find_api(id);
  return a != nullptr ? std::string(a->name) : "unknown-api";
}

uint64_t param_bytes(const pb::PendingCall& p) {
  uint64_t n = 0;
  for (const std::string& b : p.params()) n += b.size();
  return n;
}

const char* type_name(uint32_t t) { return t < 9 ? kTypeNames[t] : "unknown"; }

// Handles by resource type: how many, how many bytes of device memory they cover, how many of
// those bytes this image stores itself.
struct TypeTotals {
  uint64_t count = 0, bytes = 0, stored = 0;
};
std::vector<TypeTotals> totals_by_type(const pb::ClientImage& c) {
  std::vector<TypeTotals> t(10);
  for (const auto& h : c.handles()) {
    TypeTotals& x = t[h.type() < 9 ? h.type() : 9];
    ++x.count;
    x.bytes += h.size();
    if (h.has_memory() && !h.memory().in_parent()) x.stored += h.memory().length();
  }
  return t;
}

std::string handle_json(const pb::HandleRecord& h) {
  std::string o = fmt("{\"id\":%" PRIu64 ",\"type\":\"%s\",\"addr\":%" PRIu64 ",\"size\":%" PRIu64
                      ",\"version\":%" PRIu64,
                      h.id() & ((uint64_t{1} << 56) - 1), type_name(h.type()), h.addr(), h.size(), h.version());
  if (!h.name().empty()) o += ",\"name\":" + json_string(h.name());
  if (!h.fatbin().empty()) o += fmt(",\"fatbin_bytes\":%zu", h.fatbin().size());
  if (h.parents_size() > 0) {
    o += ",\"parents\":[";
    for (int i = 0; i < h.parents_size(); ++i)
      o += fmt("%s%" PRIu64, i > 0 ? "," : "", h.parents(i) & ((uint64_t{1} << 56) - 1));
    o += "]";
  }
  if (h.has_memory()) {
    if (h.memory().in_parent()) o += ",\"memory\":{\"in_parent\":true}";
    else if (h.memory().in_peer()) o += ",\"memory\":{\"in_peer\":true}";
    else
      o += fmt(",\"memory\":{\"in_parent\":false,\"offset\":%" PRIu64 ",\"length\":%" PRIu64 ",\"chunks\":%d}",
               h.memory().offset(), h.memory().length(), h.memory().chunk_crc_size());
  }
  return o + "}";
}

}  // namespace

StatusOr<VerifyReport> verify_image(const ImageReader& image,
                                    const std::function<void(uint64_t done, uint64_t total)>& progress) {
  VerifyReport r;
  uint64_t total = 0;
  for (const ImageReader* img = &image; img != nullptr; img = img->parent())
    for (const auto& h : img->client().handles())
      if (h.has_memory() && !h.memory().in_parent()) total += h.memory().length();
  std::vector<std::byte> buf;
  for (const ImageReader* img = &image; img != nullptr; img = img->parent()) {
    ++r.images;
    const std::string where = img->dir().empty() ? std::string("memory image") : img->dir();
    for (const auto& h : img->client().handles()) {
      if (!h.has_memory() || h.memory().in_parent() || h.memory().in_peer()) continue;
      const pb::BlobRef& ref = h.memory();
      ++r.blobs;
      const uint64_t chunk = ref.chunk_size();
      if (chunk == 0 && ref.length() > 0) return Status::Corrupt(where + ": a blob with chunk size 0");
      for (uint64_t off = 0; off < ref.length(); off += chunk) {
        const uint64_t n = std::min(chunk, ref.length() - off);
        buf.resize(n);
        Status s = img->read_chunk(ref, off, n, buf.data());
        if (!s.ok())
          return Status(s.code(), s.api_error(),
                        fmt("%s: handle #%" PRIu64 " (%s at 0x%" PRIx64 ", %" PRIu64 " bytes), bytes %" PRIu64
                            "..%" PRIu64 ": ",
                            where.c_str(), h.id() & ((uint64_t{1} << 56) - 1), type_name(h.type()), h.addr(),
                            h.size(), off, off + n) +
                            s.message());
        ++r.chunks;
        r.bytes += n;
        if (progress) progress(r.bytes, total);
      }
    }
  }
  return r;
}

std::string describe_image(const ImageReader& image, const DescribeOptions& options) {
  const pb::Inventory& inv = image.inventory();
  const pb::ClientImage& c = image.client();
  if (options.json) {
    google::protobuf::util::JsonPrintOptions o;
    o.add_whitespace = false;
    o.preserve_proto_field_names = true;
    std::string inv_json, client_json;
    pb::ClientImage slim = c;
    // Handles are written below, with their types by name.
    slim.clear_handles();
    // Pending calls: pc, API and sizes (their parameter bytes can be whole host-to-device copies).
    slim.clear_pending();
    std::string pending = "[";
    for (const pb::PendingCall& p : c.pending()) {
      pending += fmt("%s{\"pc\":\"%" PRIu64 "\",\"api_id\":%u,\"api\":\"%s\",\"params\":%d,\"param_bytes\":\"%" PRIu64
                     "\",\"ret_bytes\":%zu}",
                     pending.size() > 1 ? "," : "", p.pc(), p.api_id(), api_name_of(p.api_id()).c_str(), p.params_size(),
                     param_bytes(p), p.ret().size());
    }
    pending += "]";
    (void)google::protobuf::util::MessageToJsonString(inv, &inv_json, o);
    (void)google::protobuf::util::MessageToJsonString(slim, &client_json, o);
    std::string handles;
    if (options.summary) {
      handles = ",\"handle_summary\":{";
      const auto t = totals_by_type(c);
      bool first = true;
      for (size_t i = 0; i < t.size(); ++i) {
        if (t[i].count == 0) continue;
        handles += fmt("%s\"%s\":{\"count\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"stored_bytes\":%" PRIu64 "}",
                       first ? "" : ",", i < 9 ? kTypeNames[i] : "unknown", t[i].count, t[i].bytes, t[i].stored);
        first = false;
      }
      handles += "}";
    } else {
      handles = ",\"handles\":[";
      for (int i = 0; i < c.handles_size(); ++i) handles += (i > 0 ? "," : "") + handle_json(c.handles(i));
      handles += "]";
    }
    return "{\"inventory\":" + inv_json + ",\"client\":" + client_json + handles + ",\"pending_calls\":" + pending +
           "}\n";
  }
  std::string out;
  // Every string of the image goes through printable(): an image's names came from clients (and an
  // image may be hostile), and this text lands on an operator's terminal.
  out += fmt("POS image %s (format %u, POS %s)\n", printable(inv.image_id()).c_str(), inv.format_version(),
             printable(inv.pos_version()).c_str());
  out += fmt("  backend %s, device %s, mode %s, cut %" PRIu64 "\n", printable(inv.backend()).c_str(),
             printable(inv.device_name()).c_str(), printable(inv.mode()).c_str(), inv.cut_pc());
  std::string feats;
  for (const auto& f : inv.features()) feats += (feats.empty() ? "" : ", ") + printable(f);
  out += "  features: " + feats + "\n";
  if (inv.has_parent())
    out += fmt("  parent: %s (image %s, cut %" PRIu64 ")\n", printable(inv.parent().path()).c_str(),
               printable(inv.parent().image_id()).c_str(), inv.parent().cut_pc());
  std::string files = fmt("memory.bin %" PRIu64 " bytes", inv.memory_size());
  for (int i = 0; i < inv.memory_file_sizes_size(); ++i)
    files += fmt(", memory.%d.bin %" PRIu64 " bytes", i + 1, inv.memory_file_sizes(i));
  out += fmt("  device bytes stored here: %" PRIu64 " (%s)\n", inv.blob_bytes(), files.c_str());
  const auto& cr = c.client();
  out += fmt("client %" PRIu64 " (%s) on device %d: range 0x%" PRIx64 " + 0x%" PRIx64 ", next call %" PRIu64 "\n",
             cr.uuid(), printable(cr.job_name()).c_str(), cr.device(), cr.va_base(), cr.va_size(), cr.next_pc());
  if (options.summary) {
    out += fmt("%d handles:\n", c.handles_size());
    const auto t = totals_by_type(c);
    for (size_t i = 0; i < t.size(); ++i)
      if (t[i].count != 0)
        out += fmt("  %-8s %8" PRIu64 "  %16" PRIu64 " bytes  %16" PRIu64 " stored here\n", i < 9 ? kTypeNames[i] : "unknown",
                   t[i].count, t[i].bytes, t[i].stored);
    out += fmt("%d pending calls\n", c.pending_size());
    return out;
  }
  out += fmt("%d handles:\n", c.handles_size());
  for (const auto& h : c.handles()) {
    const char* t = h.type() < 9 ? kTypeNames[h.type()] : "?";
    out += fmt("  %-8s #%-5" PRIu64 " 0x%-14" PRIx64, t, static_cast<uint64_t>(h.id() & ((uint64_t{1} << 56) - 1)), h.addr());
    if (h.size() != 0) out += fmt(" %" PRIu64 " bytes", h.size());
    if (!h.name().empty()) out += " " + printable(h.name());
    if (!h.fatbin().empty()) out += fmt(" fatbin %zu bytes", h.fatbin().size());
    out += fmt(" v%" PRIu64, h.version());
    if (h.has_memory()) {
      if (h.memory().in_parent()) out += " [in parent]";
      else if (h.memory().in_peer()) out += " [in peer session]";
      else out += fmt(" [blob @%" PRIu64 ", %d chunks]", h.memory().offset(), h.memory().chunk_crc_size());
    }
    out += "\n";
  }
  out += fmt("%d pending calls%s\n", c.pending_size(), c.pending_size() > 0 ? " (replayed after restore):" : "");
  for (const pb::PendingCall& p : c.pending())
    out += fmt("  pc %-8" PRIu64 " %-28s %d params, %" PRIu64 " bytes\n", p.pc(), api_name_of(p.api_id()).c_str(),
               p.params_size(), param_bytes(p));
  return out;
}

}  // namespace pos::ckpt
