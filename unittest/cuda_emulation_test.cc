// cuda_emulation_test.cc — tests that CUDA-style kernels compiled through cuda_emulation.h see a correct grid.
// The host backend runs every kernel this way, so index arithmetic must behave exactly as on a GPU.
#include "pos/backends/host/cuda_emulation.h"

#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace {

// Written as it would be for nvcc: a 2-D grid of 2-D blocks, one element per thread.
__global__ void count_2d(int* counts, int width, int height) {
  const unsigned x = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < static_cast<unsigned>(width) && y < static_cast<unsigned>(height)) counts[y * width + x] += 1;
}

// Records what each thread saw, to check the builtins themselves.
__global__ void record_geometry(int* out, int stride) {
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  int* o = out + (block * (blockDim.x * blockDim.y * blockDim.z) + thread) * stride;
  o[0] += 1;
  o[1] = static_cast<int>(gridDim.x * 100 + gridDim.y * 10 + gridDim.z);
  o[2] = static_cast<int>(blockDim.x * 100 + blockDim.y * 10 + blockDim.z);
}

TEST(CudaEmulation, TwoDimensionalGridWritesEveryElementExactlyOnce) {
  const int width = 37, height = 23;  // not multiples of the block: edge threads must be masked
  std::vector<int> counts(width * height, 0);
  const dim3 block(8, 4);
  const dim3 grid((width + block.x - 1) / block.x, (height + block.y - 1) / block.y);
  pos::host::run_kernel_direct<&count_2d>(grid, block, counts.data(), width, height);
  for (int i = 0; i < width * height; ++i) ASSERT_EQ(counts[i], 1) << "element " << i;
}

TEST(CudaEmulation, EveryThreadOfAThreeDimensionalLaunchRunsOnceAndSeesTheLaunchShape) {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  const int threads = 3 * 2 * 2 * 4 * 3 * 2;
  std::vector<int> out(threads * 3, 0);
  pos::host::run_kernel_direct<&record_geometry>(grid, block, out.data(), 3);
  for (int t = 0; t < threads; ++t) {
    ASSERT_EQ(out[t * 3 + 0], 1) << "thread " << t;
    ASSERT_EQ(out[t * 3 + 1], 322) << "thread " << t;
    ASSERT_EQ(out[t * 3 + 2], 432) << "thread " << t;
  }
}

TEST(CudaEmulation, ConcurrentLaunchesOnTwoThreadsDoNotSeeEachOthersIndices) {
  // Host streams run kernels on their own threads; the builtins are thread_local.
  const int w1 = 301, h1 = 77, w2 = 129, h2 = 211;
  std::vector<int> c1(w1 * h1, 0), c2(w2 * h2, 0);
  std::thread t1([&] {
    for (int rep = 0; rep < 20; ++rep)
      pos::host::run_kernel_direct<&count_2d>(dim3((w1 + 15) / 16, (h1 + 3) / 4), dim3(16, 4), c1.data(), w1, h1);
  });
  std::thread t2([&] {
    for (int rep = 0; rep < 20; ++rep)
      pos::host::run_kernel_direct<&count_2d>(dim3((w2 + 7) / 8, (h2 + 7) / 8), dim3(8, 8), c2.data(), w2, h2);
  });
  t1.join();
  t2.join();
  for (int c : c1) ASSERT_EQ(c, 20);
  for (int c : c2) ASSERT_EQ(c, 20);
}

}  // namespace
