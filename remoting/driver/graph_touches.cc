// graph_touches.cc — a CUDA graph's nodes read for the memory they may write (graph_touches.h), and
// the book of executable graphs interpose.cc consults at every graph launch.
#include "remoting/driver/graph_touches.h"

#include <algorithm>

namespace pos::driver {
namespace {

constexpr int kMaxDepth = 8;

// The span a 3D copy writes, from its first byte: the last row of the last slice ends it.
uint64_t copy_span(const Memcpy3D& c) {
  const uint64_t rows = c.height == 0 ? 0 : c.height - 1, slices = c.depth == 0 ? 0 : c.depth - 1;
  return c.width_bytes + rows * c.dst_pitch + slices * c.dst_pitch * c.dst_height;
}

struct Reader {
  const GraphCalls& calls;
  LaunchScanner& scanner;
  const std::function<bool(uint64_t)>& keep;
  GraphTouches* out;
  std::string* why;

  bool fail(const std::string& w) {
    if (why != nullptr) *why = w;
    return false;
  }
  void range(uint64_t at, uint64_t len) {
    if (len != 0 && keep(at)) out->ranges.emplace_back(at, len);
  }

  bool kernel(CUgraphNode n) {
    KernelNodeParams p{};
    if (calls.kernel_params(n, &p) != kSuccess) return fail("the driver would not give a kernel node's parameters");
    CUfunction f = p.func != nullptr ? p.func : p.kern;
    if (p.kernel_params == nullptr && p.extra == nullptr) {
      // No parameter values given back: only a kernel that takes none is read whole.
      const std::shared_ptr<const ParamLayout> l = scanner.layout(f);
      if (l == nullptr || !l->known || !l->params.empty()) return fail("a kernel node gave no parameter values");
      return true;
    }
    const bool read = scanner.scan(f, p.kernel_params, p.extra, [&](uint64_t w) {
      if (keep(w)) out->words.push_back(w);
    });
    return read || fail("a kernel node's parameters have no layout");
  }

  bool copy(CUgraphNode n) {
    Memcpy3D c{};
    if (calls.memcpy_params(n, &c) != kSuccess) return fail("the driver would not give a copy node's parameters");
    if (c.dst_memory_type == kMemoryDevice || c.dst_memory_type == kMemoryUnified) {
      const uint64_t base = c.dst_device + c.dst_x_bytes + c.dst_y * c.dst_pitch + c.dst_z * c.dst_pitch * c.dst_height;
      range(base, copy_span(c));
    } else if (c.dst_memory_type == kMemoryHost) {
      // Host memory is never POS's; an address in its window would be, so it counts.
      range(reinterpret_cast<uint64_t>(c.dst_host) + c.dst_x_bytes, copy_span(c));
    }  // a CUDA array: the driver's memory, not placed
    return true;
  }

  bool set(CUgraphNode n) {
    MemsetNodeParams m{};
    if (calls.memset_params(n, &m) != kSuccess) return fail("the driver would not give a memset node's parameters");
    const uint64_t rows = m.height == 0 ? 0 : m.height - 1;
    range(m.dst, rows * m.pitch + m.width * m.element_size);
    return true;
  }

  bool graph(CUgraph g, int depth) {
    if (depth > kMaxDepth) return fail("child graphs nested deeper than 8");
    size_t count = 0;
    if (calls.get_nodes(g, nullptr, &count) != kSuccess) return fail("the driver would not list a graph's nodes");
    std::vector<CUgraphNode> nodes(count);
    if (count > 0 && calls.get_nodes(g, nodes.data(), &count) != kSuccess)
      return fail("the driver would not list a graph's nodes");
    nodes.resize(std::min(count, nodes.size()));
    for (CUgraphNode n : nodes) {
      int type = -1;
      if (calls.node_type(n, &type) != kSuccess) return fail("the driver would not say a node's type");
      ++out->nodes;
      bool ok = true;
      switch (type) {
        case kNodeKernel: ok = kernel(n); break;
        case kNodeMemcpy: ok = copy(n); break;
        case kNodeMemset: ok = set(n); break;
        case kNodeChildGraph: {
          CUgraph child = nullptr;
          if (calls.child_graph(n, &child) != kSuccess) return fail("the driver would not give a child graph");
          ok = graph(child, depth + 1);
          break;
        }
        // No device memory of the job's: host callbacks, ordering, semaphores, and the graph's own
        // allocations (the driver places them, never in POS's window).
        case kNodeHost: case kNodeEmpty: case kNodeWaitEvent: case kNodeEventRecord: case kNodeSemaphoreSignal:
        case kNodeSemaphoreWait: case kNodeMemAlloc: case kNodeMemFree:
          break;
        default:
          return fail("a node of type " + std::to_string(type) + " (its writes are not known)");
      }
      if (!ok) return false;
    }
    return true;
  }
};

}  // namespace

std::shared_ptr<const GraphTouches> read_graph(const GraphCalls& calls, LaunchScanner& scanner, CUgraph g,
                                               const std::function<bool(uint64_t)>& keep, std::string* why) {
  if (!calls.complete()) {
    if (why != nullptr) *why = "the driver lacks the calls that read a graph";
    return nullptr;
  }
  auto t = std::make_shared<GraphTouches>();
  Reader r{calls, scanner, keep, t.get(), why};
  if (!r.graph(g, 0)) return nullptr;
  std::sort(t->words.begin(), t->words.end());
  t->words.erase(std::unique(t->words.begin(), t->words.end()), t->words.end());
  std::sort(t->ranges.begin(), t->ranges.end());
  t->ranges.erase(std::unique(t->ranges.begin(), t->ranges.end()), t->ranges.end());
  return t;
}

void GraphBook::learn(CUgraphExec e, std::shared_ptr<const GraphTouches> t) {
  std::lock_guard<std::mutex> lk(mu_);
  if (t == nullptr) {
    execs_.erase(e);
    return;
  }
  ++stats_.read;
  execs_[e] = std::move(t);
}

void GraphBook::forget(CUgraphExec e) {
  std::lock_guard<std::mutex> lk(mu_);
  execs_.erase(e);
}

std::shared_ptr<const GraphTouches> GraphBook::find(CUgraphExec e) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = execs_.find(e);
  return it == execs_.end() ? nullptr : it->second;
}

void GraphBook::count_launch(bool read) {
  std::lock_guard<std::mutex> lk(mu_);
  ++(read ? stats_.launches_read : stats_.launches_unread);
}

void GraphBook::count_unread(const std::string& why) {
  std::lock_guard<std::mutex> lk(mu_);
  ++stats_.unread;
  stats_.last_unread = why;
}

GraphBook::Stats GraphBook::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

}  // namespace pos::driver
