// cut_probe.cu — a CUDA program for the cut-consistency test (unittest/cut_consistency.sh): it keeps
// the GPU busy rewriting N buffers, so that a GPU-only checkpoint's copies race its work on the device.
//
// Update u (1, 2, ...) writes the value u into every 32-bit word of buffer (u - 1) mod N, in stream
// order on one stream, by a kernel, or every eighth time by a device-to-device copy from a staging
// buffer the kernel filled. A checkpoint consistent with a cut after update K therefore holds, in
// buffer b, the largest u <= K with (u - 1) mod N == b (0 when there is none), in every word.
// It prints "buffer I 0xADDR BYTES" per buffer, then "ready", and runs for --seconds.
// With --graphs each update is one launch of a CUDA graph made for its buffer (as torch.compile's
// reduce-overhead replays them): a kernel bumps a device counter to u, then the buffer is filled with
// the counter's value, by a kernel, after a memset node (buffers 3 mod 8), through a copy node from
// staging (7 mod 8), or inside a child graph (buffer 0): the graph layer must read each kind.
//
//   cut_probe [--buffers N] [--mib M] [--seconds S] [--graphs]
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

__global__ void fill(uint32_t* p, size_t n, uint32_t v) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = v;
}

__global__ void bump(uint32_t* counter) { *counter += 1; }

__global__ void fill_counted(uint32_t* p, size_t n, const uint32_t* counter) {
  const uint32_t v = *counter;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = v;
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "cut_probe: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  int buffers = 8;
  size_t mib = 256;
  double seconds = 30;
  bool graphs = false;
  for (int i = 1; i < argc; i += 2) {
    if (std::strcmp(argv[i], "--graphs") == 0) {
      graphs = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: cut_probe [--buffers N] [--mib M] [--seconds S] [--graphs]\n");
      return 2;
    } else if (std::strcmp(argv[i], "--buffers") == 0) buffers = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--mib") == 0) mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: cut_probe [--buffers N] [--mib M] [--seconds S] [--graphs]\n");
      return 2;
    }
  }
  if (buffers < 1 || buffers > 64 || mib < 1 || mib > 4096) {
    std::fprintf(stderr, "cut_probe: 1..64 buffers of 1..4096 MiB\n");
    return 2;
  }
  const size_t bytes = mib << 20, words = bytes / 4;
  cudaStream_t s = nullptr;
  if (!ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate")) return 1;
  std::vector<uint32_t*> b(buffers, nullptr);
  uint32_t* staging = nullptr;
  for (int i = 0; i < buffers; ++i) {
    if (!ok(cudaMalloc(&b[i], bytes), "cudaMalloc") || !ok(cudaMemset(b[i], 0, bytes), "cudaMemset")) return 1;
    std::printf("buffer %d 0x%llx %zu\n", i, static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(b[i])), bytes);
  }
  if (!ok(cudaMalloc(&staging, bytes), "cudaMalloc (staging)") || !ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize"))
    return 1;
  // One executable graph per buffer, made by capturing its update on `s`.
  uint32_t* counter = nullptr;
  std::vector<cudaGraphExec_t> exec(graphs ? buffers : 0, nullptr);
  if (graphs) {
    if (!ok(cudaMalloc(&counter, sizeof(uint32_t)), "cudaMalloc (counter)") ||
        !ok(cudaMemset(counter, 0, sizeof(uint32_t)), "cudaMemset (counter)") ||
        !ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize"))
      return 1;
    for (int i = 0; i < buffers; ++i) {
      cudaGraph_t g = nullptr;
      if (!ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture")) return 1;
      bump<<<1, 1, 0, s>>>(counter);
      if (i % 8 == 7) {
        fill_counted<<<1024, 256, 0, s>>>(staging, words, counter);
        (void)cudaMemcpyAsync(b[i], staging, bytes, cudaMemcpyDeviceToDevice, s);
      } else {
        if (i % 8 == 3) (void)cudaMemsetAsync(b[i], 0xff, bytes, s);
        fill_counted<<<1024, 256, 0, s>>>(b[i], words, counter);
      }
      if (!ok(cudaStreamEndCapture(s, &g), "cudaStreamEndCapture")) return 1;
      if (i == 0) {  // inside a parent, as a child graph
        cudaGraph_t parent = nullptr;
        cudaGraphNode_t node = nullptr;
        if (!ok(cudaGraphCreate(&parent, 0), "cudaGraphCreate") ||
            !ok(cudaGraphAddChildGraphNode(&node, parent, nullptr, 0, g), "cudaGraphAddChildGraphNode"))
          return 1;
        (void)cudaGraphDestroy(g);
        g = parent;
      }
      if (!ok(cudaGraphInstantiate(&exec[i], g, 0), "cudaGraphInstantiate")) return 1;
      (void)cudaGraphDestroy(g);
    }
  }
  std::printf("ready\n");
  std::fflush(stdout);
  const auto t0 = std::chrono::steady_clock::now();
  uint32_t u = 0;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
    // 64 updates queued at a time: the device always has work behind a cut.
    for (int k = 0; k < 64; ++k) {
      ++u;
      uint32_t* dst = b[(u - 1) % buffers];
      if (graphs) {
        if (!ok(cudaGraphLaunch(exec[(u - 1) % buffers], s), "cudaGraphLaunch")) return 1;
        continue;
      }
      if (u % 8 == 0) {
        fill<<<1024, 256, 0, s>>>(staging, words, u);
        if (!ok(cudaMemcpyAsync(dst, staging, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync")) return 1;
      } else {
        fill<<<1024, 256, 0, s>>>(dst, words, u);
      }
      if (!ok(cudaGetLastError(), "fill")) return 1;
    }
    if (!ok(cudaStreamSynchronize(s), "cudaStreamSynchronize")) return 1;
  }
  std::printf("updates %u\n", u);
  return 0;
}
