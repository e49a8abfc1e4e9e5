// graph_touches.h — what a CUDA graph may write, read once when the job instantiates it: every
// kernel node's parameters scanned as a launch's are, every memcpy and memset node's destination.
// interpose.cc keeps it per executable graph (GraphBook), so that a graph launch marks only that
// memory written and, while a cut's copies run ahead, waits only for their copies; a graph it
// cannot read, or one changed after instantiation, counts as touching everything, as every graph
// launch did before. Device-neutral: the driver's calls come in as pointers (CI uses fakes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "remoting/driver/driver_api.h"
#include "remoting/driver/launch_params.h"

namespace pos::driver {

// CUDA_KERNEL_NODE_PARAMS_v2 (cuGraphKernelNodeGetParams_v2), as cuda.h lays it out.
struct KernelNodeParams {
  CUfunction func;
  unsigned int grid[3], block[3], shared_bytes;
  void** kernel_params;
  void** extra;
  void* kern;  // CUkernel, when the node was made with one
  CUcontext ctx;
};
// CUDA_MEMCPY3D (cuGraphMemcpyNodeGetParams), as cuda.h lays it out.
struct Memcpy3D {
  size_t src_x_bytes, src_y, src_z, src_lod;
  int src_memory_type;
  const void* src_host;
  CUdeviceptr src_device;
  void* src_array;
  void* reserved0;
  size_t src_pitch, src_height;
  size_t dst_x_bytes, dst_y, dst_z, dst_lod;
  int dst_memory_type;
  void* dst_host;
  CUdeviceptr dst_device;
  void* dst_array;
  void* reserved1;
  size_t dst_pitch, dst_height;
  size_t width_bytes, height, depth;
};
// CUDA_MEMSET_NODE_PARAMS (cuGraphMemsetNodeGetParams), as cuda.h lays it out.
struct MemsetNodeParams {
  CUdeviceptr dst;
  size_t pitch;
  unsigned int value, element_size;
  size_t width, height;
};
// CUgraphNodeType values and CUmemorytype's that name device addresses.
inline constexpr int kNodeKernel = 0, kNodeMemcpy = 1, kNodeMemset = 2, kNodeHost = 3, kNodeChildGraph = 4,
                     kNodeEmpty = 5, kNodeWaitEvent = 6, kNodeEventRecord = 7, kNodeSemaphoreSignal = 8,
                     kNodeSemaphoreWait = 9, kNodeMemAlloc = 10, kNodeMemFree = 11;
inline constexpr int kMemoryHost = 1, kMemoryDevice = 2, kMemoryUnified = 4;

struct GraphCalls {
  CUresult (*get_nodes)(CUgraph g, CUgraphNode* nodes, size_t* n) = nullptr;  // cuGraphGetNodes
  CUresult (*node_type)(CUgraphNode n, int* type) = nullptr;                  // cuGraphNodeGetType
  CUresult (*kernel_params)(CUgraphNode n, KernelNodeParams* p) = nullptr;    // cuGraphKernelNodeGetParams_v2
  CUresult (*memcpy_params)(CUgraphNode n, Memcpy3D* p) = nullptr;            // cuGraphMemcpyNodeGetParams
  CUresult (*memset_params)(CUgraphNode n, MemsetNodeParams* p) = nullptr;    // cuGraphMemsetNodeGetParams
  CUresult (*child_graph)(CUgraphNode n, CUgraph* g) = nullptr;               // cuGraphChildGraphNodeGetGraph
  bool complete() const {
    return get_nodes && node_type && kernel_params && memcpy_params && memset_params && child_graph;
  }
};

// What a graph's nodes may write: the words of its kernels' parameters that `keep` accepts (POS's
// address window), and its copies' and memsets' destination ranges that start in it. Sorted, unique.
struct GraphTouches {
  std::vector<uint64_t> words;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // (address, bytes)
  size_t nodes = 0;                                   // nodes read, child graphs' included
};

// Reads graph `g` (child graphs too, 8 deep at most). Null, with `why`, when a node cannot be read
// whole: a node type whose writes it does not know (batch memory operations, conditional nodes,
// any later kind), a kernel whose parameters have no layout, a call the driver refused.
std::shared_ptr<const GraphTouches> read_graph(const GraphCalls& calls, LaunchScanner& scanner, CUgraph g,
                                               const std::function<bool(uint64_t)>& keep, std::string* why);

// The executable graphs the job instantiated, with what each may write; an executable graph it does
// not know (instantiated before the hooks, by a call not hooked, or changed since) has none.
class GraphBook {
 public:
  void learn(CUgraphExec e, std::shared_ptr<const GraphTouches> t);
  void forget(CUgraphExec e);  // destroyed or changed
  std::shared_ptr<const GraphTouches> find(CUgraphExec e) const;

  struct Stats {
    uint64_t read = 0, unread = 0, launches_read = 0, launches_unread = 0;
    std::string last_unread;  // why the last graph that could not be read was not
  };
  void count_launch(bool read);
  void count_unread(const std::string& why);
  Stats stats() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<CUgraphExec, std::shared_ptr<const GraphTouches>> execs_;  // under mu_
  Stats stats_;                                                                  // under mu_
};

}  // namespace pos::driver
