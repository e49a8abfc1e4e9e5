// graph_touches_test.cc — a CUDA graph read for what it may write (remoting/driver/graph_touches.h):
// graphs made of fake nodes, read through fake driver calls, and the book of executable graphs.
#include "remoting/driver/graph_touches.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pos::driver {
namespace {

// A fake graph: nodes are pointers to these.
struct Node {
  int type = kNodeEmpty;
  KernelNodeParams kernel{};
  Memcpy3D copy{};
  MemsetNodeParams set{};
  struct Graph* child = nullptr;
  bool refuse = false;  // the driver refuses to give this node's parameters
};
struct Graph {
  std::vector<Node*> nodes;
};

CUresult get_nodes(CUgraph g, CUgraphNode* out, size_t* n) {
  auto* graph = static_cast<Graph*>(g);
  if (out == nullptr) {
    *n = graph->nodes.size();
    return kSuccess;
  }
  for (size_t i = 0; i < *n && i < graph->nodes.size(); ++i) out[i] = graph->nodes[i];
  return kSuccess;
}
CUresult node_type(CUgraphNode n, int* t) {
  *t = static_cast<Node*>(n)->type;
  return kSuccess;
}
CUresult kernel_params(CUgraphNode n, KernelNodeParams* p) {
  auto* node = static_cast<Node*>(n);
  if (node->refuse) return 400;
  *p = node->kernel;
  return kSuccess;
}
CUresult memcpy_params(CUgraphNode n, Memcpy3D* p) {
  *p = static_cast<Node*>(n)->copy;
  return kSuccess;
}
CUresult memset_params(CUgraphNode n, MemsetNodeParams* p) {
  *p = static_cast<Node*>(n)->set;
  return kSuccess;
}
CUresult child_graph(CUgraphNode n, CUgraph* g) {
  *g = static_cast<Node*>(n)->child;
  return kSuccess;
}
GraphCalls calls() { return GraphCalls{&get_nodes, &node_type, &kernel_params, &memcpy_params, &memset_params, &child_graph}; }

// Kernels: a handle is a pointer to its parameter layout; none known for `kUnknown`.
std::vector<std::pair<size_t, size_t>> kTwoPointers{{0, 8}, {8, 8}}, kNoParams{};
int kUnknown;
CUresult func_info(CUfunction f, size_t i, size_t* off, size_t* size) {
  if (f == &kUnknown) return 500;
  const auto* l = static_cast<const std::vector<std::pair<size_t, size_t>>*>(f);
  if (i >= l->size()) return 1;
  *off = (*l)[i].first;
  *size = (*l)[i].second;
  return kSuccess;
}

constexpr uint64_t kWindow = 0x200000000000ull, kWindowEnd = 0x210000000000ull;
bool in_window(uint64_t w) { return w >= kWindow && w < kWindowEnd; }

struct Fixture {
  LaunchScanner scanner{ParamInfoCalls{&func_info, nullptr}};
  std::string why;
  std::shared_ptr<const GraphTouches> read(Graph& g) {
    why.clear();
    return read_graph(calls(), scanner, &g, in_window, &why);
  }
};

Node kernel_node(void* f, void** params) {
  Node n;
  n.type = kNodeKernel;
  n.kernel.func = f;
  n.kernel.kernel_params = params;
  return n;
}

TEST(GraphTouches, AGraphWritesItsKernelsPointersItsCopiesAndMemsetsDestinationsInChildGraphsToo) {
  Fixture fx;
  uint64_t a = kWindow + 0x1000, outside = 0x7f0000001000ull, b = kWindow + 0x9000;
  void* p1[2] = {&a, &outside};
  void* p2[2] = {&b, &a};
  Node k1 = kernel_node(&kTwoPointers, p1), k2 = kernel_node(&kTwoPointers, p2);
  Node copy;
  copy.type = kNodeMemcpy;
  copy.copy.dst_memory_type = kMemoryDevice;
  copy.copy.dst_device = kWindow + 0x20000;
  copy.copy.dst_x_bytes = 16;
  copy.copy.width_bytes = 256;
  copy.copy.height = 1;
  copy.copy.depth = 1;
  Node pitched;  // two rows of 64 bytes, 512 apart
  pitched.type = kNodeMemset;
  pitched.set = MemsetNodeParams{kWindow + 0x40000, 512, 7, 4, 16, 2};
  Node host_copy;  // into host memory: not the job's device memory
  host_copy.type = kNodeMemcpy;
  host_copy.copy.dst_memory_type = kMemoryHost;
  host_copy.copy.dst_host = &a;
  host_copy.copy.width_bytes = 8;
  Node wait, record, host;
  wait.type = kNodeWaitEvent;
  record.type = kNodeEventRecord;
  host.type = kNodeHost;
  Graph inner{{&k2, &pitched}};
  Node child;
  child.type = kNodeChildGraph;
  child.child = &inner;
  Graph g{{&k1, &wait, &copy, &child, &host_copy, &record, &host}};
  const auto t = fx.read(g);
  ASSERT_NE(t, nullptr) << fx.why;
  EXPECT_EQ(t->words, (std::vector<uint64_t>{a, b}));  // sorted, once each, the outside word left out
  EXPECT_EQ(t->ranges, (std::vector<std::pair<uint64_t, uint64_t>>{{kWindow + 0x20010, 256}, {kWindow + 0x40000, 576}}));
  EXPECT_EQ(t->nodes, 9u);
}

TEST(GraphTouches, AGraphWithANodeWhoseWritesAreNotKnownIsNotReadAndSaysWhy) {
  Fixture fx;
  uint64_t a = kWindow;
  void* p[2] = {&a, &a};
  Node ok = kernel_node(&kTwoPointers, p);
  Node batch;
  batch.type = 12;  // batch memory operations: they write where they say, not read here
  Graph g1{{&ok, &batch}};
  EXPECT_EQ(fx.read(g1), nullptr);
  EXPECT_NE(fx.why.find("type 12"), std::string::npos) << fx.why;

  Node unknown = kernel_node(&kUnknown, p);  // no layout: its parameters cannot be read
  Graph g2{{&ok, &unknown}};
  EXPECT_EQ(fx.read(g2), nullptr);
  EXPECT_NE(fx.why.find("no layout"), std::string::npos) << fx.why;

  Node refused = kernel_node(&kTwoPointers, p);
  refused.refuse = true;
  Graph g3{{&refused}};
  EXPECT_EQ(fx.read(g3), nullptr);
  EXPECT_NE(fx.why.find("would not give"), std::string::npos) << fx.why;

  Node valueless = kernel_node(&kTwoPointers, nullptr);  // parameters but no values given back
  Graph g4{{&valueless}};
  EXPECT_EQ(fx.read(g4), nullptr);
  Node none = kernel_node(&kNoParams, nullptr);  // a kernel without parameters writes nothing it names
  Graph g5{{&none}};
  const auto t5 = fx.read(g5);
  ASSERT_NE(t5, nullptr) << fx.why;
  EXPECT_TRUE(t5->words.empty());

  // A child graph inside itself would never end: the depth bound ends it.
  Graph loop;
  Node self;
  self.type = kNodeChildGraph;
  self.child = &loop;
  loop.nodes = {&self};
  EXPECT_EQ(fx.read(loop), nullptr);
  EXPECT_NE(fx.why.find("deeper"), std::string::npos) << fx.why;

  GraphCalls partial = calls();
  partial.child_graph = nullptr;
  EXPECT_EQ(read_graph(partial, fx.scanner, &g5, in_window, &fx.why), nullptr);
  EXPECT_NE(fx.why.find("lacks"), std::string::npos) << fx.why;
}

TEST(GraphBook, AnExecutableGraphIsKnownUntilDestroyedOrChangedAndAnUnreadOneIsNot) {
  GraphBook book;
  int e1, e2;
  auto t = std::make_shared<GraphTouches>();
  t->words = {kWindow};
  book.learn(&e1, t);
  EXPECT_EQ(book.find(&e1), t);
  EXPECT_EQ(book.find(&e2), nullptr);
  book.learn(&e1, nullptr);  // the same handle made again from a graph that could not be read
  EXPECT_EQ(book.find(&e1), nullptr);
  book.learn(&e2, t);
  book.forget(&e2);
  EXPECT_EQ(book.find(&e2), nullptr);
  book.count_launch(true);
  book.count_launch(false);
  book.count_unread("a node of type 13 (its writes are not known)");
  const GraphBook::Stats s = book.stats();
  EXPECT_EQ(s.read, 2u);
  EXPECT_EQ(s.unread, 1u);
  EXPECT_EQ(s.launches_read, 1u);
  EXPECT_EQ(s.launches_unread, 1u);
  EXPECT_EQ(s.last_unread, "a node of type 13 (its writes are not known)");
}

}  // namespace
}  // namespace pos::driver
